//! Getting a call to the node that can answer it: follow NOT_LEADER hints, remember
//! partition leaders, and retry transient failures with bounded, jittered backoff.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tonic::service::interceptor::InterceptedService;
use tonic::transport::Endpoint;
use tributary_proto::v1::ErrorReason;

use crate::ClientError;
use crate::credential::Authorizer;
use crate::send_session::SendSession;

/// A connection to a node whose calls carry the client's credential, if it has one.
pub(crate) type Channel = InterceptedService<tonic::transport::Channel, Authorizer>;

/// How long a call keeps retrying transient failures before giving up, by default.
pub const RETRY_DEADLINE_DEFAULT: Duration = Duration::from_secs(30);
/// Backoff before the first retry; doubles per attempt up to [`BACKOFF_MAX`].
const BACKOFF_FIRST: Duration = Duration::from_millis(50);
const BACKOFF_MAX: Duration = Duration::from_secs(1);
/// NOT_LEADER hints followed at once before backing off (leadership may be moving).
const HINT_HOPS_MAX: u32 = 3;
/// Connections kept to nodes other than the first.
const CHANNELS_MAX: usize = 64;

/// A partition, as the leader cache knows it: (event hub, partition id).
pub(crate) type PartitionKey = (String, String);

#[derive(Debug)]
struct Inner {
    base: Arc<str>,
    authorizer: Authorizer,
    tls: Tls,
    retry_deadline: Duration,
    channels: Mutex<HashMap<Arc<str>, Channel>>,
    /// The send session to each node sends went to (at most [`CHANNELS_MAX`]).
    send_sessions: Mutex<HashMap<Arc<str>, Arc<SendSession>>>,
    leaders: Mutex<HashMap<PartitionKey, Arc<str>>>,
}

#[derive(Debug, Clone)]
pub(crate) struct Routing {
    inner: Arc<Inner>,
}

/// How long establishing a TCP connection may take before calls fail.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// HTTP/2 pings keep idle connections (e.g. a caught-up consumer) from being dropped by
/// middleboxes, and notice dead peers.
const KEEP_ALIVE_INTERVAL: Duration = Duration::from_secs(30);

/// The TLS settings of a client's `https://` channels (`None`: plain text only).
pub(crate) type Tls = Option<Arc<rustls::ClientConfig>>;

/// A lazily connected channel to `endpoint` (remade when it breaks), its calls authorized
/// by `authorizer`; `https://` endpoints use `tls`.
pub(crate) fn make_channel(
    endpoint: &str,
    authorizer: &Authorizer,
    tls: &Tls,
) -> Result<Channel, ClientError> {
    let settings = Endpoint::from_shared(endpoint.to_owned())
        .map_err(|e| {
            ClientError::InvalidArgument(format!("endpoint '{endpoint}' is not a valid URL: {e}"))
        })?
        .connect_timeout(CONNECT_TIMEOUT)
        .tcp_nodelay(true)
        .http2_keep_alive_interval(KEEP_ALIVE_INTERVAL)
        .keep_alive_while_idle(true);
    let channel = if endpoint.starts_with("https://") {
        let Some(tls) = tls else {
            return Err(ClientError::InvalidArgument(format!(
                "endpoint '{endpoint}' uses TLS: give the CA certificate that signed the nodes' \
                 certificates (--ca-cert FILE, or ClientOptions::ca_cert)"
            )));
        };
        settings.connect_with_connector_lazy(crate::tls::TlsConnector::new(tls.clone()))
    } else {
        settings.connect_lazy()
    };
    Ok(InterceptedService::new(channel, authorizer.clone()))
}

/// Backoff before retry `attempt` (1-based): exponential, capped, with ±50 % jitter so
/// many clients do not retry in lockstep.
pub(crate) fn backoff(attempt: u32) -> Duration {
    let base = BACKOFF_FIRST
        .saturating_mul(1 << attempt.saturating_sub(1).min(10))
        .min(BACKOFF_MAX);
    base.mul_f64(rand::random_range(0.5..1.5))
}

