//! Links: attach routing, detach, flow control, incoming requests and outgoing replies.
//!
//! `$cbs` and `$management` come as pairs: the client sends requests on one link and
//! receives replies on the other. Hub and partition links are routed and authorized against
//! the connection's CBS grants here, and served in `hub_links.rs`.

use bytes::Bytes;

use super::address::{Address, parse_address};
use super::backend::{ReadRequest, Right, TokenGrant};
use super::connection::{Connection, HANDLE_IN_USE, ILLEGAL_STATE, UNATTACHED_HANDLE, instant_at};
use super::error::ConnectionError;
use super::grants::LinkAuthorization;
use super::hub_links::HubRoute;
use super::metrics;
use super::position::{StartPosition, parse_selector};
use super::requests::{self, RequestContext};
use super::session::{Dropped, Link, LinkKind, Partial, Session};
use crate::delivery_state::{AmqpError, DeliveryState, condition};
use crate::frame::{FRAME_HEADER_BYTES, write_performative};
use crate::ids::{Channel, DeliveryNumber, Handle, TransferNumber};
use crate::link::{
    Attach, Detach, Disposition, Flow, ReceiverSettleMode, Role, SenderSettleMode, Transfer,
};
use crate::message::Message;
use crate::performative::Performative;
use crate::terminus::Source;
use crate::types::Value;

impl Connection {
    pub(crate) fn attach(
        &mut self,
        channel: Channel,
        attach: Attach,
    ) -> Result<(), ConnectionError> {
        let handle_max = self.limits.handle_max();
        let links_max = self.limits.links_per_session_max as usize;
        let session = self.session_mut(channel, "attach")?;
        if session.ending {
            return Ok(());
        }
        if session.links.contains_key(&attach.handle) {
            return Err(ConnectionError::protocol(
                HANDLE_IN_USE,
                format!("attach on handle {}, which has a link", attach.handle.0),
            ));
        }
        let full = attach.handle.0 > handle_max || session.open_links() >= links_max;
        let route = if full {
            Err(AmqpError::new(
                condition::RESOURCE_LIMIT_EXCEEDED,
                format!("a session holds at most {links_max} links, handles 0 to {handle_max}"),
            ))
        } else {
            self.route(&attach)
        };
        let kind = route.as_ref().map_or(LinkKind::Refused, |route| route.kind);
        let mut reply = reply_attach(&attach, self.limits.max_message_size_bytes);
        if let Ok(Route {
            hub:
                Some((
                    HubRoute::Consume {
                        runtime_metric: true,
                        ..
                    },
                    ..,
                )),
            ..
        }) = &route
        {
            reply
                .offered_capabilities
                .push(RUNTIME_METRIC_CAPABILITY.into());
        }
        self.send(channel, reply.into(), &[]);
        let target_address = attach.target.as_ref().and_then(|t| t.address.clone());
        let id = self.next_link_id;
        self.next_link_id += 1;
        let mut link = Link::new(id, attach.name, kind, target_address);
        match route {
            Err(error) => {
                tracing::debug!(name = %link.name, condition = %error.condition, description = ?error.description, "refusing an AMQP link");
                self.send_detach(channel, attach.handle, error);
            }
            Ok(route) => {
                if let Some(label) = kind.metric_label() {
                    metrics::link_attached(label);
                }
                if let Some((hub_route, authorization, grant)) = route.hub {
                    link.authorization = Some(authorization);
                    link.hub =
                        Some(self.open_hub_link(channel, attach.handle, id, hub_route, &grant));
                }
                if kind.we_receive() {
                    link.credit = match kind {
                        LinkKind::Publish => self.publish_credit(0),
                        _ => self.limits.request_link_credit,
                    };
                    let window = self.limits.session_window_frames;
                    let session = self.session_mut(channel, "attach")?;
                    let flow = link_flow(session, attach.handle, &link, window, false);
                    self.send(channel, flow.into(), &[]);
                }
            }
        }
        // Only handles up to handle-max are kept, which bounds the map; a client detaching a
        // link refused above it gets no answer.
        if attach.handle.0 <= handle_max {
            self.session_mut(channel, "attach")?
                .links
                .insert(attach.handle, link);
        }
        Ok(())
    }

