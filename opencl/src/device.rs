//! OpenCL devices, as both halves of the crate see them: the kind of device a
//! kernel asks for ([`DeviceType`], part of the spec) and a device a node has
//! ([`DeviceInfo`], what the worker reports to the agent). Pure, so the
//! coordinator and the CLI can use them without linking OpenCL.

use serde::{Deserialize, Serialize};
use starling_proto::task::truncate;
use starling_proto::{GpuDevice, GpuKind};

/// The kind of OpenCL device a kernel wants.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DeviceType {
    /// Any OpenCL device (the default).
    #[default]
    Any,
    /// A graphics processor.
    Gpu,
    /// A CPU exposed through OpenCL (PoCL, for instance).
    Cpu,
    /// A dedicated accelerator.
    Accelerator,
}

impl DeviceType {
    /// The proto's device kind this type requires, `None` for any.
    pub fn required_kind(self) -> Option<GpuKind> {
        match self {
            DeviceType::Any => None,
            DeviceType::Gpu => Some(GpuKind::Gpu),
            DeviceType::Cpu => Some(GpuKind::Cpu),
            DeviceType::Accelerator => Some(GpuKind::Accelerator),
        }
    }

    /// Whether a device of `kind` satisfies this type.
    pub fn accepts(self, kind: GpuKind) -> bool {
        self.required_kind().is_none_or(|wanted| wanted == kind)
    }
}

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

impl DeviceInfo {
    /// The device as the capability message carries it (strings cut to the
    /// proto's bounds).
    pub fn to_proto(&self) -> GpuDevice {
        GpuDevice {
            platform: truncate(self.platform.trim()),
            vendor: truncate(self.vendor.trim()),
            name: truncate(self.name.trim()),
            kind: self.kind,
            compute_units: self.compute_units,
            memory_bytes: self.global_mem_bytes,
            max_clock_mhz: self.max_clock_mhz,
            version: truncate(self.version.trim()),
            local_memory_bytes: self.local_mem_bytes,
            max_alloc_bytes: self.max_alloc_bytes,
            max_work_group_size: u32::try_from(self.max_work_group_size).unwrap_or(u32::MAX),
            fp64: self.fp64,
            // Placement works in f32; GFLOP/s figures lose nothing that matters.
            gflops: self.gflops.map(|gflops| gflops as f32),
        }
    }

    /// The identity a calibration and a cached binary are keyed by. Only the
    /// runtime keeps such caches, so the pure build goes without it.
    #[cfg(feature = "runtime")]
    pub(crate) fn cache_key(&self) -> (&str, &str, &str) {
        (&self.platform, &self.name, &self.driver_version)
    }

    /// One line for people: `name (kind, fp64)`, for the runtime's "no such
    /// device" errors.
    #[cfg(feature = "runtime")]
    pub(crate) fn describe(&self) -> String {
        format!(
            "{} ({:?}, {} compute units{})",
            self.name.trim(),
            self.kind,
            self.compute_units,
            if self.fp64 { ", fp64" } else { ", no fp64" }
        )
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
pub(crate) mod tests {
    use super::*;

    /// A PoCL CPU device with an oversize vendor string, for tests here and
    /// in `probe`.
    pub(crate) fn device(name: &str) -> DeviceInfo {
        DeviceInfo {
            platform: "Portable Computing Language".into(),
            vendor: "v".repeat(200),
            name: name.into(),
            kind: GpuKind::Cpu,
            version: "OpenCL 3.0 PoCL".into(),
            driver_version: "6.0".into(),
            compute_units: 2,
            max_clock_mhz: 3000,
            global_mem_bytes: 1 << 30,
            local_mem_bytes: 1 << 20,
            max_alloc_bytes: 1 << 28,
            max_work_group_size: 1 << 40,
            fp64: true,
            gflops: Some(12.5),
        }
    }

    #[test]
    fn to_proto_truncates_and_saturates() {
        let proto = device("cpu").to_proto();
        assert_eq!(proto.vendor.len(), starling_proto::limits::NAME_LEN);
        assert_eq!(proto.max_work_group_size, u32::MAX);
        assert_eq!(proto.memory_bytes, 1 << 30);
        assert_eq!(proto.local_memory_bytes, 1 << 20);
        assert_eq!(proto.max_alloc_bytes, 1 << 28);
        assert_eq!(proto.gflops, Some(12.5));
        assert!(proto.fp64);
        assert_eq!(proto.version.as_str(), "OpenCL 3.0 PoCL");
    }
}
