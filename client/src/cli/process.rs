//! `tributary process`: a ready-made event processor. Start it several times (one per
//! machine or container) and the instances share the hub's partitions through the
//! cluster's checkpoint store; stop one (Ctrl-C, SIGTERM) and its partitions move to the
//! others at their next load-balancing round; kill one and they move once its claims expire.
//!
//! Events go to standard output (one line each, or a count per second with --count-only);
//! ownership changes and checkpoints go to standard error, as JSON lines with
//! `--output json`.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::json;

use super::OutputFormat;
use super::event_format::{event_json_line, event_text_line};
use crate::processor::{
    CloseReason, EventHandler, EventProcessor, EventProcessorOptions, LoadBalancingStrategy,
    PartitionContext,
};
use crate::{Client, EventPosition, ReceivedEvent};

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Strategy {
    /// Claim one partition per round until balanced.
    Balanced,
    /// Claim (and steal) everything this instance is short of at once.
    Greedy,
}

#[derive(Debug, clap::Args)]
pub struct ProcessArgs {
    /// The event hub to process.
    pub hub: String,
    /// The consumer group the instances share.
    #[arg(long, default_value = "$Default")]
    pub group: String,
    /// This instance's owner id in the checkpoint store; unique per instance (random when
    /// not given).
    #[arg(long, value_name = "ID")]
    pub instance_id: Option<String>,
    /// Checkpoint a partition after every this many of its events (and when it closes on
    /// shutdown).
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u64).range(1..))]
    pub checkpoint_every: u64,
    /// Print the number of events processed each second instead of the events.
    #[arg(long)]
    pub count_only: bool,
    /// How often instances balance partitions between them (e.g. 10s).
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    pub load_balancing_interval: Duration,
    /// A claim not renewed for this long is free to take (an instance that died).
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    pub ownership_expiration: Duration,
    /// How partitions are claimed.
    #[arg(long, value_enum, default_value_t = Strategy::Greedy)]
    pub strategy: Strategy,
    /// Where a partition without a checkpoint starts: `earliest`, `latest`, `offset:N`,
    /// `seq:N` or `time:RFC3339` (as for `receive`).
    #[arg(long, default_value = "earliest", value_name = "POSITION")]
    pub from: EventPosition,
    /// Print bodies as base64 instead of UTF-8 text.
    #[arg(long)]
    pub base64: bool,
}

struct Printer {
    output: OutputFormat,
    count_only: bool,
    base64: bool,
    checkpoint_every: u64,
    instance: String,
    processed: Arc<AtomicU64>,
    /// Per partition: the last event processed and how many since the last checkpoint.
    progress: Mutex<BTreeMap<String, (ReceivedEvent, u64)>>,
}

fn write_line(to_stderr: bool, line: &str) {
    // A reader of our output that went away (e.g. `| head`) is no reason to stop
    // processing; nothing to report either.
    if to_stderr {
        let _ = writeln!(std::io::stderr().lock(), "{line}");
    } else {
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "{line}").and_then(|()| out.flush());
    }
}

impl Printer {
    fn notice(&self, text: String, value: serde_json::Value) {
        match self.output {
            OutputFormat::Json => write_line(true, &value.to_string()),
            OutputFormat::Table => write_line(true, &format!("{}: {text}", self.instance)),
        }
    }

    async fn checkpoint(&self, context: &PartitionContext, event: &ReceivedEvent) {
        match context.checkpoint(event).await {
            Ok(()) => self.notice(
                format!(
                    "checkpoint partition {} at sequence number {}",
                    context.partition_id, event.sequence_number
                ),
                json!({
                    "instance_id": self.instance,
                    "checkpoint": {
                        "partition_id": context.partition_id,
                        "sequence_number": event.sequence_number,
                        "offset": event.offset,
                    }
                }),
            ),
            Err(err) => self.notice(
                format!("checkpoint of partition {} failed: {err}", context.partition_id),
                json!({"instance_id": self.instance, "error": err.to_string(), "partition_id": context.partition_id}),
            ),
        }
    }
}

#[tonic::async_trait]
impl EventHandler for Printer {
    async fn process_events(&self, context: &PartitionContext, events: Vec<ReceivedEvent>) {
        let Some(last) = events.last().cloned() else {
            return;
        };
        self.processed
            .fetch_add(events.len() as u64, Ordering::Relaxed);
        if !self.count_only {
            let mut text = String::new();
            for event in &events {
                let line = match self.output {
                    OutputFormat::Json => {
                        let line = event_json_line(&context.partition_id, event, self.base64);
                        // The event's own line, plus which instance processed it.
                        format!(
                            "{},\"instance_id\":{}}}",
                            line.strip_suffix('}').unwrap_or(&line),
                            serde_json::Value::String(self.instance.clone())
                        )
                    }
                    OutputFormat::Table => format!(
                        "partition={} {}",
                        context.partition_id,
                        event_text_line(event, self.base64)
                    ),
                };
                text.push_str(&line);
                text.push('\n');
            }
            write_line(false, text.trim_end());
        }
        let due = {
            let mut progress = self.progress.lock().expect("progress lock");
            let entry = progress
                .entry(context.partition_id.clone())
                .or_insert_with(|| (last.clone(), 0));
            entry.0 = last.clone();
            entry.1 += events.len() as u64;
            if entry.1 >= self.checkpoint_every {
                entry.1 = 0;
                true
            } else {
                false
            }
        };
        if due {
            self.checkpoint(context, &last).await;
        }
    }

