//! Versioned encodings and the cluster's feature level.
//!
//! Every value Tributary writes to disk or sends to another node in its own encoding (Raft
//! entries and votes, partition and controller state, snapshots, controller commands and
//! replies, peer messages) is a postcard encoding of a Rust type, and carries the *format*
//! it was written in:
//!
//! ```text
//! format 1 (release 0.1.0):   [postcard bytes]
//! format 2 and later:         [0x80 0x00] [format: u8] [postcard bytes]
//! ```
//!
//! Format 1 is what release 0.1.0 wrote, with no envelope. Its values are read as they
//! are: postcard writes integers, lengths, enum tags and `Option` tags as canonical LEB128
//! varints, and every type encoded here begins with one of those, so no format-1 value
//! starts with `0x80 0x00` (a non-canonical zero). A value of a later format starts with
//! that mark and its format number.
//!
//! A node writes the newest format its *cluster* reads ([`write_format`]), not the newest
//! it knows: a node of a new release writes format 1 while nodes of release 0.1.0 may be in
//! its cluster, and switches once the controller has raised the cluster's feature level
//! ([`FEATURE_LEVEL`]), which it does only when every registered node supports that level.
//! Decoders accept every format they know; a value of a newer format is refused with an
//! error naming the release that writes it.
//!
//! Changing an encoded type: adding a field to a type, or a variant anywhere but at the end
//! of an enum, changes its postcard layout. Give the change a new format (and a new feature
//! level that turns its writing on), keep decoding the old layouts, and add golden files of
//! the new format (see [`golden`]). Appending a variant to an enum keeps older values
//! readable, but older releases cannot read the new variant: write it only once the feature
//! level that introduced it is on.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU8, Ordering};

use serde::Serialize;
use serde::de::DeserializeOwned;

/// This release, as operators name it (`tributary --version`).
pub const RELEASE: &str = env!("CARGO_PKG_VERSION");

/// The highest cluster feature level this release supports. Level 1 is release 0.1.0's
/// behaviour (format-1 encodings only); level 2 writes format-2 encodings and lets the
/// controller keep the feature level itself.
pub const FEATURE_LEVEL: u32 = 2;

/// Each feature level and the first release that supports it.
pub const FEATURE_LEVELS: &[(u32, &str)] = &[(1, "0.1.0"), (2, "0.2.0")];

/// The format release 0.1.0 wrote: postcard with no envelope.
pub const FORMAT_LEGACY: u8 = 1;
/// The newest format this release reads and writes.
pub const FORMAT_LATEST: u8 = 2;

/// The two bytes that open every value of format 2 and later: a zero written as a
/// two-byte LEB128 varint, which postcard never writes.
pub const FORMAT_MARK: [u8; 2] = [0x80, 0x00];

/// The format this process writes: raised (never lowered) as the cluster's feature level
/// rises. One per process: every node in a process belongs to one cluster.
static WRITE_FORMAT: AtomicU8 = AtomicU8::new(FORMAT_LEGACY);

/// A later release this process poses as (see [`simulate_release`]): its feature level and
/// name.
static SIMULATED: OnceLock<(u32, String)> = OnceLock::new();

/// The highest feature level this node supports.
pub fn supported_level() -> u32 {
    SIMULATED.get().map_or(FEATURE_LEVEL, |(level, _)| *level)
}

/// The release this node runs, as it tells other nodes and operators.
pub fn running_release() -> String {
    SIMULATED
        .get()
        .map_or_else(|| RELEASE.to_string(), |(_, release)| release.clone())
}

/// Makes this process pose as `release`, a later release supporting feature levels up to
/// `level` (above [`FEATURE_LEVEL`]): tests use it to check that nodes of this release
/// refuse to join a cluster that runs a level they do not know. Only the level a node
/// reports changes: it writes this release's formats. Set once, before the node starts.
pub fn simulate_release(level: u32, release: String) {
    let _ = SIMULATED.set((level.max(FEATURE_LEVEL), release));
}

