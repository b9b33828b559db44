//! The raft layer under a simulated network (turmoil). Three hosts run three groups over
//! the real peer transport (tonic on turmoil TCP) and redb log stores, while writers propose
//! appends and a seeded nemesis isolates, delays and mutes hosts. Every few simulated
//! milliseconds the checker verifies election safety, that committed entries never change
//! (in any state machine or stored log), that acknowledged entries are never lost, and log
//! matching. After the faults the network heals: every group must accept writes again and
//! all replicas must converge to the same applied entries.
//!
//! Replay a run with `TRIBUTARY_SIM_SEED=<seed> cargo test -p tributary-raft --test sim`.
//! The seed fixes the fault schedule, the workload's choices and turmoil's network; the
//! storage writer threads still run on wall-clock time, so a replay is close, not exact.

mod checker;
mod client;
mod cluster;
mod founding;
mod hibernation;
mod nemesis;
mod net;
mod slow_links;
mod state_machine;

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use checker::Checker;
use client::Workload;
use cluster::{Registry, Replica};
use nemesis::{Scheduled, Target};
use openraft::ServerState;
use openraft::async_runtime::WatchReceiver;

/// Simulated time the nemesis is active.
const FAULTS_UNTIL: Duration = Duration::from_secs(30);
/// After healing: how long every group may take to accept a write again, and then, once the
/// writers stop, how long the replicas may take to converge.
const RECOVERY_MAX: Duration = Duration::from_secs(20);
const CONVERGENCE_MAX: Duration = Duration::from_secs(20);
/// How long the hosts may take to start their groups.
const STARTUP_MAX: Duration = Duration::from_secs(5);
const TICK: Duration = Duration::from_millis(5);
/// Steps between checks: every 10 ms of simulated time.
const CHECK_EVERY_STEPS: u64 = 2;
/// Simulated time between full scans of every stored log.
const FULL_CHECK_EVERY: Duration = Duration::from_secs(1);
const MESSAGE_LATENCY_MAX: Duration = Duration::from_millis(20);

#[test]
fn partitions_and_heals_keep_groups_safe_and_convergent() {
    let seed = seed();
    println!("sim seed: {seed} (replay with TRIBUTARY_SIM_SEED={seed})");
    let wall = Instant::now();
    let dir = data_dir();

    let mut sim = turmoil::Builder::new()
        .simulation_duration(
            FAULTS_UNTIL + STARTUP_MAX + RECOVERY_MAX + CONVERGENCE_MAX + Duration::from_secs(5),
        )
        .tick_duration(TICK)
        .max_message_latency(MESSAGE_LATENCY_MAX)
        .enable_random_order()
        .rng_seed(seed)
        .build();
    let registry = Registry::default();
    cluster::add_hosts(&mut sim, dir.path(), &registry);
    let workload = Arc::new(Workload::default());
    sim.client(
        "client",
        client::run(registry.clone(), workload.clone(), seed),
    );
    let schedule = nemesis::schedule(seed, FAULTS_UNTIL);

    let mut run = Run {
        sim,
        registry,
        workload,
        checker: Checker::default(),
        steps: 0,
        client_finished: false,
        last_full_check: Duration::ZERO,
        stepping_wall_time: Duration::ZERO,
        checking_wall_time: Duration::ZERO,
    };
    run.start();
    run.faults(&schedule);
    run.recover();
    run.converge();

    let workload = &run.workload;
    println!(
        "done: {:?} simulated in {:?} ({:?} stepping, {:?} checking), {} steps",
        run.sim.elapsed(),
        wall.elapsed(),
        run.stepping_wall_time,
        run.checking_wall_time,
        run.steps,
    );
    println!(
        "{} proposals, {} failed, {} acknowledged; {} committed entries, {} discarded; \
         {} leader ids; terms with several leaders: {:?}",
        workload.attempts.load(Ordering::Relaxed),
        workload.failures.load(Ordering::Relaxed),
        run.checker.acked_entries(),
        run.checker.committed_entries(),
        run.checker.discarded_entries(),
        run.checker.leader_ids_seen(),
        run.checker.terms_with_several_leaders(),
    );
}

struct Run<'a> {
    sim: turmoil::Sim<'a>,
    registry: Registry,
    workload: Arc<Workload>,
    checker: Checker,
    steps: u64,
    /// Whether the client host's software (the writers) has ended.
    client_finished: bool,
    last_full_check: Duration,
    /// Wall-clock time spent stepping the simulation and checking it.
    stepping_wall_time: Duration,
    checking_wall_time: Duration,
}