    /// What an attach is for, or why it is refused.
    fn route(&self, attach: &Attach) -> Result<Route, AmqpError> {
        let client_sends = attach.role == Role::Sender;
        let address = if client_sends {
            attach.target.as_ref().and_then(|t| t.address.as_deref())
        } else {
            attach.source.as_ref().and_then(|s| s.address.as_deref())
        };
        let Some(address) = address else {
            return Err(AmqpError::new(
                condition::NOT_FOUND,
                "the attach has no address (a sender names its target, a receiver its source)",
            ));
        };
        let address = parse_address(address)
            .map_err(|error| AmqpError::new(condition::NOT_FOUND, error.to_string()))?;
        let path = address.entity_path();
        let (right, hub_route) = match (address, client_sends) {
            (Address::Cbs, true) => return Ok(Route::plain(LinkKind::CbsRequests)),
            (Address::Cbs, false) => return Ok(Route::plain(LinkKind::CbsReplies)),
            (Address::Management, true) => return Ok(Route::plain(LinkKind::ManagementRequests)),
            (Address::Management, false) => return Ok(Route::plain(LinkKind::ManagementReplies)),
            (Address::Hub { hub }, true) => (
                Right::Send,
                HubRoute::Publish {
                    hub,
                    partition: None,
                },
            ),
            (Address::Partition { hub, partition }, true) => (
                Right::Send,
                HubRoute::Publish {
                    hub,
                    partition: Some(partition),
                },
            ),
            (
                Address::ConsumerGroupPartition {
                    hub,
                    consumer_group,
                    partition,
                },
                false,
            ) => (
                Right::Listen,
                consume_route(attach, hub, consumer_group, partition)?,
            ),
            (_, true) => {
                return Err(AmqpError::new(
                    condition::ARGUMENT_ERROR,
                    "send to <hub> or <hub>/Partitions/<id>, not to a consumer group",
                ));
            }
            (_, false) => {
                return Err(AmqpError::new(
                    condition::ARGUMENT_ERROR,
                    "receive from <hub>/ConsumerGroups/<group>/Partitions/<id>",
                ));
            }
        };
        let now = self.backend.now_unix_ms();
        let Some((audience_path, grant)) = self.grants.covering(&path, right, now) else {
            return Err(AmqpError::new(
                condition::UNAUTHORIZED_ACCESS,
                format!(
                    "no token on this connection grants {right:?} on '{path}'; put one on $cbs first"
                ),
            ));
        };
        let authorization = LinkAuthorization {
            link_path: path.clone(),
            right,
            audience_path: audience_path.to_owned(),
        };
        let kind = match hub_route {
            HubRoute::Publish { .. } => LinkKind::Publish,
            HubRoute::Consume { .. } => LinkKind::Consume,
        };
        Ok(Route {
            kind,
            hub: Some((hub_route, authorization, grant.clone())),
        })
    }

    pub(crate) fn detach(
        &mut self,
        channel: Channel,
        detach: Detach,
    ) -> Result<(), ConnectionError> {
        let session = self.session_mut(channel, "detach")?;
        let Some(mut link) = session.links.remove(&detach.handle) else {
            tracing::debug!(handle = detach.handle.0, "detach for a link that is gone");
            return Ok(());
        };
        if let Some(error) = &detach.error {
            tracing::info!(name = %link.name, condition = %error.condition, "the AMQP client detached a link with an error");
        }
        let we_detached = link.kind == LinkKind::Refused;
        forget(&mut link, &mut self.buffered_bytes);
        if !we_detached {
            let reply = Detach {
                handle: detach.handle,
                closed: detach.closed,
                error: None,
            };
            self.send(channel, reply.into(), &[]);
        }
        Ok(())
    }

