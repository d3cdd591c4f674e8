//! What a node can do: published once at start, retained by the broker, so a
//! coordinator that connects later still learns every node.

use heapless::{String, Vec};
use serde::{Deserialize, Serialize};

use crate::ids::{Label, NodeId};
use crate::limits::{
    MAX_DISKS, MAX_GPUS, MAX_INTERFACES, MAX_LABELS, MAX_POWER_LEVELS, MAX_RUNTIMES, NAME_LEN,
    TEXT_LEN,
};

/// A task runtime an agent can execute.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Runtime {
    /// WebAssembly modules with WASI preview 1, run by wasmtime.
    Wasm,
    /// OpenCL kernels, run through the node's OpenCL platforms.
    Opencl,
}

impl Runtime {
    /// The runtime's wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Runtime::Wasm => "wasm",
            Runtime::Opencl => "opencl",
        }
    }
}

/// Where a figure a node reports came from, so that whoever shows or uses
/// it can say which it is ("3.1 J (sensor)" beside "≈ 3.5 J (model)").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Source {
    /// Measured by the agent: a benchmark, a probe, a timed transfer.
    Measured,
    /// Read from a hardware sensor: an energy counter, a power gauge, a
    /// GPU's load counter.
    Sensor,
    /// Computed from a model of the hardware (what older agents' figures
    /// all are, hence the default).
    #[default]
    Model,
    /// Declared by the operator in the agent's configuration.
    Operator,
}

impl Source {
    /// The wire name, which is also what people are shown.
    pub fn as_str(self) -> &'static str {
        match self {
            Source::Measured => "measured",
            Source::Sensor => "sensor",
            Source::Model => "model",
            Source::Operator => "operator",
        }
    }
}

/// The node's processor.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CpuInfo {
    /// Model name as the OS reports it.
    pub model: String<TEXT_LEN>,
    /// Logical cores.
    pub cores: u16,
    /// Lowest frequency in MHz (0 when unknown).
    pub min_mhz: u32,
    /// Highest frequency in MHz (0 when unknown).
    pub max_mhz: u32,
    /// One core's speed relative to the reference core (placement's unit:
    /// 1.0 runs a second of reference work in a second), when the agent
    /// measured it; without it the coordinator models the speed from the
    /// architecture and `max_mhz`.
    #[serde(default)]
    pub speed: Option<f32>,
    /// Where `speed` came from (`measured` by the agent's calibration,
    /// `operator` when declared); `model` when there is none.
    #[serde(default)]
    pub speed_source: Source,
}

/// What kind of OpenCL device a GPU entry is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum GpuKind {
    /// A graphics processor.
    Gpu,
    /// A CPU exposed as an OpenCL device (PoCL, for instance).
    Cpu,
    /// A dedicated accelerator.
    Accelerator,
    /// Anything else the platform reports.
    Other,
}

/// One OpenCL device.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GpuDevice {
    /// The OpenCL platform's name.
    pub platform: String<NAME_LEN>,
    /// The device vendor.
    pub vendor: String<NAME_LEN>,
    /// The device name.
    pub name: String<TEXT_LEN>,
    /// Device type.
    pub kind: GpuKind,
    /// Compute units.
    pub compute_units: u32,
    /// Global memory in bytes.
    pub memory_bytes: u64,
    /// Highest clock in MHz.
    pub max_clock_mhz: u32,
    /// The OpenCL version the device reports (`OpenCL 3.0 ...`).
    #[serde(default)]
    pub version: String<TEXT_LEN>,
    /// Local (work-group shared) memory in bytes.
    #[serde(default)]
    pub local_memory_bytes: u64,
    /// The largest single buffer the device allows, in bytes.
    #[serde(default)]
    pub max_alloc_bytes: u64,
    /// The largest work-group the device runs.
    #[serde(default)]
    pub max_work_group_size: u32,
    /// Whether the device computes in double precision.
    #[serde(default)]
    pub fp64: bool,
    /// Single-precision throughput measured by the agent's calibration kernel,
    /// in GFLOP/s; `None` when the device was not calibrated.
    #[serde(default)]
    pub gflops: Option<f32>,
}

/// Where a disk's I/O rate came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RateSource {
    /// Measured by the agent.
    Measured,
    /// Declared by the operator in the agent's config.
    Declared,
    /// Not known.
    Unknown,
}

/// One disk and its I/O rate.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DiskInfo {
    /// Device name.
    pub name: String<NAME_LEN>,
    /// Mount point.
    pub mount: String<TEXT_LEN>,
    /// Capacity in bytes.
    pub total_bytes: u64,
    /// Free space in bytes.
    pub available_bytes: u64,
    /// Sequential read rate in MB/s (0 when unknown).
    pub read_mbps: f32,
    /// Sequential write rate in MB/s (0 when unknown).
    pub write_mbps: f32,
    /// Where the rates came from.
    pub rate_source: RateSource,
}

/// One network interface.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NetInterface {
    /// Interface name.
    pub name: String<NAME_LEN>,
    /// Hardware address, when it has one.
    pub mac: Option<String<NAME_LEN>>,
    /// Link speed in Mbit/s, when known.
    pub speed_mbps: Option<u32>,
}

