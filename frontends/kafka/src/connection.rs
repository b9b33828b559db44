//! One client connection: frames in, requests decoded with kafka-protocol, answered in
//! order. Before a SASL login (when authorization is on) only ApiVersions and the SASL
//! calls are answered; a malformed request, or one of an API or version not served, closes
//! the connection with a log line and nothing else.
//!
//! Clients send a connection's requests without waiting for the answers (librdkafka up to
//! `max.in.flight.requests.per.connection`). A Produce request whose partitions this node
//! all leads is begun as soon as it arrives, up to [`PIPELINED_PRODUCES_MAX`] at once: its
//! records join their partitions' append queues behind those of the requests before it,
//! so each partition keeps the connection's order, and requests arriving while earlier
//! ones wait for their commit share the next one instead of each waiting its turn. Every
//! other request (and a Produce that would be passed on to another node, where the order
//! could not be kept) waits until the requests before it are answered, and is answered
//! alone, as before.

use std::future::Future;
use std::pin::Pin;

use bytes::{Bytes, BytesMut};
use futures::StreamExt as _;
use futures::stream::FuturesOrdered;
use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::sasl_authenticate_response::SaslAuthenticateResponse;
use kafka_protocol::messages::sasl_handshake_response::SaslHandshakeResponse;
use kafka_protocol::messages::{ApiKey, RequestHeader, RequestKind, ResponseHeader, ResponseKind};
use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};
use tokio::io::{AsyncRead, AsyncWrite, BufReader, BufWriter};
use tokio::sync::mpsc;
use tributary_broker::auth::Credential;

use crate::frame::{read_frame, write_frame};
use crate::{KafkaContext, admin, apis, fetch, groups, guard, handlers, producers, sasl};

/// The one SASL mechanism served.
const PLAIN: &str = "PLAIN";

/// Produce requests one connection works on at once (each holds its frame, at most the
/// node's request limit, until answered). While this many wait for their commits, the
/// next frame is not read.
pub const PIPELINED_PRODUCES_MAX: usize = 8;

/// A pipelined request's answer to come.
type Pending<'a> = Pin<Box<dyn Future<Output = Result<Outcome, Closed>> + Send + 'a>>;

/// What the reader passes on: a frame, the end of the connection (`None`), or why the
/// framing failed.
type Frame = Result<Option<Bytes>, Closed>;

/// Why a connection is closed (logged, never sent).
#[derive(Debug, PartialEq, Eq)]
pub struct Closed(pub String);

/// What a connection knows of its client.
#[derive(Debug)]
pub struct Session {
    /// A SaslHandshake chose PLAIN.
    handshake: bool,
    /// A version-0 SaslHandshake chose PLAIN: the next frame is the bare PLAIN message.
    raw_sasl: bool,
    credential: Credential,
    authenticated: bool,
}

impl Session {
    pub fn new(auth_enabled: bool) -> Session {
        Session {
            handshake: false,
            raw_sasl: false,
            credential: Credential::None,
            authenticated: !auth_enabled,
        }
    }
}

/// Serves a connection until the client closes it or breaks the protocol.
pub async fn serve_connection<S>(io: S, context: &KafkaContext)
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    metrics::gauge!("tributary_kafka_connections").increment(1.0);
    if let Err(Closed(why)) = run(io, context).await {
        tracing::info!(%why, "closed a Kafka connection");
        metrics::counter!("tributary_kafka_connections_refused_total").increment(1);
    }
    metrics::gauge!("tributary_kafka_connections").decrement(1.0);
}

async fn run<S>(io: S, context: &KafkaContext) -> Result<(), Closed>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let (reader, writer) = tokio::io::split(io);
    let mut writer = BufWriter::new(writer);
    // Frames are read beside the answering, so answers are written as they come while the
    // next request is read; one frame waits in the channel at most.
    let (frames_tx, mut frames) = mpsc::channel::<Frame>(1);
    let reading = async move {
        let mut reader = BufReader::new(reader);
        loop {
            let frame = read_frame(&mut reader, context.request_bytes_max)
                .await
                .map_err(|err| Closed(format!("framing: {err}")));
            let last = !matches!(frame, Ok(Some(_)));
            if frames_tx.send(frame).await.is_err() || last {
                break;
            }
        }
        // The answering side ends the connection, once it has answered what was read.
        std::future::pending::<Result<(), Closed>>().await
    };
    tokio::select! {
        result = answer_frames(context, &mut frames, &mut writer) => result,
        result = reading => result,
    }
}

