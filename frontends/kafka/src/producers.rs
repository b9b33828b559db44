//! InitProducerId: an idempotent producer's id and epoch (KIP-98), from the cluster's
//! producer ids (allocated through the controller's Raft group); a producer presenting its
//! current id and epoch (version 3 and later, KIP-360) gets the next epoch. Transactions are
//! not served: a transactional id is refused.

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::ProducerId;
use kafka_protocol::messages::init_producer_id_request::InitProducerIdRequest;
use kafka_protocol::messages::init_producer_id_response::InitProducerIdResponse;
use tributary_broker::auth::Credential;
use tributary_broker::error::ErrorKind;
use tributary_broker::service::KafkaProducer;

use crate::KafkaContext;

pub async fn init_producer_id(
    context: &KafkaContext,
    credential: &Credential,
    request: InitProducerIdRequest,
) -> InitProducerIdResponse {
    let mut response = InitProducerIdResponse::default();
    response.producer_id = ProducerId(-1);
    response.producer_epoch = -1;
    if let Some(id) = &request.transactional_id {
        tracing::info!(
            transactional_id = %id.0.as_str(),
            "refused a Kafka InitProducerId: transactions are not supported (the idempotent producer is)"
        );
        response.error_code = ResponseError::TransactionalIdAuthorizationFailed.code();
        return response;
    }
    let current =
        (request.producer_id.0 >= 0 && request.producer_epoch >= 0).then_some(KafkaProducer {
            producer_id: request.producer_id.0,
            epoch: request.producer_epoch,
        });
    let service = context.node.service();
    // Boxed: the controller proposal's future is deep, and the connection's would be
    // too deep to lay out with it inline.
    match Box::pin(service.init_kafka_producer(credential, current)).await {
        Ok(producer) => {
            response.producer_id = ProducerId(producer.producer_id);
            response.producer_epoch = producer.epoch;
        }
        Err(err) => {
            tracing::info!(%err, "a Kafka InitProducerId failed");
            response.error_code = match err.kind {
                ErrorKind::Unauthenticated | ErrorKind::Unauthorized => {
                    ResponseError::ClusterAuthorizationFailed
                }
                // Retried by clients: the controller is electing a leader, or the cluster
                // does not run feature level 2 yet.
                _ => ResponseError::CoordinatorNotAvailable,
            }
            .code();
        }
    }
    response
}
