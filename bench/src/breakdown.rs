//! `tributary bench --breakdown`: where a send's time goes. Every node's stage histograms
//! (`tributary_send_stage_seconds{stage=...}`, see `tributary_types::send_stage`) are read
//! before and after the run; the bucket counts' differences, summed over the nodes, give each
//! stage's count, mean, p50 and p99 during the run, and its share of the client's mean send
//! time.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use hdrhistogram::Histogram;
use serde::Serialize;
use tributary_types::send_stage::{SEND_STAGE_METRIC, SendStage};

/// One stage's histogram as a metrics page shows it, summed over its series.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct StageHistogram {
    /// (upper bound in seconds, cumulative count), by rising bound; the last is +Inf.
    buckets: Vec<(f64, f64)>,
    sum: f64,
    count: f64,
}

/// Every stage's histogram on one page, by stage name.
pub(crate) type StagePage = BTreeMap<String, StageHistogram>;

impl StageHistogram {
    fn add_bucket(&mut self, le: f64, count: f64) {
        match self.buckets.iter_mut().find(|(bound, _)| *bound == le) {
            Some((_, cumulative)) => *cumulative += count,
            None => {
                let at = self.buckets.partition_point(|(bound, _)| *bound < le);
                self.buckets.insert(at, (le, count));
            }
        }
    }

    /// What was recorded between `before` and `self` (a later read of the same series).
    fn since(&self, before: &StageHistogram) -> StageHistogram {
        let earlier = |le: f64| {
            before
                .buckets
                .iter()
                .find(|(bound, _)| *bound == le)
                .map_or(0.0, |(_, count)| *count)
        };
        StageHistogram {
            buckets: self
                .buckets
                .iter()
                .map(|&(le, count)| (le, (count - earlier(le)).max(0.0)))
                .collect(),
            sum: (self.sum - before.sum).max(0.0),
            count: (self.count - before.count).max(0.0),
        }
    }

    /// Adds another node's histogram of the same stage.
    fn merge(&mut self, other: &StageHistogram) {
        for &(le, count) in &other.buckets {
            self.add_bucket(le, count);
        }
        self.sum += other.sum;
        self.count += other.count;
    }

    fn mean(&self) -> Option<f64> {
        (self.count > 0.0).then(|| self.sum / self.count)
    }

    /// The `q` quantile in seconds, interpolated linearly within its bucket (as Prometheus'
    /// `histogram_quantile` does); one in the +Inf bucket is the highest finite bound.
    fn quantile(&self, q: f64) -> Option<f64> {
        let total = self.buckets.last().map_or(0.0, |(_, count)| *count);
        if total <= 0.0 {
            return None;
        }
        let rank = q.clamp(0.0, 1.0) * total;
        let (mut lower, mut below) = (0.0, 0.0);
        for &(le, cumulative) in &self.buckets {
            if cumulative >= rank && cumulative > below {
                if le.is_infinite() {
                    return Some(lower);
                }
                let fraction = (rank - below) / (cumulative - below);
                return Some(lower + (le - lower) * fraction);
            }
            lower = if le.is_finite() { le } else { lower };
            below = cumulative;
        }
        Some(lower)
    }
}

/// Reads the stage histograms from a metrics page in Prometheus' text format.
pub(crate) fn parse_page(text: &str) -> StagePage {
    let mut page = StagePage::new();
    for line in text.lines() {
        let Some(rest) = line.trim_start().strip_prefix(SEND_STAGE_METRIC) else {
            continue;
        };
        let (series, rest) = if let Some(rest) = rest.strip_prefix("_bucket{") {
            ("bucket", rest)
        } else if let Some(rest) = rest.strip_prefix("_sum{") {
            ("sum", rest)
        } else if let Some(rest) = rest.strip_prefix("_count{") {
            ("count", rest)
        } else {
            continue;
        };
        let Some((labels, after)) = labels(rest) else {
            continue;
        };
        let Some(value) = after
            .split_whitespace()
            .next()
            .and_then(crate::metrics::parse_sample)
        else {
            continue;
        };
        let Some(stage) = label(&labels, "stage") else {
            continue;
        };
        let histogram = page.entry(stage.to_owned()).or_default();
        match series {
            "bucket" => {
                if let Some(le) = label(&labels, "le").and_then(crate::metrics::parse_sample) {
                    histogram.add_bucket(le, value);
                }
            }
            "sum" => histogram.sum += value,
            _ => histogram.count += value,
        }
    }
    page
}

