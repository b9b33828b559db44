//! The one conversion between protobuf messages and domain types, per type.

use std::collections::HashMap;

use tributary_proto::v1 as pb;

use crate::api::error::ApiError;
use crate::capture::parse_destination;
use crate::controller::state::{
    CAPTURE_WINDOW_DEFAULT_BYTES, CAPTURE_WINDOW_DEFAULT_MS, CaptureSettings, CleanupPolicy,
    HubRecord, HubSettings, HubUpdate,
};
use crate::partition::ReadEvent;
use crate::partition::codec::{EventRecord, Property};
use crate::partition::position::Position;
use crate::partition::state_machine::{CaptureProgress, Progress};

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

/// What a request's capture settings ask for: defaults where it leaves them unset, the
/// cluster id as the namespace when it names none, and `now_ms` as the time capture is
/// enabled. The controller checks the ranges.
fn capture_settings(
    capture: &pb::CaptureSettings,
    now_ms: i64,
    cluster_id: &str,
) -> Result<CaptureSettings, ApiError> {
    Ok(CaptureSettings {
        destination: parse_destination(&capture.destination).map_err(ApiError::invalid)?,
        window_ms: match capture.window_ms {
            0 => CAPTURE_WINDOW_DEFAULT_MS,
            ms => ms,
        },
        window_bytes: match capture.window_bytes {
            0 => CAPTURE_WINDOW_DEFAULT_BYTES,
            bytes => bytes,
        },
        namespace: match capture.namespace.as_str() {
            "" => cluster_id.to_owned(),
            namespace => namespace.to_owned(),
        },
        enabled_at_ms: now_ms,
    })
}

fn cleanup_policy_to_proto(policy: CleanupPolicy) -> pb::CleanupPolicy {
    match policy {
        CleanupPolicy::Delete => pb::CleanupPolicy::Delete,
        CleanupPolicy::Compact => pb::CleanupPolicy::Compact,
        CleanupPolicy::DeleteOrCompact => pb::CleanupPolicy::DeleteOrCompact,
    }
}

/// A cleanup policy from a request; unspecified means `Delete`.
fn cleanup_policy(value: i32) -> Result<CleanupPolicy, ApiError> {
    match pb::CleanupPolicy::try_from(value) {
        Ok(pb::CleanupPolicy::Unspecified | pb::CleanupPolicy::Delete) => Ok(CleanupPolicy::Delete),
        Ok(pb::CleanupPolicy::Compact) => Ok(CleanupPolicy::Compact),
        Ok(pb::CleanupPolicy::DeleteOrCompact) => Ok(CleanupPolicy::DeleteOrCompact),
        Err(_) => Err(ApiError::invalid(format!(
            "unknown cleanup policy {value}; use DELETE, COMPACT or DELETE_OR_COMPACT"
        ))),
    }
}

/// The settings a create request asks for (defaults where it leaves them 0); capture, if
/// asked for, is enabled at `now_ms` and named after `cluster_id` unless the request names a
/// namespace.
pub fn hub_settings(
    req: &pb::CreateEventHubRequest,
    now_ms: i64,
    cluster_id: &str,
) -> Result<HubSettings, ApiError> {
    let defaults = HubSettings::default();
    Ok(HubSettings {
        cleanup_policy: cleanup_policy(req.cleanup_policy)?,
        tombstone_retention_ms: match req.tombstone_retention_ms {
            0 => defaults.tombstone_retention_ms,
            ms => ms,
        },
        compaction_lag_ms: req.compaction_lag_ms,
        retention_bytes_max: req.retention_bytes_max,
        capture: req
            .capture
            .as_ref()
            .map(|capture| capture_settings(capture, now_ms, cluster_id))
            .transpose()?,
    })
}

/// The changes an update request asks for (capture as in [`hub_settings`]).
pub fn hub_update(
    req: &pb::UpdateEventHubRequest,
    now_ms: i64,
    cluster_id: &str,
) -> Result<HubUpdate, ApiError> {
    let capture = match (&req.capture, req.capture_off) {
        (Some(_), true) => {
            return Err(ApiError::invalid(
                "capture settings and capture_off were both given; give one: the settings \
                 enable capture, capture_off disables it",
            ));
        }
        (Some(capture), false) => Some(Some(capture_settings(capture, now_ms, cluster_id)?)),
        (None, true) => Some(None),
        (None, false) => None,
    };
    Ok(HubUpdate {
        capture,
        throughput_units: req.throughput_units,
        retention_ms: req.retention_ms,
        cleanup_policy: req.cleanup_policy.map(cleanup_policy).transpose()?,
        tombstone_retention_ms: req.tombstone_retention_ms,
        compaction_lag_ms: req.compaction_lag_ms,
        retention_bytes_max: req.retention_bytes_max,
    })
}

pub fn partition_properties(
    hub: &str,
    partition_id: &str,
    p: &Progress,
    capture: &CaptureProgress,
) -> pb::PartitionProperties {
    let empty = p.is_empty();
    pb::PartitionProperties {
        event_hub: hub.to_string(),
        partition_id: partition_id.to_string(),
        begin_sequence_number: p.begin_sequence,
        last_enqueued_sequence_number: if p.next_sequence == 0 {
            -1
        } else {
            p.next_sequence - 1
        },
        last_enqueued_offset: p.last_offset.to_string(),
        last_enqueued_time_ms: p.last_time_ms,
        is_empty: empty,
        capture_next_sequence_number: capture.next_sequence,
    }
}

pub fn event_record(
    event: pb::EventData,
    partition_key: Option<&str>,
) -> Result<EventRecord, ApiError> {
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
                return Err(ApiError::invalid(format!(
                    "property '{name}' has no value; set one of string, int64, double, bool, bytes or timestamp"
                )));
            }
        };
        properties.push((name, property));
    }
    Ok(EventRecord {
        partition_key: partition_key.map(str::to_string),
        properties,
        body: event.body,
    })
}

pub fn received_event(event: ReadEvent) -> pb::ReceivedEvent {
    let properties: HashMap<String, pb::PropertyValue> = event
        .record
        .properties
        .into_iter()
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
        body: event.record.body,
        properties,
        sequence_number: event.sequence,
        offset: event.offset.to_string(),
        enqueued_time_ms: event.enqueued_time_ms,
        partition_key: event.record.partition_key.unwrap_or_default(),
    }
}

pub fn position(position: Option<pb::EventPosition>) -> Result<Position, ApiError> {
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

/// A request's consumer group: empty means `$Default`.
pub fn consumer_group(name: &str) -> &str {
    if name.is_empty() {
        tributary_types::DEFAULT_CONSUMER_GROUP
    } else {
        name
    }
}
