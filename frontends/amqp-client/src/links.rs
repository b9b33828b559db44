//! The session's links, owned by the connection's task: attach and detach, credit, the
//! deliveries we send (queued, then unsettled until the server's disposition) and the ones we
//! receive (reassembled, then handed to a receiver or matched to a request).
//!
//! Our handles are ours; the server's frames name its own handles, which its attach maps to
//! ours by link name.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, OnceLock};

use bytes::Bytes;
use tokio::sync::{OwnedSemaphorePermit, mpsc, oneshot};

use super::ReceivedEvent;
use super::driver::{
    Attached, LinkId, LinkSpec, OUTPUT_HIGH_WATER_BYTES, OutgoingDelivery, Output, RequestNode,
    Session,
};
use super::error::ClientError;
use tributary_amqp::FRAME_HEADER_BYTES;
use tributary_amqp::{AmqpError, DeliveryState, condition};
use tributary_amqp::{
    Attach, Detach, Disposition, Flow, ReceiverSettleMode, Role, SenderSettleMode, Transfer,
};
use tributary_amqp::{DeliveryNumber, Handle};
use tributary_amqp::{Message, MessageId, Properties};
use tributary_amqp::{SELECTOR_FILTER_NAME, Source, Target};
use tributary_amqp::{Symbol, Value};

/// The most a transfer performative of ours encodes to (its 11 fields at their widest: 40).
const TRANSFER_BYTES_MAX: usize = 64;
/// The credit we keep on a `$cbs` or `$management` reply link.
const REPLY_LINK_CREDIT: u32 = 100;
/// The link property carrying a receiver's owner level.
const EPOCH_PROPERTY: &str = "com.microsoft:epoch";
const RECEIVER_NAME_PROPERTY: &str = "com.microsoft:receiver-name";

pub(crate) struct Links {
    container_id: String,
    links_max: usize,
    peer_max_frame_size_bytes: u32,
    max_message_size_bytes: u64,
    next_link_id: u64,
    by_handle: BTreeMap<Handle, Link>,
    handles: HashMap<LinkId, Handle>,
    /// The server's handle of each link to ours.
    remote: HashMap<Handle, Handle>,
    /// Deliveries sent unsettled, by delivery id, until the server's disposition.
    unsettled: BTreeMap<u32, Unsettled>,
    requests: HashMap<u64, PendingRequest>,
    next_request_id: u64,
    /// The link pairs of `$cbs` and `$management`, by [`RequestNode::index`].
    pairs: [Option<RequestPair>; 2],
}

struct Link {
    id: LinkId,
    name: String,
    state: State,
    /// Why the link ended, for its handle.
    ended: Arc<OnceLock<ClientError>>,
    role: LinkRole,
}

enum State {
    Attaching(Option<oneshot::Sender<Result<Attached, ClientError>>>),
    Attached,
    /// We sent detach; the server's is awaited.
    Detaching(Option<oneshot::Sender<Result<(), ClientError>>>),
}

enum LinkRole {
    Sending(Sending),
    Receiving(Receiving),
}

struct Sending {
    credit: u32,
    delivery_count: u32,
    queue: VecDeque<Queued>,
    /// Set for the request link of `$cbs` or `$management`.
    node: Option<RequestNode>,
}

struct Queued {
    message_format: u32,
    payload: Bytes,
    sent_bytes: usize,
    /// Assigned when its first frame goes out.
    delivery_id: Option<u32>,
    /// Requests go settled; sends wait for their outcome.
    waiter: Option<(
        oneshot::Sender<Result<DeliveryState, ClientError>>,
        OwnedSemaphorePermit,
    )>,
}

struct Receiving {
    credit: u32,
    delivery_count: u32,
    partial: Option<Incoming>,
    destination: Destination,
}

enum Destination {
    Events(mpsc::Sender<Result<ReceivedEvent, ClientError>>),
    Replies(RequestNode),
    /// The link is ending: what still arrives is dropped.
    Gone,
}

struct Incoming {
    delivery_id: Option<u32>,
    message_format: u32,
    settled: bool,
    bytes: Vec<u8>,
}

struct Unsettled {
    link: LinkId,
    outcome: oneshot::Sender<Result<DeliveryState, ClientError>>,
    _permit: OwnedSemaphorePermit,
}

