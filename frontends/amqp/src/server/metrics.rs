//! The connection's metrics: open connections, open links by kind, deliveries in and out,
//! errors sent by condition.

use metrics::{counter, gauge};

/// Counts an open connection for as long as it lives.
pub(crate) struct ConnectionGauge;

impl ConnectionGauge {
    pub(crate) fn open() -> ConnectionGauge {
        gauge!("tributary_amqp_connections").increment(1.0);
        ConnectionGauge
    }
}

impl Drop for ConnectionGauge {
    fn drop(&mut self) {
        gauge!("tributary_amqp_connections").decrement(1.0);
    }
}

pub(crate) fn link_attached(kind: &'static str) {
    gauge!("tributary_amqp_links", "kind" => kind).increment(1.0);
}

pub(crate) fn link_detached(kind: &'static str) {
    gauge!("tributary_amqp_links", "kind" => kind).decrement(1.0);
}

/// An error condition we sent in a close, end, detach, SASL outcome or status reply.
pub(crate) fn error_sent(condition: &str) {
    counter!("tributary_amqp_errors_total", "condition" => condition.to_owned()).increment(1);
}

/// A published delivery handed to the backend (`in`), or an event queued for a receiver
/// (`out`).
pub(crate) fn transfers(direction: &'static str, count: usize) {
    counter!("tributary_amqp_transfers_total", "direction" => direction).increment(count as u64);
}
