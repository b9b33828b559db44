//! The controller: the metadata Raft group (`GroupId::CONTROLLER`) holding nodes, hubs,
//! consumer groups and every partition's replica set.

pub mod flow;
pub mod planner;
pub mod state;
pub mod state_machine;
pub mod store;
