//! Where a consumer starts reading a partition.

use std::fmt;
use std::str::FromStr;
use std::time::UNIX_EPOCH;

use tributary_proto::v1 as proto;
use tributary_proto::v1::event_position::Kind;

/// The starting position of a read. `inclusive` says whether the event at exactly that
/// position is delivered too. Positions older than the retained range start at the first
/// retained event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventPosition {
    /// The first retained event.
    Earliest,
    /// Only events enqueued after the read starts.
    Latest,
    Offset {
        offset: i64,
        inclusive: bool,
    },
    SequenceNumber {
        sequence_number: i64,
        inclusive: bool,
    },
    /// Milliseconds since the Unix epoch, UTC.
    EnqueuedTime {
        time_ms: i64,
        inclusive: bool,
    },
}

/// Why a position given as text (`--from`) could not be understood.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid position '{input}': {problem}")]
pub struct ParsePositionError {
    input: String,
    problem: String,
}

const POSITION_FORMS: &str = "expected earliest, latest, offset:N, seq:N or time:RFC3339 \
     (e.g. time:2024-05-01T12:00:00Z)";

impl FromStr for EventPosition {
    type Err = ParsePositionError;

    /// Parses the CLI forms: `earliest`, `latest`, `offset:N` and `seq:N` (both start AT N,
    /// inclusive) and `time:RFC3339` (events enqueued after that time, exclusive).
    fn from_str(input: &str) -> Result<Self, Self::Err> {
        let error = |problem: String| ParsePositionError {
            input: input.to_owned(),
            problem,
        };
        let text = input.trim();
        match text {
            "earliest" => return Ok(EventPosition::Earliest),
            "latest" => return Ok(EventPosition::Latest),
            _ => {}
        }
        let Some((kind, value)) = text.split_once(':') else {
            return Err(error(POSITION_FORMS.to_owned()));
        };
        match kind {
            "offset" => Ok(EventPosition::Offset {
                offset: parse_non_negative(value, "offset").map_err(error)?,
                inclusive: true,
            }),
            "seq" => Ok(EventPosition::SequenceNumber {
                sequence_number: parse_non_negative(value, "sequence number").map_err(error)?,
                inclusive: true,
            }),
            "time" => Ok(EventPosition::EnqueuedTime {
                time_ms: parse_time_ms(value).map_err(error)?,
                inclusive: false,
            }),
            _ => Err(error(format!("unknown kind '{kind}'; {POSITION_FORMS}"))),
        }
    }
}

fn parse_non_negative(value: &str, what: &str) -> Result<i64, String> {
    match value.parse::<i64>() {
        Ok(n) if n >= 0 => Ok(n),
        Ok(_) => Err(format!("the {what} must not be negative")),
        Err(_) => Err(format!("the {what} must be a whole number, got '{value}'")),
    }
}

fn parse_time_ms(value: &str) -> Result<i64, String> {
    let time = humantime::parse_rfc3339_weak(value).map_err(|e| {
        format!("'{value}' is not an RFC 3339 time such as 2024-05-01T12:00:00Z ({e})")
    })?;
    let since_epoch = time
        .duration_since(UNIX_EPOCH)
        .map_err(|_| "the time must not be before 1970-01-01".to_owned())?;
    i64::try_from(since_epoch.as_millis()).map_err(|_| "the time is too far in the future".into())
}

impl fmt::Display for EventPosition {
    /// The CLI form where there is one; other positions are shown with an explicit
    /// comparison, e.g. `seq>5`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (kind, value, inclusive) = match *self {
            EventPosition::Earliest => return f.write_str("earliest"),
            EventPosition::Latest => return f.write_str("latest"),
            EventPosition::Offset { offset, inclusive } => {
                ("offset", offset.to_string(), inclusive)
            }
            EventPosition::SequenceNumber {
                sequence_number,
                inclusive,
            } => ("seq", sequence_number.to_string(), inclusive),
            EventPosition::EnqueuedTime { time_ms, inclusive } => {
                let text =
                    crate::time::rfc3339_millis(time_ms).unwrap_or_else(|| format!("{time_ms}ms"));
                ("time", text, inclusive)
            }
        };
        let matches_cli_form = inclusive != (kind == "time");
        if matches_cli_form {
            write!(f, "{kind}:{value}")
        } else if inclusive {
            write!(f, "{kind}>={value}")
        } else {
            write!(f, "{kind}>{value}")
        }
    }
}

