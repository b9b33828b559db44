//! The connection to a Tributary node and the management calls.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tributary_proto::v1 as proto;
use tributary_proto::v1::management_client::ManagementClient as ManagementStub;
use tributary_types::{ConnectionString, Rights};

use crate::credential::{Authorizer, TokenSource, Transport, UnixClock, endpoint_url};
use crate::routing::{Channel, RETRY_DEADLINE_DEFAULT, Routing, Tls, make_channel};

use crate::{ClientError, ConsumerClient, ProducerClient};

/// How [`Client::connect_with`] connects. `ClientOptions::default()` is what
/// [`Client::connect`] uses.
#[derive(Debug, Clone, Default)]
pub struct ClientOptions {
    /// PEM file of the CA that signed the nodes' client-port certificates: `https://`
    /// endpoints trust it, and only it. Needed for `https://` endpoints.
    pub ca_cert: Option<PathBuf>,
}

impl ClientOptions {
    fn tls(&self) -> Result<Tls, ClientError> {
        let Some(path) = &self.ca_cert else {
            return Ok(None);
        };
        let certificates = crate::tls::read_certificates(path)
            .map_err(|e| ClientError::InvalidArgument(format!("CA certificate: {e}")))?;
        let config = crate::tls::client_config(&certificates, None).map_err(|reason| {
            ClientError::InvalidArgument(format!("CA certificate {}: {reason}", path.display()))
        })?;
        Ok(Some(Arc::new(config)))
    }
}

/// A connection to one Tributary node. Cheap to clone: clones share the connection.
#[derive(Debug, Clone)]
pub struct Client {
    pub(crate) channel: Channel,
    pub(crate) endpoint: Arc<str>,
    pub(crate) routing: Routing,
    pub(crate) authorizer: Authorizer,
}

/// How [`Client::from_connection_string_with`] connects.
#[derive(Clone)]
pub struct ConnectOptions {
    /// Whether an `sb://` endpoint is reached over TLS (the default) or plain HTTP/2.
    pub transport: Transport,
    /// Overrides the connection string's endpoint (e.g. `http://127.0.0.1:7400`); the
    /// credential still comes from the string.
    pub endpoint: Option<String>,
    /// Seconds since the Unix epoch, for signing and renewing tokens.
    pub clock: UnixClock,
    /// For an `https://` endpoint: PEM file of the CA that signed the nodes' client-port
    /// certificates (see [`ClientOptions::ca_cert`]).
    pub ca_cert: Option<PathBuf>,
}

impl Default for ConnectOptions {
    fn default() -> Self {
        ConnectOptions {
            transport: Transport::default(),
            endpoint: None,
            clock: crate::credential::system_clock(),
            ca_cert: None,
        }
    }
}

impl std::fmt::Debug for ConnectOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConnectOptions")
            .field("transport", &self.transport)
            .field("endpoint", &self.endpoint)
            .finish_non_exhaustive()
    }
}

/// A rule's keys, and connection strings made with them.
#[derive(Clone, PartialEq, Eq)]
pub struct RuleKeys {
    pub rule: proto::AuthorizationRule,
    pub primary_key: String,
    pub secondary_key: String,
    pub primary_connection_string: String,
    pub secondary_connection_string: String,
}

/// Never shows the keys.
impl std::fmt::Debug for RuleKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RuleKeys")
            .field("rule", &self.rule)
            .finish_non_exhaustive()
    }
}

/// Which of a rule's two keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RuleKey {
    Primary,
    Secondary,
}

impl Client {
    /// Prepares a connection to `endpoint`, e.g. `http://127.0.0.1:7400` (the scheme may be
    /// left out). The connection is made on the first call and remade when it breaks, so an
    /// unreachable node shows up as a [`ClientError::Transport`] from that call; a malformed
    /// endpoint is an error here.
    pub async fn connect(endpoint: &str) -> Result<Client, ClientError> {
        Client::connect_with(endpoint, ClientOptions::default()).await
    }

