//! The bench's producers over AMQP 1.0 (`--amqp-addr`), with the AMQP client of
//! `tributary-amqp`: each producer has its own sender link, to `<hub>/Partitions/<id>` (or
//! `<hub>` with round robin and random keys), and keeps up to `--in-flight` deliveries
//! unsettled; a delivery is one event, or with `--batch-size` above 1 an Event Hubs batch
//! (message format 0x80013700) of that many events.
//!
//! Authentication: with a key, SASL PLAIN with the rule name and key (Tributary grants the
//! rule's rights on the namespace). Without one, SASL ANONYMOUS and a token on `$cbs`, as
//! the SDKs do; it is signed with a placeholder key, which only a node run with
//! `--auth none` accepts.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{Context as _, bail};
use bytes::Bytes;
use rand::rngs::StdRng;
use rand::{Rng as _, SeedableRng as _};
use tributary_amqp::server::SAS_TOKEN_TYPE;
use tributary_amqp::{DeliveryState, Message, condition};
use tributary_amqp_client::{
    self, ClientError, Connection, ConnectionOptions, Delivery, Sasl, Sender, SenderOptions,
    with_partition_key,
};

use crate::load::{Ack, KeyDistribution, SendError, Sink};

/// Connections the producers are spread over, as for gRPC: each connection's task serves
/// several sender links.
const CONNECTIONS_MAX: usize = 8;
/// How long the placeholder token is valid.
const TOKEN_LIFETIME: Duration = Duration::from_secs(24 * 3600);
/// The key a token is signed with when no key is given.
const PLACEHOLDER_KEY: &str = "tributary-bench";

/// Where and as whom the producers connect.
#[derive(Debug, Clone)]
pub(crate) struct AmqpTarget {
    /// The nodes' AMQP addresses; connection i goes to address i mod count.
    pub(crate) addrs: Vec<String>,
    pub(crate) hub: String,
    pub(crate) key_name: String,
    /// `None`: SASL ANONYMOUS and a placeholder token.
    pub(crate) key: Option<String>,
    /// Partition id to the index in `addrs` of its leader: a partition's producers connect
    /// there. Empty: connections go round robin.
    pub(crate) leaders: std::collections::HashMap<String, usize>,
}

/// One producer's sender link and how it picks keys.
pub(crate) struct AmqpSink {
    sender: Arc<Sender>,
    keys: Option<(Box<StdRng>, u32)>,
}

/// Opens the connections and one sender link per producer, each allowed `in_flight`
/// unsettled deliveries. The connections stay open as long as their links.
pub(crate) async fn sinks(
    target: &AmqpTarget,
    partition_ids: &[String],
    producers: usize,
    keys: KeyDistribution,
    key_count: u32,
    in_flight: u32,
) -> anyhow::Result<Vec<AmqpSink>> {
    if target.addrs.is_empty() {
        bail!("no AMQP address to send to: give --amqp-addr HOST:PORT");
    }
    let to_leaders = !target.leaders.is_empty() && keys == KeyDistribution::Partition;
    let mut connections = Vec::new();
    for index in 0..producers.clamp(1, CONNECTIONS_MAX) {
        if to_leaders {
            break;
        }
        let addr = &target.addrs[index % target.addrs.len()];
        connections.push(connect(target, addr, index).await?);
    }
    // With leaders known, one connection per node, opened as its first producer needs it.
    let mut by_node: Vec<Option<Connection>> = (0..target.addrs.len()).map(|_| None).collect();
    let mut sinks = Vec::with_capacity(producers);
    for index in 0..producers {
        let partition = &partition_ids[index % partition_ids.len()];
        let address = match keys {
            KeyDistribution::Partition => format!("{}/Partitions/{partition}", target.hub),
            KeyDistribution::RoundRobin | KeyDistribution::RandomKey => target.hub.clone(),
        };
        let options = SenderOptions {
            in_flight_max: in_flight.max(1) as usize,
        };
        let leader = target.leaders.get(partition).filter(|_| to_leaders);
        let connection = match leader {
            Some(&node) => {
                if by_node[node].is_none() {
                    by_node[node] = Some(connect(target, &target.addrs[node], node).await?);
                }
                by_node[node].as_ref().expect("opened above")
            }
            None if connections.is_empty() => bail!(
                "no leader is known for partition {partition}: it is not in the cluster status"
            ),
            None => &connections[index % connections.len()],
        };
        let sender = connection
            .open_sender(&address, options)
            .await
            .with_context(|| format!("cannot attach a sender link to '{address}'"))?;
        let keys = (keys == KeyDistribution::RandomKey).then(|| {
            (
                Box::new(StdRng::seed_from_u64(index as u64)),
                key_count.max(1),
            )
        });
        sinks.push(AmqpSink {
            sender: Arc::new(sender),
            keys,
        });
    }
    Ok(sinks)
}

