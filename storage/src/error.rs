use thiserror::Error;

/// Errors of the storage layer. All are operating conditions (disk, corruption, shutdown).
#[derive(Debug, Error, Clone)]
pub enum StorageError {
    #[error("storage I/O failed: {0}")]
    Io(String),
    #[error("the storage shard is shutting down")]
    Closed,
    /// [`crate::Shard::close`] gave up: something still holds the shard.
    #[error("{0}")]
    StillInUse(String),
    #[error("stored data is corrupt: {0}")]
    Corrupt(String),
    /// A commit failed earlier; the shard refuses writes until the node restarts.
    #[error("the storage shard failed ({0}) and refuses writes until the node restarts")]
    Failed(String),
}

impl StorageError {
    pub(crate) fn io(err: impl std::fmt::Display) -> Self {
        StorageError::Io(err.to_string())
    }
}

impl From<StorageError> for std::io::Error {
    fn from(err: StorageError) -> Self {
        std::io::Error::other(err.to_string())
    }
}