impl Routing {
    pub(crate) fn new(
        base: Arc<str>,
        channel: Channel,
        authorizer: Authorizer,
        retry_deadline: Duration,
        tls: Tls,
    ) -> Self {
        let channels = HashMap::from([(base.clone(), channel)]);
        Self {
            inner: Arc::new(Inner {
                base,
                authorizer,
                tls,
                retry_deadline,
                channels: Mutex::new(channels),
                send_sessions: Mutex::new(HashMap::new()),
                leaders: Mutex::new(HashMap::new()),
            }),
        }
    }

    /// The TLS settings channels to other nodes are made with.
    pub(crate) fn tls(&self) -> &Tls {
        &self.inner.tls
    }

    /// How long a call keeps retrying; zero when retries are off.
    pub(crate) fn retry_deadline(&self) -> Duration {
        self.inner.retry_deadline
    }

    /// Forgets the cached leader of `partition` (e.g. its stream broke), so the next call
    /// asks again.
    pub(crate) fn forget_leader(&self, partition: &PartitionKey) {
        self.inner
            .leaders
            .lock()
            .expect("leaders lock")
            .remove(partition);
    }

    /// Takes a leader hint seen outside [`Routing::call`] (e.g. in a stream's error) as the
    /// partition's leader for the next call.
    pub(crate) fn remember_leader(&self, partition: PartitionKey, hint: &str) {
        self.inner
            .leaders
            .lock()
            .expect("leaders lock")
            .insert(partition, normalize_hint(hint, &self.inner.base).into());
    }

    /// Where to go after `failed` could not be reached: the first node, or when that is the
    /// one that failed, another node this client has talked to (if any).
    fn after_transport_failure(&self, failed: &Arc<str>) -> Arc<str> {
        let base = &self.inner.base;
        if failed != base {
            return base.clone();
        }
        let channels = self.inner.channels.lock().expect("channels lock");
        let mut others: Vec<&Arc<str>> = channels.keys().filter(|e| *e != failed).collect();
        others.sort();
        match others.as_slice() {
            [] => base.clone(),
            others => others[rand::random_range(0..others.len())].clone(),
        }
    }

    /// Makes `endpoint` one of the nodes a call may go to when another cannot be reached.
    pub(crate) fn know_endpoint(&self, endpoint: &Arc<str>) -> Result<(), ClientError> {
        self.channel(endpoint).map(drop)
    }

    /// The endpoints this client knows, besides the first.
    pub(crate) fn known_endpoints(&self) -> Vec<Arc<str>> {
        let channels = self.inner.channels.lock().expect("channels lock");
        let mut known: Vec<Arc<str>> = channels
            .keys()
            .filter(|e| **e != self.inner.base)
            .cloned()
            .collect();
        known.sort();
        known
    }

    fn channel(&self, endpoint: &Arc<str>) -> Result<Channel, ClientError> {
        let mut channels = self.inner.channels.lock().expect("channels lock");
        if let Some(channel) = channels.get(endpoint) {
            return Ok(channel.clone());
        }
        if channels.len() >= CHANNELS_MAX {
            let base = self.inner.base.clone();
            channels.retain(|e, _| *e == base);
        }
        let channel = make_channel(endpoint, &self.inner.authorizer, &self.inner.tls)?;
        channels.insert(endpoint.clone(), channel.clone());
        Ok(channel)
    }

    /// The send session to `endpoint` (opened on its first send).
    pub(crate) fn send_session(
        &self,
        endpoint: &Arc<str>,
    ) -> Result<Arc<SendSession>, ClientError> {
        let channel = self.channel(endpoint)?;
        let mut sessions = self.inner.send_sessions.lock().expect("send sessions lock");
        if let Some(session) = sessions.get(endpoint) {
            return Ok(session.clone());
        }
        if sessions.len() >= CHANNELS_MAX {
            let base = self.inner.base.clone();
            sessions.retain(|e, _| *e == base);
        }
        let session = Arc::new(SendSession::new(
            endpoint.clone(),
            channel,
            self.inner.authorizer.clone(),
        ));
        sessions.insert(endpoint.clone(), session.clone());
        Ok(session)
    }

