//! What a rebuild bench run measured, as a table or one JSON object.

use std::fmt::Write as _;

use hdrhistogram::Histogram;
use serde::Serialize;

/// The bound on the resident memory of the leader and of the node being rebuilt.
pub(crate) const RSS_TARGET_MIB: f64 = 300.0;

const MIB: f64 = 1024.0 * 1024.0;
const MB: f64 = 1e6;
const GB: f64 = 1e9;

/// The paced sends of one window (before a wipe, or during the rebuild).
#[derive(Debug, Clone, Serialize)]
pub struct SendWindow {
    /// Sends acknowledged.
    pub sends: u64,
    /// Attempts that failed (each retried until acknowledged).
    pub failures: u64,
    /// From when a send was due until it was acknowledged (retries included); `None`
    /// without any acknowledged send.
    pub p50_ms: Option<f64>,
    pub p99_ms: Option<f64>,
    pub max_ms: Option<f64>,
}

impl SendWindow {
    pub(crate) fn of(latency_us: &Histogram<u64>, failures: u64) -> SendWindow {
        let ms = |quantile: f64| {
            (!latency_us.is_empty()).then(|| latency_us.value_at_quantile(quantile) as f64 / 1000.0)
        };
        SendWindow {
            sends: latency_us.len(),
            failures,
            p50_ms: ms(0.5),
            p99_ms: ms(0.99),
            max_ms: ms(1.0),
        }
    }

    /// `200, p50 2.9 ms, p99 8.1 ms`.
    fn describe(&self) -> String {
        let ms = |v: Option<f64>| v.map_or_else(|| "-".to_owned(), |v| format!("{v:.1} ms"));
        format!(
            "{}, p50 {}, p99 {}",
            self.sends,
            ms(self.p50_ms),
            ms(self.p99_ms)
        )
    }
}

/// One wipe and rebuild of a follower.
#[derive(Debug, Clone, Serialize)]
pub struct RebuildRecord {
    /// The node wiped and rebuilt, and the partition's leader when it was wiped.
    pub rebuilt_node: u64,
    pub leader_node: u64,
    /// Whether the node was SIGKILLed during the install, and what share of the partition's
    /// bytes it had received then.
    pub killed_mid_install: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub killed_at_received_share: Option<f64>,
    /// From the wiped node's restart until its replica was caught up (a voter level with
    /// the leader), through any kill and restart.
    pub rebuild_seconds: f64,
    /// The partition's bytes over the rebuild time, in MB/s (10^6 bytes).
    pub throughput_mb_per_second: f64,
    /// `tributary_rebuild_bytes_sent_total` on the leader over the rebuild, and
    /// `tributary_rebuild_bytes_received_total` on the rebuilt node (summed over its lives
    /// when it was killed); `None` where the node does not export it.
    pub bytes_sent: Option<u64>,
    pub bytes_received: Option<u64>,
    /// `tributary_raft_snapshots_installed_total` on the rebuilt node at the end (counted
    /// since its last start).
    pub snapshots_installed: u64,
    /// Highest resident memory (VmRSS, sampled every 100 ms), in MiB, before the wipe and
    /// during the rebuild; `None` when it could not be read.
    pub leader_rss_before_mib: Option<f64>,
    pub leader_rss_during_mib: Option<f64>,
    pub rebuilt_rss_before_mib: Option<f64>,
    pub rebuilt_rss_during_mib: Option<f64>,
    pub sends_before: SendWindow,
    pub sends_during: SendWindow,
    /// All three replicas held the same events once the sends had stopped.
    pub replicas_identical: bool,
}

