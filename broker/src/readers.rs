//! The readers connected to this node, per consumer group and partition, and Event Hubs'
//! rules for them (SPEC.md section 3): at most five plain readers; a reader with an owner
//! level (epoch) displaces readers with an equal or lower level and plain readers, and is
//! refused while one with a higher level is connected; plain readers are refused while a
//! reader with a level is connected. A reader's slot is freed the moment its stream ends,
//! including when its client's connection dies (the stream is dropped with it), so dead
//! readers never eat the quota.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::oneshot;
use tributary_types::HubId;

use crate::error::{Error, ErrorKind};

/// Plain readers per consumer group and partition at most (Event Hubs' limit).
pub const PLAIN_READERS_MAX: usize = 5;

/// A consumer group's partition.
pub type ReaderKey = (HubId, String, u16);

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectedReader {
    pub name: String,
    pub owner_level: Option<i64>,
}

struct Entry {
    id: u64,
    reader: ConnectedReader,
    /// Tells the reader's stream why it ends when a newer reader displaces it.
    displace: Option<oneshot::Sender<Error>>,
}

#[derive(Default)]
pub struct Readers {
    connected: Mutex<HashMap<ReaderKey, Vec<Entry>>>,
    next_id: AtomicU64,
}

/// A connected reader's slot; dropping it frees the slot.
pub struct ReaderSlot {
    readers: Arc<Readers>,
    key: ReaderKey,
    id: u64,
    /// Resolves with the error to end the stream with when a newer reader displaces this one.
    pub displaced: oneshot::Receiver<Error>,
}

impl Drop for ReaderSlot {
    fn drop(&mut self) {
        let mut connected = self.readers.connected.lock().expect("readers lock");
        if let Some(entries) = connected.get_mut(&self.key) {
            entries.retain(|e| e.id != self.id);
            if entries.is_empty() {
                connected.remove(&self.key);
            }
        }
    }
}

fn shown(name: &str) -> &str {
    if name.is_empty() { "nil" } else { name }
}

fn level(owner_level: Option<i64>) -> String {
    owner_level.map_or_else(|| "none".to_string(), |l| l.to_string())
}

impl Readers {
    pub fn new() -> Arc<Self> {
        Arc::new(Readers::default())
    }

    /// Connects a reader to `key`, displacing or refusing by the rules above.
    pub fn attach(
        self: &Arc<Self>,
        key: ReaderKey,
        name: &str,
        owner_level: Option<i64>,
    ) -> Result<ReaderSlot, Error> {
        let mut connected = self.connected.lock().expect("readers lock");
        let entries = connected.entry(key.clone()).or_default();
        let highest = entries.iter().filter_map(|e| e.reader.owner_level).max();
        match (owner_level, highest) {
            (Some(new), Some(current)) if current > new => {
                return Err(Error::new(
                    ErrorKind::ReaderDisconnected,
                    format!(
                        "Receiver '{}' with epoch '{new}' cannot be created because a receiver with a higher epoch '{current}' is connected to this consumer group's partition",
                        shown(name)
                    ),
                ));
            }
            (Some(new), _) => {
                for displaced in entries.drain(..) {
                    let message = format!(
                        "displaced by a newer reader: new receiver '{}' with higher epoch of '{new}' is created hence current receiver '{}' with epoch '{}' is getting disconnected. If you are recreating the receiver, make sure a higher epoch is used",
                        shown(name),
                        shown(&displaced.reader.name),
                        level(displaced.reader.owner_level),
                    );
                    if let Some(tx) = displaced.displace {
                        let _ = tx.send(Error::new(ErrorKind::ReaderDisconnected, message));
                    }
                }
            }
            (None, Some(current)) => {
                return Err(Error::new(
                    ErrorKind::ReaderDisconnected,
                    format!(
                        "Receiver '{}' without an epoch cannot be created because a receiver with epoch '{current}' is connected to this consumer group's partition",
                        shown(name)
                    ),
                ));
            }
            (None, None) if entries.len() >= PLAIN_READERS_MAX => {
                let names: Vec<&str> = entries.iter().map(|e| shown(&e.reader.name)).collect();
                return Err(Error::new(
                    ErrorKind::QuotaExceeded,
                    format!(
                        "Exceeded the maximum number of allowed receivers per partition in a consumer group which is {PLAIN_READERS_MAX}. List of connected receivers - {}",
                        names.join(", ")
                    ),
                ));
            }
            (None, None) => {}
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        entries.push(Entry {
            id,
            reader: ConnectedReader {
                name: name.to_string(),
                owner_level,
            },
            displace: Some(tx),
        });
        Ok(ReaderSlot {
            readers: self.clone(),
            key,
            id,
            displaced: rx,
        })
    }

    /// The readers connected to `key`, oldest first.
    pub fn connected(&self, key: &ReaderKey) -> Vec<ConnectedReader> {
        self.connected
            .lock()
            .expect("readers lock")
            .get(key)
            .map(|entries| entries.iter().map(|e| e.reader.clone()).collect())
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> ReaderKey {
        (HubId(1), "$Default".to_string(), 0)
    }

    #[test]
    fn a_sixth_plain_reader_is_refused_naming_the_connected_ones() {
        let readers = Readers::new();
        let slots: Vec<ReaderSlot> = (0..5)
            .map(|i| readers.attach(key(), &format!("r{i}"), None).unwrap())
            .collect();
        let err = readers.attach(key(), "r5", None).err().unwrap();
        assert_eq!(err.kind, ErrorKind::QuotaExceeded);
        assert!(
            err.message
                .ends_with("which is 5. List of connected receivers - r0, r1, r2, r3, r4"),
            "{}",
            err.message
        );
        // Another partition or group has its own five.
        let other = (HubId(1), "audit".to_string(), 0);
        readers.attach(other, "x", None).unwrap();
        // A slot is freed when its reader goes.
        drop(slots);
        assert!(readers.connected(&key()).is_empty());
        readers.attach(key(), "r5", None).unwrap();
    }

    #[test]
    fn owner_levels_displace_equal_and_lower_and_refuse_the_rest() {
        let readers = Readers::new();
        let mut plain = readers.attach(key(), "plain", None).unwrap();
        let mut first = readers.attach(key(), "first", Some(1)).unwrap();
        let err = plain.displaced.try_recv().unwrap();
        assert_eq!(err.kind, ErrorKind::ReaderDisconnected);
        assert!(
            err.message.starts_with("displaced by a newer reader"),
            "{}",
            err.message
        );
        // Equal levels displace.
        let _second = readers.attach(key(), "second", Some(1)).unwrap();
        let err = first.displaced.try_recv().unwrap();
        assert!(
            err.message
                .contains("current receiver 'first' with epoch '1'"),
            "{}",
            err.message
        );
        // A lower level and a plain reader are refused while level 1 is connected.
        let err = readers.attach(key(), "low", Some(0)).err().unwrap();
        assert_eq!(err.kind, ErrorKind::ReaderDisconnected);
        assert!(err.message.contains("higher epoch '1'"), "{}", err.message);
        let err = readers.attach(key(), "late", None).err().unwrap();
        assert_eq!(err.kind, ErrorKind::ReaderDisconnected);
        let names: Vec<String> = readers
            .connected(&key())
            .into_iter()
            .map(|r| r.name)
            .collect();
        assert_eq!(names, vec!["second".to_string()]);
    }
}
