//! What a retention soak measured: the disk-use curve and whether it stayed flat once the
//! first events had expired, as a table or one JSON object.

use std::fmt::Write as _;

use serde::Serialize;

/// Steady-state samples needed to judge flatness: a first and a last third of one each.
pub(crate) const STEADY_SAMPLES_MIN: usize = 3;
/// Growth from the first to the last third of the steady state that still counts as flat,
/// as a share of the first third's peak.
pub(crate) const GROWTH_SHARE_MAX: f64 = 0.25;

const MIB: f64 = 1024.0 * 1024.0;

/// One sample of the curve, taken every `--sample-interval` while the load runs.
#[derive(Debug, Clone, Serialize)]
pub struct DiskSample {
    /// Since the load started.
    pub elapsed_seconds: f64,
    /// Events acknowledged so far, and sends that failed so far.
    pub events_sent: u64,
    pub sends_failed: u64,
    /// Each node's data directory on disk (allocated blocks of every file in it), by node.
    pub disk_bytes: Vec<u64>,
    pub total_disk_bytes: u64,
    /// Each node's `tributary_storage_data_bytes` gauge; `None` where the node does not
    /// export it (or its metrics could not be read).
    pub data_bytes_gauge: Vec<Option<u64>>,
}

/// How one series (a node's disk use, or the total) moved over the steady state: the peak
/// of its first third against the peak of its last third.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Flatness {
    pub first_third_max_bytes: u64,
    pub last_third_max_bytes: u64,
    /// Last third's peak ÷ first third's peak.
    pub growth_ratio: f64,
    /// The most the last third's peak may exceed the first third's and count as flat.
    pub allowed_growth_bytes: u64,
    pub flat: bool,
}

/// Decides whether `steady` (one series' samples from the steady state on, in order) is
/// flat: the peak of its last third exceeds the peak of its first third by at most
/// [`GROWTH_SHARE_MAX`] of the latter, or by at most `slack_bytes` (whichever allows more).
/// A leak grows the disk by a share of what is sent, which the ratio catches at any scale;
/// the slack keeps the granularity of space returning (a whole segment at a time) from
/// counting as growth while the retained data is only a few segments. `None` with fewer
/// than [`STEADY_SAMPLES_MIN`] samples.
pub(crate) fn flatness(steady: &[u64], slack_bytes: u64) -> Option<Flatness> {
    if steady.len() < STEADY_SAMPLES_MIN {
        return None;
    }
    let third = steady.len() / 3;
    let peak = |samples: &[u64]| samples.iter().copied().max().unwrap_or(0);
    let first = peak(&steady[..third]);
    let last = peak(&steady[steady.len() - third..]);
    let allowed = ((first as f64 * GROWTH_SHARE_MAX) as u64).max(slack_bytes);
    Some(Flatness {
        first_third_max_bytes: first,
        last_third_max_bytes: last,
        growth_ratio: last as f64 / first.max(1) as f64,
        allowed_growth_bytes: allowed,
        flat: last <= first.saturating_add(allowed),
    })
}

#[derive(Debug, Clone, Serialize)]
pub struct RetentionReport {
    pub nodes: u32,
    pub partitions: u32,
    pub replication_factor: u32,
    pub producers: u32,
    pub retention_seconds: f64,
    pub retention_interval_seconds: f64,
    pub segment_bytes: u64,
    pub event_bytes: usize,
    pub target_events_per_second: f64,
    pub duration_seconds: f64,
    /// Events acknowledged; each replica stores `bytes_sent` of event bodies.
    pub events_sent: u64,
    pub bytes_sent: u64,
    /// Sends that failed (after the client's retries), and the events in them.
    pub sends_failed: u64,
    pub events_failed: u64,
    /// Samples from this elapsed time on are the steady state: one retention period and two
    /// retention intervals after the load started.
    pub steady_state_from_seconds: f64,
    pub steady_samples: usize,
    pub samples: Vec<DiskSample>,
    /// Each node's disk use over the steady state (`None`: too few steady samples).
    pub node_flatness: Vec<Option<Flatness>>,
    pub total_flatness: Option<Flatness>,
    /// Every node's disk use stayed flat over a steady state of enough samples.
    pub flat: bool,
    pub verdict: String,
}

