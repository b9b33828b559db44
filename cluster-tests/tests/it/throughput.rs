//! Throughput units: a hub with 1 TU under 3 MB/s of offered load takes in about 1 MB/s and
//! answers the excess with SERVER_BUSY and a retry-after; raising it to 3 TUs lifts the
//! rate at once, without a restart.

use std::time::Duration;

use tokio::time::{Instant, MissedTickBehavior};
use tributary_client::{Client, ErrorReason, EventData, SendTarget};
use tributary_cluster_tests::{NodeProcess, TestDir};

const EVENT_BYTES: usize = 10_000;
/// 48 senders, each one 10 kB event every 160 ms: 3 MB/s offered (many senders, so the
/// offered rate does not depend on how fast one send is acknowledged, even when other
/// tests load the machine and a send takes hundreds of milliseconds).
const SENDERS: usize = 48;
const SEND_EVERY: Duration = Duration::from_millis(160);
/// Long enough that the most 1 TU can ever let in (1 MB/s plus the one second its bucket
/// starts with, spread over the window) is close to 1 MB/s: a loaded machine that cannot
/// push much more still shows that a raised reservation applies.
const MEASURE_FOR: Duration = Duration::from_secs(10);

struct Offered {
    accepted_bytes_per_s: f64,
    busy: usize,
    retry_after_missing: usize,
    other_errors: Vec<String>,
}

async fn offer(client: &Client, hub: &str) -> Offered {
    let started = Instant::now();
    let senders = (0..SENDERS).map(|_| {
        let producer = client.producer();
        let hub = hub.to_string();
        async move {
            let mut ticks = tokio::time::interval(SEND_EVERY);
            ticks.set_missed_tick_behavior(MissedTickBehavior::Skip);
            let (mut accepted, mut busy, mut no_retry_after) = (0usize, 0usize, 0usize);
            let mut other = Vec::new();
            while started.elapsed() < MEASURE_FOR {
                ticks.tick().await;
                let event = EventData::from_body(vec![b'x'; EVENT_BYTES]);
                match producer
                    .send(&hub, SendTarget::PartitionId("0".into()), [event])
                    .await
                {
                    Ok(_) => accepted += EVENT_BYTES,
                    Err(err) if err.reason() == Some(ErrorReason::ServerBusy) => {
                        busy += 1;
                        if err.retry_after().is_none() {
                            no_retry_after += 1;
                        }
                    }
                    Err(err) => other.push(err.to_string()),
                }
            }
            (accepted, busy, no_retry_after, other)
        }
    });
    let results = futures::future::join_all(senders).await;
    let elapsed = started.elapsed().as_secs_f64();
    Offered {
        accepted_bytes_per_s: results.iter().map(|r| r.0).sum::<usize>() as f64 / elapsed,
        busy: results.iter().map(|r| r.1).sum(),
        retry_after_missing: results.iter().map(|r| r.2).sum(),
        other_errors: results.into_iter().flat_map(|r| r.3).collect(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn throughput_units_hold_ingress_to_the_reservation_and_change_live() {
    let dir = TestDir::new("throughput");
    let node = NodeProcess::start(&dir.path().join("node")).await;
    // No retries: every refusal is seen.
    let client = Client::connect(&node.endpoint())
        .await
        .unwrap()
        .with_retry_deadline(Duration::ZERO);
    let hub = client
        .create_event_hub_with("metered", 1, None, None, 1)
        .await
        .unwrap();
    assert_eq!(hub.throughput_units, 1);

    let one = offer(&client, "metered").await;
    println!(
        "1 TU: {:.0} B/s accepted, {} busy",
        one.accepted_bytes_per_s, one.busy
    );
    assert!(one.other_errors.is_empty(), "{:?}", one.other_errors);
    // The bucket holds 1 MB/s and starts with one second: over the window no more than
    // `one_tu_max` can get in, whatever the offered load; less than 80% of 1 MB/s would
    // mean the limit bites below the reservation.
    let one_tu_max = 1e6 + 1e6 / MEASURE_FOR.as_secs_f64();
    assert!(
        (0.8e6..=one_tu_max).contains(&one.accepted_bytes_per_s),
        "1 TU took in {:.0} B/s (most it can take in: {one_tu_max:.0} B/s)",
        one.accepted_bytes_per_s
    );
    assert!(one.busy > 0, "the excess was refused");
    assert_eq!(
        one.retry_after_missing, 0,
        "every refusal says when to retry"
    );

    // Raised live, no restart.
    let hub = client.set_throughput_units("metered", 3).await.unwrap();
    assert_eq!(hub.throughput_units, 3);
    let three = offer(&client, "metered").await;
    println!(
        "3 TU: {:.0} B/s accepted, {} busy",
        three.accepted_bytes_per_s, three.busy
    );
    assert!(three.other_errors.is_empty(), "{:?}", three.other_errors);
    // More than 1 TU can ever let in: the new reservation applies. (Not a ratio: on a
    // loaded machine the senders may not reach 3 MB/s, but they do reach more than 1.1.)
    assert!(
        three.accepted_bytes_per_s > one_tu_max,
        "3 TU took in {:.0} B/s, no more than 1 TU can ({one_tu_max:.0} B/s); 1 TU took in {:.0} B/s",
        three.accepted_bytes_per_s,
        one.accepted_bytes_per_s
    );

    // A reservation beyond the cluster's capacity (10 TU per capacity unit) is refused.
    let err = client
        .set_throughput_units("metered", 11)
        .await
        .unwrap_err();
    assert_eq!(err.reason(), Some(ErrorReason::QuotaExceeded), "{err}");
    assert!(err.to_string().contains("cluster's capacity"), "{err}");
}
