//! The APIs and versions this server speaks, as ApiVersions tells clients (WIRE-PROTOCOLS C2:
//! every range below is inside what librdkafka, kafka-python and aiokafka speak and what
//! kafka-protocol codes).

use kafka_protocol::messages::ApiKey;
use kafka_protocol::messages::api_versions_response::{ApiVersion, ApiVersionsResponse};

/// (API, lowest version, highest version).
pub const SUPPORTED: &[(ApiKey, i16, i16)] = &[
    (ApiKey::Produce, 3, 9),
    // Fetch stops at 12: 13 and later name topics by id.
    (ApiKey::Fetch, 4, 12),
    (ApiKey::ListOffsets, 1, 7),
    (ApiKey::Metadata, 0, 12),
    // Version 0 is needed in the list (librdkafka keys its SASL support on it); after a v0
    // handshake the client's next frame is the bare SASL message.
    (ApiKey::SaslHandshake, 0, 1),
    (ApiKey::ApiVersions, 0, 3),
    (ApiKey::SaslAuthenticate, 0, 2),
    // Consumer groups, the classic protocol (FindCoordinator stops at 3: 4 batches keys;
    // JoinGroup at 7, LeaveGroup at 4, OffsetCommit and OffsetFetch at 8 as clients need).
    (ApiKey::FindCoordinator, 0, 3),
    (ApiKey::JoinGroup, 0, 7),
    (ApiKey::SyncGroup, 0, 5),
    (ApiKey::Heartbeat, 0, 4),
    (ApiKey::LeaveGroup, 0, 4),
    (ApiKey::OffsetCommit, 2, 8),
    (ApiKey::OffsetFetch, 1, 8),
    (ApiKey::ListGroups, 0, 4),
    (ApiKey::DescribeGroups, 0, 5),
    (ApiKey::DescribeConfigs, 1, 4),
    (ApiKey::CreateTopics, 2, 7),
    // Idempotent producers only: a transactional id is refused.
    (ApiKey::InitProducerId, 0, 4),
];

/// The versions of `key` served, if any.
pub fn versions(key: ApiKey) -> Option<(i16, i16)> {
    SUPPORTED
        .iter()
        .find(|(k, _, _)| *k == key)
        .map(|(_, min, max)| (*min, *max))
}

/// Whether `version` of `key` is served.
pub fn supported(key: ApiKey, version: i16) -> bool {
    versions(key).is_some_and(|(min, max)| (min..=max).contains(&version))
}

/// The ApiVersions answer: every API served, with `error_code` (35 UNSUPPORTED_VERSION
/// when the client asked in a version this server does not speak).
pub fn api_versions(error_code: i16) -> ApiVersionsResponse {
    let mut response = ApiVersionsResponse::default();
    response.error_code = error_code;
    response.api_keys = SUPPORTED
        .iter()
        .map(|(key, min, max)| {
            let mut api = ApiVersion::default();
            api.api_key = *key as i16;
            api.min_version = *min;
            api.max_version = *max;
            api
        })
        .collect();
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_advertised_range_is_one_kafka_protocol_codes() {
        for (key, min, max) in SUPPORTED {
            let valid = key.valid_versions();
            assert!(
                valid.min <= *min && *max <= valid.max,
                "{key:?} {min}..={max} outside {valid:?}"
            );
        }
        assert!(supported(ApiKey::Produce, 9));
        assert!(!supported(ApiKey::Produce, 2));
        assert!(supported(ApiKey::Fetch, 12));
        assert!(!supported(ApiKey::Fetch, 13));
        assert_eq!(api_versions(35).api_keys.len(), SUPPORTED.len());
    }
}
