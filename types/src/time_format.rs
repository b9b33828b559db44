//! RFC 3339 text for millisecond timestamps, as shown to people and accepted from them
//! (e.g. "read from 2026-11-22T01:02:03.456Z").
//!
//! Done by hand rather than with humantime: humantime cannot format times before 1970 and
//! its RFC 3339 parser does not accept offsets such as "+02:00", which people paste from
//! logs and other tools.

/// A timestamp that is not RFC 3339; says what was expected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "invalid time {text:?}: {reason}; write e.g. \"2026-11-22T01:02:03.456Z\" or \
     \"2026-11-22T03:02:03+02:00\""
)]
pub struct TimeParseError {
    pub text: String,
    pub reason: &'static str,
}

const MS_PER_DAY: i64 = 86_400_000;

/// A UTC date (proleptic Gregorian) and time of day, split into its fields, for formats
/// other than RFC 3339 (capture file names, the Event Hubs capture record).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UtcDateTime {
    pub year: i64,
    /// 1..=12.
    pub month: i64,
    /// 1..=31.
    pub day: i64,
    /// 0..=23.
    pub hour: i64,
    /// 0..=59.
    pub minute: i64,
    /// 0..=59.
    pub second: i64,
    /// 0..=999.
    pub millisecond: i64,
}

impl UtcDateTime {
    /// The UTC date and time of `ms` milliseconds since the Unix epoch (before it too).
    pub fn from_unix_ms(ms: i64) -> UtcDateTime {
        let (year, month, day) = civil_from_days(ms.div_euclid(MS_PER_DAY));
        let ms_of_day = ms.rem_euclid(MS_PER_DAY);
        UtcDateTime {
            year,
            month,
            day,
            hour: ms_of_day / 3_600_000,
            minute: ms_of_day / 60_000 % 60,
            second: ms_of_day / 1000 % 60,
            millisecond: ms_of_day % 1000,
        }
    }
}

/// Formats milliseconds since the Unix epoch as UTC, e.g. "2026-11-22T01:02:03.456Z".
///
/// Always prints the milliseconds, so the text sorts like the time. Years outside
/// 0000..=9999 print with more digits or a sign, which is no longer RFC 3339.
pub fn format_rfc3339_ms(ms: i64) -> String {
    let UtcDateTime {
        year,
        month,
        day,
        hour,
        minute,
        second,
        millisecond,
    } = UtcDateTime::from_unix_ms(ms);
    format!("{year:04}-{month:02}-{day:02}T{hour:02}:{minute:02}:{second:02}.{millisecond:03}Z")
}

/// Parses an RFC 3339 timestamp into milliseconds since the Unix epoch.
///
/// Accepts 'T', 't' or a space between date and time, any number of fractional-second
/// digits (those below a millisecond are dropped, i.e. rounded down), and 'Z', 'z' or a
/// `±HH:MM` offset. A leap second (":60") counts as the first instant of the next minute,
/// as Unix time has no leap seconds.
pub fn parse_rfc3339_ms(text: &str) -> Result<i64, TimeParseError> {
    parse(text.as_bytes()).map_err(|reason| TimeParseError {
        text: text.to_owned(),
        reason,
    })
}