impl RebuildRecord {
    /// Whether the leader (before and during) and the rebuilt node (during) stayed under
    /// [`RSS_TARGET_MIB`]; false when a figure is unknown.
    pub fn memory_target_met(&self) -> bool {
        [
            self.leader_rss_before_mib,
            self.leader_rss_during_mib,
            self.rebuilt_rss_during_mib,
        ]
        .iter()
        .all(|mib| mib.is_some_and(|mib| mib < RSS_TARGET_MIB))
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct RebuildReport {
    pub nodes: u32,
    pub replication_factor: u32,
    pub raft_snapshot_entries: u64,
    pub raft_log_keep_entries: u64,
    /// The nodes' `--rebuild-bytes-per-second`; `None`: their default.
    pub rebuild_bytes_per_second: Option<u64>,
    pub event_bytes: u32,
    /// `--gigabytes`, in bytes.
    pub requested_bytes: u64,
    /// The hub's `retention_bytes_max`.
    pub retention_bytes_max: u64,
    /// The fill: events sent and how long it took.
    pub load_events: u64,
    pub load_bytes: u64,
    pub load_seconds: f64,
    /// Body bytes and events the partition retained after the fill, and its first
    /// retained sequence number (above 0: retention removed the earliest events).
    pub partition_bytes: u64,
    pub partition_events: u64,
    pub begin_sequence_number: i64,
    /// Each node's highest resident memory during the fill, in MiB.
    pub load_rss_mib: Vec<Option<f64>>,
    pub sends_per_second: f64,
    pub rebuilds: Vec<RebuildRecord>,
    pub rss_target_mib: f64,
    /// Every rebuild kept the leader and the rebuilt node under the target.
    pub memory_target_met: bool,
    /// Every rebuild ended with identical replicas.
    pub replicas_identical: bool,
}

/// The raw measurements a report is computed from.
pub(crate) struct Measurements {
    pub(crate) nodes: u32,
    pub(crate) replication_factor: u32,
    pub(crate) raft_snapshot_entries: u64,
    pub(crate) raft_log_keep_entries: u64,
    pub(crate) rebuild_bytes_per_second: Option<u64>,
    pub(crate) event_bytes: u32,
    pub(crate) requested_bytes: u64,
    pub(crate) retention_bytes_max: u64,
    pub(crate) load_events: u64,
    pub(crate) load_bytes: u64,
    pub(crate) load_seconds: f64,
    pub(crate) partition_bytes: u64,
    pub(crate) partition_events: u64,
    pub(crate) begin_sequence_number: i64,
    pub(crate) load_rss_mib: Vec<Option<f64>>,
    pub(crate) sends_per_second: f64,
    pub(crate) rebuilds: Vec<RebuildRecord>,
}

impl RebuildReport {
    pub(crate) fn from_measurements(m: Measurements) -> RebuildReport {
        let all = |test: fn(&RebuildRecord) -> bool| {
            !m.rebuilds.is_empty() && m.rebuilds.iter().all(test)
        };
        let memory_target_met = all(RebuildRecord::memory_target_met);
        let replicas_identical = all(|r| r.replicas_identical);
        RebuildReport {
            nodes: m.nodes,
            replication_factor: m.replication_factor,
            raft_snapshot_entries: m.raft_snapshot_entries,
            raft_log_keep_entries: m.raft_log_keep_entries,
            rebuild_bytes_per_second: m.rebuild_bytes_per_second,
            event_bytes: m.event_bytes,
            requested_bytes: m.requested_bytes,
            retention_bytes_max: m.retention_bytes_max,
            load_events: m.load_events,
            load_bytes: m.load_bytes,
            load_seconds: m.load_seconds,
            partition_bytes: m.partition_bytes,
            partition_events: m.partition_events,
            begin_sequence_number: m.begin_sequence_number,
            load_rss_mib: m.load_rss_mib,
            sends_per_second: m.sends_per_second,
            rebuilds: m.rebuilds,
            rss_target_mib: RSS_TARGET_MIB,
            memory_target_met,
            replicas_identical,
        }
    }

    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("a rebuild report is always serializable")
    }

    pub fn to_table(&self) -> String {
        let mut rows: Vec<(String, String)> = vec![
            (
                "cluster".into(),
                format!(
                    "{} nodes, 1 partition, replication factor {}; a snapshot point every {} \
                     entries, {} entries of log kept behind it",
                    self.nodes,
                    self.replication_factor,
                    self.raft_snapshot_entries,
                    self.raft_log_keep_entries
                ),
            ),
            (
                "rebuild budget".into(),
                self.rebuild_bytes_per_second.map_or_else(
                    || "the nodes' default".to_owned(),
                    |b| format!("{b} B/s per node ({:.1} MB/s)", b as f64 / MB),
                ),
            ),
            (
                "load".into(),
                format!(
                    "{} events of {} B ({:.3} GB) in {:.1}s ({:.1} MB/s)",
                    self.load_events,
                    self.event_bytes,
                    self.load_bytes as f64 / GB,
                    self.load_seconds,
                    self.load_bytes as f64 / MB / self.load_seconds.max(f64::EPSILON)
                ),
            ),
            (
                "partition bytes".into(),
                format!(
                    "{} B ({:.3} GB retained; {:.3} GB requested, retention cap {:.3} GB)",
                    self.partition_bytes,
                    self.partition_bytes as f64 / GB,
                    self.requested_bytes as f64 / GB,
                    self.retention_bytes_max as f64 / GB
                ),
            ),
            ("events".into(), self.partition_events.to_string()),
            (
                "beginning sequence number".into(),
                format!(
                    "{} (events before it removed by retention)",
                    self.begin_sequence_number
                ),
            ),
            (
                "max RSS while loading".into(),
                self.load_rss_mib
                    .iter()
                    .enumerate()
                    .map(|(index, mib)| format!("node {} {}", index + 1, mebibytes(*mib)))
                    .collect::<Vec<_>>()
                    .join(", "),
            ),
            (
                "paced sends".into(),
                format!(
                    "{:.0}/s of one small event, before each wipe and during each rebuild",
                    self.sends_per_second
                ),
            ),
        ];
        rows.extend(self.rebuild_rows());
        rows.push(("result".into(), self.verdict()));
        crate::report::key_value_table(&rows)
    }

    /// One row per figure, one column per rebuild.
    fn rebuild_rows(&self) -> Vec<(String, String)> {
        let rebuilds = &self.rebuilds;
        let cells = |cell: &dyn Fn(usize, &RebuildRecord) -> String| -> Vec<String> {
            rebuilds
                .iter()
                .enumerate()
                .map(|(i, r)| cell(i, r))
                .collect()
        };
        let target = |mib: Option<f64>| {
            let verdict = match mib {
                Some(mib) if mib < RSS_TARGET_MIB => "",
                _ => " (over target)",
            };
            format!("{}{verdict}", mebibytes(mib))
        };
        let bytes = |b: Option<u64>| {
            b.map_or_else(
                || "unavailable".to_owned(),
                |b| format!("{:.1} MB", b as f64 / MB),
            )
        };
        let table: Vec<(&str, Vec<String>)> = vec![
            (
                "rebuild",
                cells(&|i, r| {
                    let kind = if r.killed_mid_install {
                        "killed mid-install"
                    } else {
                        "undisturbed"
                    };
                    format!("{}: {kind}", i + 1)
                }),
            ),
            (
                "rebuilt node",
                cells(&|_, r| format!("node {}", r.rebuilt_node)),
            ),
            ("leader", cells(&|_, r| format!("node {}", r.leader_node))),
            (
                "killed mid-install",
                cells(&|_, r| match r.killed_at_received_share {
                    Some(share) => format!("yes, at {:.0}% received", share * 100.0),
                    None if r.killed_mid_install => "yes".to_owned(),
                    None => "no".to_owned(),
                }),
            ),
            (
                "rebuild seconds",
                cells(&|_, r| format!("{:.2}", r.rebuild_seconds)),
            ),
            (
                "rebuild throughput",
                cells(&|_, r| format!("{:.1} MB/s", r.throughput_mb_per_second)),
            ),
            ("rebuild bytes sent", cells(&|_, r| bytes(r.bytes_sent))),
            (
                "rebuild bytes received",
                cells(&|_, r| bytes(r.bytes_received)),
            ),
            (
                "snapshots installed",
                cells(&|_, r| r.snapshots_installed.to_string()),
            ),
            (
                "max RSS leader before",
                cells(&|_, r| target(r.leader_rss_before_mib)),
            ),
            (
                "max RSS leader during",
                cells(&|_, r| target(r.leader_rss_during_mib)),
            ),
            (
                "max RSS rebuilt node before",
                cells(&|_, r| mebibytes(r.rebuilt_rss_before_mib)),
            ),
            (
                "max RSS rebuilt node during",
                cells(&|_, r| target(r.rebuilt_rss_during_mib)),
            ),
            ("sends before", cells(&|_, r| r.sends_before.describe())),
            ("sends during", cells(&|_, r| r.sends_during.describe())),
            (
                "send failures",
                cells(&|_, r| {
                    format!(
                        "{} before, {} during",
                        r.sends_before.failures, r.sends_during.failures
                    )
                }),
            ),
            (
                "replicas identical",
                cells(&|_, r| yes_no(r.replicas_identical).to_owned()),
            ),
        ];
        columns(table)
    }

    fn verdict(&self) -> String {
        let mut parts = Vec::new();
        parts.push(if self.replicas_identical {
            "replicas identical".to_owned()
        } else {
            "REPLICAS DIFFER".to_owned()
        });
        parts.push(if self.memory_target_met {
            format!("memory under {RSS_TARGET_MIB:.0} MiB: met")
        } else {
            format!("memory under {RSS_TARGET_MIB:.0} MiB: MISSED")
        });
        parts.join("; ")
    }
}

/// Rows whose cells are padded into aligned columns (3 spaces apart; a cell never holds
/// two spaces in a row, so a reader can split on them).
fn columns(table: Vec<(&str, Vec<String>)>) -> Vec<(String, String)> {
    let count = table.iter().map(|(_, c)| c.len()).max().unwrap_or(0);
    let widths: Vec<usize> = (0..count)
        .map(|i| {
            table
                .iter()
                .filter_map(|(_, c)| c.get(i).map(|c| c.chars().count()))
                .max()
                .unwrap_or(0)
        })
        .collect();
    table
        .into_iter()
        .map(|(key, cells)| {
            let mut value = String::new();
            for (i, cell) in cells.iter().enumerate() {
                if i + 1 < cells.len() {
                    let pad = widths[i] - cell.chars().count() + 3;
                    let _ = write!(value, "{cell}{}", " ".repeat(pad));
                } else {
                    value.push_str(cell);
                }
            }
            (key.to_owned(), value)
        })
        .collect()
}

fn mebibytes(mib: Option<f64>) -> String {
    mib.map_or_else(|| "unavailable".to_owned(), |mib| format!("{mib:.1} MiB"))
}

fn yes_no(value: bool) -> &'static str {
    if value { "yes" } else { "no" }
}

