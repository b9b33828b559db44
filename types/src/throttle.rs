//! Throughput units (SPEC section 7): a hub with TUs reserved may take in 1 MB/s or
//! 1,000 events/s per TU and give out 2 MB/s or 4,096 events/s per TU. Each partition
//! leader enforces its share of the hub's rate (TUs / partitions), so the hub as a whole
//! stays within its reservation without nodes coordinating per request.

use std::time::Duration;

pub const INGRESS_BYTES_PER_TU: f64 = 1_000_000.0;
pub const INGRESS_EVENTS_PER_TU: f64 = 1_000.0;
pub const EGRESS_BYTES_PER_TU: f64 = 2_000_000.0;
pub const EGRESS_EVENTS_PER_TU: f64 = 4_096.0;

/// A pair of token buckets (bytes and events) refilled at a rate that may change between
/// calls. Holds at most one second of tokens, so an idle partition bursts at most its
/// rate for a second.
#[derive(Debug, Clone)]
pub struct Throttle {
    bytes: f64,
    events: f64,
    last_ms: Option<i64>,
}

impl Default for Throttle {
    fn default() -> Self {
        Self::new()
    }
}

impl Throttle {
    pub fn new() -> Self {
        Self {
            bytes: f64::NAN,
            events: f64::NAN,
            last_ms: None,
        }
    }

    fn refill(&mut self, now_ms: i64, bytes_per_s: f64, events_per_s: f64) {
        if self.bytes.is_nan() {
            self.bytes = bytes_per_s;
            self.events = events_per_s;
        }
        let elapsed_s = self
            .last_ms
            .map_or(0.0, |last| (now_ms - last).max(0) as f64 / 1000.0);
        self.last_ms = Some(now_ms);
        self.bytes = (self.bytes + elapsed_s * bytes_per_s).min(bytes_per_s);
        self.events = (self.events + elapsed_s * events_per_s).min(events_per_s);
    }

    /// Takes `bytes` and `events` if both buckets hold enough; otherwise takes nothing and
    /// returns how long until they would. A request larger than a whole second's rate is
    /// let through once the buckets are full, so it is slowed, never refused forever.
    pub fn admit(
        &mut self,
        now_ms: i64,
        bytes_per_s: f64,
        events_per_s: f64,
        bytes: f64,
        events: f64,
    ) -> Result<(), Duration> {
        self.refill(now_ms, bytes_per_s, events_per_s);
        let need_bytes = bytes.min(bytes_per_s);
        let need_events = events.min(events_per_s);
        if self.bytes >= need_bytes && self.events >= need_events {
            self.bytes -= bytes;
            self.events -= events;
            return Ok(());
        }
        let wait_s = f64::max(
            (need_bytes - self.bytes) / bytes_per_s,
            (need_events - self.events) / events_per_s,
        );
        Err(Duration::from_secs_f64(wait_s.max(0.001)))
    }

    /// Takes `bytes` and `events` unconditionally (they may go negative) and returns how
    /// long the caller should wait before going on: egress is slowed, never refused.
    pub fn consume(
        &mut self,
        now_ms: i64,
        bytes_per_s: f64,
        events_per_s: f64,
        bytes: f64,
        events: f64,
    ) -> Duration {
        self.refill(now_ms, bytes_per_s, events_per_s);
        self.bytes -= bytes;
        self.events -= events;
        let wait_s = f64::max(-self.bytes / bytes_per_s, -self.events / events_per_s);
        Duration::from_secs_f64(wait_s.max(0.0))
    }
}

/// A partition's share of its hub's rate, per second: (bytes, events). `None` when the hub
/// reserves no throughput units (unthrottled).
pub fn partition_share(
    throughput_units: u32,
    partition_count: u16,
    bytes_per_tu: f64,
    events_per_tu: f64,
) -> Option<(f64, f64)> {
    if throughput_units == 0 || partition_count == 0 {
        return None;
    }
    let share = f64::from(throughput_units) / f64::from(partition_count);
    Some((share * bytes_per_tu, share * events_per_tu))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn admits_the_rate_and_refuses_the_excess_with_a_wait() {
        let mut t = Throttle::new();
        // A full second's worth at start, then 1 MB/s.
        assert!(t.admit(0, 1e6, 1e3, 600_000.0, 10.0).is_ok());
        assert!(t.admit(0, 1e6, 1e3, 400_000.0, 10.0).is_ok());
        let wait = t.admit(0, 1e6, 1e3, 100_000.0, 10.0).unwrap_err();
        assert_eq!(wait, Duration::from_millis(100));
        assert!(t.admit(100, 1e6, 1e3, 100_000.0, 10.0).is_ok());
        // Offered 3 MB/s for 10 s in 30 kB sends every 10 ms: about 1 MB/s gets in.
        let mut t = Throttle::new();
        let mut admitted = 0.0;
        for step in 0..1000 {
            if t.admit(step * 10, 1e6, 1e3, 30_000.0, 1.0).is_ok() {
                admitted += 30_000.0;
            }
        }
        let rate = admitted / 10.0;
        assert!((1.0e6..=1.11e6).contains(&rate), "{rate}");
    }

    #[test]
    fn events_are_limited_too_and_rate_changes_apply_at_once() {
        let mut t = Throttle::new();
        assert!(t.admit(0, 1e9, 1e3, 10.0, 1000.0).is_ok());
        assert!(t.admit(0, 1e9, 1e3, 10.0, 1.0).is_err());
        // Three times the rate: refills three times as fast from now on.
        assert!(t.admit(500, 3e9, 3e3, 10.0, 3000.0).is_err());
        assert!(t.admit(1000, 3e9, 3e3, 10.0, 3000.0).is_ok());
    }

    #[test]
    fn a_request_above_a_seconds_rate_waits_for_full_buckets_instead_of_failing_forever() {
        let mut t = Throttle::new();
        assert!(t.admit(0, 1e6, 1e3, 2e6, 1.0).is_ok());
        assert!(t.admit(500, 1e6, 1e3, 2e6, 1.0).is_err());
        assert!(t.admit(3000, 1e6, 1e3, 2e6, 1.0).is_ok());
    }

    #[test]
    fn egress_is_slowed_not_refused() {
        let mut t = Throttle::new();
        assert_eq!(t.consume(0, 2e6, 4096.0, 2e6, 1.0), Duration::ZERO);
        assert_eq!(
            t.consume(0, 2e6, 4096.0, 1e6, 1.0),
            Duration::from_millis(500)
        );
    }

    #[test]
    fn shares_split_the_hub_rate_over_partitions() {
        assert_eq!(partition_share(0, 4, 1e6, 1e3), None);
        assert_eq!(partition_share(2, 4, 1e6, 1e3), Some((5e5, 500.0)));
    }
}
