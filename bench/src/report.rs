//! What a bench run measured, as a table or one JSON object.

use std::fmt::Write as _;

use hdrhistogram::Histogram;
use serde::Serialize;

use crate::breakdown::Breakdown;
use crate::load::KeyDistribution;

/// Bytes in a megabyte for the rates we print (decimal, as network rates are).
const BYTES_PER_MB: f64 = 1_000_000.0;

#[derive(Debug, Clone, Serialize)]
pub struct BenchReport {
    /// How the producers sent: `grpc`, `amqp`, or the peer system's (`nats`).
    pub protocol: &'static str,
    pub hub: String,
    pub partitions: u32,
    pub replication_factor: u32,
    pub producers: u32,
    pub event_size_bytes: usize,
    pub batch_size: u32,
    /// Sends each producer kept unacknowledged (above 1: of one event each, published one
    /// by one and batched by the client, unless `batch_size` is above 1 too: AMQP batches
    /// pipelined on the link).
    pub in_flight: u32,
    /// The `--rate` asked for; `None`: as fast as replies came.
    pub target_events_per_second: Option<f64>,
    pub key_distribution: KeyDistribution,
    /// Consumer connections (0: end-to-end latency not measured).
    pub consumers: u32,
    /// Wall time from the first send to the last reply.
    pub elapsed_seconds: f64,
    /// Events acknowledged by the service.
    pub events_sent: u64,
    /// Acknowledged send requests.
    pub sends: u64,
    /// Sends refused with a transient error (busy, not leader, unavailable); not retried.
    pub errors: u64,
    pub events_per_second: f64,
    pub megabytes_per_second: f64,
    pub sends_per_second: f64,
    /// Send latency of acknowledged sends (from when each was due, with `--rate`).
    pub latency_ms: LatencyReport,
    /// Events the consumers received.
    pub events_received: Option<u64>,
    /// From send to delivery to a consumer; `None` without consumers.
    pub end_to_end_latency_ms: Option<LatencyReport>,
    /// Storage fsyncs per second on the node behind `--metrics-url`; `None` when unavailable.
    pub fsyncs_per_second: Option<f64>,
    /// sends/s ÷ fsyncs/s: how many sends shared one fsync.
    pub sends_per_fsync: Option<f64>,
    /// Why fsyncs/s is unavailable.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fsyncs_unavailable_reason: Option<String>,
    /// Each watched node's CPU and memory (`--metrics-url`).
    pub nodes: Vec<NodeUsage>,
    /// Where the sends' time went, with `--breakdown`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub breakdown: Option<Breakdown>,
}

/// One node's resource use during a bench run.
#[derive(Debug, Clone, Serialize)]
pub struct NodeUsage {
    pub metrics_url: String,
    /// CPU time over the run's wall time, in % of one core.
    pub cpu_percent: Option<f64>,
    /// Resident memory at the end of the run, in MiB.
    pub resident_mib: Option<f64>,
    /// Why a figure is missing.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unavailable_reason: Option<String>,
}

impl NodeUsage {
    pub(crate) fn unavailable(url: &str, reason: String) -> NodeUsage {
        NodeUsage {
            metrics_url: url.to_owned(),
            cpu_percent: None,
            resident_mib: None,
            unavailable_reason: Some(reason),
        }
    }
}

#[derive(Debug, Clone, Copy, Serialize)]
pub struct LatencyReport {
    pub p50: f64,
    pub p99: f64,
    pub p999: f64,
    pub max: f64,
}

