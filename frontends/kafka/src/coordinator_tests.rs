use super::*;

const SESSION_MS: i32 = 10_000;
const REBALANCE_MS: i32 = 30_000;

fn config() -> CoordinatorConfig {
    CoordinatorConfig {
        initial_rebalance_delay_ms: 1_000,
        ..CoordinatorConfig::default()
    }
}

fn join(member_id: &str, protocols: &[&str]) -> Join {
    Join {
        group: "g".into(),
        member_id: member_id.into(),
        group_instance_id: None,
        client_id: "rdkafka".into(),
        client_host: "/127.0.0.1".into(),
        session_timeout_ms: SESSION_MS,
        rebalance_timeout_ms: REBALANCE_MS,
        protocol_type: "consumer".into(),
        protocols: protocols
            .iter()
            .map(|p| (p.to_string(), Bytes::from(format!("{member_id}/{p}"))))
            .collect(),
        require_known_member_id: true,
    }
}

/// A member id, from the MEMBER_ID_REQUIRED answer to a first join.
fn new_member(c: &mut Coordinator, now_ms: i64) -> String {
    match c.join(now_ms, join("", &["range", "roundrobin"])) {
        (Answer::Now(joined), deliveries) => {
            assert_eq!(joined.error_code, code::MEMBER_ID_REQUIRED);
            assert!(deliveries.is_empty());
            assert!(joined.member_id.starts_with("rdkafka-"), "{joined:?}");
            joined.member_id
        }
        other => panic!("{other:?}"),
    }
}

fn joins(deliveries: &[Delivery]) -> BTreeMap<String, Joined> {
    deliveries
        .iter()
        .filter_map(|d| match d {
            Delivery::Join {
                member_id, joined, ..
            } => Some((member_id.clone(), joined.clone())),
            Delivery::Sync { .. } => None,
        })
        .collect()
}

fn syncs(deliveries: &[Delivery]) -> BTreeMap<String, Synced> {
    deliveries
        .iter()
        .filter_map(|d| match d {
            Delivery::Sync {
                member_id, synced, ..
            } => Some((member_id.clone(), synced.clone())),
            Delivery::Join { .. } => None,
        })
        .collect()
}

fn sync(member_id: &str, generation_id: i32, assignments: &[(&str, &str)]) -> Sync {
    Sync {
        group: "g".into(),
        generation_id,
        member_id: member_id.into(),
        assignments: assignments
            .iter()
            .map(|(m, a)| (m.to_string(), Bytes::from(a.to_string())))
            .collect(),
    }
}

/// Two members joined and synced at generation 1: (coordinator, leader, follower).
fn stable_pair() -> (Coordinator, String, String) {
    let mut c = Coordinator::new(config());
    let a = new_member(&mut c, 0);
    let b = new_member(&mut c, 0);
    assert!(matches!(
        c.join(10, join(&a, &["range", "roundrobin"])).0,
        Answer::Parked(_)
    ));
    assert!(matches!(
        c.join(20, join(&b, &["roundrobin", "range"])).0,
        Answer::Parked(_)
    ));
    let joined = joins(&c.tick(1_010));
    assert_eq!(joined.len(), 2);
    let leader = joined[&a].leader.clone();
    let follower = if leader == a { b.clone() } else { a.clone() };
    assert!(matches!(
        c.sync(1_020, sync(&follower, 1, &[])).0,
        Answer::Parked(_)
    ));
    let (answer, deliveries) = c.sync(
        1_030,
        sync(&leader, 1, &[(&a, "assigned-a"), (&b, "assigned-b")]),
    );
    assert!(matches!(answer, Answer::Now(ref s) if s.error_code == 0));
    assert_eq!(syncs(&deliveries).len(), 1);
    (c, leader, follower)
}