    /// Like [`Client::connect`], with options: for an `https://` endpoint, the CA that
    /// signed the nodes' client-port certificates. Channels to other nodes (a partition's
    /// leader) use the same scheme and TLS settings.
    pub async fn connect_with(
        endpoint: &str,
        options: ClientOptions,
    ) -> Result<Client, ClientError> {
        Client::connect_with_authorizer(endpoint, Authorizer::none(), options.tls()?)
    }

    /// Connects as an Event Hubs connection string says
    /// (`Endpoint=sb://host[:port]/;SharedAccessKeyName=...;SharedAccessKey=...[;EntityPath=hub]`,
    /// or `SharedAccessSignature=...` in place of the key), with default options: every call
    /// carries a token the client signs for the string's hub (or namespace) and renews
    /// before it expires.
    pub async fn from_connection_string(text: &str) -> Result<Client, ClientError> {
        Client::from_connection_string_with(text, ConnectOptions::default()).await
    }

    /// [`Client::from_connection_string`] with options.
    pub async fn from_connection_string_with(
        text: &str,
        options: ConnectOptions,
    ) -> Result<Client, ClientError> {
        let connection_string = ConnectionString::parse(text)
            .map_err(|e| ClientError::InvalidArgument(e.to_string()))?;
        let endpoint = match options.endpoint {
            Some(endpoint) => endpoint,
            None => endpoint_url(&connection_string, options.transport)?,
        };
        let tls = ClientOptions {
            ca_cert: options.ca_cert,
        }
        .tls()?;
        let authorizer = Authorizer::new(TokenSource::new(connection_string, options.clock));
        Client::connect_with_authorizer(&endpoint, authorizer, tls)
    }

    fn connect_with_authorizer(
        endpoint: &str,
        authorizer: Authorizer,
        tls: Tls,
    ) -> Result<Client, ClientError> {
        let endpoint: Arc<str> = normalize_endpoint(endpoint)?.into();
        let channel = make_channel(&endpoint, &authorizer, &tls)?;
        Ok(Client {
            routing: Routing::new(
                endpoint.clone(),
                channel.clone(),
                authorizer.clone(),
                RETRY_DEADLINE_DEFAULT,
                tls,
            ),
            channel,
            endpoint,
            authorizer,
        })
    }

    /// Like [`Client::connect`] to the first of `endpoints`, knowing the others from the
    /// start (as Kafka's bootstrap servers): when the node a call goes to cannot be reached,
    /// the call is retried on another of them, so no single node being down stops the
    /// client.
    pub async fn connect_any<S: AsRef<str>>(endpoints: &[S]) -> Result<Client, ClientError> {
        Client::connect_any_with(endpoints, ClientOptions::default()).await
    }

    /// [`Client::connect_any`] with options (see [`Client::connect_with`]).
    pub async fn connect_any_with<S: AsRef<str>>(
        endpoints: &[S],
        options: ClientOptions,
    ) -> Result<Client, ClientError> {
        let Some((first, others)) = endpoints.split_first() else {
            return Err(ClientError::InvalidArgument(
                "at least one endpoint is needed, e.g. http://127.0.0.1:7400".into(),
            ));
        };
        Client::connect_with(first.as_ref(), options)
            .await?
            .knowing(others)
    }

    /// This client, also knowing `others` as nodes to try when one cannot be reached.
    pub fn knowing<S: AsRef<str>>(self, others: &[S]) -> Result<Client, ClientError> {
        let client = self;
        for other in others {
            let other = normalize_endpoint(other.as_ref())?;
            client.routing.know_endpoint(&other.into())?;
        }
        Ok(client)
    }

    /// The same connection with another limit on how long sends and reads keep retrying
    /// transient failures (leader changes, a node restarting); zero disables retries.
    pub fn with_retry_deadline(&self, retry_deadline: Duration) -> Client {
        Client {
            routing: self.routing_over(self.channel.clone(), retry_deadline),
            channel: self.channel.clone(),
            endpoint: self.endpoint.clone(),
            authorizer: self.authorizer.clone(),
        }
    }