/// The raw measurements a report is computed from.
pub(crate) struct Measurements {
    pub(crate) protocol: &'static str,
    pub(crate) hub: String,
    pub(crate) partitions: u32,
    pub(crate) replication_factor: u32,
    pub(crate) producers: u32,
    pub(crate) event_size_bytes: usize,
    pub(crate) batch_size: u32,
    pub(crate) in_flight: u32,
    pub(crate) target_events_per_second: Option<f64>,
    pub(crate) key_distribution: KeyDistribution,
    pub(crate) consumers: u32,
    pub(crate) elapsed_seconds: f64,
    pub(crate) sends: u64,
    pub(crate) errors: u64,
    /// Send latencies in microseconds.
    pub(crate) latency_us: Histogram<u64>,
    /// Events the consumers received and their end-to-end latencies in microseconds.
    pub(crate) consumed: Option<(u64, Histogram<u64>)>,
    /// fsyncs during the run and the seconds between the two metric reads, or why unknown.
    pub(crate) fsyncs: Result<(f64, f64), String>,
    pub(crate) nodes: Vec<NodeUsage>,
}

impl BenchReport {
    pub(crate) fn from_measurements(m: Measurements) -> BenchReport {
        let elapsed = m.elapsed_seconds.max(f64::EPSILON);
        let events_sent = m.sends * u64::from(m.batch_size);
        let sends_per_second = m.sends as f64 / elapsed;
        let latency_ms = LatencyReport::of(&m.latency_us);
        let (fsyncs_per_second, fsyncs_unavailable_reason) = match m.fsyncs {
            Ok((fsyncs, seconds)) => (Some(fsyncs / seconds.max(f64::EPSILON)), None),
            Err(reason) => (None, Some(reason)),
        };
        let sends_per_fsync = fsyncs_per_second
            .filter(|f| *f > 0.0)
            .map(|f| sends_per_second / f);
        BenchReport {
            protocol: m.protocol,
            hub: m.hub,
            partitions: m.partitions,
            replication_factor: m.replication_factor,
            producers: m.producers,
            event_size_bytes: m.event_size_bytes,
            batch_size: m.batch_size,
            in_flight: m.in_flight,
            target_events_per_second: m.target_events_per_second,
            key_distribution: m.key_distribution,
            consumers: m.consumers,
            elapsed_seconds: m.elapsed_seconds,
            events_sent,
            sends: m.sends,
            errors: m.errors,
            events_per_second: events_sent as f64 / elapsed,
            megabytes_per_second: (events_sent as f64 * m.event_size_bytes as f64)
                / BYTES_PER_MB
                / elapsed,
            sends_per_second,
            latency_ms,
            events_received: m.consumed.as_ref().map(|(received, _)| *received),
            end_to_end_latency_ms: m
                .consumed
                .as_ref()
                .filter(|(received, _)| *received > 0)
                .map(|(_, latency_us)| LatencyReport::of(latency_us)),
            fsyncs_per_second,
            sends_per_fsync,
            fsyncs_unavailable_reason,
            nodes: m.nodes,
            breakdown: None,
        }
    }

    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("a bench report is always serializable")
    }

    pub fn to_table(&self) -> String {
        let l = self.latency_ms;
        let fsyncs = match (self.fsyncs_per_second, &self.fsyncs_unavailable_reason) {
            (Some(f), _) => format!("{f:.0}"),
            (None, Some(reason)) => format!("unavailable ({reason})"),
            (None, None) => "unavailable".to_owned(),
        };
        let ratio = self
            .sends_per_fsync
            .map_or_else(|| "unavailable".to_owned(), |r| format!("{r:.1}"));
        let end_to_end = match (&self.end_to_end_latency_ms, self.events_received) {
            (Some(l), Some(received)) => format!(
                "p50 {:.3}  p99 {:.3}  p99.9 {:.3}  max {:.3}  ({received} events received)",
                l.p50, l.p99, l.p999, l.max
            ),
            (None, Some(_)) => "no events received".to_owned(),
            _ => "not measured (--consumers 0)".to_owned(),
        };
        let mut rows = vec![
            (
                "hub",
                format!(
                    "{} ({} partitions, replication factor {})",
                    self.hub, self.partitions, self.replication_factor
                ),
            ),
            (
                "load",
                format!(
                    "{} producers over {}, {}, {}, keys: {}",
                    self.producers,
                    self.protocol,
                    if self.in_flight > 1 && self.batch_size > 1 {
                        format!(
                            "sends of {} events of {} B, {} unacknowledged each",
                            self.batch_size, self.event_size_bytes, self.in_flight
                        )
                    } else if self.in_flight > 1 {
                        format!(
                            "events of {} B published one by one, {} unacknowledged each",
                            self.event_size_bytes, self.in_flight
                        )
                    } else {
                        format!(
                            "{} events of {} B per send",
                            self.batch_size, self.event_size_bytes
                        )
                    },
                    self.target_events_per_second
                        .map_or_else(|| "max rate".to_owned(), |r| format!("{r:.0} events/s")),
                    self.key_distribution.name()
                ),
            ),
            ("elapsed", format!("{:.2}s", self.elapsed_seconds)),
            ("events sent", self.events_sent.to_string()),
            ("events/s", format!("{:.0}", self.events_per_second)),
            ("MB/s", format!("{:.2}", self.megabytes_per_second)),
            ("sends/s", format!("{:.0}", self.sends_per_second)),
            (
                "send latency (ms)",
                format!(
                    "p50 {:.3}  p99 {:.3}  p99.9 {:.3}  max {:.3}",
                    l.p50, l.p99, l.p999, l.max
                ),
            ),
            ("end-to-end latency (ms)", end_to_end),
            ("fsyncs/s", fsyncs),
            ("sends/s ÷ fsyncs/s", ratio),
            ("errors", self.errors.to_string()),
        ];
        for node in &self.nodes {
            rows.push(("node", format!("{}: {}", node.metrics_url, node.describe())));
        }
        let mut table = key_value_table(&rows);
        if let Some(breakdown) = &self.breakdown {
            table.push_str(&breakdown.to_table());
        }
        table
    }
}

