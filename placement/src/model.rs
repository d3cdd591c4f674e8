//! The placement model: what the engine knows about nodes ([`NodeView`], gathered
//! in a [`ClusterView`]) and about the work waiting to run ([`PendingTask`]).
//!
//! # Units
//!
//! Work is measured in *reference seconds*: the time the task takes on one core of
//! an x86 mini PC (Intel NUC class) at its highest power level. Every node carries
//! relative speeds against that reference, one per task class (CPU, GPU, I/O), and
//! a power model with one speed factor per power level.
//!
//! # The five-dimensional queue state
//!
//! HiRL describes each device's queue with a five-dimensional state. Starling uses
//! ([`QueueState`]):
//!
//! 1. **queued tasks** (placed but not finished): the length of the queue, the
//!    plainest signal of contention, and what an agent reports directly;
//! 2. **backlog seconds**: the wall time the queued and running work needs at the
//!    levels it was placed with, per lane (core or GPU). Task counts hide task
//!    sizes; this is what a new task actually waits behind;
//! 3. **earliest deadline slack**: how much time the most urgent queued task has
//!    left after its estimated finish. A node whose queue is already tight should
//!    not take more work in front of it, and slack is what the power choice
//!    reclaims;
//! 4. **utilisation**: the fraction of lanes busy. It separates a node with one
//!    long task on one of four cores (room now) from a node with four short ones;
//! 5. **energy headroom**: the fraction of the node's energy budget (battery) left,
//!    1 on mains power. Energy is one of the two objectives; a battery node close
//!    to empty must be spared.
//!
//! Together they cover the paper's concerns (delay, deadlines, load, energy) with
//! quantities both the simulator and real telemetry can supply.

use core::fmt;
use core::str::FromStr;

use serde::{Deserialize, Serialize};
use starling_proto::{Capability, GpuDevice, GpuKind, Label, NodeId, Runtime, Telemetry};

pub mod correction;

use correction::NodeCorrections;

/// Per-core speed of the reference node (an x86 mini PC core), by definition 1.
pub const REFERENCE_CORE_SPEED: f64 = 1.0;
/// Storage rate of the reference node, MB/s (a SATA SSD in an x86 mini PC).
pub const REFERENCE_IO_MBPS: f64 = 500.0;
/// Single-precision GFLOP/s of one reference core (an x86 mini-PC core = speed
/// 1.0) on the agent's calibration kernel. It converts a calibrated OpenCL
/// device's measured GFLOP/s into a speed relative to the reference core.
///
/// Measured: the calibration kernel on PoCL 3.1 held to one core
/// (`POCL_CPU_MAX_CU_NUM=1`) scores 20.6–22.7 GFLOP/s on a 2.3 GHz Skylake-SP
/// Xeon core with AVX-512. A mini-PC core has AVX2, half that vector width, at
/// a similar clock: about 10.
pub const REFERENCE_CORE_GFLOPS: f64 = 10.0;
/// FLOPs per compute unit per cycle assumed for an uncalibrated non-CPU device:
/// 64 lanes issuing a fused multiply-add (an AMD GCN compute unit; half a Maxwell
/// SM). Units differ widely between vendors; calibration replaces the guess.
const ESTIMATED_FLOPS_PER_UNIT_CYCLE: f64 = 128.0;
/// Fraction of the estimated peak a calibration kernel reaches on a GPU.
const ESTIMATED_CALIBRATION_EFFICIENCY: f64 = 0.65;
/// Share of its cores' speed an uncalibrated CPU OpenCL device (PoCL) is credited
/// with: kernels vectorise less well than native code and threads cost overhead.
const ESTIMATED_CPU_DEVICE_EFFICIENCY: f64 = 0.8;
/// The least speed an uncalibrated device is credited with, so that a device
/// reporting nonsense (zero units or clock) still counts as slow rather than absent.
const MIN_ESTIMATED_DEVICE_SPEED: f64 = 0.5;
/// Work assumed for a queued task a node reports but the coordinator did not place
/// (reference seconds): telemetry counts tasks, not their sizes.
pub const UNKNOWN_TASK_WORK_S: f64 = 1.0;

/// Which resource dominates a task's run time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TaskClass {
    /// Bound by CPU cores and their speed.
    Cpu,
    /// Bound by a GPU (an OpenCL device).
    Gpu,
    /// Bound by storage I/O.
    Io,
}

impl TaskClass {
    /// All classes, in a fixed order.
    pub const ALL: [TaskClass; 3] = [TaskClass::Cpu, TaskClass::Gpu, TaskClass::Io];

    /// The class's name, as serde writes it.
    pub fn as_str(self) -> &'static str {
        match self {
            TaskClass::Cpu => "cpu",
            TaskClass::Gpu => "gpu",
            TaskClass::Io => "io",
        }
    }
}

impl fmt::Display for TaskClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A task class name that is not `cpu`, `gpu` or `io`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown task class {0:?}: expected cpu, gpu or io")]
pub struct UnknownTaskClass(pub String);

