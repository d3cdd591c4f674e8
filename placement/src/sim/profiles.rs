//! Device profiles for the simulator, built from scenario files
//! ([`crate::sim::scenario`]). The built-in fleets are the shipped files
//! `placement/scenarios/standard.toml` and `unseen.toml`, where each figure's
//! source is written beside it: Raspberry Pi 4 and 5, Jetson Nano and Orin
//! Nano, an x86 mini PC and an I/O gateway, with approximate relative speeds
//! and power figures from public sources.
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

use crate::model::{EnergyState, GpuCapacity, NetworkLink, NodeLoad, NodeView, PowerLevelModel};
use crate::sim::scenario::{self, DeviceSpec, OpenclSpec, Scenario, ScenarioError};

/// Exponent of speed in the dynamic-power model of lower levels.
pub const DVFS_EXPONENT: f64 = 2.5;

/// One kind of simulated device.
#[derive(Debug, Clone, PartialEq)]
pub struct DeviceProfile {
    /// Short name, used in node ids.
    pub name: String,
    /// CPU architecture.
    pub arch: String,
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
    /// Energy the link spends per bit moved, nanojoules.
    pub energy_per_bit_nj: f64,
    /// Whether the device moves (its link varies widely).
    pub mobile: bool,
    /// Idle watts.
    pub idle_watts: f64,
    /// Watts fully busy at the highest level.
    pub full_watts: f64,
    /// Speed factors of the power levels, lowest first, ending at 1.
    pub level_speeds: Vec<f64>,
    /// Labels the device carries.
    pub labels: Vec<(String, String)>,
    /// Battery capacity in joules, for battery-powered devices.
    pub battery_joules: Option<f64>,
    /// Failures per hour of this profile, when it has its own rate.
    pub failure_rate_per_hour: Option<f64>,
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
            arch: self.arch.clone(),
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
            corrections: Default::default(),
        }
    }
}

const GIB: f64 = (1_u64 << 30) as f64;

fn gib(value: f64) -> u64 {
    (value * GIB).round() as u64
}

/// One OpenCL device as an agent would report it. Names longer than the wire
/// allows are left empty rather than failing: they are labels, not data.
fn opencl_device(spec: &OpenclSpec) -> GpuDevice {
    let kind = match spec.kind.as_str() {
        "gpu" => GpuKind::Gpu,
        "cpu" => GpuKind::Cpu,
        "accelerator" => GpuKind::Accelerator,
        _ => GpuKind::Other,
    };
    GpuDevice {
        platform: spec.platform.as_str().try_into().unwrap_or_default(),
        vendor: spec.vendor.as_str().try_into().unwrap_or_default(),
        name: spec.device_name.as_str().try_into().unwrap_or_default(),
        kind,
        compute_units: spec.compute_units,
        memory_bytes: gib(spec.memory_gib),
        max_clock_mhz: spec.clock_mhz,
        version: "OpenCL 3.0 PoCL".try_into().unwrap_or_default(),
        local_memory_bytes: spec.local_memory_kib << 10,
        max_alloc_bytes: gib(spec.max_alloc_gib),
        max_work_group_size: spec.max_work_group_size,
        fp64: spec.fp64,
        gflops: Some(spec.gflops as f32),
    }
}

impl DeviceProfile {
    /// The profile a scenario file describes; `mips_per_reference_core`
    /// converts a speed given in MIPS (the checks made sure it is there).
    pub fn from_spec(spec: &DeviceSpec, mips_per_reference_core: Option<f64>) -> DeviceProfile {
        let core_speed = match (spec.core_speed, spec.mips, mips_per_reference_core) {
            (Some(speed), _, _) => speed,
            (None, Some(mips), Some(reference)) => mips / reference,
            _ => 1.0,
        };
        DeviceProfile {
            name: spec.name.clone(),
            arch: spec.arch.clone(),
            cores: spec.cores,
            core_speed,
            memory_bytes: gib(spec.memory_gib),
            opencl_devices: spec.opencl.iter().map(opencl_device).collect(),
            io_mbps: spec.io_mbps,
            bandwidth_mbps: spec.bandwidth_mbps,
            rtt_ms: spec.rtt_ms,
            energy_per_bit_nj: spec.energy_per_bit_nj,
            mobile: spec.mobile,
            idle_watts: spec.idle_watts,
            full_watts: spec.max_watts,
            level_speeds: spec.level_speeds.clone(),
            labels: spec
                .labels
                .iter()
                .map(|(key, value)| (key.clone(), value.clone()))
                .collect(),
            battery_joules: spec.battery_joules,
            failure_rate_per_hour: spec.failure_rate_per_hour,
        }
    }
}