struct PendingRequest {
    node: RequestNode,
    reply: oneshot::Sender<Result<Message, ClientError>>,
    _permit: OwnedSemaphorePermit,
}

struct RequestPair {
    sender: LinkId,
    receiver: LinkId,
    reply_to: String,
}

impl Links {
    pub(crate) fn new(
        container_id: String,
        links_max: usize,
        peer_max_frame_size_bytes: u32,
        max_message_size_bytes: u64,
    ) -> Links {
        Links {
            container_id,
            links_max,
            peer_max_frame_size_bytes,
            max_message_size_bytes,
            next_link_id: 0,
            by_handle: BTreeMap::new(),
            handles: HashMap::new(),
            remote: HashMap::new(),
            unsettled: BTreeMap::new(),
            requests: HashMap::new(),
            next_request_id: 0,
            pairs: [None, None],
        }
    }

    /// Drops every link and waiter (the connection has ended).
    pub(crate) fn clear(&mut self) {
        self.by_handle.clear();
        self.handles.clear();
        self.unsettled.clear();
        self.requests.clear();
    }

    /// Attaches a link a handle asked for; the reply waits for the server's attach.
    pub(crate) fn attach(
        &mut self,
        spec: LinkSpec,
        reply: oneshot::Sender<Result<Attached, ClientError>>,
        session: &Session,
        out: &mut Output,
    ) {
        let link = match spec {
            LinkSpec::Sender { address } => NewLink::sender(address, None),
            LinkSpec::Receiver {
                address,
                options,
                events,
            } => {
                let epoch = options.epoch.map(|e| (EPOCH_PROPERTY, Value::Long(e)));
                let name =
                    (options.receiver_name).map(|n| (RECEIVER_NAME_PROPERTY, Value::String(n)));
                NewLink {
                    filter: options.filter,
                    properties: (epoch.iter().chain(&name))
                        .map(|(k, v)| (Symbol::from(*k), v.clone()))
                        .collect(),
                    ..NewLink::receiver(address, options.credit, Destination::Events(events))
                }
            }
        };
        match self.open(link, session, out) {
            Ok(id) => {
                if let Some(link) = self.link_mut(id) {
                    link.state = State::Attaching(Some(reply));
                }
            }
            Err(error) => {
                let _ = reply.send(Err(error));
            }
        }
    }

    /// Sends the attach (and a receiver's credit) of a new link.
    fn open(
        &mut self,
        link: NewLink,
        session: &Session,
        out: &mut Output,
    ) -> Result<LinkId, ClientError> {
        let handle = (0..self.links_max)
            .filter_map(|h| u32::try_from(h).ok())
            .map(Handle)
            .find(|h| !self.by_handle.contains_key(h))
            .ok_or(ClientError::TooManyLinks {
                links_max: self.links_max,
            })?;
        let id = LinkId(self.next_link_id);
        self.next_link_id += 1;
        let sends = matches!(link.role, NewRole::Sending(_));
        let name = format!(
            "{}-{}-{}",
            self.container_id,
            if sends { "sender" } else { "receiver" },
            id.0
        );
        let terminus = |address: Option<String>| Some(address.unwrap_or_else(|| name.clone()));
        let (source, target) = if sends {
            (terminus(None), Some(link.address))
        } else {
            (Some(link.address), terminus(link.reply_to))
        };
        let filter = link.filter.map(|expression| {
            let value = Value::String(expression);
            let filter = Value::described(Value::symbol(SELECTOR_FILTER_NAME), value);
            vec![(Symbol::from(SELECTOR_FILTER_NAME), filter)]
        });
        let attach = Attach {
            name: name.clone(),
            handle,
            role: if sends { Role::Sender } else { Role::Receiver },
            // We want outcomes for what we send; events come settled.
            snd_settle_mode: if sends {
                SenderSettleMode::Unsettled
            } else {
                SenderSettleMode::Settled
            },
            rcv_settle_mode: ReceiverSettleMode::First,
            source: Some(Source {
                address: source,
                filter,
                ..Source::default()
            }),
            target: Some(Target {
                address: target,
                ..Target::default()
            }),
            unsettled: None,
            incomplete_unsettled: false,
            initial_delivery_count: sends.then_some(0),
            max_message_size_bytes: (!sends).then_some(self.max_message_size_bytes),
            offered_capabilities: Vec::new(),
            desired_capabilities: Vec::new(),
            properties: (!link.properties.is_empty()).then_some(link.properties),
        };
        out.push(attach.into(), &[]);
        let role = match link.role {
            NewRole::Sending(node) => LinkRole::Sending(Sending {
                credit: 0,
                delivery_count: 0,
                queue: VecDeque::new(),
                node,
            }),
            NewRole::Receiving(credit, destination) => {
                let receiving = Receiving {
                    credit,
                    delivery_count: 0,
                    partial: None,
                    destination,
                };
                out.push(receiver_flow(session, handle, &receiving).into(), &[]);
                LinkRole::Receiving(receiving)
            }
        };
        self.handles.insert(id, handle);
        let ended = Arc::new(OnceLock::new());
        let state = State::Attaching(None);
        let link = Link {
            id,
            name,
            state,
            ended,
            role,
        };
        self.by_handle.insert(handle, link);
        Ok(id)
    }

