//! Starling's placement engine and edge simulator.
//!
//! The engine decides, for every pending task, which node runs it and at which
//! power level, so that deadlines are met at the least energy. It is pure: it
//! reads a snapshot ([`model::ClusterView`]) and the pending queue and returns
//! decisions ([`policy::Decision`]); it does no I/O, reads no clock and draws
//! only from random streams it was seeded with. The coordinator and the
//! simulator ([`sim`]) run the very same policy code.

pub mod estimate;
pub mod learned;
pub mod model;
pub mod policy;
pub mod sim;
pub mod testing;

pub use model::{
    ClusterView, Constraints, Demand, DeviceKinds, GpuCapacity, NodeLoad, NodeView, PendingTask,
    QueueState, TaskClass, REFERENCE_CORE_GFLOPS,
};
pub use policy::{
    policy_by_name, Alternative, Decision, Explanation, Outcome, Policy, PolicyError,
    UnknownPolicy, POLICY_NAMES,
};
