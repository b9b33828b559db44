//! The checkpoint store as the Azure SDKs' `BlobCheckpointStore` sees it: each ownership
//! record and checkpoint is a blob whose metadata holds its fields (`ownerid`; `offset` and
//! `sequencenumber`), written as a whole under `If-Match` / `If-None-Match` conditions.
//! A write through the Blob API sets the typed record from its metadata and keeps the raw
//! metadata beside it, so every client reads back exactly what it wrote; a write through the
//! typed API drops the raw metadata, and the Blob API then shows the typed fields.
//!
//! ETags: an ownership record's is its own etag (the one typed claims compare), so Blob
//! and typed claims race on one compare-and-set. A checkpoint's is derived from its
//! content and time, so replicas agree on it without storing it.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use tributary_types::HubId;

use super::{Checkpoint, ConsumerStore, Key, OWNER_ID_LEN_MAX, Ownership, invalid, range};
use crate::state::CommandError;

/// The most metadata one blob may carry, names and values together (Azure's limit).
pub const BLOB_METADATA_BYTES_MAX: usize = 8 * 1024;

/// The metadata key of an ownership record's owner.
const OWNER_KEY: &str = "ownerid";
const OFFSET_KEY: &str = "offset";
const SEQUENCE_NUMBER_KEY: &str = "sequencenumber";

/// Which record a blob is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum BlobKind {
    Ownership,
    Checkpoint,
}

/// A Blob write's condition (its `If-Match` / `If-None-Match: *` header).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum BlobCondition {
    None,
    /// The record exists with this ETag (without quotes).
    IfMatch(String),
    /// The record does not exist.
    IfNoneMatchAny,
}

/// A record as a blob.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BlobView {
    pub partition: u16,
    pub kind: BlobKind,
    /// Without quotes.
    pub etag: String,
    pub last_modified_ms: i64,
    pub metadata: BTreeMap<String, String>,
}

/// The outcome of a Blob write: written, or refused as Azure refuses it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum BlobWrite {
    Written(BlobView),
    /// Set Blob Metadata on a record that does not exist (404 BlobNotFound).
    NotFound,
    /// The condition does not hold (412 ConditionNotMet).
    ConditionNotMet,
    /// Put Blob with `If-None-Match: *` on a record that exists (409 BlobAlreadyExists).
    AlreadyExists,
}

/// A Blob API write, as front ends ask for it (`StoreCommand::PutBlob` without its names
/// and time).
#[derive(Debug, Clone)]
pub struct BlobPut {
    pub partition: u16,
    pub kind: BlobKind,
    pub metadata: BTreeMap<String, String>,
    pub condition: BlobCondition,
    /// Put Blob (create or replace); otherwise Set Blob Metadata (must exist).
    pub create: bool,
}

/// One `PutBlob` command's request.
pub(super) struct Write {
    pub kind: BlobKind,
    pub metadata: BTreeMap<String, String>,
    pub condition: BlobCondition,
    pub create: bool,
    pub now_ms: i64,
}