/// Rows of `key  value`, the keys padded to one width.
pub(crate) fn key_value_table<K: AsRef<str>>(rows: &[(K, String)]) -> String {
    let width = rows
        .iter()
        .map(|(k, _)| k.as_ref().chars().count())
        .max()
        .unwrap_or(0);
    let mut text = String::new();
    for (key, value) in rows {
        let key = key.as_ref();
        let pad = width - key.chars().count();
        let _ = writeln!(text, "{key}{}  {value}", " ".repeat(pad));
    }
    text
}

impl NodeUsage {
    /// "CPU 42.0% of one core, resident 100.0 MiB", with why a figure is missing.
    pub(crate) fn describe(&self) -> String {
        let figure = |value: Option<f64>, unit: &str| {
            value.map_or_else(|| "unavailable".to_owned(), |v| format!("{v:.1}{unit}"))
        };
        let mut usage = format!(
            "CPU {} of one core, resident {}",
            figure(self.cpu_percent, "%"),
            figure(self.resident_mib, " MiB")
        );
        if let Some(reason) = &self.unavailable_reason {
            let _ = write!(usage, " ({reason})");
        }
        usage
    }
}

impl LatencyReport {
    /// Percentiles of a histogram of microseconds, in milliseconds.
    pub(crate) fn of(latency_us: &Histogram<u64>) -> LatencyReport {
        let ms = |us: u64| us as f64 / 1000.0;
        LatencyReport {
            p50: ms(latency_us.value_at_quantile(0.5)),
            p99: ms(latency_us.value_at_quantile(0.99)),
            p999: ms(latency_us.value_at_quantile(0.999)),
            max: ms(latency_us.max()),
        }
    }
}

/// Columns of the CSV form, in order.
const CSV_HEADER: &str = "hub,partitions,replication_factor,producers,event_size_bytes,\
batch_size,in_flight,target_events_per_second,key_distribution,consumers,elapsed_seconds,events_sent,\
sends,errors,events_per_second,megabytes_per_second,sends_per_second,latency_p50_ms,\
latency_p99_ms,latency_p999_ms,latency_max_ms,events_received,end_to_end_p50_ms,\
end_to_end_p99_ms,end_to_end_p999_ms,end_to_end_max_ms,fsyncs_per_second,sends_per_fsync,\
node_cpu_percent,node_resident_mib";

