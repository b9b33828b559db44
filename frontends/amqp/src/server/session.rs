//! The state of one session and its links: windows, credit, delivery ids, queues.
//!
//! A session uses the client's channel number as ours, and a link the client's handle as
//! ours: every session and link is begun by the client, so the numbers are free, and one key
//! serves both directions.

use std::collections::{HashMap, VecDeque};

use bytes::Bytes;

use super::backend::EventStream;
use super::grants::LinkAuthorization;
use crate::ids::Handle;

pub(crate) struct Session {
    /// We sent end (refusing the session); the client's end is awaited.
    pub(crate) ending: bool,
    /// The id of the next transfer frame we send.
    pub(crate) next_outgoing_id: u32,
    /// The id of the next transfer frame the client sends.
    pub(crate) next_incoming_id: u32,
    /// Transfer frames the client may still send before we widen the window.
    pub(crate) incoming_window: u32,
    /// Transfer frames we may still send.
    pub(crate) remote_incoming_window: u32,
    pub(crate) next_delivery_id: u32,
    pub(crate) links: HashMap<Handle, Link>,
}

/// What a link is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LinkKind {
    /// The client sends `$cbs` requests; we receive.
    CbsRequests,
    /// We send `$cbs` replies.
    CbsReplies,
    ManagementRequests,
    ManagementReplies,
    /// The client publishes to a hub or a partition; we receive.
    Publish,
    /// We deliver a partition's events to the client.
    Consume,
    /// Refused: we sent detach and await the client's.
    Refused,
}

pub(crate) struct Link {
    /// Unique on the connection: a handle is reused after a detach, and a send or read
    /// that completes later must not land on the new link.
    pub(crate) id: u64,
    pub(crate) name: String,
    pub(crate) kind: LinkKind,
    /// The target address of a link we send on, for routing replies by `reply-to`.
    pub(crate) target_address: Option<String>,
    /// Receiving: the credit we granted that is left, and deliveries received.
    /// Sending: the credit the client granted that is left, and deliveries sent.
    pub(crate) credit: u32,
    pub(crate) delivery_count: u32,
    /// Receiving: the delivery arriving in several frames.
    pub(crate) partial: Option<Partial>,
    /// Sending: encoded messages waiting for credit.
    pub(crate) queue: VecDeque<Bytes>,
    pub(crate) next_tag: u64,
    /// Set for links authorized by a CBS grant; `$cbs` and `$management` need none.
    pub(crate) authorization: Option<LinkAuthorization>,
    /// The state of a hub link.
    pub(crate) hub: Option<HubLink>,
}

/// What a hub link needs beyond the common state.
pub(crate) enum HubLink {
    Publish {
        hub: String,
        /// Set for a `<hub>/Partitions/<id>` link.
        partition: Option<String>,
        /// Sends handed to the backend and not yet answered.
        pending_sends: usize,
    },
    Consume {
        /// Deliver the runtime metric's delivery annotations.
        runtime_metric: bool,
        /// `None` while the backend opens the reader.
        stream: Option<EventStream>,
    },
}

/// A delivery whose frames are still arriving.
pub(crate) struct Partial {
    pub(crate) bytes: Vec<u8>,
    pub(crate) delivery_id: Option<u32>,
    pub(crate) settled: bool,
    pub(crate) message_format: u32,
    /// Why a publish delivery's bytes are dropped as they arrive; it is rejected when
    /// complete, and the link goes on.
    pub(crate) dropped: Option<Dropped>,
}

/// Why a delivery on a publish link is refused before it is complete.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Dropped {
    /// It grew past max-message-size.
    TooLarge,
    /// The connection's buffers (mostly sends awaiting their commit) are full.
    BuffersFull,
}

impl Session {
    pub(crate) fn new(window_frames: u32) -> Session {
        Session {
            ending: false,
            next_outgoing_id: 0,
            next_incoming_id: 0,
            incoming_window: window_frames,
            remote_incoming_window: 0,
            next_delivery_id: 0,
            links: HashMap::new(),
        }
    }