impl ConsumerStore {
    pub(super) fn put_blob(&mut self, key: Key, write: Write) -> Result<BlobWrite, CommandError> {
        let size: usize = write.metadata.iter().map(|(k, v)| k.len() + v.len()).sum();
        if size > BLOB_METADATA_BYTES_MAX {
            return Err(invalid(format!(
                "{size} bytes of metadata; a blob here carries at most {BLOB_METADATA_BYTES_MAX}"
            )));
        }
        let current = self.blob(&key, write.kind);
        let refusal = match (&write.condition, &current) {
            _ if current.is_none() && !write.create => Some(BlobWrite::NotFound),
            (BlobCondition::IfMatch(_), None) => Some(BlobWrite::ConditionNotMet),
            (BlobCondition::IfMatch(etag), Some(current)) if *etag != current.etag => {
                Some(BlobWrite::ConditionNotMet)
            }
            (BlobCondition::IfNoneMatchAny, Some(_)) if write.create => {
                Some(BlobWrite::AlreadyExists)
            }
            (BlobCondition::IfNoneMatchAny, Some(_)) => Some(BlobWrite::ConditionNotMet),
            _ => None,
        };
        if let Some(refusal) = refusal {
            return Ok(refusal);
        }
        let metadata_key = (key.clone(), write.kind);
        match write.kind {
            BlobKind::Ownership => {
                let owner_id = value(&write.metadata, OWNER_KEY).unwrap_or_default();
                if owner_id.len() > OWNER_ID_LEN_MAX {
                    return Err(invalid(format!(
                        "owner id of {} bytes; at most {OWNER_ID_LEN_MAX}",
                        owner_id.len()
                    )));
                }
                let ownership = Ownership {
                    owner_id: owner_id.to_string(),
                    last_modified_ms: self.tick(write.now_ms),
                    etag: self.etag(),
                };
                if write.metadata == ownership_metadata(&ownership) {
                    self.blob_metadata.remove(&metadata_key);
                } else {
                    self.blob_metadata.insert(metadata_key, write.metadata);
                }
                self.ownership.insert(key.clone(), ownership);
            }
            BlobKind::Checkpoint => {
                let number = |name| {
                    value(&write.metadata, name)
                        .and_then(|v| v.parse::<i64>().ok())
                        .filter(|n| *n >= 0)
                        .unwrap_or(-1)
                };
                let checkpoint = Checkpoint {
                    offset: number(OFFSET_KEY),
                    sequence_number: number(SEQUENCE_NUMBER_KEY),
                    last_modified_ms: self.tick(write.now_ms),
                };
                if write.metadata == checkpoint_metadata(&checkpoint) {
                    self.blob_metadata.remove(&metadata_key);
                } else {
                    self.blob_metadata.insert(metadata_key, write.metadata);
                }
                self.checkpoints.insert(key.clone(), checkpoint);
            }
        }
        let written = self
            .blob(&key, write.kind)
            .expect("the record was just written");
        Ok(BlobWrite::Written(written))
    }

    /// Every record of a group as blobs: ownership, then checkpoints, each by partition.
    pub(super) fn list_blobs(&self, hub: HubId, group: &str) -> Vec<BlobView> {
        let ownership = range(&self.ownership, hub, group).map(|(p, _)| (p, BlobKind::Ownership));
        let checkpoints =
            range(&self.checkpoints, hub, group).map(|(p, _)| (p, BlobKind::Checkpoint));
        ownership
            .chain(checkpoints)
            .filter_map(|(partition, kind)| self.blob(&(hub, group.to_string(), partition), kind))
            .collect()
    }

    fn blob(&self, key: &Key, kind: BlobKind) -> Option<BlobView> {
        let raw = self.blob_metadata.get(&(key.clone(), kind));
        let (etag, last_modified_ms, derived) = match kind {
            BlobKind::Ownership => {
                let o = self.ownership.get(key)?;
                (o.etag.clone(), o.last_modified_ms, ownership_metadata(o))
            }
            BlobKind::Checkpoint => {
                let c = self.checkpoints.get(key)?;
                let metadata = raw.cloned().unwrap_or_else(|| checkpoint_metadata(c));
                (checkpoint_etag(c, &metadata), c.last_modified_ms, metadata)
            }
        };
        Some(BlobView {
            partition: key.2,
            kind,
            etag,
            last_modified_ms,
            metadata: raw.cloned().unwrap_or(derived),
        })
    }
}

/// A metadata value by name, whatever the case the writer gave it.
fn value<'a>(metadata: &'a BTreeMap<String, String>, name: &str) -> Option<&'a str> {
    metadata
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case(name))
        .map(|(_, v)| v.as_str())
}

fn ownership_metadata(ownership: &Ownership) -> BTreeMap<String, String> {
    BTreeMap::from([(OWNER_KEY.to_string(), ownership.owner_id.clone())])
}

fn checkpoint_metadata(checkpoint: &Checkpoint) -> BTreeMap<String, String> {
    BTreeMap::from([
        (OFFSET_KEY.to_string(), checkpoint.offset.to_string()),
        (
            SEQUENCE_NUMBER_KEY.to_string(),
            checkpoint.sequence_number.to_string(),
        ),
    ])
}

/// A checkpoint's ETag: FNV-1a over its time and metadata, the same on every replica.
fn checkpoint_etag(checkpoint: &Checkpoint, metadata: &BTreeMap<String, String>) -> String {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    let mut feed = |bytes: &[u8]| {
        for b in bytes {
            hash ^= u64::from(*b);
            hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
        }
        hash ^= 0xff;
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    };
    feed(&checkpoint.last_modified_ms.to_le_bytes());
    for (k, v) in metadata {
        feed(k.as_bytes());
        feed(v.as_bytes());
    }
    format!("c{hash:016x}")
}

#[cfg(test)]
#[path = "blob_tests.rs"]
mod tests;
