//! Test helpers: a node on a temporary data directory, and a client for it.

use std::sync::Arc;

use futures::StreamExt;
use tempfile::TempDir;
use tributary_client::{Client, EventData, EventPosition, ReceivedEvent, SendTarget};
use tributary_node::Node;
use tributary_node::config::NodeConfig;
use tributary_types::{Clock, ManualClock};

pub struct TestNode {
    /// Kept so the data directory lives as long as the node.
    pub _dir: TempDir,
    pub node: Option<Node>,
    pub client: Client,
    pub clock: Arc<ManualClock>,
    pub config: NodeConfig,
}

impl TestNode {
    pub async fn start() -> TestNode {
        Self::start_with(|_| {}).await
    }

    pub async fn start_with(adjust: impl FnOnce(&mut NodeConfig)) -> TestNode {
        let dir = tempfile::tempdir().unwrap();
        let mut config = NodeConfig::for_data_dir(dir.path());
        adjust(&mut config);
        let clock = Arc::new(ManualClock::new(1_700_000_000_000));
        let node = Node::start_with_clock(config.clone(), clock.clone() as Arc<dyn Clock>)
            .await
            .unwrap();
        let client = Client::connect(&format!("http://{}", node.client_addr))
            .await
            .unwrap();
        TestNode {
            _dir: dir,
            node: Some(node),
            client,
            clock,
            config,
        }
    }

    /// Clean shutdown and start again on the same data directory (new ports).
    pub async fn restart(&mut self) {
        self.node.take().unwrap().shutdown().await.unwrap();
        let node =
            Node::start_with_clock(self.config.clone(), self.clock.clone() as Arc<dyn Clock>)
                .await
                .unwrap();
        self.client = Client::connect(&format!("http://{}", node.client_addr))
            .await
            .unwrap();
        self.node = Some(node);
    }

    pub fn endpoint(&self) -> String {
        format!("http://{}", self.node.as_ref().unwrap().client_addr)
    }

    pub async fn send(
        &self,
        hub: &str,
        partition: &str,
        bodies: &[&str],
    ) -> tributary_client::SendResponse {
        self.client
            .producer()
            .send(
                hub,
                SendTarget::PartitionId(partition.to_string()),
                bodies.iter().map(|b| EventData::from_body(b.to_string())),
            )
            .await
            .unwrap()
    }

    /// Reads exactly `count` events from `position`.
    pub async fn read(
        &self,
        hub: &str,
        partition: &str,
        position: EventPosition,
        count: usize,
    ) -> Vec<ReceivedEvent> {
        let mut stream = self
            .client
            .consumer()
            .receive(hub, "", partition, position, 0)
            .await
            .unwrap();
        let mut out = Vec::new();
        while out.len() < count {
            let batch = tokio::time::timeout(std::time::Duration::from_secs(30), stream.next())
                .await
                .expect("events arrive")
                .expect("stream open")
                .unwrap();
            out.extend(batch);
        }
        out.truncate(count);
        out
    }
}

pub fn body(event: &ReceivedEvent) -> String {
    String::from_utf8(event.body.to_vec()).unwrap()
}
