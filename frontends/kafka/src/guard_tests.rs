use bytes::{Bytes, BytesMut};
use kafka_protocol::messages::api_versions_request::ApiVersionsRequest;
use kafka_protocol::messages::create_topics_request::{
    CreatableReplicaAssignment, CreatableTopic, CreatableTopicConfig, CreateTopicsRequest,
};
use kafka_protocol::messages::describe_configs_request::{
    DescribeConfigsRequest, DescribeConfigsResource,
};
use kafka_protocol::messages::describe_groups_request::DescribeGroupsRequest;
use kafka_protocol::messages::fetch_request::{
    FetchPartition, FetchRequest, FetchTopic, ForgottenTopic,
};
use kafka_protocol::messages::find_coordinator_request::FindCoordinatorRequest;
use kafka_protocol::messages::heartbeat_request::HeartbeatRequest;
use kafka_protocol::messages::init_producer_id_request::InitProducerIdRequest;
use kafka_protocol::messages::join_group_request::{JoinGroupRequest, JoinGroupRequestProtocol};
use kafka_protocol::messages::leave_group_request::{LeaveGroupRequest, MemberIdentity};
use kafka_protocol::messages::list_groups_request::ListGroupsRequest;
use kafka_protocol::messages::list_offsets_request::{
    ListOffsetsPartition, ListOffsetsRequest, ListOffsetsTopic,
};
use kafka_protocol::messages::metadata_request::{MetadataRequest, MetadataRequestTopic};
use kafka_protocol::messages::offset_commit_request::{
    OffsetCommitRequest, OffsetCommitRequestPartition, OffsetCommitRequestTopic,
};
use kafka_protocol::messages::offset_fetch_request::{
    OffsetFetchRequest, OffsetFetchRequestGroup, OffsetFetchRequestTopic, OffsetFetchRequestTopics,
};
use kafka_protocol::messages::produce_request::{
    PartitionProduceData, ProduceRequest, TopicProduceData,
};
use kafka_protocol::messages::sasl_authenticate_request::SaslAuthenticateRequest;
use kafka_protocol::messages::sasl_handshake_request::SaslHandshakeRequest;
use kafka_protocol::messages::sync_group_request::{SyncGroupRequest, SyncGroupRequestAssignment};
use kafka_protocol::messages::{
    ApiKey, BrokerId, GroupId, ProducerId, RequestKind, TopicName, TransactionalId,
};
use kafka_protocol::protocol::{Encodable, StrBytes};
use proptest::prelude::*;

use super::*;
use crate::apis;

fn name(text: &str) -> TopicName {
    TopicName(StrBytes::from_string(text.to_owned()))
}