impl Run<'_> {
    fn replicas(&self) -> Vec<Replica> {
        self.registry.lock().expect("registry lock").clone()
    }

    /// One simulation step, then the checks when one is due.
    fn step(&mut self) {
        let started = Instant::now();
        self.client_finished = self.sim.step().expect("simulation step");
        self.stepping_wall_time += started.elapsed();
        self.steps += 1;
        if self.steps.is_multiple_of(CHECK_EVERY_STEPS) {
            let started = Instant::now();
            let acks = std::mem::take(&mut *self.workload.acks.lock().expect("acks lock"));
            self.checker.acknowledged(acks);
            let replicas = self.replicas();
            self.checker.check(&replicas);
            if self.sim.elapsed() >= self.last_full_check + FULL_CHECK_EVERY {
                self.last_full_check = self.sim.elapsed();
                self.checker.check_full_logs(&replicas);
            }
            self.checking_wall_time += started.elapsed();
        }
    }

    /// Steps until `done` holds, or fails after `limit` of simulated time.
    fn step_until(&mut self, limit: Duration, what: &str, mut done: impl FnMut(&mut Self) -> bool) {
        let deadline = self.sim.elapsed() + limit;
        while !done(self) {
            assert!(
                self.sim.elapsed() < deadline,
                "{what}: not within {limit:?} of simulated time"
            );
            self.step();
        }
    }

    fn start(&mut self) {
        let expected = cluster::HOSTS.len() * cluster::groups().len();
        self.step_until(STARTUP_MAX, "every host starts its groups", |run| {
            run.replicas().len() == expected
        });
    }

    /// Runs the nemesis schedule; faults never overlap, so ending one heals everything.
    fn faults(&mut self, schedule: &[Scheduled]) {
        let mut next = 0;
        let mut active: Option<Scheduled> = None;
        while self.sim.elapsed() < FAULTS_UNTIL {
            let now = self.sim.elapsed();
            if let Some(fault) = active
                && now >= fault.end
            {
                nemesis::heal(&self.sim);
                active = None;
            }
            if active.is_none()
                && let Some(fault) = schedule.get(next)
                && now >= fault.start
            {
                let replicas = self.replicas();
                let hit =
                    nemesis::inject(&self.sim, fault.fault, |target| resolve(target, &replicas));
                let hit = hit.map_or(String::from("every host"), |h| {
                    cluster::HOSTS[h].to_string()
                });
                println!(
                    "{now:?}: {:?} hits {hit} until {:?}",
                    fault.fault, fault.end
                );
                active = Some(*fault);
                next += 1;
            }
            self.step();
        }
        nemesis::heal(&self.sim);
    }

    /// After healing, every group must accept a write again.
    fn recover(&mut self) {
        let healed_at = self.sim.elapsed();
        self.step_until(
            RECOVERY_MAX,
            "every group accepts writes after healing",
            |run| {
                cluster::groups()
                    .into_iter()
                    .all(|group| run.checker.last_ack_at(group) > Some(healed_at))
            },
        );
    }

    /// Stops the writers, then waits for every replica of every group to converge.
    fn converge(&mut self) {
        self.workload.stop.store(true, Ordering::Relaxed);
        self.step_until(CONVERGENCE_MAX, "the writers stop", |run| {
            run.client_finished
        });
        let deadline = self.sim.elapsed() + CONVERGENCE_MAX;
        loop {
            let acks = std::mem::take(&mut *self.workload.acks.lock().expect("acks lock"));
            self.checker.acknowledged(acks);
            let replicas = self.replicas();
            self.checker.check(&replicas);
            let Err(difference) = self.checker.converged(&replicas) else {
                break;
            };
            assert!(
                self.sim.elapsed() < deadline,
                "replicas did not converge within {CONVERGENCE_MAX:?} after the writers \
                 stopped: {difference}"
            );
            for _ in 0..CHECK_EVERY_STEPS {
                self.step();
            }
        }
        let replicas = self.replicas();
        self.checker.check_full_logs(&replicas);
    }
}

/// The host a fault target names now: a leader's host is the one whose replica of the
/// group claims leadership in the highest term, or the first host when none does.
fn resolve(target: Target, replicas: &[Replica]) -> usize {
    match target {
        Target::Host(host) => host,
        Target::LeaderOf(group) => {
            let group = cluster::groups()[group];
            replicas
                .iter()
                .filter(|r| r.group == group)
                .filter_map(|r| {
                    let metrics = r.raft.metrics().borrow_watched().clone();
                    (metrics.state == ServerState::Leader).then_some((metrics.current_term, r.node))
                })
                .max()
                .map_or(0, |(_, node)| cluster::host_of(node))
        }
    }
}

/// `TRIBUTARY_SIM_SEED`, or a fresh random seed.
fn seed() -> u64 {
    match std::env::var("TRIBUTARY_SIM_SEED") {
        Ok(text) => text
            .trim()
            .parse()
            .unwrap_or_else(|e| panic!("TRIBUTARY_SIM_SEED={text:?} is not a u64: {e}")),
        Err(_) => rand::random(),
    }
}

/// The shards live in memory-backed storage when there is some: a storage write's
/// wall-clock latency becomes simulated time (the host's runtime advances its paused clock
/// while it waits for the writer thread), so slow fsyncs would stretch every append.
fn data_dir() -> tempfile::TempDir {
    let shm = std::path::Path::new("/dev/shm");
    let mut builder = tempfile::Builder::new();
    builder.prefix("tributary-sim-");
    if shm.is_dir()
        && let Ok(dir) = builder.tempdir_in(shm)
    {
        return dir;
    }
    builder.tempdir().expect("temporary directory")
}