/// One power level a node offers (a DVFS operating point or a power profile).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PowerLevel {
    /// Index, 0 being the lowest.
    pub level: u8,
    /// Name for people (`powersave`, `balanced`, `performance`).
    pub name: String<NAME_LEN>,
    /// Execution speed relative to the highest level (0 < s ≤ 1).
    pub speed_factor: f32,
    /// Power drawn when idle at this level, in watts.
    pub idle_watts: f32,
    /// Power drawn when fully busy at this level, in watts.
    pub active_watts: f32,
    /// Where the watts came from: the agent's `model` unless a sensor or
    /// the operator gave them.
    #[serde(default)]
    pub source: Source,
}

/// Whether a node can apply the power level chosen for a task.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PowerControl {
    /// It cannot (no cpufreq, or not writable: VMs, containers), or it is an
    /// agent from before power control: placement must not count savings.
    #[default]
    None,
    /// It sets the CPU's frequency ceiling through the kernel's cpufreq.
    Cpufreq,
}

/// How a node runs WebAssembly modules.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WasmEngine {
    /// Whether it compiles plain modules itself (the agent carries a
    /// compiler). One that does not runs only modules the coordinator
    /// compiled for its `engine` and `target`.
    pub compiles: bool,
    /// The engine a precompiled module must be compiled for
    /// (`starling_wasm::engine_id`, e.g. `wasmtime-48/starling-1`); empty
    /// when the agent did not say (an agent from before precompiled modules).
    #[serde(default)]
    pub engine: String<NAME_LEN>,
    /// Its target as wasmtime reads a triple (`aarch64-unknown-linux`).
    #[serde(default)]
    pub target: String<NAME_LEN>,
}

impl Default for WasmEngine {
    /// What an agent from before precompiled modules is: one that compiles.
    fn default() -> Self {
        Self {
            compiles: true,
            engine: String::new(),
            target: String::new(),
        }
    }
}

/// Everything a node can do, sent at start and retained.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Capability {
    /// Protocol version.
    pub v: u16,
    /// The node's id.
    pub node_id: NodeId,
    /// The agent's version.
    pub agent_version: String<NAME_LEN>,
    /// CPU architecture (`x86_64`, `aarch64`, ...).
    pub arch: String<NAME_LEN>,
    /// Operating system and version.
    pub os: String<TEXT_LEN>,
    /// The processor.
    pub cpu: CpuInfo,
    /// Total memory in bytes.
    pub memory_bytes: u64,
    /// OpenCL devices; empty when the node has no OpenCL platform.
    pub gpus: Vec<GpuDevice, MAX_GPUS>,
    /// Disks.
    pub disks: Vec<DiskInfo, MAX_DISKS>,
    /// Network interfaces.
    pub interfaces: Vec<NetInterface, MAX_INTERFACES>,
    /// Operator labels.
    pub labels: Vec<Label, MAX_LABELS>,
    /// Runtimes the agent can execute.
    pub runtimes: Vec<Runtime, MAX_RUNTIMES>,
    /// Power levels the node offers, lowest first.
    pub power_levels: Vec<PowerLevel, MAX_POWER_LEVELS>,
    /// Whether it applies them; absent (older agents) means it does not.
    #[serde(default)]
    pub power_control: PowerControl,
    /// How it runs wasm modules; absent (older agents) means it compiles them.
    #[serde(default)]
    pub wasm: WasmEngine,
}

/// A number that must be finite and not negative, or why it is not.
fn non_negative(what: &str, value: f32) -> Option<alloc::string::String> {
    (!(value.is_finite() && value >= 0.0))
        .then(|| alloc::format!("{what} {value} is not a finite, non-negative number"))
}

impl Capability {
    /// What is wrong with the figures, if anything: a rate, power or speed
    /// that is NaN, infinite or negative. The placement engine computes
    /// with these, and one NaN would make every comparison with the node
    /// false (a broken or hostile agent would attract work).
    pub fn problems(&self) -> Option<alloc::string::String> {
        if let Some(speed) = self.cpu.speed {
            // A speed of 0 would make every estimate on the node infinite.
            if !(speed.is_finite() && speed > 0.0) {
                return Some(alloc::format!(
                    "the cpu's speed {speed} is not a finite number above 0"
                ));
            }
        }
        for gpu in &self.gpus {
            if let Some(gflops) = gpu.gflops {
                if let Some(problem) = non_negative("gflops of a GPU", gflops) {
                    return Some(problem);
                }
            }
        }
        for disk in &self.disks {
            let problem = non_negative("read_mbps of a disk", disk.read_mbps)
                .or_else(|| non_negative("write_mbps of a disk", disk.write_mbps));
            if problem.is_some() {
                return problem;
            }
        }
        for level in &self.power_levels {
            // A level that runs nothing (speed 0) would make every estimate
            // on it infinite.
            if !(level.speed_factor.is_finite() && level.speed_factor > 0.0) {
                return Some(alloc::format!(
                    "speed_factor {} of power level {} is not a finite number above 0",
                    level.speed_factor,
                    level.level
                ));
            }
            let problem = non_negative("idle_watts of a power level", level.idle_watts)
                .or_else(|| non_negative("active_watts of a power level", level.active_watts));
            if problem.is_some() {
                return problem;
            }
        }
        None
    }
}