/// The settings and counts a report is computed from, besides the samples.
pub(crate) struct Measurements {
    pub(crate) nodes: u32,
    pub(crate) partitions: u32,
    pub(crate) replication_factor: u32,
    pub(crate) producers: u32,
    pub(crate) retention_seconds: f64,
    pub(crate) retention_interval_seconds: f64,
    pub(crate) segment_bytes: u64,
    /// Segments each node writes at once (one per storage shard).
    pub(crate) segments_per_node: u64,
    pub(crate) event_bytes: usize,
    pub(crate) target_events_per_second: f64,
    pub(crate) duration_seconds: f64,
    pub(crate) steady_state_from_seconds: f64,
    /// The shortest `--duration` that reaches enough steady-state samples.
    pub(crate) duration_min_seconds: f64,
    pub(crate) events_sent: u64,
    pub(crate) sends_failed: u64,
    pub(crate) events_failed: u64,
}

impl RetentionReport {
    pub(crate) fn from_measurements(m: Measurements, samples: Vec<DiskSample>) -> RetentionReport {
        let steady: Vec<&DiskSample> = samples
            .iter()
            .filter(|s| s.elapsed_seconds >= m.steady_state_from_seconds)
            .collect();
        let node_slack = m.segment_bytes * m.segments_per_node;
        let node_flatness: Vec<Option<Flatness>> = (0..m.nodes as usize)
            .map(|node| {
                let series: Vec<u64> = steady.iter().map(|s| s.disk_bytes[node]).collect();
                flatness(&series, node_slack)
            })
            .collect();
        let totals: Vec<u64> = steady.iter().map(|s| s.total_disk_bytes).collect();
        let total_flatness = flatness(&totals, node_slack * u64::from(m.nodes));
        let reached = node_flatness.iter().all(Option::is_some) && !node_flatness.is_empty();
        let flat = reached && node_flatness.iter().flatten().all(|f| f.flat);
        let verdict = verdict(&m, steady.len(), &node_flatness, total_flatness.as_ref());
        RetentionReport {
            nodes: m.nodes,
            partitions: m.partitions,
            replication_factor: m.replication_factor,
            producers: m.producers,
            retention_seconds: m.retention_seconds,
            retention_interval_seconds: m.retention_interval_seconds,
            segment_bytes: m.segment_bytes,
            event_bytes: m.event_bytes,
            target_events_per_second: m.target_events_per_second,
            duration_seconds: m.duration_seconds,
            events_sent: m.events_sent,
            bytes_sent: m.events_sent * m.event_bytes as u64,
            sends_failed: m.sends_failed,
            events_failed: m.events_failed,
            steady_state_from_seconds: m.steady_state_from_seconds,
            steady_samples: steady.len(),
            samples,
            node_flatness,
            total_flatness,
            flat,
            verdict,
        }
    }

    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("a retention report is always serializable")
    }

    /// The settings and verdict, then the curve, one row per sample (steady-state rows
    /// marked `*`).
    pub fn to_table(&self) -> String {
        let elapsed = self.samples.last().map_or(0.0, |s| s.elapsed_seconds);
        let rows = vec![
            (
                "cluster",
                format!(
                    "{} nodes, {} partitions, replication factor {}",
                    self.nodes, self.partitions, self.replication_factor
                ),
            ),
            (
                "retention",
                format!(
                    "{} (removed every {}), segments of {:.1} MiB",
                    seconds(self.retention_seconds),
                    seconds(self.retention_interval_seconds),
                    self.segment_bytes as f64 / MIB
                ),
            ),
            (
                "load",
                format!(
                    "{} producers, {:.0} events/s of {} B for {}",
                    self.producers,
                    self.target_events_per_second,
                    self.event_bytes,
                    seconds(self.duration_seconds)
                ),
            ),
            (
                "sent",
                format!(
                    "{} events ({:.0}/s), {:.1} MiB per replica; {} failed sends ({} events)",
                    self.events_sent,
                    self.events_sent as f64 / elapsed.max(f64::EPSILON),
                    self.bytes_sent as f64 / MIB,
                    self.sends_failed,
                    self.events_failed
                ),
            ),
            (
                "steady state",
                format!(
                    "from {} on: {} samples",
                    seconds(self.steady_state_from_seconds),
                    self.steady_samples
                ),
            ),
            ("total disk", describe(self.total_flatness.as_ref())),
        ];
        let mut rows: Vec<(String, String)> =
            rows.into_iter().map(|(k, v)| (k.to_owned(), v)).collect();
        for (index, flatness) in self.node_flatness.iter().enumerate() {
            rows.push((
                format!("node {} disk", index + 1),
                describe(flatness.as_ref()),
            ));
        }
        rows.push(("result".to_owned(), self.verdict.clone()));
        let mut text = crate::report::key_value_table(&rows);
        text.push('\n');
        text.push_str(&self.curve_table());
        text
    }

    fn curve_table(&self) -> String {
        let gauge = self
            .samples
            .iter()
            .any(|s| s.data_bytes_gauge.iter().any(Option::is_some));
        let mut header = vec![
            "elapsed".to_owned(),
            "events sent".to_owned(),
            "failed sends".to_owned(),
        ];
        header.extend((1..=self.nodes).map(|n| format!("node {n} MiB")));
        header.push("total MiB".to_owned());
        if gauge {
            header.push("data gauge MiB".to_owned());
        }
        let mut lines = vec![header];
        for sample in &self.samples {
            let steady = sample.elapsed_seconds >= self.steady_state_from_seconds;
            let mut line = vec![
                format!(
                    "{}{}",
                    seconds(sample.elapsed_seconds),
                    if steady { " *" } else { "  " }
                ),
                sample.events_sent.to_string(),
                sample.sends_failed.to_string(),
            ];
            line.extend(sample.disk_bytes.iter().map(|b| mib(*b)));
            line.push(mib(sample.total_disk_bytes));
            if gauge {
                let known: Vec<u64> = sample.data_bytes_gauge.iter().flatten().copied().collect();
                line.push(if known.is_empty() {
                    "-".to_owned()
                } else {
                    mib(known.iter().sum())
                });
            }
            lines.push(line);
        }
        let widths: Vec<usize> = (0..lines[0].len())
            .map(|c| {
                lines
                    .iter()
                    .map(|l| l[c].chars().count())
                    .max()
                    .unwrap_or(0)
            })
            .collect();
        let mut text = String::new();
        for line in &lines {
            let cells: Vec<String> = line
                .iter()
                .zip(&widths)
                .enumerate()
                .map(|(c, (cell, width))| {
                    if c == 0 {
                        format!("{cell:<width$}")
                    } else {
                        format!("{cell:>width$}")
                    }
                })
                .collect();
            let _ = writeln!(text, "{}", cells.join("  ").trim_end());
        }
        if self
            .samples
            .iter()
            .any(|s| s.elapsed_seconds >= self.steady_state_from_seconds)
        {
            let _ = writeln!(text, "* steady state");
        }
        text
    }
}

