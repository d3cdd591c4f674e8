//! Device profiles for the simulator: four classes of edge hardware with
//! approximate relative speeds and power figures from public sources.
//!
//! All figures are approximate, rounded, and meant to get the *ratios* between
//! devices right, not any device's absolute numbers:
//!
//! - **Raspberry Pi 4 Model B** (4 × Cortex-A72 at 1.5 GHz, 4 GB): ~2.7 W idle and
//!   ~6.4 W under a full CPU load (Raspberry Pi Foundation and Jeff Geerling's
//!   power measurements); single-core speed about a third of a mobile Core i5 core
//!   (Geekbench 5 single-core ~270 against ~1000), taken here as 0.35; microSD
//!   storage ~40 MB/s; Wi-Fi, so its link moves (mobility).
//! - **Jetson Nano** (4 × Cortex-A57 at 1.43 GHz, 128-core Maxwell GPU, 4 GB):
//!   NVIDIA's two power modes, 5 W and 10 W (MAXN), ~1.25 W idle; CPU cores ~0.3 of
//!   the reference; eMMC/SD ~80 MB/s. The GPU is one Maxwell SM of 128 cores at
//!   921.6 MHz: 128 × 2 FLOP × 0.9216 GHz ≈ 236 GFLOP/s FP32 peak (~470 FP16).
//!   NVIDIA ships no OpenCL driver for Jetson; it is reached through PoCL's CUDA
//!   back end (portablecl.org/docs/html/cuda.html), which reports one compute
//!   unit, the board's shared 4 GB and double precision (at 1/32 rate on
//!   Maxwell). A compute-bound calibration kernel is taken to reach ~64% of the
//!   FP32 peak, 150 GFLOP/s.
//! - **x86 mini PC** (Intel NUC class, 4 cores, 16 GB): ~6 W idle, ~25–45 W loaded
//!   (taken as 35 W at full speed); the reference core (speed 1.0); SATA SSD
//!   ~500 MB/s; wired gigabit Ethernet. Its CPU is an OpenCL device through PoCL
//!   (`pocl-opencl-icd`): 4 compute units, most of the memory, double precision,
//!   and, its core being the reference core, [`REFERENCE_CORE_GFLOPS`] per core
//!   less ~10% for PoCL's threading on the calibration kernel.
//! - **I/O gateway** (Celeron J4125 class, 4 cores, 8 GB, NVMe): ~5 W idle, ~12 W
//!   loaded (10 W TDP part); cores ~0.45 of the reference; NVMe ~1 500 MB/s; the
//!   label `storage=fast`.
//!
//! Each profile lists its OpenCL devices with the fields an agent reports
//! ([`GpuDevice`]); the node's [`GpuCapacity`] is derived from them by
//! [`GpuCapacity::from_devices`], as the coordinator derives a real node's.
//!
//! Lower power levels follow the usual DVFS model: dynamic power (above idle)
//! scales with frequency × voltage², about speed^2.5 across a typical DVFS range,
//! so a level at half speed draws ~18% of the full dynamic power.

use serde::{Deserialize, Serialize};
use starling_proto::{GpuDevice, GpuKind, Label, NodeId, Runtime};

use crate::model::{
    EnergyState, GpuCapacity, NetworkLink, NodeLoad, NodeView, PowerLevelModel,
    REFERENCE_CORE_GFLOPS,
};

/// Exponent of speed in the dynamic-power model of lower levels.
pub const DVFS_EXPONENT: f64 = 2.5;

/// One kind of simulated device.
#[derive(Debug, Clone, PartialEq)]
pub struct DeviceProfile {
    /// Short name, used in node ids.
    pub name: &'static str,
    /// CPU architecture.
    pub arch: &'static str,
    /// Logical cores.
    pub cores: f64,
    /// Per-core speed relative to the reference core.
    pub core_speed: f64,
    /// Memory, bytes.
    pub memory_bytes: u64,
    /// OpenCL devices, as an agent on the device would report them.
    pub opencl_devices: Vec<GpuDevice>,
    /// Storage rate, MB/s.
    pub io_mbps: f64,
    /// Link bandwidth when the link is at its typical state, Mbit/s.
    pub bandwidth_mbps: f64,
    /// Typical round-trip time, ms.
    pub rtt_ms: f64,
    /// Whether the device moves (its link varies widely).
    pub mobile: bool,
    /// Idle watts.
    pub idle_watts: f64,
    /// Watts fully busy at the highest level.
    pub full_watts: f64,
    /// Speed factors of the power levels, lowest first, ending at 1.
    pub level_speeds: &'static [f64],
    /// Labels the device carries.
    pub labels: &'static [(&'static str, &'static str)],
    /// Battery capacity in joules, for battery-powered devices.
    pub battery_joules: Option<f64>,
}

