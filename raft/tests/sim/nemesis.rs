//! The nemesis: a seeded schedule of network faults, one at a time with quiet gaps between,
//! and the code that applies a fault to the simulated network and heals it.

use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::cluster::{GROUP_COUNT, HOSTS};

/// Whom a fault hits: a fixed host, or whichever host leads a group when the fault starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    Host(usize),
    /// Index into [`crate::cluster::groups`].
    LeaderOf(usize),
}

/// A network fault between simulated hosts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Drops everything between one host and the others: a minority of one.
    Isolate(Target),
    /// Holds everything between one host and the others, then delivers it late.
    Delay(Target),
    /// Drops what one host sends; it still hears the others.
    Mute(Target),
    /// Drops everything between every pair: no quorum anywhere.
    Scatter,
}

#[derive(Debug, Clone, Copy)]
pub struct Scheduled {
    pub start: Duration,
    pub end: Duration,
    pub fault: Fault,
}

/// Limits of the schedule.
const FIRST_FAULT_AFTER: Duration = Duration::from_secs(3);
const GAP_MS_MAX: u64 = 2_000;
const FAULT_MS_MIN: u64 = 300;
const FAULT_MS_MAX: u64 = 6_000;

/// Faults from [`FIRST_FAULT_AFTER`] until `until`, never overlapping.
pub fn schedule(seed: u64, until: Duration) -> Vec<Scheduled> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut faults = Vec::new();
    let mut at = FIRST_FAULT_AFTER;
    loop {
        let length = Duration::from_millis(rng.random_range(FAULT_MS_MIN..=FAULT_MS_MAX));
        if at + length > until {
            return faults;
        }
        // Half the faults hit a leader: faults on followers rarely force an election.
        let target = if rng.random_bool(0.5) {
            Target::LeaderOf(rng.random_range(0..usize::from(GROUP_COUNT)))
        } else {
            Target::Host(rng.random_range(0..HOSTS.len()))
        };
        let fault = match rng.random_range(0..10) {
            0..=4 => Fault::Isolate(target),
            5..=6 => Fault::Delay(target),
            7..=8 => Fault::Mute(target),
            _ => Fault::Scatter,
        };
        faults.push(Scheduled {
            start: at,
            end: at + length,
            fault,
        });
        at += length + Duration::from_millis(rng.random_range(0..=GAP_MS_MAX));
    }
}

fn others(host: usize) -> impl Iterator<Item = usize> {
    (0..HOSTS.len()).filter(move |&h| h != host)
}

fn pairs() -> impl Iterator<Item = (usize, usize)> {
    (0..HOSTS.len()).flat_map(|a| (a + 1..HOSTS.len()).map(move |b| (a, b)))
}

/// Applies `fault`, resolving its target with `resolve`; returns the host it hit.
pub fn inject(
    sim: &turmoil::Sim<'_>,
    fault: Fault,
    resolve: impl FnOnce(Target) -> usize,
) -> Option<usize> {
    match fault {
        Fault::Isolate(target) => {
            let host = resolve(target);
            for other in others(host) {
                sim.partition(HOSTS[host], HOSTS[other]);
            }
            Some(host)
        }
        Fault::Delay(target) => {
            let host = resolve(target);
            for other in others(host) {
                sim.hold(HOSTS[host], HOSTS[other]);
            }
            Some(host)
        }
        Fault::Mute(target) => {
            let host = resolve(target);
            for other in others(host) {
                sim.partition_oneway(HOSTS[host], HOSTS[other]);
            }
            Some(host)
        }
        Fault::Scatter => {
            for (a, b) in pairs() {
                sim.partition(HOSTS[a], HOSTS[b]);
            }
            None
        }
    }
}

/// Makes every link between hosts healthy again, delivering held messages.
pub fn heal(sim: &turmoil::Sim<'_>) {
    for (a, b) in pairs() {
        sim.release(HOSTS[a], HOSTS[b]);
    }
}