#[test]
fn a_join_waits_for_every_known_member_and_elects_one_leader() {
    let mut c = Coordinator::new(config());
    let a = new_member(&mut c, 0);
    let b = new_member(&mut c, 0);
    assert_ne!(a, b);
    // The first join waits out the new group's initial delay for others.
    let (answer, deliveries) = c.join(10, join(&a, &["range", "roundrobin"]));
    assert_eq!(answer, Answer::Parked(a.clone()));
    assert!(deliveries.is_empty());
    assert!(c.tick(500).is_empty());
    let (answer, deliveries) = c.join(600, join(&b, &["roundrobin", "range"]));
    assert!(matches!(answer, Answer::Parked(_)));
    assert!(deliveries.is_empty(), "still within the initial delay");
    let joined = joins(&c.tick(1_010));
    assert_eq!(joined.len(), 2);
    let leader = &joined[&a].leader;
    assert_eq!(leader, &joined[&b].leader);
    for (id, j) in &joined {
        assert_eq!(j.error_code, code::NONE);
        assert_eq!(j.generation_id, 1);
        assert_eq!(&j.member_id, id);
        // One vote each: the tie goes to the leader's preference.
        let expected = if *leader == a { "range" } else { "roundrobin" };
        assert_eq!(j.protocol_name.as_deref(), Some(expected));
        if id == leader {
            let members: Vec<&String> = j.members.iter().map(|(m, _, _)| m).collect();
            assert_eq!(members, vec![&a, &b]);
            assert_eq!(j.members[0].2, Bytes::from(format!("{a}/{expected}")));
        } else {
            assert!(j.members.is_empty(), "members go only to the leader");
        }
    }
    assert_eq!(
        c.describe("g").unwrap().state,
        GroupState::CompletingRebalance
    );
}

#[test]
fn the_protocol_is_one_every_member_supports() {
    let mut c = Coordinator::new(config());
    let a = new_member(&mut c, 0);
    let b = new_member(&mut c, 0);
    c.join(0, join(&a, &["sticky", "range"]));
    c.join(0, join(&b, &["roundrobin", "range"]));
    let joined = joins(&c.tick(2_000));
    assert_eq!(joined[&a].protocol_name.as_deref(), Some("range"));
    // A member sharing none with the group is refused.
    let x = new_member(&mut c, 2_000);
    let (answer, _) = c.join(2_000, join(&x, &["cooperative-sticky"]));
    assert!(matches!(answer, Answer::Now(j) if j.error_code == code::INCONSISTENT_GROUP_PROTOCOL));
}

#[test]
fn sync_releases_the_leaders_assignments_to_each_member() {
    let mut c = Coordinator::new(config());
    let a = new_member(&mut c, 0);
    let b = new_member(&mut c, 0);
    c.join(0, join(&a, &["range"]));
    c.join(0, join(&b, &["range"]));
    let joined = joins(&c.tick(1_000));
    let leader = joined[&a].leader.clone();
    let follower = if leader == a { b.clone() } else { a.clone() };
    assert!(matches!(
        c.sync(1_100, sync(&follower, 1, &[])).0,
        Answer::Parked(_)
    ));
    let (answer, deliveries) = c.sync(
        1_200,
        sync(
            &leader,
            1,
            &[(&leader, "for-leader"), (&follower, "for-follower")],
        ),
    );
    match answer {
        Answer::Now(s) => {
            assert_eq!(s.assignment, Bytes::from("for-leader"));
            assert_eq!(s.protocol_name.as_deref(), Some("range"));
        }
        Answer::Parked(_) => panic!("the leader's sync is answered at once"),
    }
    let synced = syncs(&deliveries);
    assert_eq!(synced[&follower].assignment, Bytes::from("for-follower"));
    assert_eq!(c.describe("g").unwrap().state, GroupState::Stable);
    // A sync once stable gets the member's assignment again.
    match c.sync(1_300, sync(&follower, 1, &[])).0 {
        Answer::Now(s) => assert_eq!(s.assignment, Bytes::from("for-follower")),
        Answer::Parked(_) => panic!("stable"),
    }
}

