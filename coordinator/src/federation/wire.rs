//! The JSON that sites exchange over REST when one forwards work to another.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::task::{TaskDemand, TaskKind, TaskLimits, TaskStatus};

/// A task another site forwards here.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ForwardRequest {
    /// The site that forwards it (its home).
    pub origin_site: String,
    /// Its id at home: with the site, the key that makes a repeated forward harmless.
    pub origin_task: String,
    /// sha256 of its artifact; fetched from the home site when not held here.
    pub artifact: String,
    /// `wasm` or `opencl`.
    pub runtime: String,
    /// Its input, base64.
    pub input_base64: String,
    /// Arguments.
    pub args: Vec<String>,
    /// Dominant resource.
    pub class: TaskKind,
    /// Resources it needs.
    pub demand: TaskDemand,
    /// Limits enforced.
    pub limits: TaskLimits,
    /// Estimated work, seconds on one reference core.
    pub work_seconds: f64,
    /// Priority.
    pub priority: u8,
    /// Absolute deadline, Unix milliseconds (sites keep their clocks in sync, NTP).
    pub deadline_unix_ms: Option<u64>,
    /// When it was submitted at home, Unix milliseconds.
    pub created_ms: u64,
}

/// The answer to a forward.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ForwardAccepted {
    /// The task's id at this site.
    pub task_id: String,
    /// False when this origin task was forwarded here before: nothing new was created.
    pub created: bool,
}

/// Where a forwarded task stands at the site that took it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ForwardStatus {
    /// The task's id at this site.
    pub task_id: String,
    /// Its state here.
    pub state: TaskStatus,
    /// The node running or that ran it.
    pub node_id: Option<String>,
    /// Output of a success, base64.
    pub output_base64: Option<String>,
    /// The module's exit code.
    pub exit_code: Option<i32>,
    /// Failure code.
    pub reason: Option<String>,
    /// Failure message.
    pub message: Option<String>,
}
