//! Filling the partition: how much to send and what retention cap to give the hub so the
//! partition ends up holding at least the requested bytes with its earliest events removed
//! by retention ([`FillPlan`]), and the sends that do it, a few in flight.
//!
//! The fill keeps every follower close behind the leader: it sends a chunk, then waits
//! until no replica lags by more than [`LAG_ENTRIES_MAX`] entries. A follower far behind
//! is sent the entries it misses in one message, which for large entries can take longer
//! than the nodes allow a replication message, again and again: it would never catch up,
//! and the partition would not be the same on every replica before the rebuild.

use std::time::Duration;

use anyhow::{Context as _, bail};
use bytes::Bytes;
use futures::StreamExt as _;
use tokio::time::Instant;
use tributary_client::{Client, EventData, SendTarget};

/// The most event bytes one fill send (one log entry) carries: well inside the nodes'
/// default publish limit (1 MiB), and small enough that a follower a few entries behind is
/// sent them within the nodes' replication timeout.
pub(crate) const SEND_BYTES_MAX: u32 = 256 * 1024;
/// Fill sends in flight at once.
const SENDS_IN_FLIGHT: usize = 4;
/// Sends between two looks at how far the followers lag.
const CHUNK_SENDS: u64 = 64;
/// The most entries a follower may lag before the fill waits for it.
const LAG_ENTRIES_MAX: i64 = 16;
/// How long a follower may take to come within [`LAG_ENTRIES_MAX`] entries again.
const CATCH_UP_TIMEOUT: Duration = Duration::from_secs(60);
/// Pause between two looks at the followers' lag.
const LAG_POLL_INTERVAL: Duration = Duration::from_millis(100);
/// How long one fill send keeps retrying (following leader hints, riding out an election)
/// before the bench gives up.
const SEND_RETRY_DEADLINE: Duration = Duration::from_secs(30);
/// Progress lines during the fill.
const PROGRESS_STEPS: u64 = 10;
/// Share of the requested bytes added to the retention cap for the storage's framing of
/// each event (tens of bytes an event), so the bodies retained still reach the request.
const FRAMING_SHARE: f64 = 0.02;
/// Share of the requested bytes sent past the retention cap, so retention has something to
/// remove (at least a few sends' worth).
const CUT_SHARE: f64 = 0.02;
const CUT_SENDS_MIN: u64 = 4;

/// How to fill the partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FillPlan {
    /// The event bodies the partition must still hold after the cut.
    pub(crate) retained_bytes_min: u64,
    /// The hub's `retention_bytes_max`.
    pub(crate) retention_bytes_max: u64,
    pub(crate) event_bytes: u32,
    pub(crate) events_per_send: u32,
    pub(crate) sends: u64,
}

impl FillPlan {
    /// The plan for `retained_bytes_min` bytes of `event_bytes`-byte events.
    pub(crate) fn new(retained_bytes_min: u64, event_bytes: u32) -> FillPlan {
        assert!(event_bytes > 0 && event_bytes <= SEND_BYTES_MAX);
        let events_per_send = SEND_BYTES_MAX / event_bytes;
        let send_bytes = u64::from(events_per_send * event_bytes);
        // Retention removes whole sends (log entries) from the front: the retained bytes
        // may fall short of the cap by up to one send.
        let retention_bytes_max = retained_bytes_min
            + (retained_bytes_min as f64 * FRAMING_SHARE) as u64
            + 2 * send_bytes;
        let cut_bytes =
            ((retained_bytes_min as f64 * CUT_SHARE) as u64).max(CUT_SENDS_MIN * send_bytes);
        let sends = (retention_bytes_max + cut_bytes).div_ceil(send_bytes);
        FillPlan {
            retained_bytes_min,
            retention_bytes_max,
            event_bytes,
            events_per_send,
            sends,
        }
    }

    pub(crate) fn events(&self) -> u64 {
        self.sends * u64::from(self.events_per_send)
    }

    pub(crate) fn bytes(&self) -> u64 {
        self.events() * u64::from(self.event_bytes)
    }
}