impl From<EventPosition> for proto::EventPosition {
    fn from(position: EventPosition) -> Self {
        let (kind, inclusive) = match position {
            EventPosition::Earliest => (Kind::Earliest(proto::Earliest {}), false),
            EventPosition::Latest => (Kind::Latest(proto::Latest {}), false),
            EventPosition::Offset { offset, inclusive } => (Kind::Offset(offset), inclusive),
            EventPosition::SequenceNumber {
                sequence_number,
                inclusive,
            } => (Kind::SequenceNumber(sequence_number), inclusive),
            EventPosition::EnqueuedTime { time_ms, inclusive } => {
                (Kind::EnqueuedTimeMs(time_ms), inclusive)
            }
        };
        proto::EventPosition {
            kind: Some(kind),
            inclusive,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<EventPosition, String> {
        text.parse::<EventPosition>().map_err(|e| e.to_string())
    }

    #[test]
    fn parses_every_cli_form() {
        assert_eq!(parse("earliest"), Ok(EventPosition::Earliest));
        assert_eq!(parse(" latest "), Ok(EventPosition::Latest));
        assert_eq!(
            parse("offset:4096"),
            Ok(EventPosition::Offset {
                offset: 4096,
                inclusive: true
            })
        );
        assert_eq!(
            parse("seq:0"),
            Ok(EventPosition::SequenceNumber {
                sequence_number: 0,
                inclusive: true
            })
        );
        assert_eq!(
            parse("time:2024-05-01T12:00:00Z"),
            Ok(EventPosition::EnqueuedTime {
                time_ms: 1_714_564_800_000,
                inclusive: false
            })
        );
        assert_eq!(
            parse("time:2024-05-01T12:00:00.250Z"),
            Ok(EventPosition::EnqueuedTime {
                time_ms: 1_714_564_800_250,
                inclusive: false
            })
        );
    }

    #[test]
    fn rejects_bad_input_with_a_clear_message() {
        let unknown = parse("beginning").unwrap_err();
        assert!(unknown.contains("'beginning'"), "{unknown}");
        assert!(unknown.contains("expected earliest, latest"), "{unknown}");

        let kind = parse("sequence:5").unwrap_err();
        assert!(kind.contains("unknown kind 'sequence'"), "{kind}");

        let not_number = parse("seq:abc").unwrap_err();
        assert_eq!(
            not_number,
            "invalid position 'seq:abc': the sequence number must be a whole number, got 'abc'"
        );
        let negative = parse("offset:-1").unwrap_err();
        assert_eq!(
            negative,
            "invalid position 'offset:-1': the offset must not be negative"
        );
        let empty = parse("seq:").unwrap_err();
        assert!(empty.contains("whole number"), "{empty}");

        let time = parse("time:yesterday").unwrap_err();
        assert!(time.contains("not an RFC 3339 time"), "{time}");
        assert!(parse("").is_err());
    }

    #[test]
    fn converts_to_proto() {
        let wire = proto::EventPosition::from(EventPosition::SequenceNumber {
            sequence_number: 9,
            inclusive: true,
        });
        assert_eq!(wire.kind, Some(Kind::SequenceNumber(9)));
        assert!(wire.inclusive);
        let wire = proto::EventPosition::from(EventPosition::Earliest);
        assert_eq!(wire.kind, Some(Kind::Earliest(proto::Earliest {})));
        let wire = proto::EventPosition::from(EventPosition::EnqueuedTime {
            time_ms: 5,
            inclusive: false,
        });
        assert_eq!(wire.kind, Some(Kind::EnqueuedTimeMs(5)));
        assert!(!wire.inclusive);
    }

    #[test]
    fn display_round_trips_cli_forms() {
        for text in [
            "earliest",
            "latest",
            "offset:12",
            "seq:3",
            "time:2024-05-01T12:00:00.000Z",
        ] {
            assert_eq!(parse(text).unwrap().to_string(), text);
        }
        let exclusive = EventPosition::SequenceNumber {
            sequence_number: 3,
            inclusive: false,
        };
        assert_eq!(exclusive.to_string(), "seq>3");
    }
}
