//! Shared access signatures on the client port (`--auth sas`): what each right allows, why
//! tokens are refused, and that no RPC goes unchecked.

use std::collections::BTreeSet;
use std::sync::Arc;

use futures::StreamExt;
use tributary_broker::cluster::RootKey;
use tributary_client::{
    CheckpointStore, Client, ClientError, ConnectOptions, ErrorReason, EventData, EventPosition,
    Rights, RuleKey, SendTarget,
};
use tributary_node::config::AuthMode;
use tributary_types::{Clock, sign};

use crate::support::TestNode;

const ROOT_KEY: &str = "root-key-for-tests";
const HUB: &str = "orders";

async fn start() -> TestNode {
    TestNode::start_with(|config| {
        config.auth = AuthMode::Sas;
        config.root_key = Some(RootKey(ROOT_KEY.into()));
    })
    .await
}

/// A connection string for `rule` with `key` (of `hub`'s rules when given).
fn connection_string(rule: &str, key: &str, hub: Option<&str>) -> String {
    let mut text =
        format!("Endpoint=sb://tributary.test/;SharedAccessKeyName={rule};SharedAccessKey={key}");
    if let Some(hub) = hub {
        text.push_str(&format!(";EntityPath={hub}"));
    }
    text
}

/// A client of `node` signing with `text`'s key on the node's clock.
async fn client(node: &TestNode, text: &str) -> Client {
    let clock = node.clock.clone();
    Client::from_connection_string_with(
        text,
        ConnectOptions {
            endpoint: Some(node.endpoint()),
            clock: Arc::new(move || u64::try_from(clock.now_ms() / 1000).unwrap()),
            ..ConnectOptions::default()
        },
    )
    .await
    .unwrap()
}

/// A client sending `token` as it is.
async fn client_with_token(node: &TestNode, token: &str) -> Client {
    client(
        node,
        &format!("Endpoint=sb://tributary.test/;SharedAccessSignature={token}"),
    )
    .await
}

async fn root(node: &TestNode) -> Client {
    let root = client(
        node,
        &connection_string("RootManageSharedAccessKey", ROOT_KEY, None),
    )
    .await;
    // The root rule is proposed once the node has registered; wait until it is in force.
    let mut view = node.node.as_ref().unwrap().broker.runtime().view();
    view.wait_for(|state| !state.rules.is_empty())
        .await
        .unwrap();
    root
}

