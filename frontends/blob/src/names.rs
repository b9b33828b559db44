//! From the names a blob carries to the cluster's: the SDKs lower-case the whole blob name,
//! so `orders/$default` must find hub `Orders` and group `$Default`.

use tributary_broker::auth::{Credential, Scope};
use tributary_broker::error::Error;
use tributary_broker::service::{Rights, Service};

/// A consumer group as the cluster names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Group {
    pub hub: String,
    pub group: String,
}

/// The hub and consumer group a blob name's segments mean: an exact match, else the one that
/// matches ignoring case. Listen on the hub is checked before anything about it is told.
pub fn resolve(
    service: &Service,
    credential: &Credential,
    hub: &str,
    group: &str,
) -> Result<Group, Error> {
    let state = service.broker().runtime().state();
    let record = state.hubs.get(hub).or_else(|| {
        state
            .hubs
            .values()
            .find(|record| record.name.eq_ignore_ascii_case(hub))
    });
    let hub_name = record.map_or(hub, |record| record.name.as_str());
    service.check(credential, Scope::Hub(hub_name), Rights::LISTEN)?;
    let record = record.ok_or_else(|| {
        Error::not_found(format!(
            "event hub '{hub}' does not exist; `tributary hub create` makes one"
        ))
    })?;
    let group_name = match record.consumer_groups.get_key_value(group) {
        Some((name, _)) => name,
        None => record
            .consumer_groups
            .keys()
            .find(|name| name.eq_ignore_ascii_case(group))
            .ok_or_else(|| {
                Error::not_found(format!(
                    "consumer group '{group}' does not exist in event hub '{}'; \
                     `tributary group create` makes one",
                    record.name
                ))
            })?,
    };
    Ok(Group {
        hub: record.name.clone(),
        group: group_name.clone(),
    })
}
