//! `tributary group show` against the test's own record of owners, checkpoints, sent
//! events and connected readers; and a reader process killed with SIGKILL freeing its slot
//! among the five a consumer group's partition allows.

use std::collections::BTreeMap;
use std::time::Duration;

use futures::StreamExt as _;
use tokio::time::Instant;
use tributary_client::checkpoints::Claim;
use tributary_client::{
    CheckpointStore, Client, EventData, EventPosition, ReceiveOptions, ReceiveStream, SendTarget,
};
use tributary_cluster_tests::{NodeProcess, TestDir, cli_ok, eventually, tributary_command};

const HUB: &str = "shown";
const GROUP: &str = "audit";

async fn reader(client: &Client, partition: &str, name: &str, level: Option<i64>) -> ReceiveStream {
    let mut stream = client
        .consumer()
        .receive_with(
            HUB,
            GROUP,
            partition,
            EventPosition::Earliest,
            ReceiveOptions {
                owner_level: level,
                reader_name: name.to_string(),
                ..ReceiveOptions::default()
            },
        )
        .await
        .unwrap();
    // Attached once the first batch is in.
    stream.next().await.unwrap().unwrap();
    stream
}

/// Items 6 and 7 (a killed reader) of the consumer-group issue.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn group_show_matches_the_record_and_a_killed_reader_frees_its_slot() {
    let dir = TestDir::new("group-show");
    let node = NodeProcess::start(dir.path()).await;
    let endpoint = node.endpoint();
    let client = Client::connect(&endpoint).await.unwrap();
    client.create_event_hub(HUB, 4, None).await.unwrap();
    client.create_consumer_group(HUB, GROUP).await.unwrap();
    // Partition p holds 3 * (p + 1) events.
    for p in 0..4u32 {
        let events: Vec<EventData> = (0..3 * (p + 1))
            .map(|i| EventData::from_body(format!("{p}-{i}")))
            .collect();
        client
            .producer()
            .send(HUB, SendTarget::PartitionId(p.to_string()), events)
            .await
            .unwrap();
    }
    let store = client.checkpoint_store();
    let claim = |p: &str, owner: &str| Claim {
        partition_id: p.into(),
        owner_id: owner.into(),
        etag: None,
    };
    let claimed = store
        .claim_ownership(
            HUB,
            GROUP,
            vec![claim("0", "alpha"), claim("1", "alpha"), claim("2", "beta")],
        )
        .await
        .unwrap();
    assert_eq!(claimed.len(), 3);
    store
        .update_checkpoint(HUB, GROUP, "0", 1, 1, None)
        .await
        .unwrap();
    store
        .update_checkpoint(HUB, GROUP, "2", 8, 8, None)
        .await
        .unwrap();
    let _r0 = reader(&client, "0", "r-a", None).await;
    let _r1 = reader(&client, "0", "r-b", None).await;
    let _owner = reader(&client, "1", "owner-x", Some(5)).await;
    // Partition 3: four readers here and one in another process, which is then killed.
    let mut plain = Vec::new();
    for i in 0..4 {
        plain.push(reader(&client, "3", &format!("p{i}"), None).await);
    }
    let mut process = tributary_command();
    process
        .args(["--endpoint", &endpoint, "receive", HUB, "--partition", "3"])
        .args(["--group", GROUP, "--reader-name", "killme"])
        .stdout(std::process::Stdio::piped());
    let mut child = process.spawn().unwrap();
    let mut stdout = tokio::io::BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    tokio::io::AsyncBufReadExt::read_line(&mut stdout, &mut line)
        .await
        .unwrap();
    assert!(line.contains("seq=0"), "the reader process reads: {line}");

    let shown: serde_json::Value = serde_json::from_str(
        &cli_ok(
            &endpoint,
            &["--output", "json", "group", "show", HUB, GROUP],
        )
        .await,
    )
    .unwrap();
    let partitions: BTreeMap<String, &serde_json::Value> = shown["partitions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| (p["partition_id"].as_str().unwrap().to_string(), p))
        .collect();
    assert_eq!(partitions.len(), 4);
    let owners: Vec<serde_json::Value> = ["0", "1", "2", "3"]
        .iter()
        .map(|p| partitions[*p]["owner_id"].clone())
        .collect();
    assert_eq!(
        owners,
        vec![
            "alpha".into(),
            "alpha".into(),
            "beta".into(),
            serde_json::Value::Null
        ]
    );
    for p in ["0", "1", "2"] {
        let claimed_at = claimed
            .iter()
            .find(|c| c.partition_id == p)
            .unwrap()
            .last_modified_ms;
        assert_eq!(
            partitions[p]["last_modified"],
            serde_json::Value::from(tributary_client::rfc3339_millis(claimed_at).unwrap()),
            "partition {p}"
        );
    }
    let checkpoints: Vec<serde_json::Value> = ["0", "1", "2", "3"]
        .iter()
        .map(|p| partitions[*p]["checkpoint_sequence_number"].clone())
        .collect();
    assert_eq!(
        checkpoints,
        vec![
            1.into(),
            serde_json::Value::Null,
            8.into(),
            serde_json::Value::Null
        ]
    );
    // Lag: events after the checkpoint (all of them without one).
    let lags: Vec<i64> = ["0", "1", "2", "3"]
        .iter()
        .map(|p| partitions[*p]["lag"].as_i64().unwrap())
        .collect();
    assert_eq!(lags, vec![2 - 1, 6, 8 - 8, 12]);
    let readers = |p: &str| -> Vec<(String, Option<i64>)> {
        partitions[p]["readers"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| {
                (
                    r["name"].as_str().unwrap().to_string(),
                    r["owner_level"].as_i64(),
                )
            })
            .collect()
    };
    assert_eq!(
        readers("0"),
        vec![("r-a".to_string(), None), ("r-b".to_string(), None)]
    );
    assert_eq!(readers("1"), vec![("owner-x".to_string(), Some(5))]);
    assert!(readers("2").is_empty());
    let names: Vec<String> = readers("3").into_iter().map(|(n, _)| n).collect();
    assert_eq!(names, vec!["p0", "p1", "p2", "p3", "killme"]);

    // Five readers on partition 3: a sixth is refused until the killed one's slot frees.
    let refused = client
        .consumer()
        .receive(HUB, GROUP, "3", EventPosition::Earliest, 0)
        .await
        .expect_err("a sixth reader is refused");
    assert!(refused.to_string().contains("killme"), "{refused}");
    child.kill().await.unwrap();
    let killed_at = Instant::now();
    let what = "the killed reader's slot free (a reader attached)";
    eventually(Duration::from_secs(5), what, async || {
        client
            .consumer()
            .receive(HUB, GROUP, "3", EventPosition::Earliest, 0)
            .await
    })
    .await;
    println!(
        "a new reader attached {:?} after the reader process was killed",
        killed_at.elapsed()
    );
    drop(plain);
}
