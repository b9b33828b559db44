//! Where a capture file goes inside its destination.

use tributary_types::UtcDateTime;

/// The path of the capture file of the window starting at `window_start_ms` (milliseconds
/// since the Unix epoch): `{namespace}/{hub}/{partition}/{YYYY}/{MM}/{DD}/{hh}/{mm}/{ss}.avro`,
/// the window's start in UTC with every field zero-padded, as Event Hubs Capture names
/// its blobs. Milliseconds are dropped, so two windows must start in different seconds.
pub fn file_path(namespace: &str, hub: &str, partition: &str, window_start_ms: i64) -> String {
    let UtcDateTime {
        year,
        month,
        day,
        hour,
        minute,
        second,
        ..
    } = UtcDateTime::from_unix_ms(window_start_ms);
    format!(
        "{namespace}/{hub}/{partition}/{year:04}/{month:02}/{day:02}/{hour:02}/{minute:02}/{second:02}.avro"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_pads_every_field_in_utc() {
        // 2019-01-02T03:04:05.678Z
        assert_eq!(
            file_path("ns", "hub", "0", 1_546_398_245_678),
            "ns/hub/0/2019/01/02/03/04/05.avro"
        );
        assert_eq!(
            file_path("ns", "hub", "31", 0),
            "ns/hub/31/1970/01/01/00/00/00.avro"
        );
    }

    #[test]
    fn late_in_the_day_and_year() {
        // 2026-12-31T23:59:59.999Z
        assert_eq!(
            file_path("contoso", "telemetry", "7", 1_798_761_599_999),
            "contoso/telemetry/7/2026/12/31/23/59/59.avro"
        );
    }

    #[test]
    fn paths_sort_like_their_windows() {
        let starts = [1_546_398_245_000_i64, 1_546_398_246_000, 1_546_484_645_000];
        let paths: Vec<String> = starts
            .iter()
            .map(|&start| file_path("ns", "hub", "0", start))
            .collect();
        let mut sorted = paths.clone();
        sorted.sort();
        assert_eq!(paths, sorted);
    }
}
