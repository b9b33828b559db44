use std::sync::Arc;

use tonic::{Request, Response, Status};
use tributary_types::Rights;

use crate::api::auth::{Auth, Scope};
use tributary_proto::ErrorReason;
use tributary_proto::v1 as pb;
use tributary_proto::v1::producer_server::Producer;

use crate::api::convert;
use crate::api::error::ApiError;
use crate::broker::{Broker, Target};
use crate::fault::FaultHooks;
use crate::partition::codec;
use tributary_raft::ProducerStamp;

pub struct ProducerService {
    pub broker: Arc<Broker>,
    pub auth: Auth,
}

/// How long a send may still wait for its commit once the node has begun to shut down
/// (less than the shutdown's drain time).
const SHUTDOWN_SEND_GRACE: std::time::Duration = std::time::Duration::from_secs(3);

#[tonic::async_trait]
impl Producer for ProducerService {
    async fn send(
        &self,
        request: Request<pb::SendRequest>,
    ) -> Result<Response<pb::SendResponse>, Status> {
        self.auth.check(
            &request,
            Scope::Hub(&request.get_ref().event_hub),
            Rights::SEND,
        )?;
        let _in_flight = InFlight::send();
        let req = request.into_inner();
        let hub = self.broker.hub(&req.event_hub)?;
        if req.events.is_empty() {
            return Err(
                ApiError::invalid("a send needs at least one event; the batch was empty").into(),
            );
        }
        let target = match req.target {
            None => Target::Any,
            Some(pb::send_request::Target::PartitionId(id)) => Target::PartitionId(id),
            Some(pb::send_request::Target::PartitionKey(key)) => Target::PartitionKey(key),
        };
        let key = match &target {
            Target::PartitionKey(key) => Some(key.as_str()),
            _ => None,
        };
        let records = req
            .events
            .into_iter()
            .map(|e| convert::event_record(e, key))
            .collect::<Result<Vec<_>, _>>()?;
        let events = codec::encode_batch(&records);
        let size_bytes = events.len();
        let max = self.broker.limits.publish_bytes_max;
        if size_bytes > max {
            return Err(ApiError::new(
                ErrorReason::MessageTooLarge,
                format!("the batch is {size_bytes} bytes; the maximum publication size is {max} bytes. Send fewer or smaller events per batch"),
            )
            .into());
        }
        let body_bytes = records.iter().map(|r| r.body.len() as u64).sum();
        let event_count = records.len();
        let index = self.broker.route(&hub, &target)?;
        let producer = match (req.producer_id, &target) {
            (0, _) => None,
            (producer_id, Target::PartitionId(_)) => Some(ProducerStamp {
                producer_id,
                sequence: req.producer_sequence,
            }),
            _ => {
                return Err(ApiError::invalid(
                    "idempotent publishing needs an explicit partition id; send with a partition id or without a producer id",
                )
                .into());
            }
        };
        let partition = self.broker.local_partition(&hub, index)?;
        if let Err(wait) = partition.admit_ingress(
            hub.throughput_units,
            hub.partition_count,
            size_bytes,
            event_count,
        ) {
            metrics::counter!("tributary_sends_throttled_total", "hub" => hub.name.clone())
                .increment(1);
            return Err(ApiError::busy(
                format!(
                    "event hub '{}' is over its {} throughput unit(s) (1 MB/s or 1,000 events/s each, shared by its {} partitions). Please wait {} ms and try again, or raise its throughput units",
                    hub.name,
                    hub.throughput_units,
                    hub.partition_count,
                    wait.as_millis().max(1)
                ),
                wait,
            )
            .into());
        }
        let started = std::time::Instant::now();
        // A send still waiting when the node shuts down (its partition may have lost its
        // quorum) gives up within the shutdown's drain time, so it never holds the node up.
        let mut closing = self.broker.closing();
        let appended = tokio::select! {
            appended = partition.append(events, body_bytes, producer) => {
                appended.map_err(|e| self.broker.partition_error(e))?
            }
            _ = async {
                let _ = closing.wait_for(|closing| *closing).await;
                tokio::time::sleep(SHUTDOWN_SEND_GRACE).await;
            } => {
                return Err(ApiError::new(
                    tributary_proto::ErrorReason::Unavailable,
                    "the node shut down before the send committed; its outcome is unknown: \
                     retry on another node (an idempotent producer's retry is stored once)",
                )
                .into());
            }
        };
        FaultHooks::global().after_commit();
        metrics::histogram!("tributary_send_duration_seconds", "hub" => hub.name.clone())
            .record(started.elapsed().as_secs_f64());
        metrics::counter!("tributary_events_in_total", "hub" => hub.name.clone())
            .increment(event_count as u64);
        metrics::counter!("tributary_bytes_in_total", "hub" => hub.name.clone())
            .increment(size_bytes as u64);
        Ok(Response::new(pb::SendResponse {
            partition_id: partition.group.partition.0.to_string(),
            first_sequence_number: appended.first_sequence,
            offsets: appended.offsets.iter().map(i64::to_string).collect(),
            enqueued_time_ms: appended.enqueued_time_ms,
        }))
    }
}

/// Counts a send in `tributary_sends_in_flight` while it runs (also when its caller gives
/// up and the call is dropped).
struct InFlight;

impl InFlight {
    fn send() -> InFlight {
        metrics::gauge!("tributary_sends_in_flight").increment(1.0);
        InFlight
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        metrics::gauge!("tributary_sends_in_flight").decrement(1.0);
    }
}