impl DeviceProfile {
    /// The power levels, with dynamic power scaling as speed^[`DVFS_EXPONENT`].
    pub fn power_levels(&self) -> Vec<PowerLevelModel> {
        let dynamic = (self.full_watts - self.idle_watts).max(0.0);
        self.level_speeds
            .iter()
            .map(|speed| PowerLevelModel {
                speed_factor: *speed,
                idle_watts: self.idle_watts,
                active_watts: self.idle_watts + dynamic * speed.powf(DVFS_EXPONENT),
            })
            .collect()
    }

    /// The summary of the OpenCL devices the engine works with.
    pub fn gpu(&self) -> Option<GpuCapacity> {
        GpuCapacity::from_devices(&self.opencl_devices, self.core_speed)
    }

    /// Runtimes the device offers: wasm everywhere, OpenCL where there is an
    /// OpenCL device.
    pub fn runtimes(&self) -> Vec<Runtime> {
        if !self.opencl_devices.is_empty() {
            vec![Runtime::Wasm, Runtime::Opencl]
        } else {
            vec![Runtime::Wasm]
        }
    }

    /// An idle node of this profile named `{name}-{number}`.
    pub fn node(&self, number: usize) -> NodeView {
        let id_text = format!("{}-{number:04}", self.name);
        // Profile names are ASCII letters, digits and '-', so the id is valid; fall
        // back to a fixed valid id rather than panicking.
        #[allow(clippy::expect_used)]
        let id = NodeId::new(&id_text)
            .or_else(|_| NodeId::new("node"))
            .expect("\"node\" is a valid node id");
        let power_levels = self.power_levels();
        let top = u8::try_from(power_levels.len().saturating_sub(1)).unwrap_or(0);
        NodeView {
            id,
            online: true,
            arch: self.arch.to_owned(),
            runtimes: self.runtimes(),
            labels: self
                .labels
                .iter()
                .filter_map(|(key, value)| Label::new(key, value).ok())
                .collect(),
            cpu_cores: self.cores,
            cpu_speed: self.core_speed,
            memory_bytes: self.memory_bytes,
            gpu: self.gpu(),
            io_mbps: self.io_mbps,
            network: NetworkLink {
                bandwidth_mbps: self.bandwidth_mbps,
                rtt_ms: self.rtt_ms,
                loss: 0.0,
            },
            power_levels,
            energy: EnergyState {
                budget_joules: self.battery_joules,
                used_joules: 0.0,
            },
            load: NodeLoad {
                free_cpu_cores: self.cores,
                free_memory_bytes: self.memory_bytes,
                free_io_mbps: self.io_mbps,
                queued_tasks: 0,
                backlog_cpu_s: 0.0,
                backlog_gpu_s: 0.0,
                earliest_slack_ms: None,
                committed_joules: 0.0,
                power_level: top,
            },
        }
    }
}

const GIB: u64 = 1 << 30;

/// What an OpenCL device reports, less the names.
struct DeviceFigures {
    kind: GpuKind,
    compute_units: u32,
    max_clock_mhz: u32,
    memory_bytes: u64,
    max_alloc_bytes: u64,
    local_memory_bytes: u64,
    max_work_group_size: u32,
    fp64: bool,
    gflops: f32,
}

/// One OpenCL device as an agent would report it. Names longer than the wire
/// allows are left empty rather than failing: they are labels, not data.
fn opencl_device(platform: &str, vendor: &str, name: &str, figures: DeviceFigures) -> GpuDevice {
    GpuDevice {
        platform: platform.try_into().unwrap_or_default(),
        vendor: vendor.try_into().unwrap_or_default(),
        name: name.try_into().unwrap_or_default(),
        kind: figures.kind,
        compute_units: figures.compute_units,
        memory_bytes: figures.memory_bytes,
        max_clock_mhz: figures.max_clock_mhz,
        version: "OpenCL 3.0 PoCL".try_into().unwrap_or_default(),
        local_memory_bytes: figures.local_memory_bytes,
        max_alloc_bytes: figures.max_alloc_bytes,
        max_work_group_size: figures.max_work_group_size,
        fp64: figures.fp64,
        gflops: Some(figures.gflops),
    }
}