fn parse(b: &[u8]) -> Result<i64, &'static str> {
    let date = (|| {
        let year = digits(b, 0, 4)?;
        let month = separated_digits(b, b'-', 4, 2)?;
        let day = separated_digits(b, b'-', 7, 2)?;
        Some((year, month, day))
    })();
    let (year, month, day) = date.ok_or("expected the date as YYYY-MM-DD")?;
    if !matches!(b.get(10), Some(b'T' | b't' | b' ')) {
        return Err("expected 'T' between the date and the time");
    }
    let time = (|| {
        let hour = digits(b, 11, 2)?;
        let minute = separated_digits(b, b':', 13, 2)?;
        let second = separated_digits(b, b':', 16, 2)?;
        Some((hour, minute, second))
    })();
    let (hour, minute, second) = time.ok_or("expected the time as HH:MM:SS")?;

    let mut at = 19;
    let mut milli = 0;
    if b.get(at) == Some(&b'.') {
        let fraction_len = b[at + 1..]
            .iter()
            .take_while(|c| c.is_ascii_digit())
            .count();
        if fraction_len == 0 {
            return Err("expected digits after the '.' of the seconds");
        }
        // Pad or cut the fraction to exactly three digits: ".5" is 500 ms, ".1239" 123 ms.
        milli = b[at + 1..at + 1 + fraction_len]
            .iter()
            .chain(std::iter::repeat(&b'0'))
            .take(3)
            .fold(0, |acc, &c| acc * 10 + i64::from(c - b'0'));
        at += 1 + fraction_len;
    }

    let offset_minutes = match &b[at..] {
        [b'Z' | b'z'] => 0,
        [sign @ (b'+' | b'-'), ..] if b.len() == at + 6 && b[at + 3] == b':' => {
            let (Some(hours), Some(minutes)) = (digits(b, at + 1, 2), digits(b, at + 4, 2)) else {
                return Err("expected the offset as +HH:MM or -HH:MM");
            };
            if hours > 23 || minutes > 59 {
                return Err("the offset must be within -23:59..=+23:59");
            }
            let minutes = hours * 60 + minutes;
            if *sign == b'-' { -minutes } else { minutes }
        }
        _ => return Err("expected 'Z' or an offset like +02:00 at the end"),
    };

    if !(1..=12).contains(&month) {
        return Err("the month must be 01-12");
    }
    if day < 1 || day > days_in_month(year, month) {
        return Err("that day does not exist in that month");
    }
    if hour > 23 || minute > 59 || second > 60 {
        return Err("the time must be within 00:00:00-23:59:60");
    }
    let seconds = ((days_from_civil(year, month, day) * 24 + hour) * 60 + minute - offset_minutes)
        * 60
        + second;
    Ok(seconds * 1000 + milli)
}

/// The `len` ASCII digits at `at` as a number, or `None` if any is missing or not a digit.
fn digits(b: &[u8], at: usize, len: usize) -> Option<i64> {
    let field = b.get(at..at + len)?;
    field.iter().try_fold(0, |acc, &c| {
        c.is_ascii_digit().then(|| acc * 10 + i64::from(c - b'0'))
    })
}

/// `sep` at `at`, then `len` digits, as a number.
fn separated_digits(b: &[u8], sep: u8, at: usize, len: usize) -> Option<i64> {
    if b.get(at) == Some(&sep) {
        digits(b, at + 1, len)
    } else {
        None
    }
}

