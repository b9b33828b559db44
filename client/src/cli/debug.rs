//! `tributary debug`: look inside one node, e.g. list what its replica of a partition holds.

use std::io::Write as _;

use serde_json::json;
use tributary_proto::v1::ReplicaEvent;

use super::output::time_json;
use crate::{Client, ReplicaListing, replica_digest};

#[derive(Debug, clap::Subcommand)]
pub enum DebugCommand {
    /// List what the node at --endpoint holds in its own replica of a partition (leader or
    /// not; never redirected): one JSON line per event with its sequence number, offset,
    /// enqueued time, partition key and body checksum (CRC-32, 8 hex digits), then one
    /// summary line {"summary":{...}} with the node, the count, the first and last sequence
    /// numbers and a digest of the whole list. Run it against each replica's node and compare
    /// the summaries: equal digests mean identical replicas. Prints JSON whatever --output says.
    ReplicaEvents(ReplicaEventsArgs),
}

#[derive(Debug, clap::Args)]
pub struct ReplicaEventsArgs {
    /// The event hub.
    #[arg(long)]
    pub hub: String,
    /// The partition (e.g. 0).
    #[arg(long)]
    pub partition: String,
    /// The first sequence number to list.
    #[arg(long, default_value_t = 0, value_name = "N",
          value_parser = clap::value_parser!(i64).range(0..))]
    pub from_sequence: i64,
    /// List at most this many events (default: all the replica has applied).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub limit: Option<u64>,
    /// Print only the summary line.
    #[arg(long)]
    pub summary: bool,
}

pub(crate) async fn run(client: &Client, command: DebugCommand) -> anyhow::Result<()> {
    match command {
        DebugCommand::ReplicaEvents(args) => {
            let listing = client
                .replica_events(&args.hub, &args.partition, args.from_sequence, args.limit)
                .await?;
            let mut out = std::io::stdout().lock();
            if !args.summary {
                for event in &listing.events {
                    writeln!(out, "{}", event_json(event))?;
                }
            }
            writeln!(out, "{}", summary_json(&args, &listing))?;
        }
    }
    Ok(())
}

fn event_json(event: &ReplicaEvent) -> serde_json::Value {
    json!({
        "sequence": event.sequence_number,
        "offset": event.offset,
        "enqueued_time": time_json(event.enqueued_time_ms),
        "partition_key": (!event.partition_key.is_empty()).then_some(&event.partition_key),
        "body_checksum": format!("{:08x}", event.body_checksum),
        "body_bytes": event.body_bytes,
    })
}

fn summary_json(args: &ReplicaEventsArgs, listing: &ReplicaListing) -> serde_json::Value {
    let summary = replica_digest(&listing.events);
    json!({
        "summary": {
            "hub": args.hub,
            "partition": args.partition,
            "node": listing.node,
            "is_leader": listing.is_leader,
            "begin_sequence": listing.begin_sequence_number,
            "count": summary.count,
            "first_sequence": summary.first_sequence_number,
            "last_sequence": summary.last_sequence_number,
            "digest": format!("{:016x}", summary.digest),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_and_summary_print_as_documented() {
        let event = ReplicaEvent {
            sequence_number: 3,
            offset: "120".into(),
            enqueued_time_ms: 1_714_564_800_250,
            partition_key: String::new(),
            body_checksum: 0xCBF4_3926,
            body_bytes: 9,
        };
        let line = event_json(&event);
        assert_eq!(line["sequence"], 3);
        assert_eq!(line["offset"], "120");
        assert_eq!(line["enqueued_time"], "2024-05-01T12:00:00.250Z");
        assert_eq!(line["partition_key"], serde_json::Value::Null);
        assert_eq!(line["body_checksum"], "cbf43926");

        let args = ReplicaEventsArgs {
            hub: "orders".into(),
            partition: "0".into(),
            from_sequence: 0,
            limit: None,
            summary: true,
        };
        let listing = ReplicaListing {
            node: 2,
            is_leader: false,
            begin_sequence_number: 0,
            events: vec![event],
        };
        let summary = &summary_json(&args, &listing)["summary"];
        assert_eq!(summary["node"], 2);
        assert_eq!(summary["count"], 1);
        assert_eq!(summary["first_sequence"], 3);
        assert_eq!(summary["last_sequence"], 3);
        let digest = replica_digest(&listing.events).digest;
        assert_eq!(summary["digest"], format!("{digest:016x}"));
    }
}
