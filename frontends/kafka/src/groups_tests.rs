//! Every answer the group APIs build encodes in every version served: a field set that a
//! version lacks would make kafka-protocol refuse the response (and the connection close).

use bytes::{Bytes, BytesMut};
use kafka_protocol::messages::{ApiKey, ResponseKind};

use super::*;
use crate::apis;
use crate::coordinator::MemberView;

fn encodes(api: ApiKey, response: &ResponseKind, version: i16) {
    let mut out = BytesMut::new();
    response
        .encode(&mut out, version)
        .unwrap_or_else(|e| panic!("{api:?} v{version}: {e}"));
}

fn versions(api: ApiKey) -> std::ops::RangeInclusive<i16> {
    let (min, max) = apis::versions(api).expect("served");
    min..=max
}

#[test]
fn join_and_sync_answers_encode_in_every_version() {
    let joined = Joined {
        error_code: 0,
        generation_id: 3,
        protocol_type: Some("consumer".into()),
        protocol_name: Some("range".into()),
        leader: "m-1".into(),
        member_id: "m-1".into(),
        members: vec![
            (
                "m-1".into(),
                Some("instance-1".into()),
                Bytes::from_static(b"meta"),
            ),
            ("m-2".into(), None, Bytes::new()),
        ],
    };
    for version in versions(ApiKey::JoinGroup) {
        let response = join_response(joined.clone(), version);
        encodes(
            ApiKey::JoinGroup,
            &ResponseKind::JoinGroup(response),
            version,
        );
        let refused = join_response(Joined::default(), version);
        encodes(
            ApiKey::JoinGroup,
            &ResponseKind::JoinGroup(refused),
            version,
        );
    }
    let synced = Synced {
        error_code: 0,
        protocol_type: Some("consumer".into()),
        protocol_name: Some("range".into()),
        assignment: Bytes::from_static(b"assigned"),
    };
    for version in versions(ApiKey::SyncGroup) {
        let response = sync_response(synced.clone(), version);
        encodes(
            ApiKey::SyncGroup,
            &ResponseKind::SyncGroup(response),
            version,
        );
    }
}

#[test]
fn described_groups_encode_in_every_version() {
    let view = GroupView {
        group: "billing".into(),
        state: GroupState::Stable,
        protocol_type: "consumer".into(),
        protocol: "range".into(),
        generation_id: 2,
        members: vec![MemberView {
            member_id: "m-1".into(),
            group_instance_id: Some("instance-1".into()),
            client_id: "rdkafka".into(),
            client_host: "/127.0.0.1".into(),
            metadata: Bytes::from_static(b"meta"),
            assignment: Bytes::from_static(b"assigned"),
        }],
    };
    for version in versions(ApiKey::DescribeGroups) {
        let mut response = DescribeGroupsResponse::default();
        response.groups = vec![
            described_group(GroupId(text("billing")), Some(view.clone()), version),
            described_group(GroupId(text("unknown")), None, version),
        ];
        encodes(
            ApiKey::DescribeGroups,
            &ResponseKind::DescribeGroups(response),
            version,
        );
    }
}

#[test]
fn listed_groups_encode_in_every_version() {
    for version in versions(ApiKey::ListGroups) {
        let mut response = ListGroupsResponse::default();
        response.groups = vec![listed_group(
            "billing",
            "consumer",
            GroupState::PreparingRebalance,
            version,
        )];
        encodes(
            ApiKey::ListGroups,
            &ResponseKind::ListGroups(response),
            version,
        );
    }
}