/// The profiles of a scenario, in file order.
pub fn scenario_profiles(scenario: &Scenario) -> Vec<DeviceProfile> {
    let mips = scenario.settings.mips_per_reference_core;
    scenario
        .devices
        .iter()
        .map(|spec| DeviceProfile::from_spec(spec, mips))
        .collect()
}

/// The four standard profiles (`placement/scenarios/standard.toml`). Empty
/// only if the shipped file failed to parse, which the test
/// `every_shipped_scenario_parses_and_runs` rules out; a simulation of an
/// empty fleet is refused.
pub fn standard_profiles() -> Vec<DeviceProfile> {
    Fleet::Standard
        .scenario()
        .map(|scenario| scenario_profiles(&scenario))
        .unwrap_or_default()
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
    /// The shipped scenario file of the fleet.
    pub fn scenario(self) -> Result<Scenario, ScenarioError> {
        scenario::shipped(match self {
            Fleet::Standard => "standard",
            Fleet::Unseen => "unseen",
        })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use crate::model::REFERENCE_CORE_GFLOPS;

    const GIB: u64 = 1 << 30;

    fn profile(name: &str) -> DeviceProfile {
        standard_profiles()
            .into_iter()
            .find(|profile| profile.name == name)
            .unwrap()
    }

    #[test]
    fn profiles_derive_their_gpu_capacity_from_their_devices() {
        let jetson = profile("jetson").node(0);
        let gpu = jetson.gpu.unwrap();
        assert_eq!(gpu.devices, 1);
        assert!((gpu.speed - 150.0 / REFERENCE_CORE_GFLOPS).abs() < 1e-6);
        assert!(gpu.kinds.gpu && !gpu.kinds.cpu && gpu.fp64);
        assert_eq!((gpu.memory_bytes, gpu.max_alloc_bytes), (4 * GIB, GIB));
        assert_eq!(jetson.runtimes, vec![Runtime::Wasm, Runtime::Opencl]);

        // The mini PC's PoCL device is its own cores: no device lane.
        let nuc = profile("nuc").node(0);
        let pocl = nuc.gpu.unwrap();
        assert_eq!((pocl.devices, pocl.speed), (0, 0.0));
        assert!(pocl.kinds.cpu && !pocl.kinds.gpu);
        assert!((pocl.cpu_device_speed - 3.6).abs() < 1e-6);
        assert_eq!(nuc.runtimes, vec![Runtime::Wasm, Runtime::Opencl]);

        for profile in [profile("pi4"), profile("gateway")] {
            let node = profile.node(0);
            assert!(node.gpu.is_none(), "{}", profile.name);
            assert_eq!(node.runtimes, vec![Runtime::Wasm]);
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod figures {
    use super::*;

    /// The figures the built-in profiles had before they moved into
    /// `standard.toml` and `unseen.toml`, so the move changes no simulation.
    #[test]
    fn the_shipped_files_keep_the_built_in_figures() {
        let standard = standard_profiles();
        let summary: Vec<_> = standard
            .iter()
            .map(|p| {
                (
                    p.name.as_str(),
                    p.cores,
                    p.core_speed,
                    p.idle_watts,
                    p.full_watts,
                )
            })
            .collect();
        assert_eq!(
            summary,
            vec![
                ("pi4", 4.0, 0.35, 2.7, 6.4),
                ("jetson", 4.0, 0.3, 1.25, 10.0),
                ("nuc", 4.0, 1.0, 6.0, 35.0),
                ("gateway", 4.0, 0.45, 5.0, 12.0),
            ]
        );
        assert_eq!(standard[0].level_speeds, vec![0.4, 0.67, 1.0]);
        assert_eq!(standard[2].memory_bytes, 16 << 30);
        assert_eq!(
            standard[2].opencl_devices[0].gflops,
            Some((4.0 * 10.0 * 0.9) as f32)
        );
        assert_eq!(
            standard[3].labels,
            vec![
                ("class".into(), "gateway".into()),
                ("storage".into(), "fast".into())
            ]
        );
        let unseen = scenario_profiles(&Fleet::Unseen.scenario().unwrap());
        let names: Vec<_> = unseen.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(names, ["pi5", "orin", "nuc", "gateway"]);
        assert_eq!(unseen[1].opencl_devices[0].gflops, Some(820.0));
        assert_eq!(unseen[1].cores, 6.0);
    }
}
