//! Waiting for a condition: [`eventually`] looks at a check again and again until it holds
//! or a deadline passes, in place of hand-written `loop { check; if late { panic }; sleep }`
//! loops. [`poll_until`] is the same wait without the panic, for callers that give up
//! quietly or report a timeout their own way (with a node's log, say).
//!
//! A check is an async closure returning `Ok(value)` once the condition holds, or
//! `Err(observation)` meanwhile: what it saw (a status, a count, an error), which the
//! timeout message shows for the last look. A check may also panic at once when it sees
//! something that can never come right (e.g. replicas that disagree).
//!
//! Polling: the first look is at once; then [`POLL_INTERVAL`] (50 ms) passes between the end
//! of one look and the start of the next, or as long as the last look took when that was
//! longer, so a slow check (a CLI process, a whole replica listing) keeps at most about half
//! the wall time busy. The pause never runs past the deadline: the last look is at the
//! deadline. A look under way when the deadline passes is not cut short; a check that could
//! hang must bound itself.

use std::fmt::{self, Display};
use std::future::Future;
use std::panic::Location;
use std::time::Duration;

use tokio::time::Instant;

/// The shortest pause between two looks at a condition (longer after a slower look; see the
/// module documentation).
pub const POLL_INTERVAL: Duration = Duration::from_millis(50);

/// When a wait gives up: a timeout counted from the start of the wait (from a
/// [`Duration`]), or a point in time (from an [`Instant`], e.g. one deadline shared by
/// several waits in a row).
#[derive(Debug, Clone, Copy)]
pub struct Deadline {
    at: Instant,
    /// The timeout it was made from, for messages.
    timeout: Option<Duration>,
}

impl From<Duration> for Deadline {
    fn from(timeout: Duration) -> Deadline {
        Deadline {
            at: Instant::now() + timeout,
            timeout: Some(timeout),
        }
    }
}

impl From<Instant> for Deadline {
    fn from(at: Instant) -> Deadline {
        Deadline { at, timeout: None }
    }
}

impl From<std::time::Instant> for Deadline {
    fn from(at: std::time::Instant) -> Deadline {
        Deadline::from(Instant::from_std(at))
    }
}

/// A wait that gave up at its deadline, with the last thing its check saw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TimedOut<E> {
    /// From the start of the wait to its last look.
    pub waited: Duration,
    /// The timeout the deadline was made from (`None`: made from a point in time).
    pub timeout: Option<Duration>,
    /// The check's `Err` at the last look.
    pub last: E,
}

impl<E: Display> Display for TimedOut<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.timeout {
            Some(timeout) => write!(f, "not within {timeout:?}")?,
            None => write!(f, "not by the deadline ({:?} of waiting)", self.waited)?,
        }
        // The alternate form shows an `anyhow::Error`'s causes too.
        write!(f, "; last seen: {:#}", self.last)
    }
}

/// Looks at `check` until it returns `Ok`, and returns that value; once `deadline` has
/// passed, returns the last `Err` it gave instead (see the module documentation for the
/// polling). The check always runs at least once, even past the deadline.
pub fn poll_until<T, E>(
    deadline: impl Into<Deadline>,
    mut check: impl AsyncFnMut() -> Result<T, E>,
) -> impl Future<Output = Result<T, TimedOut<E>>> {
    // Counted from the call, not from the first poll of the future.
    let deadline = deadline.into();
    let started = Instant::now();
    async move {
        loop {
            let look = Instant::now();
            let last = match check().await {
                Ok(value) => return Ok(value),
                Err(last) => last,
            };
            let now = Instant::now();
            if now >= deadline.at {
                return Err(TimedOut {
                    waited: now - started,
                    timeout: deadline.timeout,
                    last,
                });
            }
            let pause = POLL_INTERVAL.max(now - look).min(deadline.at - now);
            tokio::time::sleep(pause).await;
        }
    }
}

