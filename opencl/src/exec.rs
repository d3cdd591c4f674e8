//! Builds and runs kernels. The only module of the workspace allowed `unsafe`.

use serde::{Deserialize, Serialize};

use crate::spec::{DeviceType, KernelSpec, SpecError};

/// One kernel run, as the agent sends it to the worker.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunRequest {
    /// The OpenCL C source.
    pub source: String,
    /// How to launch it.
    pub spec: KernelSpec,
    /// The submission's `name=value` arguments.
    pub args: Vec<String>,
    /// The task's input bytes.
    #[serde(with = "serde_bytes")]
    pub input: Vec<u8>,
    /// The most device memory all buffers may take together.
    pub memory_limit_bytes: u64,
    /// The most output bytes.
    pub output_limit_bytes: u64,
}

/// What a successful run gives back.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunOutcome {
    /// The `out` and `inout` buffers, concatenated in argument order.
    #[serde(with = "serde_bytes")]
    pub output: Vec<u8>,
    /// The device that ran it.
    pub device: String,
    /// Time spent building (or loading the cached binary), ms.
    pub build_ms: u64,
    /// Whether the program came from the binary cache.
    pub binary_cache_hit: bool,
    /// The kernel's own run time from OpenCL profiling, ns.
    pub kernel_ns: u64,
    /// Time from request to outcome inside the worker, ms.
    pub total_ms: u64,
}

/// Why a run failed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum RunError {
    /// The arguments or input do not fit the spec.
    #[error("{0}")]
    Spec(#[from] SpecError),
    /// No device of the wanted type.
    #[error("no OpenCL device of type {wanted:?} on this node (it has: {available})")]
    NoDevice {
        /// The type wanted.
        wanted: DeviceType,
        /// What the node has, for people.
        available: String,
    },
    /// The kernel did not compile.
    #[error("the kernel did not build on {device}:\n{log}")]
    Build {
        /// The device.
        device: String,
        /// The compiler's build log.
        log: String,
    },
    /// The compiled kernel's arguments differ from the spec.
    #[error("the compiled kernel does not match the spec: {0}")]
    Mismatch(String),
    /// Buffers exceed the device or the task's memory limit.
    #[error("{0}")]
    TooLarge(String),
    /// The output would exceed the limit.
    #[error("the kernel's output buffers take {bytes} bytes; the limit is {limit}")]
    OutputLimit {
        /// Bytes the output would take.
        bytes: u64,
        /// The limit.
        limit: u64,
    },
    /// The wall-time limit was reached and the worker was killed.
    #[error("the kernel ran past its {wall_ms} ms limit and was stopped")]
    Timeout {
        /// The limit.
        wall_ms: u64,
    },
    /// The run was cancelled and the worker killed.
    #[error("cancelled")]
    Cancelled,
    /// OpenCL reported an error while running.
    #[error("OpenCL error: {0}")]
    Runtime(String),
    /// The worker process failed (could not start, crashed, spoke garbage).
    #[error("the OpenCL worker failed: {0}")]
    Worker(String),
}
