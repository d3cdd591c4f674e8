//! The coordinator's own view of a task: its lifecycle states and the demand a
//! submitter declares. Shared by the store, the scheduler and the REST API.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use starling_opencl::DeviceType;
use utoipa::ToSchema;

/// Where a task stands, as the coordinator records it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum TaskStatus {
    /// Waiting for the placement engine to choose a node.
    Pending,
    /// Sent to a node; the node has not yet said it runs.
    Assigned,
    /// The node reported that it accepted or started it.
    Running,
    /// Finished with output.
    Succeeded,
    /// Failed; the failure reason says why.
    Failed,
    /// Cancelled on request.
    Cancelled,
}

impl TaskStatus {
    /// Every status, in lifecycle order.
    pub const ALL: [TaskStatus; 6] = [
        TaskStatus::Pending,
        TaskStatus::Assigned,
        TaskStatus::Running,
        TaskStatus::Succeeded,
        TaskStatus::Failed,
        TaskStatus::Cancelled,
    ];

    /// The status as stored and shown.
    pub fn as_str(self) -> &'static str {
        match self {
            TaskStatus::Pending => "pending",
            TaskStatus::Assigned => "assigned",
            TaskStatus::Running => "running",
            TaskStatus::Succeeded => "succeeded",
            TaskStatus::Failed => "failed",
            TaskStatus::Cancelled => "cancelled",
        }
    }

    /// Whether nothing more happens to a task in this status.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            TaskStatus::Succeeded | TaskStatus::Failed | TaskStatus::Cancelled
        )
    }

    /// Whether an attempt of the task is out on a node.
    pub fn is_in_flight(self) -> bool {
        matches!(self, TaskStatus::Assigned | TaskStatus::Running)
    }
}

impl fmt::Display for TaskStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A string that names no task status.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "unknown task state {0:?}; use one of pending, assigned, running, succeeded, failed, cancelled"
)]
pub struct UnknownTaskStatus(pub String);

impl FromStr for TaskStatus {
    type Err = UnknownTaskStatus;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        TaskStatus::ALL
            .into_iter()
            .find(|status| status.as_str() == s)
            .ok_or_else(|| UnknownTaskStatus(s.to_string()))
    }
}

/// Which resource dominates a task, as its submitter declares it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum TaskKind {
    /// CPU-bound (the default).
    #[default]
    Cpu,
    /// GPU-bound.
    Gpu,
    /// I/O-bound.
    Io,
}

impl TaskKind {
    /// The kind as stored and shown.
    pub fn as_str(self) -> &'static str {
        match self {
            TaskKind::Cpu => "cpu",
            TaskKind::Gpu => "gpu",
            TaskKind::Io => "io",
        }
    }
}

/// A string that names no task kind.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown task class {0:?}; use cpu, gpu or io")]
pub struct UnknownTaskKind(pub String);

impl FromStr for TaskKind {
    type Err = UnknownTaskKind;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "cpu" => Ok(TaskKind::Cpu),
            "gpu" => Ok(TaskKind::Gpu),
            "io" => Ok(TaskKind::Io),
            other => Err(UnknownTaskKind(other.to_string())),
        }
    }
}

/// The resources a task needs while it runs.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(default)]
pub struct TaskDemand {
    /// CPU cores it keeps busy.
    pub cpu_cores: f32,
    /// Memory it needs, in MiB.
    pub memory_mb: u64,
    /// Whether it needs an OpenCL device.
    pub gpu: bool,
    /// Disk throughput it needs, in MB/s.
    pub io_mbps: f32,
    /// Device memory its kernel's buffers take, in bytes. For OpenCL tasks the
    /// coordinator computes it from the kernel spec at submission.
    pub gpu_memory_bytes: u64,
    /// The OpenCL device type it needs (`any`, `gpu`, `cpu`, `accelerator`).
    /// For OpenCL tasks it comes from the kernel spec.
    #[schema(value_type = String)]
    pub device: DeviceType,
    /// Whether it needs a double-precision OpenCL device. For OpenCL tasks the
    /// coordinator sets it when the kernel takes `double` arguments.
    pub fp64: bool,
}

impl Default for TaskDemand {
    fn default() -> Self {
        Self {
            cpu_cores: 1.0,
            memory_mb: 64,
            gpu: false,
            io_mbps: 0.0,
            gpu_memory_bytes: 0,
            device: DeviceType::Any,
            fp64: false,
        }
    }
}

/// Limits the agent enforces on each attempt (mirrors `starling_proto::ExecLimits`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(default)]
pub struct TaskLimits {
    /// Wall-clock limit in milliseconds; at most 86400000 (24 h).
    pub wall_ms: u64,
    /// Memory limit in bytes: linear memory for wasm, device buffers for
    /// OpenCL; at most 274877906944 (256 GiB). A node refuses a limit over
    /// its own cap, and the task is placed elsewhere.
    pub memory_bytes: u64,
    /// Output limit in bytes; at most 67108864 (64 MiB). Output travels
    /// inline, so no more than 524288 bytes come back whatever this says.
    pub output_bytes: u64,
    /// What a wasm task may use beyond stdin, stdout, args and its memory.
    /// Kept with the limits (the same JSON column) because both bound what an
    /// attempt may do; the node's policy may still refuse a grant.
    pub grants: TaskGrants,
}

// The maxima written in the field docs above are the coordinator's.
const _: () = assert!(
    starling_proto::limits::MAX_TASK_WALL_MS == 86_400_000
        && starling_proto::limits::MAX_TASK_MEMORY_BYTES == 274_877_906_944
        && starling_proto::limits::MAX_TASK_OUTPUT_BYTES == 67_108_864
        && starling_proto::limits::MAX_INLINE_OUTPUT_BYTES == 524_288
);

impl Default for TaskLimits {
    fn default() -> Self {
        let limits = starling_proto::ExecLimits::default();
        Self {
            wall_ms: limits.wall_ms,
            memory_bytes: limits.memory_bytes,
            output_bytes: limits.output_bytes,
            grants: TaskGrants::default(),
        }
    }
}

/// Capabilities a wasm task asks for (a manifest's `[grants]` section). Each
/// is off unless asked for; a module without the clock reads the Unix epoch,
/// one without randomness reads zeros. A node runs the task only if its
/// policy (`starling-agent --allow-grant`) allows every grant asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, ToSchema)]
#[serde(default, deny_unknown_fields)]
pub struct TaskGrants {
    /// The real wall and monotonic clocks.
    pub clock: bool,
    /// Real random bytes.
    pub random: bool,
}

impl From<TaskGrants> for starling_proto::Grants {
    fn from(grants: TaskGrants) -> Self {
        Self {
            clock: grants.clock,
            random: grants.random,
        }
    }
}

impl From<TaskLimits> for starling_proto::ExecLimits {
    fn from(limits: TaskLimits) -> Self {
        Self {
            wall_ms: limits.wall_ms,
            memory_bytes: limits.memory_bytes,
            output_bytes: limits.output_bytes,
        }
    }
}