impl FromStr for TaskClass {
    type Err = UnknownTaskClass;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "cpu" => Ok(TaskClass::Cpu),
            "gpu" => Ok(TaskClass::Gpu),
            "io" => Ok(TaskClass::Io),
            _ => Err(UnknownTaskClass(s.to_owned())),
        }
    }
}

/// What a task needs from the node while it runs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Demand {
    /// Cores it uses (it runs on `ceil(cpu_cores)` lanes, at least one).
    pub cpu_cores: f32,
    /// Memory it needs, reserved from placement until it finishes.
    pub memory_bytes: u64,
    /// Whether it needs an OpenCL device (a hard constraint).
    pub gpu: bool,
    /// Storage rate it uses, MB/s (scoring only; not a hard constraint).
    pub io_mbps: f32,
    /// Device memory its OpenCL buffers need together, bytes (0 when it is not an
    /// OpenCL task): the node needs a device with at least this much.
    #[serde(default)]
    pub gpu_memory_bytes: u64,
}

/// Hard constraints on where a task may run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Constraints {
    /// The runtime the node must offer.
    pub runtime: Runtime,
    /// The CPU architecture the node must have, if the task cares.
    pub arch: Option<String>,
    /// Labels the node must carry (all of them).
    pub labels: Vec<Label>,
    /// The OpenCL device type an OpenCL task wants (`None`: any). Ignored for
    /// tasks that need no OpenCL device.
    #[serde(default)]
    pub device_kind: Option<GpuKind>,
    /// Whether an OpenCL task needs double precision (its kernel uses `double`).
    #[serde(default)]
    pub fp64: bool,
}

/// A task waiting for a placement.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PendingTask {
    /// The caller's handle, echoed in decisions.
    pub key: u64,
    /// Which resource dominates its run time.
    pub class: TaskClass,
    /// What it needs while running.
    pub demand: Demand,
    /// Seconds on one reference core at full power (an x86 mini PC core = 1.0).
    pub work: f64,
    /// Bytes moved to the node before it starts.
    pub input_bytes: u64,
    /// Bytes moved back after it ends.
    pub output_bytes: u64,
    /// Absolute deadline, on the same clock as [`ClusterView::now_ms`].
    pub deadline_ms: Option<u64>,
    /// Higher is more urgent.
    pub priority: u8,
    /// When it was submitted, same clock.
    pub submitted_ms: u64,
    /// Where it may run.
    pub constraints: Constraints,
    /// Its artifact, as a key (0: none known), under which nodes keep what
    /// they learned of its run times ([`correction`]).
    #[serde(default)]
    pub artifact: u64,
}

/// One power level of a node, as the engine models it.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct PowerLevelModel {
    /// Execution speed relative to the node's highest level (0 < s ≤ 1).
    pub speed_factor: f64,
    /// Watts drawn idle at this level.
    pub idle_watts: f64,
    /// Watts drawn fully busy at this level.
    pub active_watts: f64,
}

/// The network path between a node and the task's data source (the coordinator's
/// site), which every input and output crosses.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct NetworkLink {
    /// Usable bandwidth, Mbit/s.
    pub bandwidth_mbps: f64,
    /// Round-trip time, milliseconds.
    pub rtt_ms: f64,
    /// Fraction of packets lost (0..1); retransmissions stretch transfers.
    pub loss: f64,
}

/// Which kinds of OpenCL devices a node has.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct DeviceKinds {
    /// A graphics processor.
    pub gpu: bool,
    /// The host CPU exposed as an OpenCL device (PoCL, for instance).
    pub cpu: bool,
    /// A dedicated accelerator.
    pub accelerator: bool,
    /// A device the platform reports as none of the above.
    pub other: bool,
}

impl DeviceKinds {
    /// Whether a device of `kind` is present.
    pub fn contains(self, kind: GpuKind) -> bool {
        match kind {
            GpuKind::Gpu => self.gpu,
            GpuKind::Cpu => self.cpu,
            GpuKind::Accelerator => self.accelerator,
            GpuKind::Other => self.other,
        }
    }

    /// Whether a device satisfying `wanted` is present (`None`: any device).
    pub fn satisfies(self, wanted: Option<GpuKind>) -> bool {
        match wanted {
            Some(kind) => self.contains(kind),
            None => self.gpu || self.cpu || self.accelerator || self.other,
        }
    }

    /// Marks a device of `kind` as present.
    pub fn insert(&mut self, kind: GpuKind) {
        match kind {
            GpuKind::Gpu => self.gpu = true,
            GpuKind::Cpu => self.cpu = true,
            GpuKind::Accelerator => self.accelerator = true,
            GpuKind::Other => self.other = true,
        }
    }
}

