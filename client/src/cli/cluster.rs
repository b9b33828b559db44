//! `tributary cluster status` and `rebalance`; `tributary node drain`, `undrain`,
//! `decommission` and `recommission`.

use std::time::{Duration, Instant};

use serde_json::json;
use tributary_proto::v1::{ClusterStatus, PlanRebalanceResponse};

use crate::Client;
use crate::cli::OutputFormat;
use crate::cli::output::Table;

#[derive(Debug, clap::Subcommand)]
pub enum ClusterCommand {
    /// Show the nodes (up or down, release, capacity units, zone, replicas and leaders),
    /// the cluster's feature level, the controller leader, how many partitions are
    /// under-replicated, and for every partition its leader, replicas and whether each
    /// replica is caught up. With `--output json`: `feature_level`, `feature_release`,
    /// `nodes[]` (`node_id`, `release`, `feature_level`, `capacity_units`, `zone`,
    /// `replicas`, `leaders`, `up`, ...), `under_replicated`, `partitions[]`, `moves[]`
    /// (replica moves under way).
    Status,
    /// Balance replicas and leaders over the nodes' capacity units. The placement
    /// controller does this continuously; without `--dry-run` this waits (showing
    /// progress) until nothing is left to move.
    Rebalance {
        /// Only print the moves the controller would make now (`kind` replica or leader,
        /// hub, partition, from node, to node); nothing moves.
        #[arg(long)]
        dry_run: bool,
        /// How long to wait for balance without --dry-run (e.g. 10m, 90s).
        #[arg(long, default_value = "10m")]
        timeout: humantime::Duration,
    },
}

#[derive(Debug, clap::Subcommand)]
pub enum NodeCommand {
    /// Move every partition leader off node N (its replicas stay and keep up), e.g. before
    /// restarting it; it stays drained, across restarts, until `node undrain N`.
    Drain {
        /// The node's id (`tributary cluster status` lists them).
        node_id: u64,
    },
    /// Let partition leaders return to node N.
    Undrain {
        /// The node's id.
        node_id: u64,
    },
    /// Move every replica off node N (restoring each partition's replication factor on
    /// the other nodes), after which the node can be stopped and removed.
    Decommission {
        /// The node's id.
        node_id: u64,
        /// Wait until no replica is left on the node, showing progress.
        #[arg(long)]
        wait: bool,
        /// How long --wait waits (e.g. 30m).
        #[arg(long, default_value = "30m")]
        timeout: humantime::Duration,
    },
    /// Stop decommissioning node N: replicas not yet moved stay, and it takes new ones.
    Recommission {
        /// The node's id.
        node_id: u64,
    },
}

/// How often waiting commands look at the cluster again.
const PROGRESS_INTERVAL: Duration = Duration::from_secs(2);

pub(crate) async fn run_node(client: &Client, command: NodeCommand) -> anyhow::Result<()> {
    match command {
        NodeCommand::Drain { node_id } => {
            client.drain_node(node_id, true).await?;
            println!(
                "node {node_id} is draining: its partition leaders are moving to other replicas"
            );
        }
        NodeCommand::Undrain { node_id } => {
            client.drain_node(node_id, false).await?;
            println!("node {node_id} is no longer drained: leaders may return to it");
        }
        NodeCommand::Decommission {
            node_id,
            wait,
            timeout,
        } => {
            client.decommission_node(node_id, true).await?;
            println!("node {node_id} is being decommissioned: its replicas move to other nodes");
            if wait {
                let deadline = Instant::now() + Duration::from(timeout);
                loop {
                    let status = client.cluster_status().await?;
                    let left = replicas_left(&status, node_id);
                    if left == 0 {
                        println!("node {node_id} holds no replicas: it can be stopped and removed");
                        break;
                    }
                    if Instant::now() >= deadline {
                        anyhow::bail!(
                            "node {node_id} still holds {left} replicas after {timeout}; `tributary cluster status` shows the moves under way"
                        );
                    }
                    println!(
                        "node {node_id}: {left} replicas left, {} moves under way",
                        status.moves.len()
                    );
                    tokio::time::sleep(PROGRESS_INTERVAL).await;
                }
            }
        }
        NodeCommand::Recommission { node_id } => {
            client.decommission_node(node_id, false).await?;
            println!("node {node_id} is no longer being decommissioned");
        }
    }
    Ok(())
}

/// Replicas still assigned to `node`, or moving onto it.
fn replicas_left(status: &ClusterStatus, node: u64) -> u32 {
    status
        .nodes
        .iter()
        .find(|n| n.id == node)
        .map_or(0, |n| n.replicas)
        + status.moves.iter().filter(|m| m.to == node).count() as u32
}

