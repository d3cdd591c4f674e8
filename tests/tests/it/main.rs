//! The cross-process tests, in one test binary: each module here was a test
//! binary of its own, and every one linked the coordinator, the agent and all
//! their dependencies again.
//!
//! One binary means one process, so the tests of different modules now run
//! side by side in the harness's threads. The fault scenarios and the
//! federation sites kill processes, cut links and wait on deadlines on two
//! cores, and they make network namespaces (checked through one fixed probe
//! namespace), so they run alone: each holds [`alone`] while it runs, and every
//! other test holds [`alongside`].
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

mod architecture;
mod bad_clients;
mod bad_input;
mod bridges;
mod ci;
mod console;
mod end_to_end;
mod estimates;
mod events;
mod faults;
mod federation;
mod first_boot;
mod liveness;
mod measured;
mod opencl;
mod precompiled;
mod replicas;
mod security;
mod swarm;
mod wire;

/// Whose turn it is: many tests [`alongside`] each other, or one [`alone`].
static TURNS: RwLock<()> = RwLock::new(());

/// Held by a test that needs the machine to itself: no other test of this
/// binary runs while it is held.
fn alone() -> RwLockWriteGuard<'static, ()> {
    // A failed test poisons the lock; the next one still gets its turn.
    TURNS
        .write()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Held by every other test: these run side by side, but never beside one
/// that holds [`alone`].
fn alongside() -> RwLockReadGuard<'static, ()> {
    TURNS
        .read()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}