    /// Routing like this client's (the nodes it knows) over `channel` to the first node.
    fn routing_over(&self, channel: Channel, retry_deadline: Duration) -> Routing {
        let routing = Routing::new(
            self.endpoint.clone(),
            channel,
            self.authorizer.clone(),
            retry_deadline,
            self.routing.tls().clone(),
        );
        for endpoint in self.routing.known_endpoints() {
            // Known endpoints were valid when first made.
            let _ = routing.know_endpoint(&endpoint);
        }
        routing
    }

    /// A client to the same endpoint over a connection of its own (same retry deadline):
    /// calls that must not wait behind busy streams on a shared connection (HTTP/2 flow
    /// control is per connection) use it.
    pub fn separate_connection(&self) -> Result<Client, ClientError> {
        let channel = make_channel(&self.endpoint, &self.authorizer, self.routing.tls())?;
        Ok(Client {
            routing: self.routing_over(channel.clone(), self.routing.retry_deadline()),
            channel,
            endpoint: self.endpoint.clone(),
            authorizer: self.authorizer.clone(),
        })
    }

    /// The endpoint this client talks to.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// A producer sharing this client's connections.
    pub fn producer(&self) -> ProducerClient {
        ProducerClient::new(self.routing.clone())
    }

    /// A producer that batches enqueued events itself, sharing this client's connections.
    pub fn buffered_producer(&self, options: crate::BufferedOptions) -> crate::BufferedProducer {
        crate::BufferedProducer::new(self.producer(), options)
    }

    /// An idempotent producer (a new producer id) sharing this client's connections.
    pub fn idempotent_producer(&self) -> crate::IdempotentProducer {
        crate::IdempotentProducer::new(self.producer())
    }

    /// The checkpoint store the cluster hosts, sharing this client's connections.
    pub fn checkpoint_store(&self) -> crate::ClusterCheckpointStore {
        crate::ClusterCheckpointStore::new(self)
    }

    /// A consumer sharing this client's connections.
    pub fn consumer(&self) -> ConsumerClient {
        ConsumerClient::new(self.routing.clone())
    }

    /// Creates an event hub. `retention: None` takes the service default (24 h).
    pub async fn create_event_hub(
        &self,
        name: &str,
        partition_count: u32,
        retention: Option<Duration>,
    ) -> Result<proto::EventHubProperties, ClientError> {
        self.create_replicated_event_hub(name, partition_count, retention, None)
            .await
    }

    /// Creates an event hub with `replication_factor` replicas per partition (`None`: the
    /// service default, 3 or fewer on a smaller cluster).
    pub async fn create_replicated_event_hub(
        &self,
        name: &str,
        partition_count: u32,
        retention: Option<Duration>,
        replication_factor: Option<u32>,
    ) -> Result<proto::EventHubProperties, ClientError> {
        self.create_event_hub_with(name, partition_count, retention, replication_factor, 0)
            .await
    }

    /// Creates an event hub reserving `throughput_units` (1 MB/s or 1,000 events/s in,
    /// 2 MB/s or 4,096 events/s out each; 0: unthrottled).
    pub async fn create_event_hub_with(
        &self,
        name: &str,
        partition_count: u32,
        retention: Option<Duration>,
        replication_factor: Option<u32>,
        throughput_units: u32,
    ) -> Result<proto::EventHubProperties, ClientError> {
        let options = HubOptions {
            retention,
            replication_factor,
            throughput_units,
            ..HubOptions::default()
        };
        self.create_event_hub_with_options(name, partition_count, &options)
            .await
    }

    /// Creates an event hub with every setting of `options`.
    pub async fn create_event_hub_with_options(
        &self,
        name: &str,
        partition_count: u32,
        options: &HubOptions,
    ) -> Result<proto::EventHubProperties, ClientError> {
        require_name("event hub name", name)?;
        if partition_count == 0 {
            return Err(ClientError::InvalidArgument(
                "an event hub needs at least one partition".into(),
            ));
        }
        let request = proto::CreateEventHubRequest {
            name: name.to_owned(),
            partition_count,
            retention_ms: options
                .retention
                .map(|d| positive_ms("retention", d))
                .transpose()?
                .unwrap_or(0),
            replication_factor: options.replication_factor.unwrap_or(0),
            throughput_units: options.throughput_units,
            cleanup_policy: options.cleanup_policy.unwrap_or_default() as i32,
            tombstone_retention_ms: options
                .tombstone_retention
                .map(|d| positive_ms("tombstone retention", d))
                .transpose()?
                .unwrap_or(0),
            compaction_lag_ms: options.compaction_lag.map_or(0, |d| d.as_millis() as u64),
            retention_bytes_max: options.retention_bytes_max.unwrap_or(0),
            capture: options
                .capture
                .as_ref()
                .map(CaptureOptions::to_proto)
                .transpose()?,
        };
        let response = self.management().create_event_hub(request).await;
        self.unwrap(response)
    }

