//! The consumers of a bench run: readers over the hub's partitions, from the latest
//! position, that time each event from its send (the time the producer wrote into the
//! body's first bytes) to its delivery: end-to-end latency.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt as _;
use hdrhistogram::Histogram;
use tokio::sync::watch;
use tokio::task::JoinSet;
use tributary_client::{Client, ClientError, EventPosition, ReceiveStream};

use crate::load::{LATENCY_US_MAX, TIMESTAMP_BYTES, new_histogram, unix_micros};

/// Where one reader's events come from: a Tributary partition, or a peer system's stream.
pub(crate) trait Source: Send + 'static {
    /// The bodies of the next events delivered; `None` when the stream ends.
    fn next(&mut self) -> impl Future<Output = Option<anyhow::Result<Vec<Bytes>>>> + Send;
}

/// Readers that run until [`Consumers::finish`].
pub(crate) struct Consumers {
    tasks: JoinSet<anyhow::Result<Histogram<u64>>>,
    /// Events received so far, over all readers.
    received: Arc<watch::Sender<u64>>,
    stop: watch::Sender<bool>,
}

/// What all consumers together saw.
pub(crate) struct ConsumeOutcome {
    pub(crate) events_received: u64,
    pub(crate) latency_us: Histogram<u64>,
}

/// A Tributary partition read from the latest position.
pub(crate) struct TributarySource(ReceiveStream);

impl Source for TributarySource {
    async fn next(&mut self) -> Option<anyhow::Result<Vec<Bytes>>> {
        let batch = self.0.next().await?;
        Some(
            batch
                .map(|events| events.into_iter().map(|e| e.body).collect())
                .map_err(Into::into),
        )
    }
}

/// Opens one reader per partition, spread over `consumers` connections, each from the
/// latest position; returns once every reader is open, so what is sent after is seen.
pub(crate) async fn tributary_sources(
    endpoint: &str,
    hub: &str,
    partition_ids: &[String],
    consumers: u32,
) -> Result<Vec<TributarySource>, ClientError> {
    let mut clients = Vec::new();
    for _ in 0..consumers.max(1) {
        clients.push(Client::connect(endpoint).await?);
    }
    let mut sources = Vec::new();
    for (index, partition) in partition_ids.iter().enumerate() {
        let client = &clients[index % clients.len()];
        let stream = client
            .consumer()
            .receive(hub, "", partition, EventPosition::Latest, 0)
            .await?;
        sources.push(TributarySource(stream));
    }
    Ok(sources)
}

impl Consumers {
    /// Starts one reader per source; each times every event from the send time in its
    /// body's first bytes to its delivery.
    pub(crate) fn spawn<S: Source>(sources: Vec<S>) -> Consumers {
        let (stop, stopped) = watch::channel(false);
        let received = Arc::new(watch::Sender::new(0u64));
        let mut tasks = JoinSet::new();
        for mut source in sources {
            let mut stopped = stopped.clone();
            let received = received.clone();
            tasks.spawn(async move {
                let mut latency_us = new_histogram();
                loop {
                    let batch = tokio::select! {
                        _ = stopped.wait_for(|stop| *stop) => break,
                        batch = source.next() => batch,
                    };
                    let Some(batch) = batch else { break };
                    let batch = batch?;
                    let now = unix_micros();
                    for body in &batch {
                        if let Some(sent) = body.get(..TIMESTAMP_BYTES) {
                            let sent = u64::from_le_bytes(sent.try_into().expect("8 bytes"));
                            latency_us.saturating_record(
                                now.saturating_sub(sent).clamp(1, LATENCY_US_MAX),
                            );
                        }
                    }
                    received.send_modify(|n| *n += batch.len() as u64);
                }
                Ok(latency_us)
            });
        }
        Consumers {
            tasks,
            received,
            stop,
        }
    }

    /// Waits until `sent` events have been received or `grace` has passed, then stops the
    /// readers and sums up what they saw.
    pub(crate) async fn finish(
        mut self,
        sent: u64,
        grace: Duration,
    ) -> anyhow::Result<ConsumeOutcome> {
        let mut received = self.received.subscribe();
        // Whether all arrived or the grace ran out, what was received is reported.
        let _ = tokio::time::timeout(grace, received.wait_for(|n| *n >= sent)).await;
        self.stop.send_replace(true);
        let mut latency_us = new_histogram();
        let mut first_error = None;
        while let Some(joined) = self.tasks.join_next().await {
            match joined.expect("a consumer task panicked") {
                Ok(histogram) => latency_us
                    .add(&histogram)
                    .expect("histograms with equal bounds merge"),
                Err(error) => {
                    first_error.get_or_insert(error);
                }
            }
        }
        match first_error {
            Some(error) => Err(error),
            None => Ok(ConsumeOutcome {
                events_received: *self.received.borrow(),
                latency_us,
            }),
        }
    }
}

/// Finishes `consumers`, if any (see [`Consumers::finish`]).
pub(crate) async fn finish(
    consumers: Option<Consumers>,
    sent: u64,
) -> anyhow::Result<Option<ConsumeOutcome>> {
    match consumers {
        Some(consumers) => Ok(Some(consumers.finish(sent, crate::CONSUMER_GRACE).await?)),
        None => Ok(None),
    }
}
