//! The one conversion between protobuf messages and the broker's domain types, per type.

use std::collections::HashMap;
use std::time::Duration;

use tributary_broker::Error;
use tributary_broker::service::{
    AuthorizationRule, CaptureRequest, CaptureSettings, Checkpoint, CleanupPolicy, ClusterStatus,
    EventRecord, HubRecord, HubSettingsRequest, HubUpdateRequest, NewHubRequest, Ownership,
    PartitionProperties, PlannedMove, Position, Property, ReadEvent, RuleKeys,
};
use tributary_proto::v1 as pb;

pub fn hub_properties(record: &HubRecord) -> pb::EventHubProperties {
    pb::EventHubProperties {
        name: record.name.clone(),
        partition_count: u32::from(record.partition_count),
        retention_ms: record.retention_ms,
        created_at_ms: record.created_at_ms,
        partition_ids: (0..record.partition_count).map(|p| p.to_string()).collect(),
        replication_factor: u32::from(record.replication_factor),
        throughput_units: record.throughput_units,
        cleanup_policy: cleanup_policy_to_proto(record.settings.cleanup_policy) as i32,
        tombstone_retention_ms: record.settings.tombstone_retention_ms,
        compaction_lag_ms: record.settings.compaction_lag_ms,
        retention_bytes_max: record.settings.retention_bytes_max,
        capture: record.settings.capture.as_ref().map(capture_to_proto),
    }
}

fn capture_to_proto(capture: &CaptureSettings) -> pb::CaptureSettings {
    pb::CaptureSettings {
        destination: capture.destination.to_string(),
        window_ms: capture.window_ms,
        window_bytes: capture.window_bytes,
        namespace: capture.namespace.clone(),
        enabled_at_ms: capture.enabled_at_ms,
    }
}

fn capture_request(capture: &pb::CaptureSettings) -> CaptureRequest {
    CaptureRequest {
        destination: capture.destination.clone(),
        window_ms: capture.window_ms,
        window_bytes: capture.window_bytes,
        namespace: capture.namespace.clone(),
    }
}

fn cleanup_policy_to_proto(policy: CleanupPolicy) -> pb::CleanupPolicy {
    match policy {
        CleanupPolicy::Delete => pb::CleanupPolicy::Delete,
        CleanupPolicy::Compact => pb::CleanupPolicy::Compact,
        CleanupPolicy::DeleteOrCompact => pb::CleanupPolicy::DeleteOrCompact,
    }
}

/// A cleanup policy from a request; unspecified means `Delete`.
fn cleanup_policy(value: i32) -> Result<CleanupPolicy, Error> {
    match pb::CleanupPolicy::try_from(value) {
        Ok(pb::CleanupPolicy::Unspecified | pb::CleanupPolicy::Delete) => Ok(CleanupPolicy::Delete),
        Ok(pb::CleanupPolicy::Compact) => Ok(CleanupPolicy::Compact),
        Ok(pb::CleanupPolicy::DeleteOrCompact) => Ok(CleanupPolicy::DeleteOrCompact),
        Err(_) => Err(Error::invalid(format!(
            "unknown cleanup policy {value}; use DELETE, COMPACT or DELETE_OR_COMPACT"
        ))),
    }
}

/// A create request: zeros take the broker's defaults.
pub fn new_hub_request(req: &pb::CreateEventHubRequest) -> Result<NewHubRequest, Error> {
    Ok(NewHubRequest {
        name: req.name.clone(),
        partition_count: req.partition_count,
        retention: (req.retention_ms > 0).then(|| Duration::from_millis(req.retention_ms)),
        replication_factor: match req.replication_factor {
            0 => None,
            rf => Some(u8::try_from(rf).unwrap_or(u8::MAX)),
        },
        throughput_units: req.throughput_units,
        settings: HubSettingsRequest {
            cleanup_policy: cleanup_policy(req.cleanup_policy)?,
            tombstone_retention_ms: req.tombstone_retention_ms,
            compaction_lag_ms: req.compaction_lag_ms,
            retention_bytes_max: req.retention_bytes_max,
            capture: req.capture.as_ref().map(capture_request),
        },
    })
}

/// The changes an update request asks for.
pub fn hub_update_request(req: &pb::UpdateEventHubRequest) -> Result<HubUpdateRequest, Error> {
    let capture = match (&req.capture, req.capture_off) {
        (Some(_), true) => {
            return Err(Error::invalid(
                "capture settings and capture_off were both given; give one: the settings \
                 enable capture, capture_off disables it",
            ));
        }
        (Some(capture), false) => Some(Some(capture_request(capture))),
        (None, true) => Some(None),
        (None, false) => None,
    };
    Ok(HubUpdateRequest {
        name: req.name.clone(),
        capture,
        throughput_units: req.throughput_units,
        retention_ms: req.retention_ms,
        cleanup_policy: req.cleanup_policy.map(cleanup_policy).transpose()?,
        tombstone_retention_ms: req.tombstone_retention_ms,
        compaction_lag_ms: req.compaction_lag_ms,
        retention_bytes_max: req.retention_bytes_max,
    })
}