/// A summary of a node's OpenCL devices: what the hard filters check and what
/// the estimates run on. Built from the devices by [`GpuCapacity::from_devices`],
/// for real nodes and simulated ones alike.
///
/// The host CPU exposed through OpenCL (PoCL) is kept apart from the other
/// devices: a kernel on it runs on the node's cores, so it competes with the
/// CPU lanes rather than adding a lane of its own.
///
/// On a node with devices of several kinds the figures are the best over all of
/// them (speed over the non-CPU devices): the summary does not pair each
/// device's memory with its kind. Edge nodes rarely mix kinds, and the agent
/// checks the chosen device's own limits before a kernel runs.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct GpuCapacity {
    /// Devices other than the host CPU (GPUs, accelerators); each runs one task
    /// at a time beside the CPU lanes.
    pub devices: u32,
    /// Speed of the fastest of those devices relative to one reference core
    /// (0 when there are none).
    pub speed: f64,
    /// Speed of the host CPU exposed as an OpenCL device, all its cores together,
    /// relative to one reference core (0 when there is none).
    pub cpu_device_speed: f64,
    /// Global memory of the largest device, bytes.
    pub memory_bytes: u64,
    /// The largest single buffer any device allows, bytes.
    pub max_alloc_bytes: u64,
    /// Which kinds of devices are present.
    pub kinds: DeviceKinds,
    /// Whether some device computes in double precision.
    pub fp64: bool,
}

impl GpuCapacity {
    /// The summary of a node's OpenCL devices, `None` without any. `cpu_speed` is
    /// the speed of one of the node's cores relative to the reference core; it
    /// prices an uncalibrated CPU device.
    pub fn from_devices(devices: &[GpuDevice], cpu_speed: f64) -> Option<GpuCapacity> {
        if devices.is_empty() {
            return None;
        }
        let mut capacity = GpuCapacity {
            devices: 0,
            speed: 0.0,
            cpu_device_speed: 0.0,
            memory_bytes: 0,
            max_alloc_bytes: 0,
            kinds: DeviceKinds::default(),
            fp64: false,
        };
        for device in devices {
            let speed = Self::device_speed(device, cpu_speed);
            capacity.kinds.insert(device.kind);
            if device.kind == GpuKind::Cpu {
                capacity.cpu_device_speed = capacity.cpu_device_speed.max(speed);
            } else {
                capacity.devices = capacity.devices.saturating_add(1);
                capacity.speed = capacity.speed.max(speed);
            }
            capacity.memory_bytes = capacity.memory_bytes.max(device.memory_bytes);
            // A device that did not report its limit (an older agent) is allowed
            // what OpenCL guarantees: a quarter of its memory, at least 128 MiB.
            let max_alloc = if device.max_alloc_bytes > 0 {
                device.max_alloc_bytes
            } else {
                (device.memory_bytes / 4)
                    .max(128 << 20)
                    .min(device.memory_bytes)
            };
            capacity.max_alloc_bytes = capacity.max_alloc_bytes.max(max_alloc);
            capacity.fp64 |= device.fp64;
        }
        Some(capacity)
    }

    /// One device's speed relative to one reference core: its calibrated
    /// GFLOP/s over [`REFERENCE_CORE_GFLOPS`] when the agent measured it;
    /// otherwise an estimate, from the cores' speed for a CPU device and from
    /// compute units × clock for any other.
    pub fn device_speed(device: &GpuDevice, cpu_speed: f64) -> f64 {
        let measured = device
            .gflops
            .map(f64::from)
            .filter(|gflops| gflops.is_finite() && *gflops > 0.0);
        if let Some(gflops) = measured {
            return gflops / REFERENCE_CORE_GFLOPS;
        }
        let units = f64::from(device.compute_units.max(1));
        let estimate = match device.kind {
            GpuKind::Cpu => units * cpu_speed.max(0.0) * ESTIMATED_CPU_DEVICE_EFFICIENCY,
            _ => {
                // An unknown clock is taken as 1 GHz, common for embedded GPUs.
                let ghz = match device.max_clock_mhz {
                    0 => 1.0,
                    mhz => f64::from(mhz) / 1000.0,
                };
                units * ghz * ESTIMATED_FLOPS_PER_UNIT_CYCLE * ESTIMATED_CALIBRATION_EFFICIENCY
                    / REFERENCE_CORE_GFLOPS
            }
        };
        estimate.max(MIN_ESTIMATED_DEVICE_SPEED)
    }

    /// Whether the node has a device of the wanted kind (`None`: any).
    pub fn has_kind(&self, wanted: Option<GpuKind>) -> bool {
        self.kinds.satisfies(wanted)
    }
}

/// The quantities of a node that change as tasks are placed, start and finish.
/// `Copy`, so that policies can keep a scratch copy per decision round cheaply.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct NodeLoad {
    /// Cores not reserved by placed tasks.
    pub free_cpu_cores: f64,
    /// Memory not reserved by placed tasks (hard limit for new placements).
    pub free_memory_bytes: u64,
    /// Storage rate not used by placed tasks, MB/s.
    pub free_io_mbps: f64,
    /// Tasks placed and not finished (running or waiting).
    pub queued_tasks: u32,
    /// Lane-seconds of CPU and I/O work placed and not finished.
    pub backlog_cpu_s: f64,
    /// Device-seconds of GPU work placed and not finished.
    pub backlog_gpu_s: f64,
    /// Smallest deadline slack among placed tasks, ms (`None` when none has a deadline).
    pub earliest_slack_ms: Option<f64>,
    /// Dynamic energy already committed to placed work, joules.
    pub committed_joules: f64,
    /// The power level in force (index into the node's levels).
    pub power_level: u8,
}

