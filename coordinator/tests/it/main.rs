//! The coordinator's integration tests, in one test binary: each module here
//! was a test binary of its own, and every one linked the coordinator,
//! wasmtime, sqlx and rumqttd again. `common` holds the helpers they share.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod access;
mod batch;
mod binaries;
mod common;
mod delivery;
mod enrollment;
mod federation;
mod ingest;
mod metrics;
mod replicas;
mod reports;
mod rest;
mod store;
mod throughput;
