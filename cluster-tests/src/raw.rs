//! Helpers for tests that speak to a node below the SDK: a gRPC codec that puts bytes on the
//! wire as they are, and the root rule's connection string a node writes.

use std::path::Path;
use std::time::Duration;

use bytes::{Buf, BufMut, Bytes};
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};

use crate::eventually::eventually;

/// How long a node may take to write `<data-dir>/root-connection-string` once ready.
const ROOT_FILE_TIMEOUT: Duration = Duration::from_secs(30);

/// Sends and receives message bodies as they are, to put malformed messages on the wire
/// (`tonic::client::Grpc::unary` with a path of the service's method).
#[derive(Debug, Clone, Copy, Default)]
pub struct RawCodec;

impl Codec for RawCodec {
    type Encode = Bytes;
    type Decode = Bytes;
    type Encoder = RawCodec;
    type Decoder = RawCodec;

    fn encoder(&mut self) -> Self::Encoder {
        RawCodec
    }

    fn decoder(&mut self) -> Self::Decoder {
        RawCodec
    }
}

impl Encoder for RawCodec {
    type Item = Bytes;
    type Error = tonic::Status;

    fn encode(&mut self, item: Bytes, dst: &mut EncodeBuf<'_>) -> Result<(), Self::Error> {
        dst.put(item);
        Ok(())
    }
}

impl Decoder for RawCodec {
    type Item = Bytes;
    type Error = tonic::Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Bytes>, Self::Error> {
        Ok(Some(src.copy_to_bytes(src.remaining())))
    }
}

/// The root rule's connection string in `<data_dir>/root-connection-string`, once the node
/// has written it (after it is ready to serve); the file must be readable by its owner only.
pub async fn root_connection_string(data_dir: &Path) -> String {
    use std::os::unix::fs::PermissionsExt as _;
    let path = data_dir.join("root-connection-string");
    let text = eventually(
        ROOT_FILE_TIMEOUT,
        format!("{} written", path.display()),
        async || std::fs::read_to_string(&path),
    )
    .await;
    let mode = std::fs::metadata(&path).unwrap().permissions().mode();
    assert_eq!(
        mode & 0o777,
        0o600,
        "{} is readable by others",
        path.display()
    );
    text.trim().to_owned()
}

/// Appends `value` as a LEB128 varint, the integer encoding of protobuf and postcard: for
/// tests that write messages byte by byte.
pub fn put_varint(out: &mut Vec<u8>, mut value: u64) {
    loop {
        let byte = (value & 0x7f) as u8;
        value >>= 7;
        if value == 0 {
            out.push(byte);
            return;
        }
        out.push(byte | 0x80);
    }
}
