//! Starling's edge agent: probes the device, talks MQTT with the coordinator,
//! and runs verified wasm tasks under limits.
//!
//! The pieces, from the outside in: [`agent`] is the I/O loop (MQTT
//! connection, telemetry timer, runners); [`session`] is the protocol logic it
//! drives, without I/O; [`runner`] takes one attempt from assignment to final
//! event; [`journal`] keeps attempts and unacknowledged events across
//! restarts; [`verify`] checks an assignment's node, window and signature; [`caps`]
//! bounds the limits a task may ask for on this node; [`artifact`] fetches
//! and caches modules by digest; [`wasm`] runs them under limits; [`mod@probe`]
//! and [`telemetry`] describe the device; [`config`] merges flags,
//! environment, file and defaults; [`join`] finds the join file a flashed
//! device enrolls with; [`swarm`] runs many virtual devices in one process,
//! each through the same [`agent::run_node`] as a real agent.

pub mod agent;
pub mod artifact;
pub mod calibrate;
pub mod caps;
pub mod config;
pub mod enroll;
pub mod join;
pub mod journal;
pub mod link;
pub mod power;
mod precompiled;
pub mod private_file;
pub mod probe;
pub mod report_key;
pub mod runner;
pub mod sensors;
pub mod session;
pub mod swarm;
pub mod telemetry;
pub mod verify;
pub mod wasm;

pub use agent::{run, run_node, AgentError, NodeSetup};
pub use config::{AgentConfig, ConfigError, ConfigLayer};
pub use probe::{probe, ProbeError};
