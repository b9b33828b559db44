//! Bytes in and out of one connection: a bounded input buffer cut into protocol headers and
//! frames, and an output buffer flushed with a write timeout.

use std::time::Duration;

use bytes::BytesMut;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::time::Instant;

use super::error::ConnectionError;
use crate::frame::{Frame, ProtocolHeader, read_frame, write_performative};
use crate::ids::Channel;
use crate::performative::Performative;

/// Bytes read from the socket at a time. The input buffer never holds more than one frame
/// (refused as soon as its header claims more than the limit) plus one read.
const READ_CHUNK_BYTES: usize = 16 * 1024;

pub(crate) struct Transport<S> {
    io: S,
    input: BytesMut,
    output: Vec<u8>,
    scratch: Box<[u8]>,
    /// The largest frame we accept; raised from 512 to our advertised value at open.
    pub(crate) read_frame_max_bytes: u32,
    write_timeout: Duration,
    /// When a frame last arrived (for the idle rule) and was last sent (for heartbeats).
    pub(crate) last_received: Instant,
    pub(crate) last_sent: Instant,
}

/// What a read brought.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Filled {
    Bytes,
    /// The client closed its side.
    Eof,
}

impl<S: AsyncRead + AsyncWrite + Unpin> Transport<S> {
    pub(crate) fn new(io: S, read_frame_max_bytes: u32, write_timeout: Duration) -> Self {
        let now = Instant::now();
        Transport {
            io,
            input: BytesMut::new(),
            output: Vec::new(),
            scratch: vec![0; READ_CHUNK_BYTES].into_boxed_slice(),
            read_frame_max_bytes,
            write_timeout,
            last_received: now,
            last_sent: now,
        }
    }

    /// Reads what the socket has. Cancel-safe: a read cancelled by `select!` loses nothing.
    pub(crate) async fn fill(&mut self) -> Result<Filled, ConnectionError> {
        let read = self.io.read(&mut self.scratch).await?;
        if read == 0 {
            return Ok(Filled::Eof);
        }
        self.input.extend_from_slice(&self.scratch[..read]);
        self.last_received = Instant::now();
        Ok(Filled::Bytes)
    }

    pub(crate) fn buffered_bytes(&self) -> usize {
        self.input.len()
    }

    /// The first 8 bytes as a protocol header, when they are in.
    pub(crate) fn take_header(&mut self) -> Result<Option<ProtocolHeader>, ConnectionError> {
        let header = ProtocolHeader::parse(&self.input).map_err(ConnectionError::NotAmqp)?;
        if header.is_some() {
            let _ = self.input.split_to(ProtocolHeader::LEN);
        }
        Ok(header)
    }

    /// The next complete frame in the buffer.
    pub(crate) fn take_frame(&mut self) -> Result<Option<Frame>, ConnectionError> {
        read_frame(&mut self.input, self.read_frame_max_bytes).map_err(ConnectionError::Framing)
    }

    /// Reads until a protocol header is in.
    pub(crate) async fn read_header(&mut self) -> Result<ProtocolHeader, ConnectionError> {
        loop {
            if let Some(header) = self.take_header()? {
                return Ok(header);
            }
            self.fill_or_eof().await?;
        }
    }

    /// Reads until a frame is in.
    pub(crate) async fn read_frame(&mut self) -> Result<Frame, ConnectionError> {
        loop {
            if let Some(frame) = self.take_frame()? {
                return Ok(frame);
            }
            self.fill_or_eof().await?;
        }
    }

    async fn fill_or_eof(&mut self) -> Result<(), ConnectionError> {
        match self.fill().await? {
            Filled::Bytes => Ok(()),
            Filled::Eof => Err(self.eof_error()),
        }
    }

    /// The error for an end of input where more was needed.
    pub(crate) fn eof_error(&self) -> ConnectionError {
        if self.input.is_empty() {
            ConnectionError::Io(std::io::ErrorKind::UnexpectedEof.into())
        } else {
            ConnectionError::Truncated {
                buffered_bytes: self.input.len(),
            }
        }
    }

    pub(crate) fn push_bytes(&mut self, bytes: &[u8]) {
        self.output.extend_from_slice(bytes);
    }

    pub(crate) fn push(&mut self, channel: Channel, performative: &Performative, payload: &[u8]) {
        write_performative(&mut self.output, channel, performative, payload);
    }

    /// Writes out everything pushed. A client that stops reading cannot hold the task: the
    /// write gives up after the write timeout.
    pub(crate) async fn flush(&mut self) -> Result<(), ConnectionError> {
        if self.output.is_empty() {
            return Ok(());
        }
        let write = async {
            self.io.write_all(&self.output).await?;
            self.io.flush().await
        };
        match tokio::time::timeout(self.write_timeout, write).await {
            Ok(result) => result?,
            Err(_) => {
                return Err(ConnectionError::WriteTimeout {
                    timeout_ms: self.write_timeout.as_millis() as u64,
                });
            }
        }
        self.output.clear();
        self.last_sent = Instant::now();
        Ok(())
    }

    /// Flushes and shuts the write side, ignoring failures: used on the way out.
    pub(crate) async fn finish(&mut self) {
        let _ = self.flush().await;
        let _ = tokio::time::timeout(self.write_timeout, self.io.shutdown()).await;
    }
}
