//! What a failover bench run measured, as a table or one JSON object.

use std::fmt::Write as _;
use std::time::Duration;

use serde::Serialize;

/// The targets for recovery after a leader is killed.
pub(crate) const MEDIAN_TARGET: Duration = Duration::from_millis(1500);
pub(crate) const MAX_TARGET: Duration = Duration::from_secs(3);

/// One kill: which partition, whose leader died, and how long until the partition accepted
/// a write again (`None`: not within the recovery timeout).
#[derive(Debug, Clone, Serialize)]
pub struct KillRecord {
    pub event_hub: String,
    pub partition_id: String,
    pub killed_node: u64,
    pub recovery_seconds: Option<f64>,
    /// From the restart until the node was ready and every replica caught up.
    pub rejoin_seconds: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct FailoverReport {
    pub nodes: u32,
    pub partitions: u32,
    pub replication_factor: u32,
    pub producers: u32,
    pub batch_size: u32,
    pub event_size_bytes: usize,
    /// Background sends acknowledged, and refused or failed (retried by the producers).
    pub load_sends: u64,
    pub load_errors: u64,
    pub kills: Vec<KillRecord>,
    /// Kills after which the partition accepted writes again.
    pub recovered: usize,
    /// Recovery times of the recovered kills, in seconds; `None` without any.
    pub median_seconds: Option<f64>,
    pub p90_seconds: Option<f64>,
    pub max_seconds: Option<f64>,
    pub median_target_seconds: f64,
    pub max_target_seconds: f64,
    /// Met only if every kill recovered and the statistic is within its target.
    pub median_target_met: bool,
    pub max_target_met: bool,
}

/// The raw measurements a report is computed from.
pub(crate) struct Measurements {
    pub(crate) nodes: u32,
    pub(crate) partitions: u32,
    pub(crate) replication_factor: u32,
    pub(crate) producers: u32,
    pub(crate) batch_size: u32,
    pub(crate) event_size_bytes: usize,
    pub(crate) load_sends: u64,
    pub(crate) load_errors: u64,
    pub(crate) kills: Vec<KillRecord>,
}

impl FailoverReport {
    pub(crate) fn from_measurements(m: Measurements) -> FailoverReport {
        let mut seconds: Vec<f64> = m.kills.iter().filter_map(|k| k.recovery_seconds).collect();
        seconds.sort_by(f64::total_cmp);
        let all_recovered = seconds.len() == m.kills.len() && !m.kills.is_empty();
        let median = median(&seconds);
        let max = seconds.last().copied();
        let within = |value: Option<f64>, target: Duration| {
            all_recovered && value.is_some_and(|v| v <= target.as_secs_f64())
        };
        FailoverReport {
            nodes: m.nodes,
            partitions: m.partitions,
            replication_factor: m.replication_factor,
            producers: m.producers,
            batch_size: m.batch_size,
            event_size_bytes: m.event_size_bytes,
            load_sends: m.load_sends,
            load_errors: m.load_errors,
            recovered: seconds.len(),
            median_seconds: median,
            p90_seconds: nearest_rank(&seconds, 0.9),
            max_seconds: max,
            median_target_seconds: MEDIAN_TARGET.as_secs_f64(),
            max_target_seconds: MAX_TARGET.as_secs_f64(),
            median_target_met: within(median, MEDIAN_TARGET),
            max_target_met: within(max, MAX_TARGET),
            kills: m.kills,
        }
    }

    pub fn targets_met(&self) -> bool {
        self.median_target_met && self.max_target_met
    }

    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("a failover report is always serializable")
    }

