//! Failed peer calls, summed up. A node that falls behind (overloaded, paused, cut off)
//! fails every group's calls to it at once: hundreds of heartbeats, votes and appends a
//! second, each of which openraft would log on its own. This log says the first failure
//! to a node at once and then at most one line per node every [`SUMMARY_INTERVAL`], with
//! the failures of each kind and the last error; `tributary_peer_call_failures_total{kind}`
//! counts every one.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

/// How often, at most, the failures of calls to one node are logged.
pub const SUMMARY_INTERVAL: Duration = Duration::from_secs(10);

/// The failures of calls to one node since its window started.
#[derive(Debug)]
struct Window {
    started: Instant,
    by_kind: BTreeMap<&'static str, u64>,
}

/// What to log about one failure.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Note {
    /// The first failure to this node in a while: log it as it is.
    First,
    /// Failures of a whole window, this one included: log their counts and the last error.
    Summary {
        by_kind: BTreeMap<&'static str, u64>,
        over: Duration,
    },
    /// Counted, to be summed up later.
    Quiet,
}

#[derive(Debug, Default)]
pub(crate) struct PeerFailures {
    by_node: Mutex<HashMap<u64, Window>>,
}

impl PeerFailures {
    /// Records a failed call of `kind` to `node` and logs what there is to log.
    pub(crate) fn record(&self, node: u64, kind: &'static str, error: &str) {
        metrics::counter!("tributary_peer_call_failures_total", "kind" => kind).increment(1);
        match self.note(node, kind, Instant::now()) {
            Note::First => tracing::warn!(
                node,
                kind,
                %error,
                "a call to a peer failed (further failures of calls to it are summed up every \
                 {}s)",
                SUMMARY_INTERVAL.as_secs()
            ),
            Note::Summary { by_kind, over } => tracing::warn!(
                node,
                failures = ?by_kind,
                last_error = %error,
                "calls to a peer failed over the last {}s",
                over.as_secs()
            ),
            Note::Quiet => {}
        }
    }

    fn note(&self, node: u64, kind: &'static str, now: Instant) -> Note {
        let mut by_node = self.by_node.lock().expect("peer failures lock");
        let Some(window) = by_node.get_mut(&node) else {
            by_node.insert(
                node,
                Window {
                    started: now,
                    by_kind: BTreeMap::new(),
                },
            );
            return Note::First;
        };
        let over = now.duration_since(window.started);
        if over >= SUMMARY_INTERVAL * 3 && window.by_kind.is_empty() {
            // Quiet for a while: this one starts a new story.
            window.started = now;
            return Note::First;
        }
        *window.by_kind.entry(kind).or_default() += 1;
        if over < SUMMARY_INTERVAL {
            return Note::Quiet;
        }
        window.started = now;
        Note::Summary {
            by_kind: std::mem::take(&mut window.by_kind),
            over,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_failure_is_told_then_one_summary_per_interval() {
        let failures = PeerFailures::default();
        let start = Instant::now();
        let at = |ms: u64| start + Duration::from_millis(ms);
        assert_eq!(failures.note(2, "heartbeat", at(0)), Note::First);
        for ms in 1..500 {
            let kind = if ms % 5 == 0 { "vote" } else { "heartbeat" };
            assert_eq!(failures.note(2, kind, at(ms)), Note::Quiet);
        }
        // Another node's failures are its own.
        assert_eq!(failures.note(3, "append", at(600)), Note::First);
        assert_eq!(
            failures.note(2, "heartbeat", at(10_000)),
            Note::Summary {
                by_kind: BTreeMap::from([("heartbeat", 401), ("vote", 99)]),
                over: Duration::from_secs(10),
            }
        );
        assert_eq!(failures.note(2, "vote", at(10_001)), Note::Quiet);
        assert_eq!(
            failures.note(2, "vote", at(20_001)),
            Note::Summary {
                by_kind: BTreeMap::from([("vote", 2)]),
                over: Duration::from_millis(10_001),
            }
        );
        // Quiet for long after a summary: the next failure is told at once again.
        assert_eq!(failures.note(2, "vote", at(60_000)), Note::First);
    }
}
