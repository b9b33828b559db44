//! Hub links: publishing on sender links (WIRE-PROTOCOLS A8) and consuming on receiver links
//! (A9).
//!
//! Neither waits in the frame loop, which keeps reading frames and sending heartbeats:
//! - A complete delivery is handed to [`Backend::send`](super::Backend::send) at once, in
//!   arrival order, and the future is kept in `Connection::sends`; the loop settles the
//!   delivery when it resolves (accepted, or rejected with the backend's condition).
//!   Pending sends are bounded per link and per connection: the credit we grant never
//!   exceeds the room left, and a delivery beyond it (pyamqp's over-credit sends) is
//!   rejected with `com.microsoft:server-busy`.
//! - A receiver's reader is opened by a future in `Connection::opening`; its stream is then
//!   polled by the loop only while the link has credit for more than is queued (or nothing
//!   is queued), so a slow client slows its reader and at most one batch waits beyond the
//!   credit.

use std::collections::HashMap;
use std::task::{Context, Poll};

use bytes::Bytes;
use futures::future::BoxFuture;
use futures::stream::FuturesUnordered;

use super::backend::{
    BackendError, EventBatch, EventStream, ReadRequest, Right, SendOutcome, SendTarget, TokenGrant,
};
use super::connection::Connection;
use super::event::{delivered_message, publication};
use super::links::link_flow;
use super::metrics;
use super::session::{Dropped, HubLink, LinkKind, Partial, Session};
use crate::delivery_state::{AmqpError, DeliveryState, condition};
use crate::ids::{Channel, Handle};

/// What a hub link serves, from its address and attach.
pub(crate) enum HubRoute {
    Publish {
        hub: String,
        partition: Option<String>,
    },
    Consume {
        request: ReadRequest,
        runtime_metric: bool,
    },
}

/// Sends handed to the backend and not yet answered.
pub(crate) type PendingSends = FuturesUnordered<BoxFuture<'static, SendDone>>;
/// Readers the backend is opening.
pub(crate) type OpeningReads = FuturesUnordered<BoxFuture<'static, ReadOpened>>;

/// A send the backend answered.
pub(crate) struct SendDone {
    channel: Channel,
    handle: Handle,
    link_id: u64,
    /// The delivery to settle; `None` when the client sent it settled.
    delivery_id: Option<u32>,
    /// The delivery's bytes, counted in the connection's buffers until now.
    bytes: usize,
    result: Result<SendOutcome, BackendError>,
}

/// A reader the backend opened, or why not.
pub(crate) struct ReadOpened {
    channel: Channel,
    handle: Handle,
    link_id: u64,
    result: Result<EventStream, BackendError>,
}

/// The next step of an open reader's stream (`None`: it ended).
pub(crate) struct ReadReady {
    channel: Channel,
    handle: Handle,
    batch: Option<EventBatch>,
}

impl Connection {
    /// The state of a new hub link; a receiver's reader starts opening.
    pub(crate) fn open_hub_link(
        &mut self,
        channel: Channel,
        handle: Handle,
        link_id: u64,
        route: HubRoute,
        grant: &TokenGrant,
    ) -> HubLink {
        match route {
            HubRoute::Publish { hub, partition } => HubLink::Publish {
                hub,
                partition,
                pending_sends: 0,
            },
            HubRoute::Consume {
                request,
                runtime_metric,
            } => {
                let opening = self.backend.read(grant, request);
                self.opening.push(Box::pin(async move {
                    ReadOpened {
                        channel,
                        handle,
                        link_id,
                        result: opening.await,
                    }
                }));
                HubLink::Consume {
                    runtime_metric,
                    stream: None,
                }
            }
        }
    }