/// The first release that supports `level`.
pub fn release_for_level(level: u32) -> String {
    if let Some((simulated, release)) = SIMULATED.get()
        && level > FEATURE_LEVEL
        && level <= *simulated
    {
        return release.clone();
    }
    FEATURE_LEVELS
        .iter()
        .find(|(l, _)| *l == level)
        .map(|(_, release)| release.to_string())
        .unwrap_or_else(|| {
            format!("a release newer than {RELEASE} (one with feature level {level})")
        })
}

/// The format a cluster at feature `level` writes.
pub fn format_for_level(level: u32) -> u8 {
    if level >= 2 { 2 } else { FORMAT_LEGACY }
}

/// The format this process writes now.
pub fn write_format() -> u8 {
    WRITE_FORMAT.load(Ordering::Acquire)
}

/// Follows the cluster's feature level: from now on this process writes the format that
/// level allows (never a lower one than before).
pub fn follow_cluster_level(level: u32) {
    WRITE_FORMAT.fetch_max(format_for_level(level).min(FORMAT_LATEST), Ordering::AcqRel);
}

/// An encoding that cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FormatError {
    #[error(
        "data of encoding format {format}, written by a newer release than {RELEASE} (which reads formats up to {FORMAT_LATEST}): run a newer release"
    )]
    Newer { format: u8 },
    #[error("encoding format {format} is not one this release knows")]
    Unknown { format: u8 },
    #[error("a versioned value ends inside its envelope")]
    Truncated,
    #[error("{0}")]
    Postcard(String),
}

impl From<FormatError> for std::io::Error {
    fn from(err: FormatError) -> Self {
        std::io::Error::new(std::io::ErrorKind::InvalidData, err)
    }
}

/// Encodes `value` in the format this process writes now.
pub fn encode<T: Serialize + ?Sized>(value: &T) -> Result<Vec<u8>, FormatError> {
    encode_as(write_format(), value)
}

/// Encodes `value` in `format`, a format in which `T`'s layout is the one postcard writes
/// today.
pub fn encode_as<T: Serialize + ?Sized>(format: u8, value: &T) -> Result<Vec<u8>, FormatError> {
    // Sized first: a Raft entry or message carrying a large batch is written into a buffer
    // of its size, not copied through one that doubles as it grows.
    let size = postcard::experimental::serialized_size(value)
        .map_err(|e| FormatError::Postcard(e.to_string()))?;
    let marked = format > FORMAT_LEGACY;
    let mark = if marked { FORMAT_MARK.len() + 1 } else { 0 };
    let mut out = Vec::with_capacity(mark + size);
    if marked {
        out.extend_from_slice(&FORMAT_MARK);
        out.push(format);
    }
    postcard::to_extend(value, out).map_err(|e| FormatError::Postcard(e.to_string()))
}

/// The format of an encoded value, and its postcard bytes.
pub fn split(bytes: &[u8]) -> Result<(u8, &[u8]), FormatError> {
    if !bytes.starts_with(&FORMAT_MARK) {
        return Ok((FORMAT_LEGACY, bytes));
    }
    let &format = bytes.get(FORMAT_MARK.len()).ok_or(FormatError::Truncated)?;
    match format {
        f if f > FORMAT_LATEST => Err(FormatError::Newer { format }),
        f if f <= FORMAT_LEGACY => Err(FormatError::Unknown { format }),
        _ => Ok((format, &bytes[FORMAT_MARK.len() + 1..])),
    }
}

/// Decodes a value of a type whose layout is the same in every format this release reads.
pub fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, FormatError> {
    let (_, payload) = split(bytes)?;
    postcard::from_bytes(payload).map_err(|e| FormatError::Postcard(e.to_string()))
}

/// Decodes postcard bytes (the payload of [`split`]).
pub fn decode_payload<T: DeserializeOwned>(payload: &[u8]) -> Result<T, FormatError> {
    postcard::from_bytes(payload).map_err(|e| FormatError::Postcard(e.to_string()))
}