    /// Detaches a link with an error and keeps it until the client's detach.
    pub(crate) fn send_detach(&mut self, channel: Channel, handle: Handle, error: AmqpError) {
        metrics::error_sent(error.condition.as_str());
        let detach = Detach {
            handle,
            closed: true,
            error: Some(error),
        };
        self.send(channel, detach.into(), &[]);
        if let Some(link) = self
            .sessions
            .get_mut(&channel)
            .and_then(|s| s.links.get_mut(&handle))
        {
            forget(link, &mut self.buffered_bytes);
        }
    }

    /// The client's flow: its session window and, with a handle, a link's credit.
    pub(crate) fn flow(&mut self, channel: Channel, flow: Flow) -> Result<(), ConnectionError> {
        let window = self.limits.session_window_frames;
        let session = self.session_mut(channel, "flow")?;
        session.update_remote_window(flow.next_incoming_id.map(|n| n.0), flow.incoming_window);
        let Some(handle) = flow.handle else {
            if flow.echo {
                let reply = session_flow(session, window);
                self.send(channel, reply.into(), &[]);
            }
            self.pump(channel);
            return Ok(());
        };
        let Some(link) = session.links.get_mut(&handle) else {
            tracing::debug!(handle = handle.0, "flow for a link that is gone");
            return Ok(());
        };
        let we_send = !link.kind.we_receive() && link.kind != LinkKind::Refused;
        if we_send {
            link.update_send_credit(flow.delivery_count, flow.link_credit.unwrap_or(0));
        }
        self.pump(channel);
        let Some(session) = self.sessions.get_mut(&channel) else {
            return Ok(());
        };
        let Some(link) = session.links.get_mut(&handle) else {
            return Ok(());
        };
        let drained = we_send && flow.drain && link.queue.is_empty() && link.credit > 0;
        if drained {
            // Nothing to send: use up the credit, as drain asks (part 2 §2.6.7).
            link.delivery_count = link.delivery_count.wrapping_add(link.credit);
            link.credit = 0;
        }
        if drained || flow.echo {
            let link = &session.links[&handle];
            let reply = link_flow(session, handle, link, window, flow.drain);
            self.send(channel, reply.into(), &[]);
        }
        Ok(())
    }

    /// A transfer frame: reassembled into a request, which is answered on its reply link.
    pub(crate) async fn transfer(
        &mut self,
        channel: Channel,
        transfer: Transfer,
        payload: Bytes,
    ) -> Result<(), ConnectionError> {
        let window = self.limits.session_window_frames;
        let max_message_size_bytes = self.limits.max_message_size_bytes;
        let buffered_bytes_max = self.limits.buffered_bytes_max;
        let session = self.session_mut(channel, "transfer")?;
        session.next_incoming_id = session.next_incoming_id.wrapping_add(1);
        session.incoming_window = session.incoming_window.saturating_sub(1);
        if session.incoming_window < window / 2 {
            session.incoming_window = window;
            let reply = session_flow(session, window);
            self.send(channel, reply.into(), &[]);
        }
        let handle = transfer.handle;
        let Some(session) = self.sessions.get_mut(&channel) else {
            return Ok(());
        };
        let Some(link) = session.links.get_mut(&handle) else {
            return Err(ConnectionError::protocol(
                UNATTACHED_HANDLE,
                format!("transfer on handle {}, which has no link", handle.0),
            ));
        };
        match link.kind {
            LinkKind::Refused => return Ok(()),
            kind if !kind.we_receive() => {
                return Err(ConnectionError::protocol(
                    ILLEGAL_STATE,
                    format!("transfer on handle {}, where the client receives", handle.0),
                ));
            }
            _ => {}
        }
        if transfer.aborted {
            forget_partial(link, &mut self.buffered_bytes);
            return Ok(());
        }
        let partial = link.partial.get_or_insert_with(|| Partial {
            bytes: Vec::new(),
            delivery_id: transfer.delivery_id.map(|id| id.0),
            settled: transfer.settled.unwrap_or(false),
            message_format: transfer.message_format.unwrap_or(0),
            dropped: None,
        });
        let message_bytes = partial.bytes.len() + payload.len();
        let publish = link.kind == LinkKind::Publish;
        let too_large = message_bytes as u64 > max_message_size_bytes;
        let buffers_full = self.buffered_bytes + payload.len() > buffered_bytes_max;
        if partial.dropped.is_some() {
            // Dropped as it arrives; rejected when complete.
        } else if publish && (too_large || buffers_full) {
            self.buffered_bytes -= partial.bytes.len();
            partial.bytes = Vec::new();
            partial.dropped = Some(if too_large {
                Dropped::TooLarge
            } else {
                Dropped::BuffersFull
            });
        } else if too_large {
            let error = AmqpError::new(
                condition::MESSAGE_SIZE_EXCEEDED,
                format!(
                    "a message of {message_bytes}+ bytes exceeds max-message-size {max_message_size_bytes}"
                ),
            );
            self.send_detach(channel, handle, error);
            return Ok(());
        } else if buffers_full {
            return Err(ConnectionError::protocol(
                condition::RESOURCE_LIMIT_EXCEEDED,
                format!("the connection buffers more than {buffered_bytes_max} bytes of messages"),
            ));
        } else {
            partial.bytes.extend_from_slice(&payload);
            self.buffered_bytes += payload.len();
        }
        if transfer.more {
            return Ok(());
        }
        let Some(partial) = link.partial.take() else {
            return Ok(());
        };
        self.buffered_bytes -= partial.bytes.len();
        link.delivery_count = link.delivery_count.wrapping_add(1);
        link.credit = link.credit.saturating_sub(1);
        let kind = link.kind;
        if kind == LinkKind::Publish {
            self.publish(channel, handle, partial);
            self.replenish_publish_credit(channel, handle);
        } else {
            self.deliver(channel, handle, kind, partial).await;
            self.replenish_credit(channel, handle);
        }
        Ok(())
    }