/// Raspberry Pi 4 class: CPU only, frugal, slow storage, on Wi-Fi.
pub fn raspberry_pi() -> DeviceProfile {
    DeviceProfile {
        name: "pi4",
        arch: "aarch64",
        cores: 4.0,
        core_speed: 0.35,
        memory_bytes: 4 * GIB,
        opencl_devices: Vec::new(),
        io_mbps: 40.0,
        bandwidth_mbps: 60.0,
        rtt_ms: 8.0,
        mobile: true,
        idle_watts: 2.7,
        full_watts: 6.4,
        // 600 MHz, 1.0 GHz, 1.5 GHz.
        level_speeds: &[0.4, 0.67, 1.0],
        labels: &[("class", "sbc")],
        battery_joules: None,
    }
}

/// Jetson Nano class: slow CPU, a GPU, 5 W and 10 W modes.
pub fn jetson() -> DeviceProfile {
    DeviceProfile {
        name: "jetson",
        arch: "aarch64",
        cores: 4.0,
        core_speed: 0.3,
        memory_bytes: 4 * GIB,
        opencl_devices: vec![opencl_device(
            "Portable Computing Language",
            "NVIDIA Corporation",
            "NVIDIA Tegra X1",
            DeviceFigures {
                kind: GpuKind::Gpu,
                compute_units: 1,
                max_clock_mhz: 922,
                memory_bytes: 4 * GIB,
                max_alloc_bytes: GIB,
                local_memory_bytes: 48 << 10,
                max_work_group_size: 1024,
                fp64: true,
                gflops: 150.0,
            },
        )],
        io_mbps: 80.0,
        bandwidth_mbps: 300.0,
        rtt_ms: 3.0,
        mobile: true,
        idle_watts: 1.25,
        full_watts: 10.0,
        // The 5 W mode runs at roughly 60% of MAXN's throughput.
        level_speeds: &[0.6, 1.0],
        labels: &[("class", "gpu")],
        battery_joules: None,
    }
}

/// x86 mini PC class (Intel NUC): the reference core, power hungry.
pub fn mini_pc() -> DeviceProfile {
    DeviceProfile {
        name: "nuc",
        arch: "x86_64",
        cores: 4.0,
        core_speed: 1.0,
        memory_bytes: 16 * GIB,
        opencl_devices: vec![opencl_device(
            "Portable Computing Language",
            "GenuineIntel",
            "cpu-x86-64-Intel Core i5",
            DeviceFigures {
                kind: GpuKind::Cpu,
                compute_units: 4,
                max_clock_mhz: 3000,
                memory_bytes: 15 * GIB,
                max_alloc_bytes: 4 * GIB,
                local_memory_bytes: 512 << 10,
                max_work_group_size: 4096,
                fp64: true,
                gflops: (4.0 * REFERENCE_CORE_GFLOPS * 0.9) as f32,
            },
        )],
        io_mbps: 500.0,
        bandwidth_mbps: 940.0,
        rtt_ms: 1.0,
        mobile: false,
        idle_watts: 6.0,
        full_watts: 35.0,
        // powersave, balanced, performance.
        level_speeds: &[0.5, 0.75, 1.0],
        labels: &[("class", "pc")],
        battery_joules: None,
    }
}

/// I/O gateway class: modest cores, fast NVMe storage, wired.
pub fn io_gateway() -> DeviceProfile {
    DeviceProfile {
        name: "gateway",
        arch: "x86_64",
        cores: 4.0,
        core_speed: 0.45,
        memory_bytes: 8 * GIB,
        opencl_devices: Vec::new(),
        io_mbps: 1500.0,
        bandwidth_mbps: 940.0,
        rtt_ms: 1.0,
        mobile: false,
        idle_watts: 5.0,
        full_watts: 12.0,
        level_speeds: &[0.6, 1.0],
        labels: &[("class", "gateway"), ("storage", "fast")],
        battery_joules: None,
    }
}

/// The four standard profiles.
pub fn standard_profiles() -> Vec<DeviceProfile> {
    vec![raspberry_pi(), jetson(), mini_pc(), io_gateway()]
}

