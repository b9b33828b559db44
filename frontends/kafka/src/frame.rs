//! Kafka's framing: each request and response is a 32-bit big-endian length and that many
//! bytes.

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// Why a connection's framing failed: the connection is closed.
#[derive(Debug)]
pub enum FrameError {
    Io(std::io::Error),
    /// A length below zero or over the limit.
    Size {
        length: i64,
        max: usize,
    },
}

impl std::fmt::Display for FrameError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FrameError::Io(err) => write!(f, "{err}"),
            FrameError::Size { length, max } => {
                write!(
                    f,
                    "a request of {length} bytes (at most {max} are accepted)"
                )
            }
        }
    }
}

/// The next frame, or `None` when the peer closed the connection between frames.
pub async fn read_frame<R: AsyncRead + Unpin>(
    io: &mut R,
    max: usize,
) -> Result<Option<Bytes>, FrameError> {
    let mut length = [0u8; 4];
    match io.read_exact(&mut length).await {
        Ok(_) => {}
        Err(err) if err.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(err) => return Err(FrameError::Io(err)),
    }
    let length = i32::from_be_bytes(length);
    let size = usize::try_from(length)
        .ok()
        .filter(|n| *n <= max)
        .ok_or(FrameError::Size {
            length: i64::from(length),
            max,
        })?;
    let mut frame = BytesMut::zeroed(size);
    io.read_exact(&mut frame).await.map_err(FrameError::Io)?;
    Ok(Some(frame.freeze()))
}

/// Writes one frame.
pub async fn write_frame<W: AsyncWrite + Unpin>(io: &mut W, frame: &[u8]) -> std::io::Result<()> {
    let length =
        i32::try_from(frame.len()).map_err(|_| std::io::Error::other("a response over 2 GiB"))?;
    io.write_all(&length.to_be_bytes()).await?;
    io.write_all(frame).await?;
    io.flush().await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn frames_are_length_prefixed_and_bounded() {
        let mut wire = Vec::new();
        write_frame(&mut wire, b"hello").await.unwrap();
        assert_eq!(&wire[..4], &5i32.to_be_bytes());
        let mut reader = &wire[..];
        assert_eq!(
            read_frame(&mut reader, 16).await.unwrap().unwrap(),
            &b"hello"[..]
        );
        assert!(read_frame(&mut reader, 16).await.unwrap().is_none());
        let mut big = &wire[..];
        assert!(matches!(
            read_frame(&mut big, 4).await,
            Err(FrameError::Size { length: 5, max: 4 })
        ));
        let negative = (-1i32).to_be_bytes();
        assert!(matches!(
            read_frame(&mut &negative[..], 4).await,
            Err(FrameError::Size { length: -1, .. })
        ));
    }
}