    fn link_mut(&mut self, id: LinkId) -> Option<&mut Link> {
        let handle = self.handles.get(&id)?;
        self.by_handle.get_mut(handle)
    }

    /// The server's attach: the link is open (a refusal follows as a detach).
    pub(crate) fn attached(&mut self, attach: Attach, out: &mut Output) {
        // A link we are detaching still gets its attach: the server's detach follows.
        let Some((handle, link)) = self
            .by_handle
            .iter_mut()
            .find(|(_, l)| l.name == attach.name)
        else {
            tracing::debug!(name = %attach.name, "an attach for no link of ours");
            return;
        };
        self.remote.insert(attach.handle, *handle);
        if let LinkRole::Receiving(receiving) = &mut link.role {
            receiving.delivery_count = attach.initial_delivery_count.unwrap_or(0);
        }
        if !matches!(link.state, State::Attaching(_)) {
            return;
        }
        if let State::Attaching(Some(reply)) = std::mem::replace(&mut link.state, State::Attached) {
            let attached = Attached {
                link: link.id,
                ended: link.ended.clone(),
                peer_attach: attach,
            };
            if reply.send(Ok(attached)).is_err() {
                // The handle gave up waiting: let the link go.
                let handle = *handle;
                self.end_link(handle, ClientError::LinkClosed, None, out);
            }
        }
    }

    /// The server's detach: the answer to ours, or the link ends with its error.
    pub(crate) fn detached(&mut self, detach: Detach, out: &mut Output) {
        let Some(handle) = self.remote.remove(&detach.handle) else {
            tracing::debug!(handle = detach.handle.0, "a detach for no attached link");
            return;
        };
        let Some(link) = self.by_handle.get(&handle) else {
            return;
        };
        if !matches!(link.state, State::Detaching(_)) {
            let error = ClientError::LinkDetached(detach.error);
            self.end_link(handle, error, None, out);
        }
        self.forget(handle);
    }

    /// Ends a link on our side: sends detach (with `amqp_error` when we refuse it), records
    /// why for its handle, drops its waiters. The link stays until the server's detach.
    fn end_link(
        &mut self,
        handle: Handle,
        error: ClientError,
        amqp_error: Option<AmqpError>,
        out: &mut Output,
    ) {
        let Some(link) = self.by_handle.get_mut(&handle) else {
            return;
        };
        let _ = link.ended.set(error.clone());
        match std::mem::replace(&mut link.state, State::Detaching(None)) {
            // Ours is already out.
            State::Detaching(reply) => link.state = State::Detaching(reply),
            previous => {
                if let State::Attaching(Some(reply)) = previous {
                    let _ = reply.send(Err(error.clone()));
                }
                let detach = Detach {
                    handle,
                    closed: true,
                    error: amqp_error,
                };
                out.push(detach.into(), &[]);
            }
        }
        let id = link.id;
        let node = match &mut link.role {
            LinkRole::Sending(sending) => {
                sending.queue.clear();
                sending.node
            }
            LinkRole::Receiving(receiving) => {
                receiving.partial = None;
                match std::mem::replace(&mut receiving.destination, Destination::Gone) {
                    Destination::Replies(node) => Some(node),
                    _ => None,
                }
            }
        };
        self.unsettled.retain(|_, u| u.link != id);
        if let Some(node) = node {
            self.fail_requests(node, error, out);
        }
    }

