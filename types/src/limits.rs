//! Event Hubs' limits (SPEC.md section 1) as named constants.
//!
//! Where Event Hubs' limit depends on the tier, Tributary makes it configurable; the
//! `_DEFAULT` constants are the defaults of that setting (the largest tier's value, so
//! that workloads moving from Event Hubs are not refused), the others are fixed.

use std::time::Duration;

/// Default cap on partitions per hub: the Dedicated tier's limit.
pub const PARTITIONS_PER_HUB_MAX_DEFAULT: u16 = 1024;

/// Default cap on one publication (a single event or a whole batch): Standard and above.
pub const PUBLISH_BYTES_MAX_DEFAULT: usize = 1024 * 1024;

/// Non-epoch readers allowed per (consumer group, partition); the 6th is refused, as in all
/// Event Hubs tiers, and clients rely on that error text.
pub const READERS_PER_PARTITION_MAX: usize = 5;

/// Most events one receive call may return, bounding the memory one reply can pin.
pub const RECEIVE_BATCH_EVENTS_MAX: u32 = 1000;

/// Events per receive call when the client does not say: the SDKs' default prefetch.
pub const RECEIVE_BATCH_EVENTS_DEFAULT: u32 = 300;

/// Body bytes one receive reply carries at most: a reply ends with the event that reaches
/// it (so one event always fits), however many events the reader asked for. Without it,
/// 300 events of 64 KiB made a 19 MB reply, over gRPC's usual 4 MiB message limit.
pub const RECEIVE_BATCH_BYTES_MAX: usize = 1024 * 1024;

/// Largest publication a node may be configured to accept (`--publish-bytes-max`).
pub const PUBLISH_BYTES_MAX_LIMIT: usize = 64 * 1024 * 1024;

/// Shortest retention a hub may have.
pub const RETENTION_MIN: Duration = Duration::from_secs(60 * 60);

/// Longest retention a hub may have: Premium/Dedicated's 90 days.
pub const RETENTION_MAX: Duration = Duration::from_secs(90 * 24 * 60 * 60);

/// Retention of a hub created without one.
pub const RETENTION_DEFAULT: Duration = Duration::from_secs(24 * 60 * 60);

/// Consumer groups per hub, `$Default` included: the Dedicated tier's limit.
pub const CONSUMER_GROUPS_PER_HUB_MAX: usize = 1000;

/// Longest event hub name.
pub const HUB_NAME_CHARS_MAX: usize = 256;

/// Longest consumer group name (the AMQP limit; Kafka allows 256, but a group must be usable
/// from every front end).
pub const CONSUMER_GROUP_NAME_CHARS_MAX: usize = 50;

/// Longest shared access signature token accepted, in bytes; longer text is refused before
/// it is parsed. Event Hubs' own tokens are a few hundred bytes.
pub const SAS_TOKEN_BYTES_MAX: usize = 4096;

/// Longest connection string accepted, in bytes.
pub const CONNECTION_STRING_BYTES_MAX: usize = 4096;

/// [`RETENTION_MIN`]..=[`RETENTION_MAX`] as people write it (humantime would print 90 days
/// as "2months 29days 2h 52m 48s"); a test keeps it in step with the constants.
const RETENTION_RANGE_TEXT: &str = "1h and 90d";

/// Why a retention setting was refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum RetentionError {
    #[error(
        "retention {text:?} is not a duration ({source}); write e.g. \"24h\", \"7d\" or \"1h 30m\""
    )]
    Syntax {
        text: String,
        source: humantime::DurationError,
    },
    #[error("retention {text:?} is out of range: it must be between {RETENTION_RANGE_TEXT}")]
    OutOfRange { text: String },
}

/// Parses a retention such as "24h", "7d", "90days" or "1h 30m" and checks it lies within
/// [`RETENTION_MIN`]..=[`RETENTION_MAX`].
pub fn parse_retention(text: &str) -> Result<Duration, RetentionError> {
    let retention =
        humantime::parse_duration(text.trim()).map_err(|source| RetentionError::Syntax {
            text: text.to_owned(),
            source,
        })?;
    if !(RETENTION_MIN..=RETENTION_MAX).contains(&retention) {
        return Err(RetentionError::OutOfRange {
            text: text.to_owned(),
        });
    }
    Ok(retention)
}

#[cfg(test)]
mod tests {
    use super::*;

    const HOUR: Duration = Duration::from_secs(3600);

    #[test]
    fn accepts_humantime_forms() {
        assert_eq!(parse_retention("24h"), Ok(24 * HOUR));
        assert_eq!(parse_retention("7d"), Ok(7 * 24 * HOUR));
        assert_eq!(parse_retention("90days"), Ok(RETENTION_MAX));
        assert_eq!(parse_retention(" 1h 30m "), Ok(HOUR + HOUR / 2));
        assert_eq!(parse_retention("1h"), Ok(RETENTION_MIN));
    }

    #[test]
    fn refuses_out_of_range_naming_the_range() {
        for text in ["59m", "90d 1s", "1year"] {
            let err = parse_retention(text).unwrap_err();
            assert!(matches!(err, RetentionError::OutOfRange { .. }), "{text}");
            let message = err.to_string();
            assert!(message.contains("between 1h and 90d"), "{message}");
        }
    }

    #[test]
    fn refuses_garbage_with_an_example() {
        let err = parse_retention("forever").unwrap_err();
        assert!(matches!(err, RetentionError::Syntax { .. }));
        assert!(err.to_string().contains("\"forever\""));
        assert!(parse_retention("").is_err());
        assert!(parse_retention("24").is_err());
    }

    #[test]
    fn range_text_matches_the_constants() {
        let (min, max) = RETENTION_RANGE_TEXT.split_once(" and ").unwrap();
        assert_eq!(humantime::parse_duration(min), Ok(RETENTION_MIN));
        assert_eq!(humantime::parse_duration(max), Ok(RETENTION_MAX));
    }

    #[test]
    fn default_is_within_range() {
        assert!((RETENTION_MIN..=RETENTION_MAX).contains(&RETENTION_DEFAULT));
    }
}
