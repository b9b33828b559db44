//! `tributary receive`: print the events of one partition.

use std::io::Write as _;
use std::time::Duration;

use futures::StreamExt as _;
use tokio::time::Instant;

use super::OutputFormat;
use super::event_format::{event_json_line, event_text_line};
use crate::{Client, EventPosition};

/// Events asked for per response when `--count` does not ask for fewer.
const RECEIVE_BATCH_MAX: u64 = 300;

#[derive(Debug, clap::Args)]
pub struct ReceiveArgs {
    /// The event hub to read from.
    pub hub: String,
    /// The partition to read (e.g. 0).
    #[arg(long)]
    pub partition: String,
    /// The consumer group to read as.
    #[arg(long, default_value = "$Default")]
    pub group: String,
    /// Where to start: `earliest` (the first retained event), `latest` (only events sent
    /// from now on), `offset:N` or `seq:N` (starting AT that offset or sequence number,
    /// inclusive), or `time:RFC3339` (events enqueued after that time, exclusive; e.g.
    /// time:2024-05-01T12:00:00Z).
    #[arg(long, default_value = "earliest", value_name = "POSITION")]
    pub from: EventPosition,
    /// Stop after this many events.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    pub count: Option<u64>,
    /// Stop when no event arrived for this long (e.g. 5s, 1m). Without it, wait for new
    /// events until --count is reached or the command is interrupted.
    #[arg(long, value_parser = humantime::parse_duration)]
    pub timeout: Option<Duration>,
    /// Print bodies as base64 instead of UTF-8 text (bodies that are not UTF-8 are always
    /// base64).
    #[arg(long)]
    pub base64: bool,
    /// Read with this owner level (Event Hubs' epoch): displaces the consumer group's readers
    /// of the partition with an equal or lower level and those without one.
    #[arg(long, value_name = "LEVEL")]
    pub owner_level: Option<i64>,
    /// The name other readers see in quota and displacement errors (and `group show`).
    #[arg(long, value_name = "NAME", default_value = "")]
    pub reader_name: String,
}

pub(crate) async fn run(
    client: &Client,
    output: OutputFormat,
    args: ReceiveArgs,
) -> anyhow::Result<()> {
    let max_batch = args
        .count
        .unwrap_or(RECEIVE_BATCH_MAX)
        .min(RECEIVE_BATCH_MAX) as u32;
    let mut batches = client
        .consumer()
        .receive_with(
            &args.hub,
            &args.group,
            &args.partition,
            args.from,
            crate::ReceiveOptions {
                max_batch,
                owner_level: args.owner_level,
                reader_name: args.reader_name.clone(),
            },
        )
        .await?;
    let mut remaining = args.count.unwrap_or(u64::MAX);
    let mut last_event_at = Instant::now();
    while remaining > 0 {
        let next = match args.timeout {
            None => batches.next().await,
            Some(timeout) => {
                match tokio::time::timeout_at(last_event_at + timeout, batches.next()).await {
                    Ok(next) => next,
                    Err(_elapsed) => break,
                }
            }
        };
        let Some(batch) = next else { break };
        let batch = batch?;
        if batch.is_empty() {
            continue;
        }
        last_event_at = Instant::now();
        let take = batch
            .len()
            .min(usize::try_from(remaining).unwrap_or(usize::MAX));
        let mut text = String::new();
        for event in &batch[..take] {
            let line = match output {
                OutputFormat::Json => event_json_line(&args.partition, event, args.base64),
                OutputFormat::Table => event_text_line(event, args.base64),
            };
            text.push_str(&line);
            text.push('\n');
        }
        remaining -= take as u64;
        if !write_stdout(&text)? {
            break;
        }
    }
    Ok(())
}

/// Writes and flushes, so events show up as they arrive. `false` when the reader of our
/// output has gone (e.g. `| head`): that ends the command quietly.
fn write_stdout(text: &str) -> anyhow::Result<bool> {
    let mut stdout = std::io::stdout().lock();
    match stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.flush())
    {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(false),
        Err(e) => Err(anyhow::Error::new(e).context("cannot write to standard output")),
    }
}