pub(crate) async fn run(
    client: &Client,
    output: OutputFormat,
    command: ClusterCommand,
) -> anyhow::Result<()> {
    match command {
        ClusterCommand::Status => {
            let status = client.cluster_status().await?;
            match output {
                OutputFormat::Json => println!("{}", status_json(&status)),
                OutputFormat::Table => print!("{}", status_text(&status)),
            }
        }
        ClusterCommand::Rebalance {
            dry_run: true,
            timeout: _,
        } => {
            let plan = client.plan_rebalance().await?;
            match output {
                OutputFormat::Json => println!("{}", plan_json(&plan)),
                OutputFormat::Table => print!("{}", plan_text(&plan)),
            }
        }
        ClusterCommand::Rebalance {
            dry_run: false,
            timeout,
        } => {
            let deadline = Instant::now() + Duration::from(timeout);
            loop {
                let plan = client.plan_rebalance().await?;
                let under_way = client.cluster_status().await?.moves.len();
                if plan.moves.is_empty() && under_way == 0 {
                    println!("balanced: no moves planned or under way");
                    break;
                }
                if Instant::now() >= deadline {
                    anyhow::bail!(
                        "not balanced after {timeout}: {} moves planned, {under_way} under way",
                        plan.moves.len()
                    );
                }
                println!("{} moves planned, {under_way} under way", plan.moves.len());
                tokio::time::sleep(PROGRESS_INTERVAL).await;
            }
        }
    }
    Ok(())
}

fn plan_text(plan: &PlanRebalanceResponse) -> String {
    let mut text = String::new();
    if !plan.down_nodes.is_empty() {
        text.push_str(&format!(
            "nodes not answering (planned as dead): {:?}\n",
            plan.down_nodes
        ));
    }
    if plan.moves.is_empty() {
        text.push_str("no moves planned: the cluster is balanced\n");
        return text;
    }
    let mut table = Table::new(&["KIND", "HUB", "PARTITION", "FROM", "TO"]);
    for m in &plan.moves {
        table.row(vec![
            m.kind.clone(),
            m.event_hub.clone(),
            m.partition_id.clone(),
            node_name(m.from),
            m.to.to_string(),
        ]);
    }
    text.push_str(&table.render());
    text
}

fn plan_json(plan: &PlanRebalanceResponse) -> serde_json::Value {
    json!({
        "down_nodes": plan.down_nodes,
        "moves": plan.moves.iter().map(|m| json!({
            "kind": m.kind,
            "event_hub": m.event_hub,
            "partition_id": m.partition_id,
            "from": if m.from == 0 { serde_json::Value::Null } else { json!(m.from) },
            "to": m.to,
        })).collect::<Vec<_>>(),
    })
}

fn node_name(id: u64) -> String {
    if id == 0 {
        "-".to_string()
    } else {
        id.to_string()
    }
}

fn status_text(status: &ClusterStatus) -> String {
    let mut text = format!(
        "cluster:            {}\nfeature level:      {} (release {} or later)\ncontroller leader:  {}\nunder-replicated:   {}\n\n",
        status.cluster_id,
        status.feature_level,
        status.feature_release,
        node_name(status.controller_leader),
        status.under_replicated
    );
    let mut nodes = Table::new(&[
        "NODE",
        "STATE",
        "CONTROLLER",
        "RELEASE",
        "CU",
        "ZONE",
        "REPLICAS",
        "LEADERS",
        "RESERVED-TU",
        "IN(EV/B)",
        "OUT(EV/B)",
        "CLIENT",
        "PEER",
    ]);
    for node in &status.nodes {
        nodes.row(vec![
            node.id.to_string(),
            match (node.up, node.decommissioning, node.draining) {
                (false, true, _) => "down,decommissioning",
                (false, false, _) => "down",
                (true, true, _) => "decommissioning",
                (true, false, true) => "draining",
                (true, false, false) => "up",
            }
            .to_string(),
            if node.controller_voter { "voter" } else { "-" }.to_string(),
            if node.release.is_empty() {
                "-".to_string()
            } else {
                format!("{} (level {})", node.release, node.feature_level)
            },
            node.capacity_units.to_string(),
            if node.zone.is_empty() {
                "-"
            } else {
                &node.zone
            }
            .to_string(),
            node.replicas.to_string(),
            node.leaders.to_string(),
            format!("{:.1}", node.reserved_throughput_units),
            format!("{}/{}", node.events_in, node.bytes_in),
            format!("{}/{}", node.events_out, node.bytes_out),
            node.client_addr.clone(),
            node.peer_addr.clone(),
        ]);
    }
    text.push_str(&nodes.render());
    if !status.partitions.is_empty() {
        text.push('\n');
        let mut partitions = Table::new(&["HUB", "PARTITION", "LEADER", "REPLICAS"]);
        for p in &status.partitions {
            let replicas = p
                .replicas
                .iter()
                .map(|r| {
                    let state = match (r.up, r.caught_up) {
                        (false, _) => "down".to_string(),
                        (true, true) => "caught-up".to_string(),
                        (true, false) if r.rebuild_bytes_total > 0 => format!(
                            "rebuilding {}%: {} of {}",
                            r.rebuild_bytes_done * 100 / r.rebuild_bytes_total,
                            human_bytes(r.rebuild_bytes_done),
                            human_bytes(r.rebuild_bytes_total)
                        ),
                        (true, false) => "behind".to_string(),
                    };
                    format!("{}({state})", r.node)
                })
                .collect::<Vec<_>>()
                .join(" ");
            partitions.row(vec![
                p.event_hub.clone(),
                p.partition_id.clone(),
                node_name(p.leader),
                replicas,
            ]);
        }
        text.push_str(&partitions.render());
    }
    if !status.moves.is_empty() {
        text.push('\n');
        let mut moves = Table::new(&["MOVING", "PARTITION", "FROM", "TO"]);
        for m in &status.moves {
            moves.row(vec![
                m.event_hub.clone(),
                m.partition_id.clone(),
                node_name(m.from),
                m.to.to_string(),
            ]);
        }
        text.push_str(&moves.render());
    }
    text
}