/// [`decode`], with the value's [`shared_bytes`] fields sharing `bytes`' buffer instead of
/// copied out of it (a follower's replicated entries, events read back: their payloads
/// are most of their bytes). The decoded value keeps the buffer alive while it lives.
pub fn decode_shared<T: DeserializeOwned>(bytes: &bytes::Bytes) -> Result<T, FormatError> {
    shared_bytes::with_source(bytes, || decode(bytes))
}

/// [`decode_payload`] with [`shared_bytes`] fields sharing `source` (which holds `payload`).
pub fn decode_payload_shared<T: DeserializeOwned>(
    source: &bytes::Bytes,
    payload: &[u8],
) -> Result<T, FormatError> {
    shared_bytes::with_source(source, || decode_payload(payload))
}

/// A `Bytes` field's deserializer (`#[serde(deserialize_with = ...)]`): the same bytes as
/// `Bytes`' own, but while [`decode_shared`] runs on this thread, a field whose bytes lie in
/// the buffer being decoded is a slice of it, not a copy. Elsewhere, or from any other
/// deserializer, the bytes are copied. The encoding is unchanged.
pub mod shared_bytes {
    use std::cell::RefCell;

    use bytes::Bytes;
    use serde::Deserializer;
    use serde::de::{Error, SeqAccess, Visitor};

    thread_local! {
        /// The buffer [`super::decode_shared`] is decoding on this thread, if any.
        static SOURCE: RefCell<Option<Bytes>> = const { RefCell::new(None) };
    }

    /// Runs `decode` (synchronous: nothing else decodes on this thread meanwhile) with
    /// `source` as the buffer fields may share; restores what was there before.
    pub(super) fn with_source<R>(source: &Bytes, decode: impl FnOnce() -> R) -> R {
        let before = SOURCE.with(|s| s.replace(Some(source.clone())));
        let result = decode();
        SOURCE.with(|s| *s.borrow_mut() = before);
        result
    }

    /// `slice` as a share of the source buffer when it lies within it, else a copy.
    fn share(slice: &[u8]) -> Bytes {
        SOURCE.with(|source| match &*source.borrow() {
            Some(source) if within(source, slice) => source.slice_ref(slice),
            _ => Bytes::copy_from_slice(slice),
        })
    }

    fn within(source: &[u8], slice: &[u8]) -> bool {
        let (start, end) = (
            source.as_ptr() as usize,
            source.as_ptr() as usize + source.len(),
        );
        let at = slice.as_ptr() as usize;
        !slice.is_empty() && at >= start && at + slice.len() <= end
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Bytes, D::Error> {
        struct Shared;
        impl<'de> Visitor<'de> for Shared {
            type Value = Bytes;

            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("bytes")
            }

            fn visit_borrowed_bytes<E: Error>(self, v: &'de [u8]) -> Result<Bytes, E> {
                Ok(share(v))
            }

            fn visit_bytes<E: Error>(self, v: &[u8]) -> Result<Bytes, E> {
                Ok(Bytes::copy_from_slice(v))
            }

            fn visit_byte_buf<E: Error>(self, v: Vec<u8>) -> Result<Bytes, E> {
                Ok(Bytes::from(v))
            }

            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Bytes, A::Error> {
                let mut out = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(4096));
                while let Some(byte) = seq.next_element::<u8>()? {
                    out.push(byte);
                }
                Ok(Bytes::from(out))
            }
        }
        deserializer.deserialize_bytes(Shared)
    }
}

/// Golden files: the bytes each format gives a sample value, kept in the repository so
/// that a change to an encoded type that breaks reading what an earlier release wrote
/// fails a unit test.
pub mod golden {
    use std::path::Path;

    use super::*;

