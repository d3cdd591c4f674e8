//! The coordinator's background loops: `scheduler` (pending queue → placement
//! → assignments), `outbox` (re-sends of unacknowledged assignments),
//! `liveness` (failure detection), `attempts` (every attempt on an online
//! node ends: wall time and reconcile with the node's list), `lease` (which
//! replica of a site leads), `round` (one round's decisions as steps,
//! no I/O), `cluster_view`, the snapshot of nodes and queue the scheduler
//! and the federation's digest are computed from, and `artifacts`
//! (collection of artifacts no task references).

pub mod artifacts;
pub mod attempts;
pub mod cluster_view;
pub mod lease;
pub mod liveness;
pub mod outbox;
pub mod round;
pub mod scheduler;
