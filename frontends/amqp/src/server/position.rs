//! Where a receiver starts (WIRE-PROTOCOLS A9, SPEC §3): the selector filter's expression,
//! parsed into a [`StartPosition`]. Pure.
//!
//! ```text
//! expr  := field WS op WS value
//! field := amqp.annotation.x-opt-offset | …x-opt-sequence-number | …x-opt-enqueued-time
//! op    := ">" | ">="
//! value := "'" token "'" | token          token := "-1" | "@latest" | -?[0-9]+
//! ```
//! Fields and `@latest` are matched case-insensitively, and white space around the operator
//! is optional.

use tributary_types::{Offset, SequenceNumber};

/// The first event a receiver gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StartPosition {
    /// `-1` (under any field): the first retained event.
    Earliest,
    /// `@latest`, or no filter at all: only events enqueued after the attach.
    Latest,
    /// The first event after `offset`, or at it when `inclusive` (`>=`).
    Offset { offset: Offset, inclusive: bool },
    /// The first event after `sequence_number`, or at it when `inclusive`. One past the
    /// end is refused by the backend with `ArgumentOutOfRange`.
    SequenceNumber {
        sequence_number: SequenceNumber,
        inclusive: bool,
    },
    /// The first event enqueued after `unix_ms`, or at it when `inclusive`.
    EnqueuedTime { unix_ms: i64, inclusive: bool },
}

/// A selector the grammar does not accept; the link is refused with
/// `com.microsoft:argument-error`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the selector filter {expression:?} {problem}")]
pub struct InvalidFilter {
    pub expression: String,
    pub problem: &'static str,
}

const OFFSET_FIELD: &str = "amqp.annotation.x-opt-offset";
const SEQUENCE_NUMBER_FIELD: &str = "amqp.annotation.x-opt-sequence-number";
const ENQUEUED_TIME_FIELD: &str = "amqp.annotation.x-opt-enqueued-time";

/// Parses a selector filter expression.
pub fn parse_selector(expression: &str) -> Result<StartPosition, InvalidFilter> {
    let error = |problem| InvalidFilter {
        expression: expression.to_owned(),
        problem,
    };
    let Some((field, rest)) = expression.split_once('>') else {
        return Err(error("has no '>' or '>=' operator"));
    };
    let (inclusive, value) = match rest.strip_prefix('=') {
        Some(value) => (true, value),
        None => (false, rest),
    };
    let field = field.trim();
    let value = value.trim();
    let token = value
        .strip_prefix('\'')
        .and_then(|v| v.strip_suffix('\''))
        .unwrap_or(value);
    let is = |name: &str| field.eq_ignore_ascii_case(name);
    if !(is(OFFSET_FIELD) || is(SEQUENCE_NUMBER_FIELD) || is(ENQUEUED_TIME_FIELD)) {
        return Err(error(
            "names none of amqp.annotation.x-opt-offset, x-opt-sequence-number and \
             x-opt-enqueued-time",
        ));
    }
    if token.eq_ignore_ascii_case("@latest") {
        return Ok(StartPosition::Latest);
    }
    let number: i64 = token
        .parse()
        .map_err(|_| error("has a value that is none of -1, @latest and an integer"))?;
    if number == -1 {
        return Ok(StartPosition::Earliest);
    }
    Ok(if is(OFFSET_FIELD) {
        StartPosition::Offset {
            offset: Offset(number),
            inclusive,
        }
    } else if is(SEQUENCE_NUMBER_FIELD) {
        StartPosition::SequenceNumber {
            sequence_number: SequenceNumber(number),
            inclusive,
        }
    } else {
        StartPosition::EnqueuedTime {
            unix_ms: number,
            inclusive,
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_client_spelling_parses() {
        let offset = |offset, inclusive| StartPosition::Offset {
            offset: Offset(offset),
            inclusive,
        };
        let cases = [
            // Python and JS quote, .NET and the Rust ports do not.
            (
                "amqp.annotation.x-opt-offset > '-1'",
                StartPosition::Earliest,
            ),
            ("amqp.annotation.x-opt-offset > -1", StartPosition::Earliest),
            (
                "amqp.annotation.x-opt-offset >= '-1'",
                StartPosition::Earliest,
            ),
            (
                "amqp.annotation.x-opt-offset > '@latest'",
                StartPosition::Latest,
            ),
            (
                "AMQP.Annotation.X-Opt-Offset > @LATEST",
                StartPosition::Latest,
            ),
            ("amqp.annotation.x-opt-offset > '4096'", offset(4096, false)),
            ("amqp.annotation.x-opt-offset >= '4096'", offset(4096, true)),
            ("amqp.annotation.x-opt-offset>=4096", offset(4096, true)),
            ("  amqp.annotation.x-opt-offset  >  0  ", offset(0, false)),
            (
                "amqp.annotation.x-opt-sequence-number > '41'",
                StartPosition::SequenceNumber {
                    sequence_number: SequenceNumber(41),
                    inclusive: false,
                },
            ),
            (
                "amqp.annotation.x-opt-sequence-number >= 41",
                StartPosition::SequenceNumber {
                    sequence_number: SequenceNumber(41),
                    inclusive: true,
                },
            ),
            (
                "amqp.annotation.x-opt-sequence-number > '-1'",
                StartPosition::Earliest,
            ),
            (
                "amqp.annotation.x-opt-enqueued-time > '1767225600000'",
                StartPosition::EnqueuedTime {
                    unix_ms: 1_767_225_600_000,
                    inclusive: false,
                },
            ),
            (
                "amqp.annotation.x-opt-enqueued-time >= 1767225600000",
                StartPosition::EnqueuedTime {
                    unix_ms: 1_767_225_600_000,
                    inclusive: true,
                },
            ),
        ];
        for (expression, expected) in cases {
            assert_eq!(parse_selector(expression), Ok(expected), "{expression}");
        }
    }

    #[test]
    fn malformed_selectors_say_what_is_wrong() {
        for expression in [
            "",
            "amqp.annotation.x-opt-offset = '1'",
            "amqp.annotation.x-opt-offset < '1'",
            "amqp.annotation.x-opt-partition-key > 'a'",
            "amqp.annotation.x-opt-offset > 'abc'",
            "amqp.annotation.x-opt-offset > '1.5'",
            "amqp.annotation.x-opt-offset > ''",
            "amqp.annotation.x-opt-offset > '99999999999999999999'",
        ] {
            let error = parse_selector(expression).unwrap_err();
            assert_eq!(error.expression, expression);
        }
    }
}
