//! Every bound of one AMQP connection, in one place, with its unit in its name.

use std::time::Duration;

use crate::frame::MIN_MAX_FRAME_SIZE_BYTES;

/// The limits and advertised values of a connection. Plain data: the node builds it from its
/// configuration and checks it once with [`ConnectionLimits::validate`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectionLimits {
    /// Our name in the open's container-id: `tributary-<node_name>`.
    pub node_name: String,
    /// The largest frame we accept (advertised as the lower of this and the client's).
    pub max_frame_size_bytes: u32,
    /// The highest channel a client may begin a session on.
    pub channel_max: u16,
    /// Advertised in open; a client silent for twice this long is disconnected.
    pub idle_timeout_ms: u32,
    /// The bound on the SASL exchange and the wait for the client's open.
    pub handshake_timeout_ms: u64,
    /// A write the client does not drain within this closes the connection.
    pub write_timeout_ms: u64,
    pub sessions_per_connection_max: usize,
    /// Advertised as begin.handle-max + 1 and enforced on attach.
    pub links_per_session_max: u32,
    /// The session windows we advertise, in transfer frames.
    pub session_window_frames: u32,
    /// The credit we grant on `$cbs` and `$management` request links.
    pub request_link_credit: u32,
    /// The max-message-size we advertise and enforce on incoming deliveries (the node sets
    /// it from `--publish-bytes-max`); a larger publication is rejected with
    /// `amqp:link:message-size-exceeded`.
    pub max_message_size_bytes: u64,
    /// The most link credit we grant on a hub sender link at a time.
    pub sender_link_credit: u32,
    /// Sends of one link handed to the backend and not yet committed. The credit we grant
    /// never exceeds the room left, so a client within its credit meets this bound only
    /// through pyamqp's over-credit sends, which are rejected with `server-busy`.
    pub pending_sends_per_link_max: usize,
    /// Sends of the whole connection handed to the backend and not yet committed.
    pub pending_sends_max: usize,
    /// Bytes of partial incoming deliveries, queued replies and events, and sends awaiting
    /// their commit, held for one connection.
    pub buffered_bytes_max: usize,
    /// Replies queued on one link while the client gives no credit.
    pub link_queue_max: usize,
    /// Audiences with a stored CBS grant.
    pub grants_max: usize,
}

impl Default for ConnectionLimits {
    fn default() -> ConnectionLimits {
        ConnectionLimits {
            node_name: "node".into(),
            max_frame_size_bytes: 65_536,
            channel_max: 255,
            idle_timeout_ms: 120_000,
            handshake_timeout_ms: 30_000,
            write_timeout_ms: 30_000,
            sessions_per_connection_max: 64,
            links_per_session_max: 256,
            session_window_frames: 5_000,
            request_link_credit: 100,
            max_message_size_bytes: 1_048_576,
            sender_link_credit: 1_000,
            pending_sends_per_link_max: 1_000,
            pending_sends_max: 4_000,
            buffered_bytes_max: 8 * 1_048_576,
            link_queue_max: 128,
            grants_max: 64,
        }
    }
}

/// A limit that makes no sense, found by [`ConnectionLimits::validate`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("AMQP connection limit {field}: {problem}")]
pub struct InvalidLimits {
    pub field: &'static str,
    pub problem: &'static str,
}

impl ConnectionLimits {
    /// Checks the values once at startup.
    pub fn validate(&self) -> Result<(), InvalidLimits> {
        let checks = [
            (
                "max_frame_size_bytes",
                self.max_frame_size_bytes >= MIN_MAX_FRAME_SIZE_BYTES,
                "must be at least 512 (AMQP's minimum)",
            ),
            (
                "idle_timeout_ms",
                self.idle_timeout_ms > 0,
                "must be positive",
            ),
            (
                "handshake_timeout_ms",
                self.handshake_timeout_ms > 0,
                "must be positive",
            ),
            (
                "write_timeout_ms",
                self.write_timeout_ms > 0,
                "must be positive",
            ),
            (
                "sessions_per_connection_max",
                self.sessions_per_connection_max > 0,
                "must be positive",
            ),
            (
                "links_per_session_max",
                self.links_per_session_max > 0,
                "must be positive",
            ),
            (
                "session_window_frames",
                self.session_window_frames > 0,
                "must be positive",
            ),
            (
                "request_link_credit",
                self.request_link_credit > 0,
                "must be positive",
            ),
            (
                "max_message_size_bytes",
                self.max_message_size_bytes > 0,
                "must be positive",
            ),
            (
                "sender_link_credit",
                self.sender_link_credit > 0,
                "must be positive",
            ),
            (
                "pending_sends_per_link_max",
                self.pending_sends_per_link_max > 0,
                "must be positive",
            ),
            (
                "pending_sends_max",
                self.pending_sends_max >= self.pending_sends_per_link_max,
                "must be at least pending_sends_per_link_max",
            ),
            (
                "buffered_bytes_max",
                self.buffered_bytes_max as u64 >= self.max_message_size_bytes,
                "must hold at least one message of max_message_size_bytes",
            ),
            (
                "link_queue_max",
                self.link_queue_max > 0,
                "must be positive",
            ),
            ("grants_max", self.grants_max > 0, "must be positive"),
        ];
        match checks.into_iter().find(|(_, ok, _)| !ok) {
            Some((field, _, problem)) => Err(InvalidLimits { field, problem }),
            None => Ok(()),
        }
    }

    pub(crate) fn container_id(&self) -> String {
        format!("tributary-{}", self.node_name)
    }

    pub(crate) fn idle_timeout(&self) -> Duration {
        Duration::from_millis(self.idle_timeout_ms.into())
    }

    pub(crate) fn handshake_timeout(&self) -> Duration {
        Duration::from_millis(self.handshake_timeout_ms)
    }

    pub(crate) fn write_timeout(&self) -> Duration {
        Duration::from_millis(self.write_timeout_ms)
    }

    /// The highest handle a session accepts.
    pub(crate) fn handle_max(&self) -> u32 {
        self.links_per_session_max - 1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_nonsense_is_named() {
        assert_eq!(ConnectionLimits::default().validate(), Ok(()));
        let small = ConnectionLimits {
            max_frame_size_bytes: 511,
            ..ConnectionLimits::default()
        };
        assert_eq!(small.validate().unwrap_err().field, "max_frame_size_bytes");
        let tight = ConnectionLimits {
            buffered_bytes_max: 1,
            ..ConnectionLimits::default()
        };
        assert_eq!(tight.validate().unwrap_err().field, "buffered_bytes_max");
    }
}