/// Answers the frames in the order they came until the client closes the connection or
/// breaks the protocol: pipelined Produce requests several at once, everything else in
/// turn.
async fn answer_frames<W: AsyncWrite + Unpin>(
    context: &KafkaContext,
    frames: &mut mpsc::Receiver<Frame>,
    writer: &mut W,
) -> Result<(), Closed> {
    let mut session = Session::new(context.node.service().auth_enabled());
    let mut pipelined: FuturesOrdered<Pending<'_>> = FuturesOrdered::new();
    loop {
        // Polled first, so a request just begun makes its appends before the next frame is
        // looked at.
        let frame = tokio::select! {
            biased;
            Some(outcome) = pipelined.next() => {
                deliver(writer, outcome?).await?;
                continue;
            }
            frame = frames.recv(), if pipelined.len() < PIPELINED_PRODUCES_MAX => frame,
        };
        let frame = match frame {
            Some(Ok(Some(frame))) => frame,
            Some(Err(closed)) => return Err(closed),
            // The client closed the connection: what it sent before is still answered, as
            // far as it listens.
            Some(Ok(None)) | None => {
                let _ = drain(&mut pipelined, writer).await;
                return Ok(());
            }
        };
        if session.raw_sasl {
            drain(&mut pipelined, writer).await?;
            session.raw_sasl = false;
            // A bare SASL exchange: an empty frame says yes; a refusal closes.
            match login(context, &frame) {
                Ok(credential) => {
                    session.credential = credential;
                    session.authenticated = true;
                    deliver(writer, Outcome::reply(BytesMut::new())).await?;
                }
                Err(why) => return Err(Closed(format!("SASL login refused: {why}"))),
            }
            continue;
        }
        let request = match read_request(&session, frame)? {
            Read::Answered(outcome) => {
                drain(&mut pipelined, writer).await?;
                deliver(writer, outcome).await?;
                continue;
            }
            Read::Request(request) => request,
        };
        match pipeline(context, &session, request) {
            Ok(pending) => pipelined.push_back(pending),
            Err(request) => {
                drain(&mut pipelined, writer).await?;
                // Boxed: the answers' futures nest deep enough to pass the compiler's
                // layout limit inside the connection's.
                let outcome = Box::pin(respond(context, &mut session, request)).await?;
                deliver(writer, outcome).await?;
            }
        }
    }
}

/// Writes every pipelined answer still to come, in order.
async fn drain<W: AsyncWrite + Unpin>(
    pipelined: &mut FuturesOrdered<Pending<'_>>,
    writer: &mut W,
) -> Result<(), Closed> {
    while let Some(outcome) = pipelined.next().await {
        deliver(writer, outcome?).await?;
    }
    Ok(())
}

/// Writes an answer (none for acks=0); `Err` when the connection closes after it.
async fn deliver<W: AsyncWrite + Unpin>(writer: &mut W, outcome: Outcome) -> Result<(), Closed> {
    if let Some(frame) = &outcome.frame {
        write_frame(writer, frame)
            .await
            .map_err(|err| Closed(format!("writing: {err}")))?;
    }
    match outcome.close {
        Some(why) => Err(Closed(why)),
        None => Ok(()),
    }
}

/// A Produce request begun at once, when this node leads every partition it sends to (its
/// appends then queue here, in the order the requests came); any other request back.
fn pipeline<'a>(
    context: &'a KafkaContext,
    session: &Session,
    request: Box<Request>,
) -> Result<Pending<'a>, Box<Request>> {
    let Request {
        api,
        version,
        header,
        kind,
    } = *request;
    match kind {
        RequestKind::Produce(produce) if handlers::leads_all(context, &produce) => {
            let credential = session.credential.clone();
            let correlation_id = header.correlation_id;
            Ok(Box::pin(async move {
                match handlers::produce(context, &credential, produce).await {
                    Some(response) => encode(
                        api,
                        version,
                        correlation_id,
                        &ResponseKind::Produce(response),
                    )
                    .map(Outcome::reply),
                    None => Ok(Outcome::silent()),
                }
            }))
        }
        kind => Err(Box::new(Request {
            api,
            version,
            header,
            kind,
        })),
    }
}