pub fn partition_properties(p: PartitionProperties) -> pb::PartitionProperties {
    pb::PartitionProperties {
        event_hub: p.hub,
        partition_id: p.partition.to_string(),
        begin_sequence_number: p.begin_sequence.0,
        last_enqueued_sequence_number: p.last_enqueued_sequence.0,
        last_enqueued_offset: p.last_enqueued_offset.to_string(),
        last_enqueued_time_ms: p.last_enqueued_time_ms,
        is_empty: p.is_empty,
        capture_next_sequence_number: p.capture_next_sequence.0,
    }
}

/// An event to send; the broker adds the send's partition key.
pub fn event_record(event: pb::EventData) -> Result<EventRecord, Error> {
    let mut properties = Vec::with_capacity(event.properties.len());
    let mut keys: Vec<_> = event.properties.into_iter().collect();
    keys.sort_by(|a, b| a.0.cmp(&b.0));
    for (name, value) in keys {
        let property = match value.value {
            Some(pb::property_value::Value::StringValue(s)) => Property::String(s),
            Some(pb::property_value::Value::Int64Value(i)) => Property::Int64(i),
            Some(pb::property_value::Value::DoubleValue(d)) => Property::Double(d),
            Some(pb::property_value::Value::BoolValue(b)) => Property::Bool(b),
            Some(pb::property_value::Value::BytesValue(b)) => Property::Bytes(b),
            Some(pb::property_value::Value::TimestampMs(t)) => Property::TimestampMs(t),
            None => {
                return Err(Error::invalid(format!(
                    "property '{name}' has no value; set one of string, int64, double, bool, bytes or timestamp"
                )));
            }
        };
        properties.push((name, property));
    }
    Ok(EventRecord {
        partition_key: None,
        properties,
        body: event.body,
    })
}

pub fn received_event(event: ReadEvent) -> pb::ReceivedEvent {
    let body = event.record.body.clone();
    let partition_key = event.record.partition_key.clone().unwrap_or_default();
    let properties: HashMap<String, pb::PropertyValue> = event
        .record
        .shown_properties()
        .map(|(name, value)| {
            let value = match value {
                Property::String(s) => pb::property_value::Value::StringValue(s),
                Property::Int64(i) => pb::property_value::Value::Int64Value(i),
                Property::Double(d) => pb::property_value::Value::DoubleValue(d),
                Property::Bool(b) => pb::property_value::Value::BoolValue(b),
                Property::Bytes(b) => pb::property_value::Value::BytesValue(b),
                Property::TimestampMs(t) => pb::property_value::Value::TimestampMs(t),
            };
            (name, pb::PropertyValue { value: Some(value) })
        })
        .collect();
    pb::ReceivedEvent {
        body,
        properties,
        sequence_number: event.sequence,
        offset: event.offset.to_string(),
        enqueued_time_ms: event.enqueued_time_ms,
        partition_key,
    }
}

pub fn position(position: Option<pb::EventPosition>) -> Result<Position, Error> {
    let Some(position) = position else {
        return Ok(Position::Earliest);
    };
    let inclusive = position.inclusive;
    Ok(match position.kind {
        None | Some(pb::event_position::Kind::Earliest(_)) => Position::Earliest,
        Some(pb::event_position::Kind::Latest(_)) => Position::Latest,
        Some(pb::event_position::Kind::Offset(offset)) => Position::Offset { offset, inclusive },
        Some(pb::event_position::Kind::SequenceNumber(sequence)) => Position::Sequence {
            sequence,
            inclusive,
        },
        Some(pb::event_position::Kind::EnqueuedTimeMs(time_ms)) => {
            Position::EnqueuedTime { time_ms, inclusive }
        }
    })
}

pub fn ownership(partition: u16, record: Ownership) -> pb::Ownership {
    pb::Ownership {
        partition_id: partition.to_string(),
        owner_id: record.owner_id,
        last_modified_ms: record.last_modified_ms,
        etag: record.etag,
    }
}

pub fn checkpoint(partition: u16, record: Checkpoint) -> pb::Checkpoint {
    pb::Checkpoint {
        partition_id: partition.to_string(),
        offset: record.offset.to_string(),
        sequence_number: record.sequence_number,
        last_modified_ms: record.last_modified_ms,
    }
}