    /// The credit a publish link with `pending_sends` may have: what fits the bounds on
    /// pending sends, and none while the connection's buffers could not take a message of
    /// max-message-size.
    pub(crate) fn publish_credit(&self, pending_sends: usize) -> u32 {
        let buffered_after = self.buffered_bytes as u64 + self.limits.max_message_size_bytes;
        if buffered_after > self.limits.buffered_bytes_max as u64 {
            return 0;
        }
        let link_room = self
            .limits
            .pending_sends_per_link_max
            .saturating_sub(pending_sends);
        let connection_room = self
            .limits
            .pending_sends_max
            .saturating_sub(self.sends.len());
        u32::try_from(link_room.min(connection_room))
            .unwrap_or(u32::MAX)
            .min(self.limits.sender_link_credit)
    }

    /// Grants a publish link credit again once half of a full grant is used, as far as the
    /// bounds allow.
    pub(crate) fn replenish_publish_credit(&mut self, channel: Channel, handle: Handle) {
        let window = self.limits.session_window_frames;
        let Some(link) = self
            .sessions
            .get(&channel)
            .and_then(|session| session.links.get(&handle))
        else {
            return;
        };
        let Some(HubLink::Publish { pending_sends, .. }) = &link.hub else {
            return;
        };
        if link.credit > self.limits.sender_link_credit / 2 {
            return;
        }
        let credit = self.publish_credit(*pending_sends);
        if credit <= link.credit {
            if link.credit == 0 {
                self.publish_credit_starved = true;
            }
            return;
        }
        let Some(session) = self.sessions.get_mut(&channel) else {
            return;
        };
        let Some(link) = session.links.get_mut(&handle) else {
            return;
        };
        link.credit = credit;
        let flow = link_flow(session, handle, &session.links[&handle], window, false);
        self.send(channel, flow.into(), &[]);
    }

    /// A complete delivery on a publish link: handed to the backend, or rejected at once.
    pub(crate) fn publish(&mut self, channel: Channel, handle: Handle, partial: Partial) {
        let delivery_id = partial.delivery_id.filter(|_| !partial.settled);
        let bytes = partial.bytes.len();
        match self.start_send(channel, handle, partial) {
            Ok((link_id, send)) => {
                metrics::transfers("in", 1);
                self.buffered_bytes += bytes;
                self.sends.push(Box::pin(async move {
                    SendDone {
                        channel,
                        handle,
                        link_id,
                        delivery_id,
                        bytes,
                        result: send.await,
                    }
                }));
            }
            Err(error) => {
                metrics::error_sent(error.condition.as_str());
                tracing::debug!(handle = handle.0, condition = %error.condition, description = ?error.description, "rejecting a published delivery");
                if let Some(id) = delivery_id {
                    let state = DeliveryState::Rejected { error: Some(error) };
                    self.settle(channel, id, state);
                }
            }
        }
    }

