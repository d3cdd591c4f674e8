//! Task submissions and what the REST API shows of tasks, their attempts and
//! their events.

use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use crate::task::{TaskDemand, TaskGrants, TaskKind, TaskLimits, TaskStatus};

/// A task submission.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct SubmitTask {
    /// The module's digest (64 hex digits), as `POST /artifacts` returned it.
    pub artifact: String,
    /// Input, base64 (give this or `input_text`, not both): the task's stdin for
    /// wasm tasks; the kernel's input buffers, concatenated, for OpenCL tasks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input_base64: Option<String>,
    /// Input for the task's stdin, as text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input_text: Option<String>,
    /// Arguments: argv after the program name for wasm tasks; the kernel's
    /// scalars as `name=value` for OpenCL tasks.
    #[serde(default)]
    pub args: Vec<String>,
    /// Deadline in milliseconds from now.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline_ms: Option<u64>,
    /// Priority, higher first (0..=255, default 0).
    #[serde(default)]
    pub priority: u8,
    /// Dominant resource: `cpu` (default), `gpu` or `io`.
    #[serde(default)]
    pub class: TaskKind,
    /// Resources the task needs.
    #[serde(default)]
    pub demand: TaskDemand,
    /// Limits enforced on each attempt.
    #[serde(default)]
    pub limits: TaskLimits,
    /// Estimated work, in seconds on one reference core (default 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub work_seconds: Option<f64>,
    /// What a wasm task may use: `{"clock": true, "random": true}`; nothing
    /// when absent. Given here, it replaces `limits.grants`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grants: Option<TaskGrants>,
    /// Accept the task even though no node of the site could run it (no
    /// node has its runtime, device, memory...): it waits, parked with the
    /// reasons in its explanation, until one that can joins. Without it
    /// such a submission is refused with `no_capable_node` (422).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub wait_for_node: bool,
}

/// The most tasks one `POST /api/v1/tasks:batch` takes.
pub const MAX_BATCH_TASKS: usize = 1000;

/// Many task submissions at once (`POST /api/v1/tasks:batch`): every item
/// is checked first and they are stored together, or none is.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct SubmitBatch {
    /// The tasks, each as `POST /api/v1/tasks` takes it: at least 1, at
    /// most 1000 (`MAX_BATCH_TASKS`).
    #[schema(min_items = 1, max_items = 1000)]
    pub tasks: Vec<SubmitTask>,
}

/// The tasks a batch created.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct BatchSubmitted {
    /// The created tasks in the order the batch gave them, each `pending`
    /// as it was stored.
    pub tasks: Vec<TaskSummary>,
}

/// The message of a batch refused for its item `index` (from 0): the
/// item's own message after `tasks[INDEX]: `, so people and programs
/// ([`batch_item_index`]) can tell which item to fix.
pub fn batch_item_message(index: usize, message: &str) -> String {
    format!("tasks[{index}]: {message}")
}

/// The item a batch refusal's message names, if it names one
/// (see [`batch_item_message`]).
pub fn batch_item_index(message: &str) -> Option<usize> {
    message
        .strip_prefix("tasks[")?
        .split_once("]: ")?
        .0
        .parse()
        .ok()
}

/// A task in a list.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct TaskSummary {
    /// The task's id.
    pub id: String,
    /// Its state.
    pub state: TaskStatus,
    /// Its module's digest.
    pub artifact: String,
    /// The node of its current or last attempt.
    pub node_id: Option<String>,
    /// Its current attempt (0 before the first).
    pub attempt: u32,
    /// Its priority.
    pub priority: u8,
    /// When it was submitted, Unix milliseconds.
    pub created_ms: u64,
    /// When it last changed, Unix milliseconds.
    pub updated_ms: u64,
    /// Failure code, for failed tasks.
    pub reason: Option<String>,
    /// The site its current attempt was forwarded to; absent when it runs here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub site: Option<String>,
}

/// The task list.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct TaskList {
    /// Tasks, newest first.
    pub tasks: Vec<TaskSummary>,
}