pub fn rule_properties(hub: &str, rule: &AuthorizationRule) -> pb::AuthorizationRule {
    pb::AuthorizationRule {
        name: rule.name.clone(),
        event_hub: hub.to_owned(),
        rights: rule
            .rights
            .to_string()
            .split(", ")
            .filter(|name| *name != "none")
            .map(str::to_owned)
            .collect(),
    }
}

pub fn rule_keys(hub: &str, keys: RuleKeys) -> pb::AuthorizationRuleKeys {
    pb::AuthorizationRuleKeys {
        rule: Some(rule_properties(hub, &keys.rule)),
        primary_key: keys.rule.primary_key,
        secondary_key: keys.rule.secondary_key,
        primary_connection_string: keys.primary_connection_string,
        secondary_connection_string: keys.secondary_connection_string,
    }
}

pub fn planned_move(planned: PlannedMove) -> pb::PlannedMove {
    match planned {
        PlannedMove::Replica {
            hub,
            partition,
            from,
            to,
        } => pb::PlannedMove {
            kind: "replica".into(),
            event_hub: hub,
            partition_id: partition.to_string(),
            from: from.map_or(0, |n| n.0),
            to: to.0,
        },
        PlannedMove::Leader {
            hub,
            partition,
            from,
            to,
        } => pb::PlannedMove {
            kind: "leader".into(),
            event_hub: hub,
            partition_id: partition.to_string(),
            from: from.0,
            to: to.0,
        },
    }
}

pub fn cluster_status(status: ClusterStatus) -> pb::ClusterStatus {
    pb::ClusterStatus {
        cluster_id: status.cluster_id,
        feature_level: status.feature_level,
        feature_release: status.feature_release,
        controller_leader: status.controller_leader,
        under_replicated: status.under_replicated,
        nodes: status
            .nodes
            .into_iter()
            .map(|n| pb::NodeStatus {
                id: n.id,
                client_addr: n.client_addr,
                peer_addr: n.peer_addr,
                up: n.up,
                controller_voter: n.controller_voter,
                capacity_units: n.capacity_units,
                zone: n.zone,
                replicas: n.replicas,
                leaders: n.leaders,
                draining: n.draining,
                decommissioning: n.decommissioning,
                reserved_throughput_units: n.reserved_throughput_units,
                bytes_in: n.bytes_in,
                events_in: n.events_in,
                bytes_out: n.bytes_out,
                events_out: n.events_out,
                release: n.release.unwrap_or_default(),
                feature_level: n.feature_level.unwrap_or_default(),
            })
            .collect(),
        partitions: status
            .partitions
            .into_iter()
            .map(|p| pb::PartitionStatus {
                event_hub: p.event_hub,
                partition_id: p.partition_id,
                leader: p.leader,
                replicas: p
                    .replicas
                    .into_iter()
                    .map(|r| pb::ReplicaStatus {
                        node: r.node,
                        up: r.up,
                        caught_up: r.caught_up,
                        last_applied_index: r.last_applied_index,
                        rebuild_bytes_done: r.rebuild_bytes_done,
                        rebuild_bytes_total: r.rebuild_bytes_total,
                    })
                    .collect(),
            })
            .collect(),
        moves: status
            .moves
            .into_iter()
            .map(|m| pb::ReplicaMoveStatus {
                event_hub: m.event_hub,
                partition_id: m.partition_id,
                from: m.from,
                to: m.to,
                started_ms: m.started_ms,
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tributary_broker::service::{AMQP_EXTRAS_PROPERTY, EventRecord};

    fn read_event(properties: Vec<(String, Property)>) -> ReadEvent {
        ReadEvent {
            sequence: 3,
            offset: 40,
            enqueued_time_ms: 1_700_000_000_000,
            record: EventRecord {
                partition_key: Some("k".into()),
                properties,
                body: bytes::Bytes::from_static(b"body"),
            },
        }
    }

    #[test]
    fn the_amqp_extras_are_not_shown_but_a_property_of_that_name_elsewhere_is() {
        let extras = (
            AMQP_EXTRAS_PROPERTY.to_owned(),
            Property::Bytes(bytes::Bytes::from_static(b"\xc1\x01\x00")),
        );
        let shown = received_event(read_event(vec![
            ("n".into(), Property::Int64(1)),
            extras.clone(),
        ]));
        assert_eq!(shown.properties.len(), 1);
        assert!(shown.properties.contains_key("n"));
        assert_eq!(shown.partition_key, "k");
        assert_eq!(&shown.body[..], b"body");
        // Not last: an application property of its own, shown.
        let shown = received_event(read_event(vec![extras, ("n".into(), Property::Int64(1))]));
        assert_eq!(shown.properties.len(), 2);
    }
}
