//! Every node as a Kafka broker: the node ids and advertised addresses Metadata lists, and
//! each partition's leader, from [`Service::endpoints`] (every node asked over the peer
//! port), kept for a moment so a burst of Metadata requests asks once.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tributary_broker::error::{Error, ErrorKind};
use tributary_broker::service::{Endpoints, Service};

/// How old the directory Metadata answers from may be: clients refresh Metadata after a
/// NOT_LEADER_OR_FOLLOWER, and must then see the new leader.
pub const METADATA_AGE_MAX: Duration = Duration::from_millis(250);

#[derive(Default)]
pub struct Directory {
    cached: tokio::sync::Mutex<Option<(Instant, Arc<Endpoints>)>>,
    /// The last answer, readable while another caller is asking the nodes again.
    latest: std::sync::RwLock<Option<Arc<Endpoints>>>,
}

impl Directory {
    /// The directory at most `max_age` old: asked again of every node when older (one
    /// caller asks; the others wait for its answer).
    pub async fn get(&self, service: &Service, max_age: Duration) -> Arc<Endpoints> {
        let mut cached = self.cached.lock().await;
        if let Some((at, endpoints)) = cached.as_ref()
            && at.elapsed() <= max_age
        {
            return endpoints.clone();
        }
        let endpoints = Arc::new(service.endpoints().await);
        *cached = Some((Instant::now(), endpoints.clone()));
        *self.latest.write().unwrap_or_else(|e| e.into_inner()) = Some(endpoints.clone());
        endpoints
    }

    /// The last directory asked for, if any: never waits for the nodes, nor for a caller
    /// asking them again.
    pub fn last(&self) -> Option<Arc<Endpoints>> {
        self.latest
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

/// A node's address for clients of one listener kind (plain text or TLS), as `(host, port)`.
pub fn address(endpoints: &Endpoints, node: u64, tls: bool) -> Option<(String, u16)> {
    let addrs = endpoints.nodes.get(&node)?;
    let addr = if tls { &addrs.tls } else { &addrs.plain };
    split(addr.as_deref()?)
}

/// `host:port` (an IPv6 host in brackets or not) as its parts.
pub fn split(addr: &str) -> Option<(String, u16)> {
    let (host, port) = addr.rsplit_once(':')?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    Some((host.to_string(), port.parse().ok()?))
}

/// Whether `err` names another node as the partition's leader that this listener's clients
/// can reach: the client is then told NOT_LEADER_OR_FOLLOWER and goes there itself, instead
/// of the call being passed on.
pub fn names_reachable_leader(
    err: &Error,
    me: u64,
    endpoints: Option<&Endpoints>,
    tls: bool,
) -> bool {
    match (&err.kind, endpoints) {
        (
            ErrorKind::NotLeader {
                node: Some(leader), ..
            },
            Some(endpoints),
        ) => leader.0 != me && address(endpoints, leader.0, tls).is_some(),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tributary_broker::service::KafkaAddrs;
    use tributary_types::NodeId;

    #[test]
    fn a_leader_elsewhere_with_an_address_is_named_to_the_client() {
        let mut endpoints = Endpoints::default();
        endpoints.nodes.insert(
            2,
            KafkaAddrs {
                plain: Some("10.0.0.2:9092".into()),
                tls: None,
            },
        );
        endpoints.nodes.insert(3, KafkaAddrs::default());
        let not_leader = |node: Option<u64>| {
            Error::new(
                ErrorKind::NotLeader {
                    node: node.map(NodeId),
                    client_addr: None,
                },
                "not here".to_string(),
            )
        };
        assert!(names_reachable_leader(
            &not_leader(Some(2)),
            1,
            Some(&endpoints),
            false
        ));
        // No TLS listener there, no Kafka listener at all, this node, or nobody named: the
        // call is passed on (or waits for an election) instead.
        assert!(!names_reachable_leader(
            &not_leader(Some(2)),
            1,
            Some(&endpoints),
            true
        ));
        assert!(!names_reachable_leader(
            &not_leader(Some(3)),
            1,
            Some(&endpoints),
            false
        ));
        assert!(!names_reachable_leader(
            &not_leader(Some(1)),
            1,
            Some(&endpoints),
            false
        ));
        assert!(!names_reachable_leader(
            &not_leader(None),
            1,
            Some(&endpoints),
            false
        ));
        assert!(!names_reachable_leader(
            &not_leader(Some(2)),
            1,
            None,
            false
        ));
        assert_eq!(split("[::1]:9092"), Some(("::1".to_string(), 9092)));
    }
}
