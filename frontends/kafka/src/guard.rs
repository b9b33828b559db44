//! A walk over a request body before kafka-protocol decodes it. kafka-protocol reserves an
//! array's declared length up front (`Vec::with_capacity(n)` with `n` from the request), so
//! a request declaring billions of elements would make the process abort on a failed
//! allocation. This walks the fields of every API and version served, in the order the
//! Kafka schemas give them, and refuses a body whose arrays declare more elements than
//! bytes remain (every element takes at least one), or that ends early.

use kafka_protocol::messages::ApiKey;

/// Why a body was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Malformed(pub String);

struct Walk<'a> {
    buf: &'a [u8],
    flexible: bool,
}

type Step = Result<(), Malformed>;

impl Walk<'_> {
    fn remaining(&self) -> usize {
        self.buf.len()
    }

    fn skip(&mut self, n: usize) -> Step {
        if n > self.buf.len() {
            return Err(Malformed(format!(
                "a field of {n} bytes where {} remain",
                self.buf.len()
            )));
        }
        self.buf = &self.buf[n..];
        Ok(())
    }

    fn fixed(&mut self, n: usize) -> Step {
        self.skip(n)
    }

    fn int16(&mut self) -> Result<i16, Malformed> {
        let bytes = self
            .buf
            .get(..2)
            .ok_or_else(|| Malformed("ends in an int16".into()))?;
        let value = i16::from_be_bytes([bytes[0], bytes[1]]);
        self.buf = &self.buf[2..];
        Ok(value)
    }

    fn int32(&mut self) -> Result<i32, Malformed> {
        let bytes = self
            .buf
            .get(..4)
            .ok_or_else(|| Malformed("ends in an int32".into()))?;
        let value = i32::from_be_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
        self.buf = &self.buf[4..];
        Ok(value)
    }

    fn uvarint(&mut self) -> Result<u64, Malformed> {
        let mut value = 0u64;
        for shift in (0..35).step_by(7) {
            let (&byte, rest) = self
                .buf
                .split_first()
                .ok_or_else(|| Malformed("ends in a varint".into()))?;
            self.buf = rest;
            value |= u64::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                return Ok(value);
            }
        }
        Err(Malformed("a varint of more than five bytes".into()))
    }

    /// A string or bytes: compact (varint length + 1) when flexible, else `int16`/`int32`
    /// length; -1 (or 0 compact) for null.
    fn sized(&mut self, wide: bool) -> Step {
        let len = if self.flexible {
            self.uvarint()?.saturating_sub(1)
        } else if wide {
            u64::try_from(self.int32()?.max(0)).unwrap_or(0)
        } else {
            u64::try_from(self.int16()?.max(0)).unwrap_or(0)
        };
        self.skip(usize::try_from(len).unwrap_or(usize::MAX))
    }

    fn string(&mut self) -> Step {
        self.sized(false)
    }

    fn bytes(&mut self) -> Step {
        self.sized(true)
    }

    /// An array whose elements `each` walks; its count may not exceed what remains.
    fn array(&mut self, mut each: impl FnMut(&mut Self) -> Step) -> Step {
        let count = if self.flexible {
            self.uvarint()?.saturating_sub(1)
        } else {
            match self.int32()? {
                n if n < -1 => return Err(Malformed(format!("an array of length {n}"))),
                n => u64::try_from(n.max(0)).unwrap_or(0),
            }
        };
        if count > self.remaining() as u64 {
            return Err(Malformed(format!(
                "an array of {count} elements where {} bytes remain",
                self.remaining()
            )));
        }
        for _ in 0..count {
            each(self)?;
        }
        Ok(())
    }

    /// Tagged fields, in flexible versions.
    fn tags(&mut self) -> Step {
        if !self.flexible {
            return Ok(());
        }
        let count = self.uvarint()?;
        if count > self.remaining() as u64 {
            return Err(Malformed(format!(
                "{count} tagged fields in {} bytes",
                self.remaining()
            )));
        }
        for _ in 0..count {
            self.uvarint()?;
            let size = self.uvarint()?;
            self.skip(usize::try_from(size).unwrap_or(usize::MAX))?;
        }
        Ok(())
    }
}