    /// Checks a delivery and calls the backend: the future of the send, with the link's id.
    fn start_send(
        &mut self,
        channel: Channel,
        handle: Handle,
        partial: Partial,
    ) -> Result<(u64, BoxFuture<'static, Result<SendOutcome, BackendError>>), AmqpError> {
        let max_message_size_bytes = self.limits.max_message_size_bytes;
        match partial.dropped {
            Some(Dropped::TooLarge) => {
                return Err(AmqpError::new(
                    condition::MESSAGE_SIZE_EXCEEDED,
                    format!(
                        "the delivery is larger than max-message-size {max_message_size_bytes}"
                    ),
                ));
            }
            Some(Dropped::BuffersFull) => return Err(server_busy()),
            None => {}
        }
        let bytes = partial.bytes.len();
        let published = publication(Bytes::from(partial.bytes), partial.message_format)?;
        let now = self.backend.now_unix_ms();
        let over_bounds = self.sends.len() >= self.limits.pending_sends_max
            || self.buffered_bytes + bytes > self.limits.buffered_bytes_max;
        let pending_sends_per_link_max = self.limits.pending_sends_per_link_max;
        let link = self
            .sessions
            .get_mut(&channel)
            .and_then(|session| session.links.get_mut(&handle));
        let Some(link) = link else {
            return Err(AmqpError::new(condition::NOT_FOUND, "the link is gone"));
        };
        let (
            Some(HubLink::Publish {
                hub,
                partition,
                pending_sends,
            }),
            Some(authorization),
        ) = (&mut link.hub, &link.authorization)
        else {
            return Err(AmqpError::new(
                condition::NOT_FOUND,
                "the link no longer publishes",
            ));
        };
        let target = match (partition.as_ref(), published.partition_key) {
            (Some(partition), Some(key)) => {
                return Err(AmqpError::new(
                    condition::ARGUMENT_ERROR,
                    format!(
                        "the partition key '{key}' cannot be used on a link to partition \
                         {partition}: a key and a partition are exclusive"
                    ),
                ));
            }
            (Some(partition), None) => SendTarget::PartitionId(partition.clone()),
            (None, Some(key)) => SendTarget::PartitionKey(key),
            (None, None) => SendTarget::RoundRobin,
        };
        let Some((_, grant)) = self
            .grants
            .covering(&authorization.link_path, Right::Send, now)
        else {
            return Err(AmqpError::new(
                condition::UNAUTHORIZED_ACCESS,
                format!(
                    "the token authorizing the link to '{}' has expired; put a new one on $cbs",
                    authorization.link_path
                ),
            ));
        };
        if over_bounds || *pending_sends >= pending_sends_per_link_max {
            return Err(server_busy());
        }
        *pending_sends += 1;
        let send = self.backend.send(grant, hub, target, published.events);
        Ok((link.id, send))
    }

    /// A send resolved: settle its delivery (unless the client pre-settled it or the link is
    /// gone) and grant the credit its room frees.
    pub(crate) fn send_done(&mut self, done: SendDone) {
        self.buffered_bytes -= done.bytes;
        let link = self
            .sessions
            .get_mut(&done.channel)
            .and_then(|session| session.links.get_mut(&done.handle))
            .filter(|link| link.id == done.link_id);
        let live = match link.and_then(|link| link.hub.as_mut()) {
            Some(HubLink::Publish { pending_sends, .. }) => {
                *pending_sends = pending_sends.saturating_sub(1);
                true
            }
            _ => false,
        };
        let state = match done.result {
            Ok(outcome) => {
                tracing::trace!(partition = %outcome.partition_id, first_sequence_number = outcome.first_sequence_number.0, "a send committed");
                DeliveryState::Accepted
            }
            Err(error) => {
                metrics::error_sent(error.kind.condition());
                tracing::debug!(%error, "the backend refused a send");
                DeliveryState::Rejected {
                    error: Some(error.to_amqp_error()),
                }
            }
        };
        if let (true, Some(id)) = (live, done.delivery_id) {
            self.settle(done.channel, id, state);
        }
        if live {
            self.replenish_publish_credit(done.channel, done.handle);
        }
        // When the connection's bounds held other links' credit down, they get it back.
        let connection_room = self
            .limits
            .pending_sends_max
            .saturating_sub(self.sends.len());
        if connection_room <= self.limits.sender_link_credit as usize + 1
            || self.publish_credit(0) == 0
        {
            self.replenish_all_publish_credit();
        } else {
            self.replenish_starved_publish_credit();
        }
    }

    /// Retries the links the connection's bounds left without credit, once room is freed:
    /// a link with no credit and no send of its own pending has nothing else to wake it,
    /// and its client would wait for credit forever.
    pub(crate) fn replenish_starved_publish_credit(&mut self) {
        if self.publish_credit_starved {
            self.replenish_all_publish_credit();
        }
    }

    fn replenish_all_publish_credit(&mut self) {
        // Each link still held down sets the flag again.
        self.publish_credit_starved = false;
        for (channel, handle) in self.links_of(LinkKind::Publish) {
            self.replenish_publish_credit(channel, handle);
        }
    }

