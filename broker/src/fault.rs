//! Fault hooks, for testing only: with `TRIBUTARY_FAULT_HOOKS=1` in a node's environment, a
//! test can make the node fail at a chosen point (see `POST /debug/faults/...` in
//! `http.rs`). Without the variable nothing can be armed and every hook is a no-op.
//!
//! The hooks are process-wide: a crash ends the whole process, a refusal applies to every
//! request the node serves.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

/// Set to `1` to enable the fault hooks. Never set it in production.
pub const FAULT_HOOKS_ENV: &str = "TRIBUTARY_FAULT_HOOKS";

/// The fault points a test can arm, each one-shot.
#[derive(Debug, Default)]
pub struct FaultHooks {
    enabled: bool,
    crash_after_commit: AtomicBool,
    /// Kafka producer-id requests still to refuse as a transient failure.
    producer_id_refusals: AtomicU32,
}

/// Arming a hook on a node whose hooks are off.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("fault hooks are off on this node; they exist for testing only (set {FAULT_HOOKS_ENV}=1)")]
pub struct HooksDisabled;

impl FaultHooks {
    /// Hooks that can be armed (`enabled`) or never fire.
    pub fn new(enabled: bool) -> Self {
        FaultHooks {
            enabled,
            crash_after_commit: AtomicBool::new(false),
            producer_id_refusals: AtomicU32::new(0),
        }
    }

    /// This process's hooks, enabled when `TRIBUTARY_FAULT_HOOKS=1` at first use.
    pub fn global() -> &'static FaultHooks {
        static HOOKS: OnceLock<FaultHooks> = OnceLock::new();
        HOOKS.get_or_init(|| {
            let enabled = std::env::var(FAULT_HOOKS_ENV).is_ok_and(|v| v.trim() == "1");
            if enabled {
                tracing::warn!("{FAULT_HOOKS_ENV}=1: fault hooks are enabled (testing only)");
            }
            FaultHooks::new(enabled)
        })
    }

    pub fn enabled(&self) -> bool {
        self.enabled
    }

    /// Arms the one-shot crash of the next send that commits on this node.
    pub fn arm_crash_after_commit(&self) -> Result<(), HooksDisabled> {
        if !self.enabled {
            return Err(HooksDisabled);
        }
        self.crash_after_commit.store(true, Ordering::SeqCst);
        Ok(())
    }

    /// True once after [`FaultHooks::arm_crash_after_commit`]: the caller should crash now.
    fn take_crash_after_commit(&self) -> bool {
        self.enabled && self.crash_after_commit.swap(false, Ordering::SeqCst)
    }

    /// Arms the refusal of the next `count` Kafka producer-id requests on this node, each
    /// failing as the controller does while it elects a leader.
    pub fn arm_producer_id_refusals(&self, count: u32) -> Result<(), HooksDisabled> {
        if !self.enabled {
            return Err(HooksDisabled);
        }
        self.producer_id_refusals.store(count, Ordering::SeqCst);
        Ok(())
    }

    /// True while armed refusals remain, using one up: the caller should fail transiently.
    pub fn take_producer_id_refusal(&self) -> bool {
        self.enabled
            && self
                .producer_id_refusals
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |left| {
                    left.checked_sub(1)
                })
                .is_ok()
    }

    /// Called by a send after its batch is committed and applied, before the reply: when
    /// armed, the process dies here, so the sender never hears that its batch was stored.
    pub fn after_commit(&self) {
        if self.take_crash_after_commit() {
            tracing::error!("fault hook crash-after-commit fired: aborting before the reply");
            std::process::abort();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn disabled_hooks_cannot_be_armed_and_never_fire() {
        let hooks = FaultHooks::new(false);
        assert_eq!(hooks.arm_crash_after_commit(), Err(HooksDisabled));
        assert!(!hooks.take_crash_after_commit());
        hooks.after_commit();
        assert_eq!(hooks.arm_producer_id_refusals(2), Err(HooksDisabled));
        assert!(!hooks.take_producer_id_refusal());
    }

    #[test]
    fn armed_refusals_are_used_up_one_at_a_time() {
        let hooks = FaultHooks::new(true);
        assert!(!hooks.take_producer_id_refusal(), "not armed yet");
        hooks.arm_producer_id_refusals(2).unwrap();
        assert!(hooks.take_producer_id_refusal());
        assert!(hooks.take_producer_id_refusal());
        assert!(!hooks.take_producer_id_refusal(), "used up");
    }

    #[test]
    fn an_armed_hook_fires_once() {
        let hooks = FaultHooks::new(true);
        assert!(!hooks.take_crash_after_commit(), "not armed yet");
        hooks.arm_crash_after_commit().unwrap();
        assert!(hooks.take_crash_after_commit());
        assert!(!hooks.take_crash_after_commit(), "one-shot");
        hooks.after_commit();
    }
}
