//! Where an event hub's capture files go: the destination kept in its settings. Writing
//! the files is the broker's (`tributary_broker::capture`).

use std::fmt;

use serde::{Deserialize, Serialize};

/// Where an event hub's capture files are written. Kept in the controller's state, so its
/// serialized form must stay readable by later versions: add variants at the end only.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum CaptureDestination {
    /// A directory on each node's local file system (absolute path), created if missing.
    Directory { path: String },
    /// A bucket of Amazon S3 or of an S3-compatible server. Credentials are not part of the
    /// destination: the node reads them from its environment (`AWS_ACCESS_KEY_ID`,
    /// `AWS_SECRET_ACCESS_KEY` and the other `AWS_*` variables of the AWS tools).
    S3 {
        /// The server's URL, e.g. `http://127.0.0.1:9000` for a local server; `None` is
        /// Amazon S3 itself.
        endpoint: Option<String>,
        bucket: String,
        region: String,
        /// Prepended to every file's path, without leading or trailing '/'; may be empty.
        prefix: String,
        /// Whether plain-HTTP endpoints are allowed (set when the endpoint is `http://`).
        allow_http: bool,
    },
}

impl fmt::Display for CaptureDestination {
    /// The destination as the broker's `capture::parse_destination` reads it back.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CaptureDestination::Directory { path } => write!(f, "file://{path}"),
            CaptureDestination::S3 {
                endpoint,
                bucket,
                region,
                prefix,
                allow_http,
            } => {
                write!(f, "s3://{bucket}")?;
                if !prefix.is_empty() {
                    write!(f, "/{prefix}")?;
                }
                write!(f, "?region={region}")?;
                if let Some(endpoint) = endpoint {
                    write!(f, "&endpoint={endpoint}")?;
                }
                if *allow_http != http_allowed_by_default(endpoint.as_deref()) {
                    write!(f, "&allow_http={allow_http}")?;
                }
                Ok(())
            }
        }
    }
}

/// Whether plain HTTP is allowed for an endpoint when not said explicitly.
pub fn http_allowed_by_default(endpoint: Option<&str>) -> bool {
    endpoint.is_some_and(|endpoint| endpoint.starts_with("http://"))
}