/// Looks at `check` until it returns `Ok`, and returns that value; panics once `deadline`
/// has passed, naming `what` was awaited, the caller and the check's last `Err`:
///
/// ```text
/// node 2 drained: not within 60s; last seen: leaders [(1, 4), (2, 1), (3, 3)]
/// (awaited at cluster-tests/tests/it/drain.rs:41:5)
/// ```
///
/// `what` reads best as the condition itself ("node 2 drained", "3 replicas caught up").
/// See the module documentation for the polling.
#[track_caller]
pub fn eventually<T, E: Display>(
    deadline: impl Into<Deadline>,
    what: impl Display,
    check: impl AsyncFnMut() -> Result<T, E>,
) -> impl Future<Output = T> {
    let caller = Location::caller();
    let wait = poll_until(deadline, check);
    async move {
        match wait.await {
            Ok(value) => value,
            Err(timed_out) => panic!("{what}: {timed_out}\n(awaited at {caller})"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SHORT: Duration = Duration::from_millis(300);

    #[tokio::test]
    async fn returns_the_value_of_the_first_look_that_holds() {
        let mut looks = 0;
        let value = eventually(Duration::from_secs(30), "the third look", async || {
            looks += 1;
            if looks == 3 {
                Ok(looks * 10)
            } else {
                Err(looks)
            }
        })
        .await;
        assert_eq!(value, 30);
        assert_eq!(looks, 3);
    }

    #[tokio::test]
    async fn a_condition_that_holds_at_once_costs_no_pause() {
        let started = Instant::now();
        let value = eventually(Duration::from_secs(30), "at once", async || {
            Ok::<_, String>("now")
        })
        .await;
        assert_eq!(value, "now");
        assert!(started.elapsed() < POLL_INTERVAL, "{:?}", started.elapsed());
    }

    #[tokio::test]
    async fn looks_at_least_once_even_past_the_deadline() {
        let value = poll_until(Instant::now() - Duration::from_secs(1), async || {
            Ok::<_, String>(7)
        })
        .await;
        assert_eq!(value, Ok(7));
    }

    #[tokio::test]
    async fn pauses_between_looks() {
        let mut looks = 0u32;
        let started = Instant::now();
        poll_until(Duration::from_secs(30), async || {
            looks += 1;
            if looks == 4 { Ok(()) } else { Err("not yet") }
        })
        .await
        .unwrap();
        assert!(
            started.elapsed() >= POLL_INTERVAL * 3,
            "{:?}",
            started.elapsed()
        );
    }

    #[tokio::test]
    async fn a_slow_look_is_followed_by_a_pause_as_long() {
        let look = Duration::from_millis(100);
        let mut looks = 0u32;
        let started = Instant::now();
        poll_until(Duration::from_secs(30), async || {
            tokio::time::sleep(look).await;
            looks += 1;
            if looks == 3 { Ok(()) } else { Err("not yet") }
        })
        .await
        .unwrap();
        // Three looks and two pauses of at least a look each.
        assert!(started.elapsed() >= look * 5, "{:?}", started.elapsed());
    }

    #[tokio::test]
    async fn gives_up_at_the_deadline_with_the_last_observation() {
        let mut looks = 0u32;
        let started = Instant::now();
        let timed_out = poll_until(SHORT, async || {
            looks += 1;
            Err::<(), _>(format!("look {looks}"))
        })
        .await
        .unwrap_err();
        assert!(timed_out.waited >= SHORT, "{timed_out:?}");
        assert!(started.elapsed() < Duration::from_secs(10), "{timed_out:?}");
        assert_eq!(timed_out.timeout, Some(SHORT));
        assert_eq!(timed_out.last, format!("look {looks}"));
        assert!(looks >= 2, "looked {looks} times");
        assert_eq!(
            timed_out.to_string(),
            format!("not within 300ms; last seen: look {looks}")
        );
    }

    #[tokio::test]
    async fn a_deadline_in_time_says_how_long_it_waited() {
        let timed_out = poll_until(Instant::now() + SHORT, async || Err::<(), _>("no"))
            .await
            .unwrap_err();
        assert_eq!(timed_out.timeout, None);
        let message = timed_out.to_string();
        assert!(
            message.starts_with("not by the deadline (") && message.ends_with("; last seen: no"),
            "{message}"
        );
    }

    #[tokio::test]
    async fn shows_an_errors_causes() {
        let timed_out = poll_until(Duration::ZERO, async || {
            Err::<(), _>(anyhow::anyhow!("connection refused").context("cluster status"))
        })
        .await
        .unwrap_err();
        assert!(
            timed_out
                .to_string()
                .ends_with("last seen: cluster status: connection refused"),
            "{timed_out}"
        );
    }

    #[tokio::test]
    #[should_panic(expected = "node 2 drained: not within 300ms; last seen: 3 leaders left")]
    async fn panics_naming_what_was_awaited_and_the_last_observation() {
        eventually(SHORT, "node 2 drained", async || {
            Err::<(), _>("3 leaders left")
        })
        .await;
    }

    #[tokio::test]
    async fn panics_naming_the_caller() {
        let line = line!() + 1;
        let wait = eventually(Duration::ZERO, "nothing", async || Err::<(), _>("no"));
        let panic = tokio::spawn(wait).await.unwrap_err().into_panic();
        let message = panic.downcast_ref::<String>().expect("a formatted message");
        assert!(
            message.ends_with(&format!("(awaited at {}:{line}:20)", file!())),
            "{message}"
        );
    }

    #[tokio::test]
    async fn a_check_may_borrow_and_change_its_surroundings() {
        let mut seen = Vec::new();
        let source = [1, 2, 3];
        let last = eventually(Duration::from_secs(30), "three values", async || {
            seen.push(source[seen.len()]);
            if seen.len() == 3 {
                Ok(seen.len())
            } else {
                Err(seen.len())
            }
        })
        .await;
        assert_eq!(last, 3);
        assert_eq!(seen, source);
    }
}