    /// Settles a complete request, answers it and queues the reply.
    async fn deliver(
        &mut self,
        channel: Channel,
        handle: Handle,
        kind: LinkKind,
        partial: Partial,
    ) {
        let request = Message::decode(Bytes::from(partial.bytes));
        if let (false, Some(id)) = (partial.settled, partial.delivery_id) {
            let state = match &request {
                Ok(_) => DeliveryState::Accepted,
                Err(error) => DeliveryState::Rejected {
                    error: Some(AmqpError::new(condition::DECODE_ERROR, error.to_string())),
                },
            };
            self.settle(channel, id, state);
        }
        let request = match request {
            Ok(request) => request,
            Err(error) => {
                metrics::error_sent(condition::DECODE_ERROR);
                tracing::info!(%error, handle = handle.0, "an undecodable request message");
                return;
            }
        };
        let context = RequestContext {
            backend: &*self.backend,
            grants: &mut self.grants,
            grants_max: self.limits.grants_max,
            hostname: &self.hostname,
        };
        let reply = match kind {
            LinkKind::CbsRequests => requests::put_token(context, &request).await,
            LinkKind::ManagementRequests => requests::read(context, &request).await,
            _ => return,
        };
        self.queue_reply(channel, kind, &request, reply);
    }

    /// Settles a delivery the client sent unsettled (pyamqp ignores unsettled dispositions).
    pub(crate) fn settle(&mut self, channel: Channel, delivery_id: u32, state: DeliveryState) {
        let disposition = Disposition {
            role: Role::Receiver,
            first: DeliveryNumber(delivery_id),
            last: None,
            settled: true,
            state: Some(state),
            batchable: false,
        };
        self.send(channel, disposition.into(), &[]);
    }