impl BenchReport {
    /// The report as one CSV line (no newline); empty fields where a figure is unknown.
    pub fn to_csv_row(&self) -> String {
        let opt = |v: Option<f64>| v.map_or_else(String::new, |v| format!("{v}"));
        let e2e = self.end_to_end_latency_ms;
        [
            self.hub.clone(),
            self.partitions.to_string(),
            self.replication_factor.to_string(),
            self.producers.to_string(),
            self.event_size_bytes.to_string(),
            self.batch_size.to_string(),
            self.in_flight.to_string(),
            opt(self.target_events_per_second),
            self.key_distribution.name().to_owned(),
            self.consumers.to_string(),
            format!("{}", self.elapsed_seconds),
            self.events_sent.to_string(),
            self.sends.to_string(),
            self.errors.to_string(),
            format!("{}", self.events_per_second),
            format!("{}", self.megabytes_per_second),
            format!("{}", self.sends_per_second),
            format!("{}", self.latency_ms.p50),
            format!("{}", self.latency_ms.p99),
            format!("{}", self.latency_ms.p999),
            format!("{}", self.latency_ms.max),
            self.events_received
                .map_or_else(String::new, |r| r.to_string()),
            opt(e2e.map(|l| l.p50)),
            opt(e2e.map(|l| l.p99)),
            opt(e2e.map(|l| l.p999)),
            opt(e2e.map(|l| l.max)),
            opt(self.fsyncs_per_second),
            opt(self.sends_per_fsync),
            // One figure per watched node, in --metrics-url order, separated by ';'.
            self.nodes
                .iter()
                .map(|n| opt(n.cpu_percent))
                .collect::<Vec<_>>()
                .join(";"),
            self.nodes
                .iter()
                .map(|n| opt(n.resident_mib))
                .collect::<Vec<_>>()
                .join(";"),
        ]
        .join(",")
    }
}