/// A node's energy supply.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct EnergyState {
    /// Battery or budget capacity, joules; `None` on mains power.
    pub budget_joules: Option<f64>,
    /// Energy used so far, joules.
    pub used_joules: f64,
}

/// HiRL's five-dimensional queue state of one node (see the module docs for why these five).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct QueueState {
    /// Tasks placed and not finished.
    pub queued_tasks: f64,
    /// Seconds of placed work per lane, at the levels it was placed with.
    pub backlog_s: f64,
    /// Smallest deadline slack among placed tasks, seconds (a large value when none).
    pub earliest_slack_s: f64,
    /// Fraction of lanes busy, 0..=1.
    pub utilisation: f64,
    /// Fraction of the energy budget left, 0..=1 (1 on mains power).
    pub energy_headroom: f64,
}

impl QueueState {
    /// The state as a plain vector, in the documented order.
    pub fn to_array(self) -> [f64; 5] {
        [
            self.queued_tasks,
            self.backlog_s,
            self.earliest_slack_s,
            self.utilisation,
            self.energy_headroom,
        ]
    }
}

/// The engine's view of one node.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodeView {
    /// The node.
    pub id: NodeId,
    /// Whether it is reachable; offline nodes get no work.
    pub online: bool,
    /// CPU architecture (`x86_64`, `aarch64`, ...).
    pub arch: String,
    /// Runtimes it can execute.
    pub runtimes: Vec<Runtime>,
    /// Operator labels.
    pub labels: Vec<Label>,
    /// Logical cores.
    pub cpu_cores: f64,
    /// Speed of one core relative to the reference core.
    pub cpu_speed: f64,
    /// Total memory, bytes.
    pub memory_bytes: u64,
    /// OpenCL devices, if any.
    pub gpu: Option<GpuCapacity>,
    /// Storage rate, MB/s.
    pub io_mbps: f64,
    /// Link toward the data source.
    pub network: NetworkLink,
    /// Power levels, lowest first; never empty.
    pub power_levels: Vec<PowerLevelModel>,
    /// Energy supply.
    pub energy: EnergyState,
    /// What placed work occupies now.
    pub load: NodeLoad,
    /// How its run times stood against their estimates (learned from
    /// finished attempts; none for a node nothing has finished on).
    #[serde(default)]
    pub corrections: NodeCorrections,
}

/// Power levels assumed when a node reports none: a single full-speed level with
/// approximate figures for its architecture (x86 mini PC ~6 W idle / ~30 W busy;
/// an Arm single-board computer ~2.7 W / ~6.4 W, the Raspberry Pi 4's figures).
fn default_power_levels(arch: &str) -> Vec<PowerLevelModel> {
    let (idle_watts, active_watts) = if arch.starts_with("x86") {
        (6.0, 30.0)
    } else {
        (2.7, 6.4)
    };
    vec![PowerLevelModel {
        speed_factor: 1.0,
        idle_watts,
        active_watts,
    }]
}

/// Per-core speed relative to the reference core, from the clock and the
/// architecture. Approximate: a Cortex-A72 at 1.5 GHz does roughly a third of a
/// mobile Core i5 core at ~3 GHz in single-threaded benchmarks (Geekbench 5 ~270 vs
/// ~1000), hence the lower per-MHz factor for Arm.
fn core_speed(arch: &str, max_mhz: u32) -> f64 {
    let per_ghz = if arch.starts_with("x86") {
        1.0 / 3.0
    } else {
        0.23
    };
    let ghz = if max_mhz == 0 {
        if arch.starts_with("x86") {
            3.0
        } else {
            1.5
        }
    } else {
        f64::from(max_mhz) / 1000.0
    };
    (per_ghz * ghz).clamp(0.05, 4.0)
}

/// One core's speed relative to the reference core, and where it came
/// from: the agent's calibration (or the operator's figure) where the node
/// reports one, the model's lookup from the architecture and clock
/// otherwise.
pub fn cpu_speed_of(capability: &Capability) -> (f64, starling_proto::Source) {
    match capability
        .cpu
        .speed
        .filter(|speed| speed.is_finite() && *speed > 0.0)
    {
        Some(speed) => (
            f64::from(speed).clamp(0.05, 4.0),
            capability.cpu.speed_source,
        ),
        None => (
            core_speed(capability.arch.as_str(), capability.cpu.max_mhz),
            starling_proto::Source::Model,
        ),
    }
}