    async fn partition_initializing(
        &self,
        context: &PartitionContext,
        checkpoint: Option<crate::checkpoints::Checkpoint>,
    ) -> Option<EventPosition> {
        self.notice(
            format!(
                "processing partition {} from {}",
                context.partition_id,
                checkpoint.map_or("the start position".to_string(), |c| format!(
                    "after sequence number {}",
                    c.sequence_number
                ))
            ),
            json!({
                "instance_id": self.instance,
                "opened": context.partition_id,
                "checkpoint_sequence_number": checkpoint.map(|c| c.sequence_number),
            }),
        );
        None
    }

    async fn partition_closing(&self, context: &PartitionContext, reason: CloseReason) {
        let pending = self
            .progress
            .lock()
            .expect("progress lock")
            .remove(&context.partition_id);
        if reason == CloseReason::Shutdown
            && let Some((last, since)) = pending
            && since > 0
        {
            self.checkpoint(context, &last).await;
        }
        let why = match reason {
            CloseReason::Shutdown => "shutdown",
            CloseReason::OwnershipLost => "ownership_lost",
        };
        self.notice(
            format!("closed partition {} ({why})", context.partition_id),
            json!({"instance_id": self.instance, "closed": context.partition_id, "reason": why}),
        );
    }

    async fn process_error(&self, partition_id: Option<&str>, error: &crate::ClientError) {
        self.notice(
            format!("error (retrying): {error}"),
            json!({"instance_id": self.instance, "error": error.to_string(), "partition_id": partition_id}),
        );
    }
}

pub(crate) async fn run(
    client: &Client,
    output: OutputFormat,
    args: ProcessArgs,
) -> anyhow::Result<()> {
    let defaults = EventProcessorOptions::default();
    let instance = args.instance_id.unwrap_or(defaults.owner_id.clone());
    let processed = Arc::new(AtomicU64::new(0));
    let printer = Arc::new(Printer {
        output,
        count_only: args.count_only,
        base64: args.base64,
        checkpoint_every: args.checkpoint_every,
        instance: instance.clone(),
        processed: processed.clone(),
        progress: Mutex::new(BTreeMap::new()),
    });
    let options = EventProcessorOptions {
        owner_id: instance.clone(),
        strategy: match args.strategy {
            Strategy::Balanced => LoadBalancingStrategy::Balanced,
            Strategy::Greedy => LoadBalancingStrategy::Greedy,
        },
        load_balancing_interval: args.load_balancing_interval,
        ownership_expiration: args.ownership_expiration,
        default_start: args.from,
        ..defaults
    };
    let running = EventProcessor::new(client, &args.hub, &args.group, printer.clone(), options)
        .start()
        .await?;
    printer.notice(
        format!(
            "processing event hub '{}' as consumer group '{}'",
            args.hub, args.group
        ),
        json!({"instance_id": instance, "started": args.hub, "consumer_group": args.group}),
    );
    let mut owned = running.watch_owned();
    let mut last_owned: BTreeSet<String> = BTreeSet::new();
    let mut ticker = tokio::time::interval(Duration::from_secs(1));
    let mut counted = 0;
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    loop {
        tokio::select! {
            _ = tokio::signal::ctrl_c() => break,
            _ = terminate.recv() => break,
            changed = owned.changed() => {
                if changed.is_err() {
                    break;
                }
                let now: BTreeSet<String> = owned.borrow_and_update().clone();
                if now != last_owned {
                    let list: Vec<&String> = now.iter().collect();
                    printer.notice(
                        format!("owns partitions {list:?}"),
                        json!({"instance_id": instance, "owned": list}),
                    );
                    last_owned = now;
                }
            }
            _ = ticker.tick(), if args.count_only => {
                let total = processed.load(Ordering::Relaxed);
                let line = match output {
                    OutputFormat::Json => json!({"instance_id": instance, "processed": total, "per_second": total - counted}).to_string(),
                    OutputFormat::Table => format!("{instance}: {total} events processed ({} in the last second)", total - counted),
                };
                write_line(false, &line);
                counted = total;
            }
        }
    }
    running.stop().await;
    printer.notice(
        "stopped; partitions released".to_string(),
        json!({"instance_id": instance, "stopped": true}),
    );
    Ok(())
}
