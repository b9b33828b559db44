//! The reconciler drops a local replica only on a view of the cluster at least as new as
//! the one that assigned it: a lagging controller replica's view (after a restart, or from
//! another controller member) may not show an assignment the node already acted on, and
//! dropping on it would throw away a log the partition's leader counts as stored.

use tributary_client::EventPosition;

use crate::support::{TestNode, body};

#[tokio::test]
async fn a_replica_is_never_dropped_on_a_view_older_than_the_one_that_assigned_it() {
    let node = TestNode::start().await;
    let broker = node.node.as_ref().unwrap().broker.clone();
    // The cluster as it was before the hub existed.
    let older = broker.runtime().state();
    node.client.create_event_hub("kept", 2, None).await.unwrap();
    node.send("kept", "1", &["stored"]).await;
    assert_eq!(broker.local_partitions().len(), 2);

    broker.reconcile(&older).await.unwrap();
    assert_eq!(
        broker.local_partitions().len(),
        2,
        "a view older than the hub dropped its replicas"
    );
    let read = node.read("kept", "1", EventPosition::Earliest, 1).await;
    assert_eq!(body(&read[0]), "stored");

    // A view as new as the current one, in which the hub is gone, does drop them.
    let mut newer = (*broker.runtime().state()).clone();
    newer.hubs.remove("kept");
    newer.version += 1;
    broker.reconcile(&newer).await.unwrap();
    assert!(broker.local_partitions().is_empty());
}