impl NodeView {
    /// Builds the engine's view of a real node from its reports (relative speeds,
    /// power model, free amounts). Without telemetry the node is taken as idle.
    pub fn from_reports(
        capability: &Capability,
        telemetry: Option<&Telemetry>,
        online: bool,
    ) -> NodeView {
        let arch = capability.arch.as_str().to_owned();
        let cpu_cores = f64::from(capability.cpu.cores.max(1));
        let (cpu_speed, _) = cpu_speed_of(capability);
        let gpu = GpuCapacity::from_devices(&capability.gpus, cpu_speed);
        let io_mbps = capability
            .disks
            .iter()
            .map(|disk| f64::from(disk.read_mbps.max(disk.write_mbps)))
            .fold(0.0_f64, f64::max);
        // Unknown rates: assume an SD-card-class 40 MB/s, the slowest common case.
        let io_mbps = if io_mbps > 0.0 { io_mbps } else { 40.0 };
        let interface_mbps = capability
            .interfaces
            .iter()
            .filter_map(|interface| interface.speed_mbps)
            .max()
            .map(f64::from);
        let mut network = NetworkLink {
            bandwidth_mbps: interface_mbps.unwrap_or(100.0),
            rtt_ms: 5.0,
            loss: 0.0,
        };
        let mut power_levels: Vec<PowerLevelModel> = capability
            .power_levels
            .iter()
            .map(|level| PowerLevelModel {
                speed_factor: f64::from(level.speed_factor).clamp(0.01, 1.0),
                idle_watts: f64::from(level.idle_watts).max(0.0),
                active_watts: f64::from(level.active_watts.max(level.idle_watts)).max(0.0),
            })
            .collect();
        if power_levels.is_empty() {
            power_levels = default_power_levels(&arch);
        }
        // A node that cannot apply a level runs as its hardware decides: its
        // top level is the honest estimate, and the lower ones are savings
        // the engine must not count (older agents say nothing: the same).
        if capability.power_control == starling_proto::PowerControl::None {
            let top = power_levels.len() - 1;
            power_levels.drain(..top);
        }
        let top_level = u8::try_from(power_levels.len() - 1).unwrap_or(u8::MAX);
        let mut load = NodeLoad {
            free_cpu_cores: cpu_cores,
            free_memory_bytes: capability.memory_bytes,
            free_io_mbps: io_mbps,
            queued_tasks: 0,
            backlog_cpu_s: 0.0,
            backlog_gpu_s: 0.0,
            earliest_slack_ms: None,
            committed_joules: 0.0,
            power_level: top_level,
        };
        let mut energy = EnergyState {
            budget_joules: None,
            used_joules: 0.0,
        };
        if let Some(report) = telemetry {
            let busy = f64::from(report.cpu_load.clamp(0.0, 1.0)) * cpu_cores;
            load.free_cpu_cores = (cpu_cores - busy).max(0.0);
            load.free_memory_bytes = report.free_memory_bytes.min(capability.memory_bytes);
            let io_used = (report.io_read_bps + report.io_write_bps) as f64 / 1e6;
            load.free_io_mbps = (io_mbps - io_used).max(0.0);
            let waiting = u32::from(report.queued_tasks) + u32::from(report.running_tasks);
            load.queued_tasks = waiting;
            let unknown_work = f64::from(waiting) * UNKNOWN_TASK_WORK_S / cpu_speed.max(0.05);
            load.backlog_cpu_s = busy + unknown_work;
            load.power_level = report.power_level.min(top_level);
            energy.used_joules = report.energy_joules.max(0.0);
            if let Some(rtt) = report.link.rtt_ms {
                network.rtt_ms = f64::from(rtt).max(0.0);
            }
            if let Some(bandwidth) = report.link.bandwidth_mbps {
                if bandwidth > 0.0 {
                    network.bandwidth_mbps = f64::from(bandwidth);
                }
            }
            if let Some(loss) = report.link.loss {
                network.loss = f64::from(loss).clamp(0.0, 0.95);
            }
        }
        NodeView {
            id: capability.node_id.clone(),
            online,
            arch,
            runtimes: capability.runtimes.iter().copied().collect(),
            labels: capability.labels.iter().cloned().collect(),
            cpu_cores,
            cpu_speed,
            memory_bytes: capability.memory_bytes,
            gpu,
            io_mbps,
            network,
            power_levels,
            energy,
            load,
            corrections: NodeCorrections::default(),
        }
    }

    /// The highest power level's index.
    pub fn top_power_level(&self) -> u8 {
        u8::try_from(self.power_levels.len().saturating_sub(1)).unwrap_or(u8::MAX)
    }

    /// The model of a power level, clamped to the levels the node has.
    pub fn power_level(&self, level: u8) -> PowerLevelModel {
        let index = usize::from(level).min(self.power_levels.len().saturating_sub(1));
        self.power_levels
            .get(index)
            .copied()
            .unwrap_or(PowerLevelModel {
                speed_factor: 1.0,
                idle_watts: 0.0,
                active_watts: 0.0,
            })
    }

    /// OpenCL devices other than the host CPU (0 without any): the device lanes.
    pub fn gpu_devices(&self) -> u32 {
        self.gpu.map_or(0, |gpu| gpu.devices)
    }

    /// The five-dimensional queue state (see the module docs).
    pub fn queue_state(&self) -> QueueState {
        self.load.queue_state(self)
    }
}