/// A request of every served API, with `topics` topics of `partitions` partitions where it
/// has them.
fn request(api: ApiKey, version: i16, topics: usize, partitions: usize) -> RequestKind {
    match api {
        ApiKey::Produce => {
            let mut r = ProduceRequest::default();
            r.acks = -1;
            r.timeout_ms = 30_000;
            r.topic_data = (0..topics)
                .map(|t| {
                    let mut topic = TopicProduceData::default();
                    topic.name = name(&format!("hub-{t}"));
                    topic.partition_data = (0..partitions)
                        .map(|p| {
                            let mut data = PartitionProduceData::default();
                            data.index = p as i32;
                            data.records = Some(Bytes::from(vec![7u8; p + 1]));
                            data
                        })
                        .collect();
                    topic
                })
                .collect();
            RequestKind::Produce(r)
        }
        ApiKey::Fetch => {
            let mut r = FetchRequest::default();
            r.max_wait_ms = 500;
            r.max_bytes = 52_428_800;
            r.topics = (0..topics)
                .map(|t| {
                    let mut topic = FetchTopic::default();
                    topic.topic = name(&format!("hub-{t}"));
                    topic.partitions = (0..partitions)
                        .map(|p| {
                            let mut part = FetchPartition::default();
                            part.partition = p as i32;
                            part.fetch_offset = 12;
                            part.partition_max_bytes = 1 << 20;
                            part
                        })
                        .collect();
                    topic
                })
                .collect();
            if version >= 7 {
                let mut forgotten = ForgottenTopic::default();
                forgotten.topic = name("gone");
                forgotten.partitions = vec![1, 2];
                r.forgotten_topics_data = vec![forgotten];
            }
            if version >= 11 {
                r.rack_id = StrBytes::from_static_str("rack-a");
            }
            RequestKind::Fetch(r)
        }
        ApiKey::ListOffsets => {
            let mut r = ListOffsetsRequest::default();
            r.topics = (0..topics)
                .map(|t| {
                    let mut topic = ListOffsetsTopic::default();
                    topic.name = name(&format!("hub-{t}"));
                    topic.partitions = (0..partitions)
                        .map(|p| {
                            let mut part = ListOffsetsPartition::default();
                            part.partition_index = p as i32;
                            part.timestamp = -2;
                            part
                        })
                        .collect();
                    topic
                })
                .collect();
            RequestKind::ListOffsets(r)
        }
        ApiKey::Metadata => {
            let mut r = MetadataRequest::default();
            r.topics = Some(
                (0..topics)
                    .map(|t| {
                        let mut topic = MetadataRequestTopic::default();
                        topic.name = Some(name(&format!("hub-{t}")));
                        topic
                    })
                    .collect(),
            );
            RequestKind::Metadata(r)
        }
        ApiKey::ApiVersions => {
            let mut r = ApiVersionsRequest::default();
            if version >= 3 {
                r.client_software_name = StrBytes::from_static_str("librdkafka");
                r.client_software_version = StrBytes::from_static_str("2.16.0");
            }
            RequestKind::ApiVersions(r)
        }
        ApiKey::SaslHandshake => {
            let mut r = SaslHandshakeRequest::default();
            r.mechanism = StrBytes::from_static_str("PLAIN");
            RequestKind::SaslHandshake(r)
        }
        ApiKey::SaslAuthenticate => {
            let mut r = SaslAuthenticateRequest::default();
            r.auth_bytes = Bytes::from_static(b"\0user\0password");
            RequestKind::SaslAuthenticate(r)
        }
        ApiKey::DescribeConfigs => {
            let mut r = DescribeConfigsRequest::default();
            r.resources = (0..topics)
                .map(|t| {
                    let mut resource = DescribeConfigsResource::default();
                    resource.resource_type = 2;
                    resource.resource_name = StrBytes::from_string(format!("hub-{t}"));
                    resource.configuration_keys = (t % 2 == 0).then(|| {
                        (0..partitions)
                            .map(|k| StrBytes::from_string(format!("key-{k}")))
                            .collect()
                    });
                    resource
                })
                .collect();
            r.include_synonyms = true;
            RequestKind::DescribeConfigs(r)
        }
        ApiKey::CreateTopics => {
            let mut r = CreateTopicsRequest::default();
            r.timeout_ms = 30_000;
            r.topics = (0..topics)
                .map(|t| {
                    let mut topic = CreatableTopic::default();
                    topic.name = name(&format!("hub-{t}"));
                    topic.num_partitions = partitions as i32;
                    topic.replication_factor = 3;
                    topic.assignments = (0..partitions)
                        .map(|p| {
                            let mut assignment = CreatableReplicaAssignment::default();
                            assignment.partition_index = p as i32;
                            assignment.broker_ids = vec![BrokerId(1), BrokerId(2)];
                            assignment
                        })
                        .collect();
                    topic.configs = (0..partitions)
                        .map(|c| {
                            let mut config = CreatableTopicConfig::default();
                            config.name = StrBytes::from_string(format!("config-{c}"));
                            config.value = (c % 2 == 0).then(|| StrBytes::from_static_str("v"));
                            config
                        })
                        .collect();
                    topic
                })
                .collect();
            RequestKind::CreateTopics(r)
        }
        ApiKey::InitProducerId => {
            let mut r = InitProducerIdRequest::default();
            // A transactional id where the request has topics, to walk a string too.
            if topics > 0 {
                r.transactional_id = Some(TransactionalId(StrBytes::from_static_str("txn-1")));
            }
            r.transaction_timeout_ms = 60_000;
            if version >= 3 {
                r.producer_id = ProducerId(4_096_001);
                r.producer_epoch = 2;
            }
            RequestKind::InitProducerId(r)
        }
        ApiKey::FindCoordinator => {
            let mut r = FindCoordinatorRequest::default();
            r.key = StrBytes::from_static_str("billing");
            RequestKind::FindCoordinator(r)
        }
        ApiKey::JoinGroup => {
            let mut r = JoinGroupRequest::default();
            r.group_id = group("billing");
            r.session_timeout_ms = 45_000;
            if version >= 1 {
                r.rebalance_timeout_ms = 300_000;
            }
            r.member_id = StrBytes::from_static_str("rdkafka-1");
            if version >= 5 {
                r.group_instance_id = Some(StrBytes::from_static_str("instance-1"));
            }
            r.protocol_type = StrBytes::from_static_str("consumer");
            r.protocols = (0..topics + partitions)
                .map(|i| {
                    let mut p = JoinGroupRequestProtocol::default();
                    p.name = StrBytes::from_string(format!("protocol-{i}"));
                    p.metadata = Bytes::from(vec![1u8; i + 1]);
                    p
                })
                .collect();
            RequestKind::JoinGroup(r)
        }
        ApiKey::SyncGroup => {
            let mut r = SyncGroupRequest::default();
            r.group_id = group("billing");
            r.generation_id = 3;
            r.member_id = StrBytes::from_static_str("rdkafka-1");
            if version >= 3 {
                r.group_instance_id = Some(StrBytes::from_static_str("instance-1"));
            }
            if version >= 5 {
                r.protocol_type = Some(StrBytes::from_static_str("consumer"));
                r.protocol_name = Some(StrBytes::from_static_str("range"));
            }
            r.assignments = (0..topics + partitions)
                .map(|i| {
                    let mut a = SyncGroupRequestAssignment::default();
                    a.member_id = StrBytes::from_string(format!("member-{i}"));
                    a.assignment = Bytes::from(vec![2u8; i + 2]);
                    a
                })
                .collect();
            RequestKind::SyncGroup(r)
        }
        ApiKey::Heartbeat => {
            let mut r = HeartbeatRequest::default();
            r.group_id = group("billing");
            r.generation_id = 3;
            r.member_id = StrBytes::from_static_str("rdkafka-1");
            if version >= 3 {
                r.group_instance_id = Some(StrBytes::from_static_str("instance-1"));
            }
            RequestKind::Heartbeat(r)
        }
        ApiKey::LeaveGroup => {
            let mut r = LeaveGroupRequest::default();
            r.group_id = group("billing");
            if version <= 2 {
                r.member_id = StrBytes::from_static_str("rdkafka-1");
            } else {
                r.members = (0..topics + partitions)
                    .map(|i| {
                        let mut m = MemberIdentity::default();
                        m.member_id = StrBytes::from_string(format!("member-{i}"));
                        m.group_instance_id =
                            (i % 2 == 0).then(|| StrBytes::from_string(format!("instance-{i}")));
                        m
                    })
                    .collect();
            }
            RequestKind::LeaveGroup(r)
        }
        ApiKey::OffsetCommit => {
            let mut r = OffsetCommitRequest::default();
            r.group_id = group("billing");
            r.generation_id_or_member_epoch = 3;
            r.member_id = StrBytes::from_static_str("rdkafka-1");
            if version >= 7 {
                r.group_instance_id = Some(StrBytes::from_static_str("instance-1"));
            }
            if version <= 4 {
                r.retention_time_ms = -1;
            }
            r.topics = (0..topics)
                .map(|t| {
                    let mut topic = OffsetCommitRequestTopic::default();
                    topic.name = name(&format!("hub-{t}"));
                    topic.partitions = (0..partitions)
                        .map(|p| {
                            let mut part = OffsetCommitRequestPartition::default();
                            part.partition_index = p as i32;
                            part.committed_offset = 40 + p as i64;
                            if version >= 6 {
                                part.committed_leader_epoch = 2;
                            }
                            part.committed_metadata = Some(StrBytes::from_static_str("meta"));
                            part
                        })
                        .collect();
                    topic
                })
                .collect();
            RequestKind::OffsetCommit(r)
        }
        ApiKey::OffsetFetch => {
            let mut r = OffsetFetchRequest::default();
            if version <= 7 {
                r.group_id = group("billing");
                r.topics = Some(
                    (0..topics)
                        .map(|t| {
                            let mut topic = OffsetFetchRequestTopic::default();
                            topic.name = name(&format!("hub-{t}"));
                            topic.partition_indexes = (0..partitions as i32).collect();
                            topic
                        })
                        .collect(),
                );
            } else {
                r.groups = (0..topics)
                    .map(|g| {
                        let mut one = OffsetFetchRequestGroup::default();
                        one.group_id = group(&format!("group-{g}"));
                        one.topics = (g % 2 == 0).then(|| {
                            (0..partitions)
                                .map(|t| {
                                    let mut topic = OffsetFetchRequestTopics::default();
                                    topic.name = name(&format!("hub-{t}"));
                                    topic.partition_indexes = (0..t as i32 + 1).collect();
                                    topic
                                })
                                .collect()
                        });
                        one
                    })
                    .collect();
            }
            if version >= 7 {
                r.require_stable = true;
            }
            RequestKind::OffsetFetch(r)
        }
        ApiKey::ListGroups => {
            let mut r = ListGroupsRequest::default();
            if version >= 4 {
                r.states_filter = (0..topics)
                    .map(|i| StrBytes::from_string(format!("state-{i}")))
                    .collect();
            }
            RequestKind::ListGroups(r)
        }
        ApiKey::DescribeGroups => {
            let mut r = DescribeGroupsRequest::default();
            r.groups = (0..topics).map(|i| group(&format!("group-{i}"))).collect();
            if version >= 3 {
                r.include_authorized_operations = true;
            }
            RequestKind::DescribeGroups(r)
        }
        other => panic!("{other:?} is not served"),
    }
}

