//! The paced sends kept up around a rebuild: one small event at a time to the partition on
//! a fixed schedule, each latency counted from when the send was due and recorded in the
//! window (before the wipe, during the rebuild) it was due in. A failed attempt is counted
//! and retried until the send is acknowledged, so a rebuild that disturbs sends shows as
//! failures and as latency, never as a lost measurement.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use hdrhistogram::Histogram;
use tokio::task::JoinHandle;
use tokio::time::{Instant, MissedTickBehavior};
use tributary_client::{Client, EventData, SendTarget};

use super::report::SendWindow;

/// Body size of each paced event.
const EVENT_BYTES: usize = 100;
/// How long one attempt keeps retrying inside the client (following leader hints, riding
/// out an election) before it counts as failed.
const ATTEMPT_RETRY_DEADLINE: Duration = Duration::from_secs(5);
/// Pause after a failed attempt before the next.
const RETRY_PAUSE: Duration = Duration::from_millis(50);
/// The highest latency recorded; a longer one is recorded as this.
const LATENCY_US_MAX: u64 = 600_000_000;

/// Which window a send that is due now belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Window {
    Before,
    During,
}

/// The running sender; [`PacedSends::finish`] stops it.
pub(crate) struct PacedSends {
    windows: Arc<Mutex<Windows>>,
    task: JoinHandle<()>,
}

struct Windows {
    current: Window,
    before: WindowStats,
    during: WindowStats,
    /// The last failed attempt's error.
    last_error: Option<String>,
}

struct WindowStats {
    latency_us: Histogram<u64>,
    failures: u64,
}

impl WindowStats {
    fn new() -> WindowStats {
        WindowStats {
            latency_us: Histogram::new_with_bounds(1, LATENCY_US_MAX, 3)
                .expect("valid histogram bounds"),
            failures: 0,
        }
    }
}

impl Windows {
    fn of(&mut self, window: Window) -> &mut WindowStats {
        match window {
            Window::Before => &mut self.before,
            Window::During => &mut self.during,
        }
    }
}

impl PacedSends {
    /// Starts sending `per_second` events a second to `partition_id` of `hub` through
    /// `client`, in the [`Window::Before`] window.
    pub(crate) fn start(
        client: &Client,
        hub: &str,
        partition_id: &str,
        per_second: f64,
    ) -> PacedSends {
        assert!(per_second > 0.0);
        let windows = Arc::new(Mutex::new(Windows {
            current: Window::Before,
            before: WindowStats::new(),
            during: WindowStats::new(),
            last_error: None,
        }));
        let sender = Sender {
            client: client.with_retry_deadline(ATTEMPT_RETRY_DEADLINE),
            hub: hub.to_owned(),
            partition_id: partition_id.to_owned(),
            interval: Duration::from_secs_f64(1.0 / per_second),
            windows: windows.clone(),
        };
        let task = tokio::spawn(sender.run());
        PacedSends { windows, task }
    }

    /// Sends due from now on belong to `window`.
    pub(crate) fn enter(&self, window: Window) {
        self.windows.lock().expect("windows lock").current = window;
    }

    /// Stops sending (a send under way is abandoned, not counted) and returns the two
    /// windows and the last failed attempt's error, if any failed.
    pub(crate) async fn finish(self) -> (SendWindow, SendWindow, Option<String>) {
        self.task.abort();
        let _ = self.task.await;
        let windows = self.windows.lock().expect("windows lock");
        (
            SendWindow::of(&windows.before.latency_us, windows.before.failures),
            SendWindow::of(&windows.during.latency_us, windows.during.failures),
            windows.last_error.clone(),
        )
    }
}

struct Sender {
    client: Client,
    hub: String,
    partition_id: String,
    interval: Duration,
    windows: Arc<Mutex<Windows>>,
}

impl Sender {
    /// Records one attempt at a send due at `due` in `window`; true if it was acknowledged.
    fn record(
        &self,
        window: Window,
        due: Instant,
        result: Result<(), tributary_client::ClientError>,
    ) -> bool {
        let mut windows = self.windows.lock().expect("windows lock");
        match result {
            Ok(()) => {
                let latency_us = Instant::now().duration_since(due).as_micros();
                let latency_us = u64::try_from(latency_us)
                    .unwrap_or(LATENCY_US_MAX)
                    .clamp(1, LATENCY_US_MAX);
                windows
                    .of(window)
                    .latency_us
                    .record(latency_us)
                    .expect("a latency within the bounds");
                true
            }
            Err(error) => {
                windows.of(window).failures += 1;
                windows.last_error = Some(error.to_string());
                false
            }
        }
    }

    async fn run(self) {
        let body = Bytes::from(vec![b'p'; EVENT_BYTES]);
        let mut schedule = tokio::time::interval(self.interval);
        // A slow send delays the schedule; late sends are not made up in a burst.
        schedule.set_missed_tick_behavior(MissedTickBehavior::Delay);
        loop {
            let due = schedule.tick().await;
            let window = self.windows.lock().expect("windows lock").current;
            loop {
                let result = self
                    .client
                    .producer()
                    .send(
                        &self.hub,
                        SendTarget::PartitionId(self.partition_id.clone()),
                        [EventData::from_body(body.clone())],
                    )
                    .await;
                if self.record(window, due, result.map(drop)) {
                    break;
                }
                tokio::time::sleep(RETRY_PAUSE).await;
            }
        }
    }
}