/// Raspberry Pi 5 class (4 × Cortex-A76 at 2.4 GHz): about twice a Pi 4's
/// single-core speed (Geekbench 6 ~760 against ~300 for the Pi 4), ~3 W idle
/// and ~10 W under full CPU load (Raspberry Pi's and Jeff Geerling's
/// measurements); an NVMe HAT at ~400 MB/s; Wi-Fi. Used only by the unseen fleet.
pub fn raspberry_pi5() -> DeviceProfile {
    DeviceProfile {
        name: "pi5",
        arch: "aarch64",
        cores: 4.0,
        core_speed: 0.7,
        memory_bytes: 8 * GIB,
        opencl_devices: Vec::new(),
        io_mbps: 400.0,
        bandwidth_mbps: 100.0,
        rtt_ms: 6.0,
        mobile: true,
        idle_watts: 3.0,
        full_watts: 10.0,
        // 1.5 GHz and 2.4 GHz.
        level_speeds: &[0.63, 1.0],
        labels: &[("class", "sbc")],
        battery_joules: None,
    }
}

/// Jetson Orin Nano class (6 × Cortex-A78AE at 1.5 GHz, a 1 024-core Ampere
/// GPU at 625 MHz, 8 GB): 1024 × 2 × 0.625 ≈ 1.28 TFLOP/s FP32 peak, a
/// calibration kernel taken at ~64% of it, 820 GFLOP/s; NVIDIA's 7 W and 15 W
/// modes, ~3 W idle; NVMe. Used only by the unseen fleet.
pub fn jetson_orin_nano() -> DeviceProfile {
    DeviceProfile {
        name: "orin",
        arch: "aarch64",
        cores: 6.0,
        core_speed: 0.55,
        memory_bytes: 8 * GIB,
        opencl_devices: vec![opencl_device(
            "Portable Computing Language",
            "NVIDIA Corporation",
            "NVIDIA Orin",
            DeviceFigures {
                kind: GpuKind::Gpu,
                compute_units: 8,
                max_clock_mhz: 625,
                memory_bytes: 8 * GIB,
                max_alloc_bytes: 2 * GIB,
                local_memory_bytes: 48 << 10,
                max_work_group_size: 1024,
                fp64: true,
                gflops: 820.0,
            },
        )],
        io_mbps: 1500.0,
        bandwidth_mbps: 300.0,
        rtt_ms: 3.0,
        mobile: true,
        idle_watts: 3.0,
        full_watts: 15.0,
        level_speeds: &[0.55, 1.0],
        labels: &[("class", "gpu")],
        battery_joules: None,
    }
}

/// Which devices a simulated fleet is made of.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Fleet {
    /// The four standard profiles (what the shipped models were trained on).
    #[default]
    Standard,
    /// A mix no shipped model has seen: Raspberry Pi 5 and Jetson Orin Nano in
    /// place of the Pi 4 and the Jetson Nano, beside the mini PC and the gateway.
    Unseen,
}

impl Fleet {
    /// The fleet's profiles, each present `nodes_per_profile` times.
    pub fn profiles(self) -> Vec<DeviceProfile> {
        match self {
            Fleet::Standard => standard_profiles(),
            Fleet::Unseen => vec![raspberry_pi5(), jetson_orin_nano(), mini_pc(), io_gateway()],
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn profiles_derive_their_gpu_capacity_from_their_devices() {
        let jetson = jetson().node(0);
        let gpu = jetson.gpu.unwrap();
        assert_eq!(gpu.devices, 1);
        assert!((gpu.speed - 150.0 / REFERENCE_CORE_GFLOPS).abs() < 1e-6);
        assert!(gpu.kinds.gpu && !gpu.kinds.cpu && gpu.fp64);
        assert_eq!((gpu.memory_bytes, gpu.max_alloc_bytes), (4 * GIB, GIB));
        assert_eq!(jetson.runtimes, vec![Runtime::Wasm, Runtime::Opencl]);

        // The mini PC's PoCL device is its own cores: no device lane.
        let nuc = mini_pc().node(0);
        let pocl = nuc.gpu.unwrap();
        assert_eq!((pocl.devices, pocl.speed), (0, 0.0));
        assert!(pocl.kinds.cpu && !pocl.kinds.gpu);
        assert!((pocl.cpu_device_speed - 3.6).abs() < 1e-6);
        assert_eq!(nuc.runtimes, vec![Runtime::Wasm, Runtime::Opencl]);

        for profile in [raspberry_pi(), io_gateway()] {
            let node = profile.node(0);
            assert!(node.gpu.is_none(), "{}", profile.name);
            assert_eq!(node.runtimes, vec![Runtime::Wasm]);
        }
    }
}