/// What answering a request gives: a response frame (none for acks=0), and whether the
/// connection closes after it.
#[derive(Debug)]
pub struct Outcome {
    pub frame: Option<BytesMut>,
    pub close: Option<String>,
}

impl Outcome {
    fn reply(frame: BytesMut) -> Outcome {
        Outcome {
            frame: Some(frame),
            close: None,
        }
    }

    /// No answer (a Produce with acks=0), and the connection stays open.
    fn silent() -> Outcome {
        Outcome {
            frame: None,
            close: None,
        }
    }
}

/// A request read from its frame and checked, to be answered.
struct Request {
    api: ApiKey,
    version: i16,
    header: RequestHeader,
    kind: RequestKind,
}

/// What a frame holds: a request, or its answer when known without asking the node (an
/// ApiVersions of a version not served).
enum Read {
    Answered(Outcome),
    Request(Box<Request>),
}

/// A request's API key, version and header, read without trusting the frame.
pub fn parse_header(frame: &mut Bytes) -> Result<(ApiKey, i16, RequestHeader), Closed> {
    if frame.len() < 8 {
        return Err(Closed(format!(
            "a request of {} bytes has no header",
            frame.len()
        )));
    }
    let key = i16::from_be_bytes([frame[0], frame[1]]);
    let version = i16::from_be_bytes([frame[2], frame[3]]);
    let api = ApiKey::try_from(key).map_err(|_| Closed(format!("unknown API key {key}")))?;
    // ApiVersions is decoded whatever its version (an unknown one gets our list back).
    let header_version = if apis::supported(api, version) {
        api.request_header_version(version)
    } else if api == ApiKey::ApiVersions {
        // A newer ApiVersions than served: its header is as of the newest (KIP-511).
        api.request_header_version(version.clamp(0, 3))
    } else {
        return Err(Closed(format!("{api:?} version {version} is not served")));
    };
    let header = RequestHeader::decode(frame, header_version)
        .map_err(|err| Closed(format!("a malformed {api:?} header: {err}")))?;
    Ok((api, version, header))
}

/// Reads a request from its frame: the header, whether the session may make it, and the
/// body (walked by the guard first).
fn read_request(session: &Session, mut frame: Bytes) -> Result<Read, Closed> {
    let (api, version, header) = parse_header(&mut frame)?;
    metrics::counter!("tributary_kafka_requests_total", "api" => format!("{api:?}")).increment(1);
    if api == ApiKey::ApiVersions && !apis::supported(api, version) {
        let response = apis::api_versions(ResponseError::UnsupportedVersion.code());
        return encode(
            api,
            0,
            header.correlation_id,
            &ResponseKind::ApiVersions(response),
        )
        .map(|frame| Read::Answered(Outcome::reply(frame)));
    }
    let open = matches!(
        api,
        ApiKey::ApiVersions | ApiKey::SaslHandshake | ApiKey::SaslAuthenticate
    );
    if !session.authenticated && !open {
        return Err(Closed(format!(
            "{api:?} before a SASL login: log in with SASL PLAIN first"
        )));
    }
    // kafka-protocol reserves arrays' declared lengths: bodies are walked first.
    guard::check(api, version, &frame)
        .map_err(|err| Closed(format!("a malformed {api:?} v{version} request: {}", err.0)))?;
    let kind = RequestKind::decode(api, &mut frame, version)
        .map_err(|err| Closed(format!("a malformed {api:?} v{version} request: {err}")))?;
    Ok(Read::Request(Box::new(Request {
        api,
        version,
        header,
        kind,
    })))
}

