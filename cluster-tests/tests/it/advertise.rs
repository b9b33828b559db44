//! `--advertise-client-addr` and `--advertise-peer-addr`: nodes registered under DNS names
//! (as Kubernetes pods are, whose IPs change across restarts) form a cluster, replicate
//! through those names, and hand clients the advertised client addresses.

use std::time::Duration;

use futures::StreamExt;
use tributary_client::{Client, EventData, EventPosition, SendTarget};
use tributary_cluster_tests::{NodePorts, NodeProcess, TestDir};

const PARTITIONS: u32 = 3;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_advertising_dns_names_form_a_cluster_and_replicate_through_them() {
    let dir = TestDir::new("advertise");
    let ports: Vec<NodePorts> = (0..3).map(|_| NodePorts::free()).collect();
    let seeds = ports
        .iter()
        .map(|p| format!("localhost:{}", p.peer))
        .collect::<Vec<_>>()
        .join(",");
    let mut nodes: Vec<NodeProcess> = ports
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let args = [
                "--node-id",
                &(i + 1).to_string(),
                "--seeds",
                &seeds,
                "--bootstrap-expect",
                "3",
                "--advertise-client-addr",
                &format!("localhost:{}", p.client),
                "--advertise-peer-addr",
                &format!("localhost:{}", p.peer),
            ]
            .map(str::to_string);
            NodeProcess::launch(&dir.path().join(format!("node-{}", i + 1)), *p, &args)
        })
        .collect();
    for node in &mut nodes {
        node.wait_ready().await;
    }

    let client = Client::connect(&nodes[0].endpoint()).await.unwrap();
    let status = client.cluster_status().await.unwrap();
    let mut addresses: Vec<(String, String)> = status
        .nodes
        .iter()
        .map(|n| (n.client_addr.clone(), n.peer_addr.clone()))
        .collect();
    addresses.sort();
    let mut expected: Vec<(String, String)> = ports
        .iter()
        .map(|p| {
            (
                format!("localhost:{}", p.client),
                format!("localhost:{}", p.peer),
            )
        })
        .collect();
    expected.sort();
    assert_eq!(addresses, expected, "registered addresses");

    // Every partition has a replica on every node: Raft traffic goes through the names.
    client
        .create_replicated_event_hub("named", PARTITIONS, None, Some(3))
        .await
        .unwrap();
    for p in 0..PARTITIONS {
        client
            .producer()
            .send(
                "named",
                SendTarget::PartitionId(p.to_string()),
                [EventData::from_body(format!("event {p}"))],
            )
            .await
            .unwrap_or_else(|e| panic!("send to partition {p}: {e}"));
    }
    let third = Client::connect(&nodes[2].endpoint()).await.unwrap();
    for p in 0..PARTITIONS {
        let mut stream = third
            .consumer()
            .receive("named", "", &p.to_string(), EventPosition::Earliest, 0)
            .await
            .unwrap();
        let batch = tokio::time::timeout(Duration::from_secs(30), stream.next())
            .await
            .expect("an event arrives")
            .expect("stream open")
            .unwrap();
        let bodies: Vec<String> = batch
            .iter()
            .map(|e| String::from_utf8_lossy(&e.body).into_owned())
            .collect();
        assert_eq!(bodies, [format!("event {p}")], "partition {p}");
    }
}