    /// Queues a reply on the session's reply link: the one whose target is the request's
    /// reply-to, else the one of the request's kind.
    fn queue_reply(&mut self, channel: Channel, kind: LinkKind, request: &Message, reply: Message) {
        let queue_max = self.limits.link_queue_max;
        let buffered_bytes_max = self.limits.buffered_bytes_max;
        let Some(session) = self.sessions.get_mut(&channel) else {
            return;
        };
        let reply_to = request
            .properties
            .as_ref()
            .and_then(|p| p.reply_to.as_deref());
        let by_reply_to = reply_to.and_then(|reply_to| {
            session
                .links
                .iter_mut()
                .find(|(_, l)| l.reply_to_matches(reply_to))
        });
        let link = match by_reply_to {
            Some((_, link)) => Some(link),
            None => session
                .links
                .values_mut()
                .find(|l| Some(l.kind) == kind.reply_kind()),
        };
        let Some(link) = link else {
            tracing::info!(
                ?reply_to,
                "a request arrived without a reply link on its session; the reply is dropped"
            );
            return;
        };
        let bytes = reply.to_bytes();
        if link.queue.len() >= queue_max || self.buffered_bytes + bytes.len() > buffered_bytes_max {
            metrics::error_sent(condition::RESOURCE_LIMIT_EXCEEDED);
            tracing::warn!(name = %link.name, "the client gives no credit for replies; a reply is dropped");
            return;
        }
        self.buffered_bytes += bytes.len();
        link.queue.push_back(bytes);
        self.pump(channel);
    }

    /// Grants a request link its credit again once half is used, unless replies pile up on
    /// the session (the client does not read them): that is the backpressure on requests.
    fn replenish_credit(&mut self, channel: Channel, handle: Handle) {
        let full = self.limits.request_link_credit;
        let queue_max = self.limits.link_queue_max;
        let window = self.limits.session_window_frames;
        let Some(session) = self.sessions.get_mut(&channel) else {
            return;
        };
        let backlog = session
            .links
            .values()
            .map(|l| l.queue.len())
            .max()
            .unwrap_or(0);
        let Some(link) = session.links.get_mut(&handle) else {
            return;
        };
        if link.kind == LinkKind::Refused || link.credit > full / 2 || backlog >= queue_max / 2 {
            return;
        }
        link.credit = full;
        let link = &session.links[&handle];
        let flow = link_flow(session, handle, link, window, false);
        self.send(channel, flow.into(), &[]);
    }

    /// Sends queued replies while the client's link credit and session window allow.
    pub(crate) fn pump(&mut self, channel: Channel) {
        let peer_max = self.peer_max_frame_size_bytes;
        let Some(session) = self.sessions.get_mut(&channel) else {
            return;
        };
        let Session {
            links,
            remote_incoming_window,
            next_outgoing_id,
            next_delivery_id,
            ..
        } = session;
        let mut freed = 0;
        for (handle, link) in links.iter_mut() {
            while link.credit > 0 && *remote_incoming_window > 0 {
                let Some(message) = link.queue.pop_front() else {
                    break;
                };
                freed += message.len();
                let delivery = Delivery {
                    channel,
                    handle: *handle,
                    delivery_id: *next_delivery_id,
                    tag: link.next_tag,
                    peer_max_frame_size_bytes: peer_max,
                };
                let frames = delivery.write(&mut self.out, &message);
                *next_delivery_id = next_delivery_id.wrapping_add(1);
                link.next_tag += 1;
                link.credit -= 1;
                link.delivery_count = link.delivery_count.wrapping_add(1);
                *next_outgoing_id = next_outgoing_id.wrapping_add(frames);
                *remote_incoming_window = remote_incoming_window.saturating_sub(frames);
            }
        }
        self.buffered_bytes -= freed;
        if freed > 0 {
            self.replenish_starved_publish_credit();
        }
    }

    /// When the first grant that authorizes a link expires, on tokio's clock.
    pub(crate) fn next_link_expiry(&self) -> Option<tokio::time::Instant> {
        let earliest = self
            .sessions
            .values()
            .flat_map(|s| s.links.values())
            .filter_map(|l| l.authorization.as_ref())
            .map(|a| a.deadline_unix_ms(&self.grants))
            .min()?;
        Some(instant_at(self.backend.now_unix_ms(), earliest))
    }

