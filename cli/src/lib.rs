//! The `starling` command line, a client of the coordinator's REST API
//! (through `starling_api::client`): publish and sign tasks, run them, watch
//! nodes, tasks and sites, manage tokens. With the default feature `up` it
//! also runs a whole single-machine Starling (`starling up`); without it the
//! binary links no server part (no wasmtime, sqlx, rumqttc, candle or
//! opencl3), for laptops and CI jobs that only publish and submit.

mod batch;
pub mod command;
pub mod image;
pub mod manifest;
pub mod publisher;
#[cfg(feature = "up")]
pub mod up;
pub mod watch;

pub use command::{run, Cli, Command, EXIT_OK, EXIT_TASK_FAILED, EXIT_UNREACHABLE, EXIT_USAGE};

/// `starling up`'s data directory unless `--data-dir` says otherwise; the
/// client commands look for its admin token there.
pub const DEFAULT_UP_DATA_DIR: &str = ".starling";
/// The file under the data directory holding the admin API token `up` made.
pub const ADMIN_TOKEN_FILE: &str = "admin.token";