/// One connection, authenticated for `target.hub`.
async fn connect(target: &AmqpTarget, addr: &str, index: usize) -> anyhow::Result<Connection> {
    let host = addr.rsplit_once(':').map_or(addr, |(host, _)| host);
    let sasl = match &target.key {
        Some(key) => Sasl::Plain {
            user: target.key_name.clone(),
            password: key.clone(),
        },
        None => Sasl::Anonymous,
    };
    let options = ConnectionOptions {
        container_id: format!("tributary-bench-{index}"),
        hostname: Some(host.to_owned()),
        sasl,
        ..ConnectionOptions::default()
    };
    let connection = tributary_amqp_client::connect(addr, options)
        .await
        .with_context(|| format!("cannot open an AMQP connection to {addr}"))?;
    if target.key.is_none() {
        let audience = format!("sb://{host}/{}", target.hub);
        let expiry_unix_s = (SystemTime::now() + TOKEN_LIFETIME)
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let token =
            tributary_types::sas::sign(&audience, &target.key_name, PLACEHOLDER_KEY, expiry_unix_s);
        let reply = connection
            .put_token(&audience, SAS_TOKEN_TYPE, &token)
            .await
            .with_context(|| format!("cannot put a token on $cbs at {addr}"))?;
        if !reply.is_success() {
            bail!(
                "the node at {addr} refused the bench's placeholder token ({} {}): run the \
                 nodes with --auth none, or give the rule's key with --amqp-key",
                reply.status_code,
                reply.status_description.unwrap_or_default()
            );
        }
    }
    Ok(connection)
}

impl AmqpSink {
    /// Hands one delivery of `bodies` to the link; the ack resolves with its outcome.
    async fn submit_delivery(&mut self, bodies: Vec<Bytes>) -> Result<Ack, SendError> {
        let key = self
            .keys
            .as_mut()
            .map(|(rng, count)| format!("key-{}", rng.random_range(0..*count)));
        let events: Vec<Message> = bodies.into_iter().map(Message::with_data).collect();
        let delivery = match (&events[..], &key) {
            ([event], None) => Delivery::event(event),
            ([event], Some(key)) => Delivery::event(&with_partition_key(event.clone(), key)),
            (events, key) => Delivery::batch(events, key.as_deref()),
        };
        let pending = self
            .sender
            .submit(delivery)
            .await
            .map_err(|error| SendError::Fatal(error.into()))?;
        Ok(Box::pin(async move { outcome(pending.await) }))
    }
}

impl Sink for AmqpSink {
    async fn send(&mut self, bodies: Vec<Bytes>) -> Result<(), SendError> {
        self.submit_delivery(bodies).await?.await
    }

    async fn publish(&mut self, body: Bytes) -> Result<Ack, SendError> {
        self.submit_delivery(vec![body]).await
    }

    async fn submit(&mut self, bodies: Vec<Bytes>) -> Result<Ack, SendError> {
        self.submit_delivery(bodies).await
    }
}