fn label<'a>(labels: &'a [(&'a str, String)], name: &str) -> Option<&'a str> {
    labels
        .iter()
        .find(|(key, _)| *key == name)
        .map(|(_, value)| value.as_str())
}

/// The labels of a series (given the text after its `{`) and the text after the `}`.
fn labels(text: &str) -> Option<(Vec<(&str, String)>, &str)> {
    let mut labels = Vec::new();
    let mut rest = text;
    loop {
        rest = rest.trim_start_matches([' ', ',']);
        if let Some(after) = rest.strip_prefix('}') {
            return Some((labels, after));
        }
        let (name, after) = rest.split_once("=\"")?;
        let mut value = String::new();
        let mut chars = after.char_indices();
        let end = loop {
            match chars.next()? {
                (_, '\\') => match chars.next()?.1 {
                    'n' => value.push('\n'),
                    other => value.push(other),
                },
                (i, '"') => break i,
                (_, c) => value.push(c),
            }
        };
        labels.push((name.trim(), value));
        rest = &after[end + 1..];
    }
}

/// Reads every node's stage histograms, in order.
pub(crate) async fn read_nodes(urls: &[String]) -> Vec<Result<StagePage, String>> {
    let reads = urls.iter().map(|url| async move {
        crate::metrics::http_get(url)
            .await
            .map(|text| parse_page(&text))
            .map_err(|error| format!("{error:#}"))
    });
    futures::future::join_all(reads).await
}

/// Where the sends of a run spent their time.
#[derive(Debug, Clone, Serialize)]
pub struct Breakdown {
    /// Nodes whose stage histograms were read before and after the run.
    pub nodes_read: usize,
    /// Why a node's could not be read.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub unavailable: Vec<String>,
    /// The send time the client measured: the whole every share is of.
    pub client_send: StageRow,
    /// What the client measured beyond the node's `total`: the request and reply on the
    /// wire, HTTP/2 and protobuf (the difference of the means).
    pub transport: StageRow,
    /// Each stage, `total` first (see `tributary_types::send_stage`).
    pub stages: Vec<StageRow>,
}

/// One stage's figures over a run, summed over the nodes.
#[derive(Debug, Clone, Serialize)]
pub struct StageRow {
    pub stage: String,
    /// The stage it runs inside of, in parallel with its siblings.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub within: Option<&'static str>,
    /// Samples: sends for the stages of a send on its leader, writes or messages for the
    /// others.
    pub count: u64,
    pub mean_ms: Option<f64>,
    pub p50_ms: Option<f64>,
    pub p99_ms: Option<f64>,
    /// The mean as a share of the client's mean send time, in %.
    pub share_percent: Option<f64>,
}

impl Breakdown {
    /// The breakdown of a run from each node's pages before and after it, and the client's
    /// send latencies (microseconds).
    pub(crate) fn new(
        urls: &[String],
        before: &[Result<StagePage, String>],
        after: &[Result<StagePage, String>],
        client_us: &Histogram<u64>,
    ) -> Breakdown {
        let mut run = StagePage::new();
        let mut unavailable = Vec::new();
        let mut nodes_read = 0;
        for (url, (before, after)) in urls.iter().zip(before.iter().zip(after)) {
            let (before, after) = match (before, after) {
                (Ok(before), Ok(after)) => (before, after),
                (Err(error), _) | (_, Err(error)) => {
                    unavailable.push(format!("{url}: {error}"));
                    continue;
                }
            };
            nodes_read += 1;
            for (stage, histogram) in after {
                let during =
                    histogram.since(before.get(stage).unwrap_or(&StageHistogram::default()));
                run.entry(stage.clone()).or_default().merge(&during);
            }
        }
        let ms = |us: u64| us as f64 / 1000.0;
        let client_mean_ms = (!client_us.is_empty()).then(|| client_us.mean() / 1000.0);
        let share = |mean_ms: Option<f64>| {
            mean_ms
                .zip(client_mean_ms.filter(|whole| *whole > 0.0))
                .map(|(part, whole)| part / whole * 100.0)
        };
        let row = |stage: SendStage| {
            let histogram = run.get(stage.name()).cloned().unwrap_or_default();
            let mean_ms = histogram.mean().map(|s| s * 1000.0);
            StageRow {
                stage: stage.name().to_owned(),
                within: stage.within().map(SendStage::name),
                count: histogram.count.round() as u64,
                mean_ms,
                p50_ms: histogram.quantile(0.5).map(|s| s * 1000.0),
                p99_ms: histogram.quantile(0.99).map(|s| s * 1000.0),
                share_percent: share(mean_ms),
            }
        };
        let mut stages = vec![row(SendStage::Total)];
        stages.extend(
            SendStage::ALL
                .into_iter()
                .filter(|stage| *stage != SendStage::Total)
                .map(row),
        );
        let transport_ms = client_mean_ms
            .zip(stages[0].mean_ms)
            .map(|(client, total)| client - total);
        Breakdown {
            nodes_read,
            unavailable,
            client_send: StageRow {
                stage: "client send".to_owned(),
                within: None,
                count: client_us.len(),
                mean_ms: client_mean_ms,
                p50_ms: (!client_us.is_empty()).then(|| ms(client_us.value_at_quantile(0.5))),
                p99_ms: (!client_us.is_empty()).then(|| ms(client_us.value_at_quantile(0.99))),
                share_percent: client_mean_ms.map(|_| 100.0),
            },
            transport: StageRow {
                stage: "transport".to_owned(),
                within: None,
                count: client_us.len(),
                mean_ms: transport_ms,
                p50_ms: None,
                p99_ms: None,
                share_percent: share(transport_ms),
            },
            stages,
        }
    }

    /// The breakdown as a table: the stages of a send indented under the one they are part
    /// of, then the storage shards' part of every durable log write.
    pub fn to_table(&self) -> String {
        let mut text = String::new();
        let _ = writeln!(
            text,
            "\nwhere a send's time goes ({} node(s) read; shares of the client's mean send time)",
            self.nodes_read
        );
        for reason in &self.unavailable {
            let _ = writeln!(text, "unavailable: {reason}");
        }
        let mut lines = vec![(0, &self.client_send), (1, &self.transport)];
        let mut storage = Vec::new();
        for row in &self.stages {
            match SendStage::from_name(&row.stage) {
                Some(SendStage::Total) => lines.push((1, row)),
                Some(
                    SendStage::StorageQueue
                    | SendStage::StorageLogWrite
                    | SendStage::StorageIndexCommit,
                ) => storage.push((1, row)),
                Some(stage) => lines.push((2 + depth(stage), row)),
                None => storage.push((1, row)),
            }
        }
        let width = 28;
        let _ = writeln!(
            text,
            "{:<width$}{:>9}{:>10}{:>10}{:>10}{:>9}",
            "stage", "count", "mean ms", "p50 ms", "p99 ms", "share"
        );
        let render = |text: &mut String, (indent, row): (usize, &StageRow)| {
            let figure =
                |value: Option<f64>| value.map_or_else(|| "-".to_owned(), |v| format!("{v:.3}"));
            let name = format!("{}{}", "  ".repeat(indent), row.stage);
            let count = if row.stage == "transport" {
                String::new()
            } else {
                row.count.to_string()
            };
            let share = row
                .share_percent
                .map_or_else(|| "-".to_owned(), |s| format!("{s:.1}%"));
            let _ = writeln!(
                text,
                "{name:<width$}{count:>9}{:>10}{:>10}{:>10}{share:>9}",
                figure(row.mean_ms),
                figure(row.p50_ms),
                figure(row.p99_ms),
            );
        };
        for line in lines {
            render(&mut text, line);
        }
        let _ = writeln!(
            text,
            "storage, per durable log write (leaders' and followers')"
        );
        for line in storage {
            render(&mut text, line);
        }
        text
    }
}

/// How many stages `stage` runs inside of.
fn depth(stage: SendStage) -> usize {
    let mut depth = 0;
    let mut at = stage;
    while let Some(parent) = at.within() {
        depth += 1;
        at = parent;
    }
    depth
}

#[cfg(test)]
mod tests {
    use super::*;

    const BEFORE: &str = "\
# TYPE tributary_send_stage_seconds histogram
tributary_send_stage_seconds_bucket{stage=\"commit\",le=\"0.001\"} 2
tributary_send_stage_seconds_bucket{stage=\"commit\",le=\"0.002\"} 4
tributary_send_stage_seconds_bucket{stage=\"commit\",le=\"+Inf\"} 4
tributary_send_stage_seconds_sum{stage=\"commit\"} 0.005
tributary_send_stage_seconds_count{stage=\"commit\"} 4
tributary_send_duration_seconds_bucket{hub=\"h\",le=\"0.001\"} 99
";

    const AFTER: &str = "\
tributary_send_stage_seconds_bucket{stage=\"commit\",le=\"0.001\"} 2
tributary_send_stage_seconds_bucket{stage=\"commit\",le=\"0.002\"} 54
tributary_send_stage_seconds_bucket{stage=\"commit\",le=\"+Inf\"} 104
tributary_send_stage_seconds_sum{stage=\"commit\"} 0.305
tributary_send_stage_seconds_count{stage=\"commit\"} 104
tributary_send_stage_seconds_bucket{stage=\"total\",le=\"0.001\"} 10
tributary_send_stage_seconds_bucket{stage=\"total\",le=\"+Inf\"} 10
tributary_send_stage_seconds_sum{stage=\"total\"} 0.005
tributary_send_stage_seconds_count{stage=\"total\"} 10
";

    #[test]
    fn reads_only_the_stage_histograms() {
        let page = parse_page(BEFORE);
        assert_eq!(page.len(), 1);
        let commit = &page["commit"];
        assert_eq!(
            commit.buckets,
            [(0.001, 2.0), (0.002, 4.0), (f64::INFINITY, 4.0)]
        );
        assert_eq!((commit.sum, commit.count), (0.005, 4.0));
    }

    #[test]
    fn labels_in_any_order_with_escapes() {
        let page = parse_page(
            "tributary_send_stage_seconds_bucket{le=\"0.5\", note=\"a \\\"}\\\" b\",stage=\"apply\"} 3\n",
        );
        assert_eq!(page["apply"].buckets, [(0.5, 3.0)]);
    }

    #[test]
    fn a_run_is_the_difference_of_its_reads() {
        let run = parse_page(AFTER)["commit"].since(&parse_page(BEFORE)["commit"]);
        assert_eq!(
            run.buckets,
            [(0.001, 0.0), (0.002, 50.0), (f64::INFINITY, 100.0)]
        );
        assert_eq!(run.count, 100.0);
        assert!((run.mean().unwrap() - 0.003).abs() < 1e-12);
    }

    #[test]
    fn quantiles_interpolate_within_their_bucket() {
        let histogram = StageHistogram {
            buckets: vec![
                (0.001, 10.0),
                (0.002, 30.0),
                (0.004, 40.0),
                (f64::INFINITY, 40.0),
            ],
            sum: 0.0,
            count: 40.0,
        };
        // Rank 20 of 40 is half-way through the second bucket (10..30).
        assert!((histogram.quantile(0.5).unwrap() - 0.0015).abs() < 1e-12);
        // Rank 4 is 40% through the first bucket, which starts at 0.
        assert!((histogram.quantile(0.1).unwrap() - 0.0004).abs() < 1e-12);
        assert!((histogram.quantile(1.0).unwrap() - 0.004).abs() < 1e-12);
        // Beyond the last finite bound: that bound.
        let overflow = StageHistogram {
            buckets: vec![(0.001, 1.0), (f64::INFINITY, 10.0)],
            sum: 0.0,
            count: 10.0,
        };
        assert_eq!(overflow.quantile(0.99), Some(0.001));
        assert_eq!(StageHistogram::default().quantile(0.5), None);
    }

    fn client(values_us: &[u64]) -> Histogram<u64> {
        let mut histogram = Histogram::new(3).unwrap();
        for value in values_us {
            histogram.record(*value).unwrap();
        }
        histogram
    }

    #[test]
    fn nodes_are_summed_and_shares_are_of_the_client_mean() {
        let urls = vec![
            "http://a/metrics".to_owned(),
            "http://b/metrics".to_owned(),
            "http://c/metrics".to_owned(),
        ];
        let before = vec![
            Ok(parse_page(BEFORE)),
            Ok(StagePage::new()),
            Err("refused".to_owned()),
        ];
        let after = vec![
            Ok(parse_page(AFTER)),
            Ok(parse_page(AFTER)),
            Ok(parse_page(AFTER)),
        ];
        // Client mean 1.5 ms.
        let breakdown = Breakdown::new(&urls, &before, &after, &client(&[1000, 2000]));
        assert_eq!(breakdown.nodes_read, 2);
        assert_eq!(breakdown.unavailable, ["http://c/metrics: refused"]);
        let row = |name: &str| breakdown.stages.iter().find(|r| r.stage == name).unwrap();
        // Node a: 100 commits since its first read; node b: 104 (none before).
        let commit = row("commit");
        assert_eq!(commit.count, 204);
        assert_eq!(commit.within, None);
        let mean = commit.mean_ms.unwrap();
        assert!((mean - (0.300 + 0.305) / 204.0 * 1000.0).abs() < 1e-9);
        assert!((commit.share_percent.unwrap() - mean / 1.5 * 100.0).abs() < 1e-9);
        let total = row("total");
        assert_eq!(total.count, 20);
        assert!((total.mean_ms.unwrap() - 0.5).abs() < 1e-9);
        assert!((breakdown.transport.mean_ms.unwrap() - 1.0).abs() < 1e-9);
        assert_eq!(breakdown.client_send.count, 2);
        assert_eq!(breakdown.client_send.share_percent, Some(100.0));
        // Stages nothing recorded show no figures.
        let apply = row("apply");
        assert_eq!((apply.count, apply.mean_ms, apply.p50_ms), (0, None, None));
        assert_eq!(row("follower_write").within, Some("follower_handle"));
        assert_eq!(breakdown.stages[0].stage, "total");
        assert_eq!(breakdown.stages.len(), SendStage::ALL.len());
    }

    #[test]
    fn the_table_indents_each_stage_under_the_one_it_is_part_of() {
        let urls = vec!["http://a/metrics".to_owned()];
        let breakdown = Breakdown::new(
            &urls,
            &[Ok(StagePage::new())],
            &[Ok(parse_page(AFTER))],
            &client(&[1000]),
        );
        let table = breakdown.to_table();
        let line = |name: &str| {
            table
                .lines()
                .find(|l| l.trim_start().starts_with(&format!("{name} ")))
                .unwrap_or_else(|| panic!("no line for {name} in\n{table}"))
                .to_owned()
        };
        let indent = |name: &str| line(name).len() - line(name).trim_start().len();
        assert_eq!(indent("client send"), 0);
        assert_eq!(indent("total"), 2);
        assert_eq!(indent("front_end"), 4);
        assert_eq!(indent("commit"), 4);
        assert_eq!(indent("replication"), 6);
        assert_eq!(indent("follower_handle"), 8);
        assert_eq!(indent("follower_write"), 10);
        assert_eq!(indent("storage_log_write"), 2);
        // total: 10 sends of 0.5 ms on average, half the client's 1 ms.
        let total_line = line("total");
        let total: Vec<&str> = total_line.split_whitespace().collect();
        assert_eq!(total[..3], ["total", "10", "0.500"]);
        assert_eq!(total.last(), Some(&"50.0%"));
        let transport: Vec<String> = line("transport")
            .split_whitespace()
            .map(str::to_owned)
            .collect();
        assert_eq!(transport[..2], ["transport", "0.500"]);
        // Rows come in the order a send meets its stages, storage after them.
        let order: Vec<usize> = [
            "total",
            "front_end",
            "appender_wait",
            "commit",
            "leader_log_write",
            "apply",
            "reply",
            "storage_queue",
        ]
        .iter()
        .map(|name| table.find(&line(name)).unwrap())
        .collect();
        assert!(order.windows(2).all(|w| w[0] < w[1]), "{table}");
    }
}