fn group(text: &str) -> GroupId {
    GroupId(StrBytes::from_string(text.to_owned()))
}

fn encoded(api: ApiKey, version: i16, topics: usize, partitions: usize) -> Bytes {
    let mut out = BytesMut::new();
    request(api, version, topics, partitions)
        .encode(&mut out, version)
        .unwrap();
    out.freeze()
}

#[test]
fn every_served_request_walks_to_its_end() {
    for (api, min, max) in apis::SUPPORTED {
        for version in *min..=*max {
            for (topics, partitions) in [(0, 0), (1, 1), (3, 5)] {
                let body = encoded(*api, version, topics, partitions);
                assert_eq!(
                    check(*api, version, &body),
                    Ok(0),
                    "{api:?} v{version} with {topics} topics of {partitions} partitions"
                );
            }
        }
    }
    let metadata_all = {
        let mut out = BytesMut::new();
        MetadataRequest::default().encode(&mut out, 12).unwrap();
        out.freeze()
    };
    assert_eq!(check(ApiKey::Metadata, 12, &metadata_all), Ok(0));
}

#[test]
fn an_array_longer_than_its_request_is_refused() {
    // Metadata v1: an array of topics declaring i32::MAX elements in 4 bytes.
    let body = i32::MAX.to_be_bytes();
    let err = check(ApiKey::Metadata, 1, &body).unwrap_err();
    assert!(err.0.contains("2147483647 elements"), "{err:?}");
    // Flexible: a compact array declaring 2^32 elements.
    let body = [0xff, 0xff, 0xff, 0xff, 0x0f];
    assert!(check(ApiKey::Metadata, 12, &body).is_err());
    // A truncated request.
    let body = encoded(ApiKey::Produce, 9, 2, 2);
    assert!(check(ApiKey::Produce, 9, &body[..body.len() - 3]).is_err());
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(3000))]

    /// Whatever the body, a request the walk accepts decodes (or fails) without an
    /// unbounded allocation; the server closes the connection on either refusal.
    #[test]
    fn accepted_bodies_decode_without_unbounded_allocation(
        api in prop::sample::select(apis::SUPPORTED.to_vec()),
        version_pick in 0i16..16,
        body in prop::collection::vec(any::<u8>(), 0..512),
    ) {
        let (key, min, max) = api;
        let version = min + version_pick % (max - min + 1);
        if check(key, version, &body).is_ok() {
            let _ = RequestKind::decode(key, &mut Bytes::from(body), version);
        }
    }

    /// A valid request with a byte changed: the walk refuses it or the decoder copes.
    #[test]
    fn corrupted_requests_are_refused_or_decoded(
        api in prop::sample::select(apis::SUPPORTED.to_vec()),
        version_pick in 0i16..16,
        at in any::<prop::sample::Index>(),
        value in any::<u8>(),
    ) {
        let (key, min, max) = api;
        let version = min + version_pick % (max - min + 1);
        let mut body = encoded(key, version, 2, 3).to_vec();
        if !body.is_empty() {
            let i = at.index(body.len());
            body[i] = value;
        }
        if check(key, version, &body).is_ok() {
            let _ = RequestKind::decode(key, &mut Bytes::from(body), version);
        }
    }
}
