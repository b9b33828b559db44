//! Several real `tributary serve` processes on loopback forming one cluster.

use std::path::Path;

use tributary_client::Client;

use crate::eventually::eventually;
use crate::node_process::{NodePorts, NodeProcess, READY_TIMEOUT};

/// A cluster of `n` nodes with ids 1..=n, each on its own free ports and data directory
/// under the given test directory.
pub struct LocalCluster {
    pub nodes: Vec<NodeProcess>,
    /// The nodes' peer addresses, comma-separated: `--seeds` for a node joining later.
    pub seeds: String,
}

impl LocalCluster {
    /// Starts every node (all must run before the cluster can form) and waits until each
    /// says it is ready.
    pub async fn start(dir: &Path, n: usize) -> LocalCluster {
        LocalCluster::start_with_env(dir, n, &[]).await
    }

    /// Like [`LocalCluster::start`], with environment variables set for every node (e.g.
    /// `TRIBUTARY_FAULT_HOOKS=1`).
    pub async fn start_with_env(dir: &Path, n: usize, env: &[(&str, &str)]) -> LocalCluster {
        LocalCluster::start_with_args(dir, n, &[], env).await
    }

    /// Like [`LocalCluster::start_with_env`], with more `serve` flags for every node (e.g.
    /// TLS: see [`crate::NodeCert::peer_port_args`]).
    pub async fn start_with_args(
        dir: &Path,
        n: usize,
        extra_args: &[String],
        env: &[(&str, &str)],
    ) -> LocalCluster {
        LocalCluster::start_with_node_args(dir, n, |_| extra_args.to_vec(), env).await
    }

    /// Like [`LocalCluster::start_with_args`], with flags of their own for each node, by
    /// node id (e.g. a certificate naming it: see [`crate::TestCa::node_cert`]).
    pub async fn start_with_node_args(
        dir: &Path,
        n: usize,
        extra_args: impl Fn(u64) -> Vec<String>,
        env: &[(&str, &str)],
    ) -> LocalCluster {
        LocalCluster::start_nodes(dir, n, None, extra_args, env).await
    }

    /// Like [`LocalCluster::start_with_env`], every node running the binary at `binary`
    /// (e.g. an earlier release's: see [`NodeProcess::set_binary`] to upgrade one).
    pub async fn start_with_binary(
        dir: &Path,
        n: usize,
        binary: &Path,
        env: &[(&str, &str)],
    ) -> LocalCluster {
        LocalCluster::start_nodes(dir, n, Some(binary), |_| Vec::new(), env).await
    }

    async fn start_nodes(
        dir: &Path,
        n: usize,
        binary: Option<&Path>,
        extra_args: impl Fn(u64) -> Vec<String>,
        env: &[(&str, &str)],
    ) -> LocalCluster {
        let ports: Vec<NodePorts> = (0..n).map(|_| NodePorts::free()).collect();
        let seeds = ports
            .iter()
            .map(|p| format!("127.0.0.1:{}", p.peer))
            .collect::<Vec<_>>()
            .join(",");
        let mut nodes: Vec<NodeProcess> = ports
            .iter()
            .enumerate()
            .map(|(i, ports)| {
                let args = vec![
                    "--node-id".to_string(),
                    (i + 1).to_string(),
                    "--seeds".to_string(),
                    seeds.clone(),
                    "--bootstrap-expect".to_string(),
                    n.to_string(),
                ]
                .into_iter()
                .chain(extra_args(i as u64 + 1))
                .collect::<Vec<_>>();
                let data_dir = dir.join(format!("node-{}", i + 1));
                match binary {
                    Some(binary) => {
                        NodeProcess::launch_binary(binary, &data_dir, *ports, &args, env)
                    }
                    None => NodeProcess::launch_with_env(&data_dir, *ports, &args, env),
                }
            })
            .collect();
        for node in &mut nodes {
            node.wait_ready().await;
        }
        LocalCluster { nodes, seeds }
    }

    /// Starts node `nodes.len() + 1`, joining through the existing nodes, with extra flags
    /// (e.g. `--capacity-units 2`) and environment variables; waits until it is ready and
    /// returns its index in `nodes`.
    pub async fn add_node(
        &mut self,
        dir: &Path,
        extra_args: &[&str],
        env: &[(&str, &str)],
    ) -> usize {
        let id = self.nodes.len() + 1;
        let mut args = vec![
            "--node-id".to_string(),
            id.to_string(),
            "--seeds".to_string(),
            self.seeds.clone(),
        ];
        args.extend(extra_args.iter().map(|a| a.to_string()));
        let ports = NodePorts::free();
        let mut node =
            NodeProcess::launch_with_env(&dir.join(format!("node-{id}")), ports, &args, env);
        node.wait_ready().await;
        self.seeds = format!("{},127.0.0.1:{}", self.seeds, ports.peer);
        self.nodes.push(node);
        id - 1
    }

    /// Client endpoints of every node.
    pub fn endpoints(&self) -> Vec<String> {
        self.nodes.iter().map(NodeProcess::endpoint).collect()
    }

    /// The index in `nodes` of the running node that leads `partition_id` of `event_hub`,
    /// as the cluster status (asked through a running node) says; waits until there is one
    /// and leadership has settled (on the preferred replica, unless that one is down).
    pub async fn partition_leader(&self, event_hub: &str, partition_id: &str) -> usize {
        eventually(
            READY_TIMEOUT,
            format!("a running, settled leader of {event_hub}/{partition_id}"),
            async || {
                let mut last_seen = String::from("no running node answered");
                for node in self.nodes.iter().filter(|n| n.pid().is_some()) {
                    let Ok(client) = Client::connect(&node.endpoint()).await else {
                        continue;
                    };
                    let status = match client.cluster_status().await {
                        Ok(status) => status,
                        Err(err) => {
                            last_seen = err.to_string();
                            continue;
                        }
                    };
                    // Leadership returns to the preferred (first) replica when it is up: wait
                    // for that, so the leader found does not move away right after.
                    let leader = status
                        .partitions
                        .iter()
                        .find(|p| p.event_hub == event_hub && p.partition_id == partition_id)
                        .map(|p| p.leader)
                        .filter(|leader| {
                            let partition = status.partitions.iter().find(|p| {
                                p.event_hub == event_hub && p.partition_id == partition_id
                            });
                            partition
                                .and_then(|p| p.replicas.first())
                                .is_none_or(|preferred| !preferred.up || preferred.node == *leader)
                        });
                    let index = leader
                        .filter(|id| *id > 0)
                        .and_then(|id| usize::try_from(id - 1).ok())
                        .filter(|i| self.nodes.get(*i).is_some_and(|n| n.pid().is_some()));
                    if let Some(index) = index {
                        return Ok(index);
                    }
                    last_seen = format!("leader {leader:?} in {status:?}");
                    break;
                }
                Err(last_seen)
            },
        )
        .await
    }
}
