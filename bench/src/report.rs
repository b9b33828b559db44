//! What a bench run measured, as a table or one JSON object.

use std::fmt::Write as _;

use hdrhistogram::Histogram;
use serde::Serialize;

/// Bytes in a megabyte for the rates we print (decimal, as network rates are).
const BYTES_PER_MB: f64 = 1_000_000.0;

#[derive(Debug, Clone, Serialize)]
pub struct BenchReport {
    pub hub: String,
    pub partitions: u32,
    pub producers: u32,
    pub event_size_bytes: usize,
    pub batch_size: u32,
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
    /// Send latency of acknowledged sends.
    pub latency_ms: LatencyReport,
    /// Storage fsyncs per second on the node behind `--metrics-url`; `None` when unavailable.
    pub fsyncs_per_second: Option<f64>,
    /// sends/s ÷ fsyncs/s: how many sends shared one fsync.
    pub sends_per_fsync: Option<f64>,
    /// Why fsyncs/s is unavailable.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fsyncs_unavailable_reason: Option<String>,
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
    pub(crate) hub: String,
    pub(crate) partitions: u32,
    pub(crate) producers: u32,
    pub(crate) event_size_bytes: usize,
    pub(crate) batch_size: u32,
    pub(crate) elapsed_seconds: f64,
    pub(crate) sends: u64,
    pub(crate) errors: u64,
    /// Send latencies in microseconds.
    pub(crate) latency_us: Histogram<u64>,
    /// fsyncs during the run and the seconds between the two metric reads, or why unknown.
    pub(crate) fsyncs: Result<(f64, f64), String>,
}

impl BenchReport {
    pub(crate) fn from_measurements(m: Measurements) -> BenchReport {
        let elapsed = m.elapsed_seconds.max(f64::EPSILON);
        let events_sent = m.sends * u64::from(m.batch_size);
        let sends_per_second = m.sends as f64 / elapsed;
        let ms = |us: u64| us as f64 / 1000.0;
        let latency_ms = LatencyReport {
            p50: ms(m.latency_us.value_at_quantile(0.5)),
            p99: ms(m.latency_us.value_at_quantile(0.99)),
            p999: ms(m.latency_us.value_at_quantile(0.999)),
            max: ms(m.latency_us.max()),
        };
        let (fsyncs_per_second, fsyncs_unavailable_reason) = match m.fsyncs {
            Ok((fsyncs, seconds)) => (Some(fsyncs / seconds.max(f64::EPSILON)), None),
            Err(reason) => (None, Some(reason)),
        };
        let sends_per_fsync = fsyncs_per_second
            .filter(|f| *f > 0.0)
            .map(|f| sends_per_second / f);
        BenchReport {
            hub: m.hub,
            partitions: m.partitions,
            producers: m.producers,
            event_size_bytes: m.event_size_bytes,
            batch_size: m.batch_size,
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
            fsyncs_per_second,
            sends_per_fsync,
            fsyncs_unavailable_reason,
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
        let rows = [
            (
                "hub",
                format!("{} ({} partitions)", self.hub, self.partitions),
            ),
            (
                "load",
                format!(
                    "{} producers, {} events of {} B per send",
                    self.producers, self.batch_size, self.event_size_bytes
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
            ("fsyncs/s", fsyncs),
            ("sends/s ÷ fsyncs/s", ratio),
            ("errors", self.errors.to_string()),
        ];
        let width = rows
            .iter()
            .map(|(k, _)| k.chars().count())
            .max()
            .unwrap_or(0);
        let mut text = String::new();
        for (key, value) in rows {
            let pad = width - key.chars().count();
            let _ = writeln!(text, "{key}{}  {value}", " ".repeat(pad));
        }
        text
    }
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
            hub: "bench-1".into(),
            partitions: 4,
            producers: 8,
            event_size_bytes: 1000,
            batch_size: 10,
            elapsed_seconds: 2.0,
            sends: 1000,
            errors: 0,
            latency_us,
            fsyncs,
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
        assert!(report.to_table().contains("sends/s ÷ fsyncs/s  5.0"));
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
}
