//! The controller: the metadata Raft group (`GroupId::CONTROLLER`) holding nodes, hubs,
//! consumer groups, every partition's replica set and the authorization rules.

pub mod capture;
pub mod flow;
#[cfg(test)]
mod golden_tests;
pub mod planner;
pub mod rules;
pub mod state;
pub mod state_machine;
pub mod store;
