//! Starling's coordinator: it keeps the registry of nodes reported over MQTT,
//! stores artifacts and tasks, places pending tasks with the placement engine,
//! turns agents' events into task state, and serves the REST API that the
//! `starling` CLI uses.
//!
//! [`start`] runs all of it inside the caller's tokio runtime and returns a
//! [`Running`] handle; the `starling-coordinator serve` binary is a thin
//! wrapper around it.
//!
//! Map (ARCHITECTURE.md is the map, docs/design/coordinator.md the long form): `domain` holds the rules as pure
//! functions; `store` (sqlx, one query text for SQLite and PostgreSQL) and
//! `registry` (node state, no I/O) hold the state; `mqtt` (broker, ingest,
//! publish) and `http` (the REST API) are the only modules that know MQTT and
//! HTTP; `loops` (scheduler, outbox, liveness, cluster view) run in the
//! background; `federation` gossips with other sites. The REST types are
//! `starling_api`'s; the `starling` CLI is its own crate (`starling-cli`).

pub mod access;
mod app;
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
pub mod signing;
pub mod simulate;
pub mod store;
pub mod task;
pub mod train;

pub(crate) use app::{describe_bind_error, Shared};
pub use app::{start, Running, StartError};
pub use config::{CoordinatorConfig, ServeArgs};
pub(crate) use counters::Counters;
pub use store::Store;