    pub fn to_table(&self) -> String {
        let secs = |v: Option<f64>| v.map_or_else(|| "-".to_owned(), |v| format!("{v:.3}s"));
        let verdict = |met: bool| if met { "met" } else { "MISSED" };
        let rows = [
            (
                "cluster",
                format!(
                    "{} nodes, {} partitions, replication factor {}",
                    self.nodes, self.partitions, self.replication_factor
                ),
            ),
            (
                "load",
                format!(
                    "{} producers, {} events of {} B per send: {} sends, {} errors",
                    self.producers,
                    self.batch_size,
                    self.event_size_bytes,
                    self.load_sends,
                    self.load_errors
                ),
            ),
            ("kills", self.kills.len().to_string()),
            ("recovered", self.recovered.to_string()),
            (
                "recovery median",
                format!(
                    "{}  (target ≤ {:.1}s: {})",
                    secs(self.median_seconds),
                    self.median_target_seconds,
                    verdict(self.median_target_met)
                ),
            ),
            ("recovery p90", secs(self.p90_seconds)),
            (
                "recovery max",
                format!(
                    "{}  (target ≤ {:.1}s: {})",
                    secs(self.max_seconds),
                    self.max_target_seconds,
                    verdict(self.max_target_met)
                ),
            ),
            ("result", self.verdict()),
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

    fn verdict(&self) -> String {
        let unrecovered = self.kills.len() - self.recovered;
        let mut misses = Vec::new();
        if unrecovered > 0 {
            misses.push(format!(
                "{unrecovered} of {} kills did not recover",
                self.kills.len()
            ));
        }
        if !self.median_target_met {
            misses.push("the median is above its target".to_owned());
        }
        if !self.max_target_met {
            misses.push("the max is above its target".to_owned());
        }
        if misses.is_empty() {
            "targets met".to_owned()
        } else {
            format!("TARGETS MISSED: {}", misses.join("; "))
        }
    }
}

/// The middle value of sorted `values` (the mean of the two middle ones for an even count).
fn median(sorted: &[f64]) -> Option<f64> {
    let n = sorted.len();
    match n {
        0 => None,
        _ if n % 2 == 1 => Some(sorted[n / 2]),
        _ => Some((sorted[n / 2 - 1] + sorted[n / 2]) / 2.0),
    }
}

/// The nearest-rank `quantile` (0 < q ≤ 1) of sorted `values`: the smallest value with at
/// least that share of values at or below it.
fn nearest_rank(sorted: &[f64], quantile: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let rank = (quantile * sorted.len() as f64).ceil() as usize;
    Some(sorted[rank.clamp(1, sorted.len()) - 1])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kill(recovery_seconds: Option<f64>) -> KillRecord {
        KillRecord {
            event_hub: "h".into(),
            partition_id: "0".into(),
            killed_node: 1,
            recovery_seconds,
            rejoin_seconds: 2.0,
        }
    }

    fn report(recoveries: &[Option<f64>]) -> FailoverReport {
        FailoverReport::from_measurements(Measurements {
            nodes: 3,
            partitions: 100,
            replication_factor: 3,
            producers: 4,
            batch_size: 10,
            event_size_bytes: 100,
            load_sends: 1000,
            load_errors: 3,
            kills: recoveries.iter().map(|r| kill(*r)).collect(),
        })
    }

    #[test]
    fn statistics_of_recovery_times() {
        assert_eq!(median(&[]), None);
        assert_eq!(median(&[1.0, 2.0, 4.0]), Some(2.0));
        assert_eq!(median(&[1.0, 2.0, 4.0, 10.0]), Some(3.0));
        let ten: Vec<f64> = (1..=10).map(f64::from).collect();
        assert_eq!(nearest_rank(&ten, 0.9), Some(9.0));
        assert_eq!(nearest_rank(&ten, 1.0), Some(10.0));
        assert_eq!(nearest_rank(&[5.0], 0.9), Some(5.0));
        assert_eq!(nearest_rank(&[], 0.9), None);
    }

    #[test]
    fn targets_met_within_bounds() {
        let r = report(&[Some(1.2), Some(0.9), Some(2.5)]);
        assert_eq!(r.recovered, 3);
        assert_eq!(r.median_seconds, Some(1.2));
        assert_eq!(r.max_seconds, Some(2.5));
        assert!(r.targets_met());
        let table = r.to_table();
        assert!(table.contains("kills            3"), "{table}");
        assert!(
            table.contains("recovery median  1.200s  (target ≤ 1.5s: met)"),
            "{table}"
        );
        assert!(table.contains("result           targets met"), "{table}");
        let json: serde_json::Value = serde_json::from_str(&r.to_json()).unwrap();
        assert_eq!(json["kills"].as_array().unwrap().len(), 3);
        assert_eq!(json["max_target_met"], true);
    }

    #[test]
    fn slow_or_unrecovered_kills_miss_the_targets() {
        let slow = report(&[Some(1.6), Some(1.7), Some(3.5)]);
        assert!(!slow.median_target_met && !slow.max_target_met);
        assert!(
            slow.to_table()
                .contains("TARGETS MISSED: the median is above its target; the max is above")
        );

        let lost = report(&[Some(0.5), None, Some(0.7)]);
        assert_eq!(lost.recovered, 2);
        assert_eq!(lost.median_seconds, Some(0.6));
        assert!(
            !lost.targets_met(),
            "a kill that never recovered misses both"
        );
        assert!(lost.to_table().contains("1 of 3 kills did not recover"));
    }
}
