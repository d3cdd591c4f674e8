//! Lists the OpenCL devices of every platform and calibrates each one.

use serde::{Deserialize, Serialize};
use starling_proto::GpuKind;

/// One OpenCL device, as the worker reports it to the agent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeviceInfo {
    /// The platform's name.
    pub platform: String,
    /// The device vendor.
    pub vendor: String,
    /// The device name.
    pub name: String,
    /// Device type.
    pub kind: GpuKind,
    /// `CL_DEVICE_VERSION`.
    pub version: String,
    /// `CL_DRIVER_VERSION`.
    pub driver_version: String,
    /// Compute units.
    pub compute_units: u32,
    /// Highest clock, MHz.
    pub max_clock_mhz: u32,
    /// Global memory, bytes.
    pub global_mem_bytes: u64,
    /// Local memory, bytes.
    pub local_mem_bytes: u64,
    /// Largest single allocation, bytes.
    pub max_alloc_bytes: u64,
    /// Largest work-group.
    pub max_work_group_size: u64,
    /// Double precision support.
    pub fp64: bool,
    /// Measured single-precision GFLOP/s, when calibrated.
    pub gflops: Option<f64>,
}
