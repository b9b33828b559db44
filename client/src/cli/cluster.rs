//! `tributary cluster status`.

use serde_json::json;
use tributary_proto::v1::ClusterStatus;

use crate::Client;
use crate::cli::OutputFormat;
use crate::cli::output::Table;

#[derive(Debug, clap::Subcommand)]
pub enum ClusterCommand {
    /// Show the nodes (up or down, capacity units, zone, replicas and leaders), the
    /// controller leader, how many partitions are under-replicated, and for every partition
    /// its leader, replicas and whether each replica is caught up. With `--output json`:
    /// `nodes[]` (`node_id`, `capacity_units`, `zone`, `replicas`, `leaders`, `up`, ...),
    /// `under_replicated`, `partitions[]`.
    Status,
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
}

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
    }
    Ok(())
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
    }
    Ok(())
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
        "cluster:            {}\ncontroller leader:  {}\nunder-replicated:   {}\n\n",
        status.cluster_id,
        node_name(status.controller_leader),
        status.under_replicated
    );
    let mut nodes = Table::new(&[
        "NODE",
        "STATE",
        "CONTROLLER",
        "CU",
        "ZONE",
        "REPLICAS",
        "LEADERS",
        "CLIENT",
        "PEER",
    ]);
    for node in &status.nodes {
        nodes.row(vec![
            node.id.to_string(),
            match (node.up, node.draining) {
                (false, _) => "down",
                (true, true) => "draining",
                (true, false) => "up",
            }
            .to_string(),
            if node.controller_voter { "voter" } else { "-" }.to_string(),
            node.capacity_units.to_string(),
            if node.zone.is_empty() {
                "-"
            } else {
                &node.zone
            }
            .to_string(),
            node.replicas.to_string(),
            node.leaders.to_string(),
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
                        (false, _) => "down",
                        (true, true) => "caught-up",
                        (true, false) => "behind",
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
    text
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
            "up": n.up,
            "controller_voter": n.controller_voter,
            "client_addr": n.client_addr,
            "peer_addr": n.peer_addr,
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
            })).collect::<Vec<_>>(),
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
                    },
                    ReplicaStatus {
                        node: 1,
                        up: false,
                        caught_up: false,
                        last_applied_index: -1,
                    },
                ],
            }],
        };
        let text = status_text(&status);
        assert!(text.contains("controller leader:  2"), "{text}");
        assert!(text.contains("1     down"), "{text}");
        assert!(text.contains("2(caught-up) 1(down)"), "{text}");
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
    }
}