    /// Checks `value` against the golden file `dir/format-<format>/<name>.bin`: decoding
    /// the file with `decode` gives `value`, and encoding `value` in that format gives the
    /// file's bytes (for the format this release writes, a layout change shows up there
    /// first). With `TRIBUTARY_WRITE_GOLDEN=1` a missing file is written instead: files of
    /// formats that shipped are never rewritten.
    pub fn check<T>(
        dir: &Path,
        format: u8,
        name: &str,
        value: &T,
        encode: impl Fn(u8, &T) -> Vec<u8>,
        decode: impl Fn(&[u8]) -> Result<T, String>,
    ) where
        T: PartialEq + std::fmt::Debug,
    {
        let path = dir
            .join(format!("format-{format}"))
            .join(format!("{name}.bin"));
        let encoded = encode(format, value);
        if !path.exists() && std::env::var_os("TRIBUTARY_WRITE_GOLDEN").is_some() {
            std::fs::create_dir_all(path.parent().expect("golden files sit in a folder"))
                .expect("create the golden folder");
            std::fs::write(&path, &encoded).expect("write a golden file");
        }
        let stored = std::fs::read(&path).unwrap_or_else(|e| {
            panic!(
                "golden file {} cannot be read ({e}); write missing ones with TRIBUTARY_WRITE_GOLDEN=1",
                path.display()
            )
        });
        let decoded = decode(&stored).unwrap_or_else(|e| {
            panic!(
                "{} (format {format}, as an earlier release wrote it) no longer decodes: {e}",
                path.display()
            )
        });
        assert_eq!(
            &decoded,
            value,
            "{} decodes to a different value",
            path.display()
        );
        assert_eq!(
            encoded,
            stored,
            "{name} no longer encodes in format {format} as {} holds: its layout changed; give the change a new format and keep reading this one",
            path.display()
        );
    }

    /// [`check`] in each of `formats`, encoding with [`encode_as`] and reading each file
    /// with `decode` (the type's own decoder) once its envelope says it is of that format.
    pub fn check_formats<T, E>(
        dir: &Path,
        name: &str,
        value: &T,
        formats: &[u8],
        decode: impl Fn(&[u8]) -> Result<T, E>,
    ) where
        T: Serialize + PartialEq + std::fmt::Debug,
        E: std::fmt::Display,
    {
        for &format in formats {
            check(
                dir,
                format,
                name,
                value,
                |format, v| encode_as(format, v).expect("golden values encode"),
                |bytes| {
                    let (read, _) = split(bytes).map_err(|e| e.to_string())?;
                    if read != format {
                        return Err(format!("read as format {read}, not {format}"));
                    }
                    decode(bytes).map_err(|e| e.to_string())
                },
            );
        }
    }

    /// [`check_formats`] in every format, for a type whose layout is the same in all.
    pub fn check_plain<T>(dir: &Path, name: &str, value: &T)
    where
        T: Serialize + DeserializeOwned + PartialEq + std::fmt::Debug,
    {
        check_formats(
            dir,
            name,
            value,
            &[FORMAT_LEGACY, FORMAT_LATEST],
            decode::<T>,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, PartialEq, Serialize, serde::Deserialize)]
    struct Carrier {
        term: u64,
        #[serde(deserialize_with = "shared_bytes::deserialize")]
        payload: bytes::Bytes,
    }

    /// A shared decode gives the same value as a copying one, with the payload pointing
    /// into the encoded buffer; an ordinary decode (and one after it) copies.
    #[test]
    fn shared_decodes_slice_the_buffer_and_others_copy() {
        let value = Carrier {
            term: 7,
            payload: bytes::Bytes::from(vec![0xAB; 4096]),
        };
        let encoded = bytes::Bytes::from(encode(&value).unwrap());
        let range = encoded.as_ptr() as usize..encoded.as_ptr() as usize + encoded.len();
        let shared: Carrier = decode_shared(&encoded).unwrap();
        assert_eq!(shared, value);
        assert!(range.contains(&(shared.payload.as_ptr() as usize)));
        let copied: Carrier = decode(&encoded).unwrap();
        assert_eq!(copied, value);
        assert!(!range.contains(&(copied.payload.as_ptr() as usize)));
        // Bytes outside the shared buffer are copied even during a shared decode.
        let other = bytes::Bytes::from_static(b"unrelated");
        let inside: Carrier = shared_bytes::with_source(&other, || decode(&encoded).unwrap());
        assert!(!range.contains(&(inside.payload.as_ptr() as usize)));
    }