/// Accepted is success; throttling and timeouts are transient (the producer goes on);
/// anything else stops the bench with the server's reason.
fn outcome(result: Result<DeliveryState, ClientError>) -> Result<(), SendError> {
    match result {
        Ok(DeliveryState::Accepted) => Ok(()),
        Ok(DeliveryState::Rejected { error: Some(error) })
            if [condition::SERVER_BUSY, condition::TIMEOUT].contains(&error.condition.as_str()) =>
        {
            Err(SendError::Transient(None))
        }
        Ok(DeliveryState::Released) => Err(SendError::Transient(None)),
        Ok(DeliveryState::Rejected { error }) => Err(SendError::Fatal(anyhow::anyhow!(
            "the node rejected a delivery: {}",
            error.map_or_else(
                || "no reason given".to_owned(),
                |e| format!("{}: {}", e.condition, e.description.unwrap_or_default())
            )
        ))),
        Ok(other) => Err(SendError::Fatal(anyhow::anyhow!(
            "the node settled a delivery as {other:?}"
        ))),
        Err(error) => Err(SendError::Fatal(error.into())),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use tokio::net::TcpListener;
    use tributary_amqp::server::{
        AmqpEvent, Backend, BackendError, BackendErrorKind, BackendFuture, ConnectionLimits,
        EventStream, HubProperties, PartitionProperties, ReadRequest, Rights, SendOutcome,
        SendTarget, TokenGrant, serve_connection,
    };
    use tributary_types::SequenceNumber;

    use super::*;
    use crate::load::{self, Shape};

    /// Accepts every token (as a node with `--auth none` does) and the PLAIN user `root`
    /// with key `secret`; commits every send at once, or refuses them all as busy.
    #[derive(Default)]
    struct Recorder {
        tokens: Mutex<Vec<(String, String)>>,
        sends: Mutex<Vec<(SendTarget, usize)>>,
        busy: bool,
        refuse_tokens: bool,
    }

    impl Recorder {
        fn grant() -> TokenGrant {
            TokenGrant {
                rights: Rights {
                    send: true,
                    listen: true,
                    manage: true,
                },
                expires_at_unix_ms: i64::MAX,
                credential: String::new(),
            }
        }
    }

    impl Backend for Recorder {
        fn now_unix_ms(&self) -> i64 {
            0
        }

        fn sasl_plain<'a>(&'a self, user: &'a str, key: &'a str) -> BackendFuture<'a, TokenGrant> {
            let known = (user, key) == ("root", "secret");
            Box::pin(async move {
                known
                    .then(Recorder::grant)
                    .ok_or_else(|| BackendError::unauthorized("wrong key"))
            })
        }

        fn put_token<'a>(
            &'a self,
            audience: &'a str,
            _token_type: &'a str,
            token: &'a str,
        ) -> BackendFuture<'a, TokenGrant> {
            let tokens = &self.tokens;
            tokens
                .lock()
                .unwrap()
                .push((audience.to_owned(), token.to_owned()));
            let refuse = self.refuse_tokens;
            Box::pin(async move {
                if refuse {
                    return Err(BackendError::unauthorized("the signature does not match"));
                }
                Ok(Recorder::grant())
            })
        }

        fn hub_properties<'a>(
            &'a self,
            _grant: &'a TokenGrant,
            _hub: &'a str,
        ) -> BackendFuture<'a, HubProperties> {
            Box::pin(async { Err(BackendError::not_found("not in this test")) })
        }

        fn partition_properties<'a>(
            &'a self,
            _grant: &'a TokenGrant,
            _hub: &'a str,
            _partition: &'a str,
        ) -> BackendFuture<'a, PartitionProperties> {
            Box::pin(async { Err(BackendError::not_found("not in this test")) })
        }

        fn send(
            &self,
            _grant: &TokenGrant,
            _hub: &str,
            target: SendTarget,
            events: Vec<AmqpEvent>,
        ) -> BackendFuture<'static, SendOutcome> {
            let count = events.len();
            let partition_id = match &target {
                SendTarget::PartitionId(id) => id.clone(),
                _ => "0".to_owned(),
            };
            let busy = self.busy;
            if !busy {
                self.sends.lock().unwrap().push((target, count));
            }
            Box::pin(async move {
                if busy {
                    return Err(BackendError::new(BackendErrorKind::ServerBusy, "throttled"));
                }
                Ok(SendOutcome {
                    partition_id,
                    first_sequence_number: SequenceNumber(0),
                })
            })
        }

        fn read(
            &self,
            _grant: &TokenGrant,
            _request: ReadRequest,
        ) -> BackendFuture<'static, EventStream> {
            Box::pin(async { Err(BackendError::not_found("not in this test")) })
        }
    }

    /// An AMQP listener on a free port serving `backend`; its address.
    async fn listen(backend: Arc<Recorder>) -> String {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let backend: Arc<dyn Backend> = backend.clone();
                tokio::spawn(serve_connection(
                    stream,
                    backend,
                    ConnectionLimits::default(),
                ));
            }
        });
        addr
    }

    fn target(addr: String, key: Option<&str>) -> AmqpTarget {
        AmqpTarget {
            addrs: vec![addr],
            hub: "hub".into(),
            key_name: "root".into(),
            key: key.map(str::to_owned),
            leaders: Default::default(),
        }
    }

    fn shape(batch_size: u32, in_flight: u32) -> Shape {
        Shape {
            batch_size,
            in_flight,
            event_size: 1024,
            duration: Duration::from_millis(300),
            rate: None,
            timestamps: false,
        }
    }

    fn partitions() -> Vec<String> {
        vec!["0".into(), "1".into()]
    }

    #[tokio::test]
    async fn pipelined_batches_reach_every_partition_and_are_all_counted() {
        let backend = Arc::new(Recorder::default());
        let addr = listen(backend.clone()).await;
        let sinks = sinks(
            &target(addr.clone(), None),
            &partitions(),
            4,
            KeyDistribution::Partition,
            1,
            8,
        )
        .await
        .unwrap();
        let outcome = load::run(sinks, &shape(16, 8)).await.unwrap();
        assert!(outcome.sends > 0);
        assert_eq!(outcome.errors, 0);
        assert_eq!(outcome.latency_us.len(), outcome.sends);
        let sends = backend.sends.lock().unwrap().clone();
        // Every acknowledged delivery was one batch of 16 committed by the backend.
        assert!(sends.len() as u64 >= outcome.sends);
        assert!(sends.iter().all(|(_, events)| *events == 16));
        for partition in partitions() {
            let target = SendTarget::PartitionId(partition);
            assert!(sends.iter().any(|(t, _)| *t == target), "{target:?}");
        }
        // ANONYMOUS, then a token for the hub on every connection.
        let tokens = backend.tokens.lock().unwrap().clone();
        assert_eq!(tokens.len(), 4, "one per connection");
        let host = addr.rsplit_once(':').unwrap().0;
        for (audience, token) in tokens {
            assert_eq!(audience, format!("sb://{host}/hub"));
            assert!(token.starts_with("SharedAccessSignature "), "{token}");
        }
    }

    #[tokio::test]
    async fn events_one_by_one_with_random_keys_go_to_the_hub() {
        let backend = Arc::new(Recorder::default());
        let addr = listen(backend.clone()).await;
        let sinks = sinks(
            &target(addr, Some("secret")),
            &partitions(),
            2,
            KeyDistribution::RandomKey,
            5,
            16,
        )
        .await
        .unwrap();
        let outcome = load::run(sinks, &shape(1, 16)).await.unwrap();
        assert!(outcome.sends > 0);
        let sends = backend.sends.lock().unwrap().clone();
        assert!(sends.iter().all(|(target, events)| {
            *events == 1 && matches!(target, SendTarget::PartitionKey(k) if k.starts_with("key-"))
        }));
        assert!(
            backend.tokens.lock().unwrap().is_empty(),
            "PLAIN needs no token"
        );
    }

    #[tokio::test]
    async fn a_throttled_node_counts_errors_and_the_bench_goes_on() {
        let backend = Arc::new(Recorder {
            busy: true,
            ..Recorder::default()
        });
        let addr = listen(backend).await;
        let sinks = sinks(
            &target(addr, None),
            &partitions(),
            1,
            KeyDistribution::RoundRobin,
            1,
            1,
        )
        .await
        .unwrap();
        let outcome = load::run(sinks, &shape(4, 1)).await.unwrap();
        assert_eq!(outcome.sends, 0);
        assert!(outcome.errors > 0);
    }

    #[tokio::test]
    async fn refused_credentials_say_what_to_do() {
        let backend = Arc::new(Recorder {
            refuse_tokens: true,
            ..Recorder::default()
        });
        let addr = listen(backend).await;
        let error = sinks(
            &target(addr.clone(), None),
            &partitions(),
            1,
            KeyDistribution::Partition,
            1,
            1,
        )
        .await
        .err()
        .unwrap();
        assert!(format!("{error:#}").contains("--auth none"), "{error:#}");
        let error = sinks(
            &target(addr, Some("wrong")),
            &partitions(),
            1,
            KeyDistribution::Partition,
            1,
            1,
        )
        .await
        .err()
        .unwrap();
        assert!(format!("{error:#}").contains("SASL PLAIN"), "{error:#}");
    }
}