    /// Runs `call` against the partition's leader (or the first node), following hints and
    /// retrying transient failures until the client's retry deadline.
    pub(crate) async fn call<T, F, Fut>(
        &self,
        partition: Option<PartitionKey>,
        mut call: F,
    ) -> Result<T, ClientError>
    where
        F: FnMut(Channel, Arc<str>) -> Fut,
        Fut: Future<Output = Result<T, ClientError>>,
    {
        let deadline = tokio::time::Instant::now() + self.inner.retry_deadline;
        let cached = partition.as_ref().and_then(|p| {
            self.inner
                .leaders
                .lock()
                .expect("leaders lock")
                .get(p)
                .cloned()
        });
        let mut endpoint = cached.unwrap_or_else(|| self.inner.base.clone());
        let mut attempt = 0u32;
        let mut hops = 0u32;
        loop {
            let result = call(self.channel(&endpoint)?, endpoint.clone()).await;
            let err = match result {
                Ok(value) => {
                    if let Some(p) = partition {
                        self.inner
                            .leaders
                            .lock()
                            .expect("leaders lock")
                            .insert(p, endpoint);
                    }
                    return Ok(value);
                }
                Err(err) => err,
            };
            if !err.is_transient() || tokio::time::Instant::now() >= deadline {
                if err.is_transient()
                    && let Some(p) = partition
                {
                    // No retry left: the next call still goes where the error pointed,
                    // not back to a leader known to be stale.
                    self.learn_from(p, &err);
                }
                return Err(err);
            }
            if let Some(p) = &partition {
                self.inner.leaders.lock().expect("leaders lock").remove(p);
            }
            match &err {
                ClientError::Service {
                    reason: ErrorReason::NotLeader,
                    leader_hint: Some(hint),
                    ..
                } if hops < HINT_HOPS_MAX => {
                    hops += 1;
                    endpoint = normalize_hint(hint, &self.inner.base).into();
                    continue;
                }
                ClientError::Transport { .. } => {
                    endpoint = self.after_transport_failure(&endpoint);
                }
                _ => {}
            }
            hops = 0;
            attempt += 1;
            let wait = err.retry_after().unwrap_or_else(|| backoff(attempt));
            tokio::time::sleep_until((tokio::time::Instant::now() + wait).min(deadline)).await;
        }
    }
}

impl Routing {
    /// After a transient failure of a call for `partition`: its cached leader is stale;
    /// a NOT_LEADER answer's hint becomes the leader to try next.
    fn learn_from(&self, partition: PartitionKey, err: &ClientError) {
        let mut leaders = self.inner.leaders.lock().expect("leaders lock");
        match err {
            ClientError::Service {
                reason: ErrorReason::NotLeader,
                leader_hint: Some(hint),
                ..
            } => {
                leaders.insert(partition, normalize_hint(hint, &self.inner.base).into());
            }
            _ => {
                leaders.remove(&partition);
            }
        }
    }
}

