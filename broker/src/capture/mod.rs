//! Capture: a partition's events written as Avro object container files, in the layout and
//! record schema of Event Hubs Capture, to a local directory or an S3-compatible object
//! store.
//!
//! The file encoding ([`encode_file`]), the file naming ([`file_path`]) and the
//! destinations ([`Sink`]) do not depend on the cluster; [`window`] decides when a window
//! closes (pure), and [`capturer`] is the node's task that writes each led partition's
//! closed windows and records its progress in the partition's Raft group.

mod avro;
pub mod capturer;
mod error;
mod path;
mod sink;
pub mod window;

pub use avro::{SCHEMA_JSON, encode_file, format_enqueued_time_utc};
pub use error::CaptureError;
pub use path::file_path;
pub use sink::{CaptureDestination, Sink, parse_destination};
