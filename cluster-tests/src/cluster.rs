//! Several real `tributary serve` processes on loopback forming one cluster.

use std::path::Path;

use crate::node_process::{NodePorts, NodeProcess};

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
                ];
                NodeProcess::launch(&dir.join(format!("node-{}", i + 1)), *ports, &args)
            })
            .collect();
        for node in &mut nodes {
            node.wait_ready().await;
        }
        LocalCluster { nodes, seeds }
    }

    /// Client endpoints of every node.
    pub fn endpoints(&self) -> Vec<String> {
        self.nodes.iter().map(NodeProcess::endpoint).collect()
    }
}