/// Bytes as a person reads them: 1.5 GiB, 300.0 MiB, 12 B.
fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["KiB", "MiB", "GiB", "TiB", "PiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut value = bytes as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.1} {}", UNITS[unit])
}

fn status_json(status: &ClusterStatus) -> serde_json::Value {
    let leader = |id: u64| {
        if id == 0 {
            serde_json::Value::Null
        } else {
            json!(id)
        }
    };
    json!({
        "cluster_id": status.cluster_id,
        "feature_level": status.feature_level,
        "feature_release": status.feature_release,
        "controller_leader": leader(status.controller_leader),
        "under_replicated": status.under_replicated,
        "nodes": status.nodes.iter().map(|n| json!({
            "node_id": n.id,
            "id": n.id,
            "capacity_units": n.capacity_units,
            "zone": if n.zone.is_empty() { serde_json::Value::Null } else { json!(n.zone) },
            "replicas": n.replicas,
            "leaders": n.leaders,
            "draining": n.draining,
            "decommissioning": n.decommissioning,
            "reserved_throughput_units": n.reserved_throughput_units,
            "bytes_in": n.bytes_in,
            "events_in": n.events_in,
            "bytes_out": n.bytes_out,
            "events_out": n.events_out,
            "up": n.up,
            "controller_voter": n.controller_voter,
            "client_addr": n.client_addr,
            "peer_addr": n.peer_addr,
            "release": if n.release.is_empty() { serde_json::Value::Null } else { json!(n.release) },
            "feature_level": if n.feature_level == 0 { serde_json::Value::Null } else { json!(n.feature_level) },
        })).collect::<Vec<_>>(),
        "partitions": status.partitions.iter().map(|p| json!({
            "event_hub": p.event_hub,
            "partition_id": p.partition_id,
            "leader": leader(p.leader),
            "replicas": p.replicas.iter().map(|r| json!({
                "node": r.node,
                "up": r.up,
                "caught_up": r.caught_up,
                "last_applied_index": r.last_applied_index,
                "rebuild_bytes_done": r.rebuild_bytes_done,
                "rebuild_bytes_total": r.rebuild_bytes_total,
            })).collect::<Vec<_>>(),
        })).collect::<Vec<_>>(),
        "moves": status.moves.iter().map(|m| json!({
            "event_hub": m.event_hub,
            "partition_id": m.partition_id,
            "from": leader(m.from),
            "to": m.to,
            "started_ms": m.started_ms,
        })).collect::<Vec<_>>(),
    })
}

#[cfg(test)]
mod tests {
    use tributary_proto::v1::{NodeStatus, PartitionStatus, ReplicaStatus};

    use super::*;

