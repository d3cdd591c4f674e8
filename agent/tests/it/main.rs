//! The agent's integration tests, in one test binary: each module here was a
//! test binary of its own, and every one linked the agent, wasmtime and sqlx
//! again. `support` holds the helpers they share.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod agent_end_to_end;
mod artifact_cache;
mod caps;
mod cli;
mod enroll;
mod grants;
mod journal;
mod power;
mod runner_queue;
mod support;
mod verify;
