//! Capture: a partition's events written as Avro object container files, in the layout and
//! record schema of Event Hubs Capture, to a local directory or an S3-compatible object
//! store.
//!
//! This module holds the parts that do not depend on the cluster: the file encoding
//! ([`encode_file`]), the file naming ([`file_path`]) and the destinations ([`Sink`]).

mod avro;
mod error;
mod path;
mod sink;

pub use avro::{SCHEMA_JSON, encode_file, format_enqueued_time_utc};
pub use error::CaptureError;
pub use path::file_path;
pub use sink::{CaptureDestination, Sink, parse_destination};