    /// The client's view of its incoming window, from its begin or flow (part 2 §2.5.6):
    /// what it can take counts from the transfer it expects next, 0 before our begin.
    pub(crate) fn update_remote_window(&mut self, next_incoming_id: Option<u32>, window: u32) {
        let next_incoming_id = next_incoming_id.unwrap_or(0);
        self.remote_incoming_window = next_incoming_id
            .wrapping_add(window)
            .wrapping_sub(self.next_outgoing_id);
        if self.remote_incoming_window > window {
            // The client counted transfers it has not seen yet; stay within its window.
            self.remote_incoming_window = window;
        }
    }

    /// The number of open links (refused ones excluded).
    pub(crate) fn open_links(&self) -> usize {
        self.links
            .values()
            .filter(|l| l.kind != LinkKind::Refused)
            .count()
    }
}

impl LinkKind {
    /// True when the client sends on the link and we receive.
    pub(crate) fn we_receive(self) -> bool {
        matches!(
            self,
            LinkKind::CbsRequests | LinkKind::ManagementRequests | LinkKind::Publish
        )
    }

    /// The label of the `tributary_amqp_links` gauge; `None` for links not counted.
    pub(crate) fn metric_label(self) -> Option<&'static str> {
        match self {
            LinkKind::CbsRequests | LinkKind::CbsReplies => Some("cbs"),
            LinkKind::ManagementRequests | LinkKind::ManagementReplies => Some("management"),
            LinkKind::Publish => Some("send"),
            LinkKind::Consume => Some("receive"),
            LinkKind::Refused => None,
        }
    }

    /// The reply link kind for requests on this kind.
    pub(crate) fn reply_kind(self) -> Option<LinkKind> {
        match self {
            LinkKind::CbsRequests => Some(LinkKind::CbsReplies),
            LinkKind::ManagementRequests => Some(LinkKind::ManagementReplies),
            _ => None,
        }
    }
}

impl Link {
    pub(crate) fn new(
        id: u64,
        name: String,
        kind: LinkKind,
        target_address: Option<String>,
    ) -> Link {
        Link {
            id,
            name,
            kind,
            target_address,
            credit: 0,
            delivery_count: 0,
            partial: None,
            queue: VecDeque::new(),
            next_tag: 0,
            authorization: None,
            hub: None,
        }
    }

    /// The credit left to us on a link we send on, from the client's flow (part 2 §2.6.7):
    /// its delivery-count plus its credit minus what we have sent.
    pub(crate) fn update_send_credit(&mut self, delivery_count: Option<u32>, link_credit: u32) {
        let received = delivery_count.unwrap_or(0);
        self.credit = received
            .wrapping_add(link_credit)
            .wrapping_sub(self.delivery_count)
            .min(link_credit);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_remote_window_counts_from_the_transfer_the_client_expects() {
        let mut session = Session::new(100);
        session.update_remote_window(None, 65_536);
        assert_eq!(session.remote_incoming_window, 65_536);
        session.next_outgoing_id = 10;
        session.update_remote_window(Some(4), 20);
        assert_eq!(session.remote_incoming_window, 14);
        session.update_remote_window(Some(10), 20);
        assert_eq!(session.remote_incoming_window, 20);
        // Serial numbers wrap.
        session.next_outgoing_id = 3;
        session.update_remote_window(Some(u32::MAX - 1), 10);
        assert_eq!(session.remote_incoming_window, 5);
        // A client claiming transfers it never got cannot widen its own window.
        session.update_remote_window(Some(50), 10);
        assert_eq!(session.remote_incoming_window, 10);
    }

    #[test]
    fn send_credit_subtracts_what_is_in_flight() {
        let mut link = Link::new(0, "l".into(), LinkKind::CbsReplies, None);
        link.update_send_credit(None, 300);
        assert_eq!(link.credit, 300);
        link.delivery_count = 5;
        link.update_send_credit(Some(2), 10);
        assert_eq!(link.credit, 7);
        link.update_send_credit(Some(5), 10);
        assert_eq!(link.credit, 10);
        link.update_send_credit(Some(5), 0);
        assert_eq!(link.credit, 0);
    }
}