    /// Changes an event hub's reserved throughput units (0: unthrottled); sends and reads
    /// are held to the new rate at once.
    pub async fn set_throughput_units(
        &self,
        name: &str,
        throughput_units: u32,
    ) -> Result<proto::EventHubProperties, ClientError> {
        let changes = HubChanges {
            throughput_units: Some(throughput_units),
            ..HubChanges::default()
        };
        self.update_event_hub(name, &changes).await
    }

    /// Changes the settings `changes` names; the others stay. They apply at once.
    pub async fn update_event_hub(
        &self,
        name: &str,
        changes: &HubChanges,
    ) -> Result<proto::EventHubProperties, ClientError> {
        require_name("event hub name", name)?;
        let request = proto::UpdateEventHubRequest {
            name: name.to_owned(),
            throughput_units: changes.throughput_units,
            retention_ms: changes
                .retention
                .map(|d| positive_ms("retention", d))
                .transpose()?,
            cleanup_policy: changes.cleanup_policy.map(|p| p as i32),
            tombstone_retention_ms: changes
                .tombstone_retention
                .map(|d| positive_ms("tombstone retention", d))
                .transpose()?,
            compaction_lag_ms: changes.compaction_lag.map(|d| d.as_millis() as u64),
            retention_bytes_max: changes.retention_bytes_max,
            capture: match &changes.capture {
                Some(Some(capture)) => Some(capture.to_proto()?),
                _ => None,
            },
            capture_off: matches!(changes.capture, Some(None)),
        };
        let response = self.management().update_event_hub(request).await;
        self.unwrap(response)
    }

    /// An event hub's properties, including its partition ids.
    pub async fn get_event_hub(
        &self,
        name: &str,
    ) -> Result<proto::EventHubProperties, ClientError> {
        require_name("event hub name", name)?;
        let request = proto::GetEventHubRequest {
            name: name.to_owned(),
        };
        let response = self.management().get_event_hub(request).await;
        self.unwrap(response)
    }

    pub async fn list_event_hubs(&self) -> Result<Vec<proto::EventHubProperties>, ClientError> {
        let response = self
            .management()
            .list_event_hubs(proto::ListEventHubsRequest {})
            .await;
        Ok(self.unwrap(response)?.event_hubs)
    }

    /// Deletes an event hub with its events, consumer groups and checkpoints.
    pub async fn delete_event_hub(&self, name: &str) -> Result<(), ClientError> {
        require_name("event hub name", name)?;
        let request = proto::DeleteEventHubRequest {
            name: name.to_owned(),
        };
        let response = self.management().delete_event_hub(request).await;
        self.unwrap(response).map(drop)
    }

    pub async fn create_consumer_group(
        &self,
        event_hub: &str,
        name: &str,
    ) -> Result<proto::ConsumerGroupProperties, ClientError> {
        require_name("event hub name", event_hub)?;
        require_name("consumer group name", name)?;
        let request = proto::CreateConsumerGroupRequest {
            event_hub: event_hub.to_owned(),
            name: name.to_owned(),
        };
        let response = self.management().create_consumer_group(request).await;
        self.unwrap(response)
    }

    pub async fn list_consumer_groups(
        &self,
        event_hub: &str,
    ) -> Result<Vec<proto::ConsumerGroupProperties>, ClientError> {
        require_name("event hub name", event_hub)?;
        let request = proto::ListConsumerGroupsRequest {
            event_hub: event_hub.to_owned(),
        };
        let response = self.management().list_consumer_groups(request).await;
        Ok(self.unwrap(response)?.consumer_groups)
    }

