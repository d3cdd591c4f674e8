//! Starling's coordinator: it keeps the registry of nodes reported over MQTT,
//! stores artifacts and tasks, places pending tasks with the placement engine,
//! turns agents' events into task state, and serves the REST API that the
//! `starling` CLI uses.
//!
//! [`start`] runs all of it inside the caller's tokio runtime and returns a
//! [`Running`] handle; the `starling-coordinator serve` binary is a thin
//! wrapper around it.
//!
//! Map (ARCHITECTURE.md; docs/design/coordinator.md has the long form):
//! `domain` holds the rules as pure functions; `store` (sqlx, one query text
//! for SQLite and PostgreSQL) and `registry` (node state, no I/O) hold the
//! state; `mqtt` (broker, ingest, publish) and `http` (the REST API) are the
//! only modules that know MQTT and HTTP; `loops` (scheduler, outbox,
//! liveness, attempts) run in the background over `cluster_view`'s snapshot;
//! `federation` gossips with other sites; `counters` are what `/metrics`
//! shows, below every part that counts. The REST types are
//! `starling_api`'s; the `starling` CLI is its own crate (`starling-cli`).

pub mod access;
mod app;
mod bind_error;
pub mod cluster_view;
pub mod config;
mod counters;
pub mod domain;
pub mod federation;
pub mod http;
pub mod leader;
pub mod live;
pub mod loops;
pub mod models;
pub mod mqtt;
mod precompile;
pub mod registry;
pub mod server_tls;
mod service;
pub mod signing;
pub mod simulate;
mod start_error;
pub mod store;
pub mod task;
pub mod train;

pub use app::{start, Running};
pub use config::{CoordinatorConfig, ServeArgs};
pub use start_error::StartError;
pub use store::Store;
