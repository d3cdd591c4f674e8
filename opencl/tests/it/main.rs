//! The crate's integration tests, in one test binary: each module here was a
//! test binary of its own. `spec` and `layering` are pure and run without the
//! `runtime` feature too; `exec` and `worker` run kernels, so they need it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
#[cfg(feature = "runtime")]
mod exec;
mod layering;
mod spec;
#[cfg(feature = "runtime")]
mod worker;