impl NodeLoad {
    /// The five-dimensional queue state of this load on `node`.
    pub fn queue_state(&self, node: &NodeView) -> QueueState {
        let cpu_wait = self.backlog_cpu_s / node.cpu_cores.max(1.0);
        let gpu_wait = match node.gpu {
            Some(gpu) => self.backlog_gpu_s / f64::from(gpu.devices.max(1)),
            None => 0.0,
        };
        let energy_headroom = match node.energy.budget_joules {
            Some(budget) if budget > 0.0 => {
                ((budget - node.energy.used_joules - self.committed_joules) / budget)
                    .clamp(0.0, 1.0)
            }
            Some(_) => 0.0,
            None => 1.0,
        };
        QueueState {
            queued_tasks: f64::from(self.queued_tasks),
            backlog_s: cpu_wait.max(gpu_wait),
            earliest_slack_s: self.earliest_slack_ms.map_or(1e6, |slack| slack / 1000.0),
            utilisation: (1.0 - self.free_cpu_cores / node.cpu_cores.max(1.0)).clamp(0.0, 1.0),
            energy_headroom,
        }
    }
}

/// A snapshot of the cluster, as the policies see it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ClusterView {
    /// The current time, milliseconds, on the same clock as task deadlines.
    pub now_ms: u64,
    /// The nodes; decisions refer to them by index.
    pub nodes: Vec<NodeView>,
}

