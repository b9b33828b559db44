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

/// Requests of one send stream handled at once by default; beyond, the server stops
/// reading the stream until one is answered.
pub const STREAM_SENDS_MAX_DEFAULT: usize = 1000;

/// Every service of the client port, over one broker [`Service`].
#[derive(Clone)]
pub struct GrpcApi {
    pub service: Service,
    /// Set to `true` when the node stops: send streams stop reading, answer what they
    /// read and end. `None`: never.
    pub stop: Option<tokio::sync::watch::Receiver<bool>>,
    /// Requests of one send stream handled at once, at most (0 counts as 1).
    pub stream_sends_max: usize,
}

impl GrpcApi {
    /// The API over `service`, its send streams never told to stop.
    pub fn new(service: Service) -> Self {
        GrpcApi {
            service,
            stop: None,
            stream_sends_max: STREAM_SENDS_MAX_DEFAULT,
        }
    }

    /// Ends send streams when `stop` turns `true` (or its sender is dropped).
    pub fn stopping_on(mut self, stop: tokio::sync::watch::Receiver<bool>) -> Self {
        self.stop = Some(stop);
        self
    }

    /// Handles at most `max` requests of one send stream at once (at least one).
    pub fn with_stream_sends_max(mut self, max: usize) -> Self {
        self.stream_sends_max = max;
        self
    }

    /// Resolves when the node stops (never without a stop signal).
    async fn stopped(&self) {
        match self.stop.clone() {
            Some(mut stop) => {
                let _ = stop.wait_for(|stop| *stop).await;
            }
            None => std::future::pending().await,
        }
    }
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