/// Appends `report` to the CSV file at `path`, writing the header first if the file is
/// new or empty.
pub(crate) fn append_csv(path: &std::path::Path, report: &BenchReport) -> std::io::Result<()> {
    use std::io::Write as _;
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)?;
    if file.metadata()?.len() == 0 {
        writeln!(file, "{CSV_HEADER}")?;
    }
    writeln!(file, "{}", report.to_csv_row())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn measurements(fsyncs: Result<(f64, f64), String>) -> Measurements {
        let mut latency_us = Histogram::new_with_bounds(1, 60_000_000, 3).unwrap();
        for us in 1..=1000 {
            latency_us.record(us).unwrap();
        }
        Measurements {
            protocol: "grpc",
            hub: "bench-1".into(),
            partitions: 4,
            replication_factor: 3,
            producers: 8,
            event_size_bytes: 1000,
            batch_size: 10,
            in_flight: 1,
            target_events_per_second: None,
            key_distribution: KeyDistribution::Partition,
            consumers: 0,
            consumed: None,
            elapsed_seconds: 2.0,
            sends: 1000,
            errors: 0,
            latency_us,
            fsyncs,
            nodes: vec![NodeUsage {
                metrics_url: "http://n1/metrics".into(),
                cpu_percent: Some(42.0),
                resident_mib: Some(100.0),
                unavailable_reason: None,
            }],
        }
    }

    #[test]
    fn computes_rates_and_ratio() {
        let report = BenchReport::from_measurements(measurements(Ok((250.0, 2.5))));
        assert_eq!(report.events_sent, 10_000);
        assert_eq!(report.events_per_second, 5000.0);
        assert_eq!(report.megabytes_per_second, 5.0);
        assert_eq!(report.sends_per_second, 500.0);
        assert_eq!(report.fsyncs_per_second, Some(100.0));
        assert_eq!(report.sends_per_fsync, Some(5.0));
        assert!((report.latency_ms.p50 - 0.5).abs() < 0.01);
        assert!((report.latency_ms.max - 1.0).abs() < 0.01);
        let json: serde_json::Value = serde_json::from_str(&report.to_json()).unwrap();
        assert_eq!(json["sends_per_fsync"], 5.0);
        let table = report.to_table();
        let ratio_line = table
            .lines()
            .find(|line| line.starts_with("sends/s ÷ fsyncs/s"))
            .unwrap_or_else(|| panic!("no ratio row: {table}"));
        assert_eq!(ratio_line.split_whitespace().last(), Some("5.0"), "{table}");
    }

    #[test]
    fn missing_metrics_are_reported_not_fatal() {
        let report = BenchReport::from_measurements(measurements(Err("connection refused".into())));
        assert_eq!(report.fsyncs_per_second, None);
        assert_eq!(report.sends_per_fsync, None);
        assert!(
            report
                .to_table()
                .contains("unavailable (connection refused)")
        );
        let json: serde_json::Value = serde_json::from_str(&report.to_json()).unwrap();
        assert_eq!(json["fsyncs_per_second"], serde_json::Value::Null);
        assert_eq!(json["fsyncs_unavailable_reason"], "connection refused");
    }

    #[test]
    fn end_to_end_latency_and_csv_rows_follow_the_header() {
        let mut m = measurements(Ok((250.0, 2.5)));
        let mut e2e = Histogram::new_with_bounds(1, 60_000_000, 3).unwrap();
        for us in [2_000, 4_000, 6_000] {
            e2e.record(us).unwrap();
        }
        m.consumers = 2;
        m.consumed = Some((3, e2e));
        m.target_events_per_second = Some(500.0);
        let report = BenchReport::from_measurements(m);
        let l = report
            .end_to_end_latency_ms
            .expect("measured with consumers");
        assert!(
            (l.p50 - 4.0).abs() < 0.01 && (l.max - 6.0).abs() < 0.01,
            "{l:?}"
        );
        assert!(report.to_table().contains("(3 events received)"));
        assert!(report.to_table().contains("500 events/s"));
        let row = report.to_csv_row();
        let header: Vec<&str> = CSV_HEADER.split(',').collect();
        let fields: Vec<&str> = row.split(',').collect();
        assert_eq!(fields.len(), header.len(), "{row}");
        let field = |name: &str| fields[header.iter().position(|h| *h == name).unwrap()];
        assert_eq!(field("events_received"), "3");
        assert_eq!(field("target_events_per_second"), "500");
        assert_eq!(field("key_distribution"), "partition");
        assert_eq!(field("node_cpu_percent"), "42");
        assert_eq!(field("node_resident_mib"), "100");
        let max: f64 = field("end_to_end_max_ms").parse().unwrap();
        assert!((max - 6.0).abs() < 0.01, "{row}");

        // Without consumers the end-to-end columns stay empty.
        let report = BenchReport::from_measurements(measurements(Ok((250.0, 2.5))));
        assert!(report.end_to_end_latency_ms.is_none());
        let row = report.to_csv_row();
        let fields: Vec<&str> = row.split(',').collect();
        assert_eq!(
            fields[header
                .iter()
                .position(|h| *h == "end_to_end_p50_ms")
                .unwrap()],
            ""
        );
        assert!(report.to_table().contains("not measured (--consumers 0)"));
        assert!(
            report
                .to_table()
                .contains("http://n1/metrics: CPU 42.0% of one core, resident 100.0 MiB"),
            "{}",
            report.to_table()
        );
    }

    #[test]
    fn csv_file_gets_one_header_then_a_row_per_report() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("runs.csv");
        let report = BenchReport::from_measurements(measurements(Ok((250.0, 2.5))));
        append_csv(&path, &report).unwrap();
        append_csv(&path, &report).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines,
            [CSV_HEADER, &report.to_csv_row(), &report.to_csv_row()]
        );
    }
}