    /// A request link ended: its pending requests fail, and its partner goes too.
    fn fail_requests(&mut self, node: RequestNode, error: ClientError, out: &mut Output) {
        let pair = self.pairs[node.index()].take();
        for (_, request) in self.requests.extract_if(|_, r| r.node == node) {
            let _ = request.reply.send(Err(error.clone()));
        }
        for partner in pair.into_iter().flat_map(|p| [p.sender, p.receiver]) {
            if let Some(&handle) = self.handles.get(&partner) {
                self.end_link(handle, error.clone(), None, out);
            }
        }
    }

    /// Removes a link both sides have detached; its handle is free again.
    fn forget(&mut self, handle: Handle) {
        if let Some(link) = self.by_handle.remove(&handle) {
            self.handles.remove(&link.id);
            if let State::Detaching(Some(reply)) = link.state {
                let _ = reply.send(Ok(()));
            }
        }
        self.remote.retain(|_, ours| *ours != handle);
    }

    /// A handle closes its link (or was dropped).
    pub(crate) fn detach(
        &mut self,
        id: LinkId,
        reply: Option<oneshot::Sender<Result<(), ClientError>>>,
        out: &mut Output,
    ) {
        let Some(&handle) = self.handles.get(&id) else {
            if let Some(reply) = reply {
                let _ = reply.send(Ok(()));
            }
            return;
        };
        self.end_link(handle, ClientError::LinkClosed, None, out);
        if let Some(link) = self.by_handle.get_mut(&handle) {
            link.state = State::Detaching(reply);
        }
    }

    /// The server's flow: credit on a link we send on; an answer when it asks for one.
    pub(crate) fn flow(&mut self, flow: Flow, session: &Session, out: &mut Output) {
        let Some(handle) = flow.handle else {
            if flow.echo {
                out.push(session.flow().into(), &[]);
            }
            return;
        };
        let Some(&ours) = self.remote.get(&handle) else {
            return;
        };
        let Some(link) = self.by_handle.get_mut(&ours) else {
            return;
        };
        match &mut link.role {
            LinkRole::Sending(sending) => {
                let link_credit = flow.link_credit.unwrap_or(0);
                // What the server allows beyond what it has received, less what is on its way.
                sending.credit = flow
                    .delivery_count
                    .unwrap_or(0)
                    .wrapping_add(link_credit)
                    .wrapping_sub(sending.delivery_count)
                    .min(link_credit);
                let drained = flow.drain && sending.queue.is_empty();
                if drained {
                    sending.delivery_count = sending.delivery_count.wrapping_add(sending.credit);
                    sending.credit = 0;
                }
                if drained || flow.echo {
                    let reply = Flow {
                        handle: Some(ours),
                        delivery_count: Some(sending.delivery_count),
                        link_credit: Some(sending.credit),
                        available: Some(u32::try_from(sending.queue.len()).unwrap_or(u32::MAX)),
                        drain: flow.drain,
                        ..session.flow()
                    };
                    out.push(reply.into(), &[]);
                }
            }
            LinkRole::Receiving(receiving) => {
                if flow.echo {
                    out.push(receiver_flow(session, ours, receiving).into(), &[]);
                }
            }
        }
    }

    /// A receiver made room: more credit.
    pub(crate) fn add_credit(
        &mut self,
        id: LinkId,
        credit: u32,
        session: &Session,
        out: &mut Output,
    ) {
        let Some(&handle) = self.handles.get(&id) else {
            return;
        };
        let Some(link) = self.by_handle.get_mut(&handle) else {
            return;
        };
        if let (LinkRole::Receiving(receiving), false) =
            (&mut link.role, matches!(link.state, State::Detaching(_)))
        {
            receiving.credit = receiving.credit.saturating_add(credit);
            out.push(receiver_flow(session, handle, receiving).into(), &[]);
        }
    }

    /// Queues a delivery on its sender link.
    pub(crate) fn queue(&mut self, delivery: OutgoingDelivery) {
        let Some(link) = self.link_mut(delivery.link) else {
            // The link is gone: dropping the waiter tells the handle why.
            return;
        };
        if let (LinkRole::Sending(sending), false) =
            (&mut link.role, matches!(link.state, State::Detaching(_)))
        {
            sending.queue.push_back(Queued {
                message_format: delivery.delivery.message_format,
                payload: delivery.delivery.payload,
                sent_bytes: 0,
                delivery_id: None,
                waiter: Some((delivery.outcome, delivery.permit)),
            });
        }
    }