fn days_in_month(year: i64, month: i64) -> i64 {
    match month {
        2 if year % 4 == 0 && (year % 100 != 0 || year % 400 == 0) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's
/// `days_from_civil`, valid for all years).
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let year = if month <= 2 { year - 1 } else { year };
    let era = year.div_euclid(400);
    let year_of_era = year.rem_euclid(400);
    let day_of_year = (153 * (month + if month > 2 { -3 } else { 9 }) + 2) / 5 + day - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    era * 146_097 + day_of_era - 719_468
}

/// The inverse of [`days_from_civil`]: (year, month, day) of a day count since 1970-01-01.
fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let days = days + 719_468;
    let era = days.div_euclid(146_097);
    let day_of_era = days.rem_euclid(146_097);
    let year_of_era =
        (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let shifted_month = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * shifted_month + 2) / 5 + 1;
    let month = if shifted_month < 10 {
        shifted_month + 3
    } else {
        shifted_month - 9
    };
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// 2026-11-22T01:02:03.456Z, checked with `date -u -d @1795309323`.
    const EXAMPLE_MS: i64 = 1_795_309_323_456;

    #[test]
    fn formats_utc_with_milliseconds() {
        assert_eq!(format_rfc3339_ms(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(format_rfc3339_ms(EXAMPLE_MS), "2026-11-22T01:02:03.456Z");
        assert_eq!(
            format_rfc3339_ms(951_782_400_000),
            "2000-02-29T00:00:00.000Z"
        );
        assert_eq!(format_rfc3339_ms(-1), "1969-12-31T23:59:59.999Z");
    }

    #[test]
    fn splits_into_utc_fields() {
        assert_eq!(
            UtcDateTime::from_unix_ms(EXAMPLE_MS),
            UtcDateTime {
                year: 2026,
                month: 11,
                day: 22,
                hour: 1,
                minute: 2,
                second: 3,
                millisecond: 456,
            }
        );
        let before_epoch = UtcDateTime::from_unix_ms(-1);
        assert_eq!(
            (before_epoch.year, before_epoch.month, before_epoch.day),
            (1969, 12, 31)
        );
        assert_eq!(
            (
                before_epoch.hour,
                before_epoch.second,
                before_epoch.millisecond
            ),
            (23, 59, 999)
        );
    }

    #[test]
    fn parses_z_and_offsets() {
        assert_eq!(parse_rfc3339_ms("2026-11-22T01:02:03.456Z"), Ok(EXAMPLE_MS));
        assert_eq!(
            parse_rfc3339_ms("2026-11-22T03:02:03.456+02:00"),
            Ok(EXAMPLE_MS)
        );
        assert_eq!(
            parse_rfc3339_ms("2026-11-21T20:32:03.456-04:30"),
            Ok(EXAMPLE_MS)
        );
        assert_eq!(parse_rfc3339_ms("2026-11-22t01:02:03.456z"), Ok(EXAMPLE_MS));
        assert_eq!(
            parse_rfc3339_ms("2026-11-22 01:02:03.456-00:00"),
            Ok(EXAMPLE_MS)
        );
        // An offset can move the date across midnight and a year boundary.
        assert_eq!(parse_rfc3339_ms("1970-01-01T01:00:00+01:00"), Ok(0));
        assert_eq!(parse_rfc3339_ms("1969-12-31T23:00:00-01:00"), Ok(0));
    }

    #[test]
    fn fraction_is_padded_or_cut_to_milliseconds() {
        let second_ms = EXAMPLE_MS - 456;
        assert_eq!(parse_rfc3339_ms("2026-11-22T01:02:03Z"), Ok(second_ms));
        assert_eq!(
            parse_rfc3339_ms("2026-11-22T01:02:03.4Z"),
            Ok(second_ms + 400)
        );
        assert_eq!(
            parse_rfc3339_ms("2026-11-22T01:02:03.45Z"),
            Ok(second_ms + 450)
        );
        assert_eq!(
            parse_rfc3339_ms("2026-11-22T01:02:03.456999999Z"),
            Ok(EXAMPLE_MS)
        );
        assert_eq!(parse_rfc3339_ms("1969-12-31T23:59:59.9999Z"), Ok(-1));
    }

    #[test]
    fn leap_second_is_the_next_minute() {
        assert_eq!(
            parse_rfc3339_ms("2016-12-31T23:59:60Z"),
            parse_rfc3339_ms("2017-01-01T00:00:00Z")
        );
    }

    #[test]
    fn refuses_malformed_text_saying_why() {
        let cases = [
            ("", "expected the date as YYYY-MM-DD"),
            ("2026/11/22T01:02:03Z", "expected the date as YYYY-MM-DD"),
            ("2026-11-22", "expected 'T' between the date and the time"),
            ("2026-11-22T1:02:03Z", "expected the time as HH:MM:SS"),
            (
                "2026-11-22T01:02:03",
                "expected 'Z' or an offset like +02:00 at the end",
            ),
            (
                "2026-11-22T01:02:03+0200",
                "expected 'Z' or an offset like +02:00 at the end",
            ),
            (
                "2026-11-22T01:02:03Zjunk",
                "expected 'Z' or an offset like +02:00 at the end",
            ),
            (
                "2026-11-22T01:02:03.Z",
                "expected digits after the '.' of the seconds",
            ),
            (
                "2026-11-22T01:02:03+2x:00",
                "expected the offset as +HH:MM or -HH:MM",
            ),
            (
                "2026-11-22T01:02:03+24:00",
                "the offset must be within -23:59..=+23:59",
            ),
            ("2026-13-22T01:02:03Z", "the month must be 01-12"),
            (
                "2025-02-29T01:02:03Z",
                "that day does not exist in that month",
            ),
            (
                "2026-04-31T01:02:03Z",
                "that day does not exist in that month",
            ),
            (
                "2026-11-22T24:00:00Z",
                "the time must be within 00:00:00-23:59:60",
            ),
            ("２026-11-22T01:02:03Z", "expected the date as YYYY-MM-DD"),
        ];
        for (text, reason) in cases {
            let err = parse_rfc3339_ms(text).unwrap_err();
            assert_eq!(err.reason, reason, "{text:?}");
            assert!(err.to_string().contains(&format!("{text:?}")));
        }
        assert_eq!(
            parse_rfc3339_ms("2024-02-29T00:00:00Z"),
            Ok(1_709_164_800_000)
        );
    }

    proptest! {
        #[test]
        fn round_trips(ms in -62_167_219_200_000_i64..253_402_300_800_000) {
            // Years 0000..=9999: the range RFC 3339 can write.
            let text = format_rfc3339_ms(ms);
            prop_assert_eq!(parse_rfc3339_ms(&text), Ok(ms), "{}", text);
        }

        #[test]
        fn civil_days_round_trip(days in -1_000_000_000_i64..1_000_000_000) {
            let (year, month, day) = civil_from_days(days);
            prop_assert_eq!(days_from_civil(year, month, day), days);
        }
    }
}
