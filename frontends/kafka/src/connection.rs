//! One client connection: frames in, requests decoded with kafka-protocol, answered in
//! order. Before a SASL login (when authorization is on) only ApiVersions and the SASL
//! calls are answered; a malformed request, or one of an API or version not served, closes
//! the connection with a log line and nothing else.

use bytes::{Bytes, BytesMut};
use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::sasl_authenticate_response::SaslAuthenticateResponse;
use kafka_protocol::messages::sasl_handshake_response::SaslHandshakeResponse;
use kafka_protocol::messages::{ApiKey, RequestHeader, RequestKind, ResponseHeader, ResponseKind};
use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};
use tokio::io::{AsyncRead, AsyncWrite, BufReader, BufWriter};
use tributary_broker::auth::Credential;

use crate::frame::{read_frame, write_frame};
use crate::{KafkaContext, admin, apis, fetch, groups, guard, handlers, producers, sasl};

/// The one SASL mechanism served.
const PLAIN: &str = "PLAIN";

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
    let (mut reader, mut writer) = (BufReader::new(reader), BufWriter::new(writer));
    let mut session = Session::new(context.node.service().auth_enabled());
    loop {
        let frame = match read_frame(&mut reader, context.request_bytes_max).await {
            Ok(Some(frame)) => frame,
            Ok(None) => return Ok(()),
            Err(err) => return Err(Closed(format!("framing: {err}"))),
        };
        let outcome = if session.raw_sasl {
            session.raw_sasl = false;
            // A bare SASL exchange: an empty frame says yes; a refusal closes.
            match login(context, &frame) {
                Ok(credential) => {
                    session.credential = credential;
                    session.authenticated = true;
                    Outcome::reply(BytesMut::new())
                }
                Err(why) => return Err(Closed(format!("SASL login refused: {why}"))),
            }
        } else {
            answer(context, &mut session, frame).await?
        };
        if let Some(frame) = &outcome.frame {
            write_frame(&mut writer, frame)
                .await
                .map_err(|err| Closed(format!("writing: {err}")))?;
        }
        if let Some(why) = outcome.close {
            return Err(Closed(why));
        }
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

/// The answer to one request.
pub async fn answer(
    context: &KafkaContext,
    session: &mut Session,
    mut frame: Bytes,
) -> Result<Outcome, Closed> {
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
        .map(Outcome::reply);
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
    let request = RequestKind::decode(api, &mut frame, version)
        .map_err(|err| Closed(format!("a malformed {api:?} v{version} request: {err}")))?;
    let response = match request {
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
        None => Ok(Outcome {
            frame: None,
            close: None,
        }),
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