    /// Sends a `$cbs` or `$management` request, attaching the node's link pair first when
    /// it has none.
    pub(crate) fn request(
        &mut self,
        node: RequestNode,
        mut message: Box<Message>,
        reply: oneshot::Sender<Result<Message, ClientError>>,
        permit: OwnedSemaphorePermit,
        session: &Session,
        out: &mut Output,
    ) {
        let pair = &self.pairs[node.index()];
        let existing = pair.as_ref().map(|p| (p.sender, p.reply_to.clone()));
        let (sender, reply_to) = match existing {
            Some(existing) => existing,
            None => match self.open_pair(node, session, out) {
                Ok(opened) => opened,
                Err(error) => {
                    let _ = reply.send(Err(error));
                    return;
                }
            },
        };
        let id = self.next_request_id;
        self.next_request_id += 1;
        message.properties = Some(Properties {
            message_id: Some(MessageId::Ulong(id)),
            reply_to: Some(reply_to),
            ..message.properties.take().unwrap_or_default()
        });
        let Some(LinkRole::Sending(sending)) = self.link_mut(sender).map(|l| &mut l.role) else {
            let _ = reply.send(Err(ClientError::LinkClosed));
            return;
        };
        sending.queue.push_back(Queued {
            message_format: 0,
            payload: message.to_bytes(),
            sent_bytes: 0,
            delivery_id: None,
            waiter: None,
        });
        self.requests.insert(
            id,
            PendingRequest {
                node,
                reply,
                _permit: permit,
            },
        );
    }

    fn open_pair(
        &mut self,
        node: RequestNode,
        session: &Session,
        out: &mut Output,
    ) -> Result<(LinkId, String), ClientError> {
        if self.by_handle.len() + 2 > self.links_max {
            return Err(ClientError::TooManyLinks {
                links_max: self.links_max,
            });
        }
        let reply_to = format!(
            "{}-{}-replies-{}",
            self.container_id,
            node.address(),
            self.next_link_id
        );
        let address = node.address().to_owned();
        let receiver = NewLink {
            reply_to: Some(reply_to.clone()),
            ..NewLink::receiver(
                address.clone(),
                REPLY_LINK_CREDIT,
                Destination::Replies(node),
            )
        };
        let receiver = self.open(receiver, session, out)?;
        let sender = self.open(NewLink::sender(address, Some(node)), session, out)?;
        let pair = RequestPair {
            sender,
            receiver,
            reply_to: reply_to.clone(),
        };
        self.pairs[node.index()] = Some(pair);
        Ok((sender, reply_to))
    }

