//! The coordinator's background loops: `scheduler` (pending queue → placement
//! → assignments), `outbox` (re-sends of unacknowledged assignments),
//! `liveness` (failure detection), `attempts` (every attempt on an online
//! node ends: wall time and reconcile with the node's list), `lease` (which
//! replica of a site leads), `round` (one round's decisions as steps,
//! no I/O) and `artifacts` (collection of artifacts no task references).
//! The snapshot of nodes and queue they decide over is `crate::cluster_view`,
//! a floor below them and the federation, which computes its digest from it.

pub mod artifacts;
pub mod attempts;
pub mod lease;
pub mod liveness;
pub mod outbox;
pub mod round;
pub mod scheduler;
