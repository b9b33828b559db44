//! InitProducerId: an idempotent producer's id and epoch (KIP-98), from the cluster's
//! producer ids (allocated through the controller's Raft group); a producer presenting its
//! current id and epoch (version 3 and later, KIP-360) gets the next epoch. Transactions are
//! not served: a transactional id is refused.

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::ProducerId;
use kafka_protocol::messages::init_producer_id_request::InitProducerIdRequest;
use kafka_protocol::messages::init_producer_id_response::InitProducerIdResponse;
use tributary_broker::auth::Credential;
use tributary_broker::error::{Error, ErrorKind};
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
            response.error_code = failure_code(&err);
        }
    }
    response
}

/// An InitProducerId that failed, as Kafka's code. A transient failure (the controller is
/// electing a leader, or the cluster does not run feature level 2 yet) is
/// COORDINATOR_LOAD_IN_PROGRESS, as a Kafka broker answers while its producer ids are not
/// ready: clients just ask again. COORDINATOR_NOT_AVAILABLE or NOT_COORDINATOR would send
/// them looking for a transaction coordinator first (the Java client and kafka-python do,
/// even without a transactional id), and kafka-python then sends FindCoordinator with a
/// null key, which cannot be decoded (the key is not nullable), so its connection is closed;
/// it sends that again and again and never asks for a producer id.
fn failure_code(err: &Error) -> i16 {
    match err.kind {
        ErrorKind::Unauthenticated | ErrorKind::Unauthorized => {
            ResponseError::ClusterAuthorizationFailed
        }
        _ => ResponseError::CoordinatorLoadInProgress,
    }
    .code()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_transient_failure_is_retried_without_a_coordinator_lookup() {
        for err in [
            Error::unavailable("no controller leader yet"),
            Error::internal("the controller answered something else"),
        ] {
            let code = failure_code(&err);
            assert_eq!(
                code,
                ResponseError::CoordinatorLoadInProgress.code(),
                "{err}"
            );
            assert_ne!(code, ResponseError::CoordinatorNotAvailable.code());
            assert_ne!(code, ResponseError::NotCoordinator.code());
        }
        assert_eq!(
            failure_code(&Error::new(
                ErrorKind::Unauthorized,
                "no send right".to_string()
            )),
            ResponseError::ClusterAuthorizationFailed.code()
        );
    }
}