    /// Detaches, with `amqp:unauthorized-access`, every link no live grant covers any more.
    pub(crate) fn expire_links(&mut self) {
        let now = self.backend.now_unix_ms();
        let mut expired = Vec::new();
        for (channel, session) in &mut self.sessions {
            for (handle, link) in &mut session.links {
                if let Some(authorization) = &mut link.authorization
                    && !authorization.renew(&self.grants, now)
                {
                    expired.push((*channel, *handle, authorization.link_path.clone()));
                }
            }
        }
        for (channel, handle, path) in expired {
            let error = AmqpError::new(
                condition::UNAUTHORIZED_ACCESS,
                format!(
                    "the token authorizing the link to '{path}' has expired; put a new one on $cbs"
                ),
            );
            self.send_detach(channel, handle, error);
        }
    }

    pub(crate) fn forget_link(&mut self, link: &Link) {
        let bytes = link.partial.as_ref().map_or(0, |p| p.bytes.len())
            + link.queue.iter().map(Bytes::len).sum::<usize>();
        self.buffered_bytes -= bytes;
        if bytes > 0 {
            self.replenish_starved_publish_credit();
        }
        if let Some(label) = link.kind.metric_label() {
            metrics::link_detached(label);
        }
    }
}

impl Link {
    fn reply_to_matches(&self, reply_to: &str) -> bool {
        matches!(
            self.kind,
            LinkKind::CbsReplies | LinkKind::ManagementReplies
        ) && self.target_address.as_deref() == Some(reply_to)
    }
}

/// Frees what a link holds, uncounts it and marks it refused (we detached it or it is gone).
fn forget(link: &mut Link, buffered_bytes: &mut usize) {
    forget_partial(link, buffered_bytes);
    *buffered_bytes -= link.queue.drain(..).map(|m| m.len()).sum::<usize>();
    if let Some(label) = link.kind.metric_label() {
        metrics::link_detached(label);
    }
    link.kind = LinkKind::Refused;
    link.authorization = None;
    // Dropping a reader's stream releases it in the backend.
    link.hub = None;
}

fn forget_partial(link: &mut Link, buffered_bytes: &mut usize) {
    if let Some(partial) = link.partial.take() {
        *buffered_bytes -= partial.bytes.len();
    }
}

/// Our attach answering the client's: the opposite role, non-null source and target,
/// initial-delivery-count when we send, an explicit max-message-size, empty properties.
fn reply_attach(attach: &Attach, max_message_size_bytes: u64) -> Attach {
    let we_send = attach.role == Role::Receiver;
    Attach {
        name: attach.name.clone(),
        handle: attach.handle,
        role: if we_send {
            Role::Sender
        } else {
            Role::Receiver
        },
        snd_settle_mode: if we_send {
            SenderSettleMode::Settled
        } else {
            attach.snd_settle_mode
        },
        rcv_settle_mode: ReceiverSettleMode::First,
        source: Some(attach.source.clone().unwrap_or_default()),
        target: Some(attach.target.clone().unwrap_or_default()),
        unsettled: None,
        incomplete_unsettled: false,
        initial_delivery_count: we_send.then_some(0),
        max_message_size_bytes: Some(max_message_size_bytes),
        offered_capabilities: Vec::new(),
        desired_capabilities: Vec::new(),
        properties: Some(Vec::new()),
    }
}

/// What an attach is for: the link kind and, for hub links, what the link serves, what
/// authorized it and the grant to act with.
struct Route {
    kind: LinkKind,
    hub: Option<(HubRoute, LinkAuthorization, TokenGrant)>,
}

impl Route {
    fn plain(kind: LinkKind) -> Route {
        Route { kind, hub: None }
    }
}

/// The link property carrying a receiver's owner level (a long).
pub(crate) const EPOCH_PROPERTY: &str = "com.microsoft:epoch";
/// The link property naming a receiver (.NET, JS).
pub(crate) const RECEIVER_NAME_PROPERTY: &str = "com.microsoft:receiver-name";
/// The desired capability asking for the runtime metric's delivery annotations.
pub(crate) const RUNTIME_METRIC_CAPABILITY: &str = "com.microsoft:enable-receiver-runtime-metric";