/// The answer to a request read from its frame.
async fn respond(
    context: &KafkaContext,
    session: &mut Session,
    request: Box<Request>,
) -> Result<Outcome, Closed> {
    let Request {
        api,
        version,
        header,
        kind,
    } = *request;
    let response = match kind {
        RequestKind::ApiVersions(_) => Some(ResponseKind::ApiVersions(apis::api_versions(0))),
        RequestKind::SaslHandshake(request) => {
            let mut response = SaslHandshakeResponse::default();
            response.mechanisms = vec![StrBytes::from_static_str(PLAIN)];
            if request.mechanism.as_str() == PLAIN {
                session.handshake = true;
                session.raw_sasl = version == 0;
            } else {
                response.error_code = ResponseError::UnsupportedSaslMechanism.code();
            }
            Some(ResponseKind::SaslHandshake(response))
        }
        RequestKind::SaslAuthenticate(request) => {
            let mut response = SaslAuthenticateResponse::default();
            let login = if session.handshake {
                login(context, &request.auth_bytes)
            } else {
                Err("SaslAuthenticate before a SaslHandshake naming PLAIN".to_owned())
            };
            match login {
                Ok(credential) => {
                    session.credential = credential;
                    session.authenticated = true;
                }
                Err(why) => {
                    response.error_code = ResponseError::SaslAuthenticationFailed.code();
                    response.error_message = Some(StrBytes::from_string(why.clone()));
                    // The refusal goes out, then the connection closes.
                    let frame = encode(
                        api,
                        version,
                        header.correlation_id,
                        &ResponseKind::SaslAuthenticate(response),
                    )?;
                    return Ok(Outcome {
                        frame: Some(frame),
                        close: Some(format!("SASL login refused: {why}")),
                    });
                }
            }
            Some(ResponseKind::SaslAuthenticate(response))
        }
        RequestKind::Metadata(request) => Some(ResponseKind::Metadata(
            handlers::metadata(context, &session.credential, request, version).await,
        )),
        RequestKind::Fetch(request) => Some(ResponseKind::Fetch(
            fetch::fetch(context, &session.credential, request).await,
        )),
        RequestKind::ListOffsets(request) => Some(ResponseKind::ListOffsets(
            fetch::list_offsets(context, &session.credential, request).await,
        )),
        RequestKind::Produce(request) => handlers::produce(context, &session.credential, request)
            .await
            .map(ResponseKind::Produce),
        request if groups::serves(&request) => {
            let client_id = header.client_id.as_deref().unwrap_or_default();
            Some(groups::answer(context, &session.credential, client_id, request, version).await)
        }
        RequestKind::DescribeConfigs(request) => Some(ResponseKind::DescribeConfigs(
            admin::describe_configs(context, &session.credential, request),
        )),
        RequestKind::CreateTopics(request) => Some(ResponseKind::CreateTopics(
            admin::create_topics(context.node.service(), &session.credential, request).await,
        )),
        RequestKind::InitProducerId(request) => Some(ResponseKind::InitProducerId(
            producers::init_producer_id(context, &session.credential, request).await,
        )),
        other => {
            return Err(Closed(format!(
                "{:?} is not served",
                std::mem::discriminant(&other)
            )));
        }
    };
    match response {
        Some(response) => {
            encode(api, version, header.correlation_id, &response).map(Outcome::reply)
        }
        None => Ok(Outcome::silent()),
    }
}

/// The credential of a PLAIN login, once the broker accepts it (any login when
/// authorization is off).
fn login(context: &KafkaContext, auth_bytes: &[u8]) -> Result<Credential, String> {
    let service = context.node.service();
    if !service.auth_enabled() {
        return Ok(Credential::None);
    }
    let now_s = u64::try_from(context.clock.now_ms() / 1000).unwrap_or(0);
    let login = sasl::plain_login(auth_bytes, now_s)?;
    let entity = login.entity.clone().unwrap_or_default();
    service
        .granted_rights(&login.credential, &entity)
        .map(|_| login.credential)
        .map_err(|err| err.message)
}

/// A response frame: the header of the API's version, then the body.
fn encode(
    api: ApiKey,
    version: i16,
    correlation_id: i32,
    response: &ResponseKind,
) -> Result<BytesMut, Closed> {
    let mut out = BytesMut::new();
    let mut header = ResponseHeader::default();
    header.correlation_id = correlation_id;
    header
        .encode(&mut out, api.response_header_version(version))
        .and_then(|()| response.encode(&mut out, version))
        .map_err(|err| Closed(format!("encoding a {api:?} v{version} response: {err}")))?;
    Ok(out)
}

#[cfg(test)]
#[path = "connection_tests.rs"]
mod tests;
