//! Link addresses and CBS audiences as entity paths (WIRE-PROTOCOLS A1 "Server rule"): pure
//! parsing.

/// What a link address names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Address {
    /// `$cbs`: put-token requests and replies.
    Cbs,
    /// `$management`: READ requests and replies.
    Management,
    /// `<hub>`: a service-routed sender.
    Hub { hub: String },
    /// `<hub>/Partitions/<N>`: a partition sender.
    Partition { hub: String, partition: String },
    /// `<hub>/ConsumerGroups/<G>/Partitions/<N>`: a receiver.
    ConsumerGroupPartition {
        hub: String,
        consumer_group: String,
        partition: String,
    },
}

/// Why an address names nothing we serve.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the address '{address}' {problem}")]
pub struct AddressError {
    pub address: String,
    pub problem: &'static str,
}

/// Parses a link address: `amqps://host/hub/Partitions/0`, `/hub/Partitions/0` (.NET) and
/// `hub/Partitions/0` alike. The keywords are matched case-insensitively; names keep their
/// case (the backend compares them case-insensitively).
pub fn parse_address(address: &str) -> Result<Address, AddressError> {
    let error = |problem| AddressError {
        address: address.to_owned(),
        problem,
    };
    let path = strip_authority(address);
    if path.eq_ignore_ascii_case("$cbs") {
        return Ok(Address::Cbs);
    }
    if path.eq_ignore_ascii_case("$management") {
        return Ok(Address::Management);
    }
    let segments: Vec<&str> = path.split('/').collect();
    if segments.iter().any(|s| s.is_empty()) {
        return Err(error("has an empty path segment"));
    }
    let keyword = |index: usize, word: &str| segments[index].eq_ignore_ascii_case(word);
    match segments.len() {
        1 => Ok(Address::Hub {
            hub: segments[0].to_owned(),
        }),
        3 if keyword(1, "Partitions") => Ok(Address::Partition {
            hub: segments[0].to_owned(),
            partition: segments[2].to_owned(),
        }),
        5 if keyword(1, "ConsumerGroups") && keyword(3, "Partitions") => {
            Ok(Address::ConsumerGroupPartition {
                hub: segments[0].to_owned(),
                consumer_group: segments[2].to_owned(),
                partition: segments[4].to_owned(),
            })
        }
        _ => Err(error(
            "is none of $cbs, $management, <hub>, <hub>/Partitions/<id> and \
             <hub>/ConsumerGroups/<group>/Partitions/<id>",
        )),
    }
}

impl Address {
    /// The path grants are matched against: lower case, without scheme and host.
    pub fn entity_path(&self) -> String {
        let path = match self {
            Address::Cbs => "$cbs".to_owned(),
            Address::Management => "$management".to_owned(),
            Address::Hub { hub } => hub.clone(),
            Address::Partition { hub, partition } => format!("{hub}/partitions/{partition}"),
            Address::ConsumerGroupPartition {
                hub,
                consumer_group,
                partition,
            } => format!("{hub}/consumergroups/{consumer_group}/partitions/{partition}"),
        };
        path.to_ascii_lowercase()
    }
}

/// The entity path of a CBS audience or link address: scheme and host removed, no leading or
/// trailing `/`, lower case. `sb://host/hub/consumergroups/cg` becomes `hub/consumergroups/cg`.
pub fn entity_path(audience: &str) -> String {
    strip_authority(audience).to_ascii_lowercase()
}

/// True when a grant for `audience_path` covers `link_path`: the audience is the link's path
/// or one of its ancestors, segment by segment (`hub` covers `hub/partitions/0`, not `hub2`).
/// The empty path (a namespace-wide grant) covers everything.
pub fn covers(audience_path: &str, link_path: &str) -> bool {
    audience_path.is_empty()
        || link_path == audience_path
        || link_path
            .strip_prefix(audience_path)
            .is_some_and(|rest| rest.starts_with('/'))
}

fn strip_authority(address: &str) -> &str {
    let path = match address.find("://") {
        Some(at) => {
            let after_scheme = &address[at + 3..];
            after_scheme
                .find('/')
                .map_or("", |slash| &after_scheme[slash..])
        }
        None => address,
    };
    path.trim_start_matches('/').trim_end_matches('/')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn partition(hub: &str, partition: &str) -> Address {
        Address::Partition {
            hub: hub.into(),
            partition: partition.into(),
        }
    }

    #[test]
    fn every_client_spelling_of_an_address_parses() {
        let cases = [
            ("$cbs", Address::Cbs),
            ("$CBS", Address::Cbs),
            ("$management", Address::Management),
            ("amqps://host/$management", Address::Management),
            (
                "amqps://ns.example.com/hub",
                Address::Hub { hub: "hub".into() },
            ),
            (
                "amqps://ns.example.com:5671/hub/",
                Address::Hub { hub: "hub".into() },
            ),
            ("amqps://host/hub/Partitions/3", partition("hub", "3")),
            ("/hub/partitions/3", partition("hub", "3")),
            ("Hub/PARTITIONS/0", partition("Hub", "0")),
            (
                "amqps://host/hub/ConsumerGroups/$Default/Partitions/1",
                Address::ConsumerGroupPartition {
                    hub: "hub".into(),
                    consumer_group: "$Default".into(),
                    partition: "1".into(),
                },
            ),
            (
                "/hub/consumergroups/cg/partitions/1",
                Address::ConsumerGroupPartition {
                    hub: "hub".into(),
                    consumer_group: "cg".into(),
                    partition: "1".into(),
                },
            ),
        ];
        for (address, expected) in cases {
            assert_eq!(parse_address(address), Ok(expected), "{address}");
        }
    }

    #[test]
    fn addresses_we_do_not_serve_are_refused_with_the_reason() {
        for address in [
            "",
            "amqps://host",
            "amqps://host/",
            "hub//Partitions/0",
            "hub/Partitions",
            "hub/Publishers/p1",
            "hub/ConsumerGroups/cg",
            "hub/ConsumerGroups/cg/Partitions/0/extra",
        ] {
            let error = parse_address(address).unwrap_err();
            assert_eq!(error.address, address);
        }
    }

    #[test]
    fn entity_paths_match_audiences_segment_by_segment() {
        let consumer = parse_address("amqps://h/Hub/ConsumerGroups/CG/Partitions/0").unwrap();
        assert_eq!(consumer.entity_path(), "hub/consumergroups/cg/partitions/0");
        let audience = entity_path("sb://h.example.com/hub/consumergroups/cg");
        assert_eq!(audience, "hub/consumergroups/cg");
        assert!(covers(&audience, &consumer.entity_path()));
        assert!(covers("hub", &consumer.entity_path()));
        assert!(covers("", &consumer.entity_path()));
        assert!(!covers("hub2", "hub/partitions/0"));
        assert!(!covers("hu", "hub"));
        assert!(!covers("hub/consumergroups/other", &consumer.entity_path()));
        assert_eq!(entity_path("sb://host/"), "");
        assert_eq!(entity_path("https://host/HUB"), "hub");
    }
}
