//! What can go wrong while capturing.

/// A capture file could not be encoded, or a destination opened, written or listed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CaptureError {
    /// The events could not be encoded as Avro. A bug: every event fits the schema.
    #[error("cannot encode the capture file as Avro: {0}")]
    Encode(#[source] Box<apache_avro::Error>),
    /// The local capture directory could not be created.
    #[error(
        "cannot create the capture directory {path}: {source}; check that the node's user may \
         create and write it, or choose another directory"
    )]
    CreateDirectory {
        path: String,
        #[source]
        source: std::io::Error,
    },
    /// The destination's settings were refused by the object store client.
    #[error("cannot open the capture destination {destination}: {source}; check its settings")]
    Open {
        destination: String,
        #[source]
        source: Box<object_store::Error>,
    },
    /// A path given to the sink is not a valid object path.
    #[error(
        "invalid capture path {path:?}: {reason}; a path is segments separated by '/', \
         none empty, \".\" or \"..\""
    )]
    InvalidPath { path: String, reason: String },
    /// Writing a capture file failed.
    #[error(
        "cannot write the capture file {path} to {destination}: {source}; check that the \
         destination is reachable and writable (for S3: the bucket exists and the credentials \
         in AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY may write to it)"
    )]
    Put {
        destination: String,
        path: String,
        #[source]
        source: Box<object_store::Error>,
    },
    /// Listing capture files failed.
    #[error(
        "cannot list capture files under {prefix:?} at {destination}: {source}; check that the \
         destination is reachable and readable (for S3: the bucket exists and the credentials \
         may list it)"
    )]
    List {
        destination: String,
        prefix: String,
        #[source]
        source: Box<object_store::Error>,
    },
}