fn verdict(
    m: &Measurements,
    steady_samples: usize,
    nodes: &[Option<Flatness>],
    total: Option<&Flatness>,
) -> String {
    if steady_samples < STEADY_SAMPLES_MIN || nodes.iter().any(Option::is_none) {
        return format!(
            "STEADY STATE NOT REACHED: {steady_samples} samples from {} on, {STEADY_SAMPLES_MIN} \
             needed; with this retention run for at least {}",
            seconds(m.steady_state_from_seconds),
            seconds(m.duration_min_seconds)
        );
    }
    let grown: Vec<String> = nodes
        .iter()
        .enumerate()
        .filter_map(|(index, f)| f.as_ref().filter(|f| !f.flat).map(|f| (index + 1, f)))
        .map(|(node, f)| format!("node {node} {}", growth(f)))
        .collect();
    if grown.is_empty() {
        let ratio = total.map_or(1.0, |t| t.growth_ratio);
        format!(
            "flat: the total disk use peaked at ×{ratio:.3} in the last third of the steady \
             state against the first"
        )
    } else {
        format!("NOT FLAT: {}", grown.join("; "))
    }
}

/// "grew from 10.0 MiB to 20.0 MiB (×2.000), more than 2.5 MiB".
fn growth(f: &Flatness) -> String {
    format!(
        "grew from {} MiB to {} MiB (×{:.3}), more than the {} MiB allowed",
        mib(f.first_third_max_bytes),
        mib(f.last_third_max_bytes),
        f.growth_ratio,
        mib(f.allowed_growth_bytes)
    )
}

fn describe(flatness: Option<&Flatness>) -> String {
    match flatness {
        None => "not judged (too few steady-state samples)".to_owned(),
        Some(f) => format!(
            "peak {} MiB in the first third of the steady state, {} MiB in the last (×{:.3}, \
             allowed +{} MiB): {}",
            mib(f.first_third_max_bytes),
            mib(f.last_third_max_bytes),
            f.growth_ratio,
            mib(f.allowed_growth_bytes),
            if f.flat { "flat" } else { "GREW" }
        ),
    }
}

fn mib(bytes: u64) -> String {
    format!("{:.1}", bytes as f64 / MIB)
}

