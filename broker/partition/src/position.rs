//! Resolving a reader's start position to a sequence number, with Event Hubs' rules for
//! out-of-range values (SPEC.md section 3). Pure: index look-ups come through [`Lookup`].

use super::state_machine::Progress;

/// Where a reader starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Position {
    Earliest,
    Latest,
    Offset { offset: i64, inclusive: bool },
    Sequence { sequence: i64, inclusive: bool },
    EnqueuedTime { time_ms: i64, inclusive: bool },
}

/// Index queries position resolution needs.
pub trait Lookup {
    /// Sequence number of the first event at or after `offset` (after it when not inclusive),
    /// or `None` when no committed event is there.
    fn sequence_at_offset(&self, offset: i64, inclusive: bool) -> Result<Option<i64>, String>;
    /// Sequence number of the first event enqueued after `time_ms` (or at it when inclusive).
    fn sequence_at_time(&self, time_ms: i64, inclusive: bool) -> Result<Option<i64>, String>;
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PositionError {
    #[error(
        "The supplied sequence number '{requested}' is invalid. The last sequence number in the system is '{last}'"
    )]
    SequenceOutOfRange { requested: i64, last: i64 },
    #[error(
        "The supplied offset '{requested}' is invalid. The last offset in the system is '{last}'"
    )]
    OffsetOutOfRange { requested: i64, last: i64 },
    #[error("reading the partition index failed: {0}")]
    Storage(String),
}

/// The sequence number of the first event the reader gets. Positions before the first
/// retained event start there; `Latest` and positions just past the end wait for the next
/// event; positions further past the end are errors.
pub fn resolve(
    position: Position,
    progress: &Progress,
    lookup: &impl Lookup,
) -> Result<i64, PositionError> {
    let begin = progress.begin_sequence;
    let next = progress.next_sequence;
    let start = match position {
        Position::Earliest => begin,
        Position::Latest => next,
        Position::Sequence {
            sequence,
            inclusive,
        } => {
            let start = if inclusive {
                sequence
            } else {
                sequence.saturating_add(1)
            };
            if start > next {
                return Err(PositionError::SequenceOutOfRange {
                    requested: sequence,
                    last: next - 1,
                });
            }
            start
        }
        Position::Offset { offset, inclusive } => {
            // The next event will get `next_offset`: positions up to it are valid and wait
            // for it; anything further has never existed.
            let too_far = if inclusive {
                offset > progress.next_offset
            } else {
                offset >= progress.next_offset
            };
            if too_far {
                return Err(PositionError::OffsetOutOfRange {
                    requested: offset,
                    last: progress.last_offset,
                });
            }
            lookup
                .sequence_at_offset(offset, inclusive)
                .map_err(PositionError::Storage)?
                .unwrap_or(next)
        }
        Position::EnqueuedTime { time_ms, inclusive } => lookup
            .sequence_at_time(time_ms, inclusive)
            .map_err(PositionError::Storage)?
            .unwrap_or(next),
    };
    Ok(start.clamp(begin, next))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A partition of events at sequence i with offset 10*i and time 1000+100*i.
    struct Fixed {
        count: i64,
    }

    impl Lookup for Fixed {
        fn sequence_at_offset(&self, offset: i64, inclusive: bool) -> Result<Option<i64>, String> {
            Ok((0..self.count).find(|s| {
                if inclusive {
                    10 * s >= offset
                } else {
                    10 * s > offset
                }
            }))
        }
        fn sequence_at_time(&self, time_ms: i64, inclusive: bool) -> Result<Option<i64>, String> {
            Ok((0..self.count).find(|s| {
                let t = 1000 + 100 * s;
                if inclusive { t >= time_ms } else { t > time_ms }
            }))
        }
    }

    fn progress(count: i64) -> Progress {
        Progress {
            begin_sequence: 0,
            next_sequence: count,
            next_offset: 10 * count,
            last_offset: if count == 0 { -1 } else { 10 * (count - 1) },
            last_time_ms: if count == 0 {
                0
            } else {
                1000 + 100 * (count - 1)
            },
        }
    }

    fn at(position: Position, count: i64) -> Result<i64, PositionError> {
        resolve(position, &progress(count), &Fixed { count })
    }

    #[test]
    fn earliest_and_latest() {
        assert_eq!(at(Position::Earliest, 5), Ok(0));
        assert_eq!(at(Position::Latest, 5), Ok(5));
        assert_eq!(at(Position::Latest, 0), Ok(0));
        assert_eq!(at(Position::Earliest, 0), Ok(0));
    }

    #[test]
    fn sequence_edges() {
        let seq = |sequence, inclusive| Position::Sequence {
            sequence,
            inclusive,
        };
        assert_eq!(at(seq(2, true), 5), Ok(2));
        assert_eq!(at(seq(2, false), 5), Ok(3));
        assert_eq!(at(seq(4, false), 5), Ok(5));
        assert_eq!(at(seq(5, true), 5), Ok(5));
        assert_eq!(at(seq(-1, false), 5), Ok(0));
        assert_eq!(
            at(seq(6, true), 5),
            Err(PositionError::SequenceOutOfRange {
                requested: 6,
                last: 4
            })
        );
        assert_eq!(
            at(seq(5, false), 5),
            Err(PositionError::SequenceOutOfRange {
                requested: 5,
                last: 4
            })
        );
    }

    #[test]
    fn offset_edges() {
        let off = |offset, inclusive| Position::Offset { offset, inclusive };
        assert_eq!(at(off(20, true), 5), Ok(2));
        assert_eq!(at(off(20, false), 5), Ok(3));
        assert_eq!(at(off(25, true), 5), Ok(3));
        assert_eq!(at(off(-1, false), 5), Ok(0));
        assert_eq!(at(off(40, false), 5), Ok(5));
        assert_eq!(at(off(50, true), 5), Ok(5));
        assert!(matches!(
            at(off(51, true), 5),
            Err(PositionError::OffsetOutOfRange {
                requested: 51,
                last: 40
            })
        ));
    }

    #[test]
    fn time_edges() {
        let time = |time_ms, inclusive| Position::EnqueuedTime { time_ms, inclusive };
        assert_eq!(at(time(0, false), 5), Ok(0));
        assert_eq!(at(time(1200, false), 5), Ok(3));
        assert_eq!(at(time(1200, true), 5), Ok(2));
        assert_eq!(at(time(99_999, false), 5), Ok(5));
        assert_eq!(at(time(0, false), 0), Ok(0));
    }
}