/// One task in full.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct TaskDetail {
    /// The task's id.
    pub id: String,
    /// Its state.
    pub state: TaskStatus,
    /// Its module's digest.
    pub artifact: String,
    /// The runtime.
    pub runtime: String,
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
    /// Absolute deadline, Unix milliseconds.
    pub deadline_unix_ms: Option<u64>,
    /// Input size in bytes.
    pub input_bytes: u64,
    /// When it was submitted, Unix milliseconds.
    pub created_ms: u64,
    /// When it last changed, Unix milliseconds.
    pub updated_ms: u64,
    /// The node of its current or last attempt.
    pub node_id: Option<String>,
    /// The site its current attempt was forwarded to; absent when it runs here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub site: Option<String>,
    /// The node at that site that ran it, as the site reported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub site_node: Option<String>,
    /// For a task another site forwarded here: that site.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub origin_site: Option<String>,
    /// Its current attempt (0 before the first).
    pub attempt: u32,
    /// The power level chosen for the current attempt.
    pub power_level: Option<u8>,
    /// Output of a successful run, base64.
    pub output_base64: Option<String>,
    /// Output of a successful run, when it is UTF-8.
    pub output_text: Option<String>,
    /// The module's exit code, when it exited.
    pub exit_code: Option<i32>,
    /// Failure code (`timeout`, `trap`, `node_lost`, ...).
    pub reason: Option<String>,
    /// Failure message for people.
    pub message: Option<String>,
    /// Whether a cancel was requested.
    pub cancel_requested: bool,
    /// The latest placement decision's explanation, as the engine wrote it
    /// (kept untyped, so explanations of older and newer coordinators pass
    /// through): `policy`, `summary` (one line), `considered` (nodes the
    /// policy looked at), `filtered` (the nodes ruled out, most first:
    /// `[{"reason": "memory", "count": 7, "nodes": ["pi-1", ...]}]`, the
    /// reason a stable code such as `offline`, `runtime`, `arch`, `labels`,
    /// `gpu`, `gpu_kind`, `gpu_memory`, `fp64`, `memory`, `energy_budget`,
    /// with at most 5 example node ids each) and `alternatives` (the best
    /// 3 candidates scored, the chosen one first). A placed task's adds
    /// `estimated_run_s` (the run time expected on the chosen node: the
    /// model times what that node's finished attempts taught, which the
    /// chosen alternative's note names) and `modelled_run_s` (the model
    /// alone). A forwarded task's adds `forwarded_to`, `estimated_finish_ms`
    /// and the `local` decision.
    /// Explanations stored before `considered` and `filtered` existed lack them.
    #[schema(value_type = Option<Object>)]
    pub explanation: Option<serde_json::Value>,
    /// Attempts, first first.
    pub attempts: Vec<AttemptRecord>,
    /// Events received from agents, oldest first.
    pub events: Vec<EventRecord>,
}

/// Filters for the task list.
#[derive(Debug, Clone, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct TaskListQuery {
    /// Only tasks in this state (`pending`, `assigned`, `running`, `succeeded`, `failed`, `cancelled`).
    pub state: Option<String>,
    /// Most tasks returned (default 50, at most 1000).
    pub limit: Option<u32>,
}

/// One stored task event.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct EventRecord {
    /// Attempt number.
    pub attempt: u32,
    /// Event state (`accepted`, `running`, `succeeded`, `failed`, `cancelled`, `rejected` when the
    /// agent refused the assignment, or `lost` when the node vanished).
    pub state: String,
    /// The node that sent it; for an attempt forwarded to another site, the
    /// node there that ran it, when that site said.
    pub node_id: Option<String>,
    /// For an event of an attempt forwarded to another site: that site.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub site: Option<String>,
    /// When the coordinator received it, Unix milliseconds.
    pub received_ms: u64,
    /// Failure code.
    pub reason: Option<String>,
    /// Failure message.
    pub message: Option<String>,
    /// Exit code.
    pub exit_code: Option<i32>,
    /// Size of the output carried.
    pub output_bytes: u64,
    /// Execution measurements, as the agent sent them.
    #[schema(value_type = Option<Object>)]
    pub metrics: Option<serde_json::Value>,
    /// The power level the attempt ran under, as its agent applied it
    /// (`requested`, `in_force`: the highest level among the tasks sharing
    /// the CPU, `max_frequency_khz`: the frequency ceiling, null without
    /// power control); absent when the event carries none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub power: Option<serde_json::Value>,
}

/// One attempt of a task.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct AttemptRecord {
    /// Attempt number, from 1.
    pub attempt: u32,
    /// The node of this site it was sent to; null when it was forwarded.
    pub node_id: Option<String>,
    /// The site it was forwarded to; absent when it ran here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub site: Option<String>,
    /// The power level chosen.
    pub power_level: u8,
    /// When it was assigned, Unix milliseconds.
    pub assigned_ms: u64,
    /// Its state (`assigned`, `running`, `succeeded`, `failed`, `cancelled`, `lost`).
    pub state: String,
    /// When it ended, Unix milliseconds.
    pub finished_ms: Option<u64>,
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_refusal_names_its_item() {
        let message = batch_item_message(17, "no artifact 00ff; upload it first");
        assert_eq!(message, "tasks[17]: no artifact 00ff; upload it first");
        assert_eq!(batch_item_index(&message), Some(17));
        for other in ["no artifact", "tasks[]: x", "tasks[x]: y", "tasks[3] y"] {
            assert_eq!(batch_item_index(other), None, "{other}");
        }
    }
}
