//! The CBS grants of one connection, per audience, and which of them authorizes a link.
//!
//! A link records the audience path that authorized it. When that grant expires the link is
//! re-checked against the other grants (a refreshed token replaces the grant under the same
//! audience) and detached with `amqp:unauthorized-access` when none covers it.

use std::collections::HashMap;

use super::address::covers;
use super::backend::{Right, TokenGrant};

/// Grants by audience entity path ([`super::address::entity_path`]).
#[derive(Debug, Default)]
pub(crate) struct Grants {
    by_path: HashMap<String, TokenGrant>,
}

/// The connection holds as many audiences as it may.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TooManyGrants;

impl Grants {
    /// Stores (or refreshes) the grant for an audience; expired grants are dropped first so
    /// a long-lived connection that refreshes tokens never fills up.
    pub(crate) fn insert(
        &mut self,
        audience_path: String,
        grant: TokenGrant,
        now_unix_ms: i64,
        grants_max: usize,
    ) -> Result<(), TooManyGrants> {
        self.by_path
            .retain(|_, grant| grant.expires_at_unix_ms > now_unix_ms);
        if !self.by_path.contains_key(&audience_path) && self.by_path.len() >= grants_max {
            return Err(TooManyGrants);
        }
        self.by_path.insert(audience_path, grant);
        Ok(())
    }

    /// The live grant that covers `link_path` with `right` and lasts longest, with its
    /// audience path.
    pub(crate) fn covering(
        &self,
        link_path: &str,
        right: Right,
        now_unix_ms: i64,
    ) -> Option<(&str, &TokenGrant)> {
        self.by_path
            .iter()
            .filter(|(path, grant)| {
                grant.expires_at_unix_ms > now_unix_ms
                    && grant.rights.allow(right)
                    && covers(path, link_path)
            })
            .max_by_key(|(_, grant)| grant.expires_at_unix_ms)
            .map(|(path, grant)| (path.as_str(), grant))
    }

    /// When the grant under `audience_path` expires; `None` when there is none.
    pub(crate) fn expires_at(&self, audience_path: &str) -> Option<i64> {
        self.by_path
            .get(audience_path)
            .map(|grant| grant.expires_at_unix_ms)
    }
}

/// The authorization of one link: what it needs and which audience gave it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LinkAuthorization {
    pub(crate) link_path: String,
    pub(crate) right: Right,
    pub(crate) audience_path: String,
}

impl LinkAuthorization {
    /// When the link must be re-checked.
    pub(crate) fn deadline_unix_ms(&self, grants: &Grants) -> i64 {
        grants.expires_at(&self.audience_path).unwrap_or(i64::MIN)
    }

    /// Moves the link onto another live grant when its own has expired; false when none
    /// covers it any more.
    pub(crate) fn renew(&mut self, grants: &Grants, now_unix_ms: i64) -> bool {
        if self.deadline_unix_ms(grants) > now_unix_ms {
            return true;
        }
        match grants.covering(&self.link_path, self.right, now_unix_ms) {
            Some((path, _)) => {
                self.audience_path = path.to_owned();
                true
            }
            None => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server::backend::Rights;

    fn grant(rights: Rights, expires_at_unix_ms: i64) -> TokenGrant {
        TokenGrant {
            rights,
            credential: String::new(),
            expires_at_unix_ms,
        }
    }

    const SEND: Rights = Rights {
        send: true,
        listen: false,
        manage: false,
    };

    #[test]
    fn the_covering_grant_needs_the_right_the_path_and_time() {
        let mut grants = Grants::default();
        grants.insert("hub".into(), grant(SEND, 100), 0, 4).unwrap();
        let path = "hub/partitions/0";
        assert_eq!(
            grants.covering(path, Right::Send, 50).map(|g| g.0),
            Some("hub")
        );
        assert!(grants.covering(path, Right::Listen, 50).is_none());
        assert!(grants.covering(path, Right::Send, 100).is_none());
        assert!(grants.covering("other", Right::Send, 50).is_none());
        grants
            .insert("".into(), grant(Rights::MANAGE, 500), 0, 4)
            .unwrap();
        assert_eq!(
            grants.covering(path, Right::Send, 50).map(|g| g.0),
            Some("")
        );
    }

    #[test]
    fn the_grant_table_is_bounded_but_expired_grants_make_room() {
        let mut grants = Grants::default();
        grants.insert("a".into(), grant(SEND, 100), 0, 2).unwrap();
        grants.insert("b".into(), grant(SEND, 200), 0, 2).unwrap();
        assert_eq!(
            grants.insert("c".into(), grant(SEND, 300), 0, 2),
            Err(TooManyGrants)
        );
        grants.insert("a".into(), grant(SEND, 400), 0, 2).unwrap();
        assert_eq!(grants.expires_at("a"), Some(400));
        grants.insert("c".into(), grant(SEND, 300), 250, 2).unwrap();
        assert_eq!(grants.expires_at("b"), None);
    }

    #[test]
    fn a_link_outlives_its_grant_only_through_a_refresh_or_another_grant() {
        let mut grants = Grants::default();
        grants.insert("hub".into(), grant(SEND, 100), 0, 4).unwrap();
        let mut link = LinkAuthorization {
            link_path: "hub/partitions/0".into(),
            right: Right::Send,
            audience_path: "hub".into(),
        };
        assert_eq!(link.deadline_unix_ms(&grants), 100);
        assert!(link.renew(&grants, 99));
        assert!(!link.renew(&grants, 100));
        grants
            .insert("hub".into(), grant(SEND, 200), 100, 4)
            .unwrap();
        assert!(link.renew(&grants, 150));
        grants
            .insert("hub/partitions/0".into(), grant(SEND, 900), 150, 4)
            .unwrap();
        assert!(link.renew(&grants, 200));
        assert_eq!(link.audience_path, "hub/partitions/0");
        assert!(!link.renew(&grants, 900));
    }
}