    pub async fn delete_consumer_group(
        &self,
        event_hub: &str,
        name: &str,
    ) -> Result<(), ClientError> {
        require_name("event hub name", event_hub)?;
        require_name("consumer group name", name)?;
        let request = proto::DeleteConsumerGroupRequest {
            event_hub: event_hub.to_owned(),
            name: name.to_owned(),
        };
        let response = self.management().delete_consumer_group(request).await;
        self.unwrap(response).map(drop)
    }

    /// A partition's retained range and last enqueued event.
    pub async fn get_partition_properties(
        &self,
        event_hub: &str,
        partition_id: &str,
    ) -> Result<proto::PartitionProperties, ClientError> {
        require_name("event hub name", event_hub)?;
        require_name("partition id", partition_id)?;
        let request = proto::GetPartitionPropertiesRequest {
            event_hub: event_hub.to_owned(),
            partition_id: partition_id.to_owned(),
        };
        let key = (event_hub.to_owned(), partition_id.to_owned());
        self.routing
            .call(Some(key), |channel, endpoint| {
                let request = request.clone();
                async move {
                    ManagementStub::new(channel)
                        .get_partition_properties(request)
                        .await
                        .map(tonic::Response::into_inner)
                        .map_err(|status| ClientError::from_status(status, &endpoint))
                }
            })
            .await
    }

    /// Nodes, the controller leader, and every partition's leader and replicas.
    pub async fn cluster_status(&self) -> Result<proto::ClusterStatus, ClientError> {
        let response = self
            .management()
            .get_cluster_status(proto::GetClusterStatusRequest {})
            .await;
        self.unwrap(response)
    }

    /// Drains node `node_id` (`drain`: every partition leader moves off it, for
    /// maintenance or a rolling restart; its replicas stay and keep up), or lets leaders
    /// return to it (`drain` false).
    pub async fn drain_node(&self, node_id: u64, drain: bool) -> Result<(), ClientError> {
        let response = self
            .management()
            .drain_node(proto::DrainNodeRequest { node_id, drain })
            .await;
        self.unwrap(response).map(|_| ())
    }

    /// Decommissions node `node_id` (`decommission`: the placement controller moves every
    /// replica off it, after which it can be removed), or stops doing so.
    pub async fn decommission_node(
        &self,
        node_id: u64,
        decommission: bool,
    ) -> Result<(), ClientError> {
        let response = self
            .management()
            .decommission_node(proto::DecommissionNodeRequest {
                node_id,
                decommission,
            })
            .await;
        self.unwrap(response).map(|_| ())
    }

    /// The replica and leader moves the placement controller would make now.
    pub async fn plan_rebalance(&self) -> Result<proto::PlanRebalanceResponse, ClientError> {
        let response = self
            .management()
            .plan_rebalance(proto::PlanRebalanceRequest {})
            .await;
        self.unwrap(response)
    }

    /// Creates a shared access authorization rule of the namespace (`hub: None`) or of a
    /// hub, with two random keys; [`Client::authorization_rule_keys`] shows them.
    pub async fn create_authorization_rule(
        &self,
        hub: Option<&str>,
        name: &str,
        rights: Rights,
    ) -> Result<proto::AuthorizationRule, ClientError> {
        require_name("rule name", name)?;
        let rights = rights
            .to_string()
            .split(", ")
            .filter(|right| *right != "none")
            .map(str::to_owned)
            .collect();
        let response = self
            .management()
            .create_authorization_rule(proto::CreateAuthorizationRuleRequest {
                event_hub: hub.unwrap_or_default().to_owned(),
                name: name.to_owned(),
                rights,
            })
            .await;
        self.unwrap(response)
    }

    /// The rules of the namespace (`hub: None`) or of a hub: names and rights.
    pub async fn list_authorization_rules(
        &self,
        hub: Option<&str>,
    ) -> Result<Vec<proto::AuthorizationRule>, ClientError> {
        let response = self
            .management()
            .list_authorization_rules(proto::ListAuthorizationRulesRequest {
                event_hub: hub.unwrap_or_default().to_owned(),
            })
            .await;
        Ok(self.unwrap(response)?.rules)
    }