/// Sends the fill `plan` to `partition_id` of `hub` through `client`, keeping the followers
/// close behind (see the module documentation) and printing progress; returns how long it
/// took. Fails on a send that does not succeed within the client's retries, or a follower
/// that does not catch up.
pub(crate) async fn fill(
    client: &Client,
    hub: &str,
    partition_id: &str,
    plan: &FillPlan,
) -> anyhow::Result<Duration> {
    let client = client.with_retry_deadline(SEND_RETRY_DEADLINE);
    // Random bodies, so the bytes stored are the bytes sent whatever the storage does.
    let body: Bytes = (0..plan.event_bytes)
        .map(|_| rand::random::<u8>())
        .collect::<Vec<u8>>()
        .into();
    let started = Instant::now();
    let step = plan.sends.div_ceil(PROGRESS_STEPS).max(1);
    let mut done = 0u64;
    while done < plan.sends {
        let chunk = CHUNK_SENDS.min(plan.sends - done);
        let sends = futures::stream::iter(0..chunk)
            .map(|_| {
                let events = (0..plan.events_per_send).map(|_| EventData::from_body(body.clone()));
                let producer = client.producer();
                async move {
                    producer
                        .send(
                            hub,
                            SendTarget::PartitionId(partition_id.to_owned()),
                            events,
                        )
                        .await
                }
            })
            .buffer_unordered(SENDS_IN_FLIGHT);
        futures::pin_mut!(sends);
        while let Some(result) = sends.next().await {
            result.with_context(|| {
                format!("a send of the fill to partition {partition_id} of '{hub}' failed")
            })?;
            done += 1;
            if done.is_multiple_of(step) || done == plan.sends {
                let bytes = done * u64::from(plan.events_per_send * plan.event_bytes);
                let seconds = started.elapsed().as_secs_f64();
                eprintln!(
                    "    filled {:.3} GB of {:.3} GB in {seconds:.1}s ({:.1} MB/s)",
                    bytes as f64 / 1e9,
                    plan.bytes() as f64 / 1e9,
                    bytes as f64 / 1e6 / seconds.max(f64::EPSILON)
                );
            }
        }
        await_followers(&client, hub, partition_id).await?;
    }
    Ok(started.elapsed())
}

/// Waits until no replica lags the leader by more than [`LAG_ENTRIES_MAX`] entries.
async fn await_followers(client: &Client, hub: &str, partition_id: &str) -> anyhow::Result<()> {
    let deadline = Instant::now() + CATCH_UP_TIMEOUT;
    loop {
        let last = match client.cluster_status().await {
            Ok(status) => match super::replicas::furthest_behind(&status, hub, partition_id) {
                Ok((_, lag)) if lag <= LAG_ENTRIES_MAX => return Ok(()),
                Ok((node, lag)) => format!("node {node}'s replica is {lag} entries behind"),
                Err(why) => why,
            },
            Err(error) => error.to_string(),
        };
        if Instant::now() >= deadline {
            bail!(
                "a follower did not catch up during the fill within {}: {last} (see the \
                 leader's log for replication that times out)",
                humantime::format_duration(CATCH_UP_TIMEOUT)
            );
        }
        tokio::time::sleep(LAG_POLL_INTERVAL).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cap_keeps_the_request_and_the_fill_passes_the_cap() {
        let plan = FillPlan::new(1_050_000_000, 65536);
        assert_eq!(plan.events_per_send, 4);
        let send_bytes = 4 * 65536;
        assert_eq!(
            plan.retention_bytes_max,
            1_050_000_000 + 21_000_000 + 2 * send_bytes
        );
        // More than the cap plus the cut margin, by less than one send.
        let past_cap = plan.bytes() - plan.retention_bytes_max;
        assert!(past_cap >= 21_000_000 && past_cap < 21_000_000 + send_bytes);
        assert_eq!(plan.events(), plan.sends * 4);
    }

    #[test]
    fn small_fills_still_cut_a_few_sends_and_large_events_go_one_by_one() {
        let plan = FillPlan::new(1_000_000, 1024);
        assert_eq!(plan.events_per_send, 256);
        let send_bytes = 256 * 1024;
        assert!(plan.bytes() - plan.retention_bytes_max >= CUT_SENDS_MIN * send_bytes);
        let one = FillPlan::new(10_000_000, SEND_BYTES_MAX);
        assert_eq!(one.events_per_send, 1);
        assert!(one.bytes() > one.retention_bytes_max);
    }
}
