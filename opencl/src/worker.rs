//! The worker process: its protocol, its `main`, and the agent's client.

/// The worker binary's name.
pub const WORKER_BIN: &str = "starling-opencl-worker";
