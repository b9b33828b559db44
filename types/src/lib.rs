//! Vocabulary shared by every Tributary crate: typed ids, limits, the partition-key hash,
//! naming rules, the clock, shared access signatures and the stages a send's time is
//! measured in.

pub mod clock;
pub mod format;
pub mod ids;
pub mod limits;
pub mod names;
pub mod partition_key;
pub mod sas;
pub mod send_stage;
pub mod throttle;
pub mod time_format;

pub use clock::{Clock, ManualClock, MonotonicStamp, SystemClock};
pub use ids::{GroupId, HubId, NodeId, Offset, PartitionId, SequenceNumber};
pub use limits::{RetentionError, parse_retention};
pub use names::{
    DEFAULT_CONSUMER_GROUP, NameError, NameKind, validate_consumer_group_name, validate_hub_name,
};
pub use partition_key::{partition_for_key, partition_key_hash};
pub use sas::{
    AuthError, AuthorizationRule, ConnectionString, ConnectionStringError, Credential, Grant,
    Rights, SasToken, TokenError, authorize, parse_token, sign, verify,
};
pub use send_stage::SendStage;
pub use time_format::{TimeParseError, UtcDateTime, format_rfc3339_ms, parse_rfc3339_ms};
