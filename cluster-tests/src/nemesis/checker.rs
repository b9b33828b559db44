//! STUB (replaced by the real checker).
use super::history::History;
use std::collections::BTreeMap;
#[derive(Debug, Clone, Copy)]
pub struct Bounds {
    pub handoff_max_ms: u64,
    pub recovery_max_ms: u64,
}
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ViolationKind {
    Lost,
}
#[derive(Debug, Clone)]
pub struct Violation {
    pub kind: ViolationKind,
    pub detail: String,
}
#[derive(Debug, Clone, Default)]
pub struct CheckReport {
    pub acked_events: u64,
    pub indeterminate_events: u64,
    pub indeterminate_stored: u64,
    pub lost: u64,
    pub duplicated: u64,
    pub reordered: u64,
    pub delivered_events: u64,
    pub processed_events: u64,
    pub checkpoint_samples: u64,
    pub max_handoff_ms: u64,
    pub max_recovery_ms: BTreeMap<String, u64>,
    pub faults: BTreeMap<String, u64>,
    pub violations: Vec<Violation>,
}
impl CheckReport {
    pub fn is_valid(&self) -> bool {
        self.violations.is_empty()
    }
    pub fn render(&self, _max_lines: usize) -> String {
        String::new()
    }
}
pub fn check(_history: &History, _bounds: Bounds) -> CheckReport {
    CheckReport::default()
}