    #[test]
    fn shows_down_nodes_and_lagging_replicas() {
        let status = ClusterStatus {
            under_replicated: 1,
            cluster_id: "c1".into(),
            feature_level: 1,
            feature_release: "0.1.0".into(),
            controller_leader: 2,
            nodes: vec![
                NodeStatus {
                    id: 1,
                    client_addr: "a:1".into(),
                    peer_addr: "a:2".into(),
                    up: false,
                    controller_voter: true,
                    capacity_units: 1,
                    zone: String::new(),
                    replicas: 1,
                    leaders: 0,
                    draining: false,
                    ..Default::default()
                },
                NodeStatus {
                    id: 2,
                    client_addr: "b:1".into(),
                    peer_addr: "b:2".into(),
                    up: true,
                    controller_voter: true,
                    capacity_units: 2,
                    zone: "rack-b".into(),
                    replicas: 1,
                    leaders: 1,
                    draining: false,
                    decommissioning: true,
                    release: "0.2.0".into(),
                    feature_level: 2,
                    ..Default::default()
                },
            ],
            partitions: vec![PartitionStatus {
                event_hub: "orders".into(),
                partition_id: "0".into(),
                leader: 2,
                replicas: vec![
                    ReplicaStatus {
                        node: 2,
                        up: true,
                        caught_up: true,
                        last_applied_index: 9,
                        ..Default::default()
                    },
                    ReplicaStatus {
                        node: 1,
                        up: false,
                        caught_up: false,
                        last_applied_index: -1,
                        ..Default::default()
                    },
                    ReplicaStatus {
                        node: 3,
                        up: true,
                        caught_up: false,
                        last_applied_index: -1,
                        rebuild_bytes_done: 384 * 1024 * 1024,
                        rebuild_bytes_total: 1536 * 1024 * 1024,
                    },
                ],
            }],
            moves: vec![tributary_proto::v1::ReplicaMoveStatus {
                event_hub: "orders".into(),
                partition_id: "0".into(),
                from: 1,
                to: 2,
                started_ms: 0,
            }],
        };
        let text = status_text(&status);
        assert!(text.contains("decommissioning"), "{text}");
        assert!(text.contains("MOVING"), "{text}");
        assert_eq!(replicas_left(&status, 2), 2);
        assert!(text.contains("controller leader:  2"), "{text}");
        assert!(text.contains("1     down"), "{text}");
        assert!(
            text.contains("2(caught-up) 1(down) 3(rebuilding 25%: 384.0 MiB of 1.5 GiB)"),
            "{text}"
        );
        assert_eq!(
            json_replica_rebuild(&status_json(&status)),
            (384 * 1024 * 1024, 1536 * 1024 * 1024)
        );
        let json = status_json(&status);
        assert_eq!(json["nodes"][0]["up"], false);
        assert_eq!(json["partitions"][0]["leader"], 2);
        assert_eq!(json["under_replicated"], 1);
        assert!(text.contains("under-replicated:   1"), "{text}");
        let second = &json["nodes"][1];
        assert_eq!(second["node_id"], 2);
        assert_eq!(second["capacity_units"], 2);
        assert_eq!(second["zone"], "rack-b");
        assert_eq!(second["replicas"], 1);
        assert_eq!(second["leaders"], 1);
        assert_eq!(json["nodes"][0]["zone"], serde_json::Value::Null);
        assert_eq!(second["decommissioning"], true);
        assert_eq!(json["moves"][0]["to"], 2);
        // Each node's release, and the cluster's level, during a rolling upgrade.
        assert!(
            text.contains("feature level:      1 (release 0.1.0 or later)"),
            "{text}"
        );
        assert!(text.contains("0.2.0 (level 2)"), "{text}");
        assert_eq!(json["feature_level"], 1);
        assert_eq!(second["release"], "0.2.0");
        assert_eq!(second["feature_level"], 2);
        assert_eq!(json["nodes"][0]["release"], serde_json::Value::Null);
    }

    /// The third replica's rebuild progress in the JSON status.
    fn json_replica_rebuild(json: &serde_json::Value) -> (u64, u64) {
        let replica = &json["partitions"][0]["replicas"][2];
        (
            replica["rebuild_bytes_done"].as_u64().unwrap(),
            replica["rebuild_bytes_total"].as_u64().unwrap(),
        )
    }

    #[test]
    fn plans_print_as_tables_and_json() {
        let plan = PlanRebalanceResponse {
            moves: vec![
                tributary_proto::v1::PlannedMove {
                    kind: "replica".into(),
                    event_hub: "orders".into(),
                    partition_id: "3".into(),
                    from: 0,
                    to: 4,
                },
                tributary_proto::v1::PlannedMove {
                    kind: "leader".into(),
                    event_hub: "orders".into(),
                    partition_id: "5".into(),
                    from: 1,
                    to: 2,
                },
            ],
            down_nodes: vec![3],
        };
        let text = plan_text(&plan);
        assert!(text.contains("planned as dead): [3]"), "{text}");
        assert!(
            text.contains("replica  orders  3          -     4"),
            "{text}"
        );
        let json = plan_json(&plan);
        assert_eq!(json["moves"][0]["from"], serde_json::Value::Null);
        assert_eq!(json["moves"][1]["kind"], "leader");
        assert_eq!(json["moves"][1]["from"], 1);
        let empty = plan_text(&PlanRebalanceResponse::default());
        assert!(empty.contains("no moves planned"), "{empty}");
    }
}