/// A receiver's reader request from its attach: the selector filter (none: latest), the
/// owner level and name from the link properties, the runtime metric capability.
fn consume_route(
    attach: &Attach,
    hub: String,
    consumer_group: String,
    partition: String,
) -> Result<HubRoute, AmqpError> {
    let start = match attach.source.as_ref().and_then(Source::selector_filter) {
        Some(expression) => parse_selector(expression)
            .map_err(|error| AmqpError::new(condition::ARGUMENT_ERROR, error.to_string()))?,
        None => StartPosition::Latest,
    };
    let property = |name: &str| {
        attach
            .properties
            .iter()
            .flatten()
            .find(|(key, _)| key.as_str() == name)
            .map(|(_, value)| value)
    };
    let owner_level = match property(EPOCH_PROPERTY) {
        None | Some(Value::Null) => None,
        Some(value) => Some(value.as_i64().ok_or_else(|| {
            AmqpError::new(
                condition::ARGUMENT_ERROR,
                format!(
                    "{EPOCH_PROPERTY} must be a long, not a {}",
                    value.kind().name()
                ),
            )
        })?),
    };
    let receiver_name = property(RECEIVER_NAME_PROPERTY)
        .and_then(Value::as_str)
        .map(str::to_owned);
    let runtime_metric = attach
        .desired_capabilities
        .iter()
        .any(|c| c.as_str() == RUNTIME_METRIC_CAPABILITY);
    Ok(HubRoute::Consume {
        request: ReadRequest {
            hub,
            consumer_group,
            partition,
            start,
            owner_level,
            receiver_name,
        },
        runtime_metric,
    })
}

fn session_flow(session: &Session, window: u32) -> Flow {
    Flow {
        next_incoming_id: Some(TransferNumber(session.next_incoming_id)),
        incoming_window: session.incoming_window,
        next_outgoing_id: TransferNumber(session.next_outgoing_id),
        outgoing_window: window,
        ..Flow::default()
    }
}

pub(crate) fn link_flow(
    session: &Session,
    handle: Handle,
    link: &Link,
    window: u32,
    drain: bool,
) -> Flow {
    Flow {
        handle: Some(handle),
        delivery_count: Some(link.delivery_count),
        link_credit: Some(link.credit),
        available: Some(u32::try_from(link.queue.len()).unwrap_or(u32::MAX)),
        drain,
        ..session_flow(session, window)
    }
}

/// One settled delivery we send, split into frames that fit the client's max-frame-size.
struct Delivery {
    channel: Channel,
    handle: Handle,
    delivery_id: u32,
    tag: u64,
    peer_max_frame_size_bytes: u32,
}

impl Delivery {
    /// Writes the frames; returns how many. Every frame repeats id, tag, format and settled,
    /// which the spec allows and pyamqp reads by position (WIRE-PROTOCOLS A5).
    fn write(&self, out: &mut Vec<u8>, message: &[u8]) -> u32 {
        let mut transfer = Transfer {
            handle: self.handle,
            delivery_id: Some(DeliveryNumber(self.delivery_id)),
            delivery_tag: Some(Bytes::copy_from_slice(&self.tag.to_be_bytes())),
            message_format: Some(0),
            settled: Some(true),
            more: true,
            rcv_settle_mode: None,
            state: None,
            resume: false,
            aborted: false,
            batchable: false,
        };
        let performative_bytes = Performative::Transfer(transfer.clone())
            .to_value()
            .to_bytes()
            .len();
        let room = (self.peer_max_frame_size_bytes as usize)
            .saturating_sub(FRAME_HEADER_BYTES + performative_bytes)
            .max(1);
        let mut frames = 0;
        let mut chunks = message.chunks(room).peekable();
        loop {
            let chunk = chunks.next().unwrap_or_default();
            transfer.more = chunks.peek().is_some();
            write_performative(
                out,
                self.channel,
                &Performative::Transfer(transfer.clone()),
                chunk,
            );
            frames += 1;
            if !transfer.more {
                return frames;
            }
        }
    }
}
