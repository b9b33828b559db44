//! Heartbeat coalescing: with hundreds of groups per node, each group's leader sends its
//! followers a heartbeat every interval. Sent one by one that is hundreds of RPCs per
//! interval per peer; instead, messages to the same peer that arrive within a short window
//! travel together in one `RaftPeer.Batch` call, and each caller gets its own reply.

use std::future::Future;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};
use tributary_proto::peer::{GroupMessage, GroupReply};

/// How long the first message of a batch waits for others. Each group's heartbeat timer
/// runs at its own phase, so the window decides how many share a batch: with 100 groups
/// led per peer and 150 ms heartbeats, about 13. Small against the election timeout
/// (400 ms and more), so a heartbeat is never late enough to matter.
pub const COALESCE_WINDOW: Duration = Duration::from_millis(20);
/// Most messages in one batch.
pub const BATCH_MESSAGES_MAX: usize = 1024;
/// Messages waiting for a batch at most; beyond, callers wait (backpressure).
const QUEUE_MAX: usize = 8192;

type Waiter = oneshot::Sender<Result<GroupReply, String>>;

/// Collects messages for one peer and sends them in batches. Cheap to clone; the batching
/// task ends when every clone is dropped.
#[derive(Clone, Debug)]
pub struct Coalescer {
    tx: mpsc::Sender<(GroupMessage, Waiter)>,
}

impl Coalescer {
    /// Starts the batching task. `send` delivers one batch and returns one reply per
    /// message, in order.
    pub fn spawn<F, Fut>(window: Duration, send: F) -> Coalescer
    where
        F: Fn(Vec<GroupMessage>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Vec<GroupReply>, String>> + Send + 'static,
    {
        let (tx, mut rx) = mpsc::channel::<(GroupMessage, Waiter)>(QUEUE_MAX);
        tokio::spawn(async move {
            while let Some(first) = rx.recv().await {
                let mut batch = vec![first];
                let window_end = tokio::time::sleep(window);
                tokio::pin!(window_end);
                while batch.len() < BATCH_MESSAGES_MAX {
                    tokio::select! {
                        next = rx.recv() => match next {
                            Some(message) => batch.push(message),
                            None => break,
                        },
                        _ = &mut window_end => break,
                    }
                }
                let (messages, waiters): (Vec<GroupMessage>, Vec<Waiter>) =
                    batch.into_iter().unzip();
                metrics::counter!("tributary_peer_batches_total").increment(1);
                metrics::counter!("tributary_peer_batched_messages_total")
                    .increment(messages.len() as u64);
                let reply = send(messages);
                // The next window opens while this batch is in flight.
                tokio::spawn(async move { deliver(reply.await, waiters) });
            }
        });
        Coalescer { tx }
    }

    /// Sends `message` in the next batch and waits for its reply.
    pub async fn call(&self, message: GroupMessage) -> Result<GroupReply, String> {
        let (waiter, reply) = oneshot::channel();
        self.tx
            .send((message, waiter))
            .await
            .map_err(|_| "the peer's batching task has stopped".to_string())?;
        reply
            .await
            .map_err(|_| "the batch carrying the message was dropped".to_string())?
    }
}

fn deliver(result: Result<Vec<GroupReply>, String>, waiters: Vec<Waiter>) {
    match result {
        Ok(replies) if replies.len() == waiters.len() => {
            for (waiter, reply) in waiters.into_iter().zip(replies) {
                let _ = waiter.send(Ok(reply));
            }
        }
        Ok(replies) => {
            let error = format!(
                "a batch of {} messages got {} replies",
                waiters.len(),
                replies.len()
            );
            for waiter in waiters {
                let _ = waiter.send(Err(error.clone()));
            }
        }
        Err(error) => {
            for waiter in waiters {
                let _ = waiter.send(Err(error.clone()));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use tributary_proto::peer::group_reply;

    use super::*;

    fn message(group: u64) -> GroupMessage {
        GroupMessage {
            group,
            kind: 1,
            payload: Default::default(),
            from_node: 1,
            to_member: 2,
        }
    }

    /// Echoes each message's group back as its reply, recording batch sizes.
    fn echo(batches: Arc<Mutex<Vec<usize>>>) -> Coalescer {
        Coalescer::spawn(Duration::from_millis(50), move |messages| {
            batches.lock().unwrap().push(messages.len());
            async move {
                Ok(messages
                    .iter()
                    .map(|m| GroupReply {
                        result: Some(group_reply::Result::Payload(
                            m.group.to_le_bytes().to_vec().into(),
                        )),
                    })
                    .collect())
            }
        })
    }

    #[tokio::test(start_paused = true)]
    async fn messages_within_a_window_travel_in_one_batch_and_get_their_own_replies() {
        let batches = Arc::new(Mutex::new(Vec::new()));
        let coalescer = echo(batches.clone());
        let calls = (0..300u64).map(|g| {
            let coalescer = coalescer.clone();
            async move { (g, coalescer.call(message(g)).await.unwrap()) }
        });
        for (group, reply) in futures::future::join_all(calls).await {
            assert_eq!(
                reply.result,
                Some(group_reply::Result::Payload(
                    group.to_le_bytes().to_vec().into()
                ))
            );
        }
        assert_eq!(*batches.lock().unwrap(), vec![300]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_full_batch_goes_at_once_and_later_messages_form_the_next() {
        let batches = Arc::new(Mutex::new(Vec::new()));
        let coalescer = echo(batches.clone());
        let calls = (0..(BATCH_MESSAGES_MAX as u64 + 10)).map(|g| {
            let coalescer = coalescer.clone();
            async move { coalescer.call(message(g)).await.unwrap() }
        });
        futures::future::join_all(calls).await;
        assert_eq!(*batches.lock().unwrap(), vec![BATCH_MESSAGES_MAX, 10]);
        coalescer.call(message(1)).await.unwrap();
        assert_eq!(batches.lock().unwrap().len(), 3);
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_batch_fails_every_message_in_it() {
        let coalescer = Coalescer::spawn(Duration::from_millis(5), |_| async {
            Err::<Vec<GroupReply>, _>("node 2: connection refused".to_string())
        });
        let (a, b) = tokio::join!(coalescer.call(message(1)), coalescer.call(message(2)));
        assert_eq!(a.unwrap_err(), "node 2: connection refused");
        assert_eq!(b.unwrap_err(), "node 2: connection refused");
    }
}