    /// One transfer frame from the server. `Err`: a protocol violation that ends the
    /// connection.
    pub(crate) fn transfer(
        &mut self,
        transfer: Transfer,
        payload: Bytes,
        session: &Session,
        out: &mut Output,
    ) -> Result<(), String> {
        // Frames of links we have detached may still be on their way: they are dropped.
        let Some(&handle) = self.remote.get(&transfer.handle) else {
            return Ok(());
        };
        let max_bytes = self.max_message_size_bytes;
        let Some(link) = self.by_handle.get_mut(&handle) else {
            return Ok(());
        };
        let LinkRole::Receiving(receiving) = &mut link.role else {
            return Err(format!(
                "a transfer on handle {}, a link where the client sends",
                transfer.handle.0
            ));
        };
        if matches!(link.state, State::Detaching(_)) {
            return Ok(());
        }
        if transfer.aborted {
            receiving.partial = None;
            return Ok(());
        }
        let partial = receiving.partial.get_or_insert_with(|| Incoming {
            delivery_id: transfer.delivery_id.map(|id| id.0),
            message_format: transfer.message_format.unwrap_or(0),
            settled: transfer.settled.unwrap_or(false),
            bytes: Vec::new(),
        });
        let size_bytes = (partial.bytes.len() + payload.len()) as u64;
        if size_bytes > max_bytes {
            let error = AmqpError::new(
                condition::MESSAGE_SIZE_EXCEEDED,
                format!("a message of {size_bytes}+ bytes exceeds max-message-size {max_bytes}"),
            );
            let local = ClientError::MessageTooLarge {
                size_bytes,
                max_bytes,
            };
            self.end_link(handle, local, Some(error), out);
            return Ok(());
        }
        partial.bytes.extend_from_slice(&payload);
        if transfer.more {
            return Ok(());
        }
        let Some(incoming) = receiving.partial.take() else {
            return Ok(());
        };
        if receiving.credit == 0 {
            return Err(format!(
                "a delivery on handle {} beyond the link credit we granted",
                transfer.handle.0
            ));
        }
        receiving.credit -= 1;
        receiving.delivery_count = receiving.delivery_count.wrapping_add(1);
        if let (false, Some(id)) = (incoming.settled, incoming.delivery_id) {
            out.push(
                settle(Role::Receiver, id, Some(DeliveryState::Accepted)).into(),
                &[],
            );
        }
        let message = Message::decode(Bytes::from(incoming.bytes)).map_err(ClientError::Decode);
        match &receiving.destination {
            Destination::Events(events) => {
                let event = message.map(|message| ReceivedEvent {
                    message,
                    message_format: incoming.message_format,
                });
                // Never full (the channel holds the credit and one more); closed when the
                // receiver is being dropped.
                let _ = events.try_send(event);
            }
            Destination::Replies(_) => {
                if receiving.credit < REPLY_LINK_CREDIT / 2 {
                    receiving.credit = REPLY_LINK_CREDIT;
                    out.push(receiver_flow(session, handle, receiving).into(), &[]);
                }
                self.reply(message);
            }
            Destination::Gone => {}
        }
        Ok(())
    }

    /// Matches a reply to its request by correlation id.
    fn reply(&mut self, message: Result<Message, ClientError>) {
        let Ok(message) = message else {
            tracing::debug!("an undecodable reply is dropped");
            return;
        };
        let correlation_id = message
            .properties
            .as_ref()
            .and_then(|p| p.correlation_id.clone());
        let pending = match correlation_id {
            Some(MessageId::Ulong(id)) => self.requests.remove(&id),
            _ => None,
        };
        match pending {
            Some(request) => {
                let _ = request.reply.send(Ok(message));
            }
            None => tracing::debug!(?correlation_id, "a reply to no pending request"),
        }
    }

    /// The server settles deliveries we sent.
    pub(crate) fn disposition(&mut self, disposition: Disposition, out: &mut Output) {
        if disposition.role != Role::Receiver {
            return;
        }
        // Received is no outcome yet.
        let Some(outcome) = disposition
            .state
            .filter(|s| !matches!(s, DeliveryState::Received { .. }))
        else {
            return;
        };
        let first = disposition.first.0;
        let last = disposition.last.map_or(first, |l| l.0);
        let ids: Vec<u32> = if first <= last {
            self.unsettled
                .range(first..=last)
                .map(|(id, _)| *id)
                .collect()
        } else {
            // The range wraps around the serial numbers.
            let high = self.unsettled.range(first..).map(|(id, _)| *id);
            high.chain(self.unsettled.range(..=last).map(|(id, _)| *id))
                .collect()
        };
        for id in ids {
            if let Some(unsettled) = self.unsettled.remove(&id) {
                let _ = unsettled.outcome.send(Ok(outcome.clone()));
            }
        }
        if !disposition.settled {
            let mut settled = settle(Role::Sender, first, None);
            settled.last = disposition.last;
            out.push(settled.into(), &[]);
        }
    }