#[test]
fn heartbeats_answer_rebalancing_unknown_member_and_stale_generation() {
    let (mut c, leader, follower) = stable_pair();
    assert_eq!(c.heartbeat(2_000, "g", 1, &leader), code::NONE);
    assert_eq!(
        c.heartbeat(2_000, "g", 0, &leader),
        code::ILLEGAL_GENERATION
    );
    assert_eq!(
        c.heartbeat(2_000, "g", 1, "stranger"),
        code::UNKNOWN_MEMBER_ID
    );
    assert_eq!(
        c.heartbeat(2_000, "nogroup", 1, &leader),
        code::UNKNOWN_MEMBER_ID
    );
    // A member rejoining starts a rebalance: the other's heartbeats say so.
    assert!(matches!(
        c.join(2_100, join(&leader, &["range"])).0,
        Answer::Parked(_)
    ));
    assert_eq!(
        c.heartbeat(2_200, "g", 1, &follower),
        code::REBALANCE_IN_PROGRESS
    );
    let joined = joins(&c.join(2_300, join(&follower, &["range"])).1);
    assert_eq!(
        joined.len(),
        2,
        "everyone rejoined: no initial delay for a known group"
    );
    assert_eq!(joined[&follower].generation_id, 2);
    assert_eq!(
        c.heartbeat(2_400, "g", 1, &follower),
        code::ILLEGAL_GENERATION
    );
    // Stale generations are refused by SyncGroup and OffsetCommit too.
    assert_eq!(
        c.sync(2_500, sync(&follower, 1, &[])).0,
        Answer::Now(Synced::error(code::ILLEGAL_GENERATION))
    );
    assert_eq!(
        c.check_commit(2_500, "g", 1, &follower),
        code::ILLEGAL_GENERATION
    );
    assert_eq!(
        c.check_commit(2_500, "g", 2, &follower),
        code::REBALANCE_IN_PROGRESS
    );
    assert_eq!(
        c.check_commit(2_500, "g", 2, "stranger"),
        code::UNKNOWN_MEMBER_ID
    );
}

#[test]
fn unknown_members_are_refused_and_first_joins_need_their_id() {
    let mut c = Coordinator::new(config());
    let (answer, _) = c.join(0, join("made-up", &["range"]));
    assert!(matches!(answer, Answer::Now(j) if j.error_code == code::UNKNOWN_MEMBER_ID));
    // Before v4: a first join is taken at once, its id in the answer.
    let mut old = join("", &["range"]);
    old.require_known_member_id = false;
    assert!(matches!(c.join(0, old).0, Answer::Parked(_)));
    let joined = joins(&c.tick(1_000));
    assert_eq!(joined.len(), 1);
    assert!(joined.keys().next().unwrap().starts_with("rdkafka-"));
    // An id handed out and never used lapses with its session timeout.
    let unused = new_member(&mut c, 1_000);
    c.tick(1_000 + i64::from(SESSION_MS));
    let (answer, _) = c.join(1_000 + i64::from(SESSION_MS), join(&unused, &["range"]));
    assert!(matches!(answer, Answer::Now(j) if j.error_code == code::UNKNOWN_MEMBER_ID));
    // Session timeouts outside the bounds.
    let mut short = join("", &["range"]);
    short.session_timeout_ms = 1_000;
    let (answer, _) = c.join(0, short);
    assert!(matches!(answer, Answer::Now(j) if j.error_code == code::INVALID_SESSION_TIMEOUT));
}