    /// A reader opened: the link starts consuming, or is detached with the backend's reason
    /// (not found, owner level, reader quota, position out of range).
    pub(crate) fn read_opened(&mut self, opened: ReadOpened) {
        let link = self
            .sessions
            .get_mut(&opened.channel)
            .and_then(|session| session.links.get_mut(&opened.handle))
            .filter(|link| link.id == opened.link_id);
        // A link detached meanwhile drops the stream, which releases the reader.
        let Some(link) = link else {
            return;
        };
        let Some(HubLink::Consume { stream, .. }) = &mut link.hub else {
            return;
        };
        match opened.result {
            Ok(opened) => *stream = Some(opened),
            Err(error) => {
                tracing::debug!(name = %link.name, %error, "the backend refused a reader");
                self.send_detach(opened.channel, opened.handle, error.to_amqp_error());
            }
        }
    }

    /// Events arrived on a reader: queued as messages and sent as credit allows. A stream
    /// that ends detaches its link with its error.
    pub(crate) fn read_ready(&mut self, ready: ReadReady) {
        let now = self.backend.now_unix_ms();
        let Some(link) = self
            .sessions
            .get_mut(&ready.channel)
            .and_then(|session| session.links.get_mut(&ready.handle))
        else {
            return;
        };
        let runtime_metric = match &link.hub {
            Some(HubLink::Consume { runtime_metric, .. }) => *runtime_metric,
            _ => return,
        };
        let error = match ready.batch {
            Some(Ok(events)) => {
                metrics::transfers("out", events.len());
                for event in &events {
                    let message = delivered_message(event, runtime_metric.then_some(now));
                    let bytes = message.to_bytes();
                    self.buffered_bytes += bytes.len();
                    link.queue.push_back(bytes);
                }
                self.pump(ready.channel);
                return;
            }
            Some(Err(error)) => error.to_amqp_error(),
            None => AmqpError::new(
                condition::LINK_DETACH_FORCED,
                "the partition's reader ended (the partition moved or the node is stopping); \
                 attach again",
            ),
        };
        tracing::debug!(name = %link.name, condition = %error.condition, "a reader ended");
        self.send_detach(ready.channel, ready.handle, error);
    }

    /// The links of one kind, by channel and handle.
    fn links_of(&self, kind: LinkKind) -> Vec<(Channel, Handle)> {
        self.sessions
            .iter()
            .flat_map(|(channel, session)| {
                session
                    .links
                    .iter()
                    .filter(move |(_, link)| link.kind == kind)
                    .map(move |(handle, _)| (*channel, *handle))
            })
            .collect()
    }
}

fn server_busy() -> AmqpError {
    AmqpError::new(
        condition::SERVER_BUSY,
        "too many sends on this connection await their commit; retry shortly",
    )
}

/// Polls the readers whose links have credit for more than they have queued (at most
/// `queue_max` messages queued per link, and one batch when the link has no credit);
/// every ready one is returned, so a busy reader cannot starve the others.
pub(crate) fn poll_readers(
    sessions: &mut HashMap<Channel, Session>,
    queue_max: usize,
    cx: &mut Context<'_>,
) -> Poll<Vec<ReadReady>> {
    let mut ready = Vec::new();
    for (channel, session) in sessions.iter_mut() {
        for (handle, link) in session.links.iter_mut() {
            // One batch is taken even without credit, so a reader's end (a stolen link) is
            // seen while the client gives none.
            let wanted = (link.credit as usize).min(queue_max).max(1);
            if link.queue.len() >= wanted {
                continue;
            }
            if let Some(HubLink::Consume {
                stream: Some(stream),
                ..
            }) = &mut link.hub
                && let Poll::Ready(batch) = stream.poll_next(cx)
            {
                ready.push(ReadReady {
                    channel: *channel,
                    handle: *handle,
                    batch,
                });
            }
        }
    }
    if ready.is_empty() {
        Poll::Pending
    } else {
        Poll::Ready(ready)
    }
}