/// Whole seconds as `1h 2m 3s`; below a minute with tenths, as `4.4s`.
fn seconds(value: f64) -> String {
    if value < 60.0 {
        format!("{value:.1}s")
    } else {
        humantime::format_duration(std::time::Duration::from_secs(value.round() as u64)).to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MB: u64 = 1_000_000;

    #[test]
    fn flat_within_a_quarter_or_the_slack() {
        assert_eq!(flatness(&[100, 100], 0), None, "too few samples");
        let steady = [100 * MB, 120 * MB, 110 * MB, 118 * MB, 124 * MB, 121 * MB];
        let f = flatness(&steady, MB).unwrap();
        assert_eq!(f.first_third_max_bytes, 120 * MB);
        assert_eq!(f.last_third_max_bytes, 124 * MB);
        assert_eq!(f.allowed_growth_bytes, 30 * MB);
        assert!(f.flat);
        assert!((f.growth_ratio - 124.0 / 120.0).abs() < 1e-9);

        // A leak: the disk grows with what is sent.
        let leak = [100 * MB, 110 * MB, 120 * MB, 130 * MB, 140 * MB, 151 * MB];
        let f = flatness(&leak, MB).unwrap();
        assert_eq!(f.allowed_growth_bytes, 27_500_000);
        assert!(!f.flat, "{f:?}");

        // A few segments retained: one segment more is not growth.
        let small = [4 * MB, 4 * MB, 5 * MB, 5 * MB, 6 * MB];
        let f = flatness(&small, 2 * MB).unwrap();
        assert_eq!(
            (f.first_third_max_bytes, f.last_third_max_bytes),
            (4 * MB, 6 * MB)
        );
        assert!(f.flat, "{f:?}");
        assert!(!flatness(&small, MB).unwrap().flat);
    }

    fn sample(elapsed_seconds: f64, disk_bytes: Vec<u64>) -> DiskSample {
        DiskSample {
            elapsed_seconds,
            events_sent: (elapsed_seconds * 100.0) as u64,
            sends_failed: 0,
            total_disk_bytes: disk_bytes.iter().sum(),
            data_bytes_gauge: vec![None; disk_bytes.len()],
            disk_bytes,
        }
    }

    fn measurements() -> Measurements {
        Measurements {
            nodes: 2,
            partitions: 1,
            replication_factor: 2,
            producers: 1,
            retention_seconds: 4.0,
            retention_interval_seconds: 0.5,
            segment_bytes: MB,
            segments_per_node: 1,
            event_bytes: 1000,
            target_events_per_second: 100.0,
            duration_seconds: 10.0,
            steady_state_from_seconds: 5.0,
            duration_min_seconds: 8.0,
            events_sent: 1000,
            sends_failed: 1,
            events_failed: 10,
        }
    }

    #[test]
    fn the_report_judges_every_node_from_the_steady_state_on() {
        // Before the steady state the disk grows; after it one node stays flat and the
        // other keeps growing.
        let samples: Vec<DiskSample> = (0..=10)
            .map(|t| {
                let t = f64::from(t);
                let grows = (t * 2.0 * MB as f64) as u64;
                sample(t, vec![grows.min(10 * MB), grows])
            })
            .collect();
        let report = RetentionReport::from_measurements(measurements(), samples);
        assert_eq!(report.steady_samples, 6);
        assert_eq!(report.bytes_sent, 1_000_000);
        assert!(report.node_flatness[0].as_ref().unwrap().flat);
        assert!(!report.node_flatness[1].as_ref().unwrap().flat);
        assert!(!report.flat);
        assert!(
            report.verdict.starts_with("NOT FLAT: node 2 grew"),
            "{}",
            report.verdict
        );
        let table = report.to_table();
        assert!(table.contains("result        NOT FLAT"), "{table}");
        assert!(table.contains("5.0s *"), "{table}");
        assert!(table.contains("4.0s   "), "{table}");
        let json: serde_json::Value = serde_json::from_str(&report.to_json()).unwrap();
        assert_eq!(json["samples"].as_array().unwrap().len(), 11);
        assert_eq!(json["samples"][10]["disk_bytes"][0], 10 * MB);
        assert_eq!(json["flat"], false);
    }

    #[test]
    fn too_few_steady_samples_name_the_duration_needed() {
        let samples = (0..=6)
            .map(|t| sample(f64::from(t), vec![MB, MB]))
            .collect();
        let report = RetentionReport::from_measurements(measurements(), samples);
        assert_eq!(report.steady_samples, 2);
        assert!(!report.flat);
        assert_eq!(
            report.verdict,
            "STEADY STATE NOT REACHED: 2 samples from 5.0s on, 3 needed; with this retention \
             run for at least 8.0s"
        );

        let samples = (0..=10)
            .map(|t| sample(f64::from(t), vec![MB, MB]))
            .collect();
        let report = RetentionReport::from_measurements(measurements(), samples);
        assert!(report.flat, "{}", report.verdict);
        assert!(report.verdict.starts_with("flat: "), "{}", report.verdict);
    }
}
