//! Wall-clock time, injected.
//!
//! Code that stamps or expires events takes a [`Clock`] instead of reading the system time,
//! so tests and simulations can drive time by hand and replay the same history.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// A source of wall-clock time.
pub trait Clock: Send + Sync + 'static {
    /// Milliseconds since the Unix epoch, UTC. May step backwards (NTP); use
    /// [`MonotonicStamp`] where order matters.
    fn now_ms(&self) -> i64;
}

/// So a clock can be shared, e.g. an `Arc<ManualClock>` kept by a test and given to the code.
impl<C: Clock + ?Sized> Clock for Arc<C> {
    fn now_ms(&self) -> i64 {
        (**self).now_ms()
    }
}

/// The operating system's clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> i64 {
        let to_ms = |d: std::time::Duration| i64::try_from(d.as_millis()).unwrap_or(i64::MAX);
        match SystemTime::now().duration_since(UNIX_EPOCH) {
            Ok(since) => to_ms(since),
            // A host clock set before 1970 is odd but representable.
            Err(before) => -to_ms(before.duration()),
        }
    }
}

/// A clock that only moves when told to, for tests.
#[derive(Debug, Default)]
pub struct ManualClock {
    now_ms: AtomicI64,
}

impl ManualClock {
    pub fn new(now_ms: i64) -> Self {
        Self {
            now_ms: AtomicI64::new(now_ms),
        }
    }

    /// Sets the time, backwards too, to test how code copes with a clock that steps back.
    pub fn set_ms(&self, now_ms: i64) {
        self.now_ms.store(now_ms, Ordering::SeqCst);
    }

    /// Moves the time by `delta_ms` (negative steps back) and returns the new time.
    pub fn advance_ms(&self, delta_ms: i64) -> i64 {
        self.now_ms
            .fetch_add(delta_ms, Ordering::SeqCst)
            .wrapping_add(delta_ms)
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> i64 {
        self.now_ms.load(Ordering::SeqCst)
    }
}

/// Hands out timestamps that never decrease.
///
/// A partition leader stamps each event's enqueued time with this, so enqueued times follow
/// sequence numbers even when the wall clock steps back; otherwise "read from time t" could
/// skip events or return them out of order. A new leader starts from the last stamp in the
/// log (`floor_ms`), so the guarantee survives failover.
#[derive(Debug, Clone)]
pub struct MonotonicStamp {
    last_ms: i64,
}

impl MonotonicStamp {
    /// Starts a stamper whose stamps are never below `floor_ms`.
    pub fn new(floor_ms: i64) -> Self {
        Self { last_ms: floor_ms }
    }

    /// Returns `max(now_ms, last stamp)` and remembers it.
    pub fn stamp(&mut self, now_ms: i64) -> i64 {
        self.last_ms = self.last_ms.max(now_ms);
        self.last_ms
    }

    /// The latest stamp handed out, or the floor if none was.
    pub fn last_ms(&self) -> i64 {
        self.last_ms
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn system_clock_is_after_2020() {
        assert!(SystemClock.now_ms() > 1_577_836_800_000);
    }

    #[test]
    fn manual_clock_moves_only_when_told() {
        let clock = Arc::new(ManualClock::new(1_000));
        let shared: Arc<dyn Clock> = clock.clone();
        assert_eq!(shared.now_ms(), 1_000);
        assert_eq!(clock.advance_ms(500), 1_500);
        assert_eq!(shared.now_ms(), 1_500);
        clock.set_ms(200);
        assert_eq!(shared.now_ms(), 200);
        assert_eq!(clock.advance_ms(-100), 100);
    }

    #[test]
    fn stamp_holds_when_the_clock_steps_back() {
        let clock = ManualClock::new(10_000);
        let mut stamper = MonotonicStamp::new(0);
        assert_eq!(stamper.stamp(clock.now_ms()), 10_000);
        clock.set_ms(9_000);
        assert_eq!(stamper.stamp(clock.now_ms()), 10_000);
        clock.set_ms(10_001);
        assert_eq!(stamper.stamp(clock.now_ms()), 10_001);
        assert_eq!(stamper.last_ms(), 10_001);
    }

    #[test]
    fn stamp_respects_the_floor() {
        let mut stamper = MonotonicStamp::new(5_000);
        assert_eq!(stamper.stamp(4_000), 5_000);
        assert_eq!(stamper.stamp(6_000), 6_000);
    }

    proptest! {
        #[test]
        fn stamps_never_decrease(floor in any::<i64>(), times in prop::collection::vec(any::<i64>(), 0..50)) {
            let mut stamper = MonotonicStamp::new(floor);
            let mut previous = floor;
            for now_ms in times {
                let stamp = stamper.stamp(now_ms);
                prop_assert!(stamp >= previous && stamp >= now_ms);
                previous = stamp;
            }
        }
    }
}