    /// A rule's keys and the connection strings made with them (needs Manage).
    pub async fn authorization_rule_keys(
        &self,
        hub: Option<&str>,
        name: &str,
    ) -> Result<RuleKeys, ClientError> {
        require_name("rule name", name)?;
        let response = self
            .management()
            .get_authorization_rule_keys(proto::GetAuthorizationRuleKeysRequest {
                event_hub: hub.unwrap_or_default().to_owned(),
                name: name.to_owned(),
            })
            .await;
        Ok(rule_keys(self.unwrap(response)?))
    }

    /// Replaces one of a rule's keys with a random one (or `new_key`): tokens signed with
    /// the old key stop working at once; the other key's go on.
    pub async fn regenerate_authorization_rule_key(
        &self,
        hub: Option<&str>,
        name: &str,
        key: RuleKey,
        new_key: Option<&str>,
    ) -> Result<RuleKeys, ClientError> {
        require_name("rule name", name)?;
        let key = match key {
            RuleKey::Primary => proto::AuthorizationKey::PrimaryKey,
            RuleKey::Secondary => proto::AuthorizationKey::SecondaryKey,
        };
        let response = self
            .management()
            .regenerate_authorization_rule_key(proto::RegenerateAuthorizationRuleKeyRequest {
                event_hub: hub.unwrap_or_default().to_owned(),
                name: name.to_owned(),
                key: key as i32,
                key_value: new_key.unwrap_or_default().to_owned(),
            })
            .await;
        Ok(rule_keys(self.unwrap(response)?))
    }

    /// Deletes a rule; tokens signed with its keys stop working.
    pub async fn delete_authorization_rule(
        &self,
        hub: Option<&str>,
        name: &str,
    ) -> Result<(), ClientError> {
        require_name("rule name", name)?;
        let response = self
            .management()
            .delete_authorization_rule(proto::DeleteAuthorizationRuleRequest {
                event_hub: hub.unwrap_or_default().to_owned(),
                name: name.to_owned(),
            })
            .await;
        self.unwrap(response).map(drop)
    }

    fn management(&self) -> ManagementStub<Channel> {
        ManagementStub::new(self.channel.clone())
    }

    fn unwrap<T>(
        &self,
        response: Result<tonic::Response<T>, tonic::Status>,
    ) -> Result<T, ClientError> {
        response
            .map(tonic::Response::into_inner)
            .map_err(|status| ClientError::from_status(status, &self.endpoint))
    }
}

fn rule_keys(keys: proto::AuthorizationRuleKeys) -> RuleKeys {
    RuleKeys {
        rule: keys.rule.unwrap_or_default(),
        primary_key: keys.primary_key,
        secondary_key: keys.secondary_key,
        primary_connection_string: keys.primary_connection_string,
        secondary_connection_string: keys.secondary_connection_string,
    }
}

/// Client-side check for the mistake the service would otherwise report less clearly.
pub(crate) fn require_name(what: &str, value: &str) -> Result<(), ClientError> {
    if value.is_empty() {
        return Err(ClientError::InvalidArgument(format!(
            "the {what} must not be empty"
        )));
    }
    Ok(())
}

