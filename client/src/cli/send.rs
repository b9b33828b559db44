//! `tributary send`: send events from the command line.

use std::collections::BTreeSet;
use std::io::IsTerminal as _;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use bytes::Bytes;
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::json;
use tokio::io::{AsyncBufRead, AsyncBufReadExt as _, BufReader};

use super::OutputFormat;
use super::output::{sort_partition_ids, time_json, time_text};
use crate::{Client, ClientError, ErrorReason, EventData, SendResponse, SendTarget};

/// Events per send when `--batch-size` is not given and events come from a file or are
/// generated.
const BATCH_SIZE_DEFAULT: usize = 100;
/// Bytes in a megabyte for the rates we print (decimal, as network rates are).
const BYTES_PER_MB: f64 = 1_000_000.0;

#[derive(Debug, clap::Args)]
#[command(group(clap::ArgGroup::new("source").required(true).args(["body", "file", "count"])))]
pub struct SendArgs {
    /// The event hub to send to.
    pub hub: String,
    /// Send to the partition this key hashes to; events with the same key stay in order.
    /// Without this or --partition, the service spreads batches round robin.
    #[arg(long, conflicts_with = "partition")]
    pub partition_key: Option<String>,
    /// Send to this partition id (e.g. 0).
    #[arg(long)]
    pub partition: Option<String>,
    /// Send one event with this text as its body.
    #[arg(long)]
    pub body: Option<String>,
    /// Send one event per line of this file ('-' reads standard input).
    #[arg(long)]
    pub file: Option<PathBuf>,
    /// Send this many generated events (with --size).
    #[arg(long, requires = "size", value_parser = clap::value_parser!(u64).range(1..))]
    pub count: Option<u64>,
    /// Body size in bytes of each generated event (with --count).
    #[arg(long, requires = "count")]
    pub size: Option<usize>,
    /// Events per send request; each request lands atomically in one partition
    /// [default: 1 with --body, 100 otherwise].
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    pub batch_size: Option<u32>,
}

pub(crate) async fn run(
    client: &Client,
    output: OutputFormat,
    args: SendArgs,
) -> anyhow::Result<()> {
    let target = match (args.partition_key.clone(), args.partition.clone()) {
        (Some(key), _) => SendTarget::PartitionKey(key),
        (None, Some(id)) => SendTarget::PartitionId(id),
        (None, None) => SendTarget::Any,
    };
    let single_body = args.body.is_some();
    let batch_size = match args.batch_size {
        Some(n) => n as usize,
        None if single_body => 1,
        None => BATCH_SIZE_DEFAULT,
    };
    let mut source = EventSource::open(&args).await?;
    let progress = progress_bar(&source);
    let producer = client.producer();
    let mut summary = SendSummary::default();
    let started = Instant::now();
    loop {
        let batch = source.next_batch(batch_size).await?;
        if batch.is_empty() {
            break;
        }
        let events = batch.len() as u64;
        let bytes: u64 = batch.iter().map(|e| e.body.len() as u64).sum();
        let response = producer
            .send(&args.hub, target.clone(), batch)
            .await
            .map_err(|e| with_hint(e, batch_size))?;
        progress.inc(events);
        summary.record(events, bytes, response);
    }
    summary.elapsed = started.elapsed();
    progress.finish_and_clear();
    match output {
        OutputFormat::Json => println!("{}", summary.to_json(single_body)),
        OutputFormat::Table => print!("{}", summary.to_text(single_body)),
    }
    Ok(())
}

/// Where the events of one `send` come from.
enum EventSource {
    Body(Option<Bytes>),
    Lines(Box<dyn AsyncBufRead + Unpin + Send>),
    Generated { remaining: u64, body: Bytes },
}

impl EventSource {
    async fn open(args: &SendArgs) -> anyhow::Result<EventSource> {
        if let Some(body) = &args.body {
            return Ok(EventSource::Body(Some(Bytes::from(body.clone()))));
        }
        if let Some(path) = &args.file {
            if path.as_os_str() == "-" {
                return Ok(EventSource::Lines(Box::new(BufReader::new(
                    tokio::io::stdin(),
                ))));
            }
            let file = tokio::fs::File::open(path)
                .await
                .with_context(|| format!("cannot open {}", path.display()))?;
            return Ok(EventSource::Lines(Box::new(BufReader::new(file))));
        }
        match (args.count, args.size) {
            (Some(count), Some(size)) => Ok(EventSource::Generated {
                remaining: count,
                body: generated_body(size),
            }),
            // clap's argument group makes exactly one source present.
            _ => unreachable!("clap requires --body, --file or --count with --size"),
        }
    }