/// Bytes as MiB, for the report.
pub(crate) fn to_mib(bytes: Option<u64>) -> Option<f64> {
    bytes.map(|b| b as f64 / MIB)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn window(sends: u64, failures: u64) -> SendWindow {
        let mut latency_us = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).unwrap();
        for i in 1..=sends {
            latency_us.record(i * 1000).unwrap();
        }
        SendWindow::of(&latency_us, failures)
    }

    fn record(killed: Option<f64>, leader_rss: f64) -> RebuildRecord {
        RebuildRecord {
            rebuilt_node: 2,
            leader_node: 1,
            killed_mid_install: killed.is_some(),
            killed_at_received_share: killed,
            rebuild_seconds: 20.0,
            throughput_mb_per_second: 52.5,
            bytes_sent: Some(1_060_000_000),
            bytes_received: None,
            snapshots_installed: 1,
            leader_rss_before_mib: Some(120.0),
            leader_rss_during_mib: Some(leader_rss),
            rebuilt_rss_before_mib: Some(100.0),
            rebuilt_rss_during_mib: Some(150.0),
            sends_before: window(100, 0),
            sends_during: window(400, 2),
            replicas_identical: true,
        }
    }

    fn report(rebuilds: Vec<RebuildRecord>) -> RebuildReport {
        RebuildReport::from_measurements(Measurements {
            nodes: 3,
            replication_factor: 3,
            raft_snapshot_entries: 100,
            raft_log_keep_entries: 10,
            rebuild_bytes_per_second: Some(52_428_800),
            event_bytes: 65536,
            requested_bytes: 1_050_000_000,
            retention_bytes_max: 1_072_500_000,
            load_events: 16_700,
            load_bytes: 16_700 * 65536,
            load_seconds: 40.0,
            partition_bytes: 1_060_000_000,
            partition_events: 16_200,
            begin_sequence_number: 500,
            load_rss_mib: vec![Some(200.0), None, Some(150.0)],
            sends_per_second: 20.0,
            rebuilds,
        })
    }

    /// The value of the row `key` in `table`.
    fn row<'a>(table: &'a str, key: &str) -> &'a str {
        table
            .lines()
            .find_map(|l| l.strip_prefix(key).filter(|rest| rest.starts_with("  ")))
            .unwrap_or_else(|| panic!("a '{key}' row: {table}"))
            .trim()
    }

    #[test]
    fn latency_percentiles_of_a_window() {
        let w = window(100, 3);
        assert_eq!(w.sends, 100);
        assert_eq!(w.failures, 3);
        // Within the histogram's 3 significant digits.
        let near = |v: Option<f64>, ms: f64| v.is_some_and(|v| (v - ms).abs() < ms / 1000.0);
        assert!(near(w.p50_ms, 50.0), "{w:?}");
        assert!(near(w.p99_ms, 99.0), "{w:?}");
        let empty = window(0, 1);
        assert_eq!((empty.sends, empty.p99_ms), (0, None));
        assert_eq!(empty.describe(), "0, p50 -, p99 -");
    }

    #[test]
    fn one_column_per_rebuild() {
        let r = report(vec![record(None, 200.0), record(Some(0.34), 1800.0)]);
        assert!(r.replicas_identical);
        assert!(!r.memory_target_met, "the second rebuild's leader is over");
        let table = r.to_table();
        assert!(
            row(&table, "partition bytes").starts_with("1060000000 B (1.060 GB retained"),
            "{table}"
        );
        assert_eq!(
            row(&table, "beginning sequence number").split(' ').next(),
            Some("500")
        );
        let cells = |key: &str| -> Vec<String> {
            row(&table, key)
                .split("   ")
                .map(str::trim)
                .filter(|c| !c.is_empty())
                .map(str::to_owned)
                .collect()
        };
        assert_eq!(
            cells("rebuild"),
            ["1: undisturbed", "2: killed mid-install"]
        );
        assert_eq!(cells("killed mid-install"), ["no", "yes, at 34% received"]);
        assert_eq!(
            cells("max RSS leader during"),
            ["200.0 MiB", "1800.0 MiB (over target)"]
        );
        assert_eq!(
            cells("rebuild bytes received"),
            ["unavailable", "unavailable"]
        );
        assert_eq!(
            cells("sends during")[0],
            "400, p50 200.1 ms, p99 396.0 ms",
            "{table}"
        );
        assert_eq!(cells("send failures")[1], "0 before, 2 during");
        assert_eq!(cells("replicas identical"), ["yes", "yes"]);
        assert!(
            row(&table, "max RSS while loading").contains("node 1 200.0 MiB, node 2 unavailable"),
            "{table}"
        );
        assert_eq!(
            row(&table, "result"),
            "replicas identical; memory under 300 MiB: MISSED"
        );
        let json: serde_json::Value = serde_json::from_str(&r.to_json()).unwrap();
        assert_eq!(json["rebuilds"].as_array().unwrap().len(), 2);
        assert_eq!(json["rebuilds"][1]["killed_at_received_share"], 0.34);
        assert_eq!(json["partition_bytes"], 1_060_000_000u64);
    }

    #[test]
    fn memory_and_identity_verdicts() {
        let ok = report(vec![record(None, 250.0)]);
        assert!(ok.memory_target_met && ok.replicas_identical);
        assert_eq!(
            row(&ok.to_table(), "result"),
            "replicas identical; memory under 300 MiB: met"
        );
        let mut differ = record(None, 250.0);
        differ.replicas_identical = false;
        differ.rebuilt_rss_during_mib = None;
        let bad = report(vec![differ]);
        assert!(!bad.replicas_identical);
        assert!(!bad.memory_target_met, "an unknown figure does not meet it");
        assert!(row(&bad.to_table(), "result").starts_with("REPLICAS DIFFER"));
        assert!(!report(Vec::new()).replicas_identical);
    }
}
