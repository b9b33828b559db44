use bytes::{BufMut, Bytes, BytesMut};
use kafka_protocol::messages::ApiKey;
use proptest::prelude::*;

use super::*;

/// A request frame: a header of the API's version for `key` and `version`, then `body`.
fn frame(key: ApiKey, version: i16, body: &[u8]) -> Bytes {
    let mut header = RequestHeader::default();
    header.request_api_key = key as i16;
    header.request_api_version = version;
    header.correlation_id = 7;
    let mut out = BytesMut::new();
    header
        .encode(&mut out, key.request_header_version(version))
        .unwrap();
    out.put_slice(body);
    out.freeze()
}

#[test]
fn headers_of_apis_and_versions_not_served_close_the_connection() {
    for bad in [
        &b""[..],
        b"\x00\x12\x00",
        b"\x7f\x7f\x00\x00\x00\x00\x00\x01",
    ] {
        assert!(
            parse_header(&mut Bytes::copy_from_slice(bad)).is_err(),
            "{bad:?}"
        );
    }
    let mut fetch13 = frame(ApiKey::Fetch, 13, b"");
    let err = parse_header(&mut fetch13).unwrap_err();
    assert!(err.0.contains("Fetch version 13"), "{err:?}");
    let mut produce = frame(ApiKey::Produce, 9, b"");
    let (api, version, header) = parse_header(&mut produce).unwrap();
    assert_eq!(
        (api, version, header.correlation_id),
        (ApiKey::Produce, 9, 7)
    );
    // A newer ApiVersions than served is still read (and answered with our list).
    let mut newer = frame(ApiKey::ApiVersions, 4, b"");
    assert_eq!(parse_header(&mut newer).unwrap().0, ApiKey::ApiVersions);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    /// Any frame at all: reading its header never panics, and a header is only accepted
    /// for an API and version served. (Decoding the body is left to kafka-protocol, whose
    /// decoder trusts array lengths: see the crate's documentation.)
    #[test]
    fn the_header_parser_survives_any_frame(raw in prop::collection::vec(any::<u8>(), 0..64)) {
        let mut bytes = Bytes::from(raw);
        if let Ok((api, version, _)) = parse_header(&mut bytes) {
            prop_assert!(apis::supported(api, version) || api == ApiKey::ApiVersions);
        }
    }
}