/// A leader hint (the leader's client address, `host:port`) as an endpoint with the
/// scheme of `base`: every node of a cluster serves its client port the same way.
fn normalize_hint(hint: &str, base: &str) -> String {
    if hint.contains("://") {
        hint.to_owned()
    } else if base.starts_with("https://") {
        format!("https://{hint}")
    } else {
        format!("http://{hint}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_is_capped_and_jittered() {
        for attempt in 1..20 {
            let d = backoff(attempt);
            assert!(d >= BACKOFF_FIRST.mul_f64(0.5), "{d:?}");
            assert!(d <= BACKOFF_MAX.mul_f64(1.5), "{d:?}");
        }
        let late: Vec<_> = (0..50).map(|_| backoff(10)).collect();
        assert!(late.iter().any(|d| *d != late[0]), "jittered");
    }

    fn routing(base: &str) -> Routing {
        let base: Arc<str> = base.into();
        let channel = make_channel(&base, &Authorizer::none(), &None).unwrap();
        Routing::new(
            base,
            channel,
            Authorizer::none(),
            RETRY_DEADLINE_DEFAULT,
            None,
        )
    }

    #[tokio::test]
    async fn an_unreachable_node_sends_calls_elsewhere() {
        let routing = routing("http://a:1");
        let base: Arc<str> = "http://a:1".into();
        // Only the first node is known: nowhere else to go.
        assert_eq!(routing.after_transport_failure(&base), base);
        let other: Arc<str> = "http://b:1".into();
        routing.channel(&other).unwrap();
        // Another node failed: back to the first; the first failed: the other one.
        assert_eq!(routing.after_transport_failure(&other), base);
        assert_eq!(routing.after_transport_failure(&base), other);
    }

    #[tokio::test]
    async fn leaders_are_remembered_and_forgotten() {
        let routing = routing("http://a:1");
        let key: PartitionKey = ("hub".into(), "0".into());
        routing.remember_leader(key.clone(), "b:2");
        let leader = routing.inner.leaders.lock().unwrap().get(&key).cloned();
        assert_eq!(leader.as_deref(), Some("http://b:2"));
        routing.forget_leader(&key);
        assert!(routing.inner.leaders.lock().unwrap().get(&key).is_none());
    }

    /// With no retry time left, a call still learns from its failure: a NOT_LEADER hint
    /// becomes the partition's leader, any other transient failure forgets the cached one.
    #[tokio::test]
    async fn a_failed_call_without_retries_learns_the_leader() {
        let base: Arc<str> = "http://a:1".into();
        let channel = make_channel(&base, &Authorizer::none(), &None).unwrap();
        let routing = Routing::new(base, channel, Authorizer::none(), Duration::ZERO, None);
        let key: PartitionKey = ("hub".into(), "0".into());
        routing.remember_leader(key.clone(), "stale:1");
        let tried = std::sync::Mutex::new(Vec::new());
        let not_leader = |endpoint: Arc<str>| {
            tried.lock().unwrap().push(endpoint.to_string());
            async {
                Err::<(), _>(ClientError::Service {
                    code: tonic::Code::FailedPrecondition,
                    reason: ErrorReason::NotLeader,
                    message: "not leader".into(),
                    retry_after: None,
                    leader_hint: Some("b:2".into()),
                })
            }
        };
        let err = routing
            .call(Some(key.clone()), |_, endpoint| not_leader(endpoint))
            .await
            .unwrap_err();
        assert!(matches!(err, ClientError::Service { .. }));
        assert_eq!(*tried.lock().unwrap(), ["http://stale:1"]);
        let leader = routing.inner.leaders.lock().unwrap().get(&key).cloned();
        assert_eq!(
            leader.as_deref(),
            Some("http://b:2"),
            "the hint is the leader now"
        );
        let _ = routing
            .call(Some(key.clone()), |_, endpoint| not_leader(endpoint))
            .await;
        assert_eq!(
            tried.lock().unwrap()[1],
            "http://b:2",
            "the next call goes there"
        );
        // A transport failure forgets the leader.
        let _ = routing
            .call(Some(key.clone()), |_, endpoint| async move {
                Err::<(), _>(ClientError::Transport {
                    endpoint: endpoint.to_string(),
                    message: "refused".into(),
                })
            })
            .await;
        assert!(routing.inner.leaders.lock().unwrap().get(&key).is_none());
    }

    #[test]
    fn hints_become_endpoints() {
        assert_eq!(
            normalize_hint("10.0.0.2:7400", "http://b:1"),
            "http://10.0.0.2:7400"
        );
        assert_eq!(
            normalize_hint("10.0.0.2:7400", "https://b:1"),
            "https://10.0.0.2:7400"
        );
        assert_eq!(normalize_hint("http://a:1", "https://b:1"), "http://a:1");
    }
}