    /// Up to `max` events; empty when the source is exhausted.
    async fn next_batch(&mut self, max: usize) -> anyhow::Result<Vec<EventData>> {
        match self {
            EventSource::Body(body) => {
                Ok(body.take().map(EventData::from_body).into_iter().collect())
            }
            EventSource::Generated { remaining, body } => {
                let n = (*remaining).min(max as u64);
                *remaining -= n;
                Ok((0..n).map(|_| EventData::from_body(body.clone())).collect())
            }
            EventSource::Lines(reader) => {
                let mut batch = Vec::new();
                while batch.len() < max {
                    let mut line = Vec::new();
                    let read = reader
                        .read_until(b'\n', &mut line)
                        .await
                        .context("cannot read the events file")?;
                    if read == 0 {
                        break;
                    }
                    if line.last() == Some(&b'\n') {
                        line.pop();
                        if line.last() == Some(&b'\r') {
                            line.pop();
                        }
                    }
                    batch.push(EventData::from_body(line));
                }
                Ok(batch)
            }
        }
    }
}

/// A readable repeating pattern, so generated events look sane when received.
fn generated_body(size: usize) -> Bytes {
    const PATTERN: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    PATTERN
        .iter()
        .copied()
        .cycle()
        .take(size)
        .collect::<Vec<u8>>()
        .into()
}

/// A progress bar on stderr when it is a terminal; hidden otherwise.
fn progress_bar(source: &EventSource) -> ProgressBar {
    if !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    match source {
        EventSource::Body(_) => ProgressBar::hidden(),
        EventSource::Generated { remaining, .. } => {
            let bar = ProgressBar::new(*remaining);
            bar.set_style(
                ProgressStyle::with_template(
                    "{wide_bar} {human_pos}/{human_len} events ({per_sec}, eta {eta})",
                )
                .expect("the progress template is valid"),
            );
            bar
        }
        EventSource::Lines(_) => {
            let bar = ProgressBar::new_spinner();
            bar.set_style(
                ProgressStyle::with_template("{spinner} {human_pos} events ({per_sec})")
                    .expect("the progress template is valid"),
            );
            bar.enable_steady_tick(Duration::from_millis(100));
            bar
        }
    }
}

/// "1 event", "3 events", "2 batches".
fn counted(n: u64, noun: &str) -> String {
    match (n, noun.ends_with('h')) {
        (1, _) => format!("1 {noun}"),
        (_, true) => format!("{n} {noun}es"),
        (_, false) => format!("{n} {noun}s"),
    }
}

/// Adds what to do about a batch that is too large.
fn with_hint(error: ClientError, batch_size: usize) -> anyhow::Error {
    if error.reason() == Some(ErrorReason::MessageTooLarge) && batch_size > 1 {
        anyhow::Error::new(error).context(format!(
            "a batch of {batch_size} events is too large; try a smaller --batch-size"
        ))
    } else {
        error.into()
    }
}

#[derive(Default)]
struct SendSummary {
    events: u64,
    bytes: u64,
    batches: u64,
    partitions: BTreeSet<String>,
    elapsed: Duration,
    first: Option<SendResponse>,
}

impl SendSummary {
    fn record(&mut self, events: u64, bytes: u64, response: SendResponse) {
        self.events += events;
        self.bytes += bytes;
        self.batches += 1;
        self.partitions.insert(response.partition_id.clone());
        if self.first.is_none() {
            self.first = Some(response);
        }
    }

    fn partitions(&self) -> Vec<String> {
        let mut ids: Vec<String> = self.partitions.iter().cloned().collect();
        sort_partition_ids(&mut ids);
        ids
    }

    fn events_per_second(&self) -> f64 {
        self.events as f64 / self.elapsed.as_secs_f64().max(f64::EPSILON)
    }

