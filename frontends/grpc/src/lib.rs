//! The native gRPC API (`tributary.v1`, tonic). Every handler decodes its request into the
//! broker's typed request, makes one [`Service`] call and maps the one error type back
//! (`From<tributary_broker::Error> for tonic::Status`). Protobuf types stop here.

pub mod checkpoints;
pub mod consumer;
pub mod convert;
pub mod diagnostics;
pub mod management;
pub mod producer;

use tonic::Request;
use tributary_broker::{Credential, Service};

/// The gRPC metadata key carrying the shared access signature.
pub const AUTHORIZATION_METADATA: &str = "authorization";

/// The credential a call presents: the token in its `authorization` metadata, if any.
pub fn credential<T>(request: &Request<T>) -> Credential {
    match request.metadata().get(AUTHORIZATION_METADATA) {
        None => Credential::None,
        // Not ASCII: no token can be read from it, so it is refused as malformed.
        Some(value) => Credential::SasToken(value.to_str().unwrap_or_default().to_owned()),
    }
}

/// Every service of the client port, over one broker [`Service`].
#[derive(Clone)]
pub struct GrpcApi {
    pub service: Service,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_credential_is_the_authorization_metadata() {
        let mut request = Request::new(());
        assert_eq!(credential(&request), Credential::None);
        request.metadata_mut().insert(
            AUTHORIZATION_METADATA,
            "SharedAccessSignature sr=x".parse().unwrap(),
        );
        assert_eq!(
            credential(&request),
            Credential::SasToken("SharedAccessSignature sr=x".into())
        );
    }
}