/// Checks a body of `api` at `version` (one this server serves); returns how many bytes
/// follow the fields walked (none, in a well-formed request).
pub fn check(api: ApiKey, version: i16, body: &[u8]) -> Result<usize, Malformed> {
    let mut w = Walk {
        buf: body,
        // Flexible versions (compact lengths, tagged fields) are those with header v2.
        flexible: api.request_header_version(version) >= 2,
    };
    let v = version;
    match api {
        ApiKey::Produce => {
            w.string()?; // transactional id
            w.fixed(2 + 4)?; // acks, timeout
            w.array(|w| {
                w.string()?;
                w.array(|w| {
                    w.fixed(4)?;
                    w.bytes()?;
                    w.tags()
                })?;
                w.tags()
            })?;
        }
        ApiKey::Fetch => {
            w.fixed(4 + 4 + 4)?; // replica id, max wait, min bytes
            if v >= 3 {
                w.fixed(4)?;
            }
            if v >= 4 {
                w.fixed(1)?;
            }
            if v >= 7 {
                w.fixed(4 + 4)?;
            }
            w.array(|w| {
                w.string()?;
                w.array(|w| {
                    w.fixed(4)?;
                    if v >= 9 {
                        w.fixed(4)?;
                    }
                    w.fixed(8)?;
                    if v >= 12 {
                        w.fixed(4)?;
                    }
                    if v >= 5 {
                        w.fixed(8)?;
                    }
                    w.fixed(4)?;
                    w.tags()
                })?;
                w.tags()
            })?;
            if v >= 7 {
                w.array(|w| {
                    w.string()?;
                    w.array(|w| w.fixed(4))?;
                    w.tags()
                })?;
            }
            if v >= 11 {
                w.string()?;
            }
        }
        ApiKey::ListOffsets => {
            w.fixed(4)?;
            if v >= 2 {
                w.fixed(1)?;
            }
            w.array(|w| {
                w.string()?;
                w.array(|w| {
                    w.fixed(4)?;
                    if v >= 4 {
                        w.fixed(4)?;
                    }
                    w.fixed(8)?;
                    w.tags()
                })?;
                w.tags()
            })?;
        }
        ApiKey::Metadata => {
            w.array(|w| {
                if v >= 10 {
                    w.fixed(16)?;
                }
                w.string()?;
                w.tags()
            })?;
            if v >= 4 {
                w.fixed(1)?;
            }
            if (8..=10).contains(&v) {
                w.fixed(1)?;
            }
            if v >= 8 {
                w.fixed(1)?;
            }
        }
        ApiKey::ApiVersions => {
            if v >= 3 {
                w.string()?;
                w.string()?;
            }
        }
        ApiKey::DescribeConfigs => {
            w.array(|w| {
                w.fixed(1)?; // resource type
                w.string()?;
                w.array(|w| w.string())?; // configuration keys (nullable)
                w.tags()
            })?;
            w.fixed(1)?; // include synonyms (v1+)
            if v >= 3 {
                w.fixed(1)?; // include documentation
            }
        }
        ApiKey::CreateTopics => {
            w.array(|w| {
                w.string()?;
                w.fixed(4 + 2)?; // partitions, replication factor
                w.array(|w| {
                    w.fixed(4)?;
                    w.array(|w| w.fixed(4))?;
                    w.tags()
                })?;
                w.array(|w| {
                    w.string()?;
                    w.string()?;
                    w.tags()
                })?;
                w.tags()
            })?;
            w.fixed(4 + 1)?; // timeout, validate only (v1+)
        }
        ApiKey::InitProducerId => {
            w.string()?; // transactional id
            w.fixed(4)?; // transaction timeout
            if v >= 3 {
                w.fixed(8 + 2)?; // producer id, epoch
            }
        }
        ApiKey::SaslHandshake => w.string()?,
        ApiKey::SaslAuthenticate => w.bytes()?,
        ApiKey::FindCoordinator => {
            w.string()?; // key
            if v >= 1 {
                w.fixed(1)?; // key type
            }
        }
        ApiKey::JoinGroup => {
            w.string()?; // group id
            w.fixed(4)?; // session timeout
            if v >= 1 {
                w.fixed(4)?; // rebalance timeout
            }
            w.string()?; // member id
            if v >= 5 {
                w.string()?; // group instance id
            }
            w.string()?; // protocol type
            w.array(|w| {
                w.string()?;
                w.bytes()?;
                w.tags()
            })?;
        }
        ApiKey::SyncGroup => {
            w.string()?; // group id
            w.fixed(4)?; // generation
            w.string()?; // member id
            if v >= 3 {
                w.string()?; // group instance id
            }
            if v >= 5 {
                w.string()?; // protocol type
                w.string()?; // protocol name
            }
            w.array(|w| {
                w.string()?;
                w.bytes()?;
                w.tags()
            })?;
        }
        ApiKey::Heartbeat => {
            w.string()?; // group id
            w.fixed(4)?; // generation
            w.string()?; // member id
            if v >= 3 {
                w.string()?; // group instance id
            }
        }
        ApiKey::LeaveGroup => {
            w.string()?; // group id
            if v <= 2 {
                w.string()?; // member id
            } else {
                w.array(|w| {
                    w.string()?; // member id
                    w.string()?; // group instance id
                    if v >= 5 {
                        w.string()?; // reason
                    }
                    w.tags()
                })?;
            }
        }
        ApiKey::OffsetCommit => {
            w.string()?; // group id
            w.fixed(4)?; // generation
            w.string()?; // member id
            if v >= 7 {
                w.string()?; // group instance id
            }
            if v <= 4 {
                w.fixed(8)?; // retention time
            }
            w.array(|w| {
                w.string()?;
                w.array(|w| {
                    w.fixed(4 + 8)?; // partition, offset
                    if v >= 6 {
                        w.fixed(4)?; // leader epoch
                    }
                    w.string()?; // metadata
                    w.tags()
                })?;
                w.tags()
            })?;
        }
        ApiKey::OffsetFetch => {
            let topics = |w: &mut Walk<'_>| {
                w.array(|w| {
                    w.string()?;
                    w.array(|w| w.fixed(4))?;
                    w.tags()
                })
            };
            if v <= 7 {
                w.string()?; // group id
                topics(&mut w)?;
            } else {
                w.array(|w| {
                    w.string()?; // group id
                    topics(w)?;
                    w.tags()
                })?;
            }
            if v >= 7 {
                w.fixed(1)?; // require stable
            }
        }
        ApiKey::ListGroups => {
            if v >= 4 {
                w.array(|w| w.string())?; // states filter
            }
        }
        ApiKey::DescribeGroups => {
            w.array(|w| w.string())?;
            if v >= 3 {
                w.fixed(1)?; // include authorized operations
            }
        }
        other => return Err(Malformed(format!("{other:?} is not served"))),
    }
    w.tags()?;
    Ok(w.remaining())
}

#[cfg(test)]
#[path = "guard_tests.rs"]
mod tests;