    fn megabytes_per_second(&self) -> f64 {
        self.bytes as f64 / BYTES_PER_MB / self.elapsed.as_secs_f64().max(f64::EPSILON)
    }

    fn to_json(&self, single_body: bool) -> serde_json::Value {
        let mut value = json!({
            "events": self.events,
            "bytes": self.bytes,
            "batches": self.batches,
            "partitions": self.partitions(),
            "elapsed_ms": self.elapsed.as_secs_f64() * 1000.0,
            "events_per_second": self.events_per_second(),
            "megabytes_per_second": self.megabytes_per_second(),
        });
        if let (true, Some(first)) = (single_body, &self.first) {
            value["partition"] = json!(first.partition_id);
            value["sequence_number"] = json!(first.first_sequence_number);
            value["offset"] = json!(first.offsets.first());
            value["enqueued_time"] = time_json(first.enqueued_time_ms);
        }
        value
    }

    fn to_text(&self, single_body: bool) -> String {
        let mut text = String::new();
        if let (true, Some(first)) = (single_body, &self.first) {
            text.push_str(&format!(
                "sent to partition {}: sequence number {}, offset {}, enqueued {}\n",
                first.partition_id,
                first.first_sequence_number,
                first.offsets.first().map_or("?", String::as_str),
                time_text(first.enqueued_time_ms),
            ));
        }
        let partitions = self.partitions();
        text.push_str(&format!(
            "sent {} ({:.2} MB) in {} to {} {} in {:.3}s: {:.0} events/s, {:.2} MB/s\n",
            counted(self.events, "event"),
            self.bytes as f64 / BYTES_PER_MB,
            counted(self.batches, "batch"),
            if partitions.len() == 1 {
                "partition"
            } else {
                "partitions"
            },
            partitions.join(", "),
            self.elapsed.as_secs_f64(),
            self.events_per_second(),
            self.megabytes_per_second(),
        ));
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn lines_become_events_without_line_endings() {
        let input: &[u8] = b"one\r\ntwo\n\nfour";
        let mut source = EventSource::Lines(Box::new(BufReader::new(input)));
        let first = source.next_batch(3).await.unwrap();
        let bodies: Vec<&[u8]> = first.iter().map(|e| e.body.as_ref()).collect();
        assert_eq!(bodies, [&b"one"[..], b"two", b""]);
        let rest = source.next_batch(3).await.unwrap();
        assert_eq!(rest.len(), 1);
        assert_eq!(rest[0].body.as_ref(), b"four");
        assert!(source.next_batch(3).await.unwrap().is_empty());
    }

    #[tokio::test]
    async fn generated_events_come_in_batches_of_the_right_size() {
        let mut source = EventSource::Generated {
            remaining: 5,
            body: generated_body(40),
        };
        assert_eq!(source.next_batch(2).await.unwrap().len(), 2);
        assert_eq!(source.next_batch(2).await.unwrap().len(), 2);
        let last = source.next_batch(2).await.unwrap();
        assert_eq!(last.len(), 1);
        assert_eq!(last[0].body.len(), 40);
        assert!(source.next_batch(2).await.unwrap().is_empty());
    }

    #[test]
    fn summary_json_reports_the_single_event() {
        let mut summary = SendSummary::default();
        summary.record(
            1,
            5,
            SendResponse {
                partition_id: "2".into(),
                first_sequence_number: 17,
                offsets: vec!["4096".into()],
                enqueued_time_ms: 1_714_564_800_250,
            },
        );
        summary.elapsed = Duration::from_millis(10);
        let value = summary.to_json(true);
        assert_eq!(value["events"], 1);
        assert_eq!(value["partitions"], json!(["2"]));
        assert_eq!(value["partition"], "2");
        assert_eq!(value["sequence_number"], 17);
        assert_eq!(value["offset"], "4096");
        assert_eq!(value["enqueued_time"], "2024-05-01T12:00:00.250Z");
        assert_eq!(summary.to_json(false).get("partition"), None);
        let text = summary.to_text(true);
        assert!(
            text.starts_with("sent to partition 2: sequence number 17, offset 4096"),
            "{text}"
        );
        assert!(
            text.contains("sent 1 event (0.00 MB) in 1 batch to partition 2 in 0.010s"),
            "{text}"
        );
    }
}
