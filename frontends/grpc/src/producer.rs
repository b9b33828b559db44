//! `Producer.Send` and `Producer.SendStream`.

use std::sync::Arc;

use futures::StreamExt;
use tokio::sync::{Semaphore, mpsc};
use tonic::{Request, Response, Status, Streaming};
use tributary_broker::service::{
    Producer as ProducerNumbering, ProducerStamp, SendRequest, Target,
};
use tributary_broker::{Credential, Service};
use tributary_proto::v1 as pb;
use tributary_proto::v1::producer_server::Producer;

use crate::{GrpcApi, convert, credential};

/// Replies of one send stream queued for the client at most; beyond, handled requests wait.
const STREAM_REPLIES_QUEUED_MAX: usize = 1024;

#[tonic::async_trait]
impl Producer for GrpcApi {
    async fn send(
        &self,
        request: Request<pb::SendRequest>,
    ) -> Result<Response<pb::SendResponse>, Status> {
        let credential = credential(&request);
        let sent = send(&self.service, &credential, request.into_inner()).await?;
        Ok(Response::new(sent))
    }

    type SendStreamStream =
        tokio_stream::wrappers::ReceiverStream<Result<pb::SendStreamReply, Status>>;

    async fn send_stream(
        &self,
        request: Request<Streaming<pb::SendStreamRequest>>,
    ) -> Result<Response<Self::SendStreamStream>, Status> {
        metrics::counter!("tributary_send_streams_opened_total").increment(1);
        let credential = Arc::new(credential(&request));
        let (replies, rx) = mpsc::channel(STREAM_REPLIES_QUEUED_MAX);
        tokio::spawn(serve_send_stream(
            self.clone(),
            credential,
            request.into_inner(),
            replies,
        ));
        Ok(Response::new(tokio_stream::wrappers::ReceiverStream::new(
            rx,
        )))
    }
}

/// Reads one send stream until the client ends it, the stream fails or the node stops,
/// handling each request in a task of its own (at most `stream_sends_max` at once) that
/// replies as soon as its batch is stored. The reply stream ends once every request read
/// has been answered: a request the client sent but this side never read gets no reply, and
/// the client sees the stream end before its reply (the request was not handled).
async fn serve_send_stream(
    api: GrpcApi,
    credential: Arc<Credential>,
    mut incoming: Streaming<pb::SendStreamRequest>,
    replies: mpsc::Sender<Result<pb::SendStreamReply, Status>>,
) {
    let handling = Arc::new(Semaphore::new(api.stream_sends_max.max(1)));
    let stopped = api.stopped();
    tokio::pin!(stopped);
    loop {
        let permit = tokio::select! {
            biased;
            () = &mut stopped => break,
            permit = handling.clone().acquire_owned() => permit.expect("never closed"),
        };
        let next = tokio::select! {
            biased;
            () = &mut stopped => break,
            next = incoming.next() => next,
        };
        let pb::SendStreamRequest { id, request } = match next {
            Some(Ok(message)) => message,
            // The client ended its side or the stream failed: answer what was read.
            Some(Err(_)) | None => break,
        };
        let service = api.service.clone();
        let credential = credential.clone();
        let replies = replies.clone();
        tokio::spawn(async move {
            let result = match request {
                None => Err(Status::invalid_argument(
                    "a send stream request without a request",
                )),
                Some(request) => send(&service, &credential, request).await,
            };
            let result = match result {
                Ok(response) => pb::send_stream_reply::Result::Response(response),
                Err(status) => pb::send_stream_reply::Result::Error(pb::SendError {
                    code: status.code() as i32,
                    message: status.message().to_owned(),
                    details: status.details().to_vec().into(),
                }),
            };
            let _ = replies
                .send(Ok(pb::SendStreamReply {
                    id,
                    result: Some(result),
                }))
                .await;
            drop(permit);
        });
    }
    // Every task handling a request holds a sender: the reply stream ends with the last.
}

/// One send: decodes the request, appends the batch, encodes the reply.
async fn send(
    service: &Service,
    credential: &Credential,
    req: pb::SendRequest,
) -> Result<pb::SendResponse, Status> {
    let request = SendRequest {
        hub: req.event_hub,
        target: match req.target {
            None => Target::Any,
            Some(pb::send_request::Target::PartitionId(id)) => Target::PartitionId(id),
            Some(pb::send_request::Target::PartitionKey(key)) => Target::PartitionKey(key),
        },
        events: req
            .events
            .into_iter()
            .map(convert::event_record)
            .collect::<Result<_, _>>()?,
        producer: (req.producer_id != 0).then_some(ProducerNumbering::EventHubs(ProducerStamp {
            producer_id: req.producer_id,
            sequence: req.producer_sequence,
        })),
    };
    let sent = service.send(credential, request).await?;
    Ok(pb::SendResponse {
        partition_id: sent.partition.to_string(),
        first_sequence_number: sent.first_sequence.0,
        offsets: sent.offsets.iter().map(ToString::to_string).collect(),
        enqueued_time_ms: sent.enqueued_time_ms,
    })
}
