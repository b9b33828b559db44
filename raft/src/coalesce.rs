//! Heartbeat coalescing: with hundreds of groups per node, each group's leader sends its
//! followers a heartbeat every interval. Sent one by one that is hundreds of RPCs per
//! interval per peer; instead, messages to the same peer that arrive within a short window
//! travel together in one call (`RaftPeer.BatchStream`), and each caller gets its own
//! reply as soon as the peer has it, whatever the batch's other messages wait for.

use std::future::Future;
use std::time::Duration;

use futures::StreamExt;
use futures::stream::BoxStream;
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

/// The replies to one batch as they come: each with its message's place in the batch.
pub type Replies = BoxStream<'static, Result<(usize, GroupReply), String>>;

/// Collects messages for one peer and sends them in batches. Cheap to clone; the batching
/// task ends when every clone is dropped.
#[derive(Clone, Debug)]
pub struct Coalescer {
    tx: mpsc::Sender<(GroupMessage, Waiter)>,
}

impl Coalescer {
    /// Starts the batching task. `send` delivers one batch and returns its replies, one
    /// per message, in any order.
    pub fn spawn<F, Fut>(window: Duration, send: F) -> Coalescer
    where
        F: Fn(Vec<GroupMessage>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Replies, String>> + Send + 'static,
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
                tokio::spawn(async move { deliver(reply.await, waiters).await });
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

/// Hands each reply to its caller as it arrives; when the replies fail or end early, the
/// callers still waiting get the error.
async fn deliver(replies: Result<Replies, String>, waiters: Vec<Waiter>) {
    let count = waiters.len();
    let mut waiters: Vec<Option<Waiter>> = waiters.into_iter().map(Some).collect();
    let mut unanswered = count;
    let error = match replies {
        Err(error) => error,
        Ok(mut replies) => loop {
            match replies.next().await {
                Some(Ok((index, reply))) => match waiters.get_mut(index).and_then(Option::take) {
                    Some(waiter) => {
                        let _ = waiter.send(Ok(reply));
                        unanswered -= 1;
                        if unanswered == 0 {
                            return;
                        }
                    }
                    None => {
                        break format!(
                            "a batch of {count} messages got a second reply, or one for \
                             message {index}"
                        );
                    }
                },
                Some(Err(error)) => break error,
                None => {
                    break format!(
                        "a batch of {count} messages got {} replies",
                        count - unanswered
                    );
                }
            }
        },
    };
    for waiter in waiters.into_iter().flatten() {
        let _ = waiter.send(Err(error.clone()));
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

    fn reply(group: u64) -> GroupReply {
        GroupReply {
            result: Some(group_reply::Result::Payload(
                group.to_le_bytes().to_vec().into(),
            )),
        }
    }

    /// Echoes each message's group back as its reply, last message first, recording batch
    /// sizes.
    fn echo(batches: Arc<Mutex<Vec<usize>>>) -> Coalescer {
        Coalescer::spawn(Duration::from_millis(50), move |messages| {
            batches.lock().unwrap().push(messages.len());
            let replies: Vec<_> = messages
                .iter()
                .enumerate()
                .rev()
                .map(|(index, m)| Ok((index, reply(m.group))))
                .collect();
            async move { Ok(futures::stream::iter(replies).boxed()) }
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

    /// A message whose group answers late holds up no other message's reply.
    #[tokio::test(start_paused = true)]
    async fn each_reply_reaches_its_caller_as_soon_as_it_arrives() {
        let coalescer = Coalescer::spawn(Duration::from_millis(5), |messages| {
            // Answered in the order they finish, as a peer's BatchStream does.
            let replies: futures::stream::FuturesUnordered<_> = messages
                .into_iter()
                .enumerate()
                .map(|(index, m)| async move {
                    if m.group == 1 {
                        tokio::time::sleep(Duration::from_secs(1)).await;
                    }
                    Ok((index, reply(m.group)))
                })
                .collect();
            let replies = replies.boxed();
            async move { Ok(replies) }
        });
        let slow = tokio::spawn({
            let coalescer = coalescer.clone();
            async move { coalescer.call(message(1)).await }
        });
        tokio::task::yield_now().await;
        let started = tokio::time::Instant::now();
        let fast = coalescer.call(message(2)).await.unwrap();
        assert_eq!(fast, reply(2));
        assert!(
            started.elapsed() < Duration::from_millis(100),
            "the fast reply waited {:?}",
            started.elapsed()
        );
        assert!(!slow.is_finished());
        assert_eq!(slow.await.unwrap().unwrap(), reply(1));
    }

    #[tokio::test(start_paused = true)]
    async fn a_batch_whose_replies_end_early_fails_the_messages_left() {
        let coalescer = Coalescer::spawn(Duration::from_millis(5), |messages| {
            let first = messages.first().map(|m| Ok((0, reply(m.group))));
            async move { Ok(futures::stream::iter(first).boxed()) }
        });
        let (a, b) = tokio::join!(coalescer.call(message(1)), coalescer.call(message(2)));
        assert_eq!(a.unwrap(), reply(1));
        assert_eq!(b.unwrap_err(), "a batch of 2 messages got 1 replies");
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_batch_fails_every_message_in_it() {
        let coalescer = Coalescer::spawn(Duration::from_millis(5), |_| async {
            Err::<Replies, _>("node 2: connection refused".to_string())
        });
        let (a, b) = tokio::join!(coalescer.call(message(1)), coalescer.call(message(2)));
        assert_eq!(a.unwrap_err(), "node 2: connection refused");
        assert_eq!(b.unwrap_err(), "node 2: connection refused");
    }
}