#[test]
fn a_member_leaving_makes_the_others_rebalance_without_it() {
    let (mut c, leader, follower) = stable_pair();
    let (code, deliveries) = c.leave(3_000, "g", &leader);
    assert_eq!(code, code::NONE);
    assert!(deliveries.is_empty());
    assert_eq!(
        c.heartbeat(3_100, "g", 1, &follower),
        code::REBALANCE_IN_PROGRESS
    );
    let joined = joins(&c.join(3_200, join(&follower, &["range"])).1);
    let j = &joined[&follower];
    assert_eq!((j.generation_id, j.leader.as_str()), (2, follower.as_str()));
    assert_eq!(
        j.members.len(),
        1,
        "the survivor leads and assigns everything"
    );
    assert_eq!(c.leave(3_300, "g", &leader).0, code::UNKNOWN_MEMBER_ID);
    // The last member leaving empties the group; it is then forgotten.
    c.leave(3_400, "g", &follower);
    assert_eq!(c.describe("g").unwrap().state, GroupState::Empty);
    c.tick(3_500);
    assert!(c.describe("g").is_none());
    // With no members, commits outside group management are taken.
    assert_eq!(c.check_commit(3_600, "g", -1, ""), code::NONE);
}

#[test]
fn a_lapsed_session_evicts_the_member_and_the_others_rebalance() {
    let (mut c, leader, follower) = stable_pair();
    // The leader keeps heartbeating; the follower goes silent.
    let mut now = 1_030;
    while now < 1_030 + i64::from(SESSION_MS) - 1_000 {
        now += 3_000;
        assert_eq!(c.heartbeat(now, "g", 1, &leader), code::NONE);
        assert!(c.tick(now).is_empty());
    }
    now = 1_030 + i64::from(SESSION_MS);
    assert!(c.tick(now).is_empty());
    assert_eq!(c.heartbeat(now, "g", 1, &follower), code::UNKNOWN_MEMBER_ID);
    assert_eq!(
        c.heartbeat(now, "g", 1, &leader),
        code::REBALANCE_IN_PROGRESS
    );
    let joined = joins(&c.join(now, join(&leader, &["range"])).1);
    assert_eq!(joined[&leader].generation_id, 2);
    assert_eq!(joined[&leader].members.len(), 1);
}

#[test]
fn a_member_that_does_not_rejoin_in_time_is_dropped() {
    let (mut c, leader, follower) = stable_pair();
    assert!(matches!(
        c.join(5_000, join(&leader, &["range"])).0,
        Answer::Parked(_)
    ));
    // The follower heartbeats (told to rejoin) but never does.
    let mut now = 5_000;
    let mut joined = BTreeMap::new();
    while joined.is_empty() {
        now += 1_000;
        assert!(
            now <= 5_000 + i64::from(REBALANCE_MS),
            "the rebalance ends by its timeout"
        );
        if c.heartbeat(now, "g", 1, &follower) == code::UNKNOWN_MEMBER_ID {
            panic!("still a member while the rebalance waits");
        }
        joined = joins(&c.tick(now));
    }
    assert_eq!(now, 5_000 + i64::from(REBALANCE_MS));
    assert_eq!(joined.keys().collect::<Vec<_>>(), vec![&leader]);
    assert_eq!(c.heartbeat(now, "g", 2, &follower), code::UNKNOWN_MEMBER_ID);
}

#[test]
fn a_sync_waiting_when_a_rebalance_starts_is_told_to_rejoin() {
    let mut c = Coordinator::new(config());
    let a = new_member(&mut c, 0);
    let b = new_member(&mut c, 0);
    c.join(0, join(&a, &["range"]));
    c.join(0, join(&b, &["range"]));
    let joined = joins(&c.tick(1_000));
    let leader = joined[&a].leader.clone();
    let follower = if leader == a { b.clone() } else { a.clone() };
    assert!(matches!(
        c.sync(1_100, sync(&follower, 1, &[])).0,
        Answer::Parked(_)
    ));
    // The leader leaves instead of syncing.
    let (_, deliveries) = c.leave(1_200, "g", &leader);
    assert_eq!(
        syncs(&deliveries)[&follower],
        Synced::error(code::REBALANCE_IN_PROGRESS)
    );
    let view = c.describe("g").unwrap();
    assert_eq!(view.state, GroupState::PreparingRebalance);
    assert_eq!(
        c.list(),
        vec![(
            "g".into(),
            "consumer".into(),
            GroupState::PreparingRebalance
        )]
    );
}