    #[derive(Debug, PartialEq, Serialize, serde::Deserialize)]
    struct Sample {
        term: u64,
        name: String,
    }

    #[test]
    fn legacy_values_read_as_format_one_and_marked_values_by_their_format() {
        let value = Sample {
            term: 300,
            name: "x".into(),
        };
        let legacy = encode_as(FORMAT_LEGACY, &value).unwrap();
        assert_eq!(legacy, postcard::to_allocvec(&value).unwrap());
        assert_eq!(split(&legacy).unwrap(), (FORMAT_LEGACY, &legacy[..]));
        let latest = encode_as(FORMAT_LATEST, &value).unwrap();
        assert_eq!(&latest[..3], &[0x80, 0x00, FORMAT_LATEST]);
        assert_eq!(decode::<Sample>(&latest).unwrap(), value);
        assert_eq!(decode::<Sample>(&legacy).unwrap(), value);
    }

    /// An encoding is sized before it is written: its buffer is exactly its length (a
    /// large value is not copied through a buffer that grows), in every format.
    #[test]
    fn an_encoding_is_written_into_a_buffer_of_its_size() {
        let value = Sample {
            term: 7,
            name: "z".repeat(100_000),
        };
        for format in [FORMAT_LEGACY, FORMAT_LATEST] {
            let encoded = encode_as(format, &value).unwrap();
            assert_eq!(encoded.capacity(), encoded.len(), "format {format}");
            assert_eq!(decode::<Sample>(&encoded).unwrap(), value);
        }
    }

    #[test]
    fn a_newer_format_is_refused_with_a_message_to_upgrade() {
        let err = decode::<Sample>(&[0x80, 0x00, FORMAT_LATEST + 1, 1, 0]).unwrap_err();
        assert_eq!(
            err,
            FormatError::Newer {
                format: FORMAT_LATEST + 1
            }
        );
        assert!(err.to_string().contains("run a newer release"), "{err}");
        assert_eq!(
            split(&[0x80, 0x00]).unwrap_err(),
            FormatError::Truncated,
            "a mark without its format"
        );
    }

    proptest::proptest! {
        /// No format-1 value of a type that begins with a varint is taken for a marked one.
        #[test]
        fn canonical_varints_never_start_with_the_mark(term in proptest::prelude::any::<u64>(), name in ".{0,300}") {
            let bytes = postcard::to_allocvec(&Sample { term, name: name.clone() }).unwrap();
            proptest::prop_assert!(!bytes.starts_with(&FORMAT_MARK));
            let bytes = postcard::to_allocvec(&(name, term)).unwrap();
            proptest::prop_assert!(!bytes.starts_with(&FORMAT_MARK));
        }
    }

    #[test]
    fn the_cluster_level_only_raises_the_write_format() {
        // The process-wide format: this test is the only one in this crate that moves it.
        assert_eq!(format_for_level(1), FORMAT_LEGACY);
        assert_eq!(format_for_level(2), 2);
        follow_cluster_level(2);
        assert_eq!(write_format(), 2);
        follow_cluster_level(1);
        assert_eq!(write_format(), 2, "the format never goes back down");
    }

    #[test]
    fn every_level_up_to_this_release_names_its_first_release() {
        for level in 1..=FEATURE_LEVEL {
            assert!(FEATURE_LEVELS.iter().any(|(l, _)| *l == level), "{level}");
        }
        assert_eq!(release_for_level(FEATURE_LEVEL), RELEASE);
        assert!(release_for_level(FEATURE_LEVEL + 1).contains("newer than"));
    }
}