/// The service refused the call for want of authorization; its message.
fn refusal(result: Result<impl std::fmt::Debug, ClientError>, code: tonic::Code) -> String {
    match result {
        Err(ClientError::Service {
            code: actual,
            reason: ErrorReason::Unauthorized,
            message,
            ..
        }) => {
            assert_eq!(actual, code, "{message}");
            message
        }
        other => panic!("expected an authorization refusal ({code:?}), got {other:?}"),
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Operation {
    Send,
    Receive,
    Properties,
    CheckpointUpdate,
    CheckpointList,
    CreateHub,
    ConsumerGroupCreate,
    RuleCreate,
    DeleteHub,
}

const OPERATIONS: [Operation; 9] = [
    Operation::Send,
    Operation::Receive,
    Operation::Properties,
    Operation::CheckpointUpdate,
    Operation::CheckpointList,
    Operation::CreateHub,
    Operation::ConsumerGroupCreate,
    Operation::RuleCreate,
    // Last: it removes the hub (and its rules).
    Operation::DeleteHub,
];

impl Operation {
    /// The right it needs, and whether only a namespace rule can grant it.
    fn needs(self) -> (Option<Rights>, bool) {
        match self {
            Operation::Send => (Some(Rights::SEND), false),
            Operation::Receive | Operation::CheckpointUpdate | Operation::CheckpointList => {
                (Some(Rights::LISTEN), false)
            }
            Operation::Properties => (None, false),
            Operation::ConsumerGroupCreate | Operation::DeleteHub => (Some(Rights::MANAGE), false),
            Operation::CreateHub | Operation::RuleCreate => (Some(Rights::MANAGE), true),
        }
    }

    async fn run(self, client: &Client, case: &str) -> Result<(), ClientError> {
        match self {
            Operation::Send => client
                .producer()
                .send(
                    HUB,
                    SendTarget::PartitionId("0".into()),
                    [EventData::from_body(format!("from {case}"))],
                )
                .await
                .map(drop),
            Operation::Receive => {
                let mut stream = client
                    .consumer()
                    .receive(HUB, "", "0", EventPosition::Earliest, 1)
                    .await?;
                match stream.next().await {
                    Some(batch) => batch.map(drop),
                    None => panic!("the stream ended without events or an error"),
                }
            }
            Operation::Properties => client.get_partition_properties(HUB, "0").await.map(drop),
            Operation::CheckpointUpdate => client
                .checkpoint_store()
                .update_checkpoint(HUB, "$Default", "0", 0, 0, None)
                .await
                .map(drop),
            Operation::CheckpointList => client
                .checkpoint_store()
                .list_checkpoints(HUB, "$Default")
                .await
                .map(drop),
            Operation::CreateHub => client
                .create_event_hub(&format!("made-by-{case}"), 1, None)
                .await
                .map(drop),
            Operation::ConsumerGroupCreate => client
                .create_consumer_group(HUB, &format!("group-of-{case}"))
                .await
                .map(drop),
            Operation::RuleCreate => client
                .create_authorization_rule(None, &format!("rule-of-{case}"), Rights::SEND)
                .await
                .map(drop),
            Operation::DeleteHub => client.delete_event_hub(HUB).await,
        }
    }
}

/// Every operation with a rule of each kind: allowed ones succeed, the others are refused
/// with PERMISSION_DENIED naming the missing right.
#[tokio::test]
async fn each_right_allows_exactly_its_operations() {
    let node = start().await;
    let root = root(&node).await;
    let cases = [
        ("ns-send", Rights::SEND, false),
        ("ns-listen", Rights::LISTEN, false),
        ("ns-send-listen", Rights::SEND.union(Rights::LISTEN), false),
        ("ns-manage", Rights::MANAGE, false),
        ("hub-send", Rights::SEND, true),
        ("hub-listen", Rights::LISTEN, true),
        ("hub-manage", Rights::MANAGE, true),
    ];
    for (case, rights, hub_scoped) in cases {
        root.create_event_hub(HUB, 1, None).await.unwrap();
        // An event for the receive to find.
        root.producer()
            .send(
                HUB,
                SendTarget::PartitionId("0".into()),
                [EventData::from_body("seed")],
            )
            .await
            .unwrap();
        let scope = hub_scoped.then_some(HUB);
        root.create_authorization_rule(scope, case, rights)
            .await
            .unwrap();
        let keys = root.authorization_rule_keys(scope, case).await.unwrap();
        let client = client(&node, &connection_string(case, &keys.primary_key, scope)).await;
        for operation in OPERATIONS {
            let (needed, namespace_only) = operation.needs();
            let allowed = needed.is_none_or(|needed| rights.grants(needed))
                && !(namespace_only && hub_scoped);
            let result = operation.run(&client, case).await;
            if allowed {
                result.unwrap_or_else(|e| panic!("{case} may {operation:?}, but: {e}"));
                continue;
            }
            let message = refusal(result, tonic::Code::PermissionDenied);
            let needed = needed.expect("an operation needing no right is always allowed");
            if namespace_only && hub_scoped {
                // A hub rule's token never covers the namespace, whatever its rights.
                assert!(
                    message.contains("does not cover sb://tributary.test/"),
                    "{case}: {message}"
                );
            } else {
                let expected = format!(
                    "rule \"{case}\" grants {rights} but not {}, which this operation needs",
                    rights.missing(needed)
                );
                assert!(
                    message.contains(&expected),
                    "{case} {operation:?}: {message}"
                );
            }
        }
        if root.get_event_hub(HUB).await.is_ok() {
            root.delete_event_hub(HUB).await.unwrap();
        }
        if !hub_scoped {
            root.delete_authorization_rule(None, case).await.unwrap();
        }
    }
}

#[tokio::test]
async fn refused_tokens_each_say_why() {
    tributary_node::http::metrics_handle();
    let node = start().await;
    let root = root(&node).await;
    for hub in ["a", "b"] {
        root.create_event_hub(hub, 1, None).await.unwrap();
    }
    root.create_authorization_rule(Some("a"), "sender", Rights::SEND)
        .await
        .unwrap();
    let keys = root
        .authorization_rule_keys(Some("a"), "sender")
        .await
        .unwrap();
    let now_s = u64::try_from(node.clock.now_ms() / 1000).unwrap();
    let send = |client: Client, hub: &'static str| async move {
        client
            .producer()
            .send(
                hub,
                SendTarget::PartitionId("0".into()),
                [EventData::from_body("x")],
            )
            .await
    };

    // No token at all.
    let anonymous = Client::connect(&node.endpoint()).await.unwrap();
    let message = refusal(send(anonymous, "a").await, tonic::Code::Unauthenticated);
    assert!(
        message.contains("carries no shared access signature"),
        "{message}"
    );

    // Valid: the primary key, on hub a.
    let valid = client(
        &node,
        &connection_string("sender", &keys.primary_key, Some("a")),
    )
    .await;
    send(valid.clone(), "a").await.unwrap();

    // For hub a, used on hub b.
    let message = refusal(
        send(valid.clone(), "b").await,
        tonic::Code::PermissionDenied,
    );
    assert!(
        message.contains(
            "the token is for sb://tributary.test/a, which does not cover sb://tributary.test/b"
        ),
        "{message}"
    );

    // Forged: signed with a key that is not the rule's.
    let forged = sign("sb://tributary.test/a", "sender", "guessed", now_s + 600);
    let message = refusal(
        send(client_with_token(&node, &forged).await, "a").await,
        tonic::Code::Unauthenticated,
    );
    assert!(
        message.contains("signature does not match rule \"sender\"'s current keys"),
        "{message}"
    );
    assert!(
        !message.contains("guessed") && !message.contains("sig="),
        "{message}"
    );

    // An unknown rule name.
    let unknown = sign(
        "sb://tributary.test/a",
        "nobody",
        &keys.primary_key,
        now_s + 600,
    );
    let message = refusal(
        send(client_with_token(&node, &unknown).await, "a").await,
        tonic::Code::Unauthenticated,
    );
    assert!(
        message.contains("signed with rule \"nobody\", which is not"),
        "{message}"
    );

    // Expired: valid until the node's clock passes its expiry.
    let short = sign(
        "sb://tributary.test/a",
        "sender",
        &keys.primary_key,
        now_s + 60,
    );
    let short_lived = client_with_token(&node, &short).await;
    send(short_lived.clone(), "a").await.unwrap();
    node.clock.advance_ms(61_000);
    let message = refusal(send(short_lived, "a").await, tonic::Code::Unauthenticated);
    assert!(
        message.contains("the token expired at") && message.contains("(1 s ago)"),
        "{message}"
    );

    // Rotated: a token signed with the old primary key is refused; the secondary goes on.
    let before = sign(
        "sb://tributary.test/a",
        "sender",
        &keys.primary_key,
        now_s + 3600,
    );
    let old_primary = client_with_token(&node, &before).await;
    send(old_primary.clone(), "a").await.unwrap();
    let rotated = root
        .regenerate_authorization_rule_key(Some("a"), "sender", RuleKey::Primary, None)
        .await
        .unwrap();
    assert_ne!(rotated.primary_key, keys.primary_key);
    assert_eq!(rotated.secondary_key, keys.secondary_key);
    let message = refusal(send(old_primary, "a").await, tonic::Code::Unauthenticated);
    assert!(
        message.contains("the key may have been rotated"),
        "{message}"
    );
    let secondary = client(
        &node,
        &connection_string("sender", &keys.secondary_key, Some("a")),
    )
    .await;
    send(secondary, "a").await.unwrap();
    let new_primary = client(&node, &rotated.primary_connection_string).await;
    send(new_primary, "a").await.unwrap();

    // Each refusal counted by reason.
    let metrics = tributary_node::http::metrics_handle().render();
    for reason in [
        "missing",
        "wrong_resource",
        "bad_signature",
        "unknown_rule",
        "expired",
    ] {
        assert!(
            metrics.contains(&format!(
                "tributary_auth_refused_total{{reason=\"{reason}\"}}"
            )),
            "{reason} not counted in:\n{metrics}"
        );
    }
}

/// Every RPC of every client-port service, called without a token, is refused with
/// UNAUTHENTICATED: a handler that forgot its check would answer otherwise. The list of
/// RPCs is checked against the proto file, so a new RPC must be added here.
#[tokio::test]
async fn every_rpc_needs_a_token() {
    use tributary_proto::v1 as pb;
    let node = start().await;
    let channel = tonic::transport::Endpoint::from_shared(node.endpoint())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let management = || pb::management_client::ManagementClient::new(channel.clone());
    let store = || pb::checkpoint_store_client::CheckpointStoreClient::new(channel.clone());
    let mut called = BTreeSet::new();
    macro_rules! expect_refused {
        ($service:literal, $rpc:literal, $call:expr) => {{
            called.insert(($service, $rpc));
            match $call.await {
                Err(status) => assert_eq!(
                    status.code(),
                    tonic::Code::Unauthenticated,
                    "{}.{} answered {status:?}",
                    $service,
                    $rpc
                ),
                Ok(_) => panic!("{}.{} answered a call without a token", $service, $rpc),
            }
        }};
    }
    expect_refused!(
        "Management",
        "CreateEventHub",
        management().create_event_hub(pb::CreateEventHubRequest::default())
    );
    expect_refused!(
        "Management",
        "GetEventHub",
        management().get_event_hub(pb::GetEventHubRequest::default())
    );
    expect_refused!(
        "Management",
        "ListEventHubs",
        management().list_event_hubs(pb::ListEventHubsRequest::default())
    );
    expect_refused!(
        "Management",
        "DeleteEventHub",
        management().delete_event_hub(pb::DeleteEventHubRequest::default())
    );
    expect_refused!(
        "Management",
        "UpdateEventHub",
        management().update_event_hub(pb::UpdateEventHubRequest::default())
    );
    expect_refused!(
        "Management",
        "CreateConsumerGroup",
        management().create_consumer_group(pb::CreateConsumerGroupRequest::default())
    );
    expect_refused!(
        "Management",
        "ListConsumerGroups",
        management().list_consumer_groups(pb::ListConsumerGroupsRequest::default())
    );
    expect_refused!(
        "Management",
        "DeleteConsumerGroup",
        management().delete_consumer_group(pb::DeleteConsumerGroupRequest::default())
    );
    expect_refused!(
        "Management",
        "GetPartitionProperties",
        management().get_partition_properties(pb::GetPartitionPropertiesRequest::default())
    );
    expect_refused!(
        "Management",
        "GetClusterStatus",
        management().get_cluster_status(pb::GetClusterStatusRequest::default())
    );
    expect_refused!(
        "Management",
        "DrainNode",
        management().drain_node(pb::DrainNodeRequest::default())
    );
    expect_refused!(
        "Management",
        "DecommissionNode",
        management().decommission_node(pb::DecommissionNodeRequest::default())
    );
    expect_refused!(
        "Management",
        "PlanRebalance",
        management().plan_rebalance(pb::PlanRebalanceRequest::default())
    );
    expect_refused!(
        "Management",
        "CreateAuthorizationRule",
        management().create_authorization_rule(pb::CreateAuthorizationRuleRequest::default())
    );
    expect_refused!(
        "Management",
        "ListAuthorizationRules",
        management().list_authorization_rules(pb::ListAuthorizationRulesRequest::default())
    );
    expect_refused!(
        "Management",
        "GetAuthorizationRuleKeys",
        management().get_authorization_rule_keys(pb::GetAuthorizationRuleKeysRequest::default())
    );
    expect_refused!("Management", "RegenerateAuthorizationRuleKey", management().regenerate_authorization_rule_key(pb::RegenerateAuthorizationRuleKeyRequest::default()));
    expect_refused!(
        "Management",
        "DeleteAuthorizationRule",
        management().delete_authorization_rule(pb::DeleteAuthorizationRuleRequest::default())
    );
    expect_refused!(
        "Producer",
        "Send",
        pb::producer_client::ProducerClient::new(channel.clone()).send(pb::SendRequest::default())
    );
    // A send stream opens without a token; each request on it is refused.
    expect_refused!("Producer", "SendStream", async {
        let request = pb::SendStreamRequest {
            id: 7,
            request: Some(pb::SendRequest {
                event_hub: "a".into(),
                events: vec![pb::EventData::default()],
                ..Default::default()
            }),
        };
        let mut replies = pb::producer_client::ProducerClient::new(channel.clone())
            .send_stream(futures::stream::iter([request]))
            .await?
            .into_inner();
        let reply = replies.message().await?.expect("a reply to the request");
        assert_eq!(reply.id, 7);
        match reply.result {
            Some(pb::send_stream_reply::Result::Error(error)) => Err(tonic::Status::new(
                tonic::Code::from_i32(error.code),
                error.message,
            )),
            other => Ok(other),
        }
    });
    expect_refused!(
        "Consumer",
        "Receive",
        pb::consumer_client::ConsumerClient::new(channel.clone())
            .receive(pb::ReceiveRequest::default())
    );
    expect_refused!(
        "Consumer",
        "GetPartitionReaders",
        pb::consumer_client::ConsumerClient::new(channel.clone())
            .get_partition_readers(pb::GetPartitionReadersRequest::default())
    );
    expect_refused!(
        "Diagnostics",
        "ReplicaEvents",
        pb::diagnostics_client::DiagnosticsClient::new(channel.clone())
            .replica_events(pb::ReplicaEventsRequest::default())
    );
    expect_refused!(
        "CheckpointStore",
        "ListOwnership",
        store().list_ownership(pb::ListOwnershipRequest::default())
    );
    expect_refused!(
        "CheckpointStore",
        "ClaimOwnership",
        store().claim_ownership(pb::ClaimOwnershipRequest::default())
    );
    expect_refused!(
        "CheckpointStore",
        "UpdateCheckpoint",
        store().update_checkpoint(pb::UpdateCheckpointRequest::default())
    );
    expect_refused!(
        "CheckpointStore",
        "ListCheckpoints",
        store().list_checkpoints(pb::ListCheckpointsRequest::default())
    );
    expect_refused!(
        "CheckpointStore",
        "ListKafkaOffsets",
        store().list_kafka_offsets(pb::ListKafkaOffsetsRequest::default())
    );
    let called: BTreeSet<(String, String)> = called
        .into_iter()
        .map(|(service, rpc)| (service.to_owned(), rpc.to_owned()))
        .collect();
    assert_eq!(called, client_port_rpcs());
}

/// (service, rpc) of every RPC in the client API's proto file.
fn client_port_rpcs() -> BTreeSet<(String, String)> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../proto/proto/tributary/v1/tributary.proto");
    let text = std::fs::read_to_string(&path).unwrap();
    let mut service = None;
    let mut rpcs = BTreeSet::new();
    for line in text.lines().map(str::trim) {
        if let Some(rest) = line.strip_prefix("service ") {
            service = rest.split_whitespace().next().map(str::to_owned);
        } else if let Some(rest) = line.strip_prefix("rpc ") {
            let name = rest.split('(').next().unwrap().trim().to_owned();
            rpcs.insert((service.clone().expect("rpc inside a service"), name));
        }
    }
    assert!(rpcs.len() > 20, "parsed too few RPCs: {rpcs:?}");
    rpcs
}