impl ClusterView {
    /// A copy of every node's load, for policies that account their own placements
    /// within one round without cloning the whole view.
    pub fn loads(&self) -> Vec<NodeLoad> {
        self.nodes.iter().map(|node| node.load).collect()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use starling_proto::{CpuInfo, DiskInfo, GpuDevice, LinkState, PowerLevel, RateSource};

    /// An OpenCL device without double precision or a reported allocation limit.
    fn device(
        kind: GpuKind,
        compute_units: u32,
        max_clock_mhz: u32,
        memory_bytes: u64,
        gflops: Option<f32>,
    ) -> GpuDevice {
        GpuDevice {
            platform: "Portable Computing Language".try_into().unwrap(),
            vendor: "vendor".try_into().unwrap(),
            name: "device".try_into().unwrap(),
            kind,
            compute_units,
            memory_bytes,
            max_clock_mhz,
            version: "OpenCL 3.0".try_into().unwrap(),
            local_memory_bytes: 64 << 10,
            max_alloc_bytes: 0,
            max_work_group_size: 1024,
            fp64: false,
            gflops,
        }
    }

    fn capability(arch: &str) -> Capability {
        let mut capability = Capability {
            arch: arch.try_into().unwrap(),
            os: "Linux".try_into().unwrap(),
            cpu: CpuInfo {
                model: "cpu".try_into().unwrap(),
                cores: 4,
                min_mhz: 600,
                max_mhz: 1500,
                speed: None,
                speed_source: Default::default(),
            },
            memory_bytes: 4 << 30,
            runtimes: Default::default(),
            ..starling_proto::fixtures::capability("edge-1")
        };
        if arch == "aarch64" {
            capability.power_control = starling_proto::PowerControl::Cpufreq;
            capability
                .gpus
                .push(device(GpuKind::Gpu, 1, 921, 4 << 30, None))
                .unwrap();
            for (level, speed, active) in [(0u8, 0.6f32, 5.0f32), (1, 1.0, 10.0)] {
                capability
                    .power_levels
                    .push(PowerLevel {
                        level,
                        name: "mode".try_into().unwrap(),
                        speed_factor: speed,
                        idle_watts: 1.25,
                        active_watts: active,
                        source: Default::default(),
                    })
                    .unwrap();
            }
        }
        capability
            .disks
            .push(DiskInfo {
                name: "nvme0n1".try_into().unwrap(),
                mount: "/".try_into().unwrap(),
                total_bytes: 1 << 40,
                available_bytes: 1 << 39,
                read_mbps: 1500.0,
                write_mbps: 900.0,
                rate_source: RateSource::Measured,
            })
            .unwrap();
        capability
            .labels
            .push(Label::parse("zone=lab").unwrap())
            .unwrap();
        capability.runtimes.push(Runtime::Wasm).unwrap();
        capability
    }

    #[test]
    fn levels_a_node_cannot_apply_are_not_offered_to_the_engine() {
        let mut capability = capability("aarch64");
        assert_eq!(
            NodeView::from_reports(&capability, None, true)
                .power_levels
                .len(),
            2
        );
        capability.power_control = starling_proto::PowerControl::None;
        let view = NodeView::from_reports(&capability, None, true);
        assert_eq!(view.power_levels.len(), 1, "only the top level");
        assert_eq!(view.power_levels[0].speed_factor, 1.0);
        assert_eq!(view.power_levels[0].active_watts, 10.0);
        assert_eq!(view.top_power_level(), 0);
    }

    #[test]
    fn from_reports_without_telemetry_is_an_idle_node_with_defaults() {
        let view = NodeView::from_reports(&capability("x86_64"), None, true);
        assert_eq!(view.id.as_str(), "edge-1");
        assert!(view.online);
        assert_eq!(view.cpu_cores, 4.0);
        // 1.5 GHz x86 is half the 3 GHz reference core.
        assert!((view.cpu_speed - 0.5).abs() < 1e-9);
        assert_eq!(view.io_mbps, 1500.0);
        assert!(view.gpu.is_none());
        assert_eq!(
            view.power_levels.len(),
            1,
            "a default level when none is reported"
        );
        assert_eq!(view.power_levels[0].active_watts, 30.0);
        assert_eq!(view.load.free_memory_bytes, 4 << 30);
        assert_eq!(view.load.queued_tasks, 0);
        assert_eq!(view.labels, vec![Label::parse("zone=lab").unwrap()]);
        assert_eq!(view.queue_state().to_array(), [0.0, 0.0, 1e6, 0.0, 1.0]);
    }

    #[test]
    fn a_measured_speed_replaces_the_lookup_and_says_so() {
        let mut reported = capability("x86_64");
        assert_eq!(
            cpu_speed_of(&reported),
            (0.5, starling_proto::Source::Model)
        );
        // Calibrated at a fifth of what the clock suggests (a shared or
        // throttled core): the measurement decides.
        reported.cpu.speed = Some(0.1);
        reported.cpu.speed_source = starling_proto::Source::Measured;
        assert_eq!(
            cpu_speed_of(&reported),
            (f64::from(0.1f32), starling_proto::Source::Measured)
        );
        let view = NodeView::from_reports(&reported, None, true);
        assert!((view.cpu_speed - 0.1).abs() < 1e-6);
        // Past the model's bounds, clamped as the lookup is; a broken
        // figure (the ingest refuses it first) falls back to the lookup.
        reported.cpu.speed = Some(100.0);
        assert_eq!(cpu_speed_of(&reported).0, 4.0);
        reported.cpu.speed = Some(f32::NAN);
        assert_eq!(
            cpu_speed_of(&reported),
            (0.5, starling_proto::Source::Model)
        );
    }

    #[test]
    fn from_reports_reads_gpu_power_levels_and_telemetry() {
        let capability = capability("aarch64");
        let telemetry = Telemetry {
            cpu_load: 0.5,
            free_memory_bytes: 1 << 30,
            io_read_bps: 100_000_000,
            link: LinkState {
                rtt_ms: Some(40.0),
                bandwidth_mbps: Some(20.0),
                loss: Some(0.1),
            },
            running_tasks: 2,
            queued_tasks: 1,
            energy_joules: 55.0,
            ..starling_proto::fixtures::telemetry(capability.node_id.as_str(), 9, 1_000)
        };
        let view = NodeView::from_reports(&capability, Some(&telemetry), false);
        assert!(!view.online);
        let gpu = view.gpu.unwrap();
        assert_eq!(gpu.devices, 1);
        // Uncalibrated: 1 unit × 0.921 GHz × 128 FLOP/cycle × 65% over the reference core.
        let estimate = 0.921 * 128.0 * 0.65 / REFERENCE_CORE_GFLOPS;
        assert!((gpu.speed - estimate).abs() < 0.01, "{}", gpu.speed);
        assert!(gpu.kinds.gpu && !gpu.kinds.cpu);
        assert_eq!(view.power_levels.len(), 2);
        assert_eq!(view.power_levels[0].speed_factor, 0.6f32 as f64);
        assert_eq!(view.load.free_cpu_cores, 2.0);
        assert_eq!(view.load.free_memory_bytes, 1 << 30);
        assert_eq!(view.load.free_io_mbps, 1400.0);
        assert_eq!(view.load.queued_tasks, 3);
        assert_eq!(view.load.power_level, 0);
        assert!(
            view.load.backlog_cpu_s > 2.0,
            "busy cores and queued tasks count as backlog"
        );
        assert_eq!(view.network.rtt_ms, 40.0);
        assert_eq!(view.network.bandwidth_mbps, 20.0);
        assert!((view.network.loss - 0.1).abs() < 1e-6);
        assert_eq!(view.energy.used_joules, 55.0);
    }

    #[test]
    fn commit_reserves_demand_and_adds_backlog() {
        let mut view = ClusterView {
            now_ms: 0,
            nodes: vec![NodeView::from_reports(&capability("x86_64"), None, true)],
        };
        let mut task = crate::testing::task(1, TaskClass::Cpu);
        task.deadline_ms = Some(60_000);
        task.work = 2.0;
        view.commit(0, &task, 0);
        let load = view.nodes[0].load;
        assert_eq!(load.free_memory_bytes, (4 << 30) - (64 << 20));
        assert_eq!(load.free_cpu_cores, 3.0);
        assert_eq!(load.queued_tasks, 1);
        // 2 reference seconds on a half-speed core.
        assert!((load.backlog_cpu_s - 4.0).abs() < 1e-9);
        assert!(load.earliest_slack_ms.unwrap() < 60_000.0);
        // Out of range: nothing changes.
        view.commit(5, &task, 0);
        assert_eq!(view.nodes[0].load, load);
    }

    #[test]
    fn a_calibrated_device_is_as_fast_as_its_gflops_say() {
        let calibrated = device(GpuKind::Gpu, 1, 921, 4 << 30, Some(150.0));
        let speed = GpuCapacity::device_speed(&calibrated, 0.3);
        assert!(
            (speed - 150.0 / REFERENCE_CORE_GFLOPS).abs() < 1e-9,
            "{speed}"
        );
        // The same device uncalibrated is priced from units × clock instead.
        let estimated = device(GpuKind::Gpu, 1, 921, 4 << 30, None);
        let guess = GpuCapacity::device_speed(&estimated, 0.3);
        let estimate = 0.921 * 128.0 * 0.65 / REFERENCE_CORE_GFLOPS;
        assert!((guess - estimate).abs() < 0.01, "{guess}");
        // A CPU device without a measurement counts its cores at 80% of their speed.
        let pocl = device(GpuKind::Cpu, 8, 3000, 16 << 30, None);
        assert!((GpuCapacity::device_speed(&pocl, 0.5) - 3.2).abs() < 1e-9);
        // Nonsense measurements fall back to the estimate; nonsense figures to a floor.
        let nan = device(GpuKind::Gpu, 1, 921, 1 << 30, Some(f32::NAN));
        assert_eq!(GpuCapacity::device_speed(&nan, 0.3), guess);
        let blank = device(GpuKind::Cpu, 0, 0, 1 << 30, None);
        assert_eq!(GpuCapacity::device_speed(&blank, 0.0), 0.5);
    }

    #[test]
    fn from_devices_summarises_kinds_memory_and_speed() {
        assert_eq!(GpuCapacity::from_devices(&[], 1.0), None);

        // PoCL alone: no device lane, the CPU device priced by its measurement.
        let mut pocl = device(GpuKind::Cpu, 16, 3000, 32 << 30, Some(96.0));
        pocl.fp64 = true;
        pocl.max_alloc_bytes = 8 << 30;
        let cpu_only = GpuCapacity::from_devices(core::slice::from_ref(&pocl), 1.0).unwrap();
        assert_eq!(cpu_only.devices, 0);
        assert_eq!(cpu_only.speed, 0.0);
        assert!((cpu_only.cpu_device_speed - 96.0 / REFERENCE_CORE_GFLOPS).abs() < 1e-9);
        assert_eq!(
            cpu_only.kinds,
            DeviceKinds {
                cpu: true,
                ..DeviceKinds::default()
            }
        );
        assert!(cpu_only.has_kind(None) && cpu_only.has_kind(Some(GpuKind::Cpu)));
        assert!(!cpu_only.has_kind(Some(GpuKind::Gpu)));
        assert_eq!(cpu_only.memory_bytes, 32 << 30);
        assert_eq!(cpu_only.max_alloc_bytes, 8 << 30);
        assert!(cpu_only.fp64);

        // Two GPUs and an accelerator beside it: three device lanes, the fastest
        // sets the speed, the largest sets the memory; a missing allocation limit
        // is taken as OpenCL's guaranteed quarter of the memory.
        let small = device(GpuKind::Gpu, 2, 1000, 2 << 30, Some(40.0));
        let big = device(GpuKind::Gpu, 20, 1500, 8 << 30, Some(4000.0));
        let npu = device(GpuKind::Accelerator, 4, 800, 1 << 30, None);
        let mixed = GpuCapacity::from_devices(&[pocl, small, big, npu], 1.0).unwrap();
        assert_eq!(mixed.devices, 3);
        assert!((mixed.speed - 4000.0 / REFERENCE_CORE_GFLOPS).abs() < 1e-9);
        assert!((mixed.cpu_device_speed - 96.0 / REFERENCE_CORE_GFLOPS).abs() < 1e-9);
        assert_eq!(mixed.memory_bytes, 32 << 30);
        assert_eq!(mixed.max_alloc_bytes, 8 << 30);
        assert!(mixed.kinds.gpu && mixed.kinds.cpu && mixed.kinds.accelerator);
        assert!(!mixed.kinds.other && !mixed.has_kind(Some(GpuKind::Other)));

        let lone =
            GpuCapacity::from_devices(&[device(GpuKind::Gpu, 1, 921, 4 << 30, None)], 0.3).unwrap();
        assert_eq!(lone.max_alloc_bytes, 1 << 30);
        assert!(!lone.fp64);
        let tiny =
            GpuCapacity::from_devices(&[device(GpuKind::Other, 1, 500, 64 << 20, None)], 1.0)
                .unwrap();
        assert_eq!(tiny.max_alloc_bytes, 64 << 20, "never more than the memory");
        assert!(tiny.has_kind(Some(GpuKind::Other)));
    }

    #[test]
    fn from_reports_and_the_simulator_share_from_devices() {
        let mut capability = capability("x86_64");
        let mut pocl = device(GpuKind::Cpu, 4, 1500, 4 << 30, None);
        pocl.gflops = Some(20.0);
        capability.gpus.push(pocl.clone()).unwrap();
        let view = NodeView::from_reports(&capability, None, true);
        assert_eq!(
            view.gpu,
            GpuCapacity::from_devices(&[pocl], view.cpu_speed),
            "the same summary a simulated node gets from its device list"
        );
    }

    #[test]
    fn task_class_parses_and_prints() {
        for class in TaskClass::ALL {
            assert_eq!(class.as_str().parse::<TaskClass>().unwrap(), class);
            assert_eq!(
                serde_json::to_string(&class).unwrap(),
                format!("\"{class}\"")
            );
        }
        assert_eq!(" GPU ".parse::<TaskClass>().unwrap(), TaskClass::Gpu);
        assert!("fpga".parse::<TaskClass>().is_err());
    }
}
