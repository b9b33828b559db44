//! Everything before the frame loop: the protocol headers, SASL (ANONYMOUS or PLAIN), open
//! and the one session's begin. Frames the server pipelines after its begin stay in the
//! returned buffer for the connection task.

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use super::error::ClientError;
use super::{ConnectionOptions, Sasl};
use tributary_amqp::{Begin, Open};
use tributary_amqp::{Channel, TransferNumber};
use tributary_amqp::{Frame, FrameType, ProtocolHeader, read_frame, write_performative};
use tributary_amqp::{Performative, decode_frame_body};
use tributary_amqp::{SaslCode, SaslInit};
use tributary_amqp::{Symbol, Value};

/// The channel of the client's one session.
pub(crate) const SESSION_CHANNEL: Channel = Channel(0);

/// What the server answered in the handshake.
pub(crate) struct Opened {
    pub(crate) open: Open,
    pub(crate) begin: Begin,
    /// Bytes read past the begin.
    pub(crate) input: BytesMut,
}

/// Runs SASL (unless [`Sasl::None`]), then sends header, open and begin at once and reads the
/// server's.
pub(crate) async fn handshake<S: AsyncRead + AsyncWrite + Unpin>(
    io: &mut S,
    options: &ConnectionOptions,
) -> Result<Opened, ClientError> {
    let mut reader = HandshakeReader {
        input: BytesMut::new(),
        max_frame_size_bytes: options.max_frame_size_bytes,
    };
    if options.sasl != Sasl::None {
        sasl(io, &mut reader, options).await?;
    }
    let mut out = ProtocolHeader::AMQP.to_bytes().to_vec();
    let open = Open {
        container_id: options.container_id.clone(),
        hostname: options.hostname.clone(),
        max_frame_size_bytes: options.max_frame_size_bytes,
        channel_max: options.channel_max,
        idle_timeout_ms: options.idle_timeout_ms,
        properties: Some(vec![(
            Symbol::from("product"),
            Value::String("tributary-amqp-client".into()),
        )]),
        ..Open::default()
    };
    write_performative(&mut out, Channel(0), &open.into(), &[]);
    let begin = Begin {
        remote_channel: None,
        next_outgoing_id: TransferNumber(0),
        incoming_window: options.session_window_frames,
        outgoing_window: options.session_window_frames,
        handle_max: options.links_max.saturating_sub(1),
        ..Begin::default()
    };
    write_performative(&mut out, SESSION_CHANNEL, &begin.into(), &[]);
    io.write_all(&out).await?;
    io.flush().await?;
    expect_header(io, &mut reader, ProtocolHeader::AMQP).await?;
    let open = match reader.performative(io).await? {
        Performative::Open(open) => open,
        other => return Err(unexpected("open", &other)),
    };
    let begin = match reader.performative(io).await? {
        Performative::Begin(begin) if begin.remote_channel == Some(SESSION_CHANNEL) => begin,
        Performative::Close(close) => return Err(ClientError::ConnectionClosed(close.error)),
        other => return Err(unexpected("begin on our channel", &other)),
    };
    Ok(Opened {
        open,
        begin,
        input: reader.input,
    })
}

async fn sasl<S: AsyncRead + AsyncWrite + Unpin>(
    io: &mut S,
    reader: &mut HandshakeReader,
    options: &ConnectionOptions,
) -> Result<(), ClientError> {
    io.write_all(&ProtocolHeader::SASL.to_bytes()).await?;
    io.flush().await?;
    expect_header(io, reader, ProtocolHeader::SASL).await?;
    let offered = match reader.performative(io).await? {
        Performative::SaslMechanisms(mechanisms) => mechanisms.sasl_server_mechanisms,
        other => return Err(unexpected("sasl-mechanisms", &other)),
    };
    let (mechanism, initial_response) = match &options.sasl {
        Sasl::Plain { user, password } => {
            let response = format!("\0{user}\0{password}");
            ("PLAIN", Bytes::from(response.into_bytes()))
        }
        _ => ("ANONYMOUS", Bytes::new()),
    };
    if !offered.iter().any(|m| m.as_str() == mechanism) {
        return Err(ClientError::MechanismNotOffered { mechanism, offered });
    }
    let init = SaslInit {
        mechanism: mechanism.into(),
        initial_response: Some(initial_response),
        hostname: options.hostname.clone(),
    };
    let mut out = Vec::new();
    write_performative(&mut out, Channel(0), &init.into(), &[]);
    io.write_all(&out).await?;
    io.flush().await?;
    match reader.performative(io).await? {
        Performative::SaslOutcome(outcome) if outcome.code == SaslCode::Ok => Ok(()),
        Performative::SaslOutcome(outcome) => Err(ClientError::Authentication {
            mechanism,
            code: outcome.code,
        }),
        other => Err(unexpected("sasl-outcome", &other)),
    }
}

async fn expect_header<S: AsyncRead + Unpin>(
    io: &mut S,
    reader: &mut HandshakeReader,
    expected: ProtocolHeader,
) -> Result<(), ClientError> {
    let header = loop {
        if let Some(header) = ProtocolHeader::parse(&reader.input).map_err(ClientError::Framing)? {
            let _ = reader.input.split_to(ProtocolHeader::LEN);
            break header;
        }
        reader.fill(io).await?;
    };
    if header != expected {
        return Err(ClientError::Protocol(format!(
            "asked for protocol header {expected:?}, the server answered {header:?}"
        )));
    }
    Ok(())
}

struct HandshakeReader {
    input: BytesMut,
    max_frame_size_bytes: u32,
}

impl HandshakeReader {
    async fn fill<S: AsyncRead + Unpin>(&mut self, io: &mut S) -> Result<(), ClientError> {
        if io.read_buf(&mut self.input).await? == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "the server hung up during the handshake",
            )
            .into());
        }
        Ok(())
    }

    /// The next performative, skipping heartbeats.
    async fn performative<S: AsyncRead + Unpin>(
        &mut self,
        io: &mut S,
    ) -> Result<Performative, ClientError> {
        loop {
            let frame = read_frame(&mut self.input, self.max_frame_size_bytes)
                .map_err(ClientError::Framing)?;
            match frame {
                Some(Frame { body, .. }) if body.is_empty() => {}
                Some(Frame {
                    frame_type, body, ..
                }) => {
                    let (performative, _) = decode_frame_body(body).map_err(ClientError::Decode)?;
                    if performative.frame_type() != frame_type {
                        return Err(ClientError::Protocol(format!(
                            "{} arrived in a {frame_type:?} frame",
                            performative.name()
                        )));
                    }
                    return Ok(performative);
                }
                None => self.fill(io).await?,
            }
        }
    }
}

fn unexpected(expected: &str, found: &Performative) -> ClientError {
    if let (FrameType::Amqp, Performative::Close(close)) = (found.frame_type(), found) {
        return ClientError::ConnectionClosed(close.error.clone());
    }
    ClientError::Protocol(format!(
        "expected {expected}, the server sent {}",
        found.name()
    ))
}
