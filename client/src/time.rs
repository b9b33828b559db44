//! Showing event times (milliseconds since the Unix epoch) as RFC 3339 text.

use std::time::{Duration, UNIX_EPOCH};

/// The first second humantime cannot format (year 10000).
const FORMATTABLE_SECONDS_MAX: u64 = 253_402_300_800;

/// `2024-05-01T12:00:00.250Z`, or `None` for times before 1970 or after year 9999.
/// This machine's time in milliseconds since the Unix epoch.
pub(crate) fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// `time_ms` (milliseconds since the Unix epoch) as RFC 3339 UTC with milliseconds, as the
/// CLI prints times; `None` before the epoch or past year 9999.
pub fn rfc3339_millis(time_ms: i64) -> Option<String> {
    let time_ms = u64::try_from(time_ms).ok()?;
    let since_epoch = Duration::from_millis(time_ms);
    if since_epoch.as_secs() >= FORMATTABLE_SECONDS_MAX {
        return None;
    }
    Some(humantime::format_rfc3339_millis(UNIX_EPOCH + since_epoch).to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_in_range_times_and_refuses_others() {
        assert_eq!(
            rfc3339_millis(1_714_564_800_250).as_deref(),
            Some("2024-05-01T12:00:00.250Z")
        );
        assert_eq!(
            rfc3339_millis(0).as_deref(),
            Some("1970-01-01T00:00:00.000Z")
        );
        assert_eq!(rfc3339_millis(-1), None);
        assert_eq!(rfc3339_millis(i64::MAX), None);
    }
}