    /// Sends queued deliveries while link credit, the server's session window and the
    /// output bound allow; a delivery larger than a frame goes in several.
    pub(crate) fn pump(&mut self, session: &mut Session, out: &mut Output) {
        let Links {
            by_handle,
            unsettled,
            peer_max_frame_size_bytes,
            ..
        } = self;
        for (handle, link) in by_handle.iter_mut() {
            let (State::Attached, LinkRole::Sending(sending)) = (&link.state, &mut link.role)
            else {
                continue;
            };
            while out.pending_bytes() < OUTPUT_HIGH_WATER_BYTES
                && session.remote_incoming_window > 0
            {
                let Some(front) = sending.queue.front_mut() else {
                    break;
                };
                if front.delivery_id.is_none() {
                    if sending.credit == 0 {
                        break;
                    }
                    sending.credit -= 1;
                    sending.delivery_count = sending.delivery_count.wrapping_add(1);
                    front.delivery_id = Some(session.next_delivery_id);
                    session.next_delivery_id = session.next_delivery_id.wrapping_add(1);
                }
                let more = write_transfer(out, *handle, front, *peer_max_frame_size_bytes);
                session.next_outgoing_id = session.next_outgoing_id.wrapping_add(1);
                session.remote_incoming_window -= 1;
                if more {
                    continue;
                }
                if let Some(Queued {
                    delivery_id: Some(id),
                    waiter: Some((outcome, permit)),
                    ..
                }) = sending.queue.pop_front()
                {
                    unsettled.insert(
                        id,
                        Unsettled {
                            link: link.id,
                            outcome,
                            _permit: permit,
                        },
                    );
                }
            }
        }
    }
}

/// What a link is opened with.
struct NewLink {
    address: String,
    role: NewRole,
    /// A receiver's target, which replies are sent to; `None`: the link's name.
    reply_to: Option<String>,
    filter: Option<String>,
    properties: Vec<(Symbol, Value)>,
}

enum NewRole {
    Sending(Option<RequestNode>),
    /// The credit to grant, and where events go.
    Receiving(u32, Destination),
}

impl NewLink {
    fn sender(address: String, node: Option<RequestNode>) -> NewLink {
        NewLink {
            address,
            role: NewRole::Sending(node),
            reply_to: None,
            filter: None,
            properties: Vec::new(),
        }
    }

    fn receiver(address: String, credit: u32, destination: Destination) -> NewLink {
        NewLink {
            role: NewRole::Receiving(credit, destination),
            ..NewLink::sender(address, None)
        }
    }
}

/// Writes the next frame of `queued` (every frame repeats id, tag, format and settled, as
/// the spec allows); `true` when more frames follow.
fn write_transfer(
    out: &mut Output,
    handle: Handle,
    queued: &mut Queued,
    peer_max_frame_size_bytes: u32,
) -> bool {
    let delivery_id = queued.delivery_id.unwrap_or(0);
    let mut transfer = Transfer {
        handle,
        delivery_id: Some(DeliveryNumber(delivery_id)),
        delivery_tag: Some(Bytes::copy_from_slice(&delivery_id.to_be_bytes())),
        message_format: Some(queued.message_format),
        settled: Some(queued.waiter.is_none()),
        more: true,
        rcv_settle_mode: None,
        state: None,
        resume: false,
        aborted: false,
        batchable: false,
    };
    let room = (peer_max_frame_size_bytes as usize)
        .saturating_sub(FRAME_HEADER_BYTES + TRANSFER_BYTES_MAX)
        .max(1);
    let end = (queued.sent_bytes + room).min(queued.payload.len());
    transfer.more = end < queued.payload.len();
    out.push(transfer.into(), &queued.payload[queued.sent_bytes..end]);
    queued.sent_bytes = end;
    end < queued.payload.len()
}

fn receiver_flow(session: &Session, handle: Handle, receiving: &Receiving) -> Flow {
    Flow {
        handle: Some(handle),
        delivery_count: Some(receiving.delivery_count),
        link_credit: Some(receiving.credit),
        ..session.flow()
    }
}

fn settle(role: Role, first: u32, state: Option<DeliveryState>) -> Disposition {
    Disposition {
        role,
        first: DeliveryNumber(first),
        last: None,
        settled: true,
        state,
        batchable: false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tributary_amqp::Performative;

    #[test]
    fn a_transfer_at_its_widest_fits_the_bound() {
        let transfer = Transfer {
            handle: Handle(u32::MAX),
            delivery_id: Some(DeliveryNumber(u32::MAX)),
            delivery_tag: Some(Bytes::copy_from_slice(&u32::MAX.to_be_bytes())),
            message_format: Some(u32::MAX),
            settled: Some(true),
            more: true,
            rcv_settle_mode: None,
            state: None,
            resume: false,
            aborted: false,
            batchable: false,
        };
        let bytes = Performative::Transfer(transfer).to_value().to_bytes();
        assert!(bytes.len() <= TRANSFER_BYTES_MAX, "{} bytes", bytes.len());
    }
}
