//! Starling's placement engine and edge simulator.
//!
//! The engine decides, for every pending task, which node runs it and at which
//! power level, so that deadlines are met at the least energy. It is pure: it
//! reads a snapshot ([`model::ClusterView`]) and the pending queue and returns
//! decisions ([`policy::Decision`]); it does no I/O, reads no clock and draws
//! only from random streams it was seeded with. The coordinator and the
//! simulator ([`sim`]) run the very same policy code.
//!
//! Across sites, [`federation`] builds the digest a coordinator gossips about
//! its site and decides, from its peers' digests, whether a task the local
//! policy cannot finish in time should go to a peer; the simulator's
//! multi-site mode ([`sim::run_sites`]) runs the same code.

pub mod capable;
pub mod catalog;
pub mod estimate;
pub mod federation;
pub mod learned;
pub mod model;
pub mod policy;
pub mod sample;
pub mod sim;
pub mod testing;

pub use catalog::{policy_by_name, PolicyError, UnknownPolicy, POLICY_NAMES};
pub use federation::{
    commit, remote_finish_ms, route, route_with_artifact, site_capacity, work_class, DigestError,
    InterSiteLink, RemoteSite, Route, SiteCapacity,
};
pub use model::correction;
pub use model::{
    cpu_speed_of, ClusterView, Constraints, Demand, DeviceKinds, GpuCapacity, NodeLoad, NodeView,
    PendingTask, QueueState, TaskClass, REFERENCE_CORE_GFLOPS,
};
pub use policy::{Alternative, Decision, Explanation, FilterCount, Outcome, Policy};