/// Adds `http://` when no scheme is given; refuses schemes other than http and https.
fn normalize_endpoint(endpoint: &str) -> Result<String, ClientError> {
    let endpoint = endpoint.trim();
    if endpoint.is_empty() {
        return Err(ClientError::InvalidArgument(
            "the endpoint must not be empty; expected e.g. http://127.0.0.1:7400".into(),
        ));
    }
    match endpoint.split_once("://") {
        None => Ok(format!("http://{endpoint}")),
        Some(("http" | "https", _)) => Ok(endpoint.to_owned()),
        Some((scheme, _)) => Err(ClientError::InvalidArgument(format!(
            "endpoint '{endpoint}': unsupported scheme '{scheme}'; expected http://host:port or https://host:port"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_get_a_scheme_and_bad_ones_are_refused() {
        assert_eq!(
            normalize_endpoint("127.0.0.1:7400").unwrap(),
            "http://127.0.0.1:7400"
        );
        assert_eq!(
            normalize_endpoint("http://node-0:7400").unwrap(),
            "http://node-0:7400"
        );
        assert!(normalize_endpoint("").is_err());
        assert!(normalize_endpoint("ftp://x").is_err());
        assert_eq!(normalize_endpoint("https://x:1").unwrap(), "https://x:1");
    }

    #[tokio::test]
    async fn malformed_url_is_an_error_at_connect() {
        let error = Client::connect("http://bad host:7400").await.unwrap_err();
        assert!(matches!(error, ClientError::InvalidArgument(_)), "{error}");
        assert!(error.to_string().contains("not a valid URL"), "{error}");
    }

    #[tokio::test]
    async fn a_client_of_several_nodes_goes_on_when_the_first_is_down() {
        let down = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let down_port = down.local_addr().unwrap().port();
        drop(down);
        // A stand-in node that answers every call with an error of its own.
        let up = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let up_port = up.local_addr().unwrap().port();
        let server = tokio::spawn(async move {
            let incoming = tokio_stream::wrappers::TcpListenerStream::new(up);
            tonic::transport::Server::builder()
                .add_service(
                    tributary_proto::v1::checkpoint_store_server::CheckpointStoreServer::new(
                        RefusingStore,
                    ),
                )
                .serve_with_incoming(incoming)
                .await
        });
        let endpoints = [
            format!("127.0.0.1:{down_port}"),
            format!("http://127.0.0.1:{up_port}"),
        ];
        let client = Client::connect_any(&endpoints)
            .await
            .unwrap()
            .with_retry_deadline(std::time::Duration::from_secs(5));
        use crate::CheckpointStore as _;
        let error = client
            .checkpoint_store()
            .list_ownership("hub", "group")
            .await
            .unwrap_err();
        // The refusal came from the second node: the first one's absence was worked around.
        assert!(
            error.to_string().contains("refused by the stand-in"),
            "{error}"
        );
        // The same holds for a client made from it.
        let error = client
            .separate_connection()
            .unwrap()
            .checkpoint_store()
            .list_ownership("hub", "group")
            .await
            .unwrap_err();
        assert!(
            error.to_string().contains("refused by the stand-in"),
            "{error}"
        );
        server.abort();
        assert!(matches!(
            Client::connect_any::<&str>(&[]).await,
            Err(ClientError::InvalidArgument(_))
        ));
    }

    struct RefusingStore;

    #[tonic::async_trait]
    impl tributary_proto::v1::checkpoint_store_server::CheckpointStore for RefusingStore {
        async fn list_ownership(
            &self,
            _request: tonic::Request<proto::ListOwnershipRequest>,
        ) -> Result<tonic::Response<proto::ListOwnershipResponse>, tonic::Status> {
            Err(tonic::Status::permission_denied("refused by the stand-in"))
        }
        async fn claim_ownership(
            &self,
            _request: tonic::Request<proto::ClaimOwnershipRequest>,
        ) -> Result<tonic::Response<proto::ClaimOwnershipResponse>, tonic::Status> {
            Err(tonic::Status::permission_denied("refused by the stand-in"))
        }
        async fn update_checkpoint(
            &self,
            _request: tonic::Request<proto::UpdateCheckpointRequest>,
        ) -> Result<tonic::Response<proto::Checkpoint>, tonic::Status> {
            Err(tonic::Status::permission_denied("refused by the stand-in"))
        }
        async fn list_checkpoints(
            &self,
            _request: tonic::Request<proto::ListCheckpointsRequest>,
        ) -> Result<tonic::Response<proto::ListCheckpointsResponse>, tonic::Status> {
            Err(tonic::Status::permission_denied("refused by the stand-in"))
        }
        async fn list_kafka_offsets(
            &self,
            _request: tonic::Request<proto::ListKafkaOffsetsRequest>,
        ) -> Result<tonic::Response<proto::ListKafkaOffsetsResponse>, tonic::Status> {
            Err(tonic::Status::permission_denied("refused by the stand-in"))
        }
    }

    #[tokio::test]
    async fn unreachable_node_is_a_transport_error() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        drop(listener);
        let client = Client::connect(&format!("127.0.0.1:{port}")).await.unwrap();
        let error = client.list_event_hubs().await.unwrap_err();
        assert!(matches!(error, ClientError::Transport { .. }), "{error:?}");
        assert!(
            error.to_string().starts_with(&format!(
                "cannot reach the Tributary node at http://127.0.0.1:{port}: "
            )),
            "{error}"
        );
    }
}

/// Settings of a new event hub; `None` takes the service default.
#[derive(Debug, Clone, Default)]
pub struct HubOptions {
    /// How long events are kept [24 h].
    pub retention: Option<Duration>,
    /// Replicas per partition [3, or fewer on a smaller cluster].
    pub replication_factor: Option<u32>,
    /// Reserved throughput units; 0: unthrottled.
    pub throughput_units: u32,
    /// What happens to old events [delete].
    pub cleanup_policy: Option<proto::CleanupPolicy>,
    /// Compacted hubs: how long a tombstone stays [24 h].
    pub tombstone_retention: Option<Duration>,
    /// Compacted hubs: events younger than this are never compacted away [0].
    pub compaction_lag: Option<Duration>,
    /// Per partition, the most bytes retained [no cap].
    pub retention_bytes_max: Option<u64>,
    /// Capture the hub's events to Avro files from its creation [off].
    pub capture: Option<CaptureOptions>,
}

/// Event Hubs Capture settings: where each partition's files go and when a window closes
/// (whichever of the time and size windows closes first); `None` takes the service default.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CaptureOptions {
    /// `file:///absolute/dir`, or `s3://bucket/prefix?region=REGION[&endpoint=URL]` (the
    /// nodes read S3 credentials from their `AWS_*` environment).
    pub destination: String,
    /// The time window [5 min; 1 s to 15 min].
    pub window: Option<Duration>,
    /// The size window in bytes [300 MiB; 1 KiB to 500 MiB].
    pub window_bytes: Option<u64>,
    /// The first folder of every file's path [the cluster id].
    pub namespace: Option<String>,
}

impl CaptureOptions {
    fn to_proto(&self) -> Result<proto::CaptureSettings, ClientError> {
        if self.destination.is_empty() {
            return Err(ClientError::InvalidArgument(
                "the capture destination is missing: give file:///absolute/dir or \
                 s3://bucket/prefix?region=REGION"
                    .into(),
            ));
        }
        Ok(proto::CaptureSettings {
            destination: self.destination.clone(),
            window_ms: self
                .window
                .map(|d| positive_ms("the capture window", d))
                .transpose()?
                .unwrap_or(0),
            window_bytes: self.window_bytes.unwrap_or(0),
            namespace: self.namespace.clone().unwrap_or_default(),
            enabled_at_ms: 0,
        })
    }
}

/// Changes to an event hub's settings; `None` leaves a setting as it is.
#[derive(Debug, Clone, Default)]
pub struct HubChanges {
    pub throughput_units: Option<u32>,
    pub retention: Option<Duration>,
    pub cleanup_policy: Option<proto::CleanupPolicy>,
    pub tombstone_retention: Option<Duration>,
    pub compaction_lag: Option<Duration>,
    /// 0 removes the cap.
    pub retention_bytes_max: Option<u64>,
    /// `Some(None)` disables Capture; `Some(Some(..))` enables it or replaces its settings.
    pub capture: Option<Option<CaptureOptions>>,
}

/// A duration in whole milliseconds, at least one.
fn positive_ms(what: &str, duration: Duration) -> Result<u64, ClientError> {
    match u64::try_from(duration.as_millis()) {
        Ok(ms) if ms > 0 => Ok(ms),
        _ => Err(ClientError::InvalidArgument(format!(
            "{what} must be at least 1ms, got {}",
            humantime::format_duration(duration)
        ))),
    }
}
