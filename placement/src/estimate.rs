//! Estimates every policy shares: transfer time, queueing delay, execution time at
//! a power level, energy, and the compatibility of a task with a node (hard
//! filters, then a soft fit).
//!
//! The simulator executes tasks with the same formulas, so an estimate is exact
//! there except for what the engine cannot know in advance: the link changing
//! while data moves (mobility), and the order in which a node's queue drains.

use core::fmt;

use serde::{Deserialize, Serialize};

use starling_proto::{GpuKind, Runtime};

use crate::model::{ClusterView, NodeLoad, NodeView, PendingTask, TaskClass, REFERENCE_IO_MBPS};

/// Share of an I/O-bound task's reference time spent waiting on storage; the rest
/// is CPU work. Storage does not speed up with the CPU's power level.
pub const IO_STORAGE_SHARE: f64 = 0.7;

/// Whether the task needs an OpenCL device: an OpenCL kernel, or a task that
/// declares it needs one.
pub fn needs_device(task: &PendingTask) -> bool {
    task.demand.gpu || task.constraints.runtime == Runtime::Opencl
}

/// What runs a task on a node.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Runner {
    /// CPU lanes at the cores' speed.
    Cores,
    /// An OpenCL device other than the host CPU (GPU, accelerator): a lane of its
    /// own, at the device's speed.
    Device {
        /// Speed relative to one reference core.
        speed: f64,
    },
    /// The host CPU exposed as an OpenCL device (PoCL): every core of the node,
    /// at the device's speed.
    CpuDevice {
        /// Speed of all the cores together, relative to one reference core.
        speed: f64,
    },
}

/// Where the task runs on the node. An OpenCL task runs on a device of the kind
/// it wants, the fastest one when any kind will do; a GPU-class task that needs
/// no device uses a non-CPU device when the node has one (a device kernel with a
/// CPU fallback) and the cores otherwise; everything else runs on the cores. A
/// task the node cannot run (see [`check_static`]) is answered `Cores`.
pub fn runner(node: &NodeView, task: &PendingTask) -> Runner {
    let Some(gpu) = node.gpu else {
        return Runner::Cores;
    };
    let device = (gpu.devices > 0).then_some(Runner::Device { speed: gpu.speed });
    let cpu_device = gpu.kinds.cpu.then_some(Runner::CpuDevice {
        speed: gpu.cpu_device_speed,
    });
    if !needs_device(task) {
        return match (task.class, device) {
            (TaskClass::Gpu, Some(device)) => device,
            _ => Runner::Cores,
        };
    }
    let chosen = match task.constraints.device_kind {
        Some(GpuKind::Cpu) => cpu_device,
        Some(kind) if gpu.kinds.contains(kind) => device,
        Some(_) => None,
        None => match (device, cpu_device) {
            (Some(_), Some(cpu_device)) if gpu.cpu_device_speed > gpu.speed => Some(cpu_device),
            (Some(device), _) => Some(device),
            (None, cpu_device) => cpu_device,
        },
    };
    chosen.unwrap_or(Runner::Cores)
}

/// Lanes (cores) a task occupies on a node's CPU: `ceil(cpu_cores)`, at least one,
/// at most the node's cores; every core for a kernel on the CPU's OpenCL device.
pub fn lanes(node: &NodeView, task: &PendingTask) -> u32 {
    let cores = node.cpu_cores.floor().max(1.0);
    let wanted = match runner(node, task) {
        Runner::CpuDevice { .. } => cores,
        _ => f64::from(task.demand.cpu_cores).ceil().max(1.0),
    };
    // Both are small positive whole numbers, so the cast cannot truncate.
    wanted.min(cores) as u32
}

/// Whether the task runs on one of the node's device lanes (a GPU or
/// accelerator) rather than on its CPU lanes. A kernel on the CPU's OpenCL
/// device runs on the CPU lanes.
pub fn runs_on_gpu(node: &NodeView, task: &PendingTask) -> bool {
    matches!(runner(node, task), Runner::Device { .. })
}

/// Seconds to move `bytes` over the node's link: one round trip to set up, then
/// the bytes at the bandwidth left after retransmitting lost packets.
pub fn transfer_s(node: &NodeView, bytes: u64) -> f64 {
    let link = node.network;
    let goodput_bps = link.bandwidth_mbps.max(0.001) * 1e6 * (1.0 - link.loss.clamp(0.0, 0.95));
    link.rtt_ms.max(0.0) / 1000.0 + (bytes as f64 * 8.0) / goodput_bps
}

/// Seconds a task would wait behind the node's placed work (fluid approximation:
/// the backlog spread over the node's lanes).
pub fn queue_wait_s(node: &NodeView, load: &NodeLoad, task: &PendingTask) -> f64 {
    if runs_on_gpu(node, task) {
        load.backlog_gpu_s / f64::from(node.gpu_devices().max(1))
    } else {
        load.backlog_cpu_s / node.cpu_cores.max(1.0)
    }
}

/// Seconds the task executes on the node at a power level: as modelled
/// ([`modelled_execution_s`]), times what the node has learned of such
/// work's run times ([`crate::model::correction`]).
pub fn execution_s(node: &NodeView, task: &PendingTask, power_level: u8) -> f64 {
    modelled_execution_s(node, task, power_level) * node.corrections.factor(task)
}

/// Seconds the task executes on the node at a power level by the model
/// alone: the node's declared speeds and the task's declared work.
pub fn modelled_execution_s(node: &NodeView, task: &PendingTask, power_level: u8) -> f64 {
    let factor = node.power_level(power_level).speed_factor.max(0.01);
    let work = task.work.max(0.0);
    let cpu_rate = node.cpu_speed.max(0.01) * factor;
    match (runner(node, task), task.class) {
        (Runner::Device { speed } | Runner::CpuDevice { speed }, _) => {
            work / (speed.max(0.01) * factor)
        }
        (Runner::Cores, TaskClass::Cpu | TaskClass::Gpu) => {
            work / (cpu_rate * f64::from(lanes(node, task)))
        }
        (Runner::Cores, TaskClass::Io) => {
            let storage = work * IO_STORAGE_SHARE * REFERENCE_IO_MBPS / node.io_mbps.max(0.1);
            let compute = work * (1.0 - IO_STORAGE_SHARE) / cpu_rate;
            storage + compute
        }
    }
}

/// Fraction of the node's dynamic power a running task accounts for: its lanes
/// out of the cores (all of them for a kernel on the CPU's OpenCL device), or
/// the whole board shared by the devices for a task on a device lane (a GPU
/// dominates the board's draw on Jetson-class devices).
pub fn power_share(node: &NodeView, task: &PendingTask) -> f64 {
    if runs_on_gpu(node, task) {
        1.0 / f64::from(node.gpu_devices().max(1))
    } else {
        f64::from(lanes(node, task)) / node.cpu_cores.max(1.0)
    }
}

/// Dynamic energy the task costs, joules: the power above idle at its level, times
/// its share of the node, times its run time. Idle power is paid whatever the
/// placement, so it is left out of what a decision can change.
pub fn energy_joules(node: &NodeView, task: &PendingTask, power_level: u8) -> f64 {
    let level = node.power_level(power_level);
    let dynamic_watts = (level.active_watts - level.idle_watts).max(0.0);
    dynamic_watts * power_share(node, task) * execution_s(node, task, power_level)
}

/// Estimated finish time, ms on the view's clock: the input transfer overlaps the
/// wait in the queue, then the task runs, then the output travels back.
pub fn finish_ms(
    node: &NodeView,
    load: &NodeLoad,
    task: &PendingTask,
    power_level: u8,
    now_ms: f64,
) -> f64 {
    let start_s = transfer_s(node, task.input_bytes).max(queue_wait_s(node, load, task));
    let total_s =
        start_s + execution_s(node, task, power_level) + transfer_s(node, task.output_bytes);
    now_ms + total_s * 1000.0
}

/// Why a node cannot take a task (a hard filter that failed).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Incompatible {
    /// The node is offline.
    Offline,
    /// The node lacks the task's runtime.
    Runtime,
    /// The node's architecture differs from the one required.
    Arch,
    /// The node lacks a required label.
    Labels,
    /// The task needs an OpenCL device and the node has none.
    Gpu,
    /// The node has no OpenCL device of the type the task wants.
    GpuKind,
    /// No OpenCL device of the node has the memory the task's buffers need.
    GpuMemory,
    /// The task needs double precision and no OpenCL device of the node has it.
    Fp64,
    /// The node has too little unreserved memory.
    Memory,
    /// The node's energy budget cannot pay for the task.
    EnergyBudget,
}

impl Incompatible {
    /// Every reason, in the order the filters run.
    pub const ALL: [Incompatible; 10] = [
        Incompatible::Offline,
        Incompatible::Runtime,
        Incompatible::Arch,
        Incompatible::Labels,
        Incompatible::Gpu,
        Incompatible::GpuKind,
        Incompatible::GpuMemory,
        Incompatible::Fp64,
        Incompatible::Memory,
        Incompatible::EnergyBudget,
    ];
}

impl fmt::Display for Incompatible {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Incompatible::Offline => "node offline",
            Incompatible::Runtime => "runtime not offered",
            Incompatible::Arch => "architecture differs",
            Incompatible::Labels => "required label missing",
            Incompatible::Gpu => "no OpenCL device",
            Incompatible::GpuKind => "no OpenCL device of the wanted type",
            Incompatible::GpuMemory => "not enough device memory",
            Incompatible::Fp64 => "no double-precision OpenCL device",
            Incompatible::Memory => "not enough free memory",
            Incompatible::EnergyBudget => "energy budget exhausted",
        })
    }
}

/// The static hard filters: those that do not depend on the node's load.
pub fn check_static(node: &NodeView, task: &PendingTask) -> Result<(), Incompatible> {
    if !node.online {
        return Err(Incompatible::Offline);
    }
    check_capable(node, task)
}

/// The static hard filters but the node's being online: whether the node,
/// idle and online, could take the task at all (runtime, architecture,
/// labels, OpenCL device, memory).
pub fn check_capable(node: &NodeView, task: &PendingTask) -> Result<(), Incompatible> {
    if !node.runtimes.contains(&task.constraints.runtime) {
        return Err(Incompatible::Runtime);
    }
    if let Some(arch) = &task.constraints.arch {
        if !arch.eq_ignore_ascii_case(&node.arch) {
            return Err(Incompatible::Arch);
        }
    }
    if !task
        .constraints
        .labels
        .iter()
        .all(|wanted| node.labels.contains(wanted))
    {
        return Err(Incompatible::Labels);
    }
    if needs_device(task) {
        // A single buffer larger than the device allows is the agent's to refuse:
        // the task's demand is the buffers' total.
        let Some(gpu) = node.gpu else {
            return Err(Incompatible::Gpu);
        };
        if !gpu.has_kind(task.constraints.device_kind) {
            return Err(Incompatible::GpuKind);
        }
        if task.demand.gpu_memory_bytes > gpu.memory_bytes {
            return Err(Incompatible::GpuMemory);
        }
        if task.constraints.fp64 && !gpu.fp64 {
            return Err(Incompatible::Fp64);
        }
    }
    if task.demand.memory_bytes > node.memory_bytes {
        return Err(Incompatible::Memory);
    }
    Ok(())
}

/// The load-dependent hard filters at a power level: unreserved memory, and the
/// energy budget.
pub fn check_load(
    node: &NodeView,
    load: &NodeLoad,
    task: &PendingTask,
    power_level: u8,
) -> Result<(), Incompatible> {
    if task.demand.memory_bytes > load.free_memory_bytes {
        return Err(Incompatible::Memory);
    }
    if let Some(budget) = node.energy.budget_joules {
        let needed = energy_joules(node, task, power_level);
        if node.energy.used_joules + load.committed_joules + needed > budget {
            return Err(Incompatible::EnergyBudget);
        }
    }
    Ok(())
}

/// Every hard filter: whether the node may take the task at this level now.
pub fn check(
    node: &NodeView,
    load: &NodeLoad,
    task: &PendingTask,
    power_level: u8,
) -> Result<(), Incompatible> {
    check_static(node, task)?;
    check_load(node, load, task, power_level)
}

/// Soft fit of a node to a task, 0..1: how strong the node is in the task's
/// dominant dimension (speed of that resource, saturating), used to break ties in
/// favour of the right kind of device.
pub fn fit(node: &NodeView, task: &PendingTask) -> f64 {
    let strength = match (runner(node, task), task.class) {
        (Runner::Device { speed } | Runner::CpuDevice { speed }, _) => speed,
        (Runner::Cores, TaskClass::Cpu) => node.cpu_speed * f64::from(lanes(node, task)),
        (Runner::Cores, TaskClass::Gpu) => node.cpu_speed * 0.25,
        (Runner::Cores, TaskClass::Io) => node.io_mbps / REFERENCE_IO_MBPS,
    };
    strength / (strength + 1.0)
}

/// How many example nodes an explanation names per filter reason: enough to
/// go and look, and bounded, so a 10 000-node fleet's explanation stays small.
pub const FILTER_EXAMPLES: usize = 5;

/// A count of nodes and the first few of them ([`FILTER_EXAMPLES`]), as
/// indexes into the view: a fixed-size value, so counting a node never
/// allocates.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NodeSample {
    count: u32,
    first: [u32; FILTER_EXAMPLES],
}

impl NodeSample {
    /// Counts one node, keeping its index while fewer than
    /// [`FILTER_EXAMPLES`] are kept.
    pub fn push(&mut self, node: usize) {
        if let (Some(slot), Ok(node)) =
            (self.first.get_mut(self.count as usize), u32::try_from(node))
        {
            *slot = node;
        }
        self.count = self.count.saturating_add(1);
    }

    /// Adds another sample: its count, and its examples while room is left.
    pub fn merge(&mut self, other: &NodeSample) {
        for node in other.examples() {
            if let Some(slot) = self.first.get_mut(self.count as usize) {
                *slot = *node;
            }
            self.count = self.count.saturating_add(1);
        }
        let rest = other.count.saturating_sub(other.examples().len() as u32);
        self.count = self.count.saturating_add(rest);
    }

    /// How many nodes were counted.
    pub fn count(&self) -> u32 {
        self.count
    }

    /// The first nodes counted (at most [`FILTER_EXAMPLES`]), as indexes
    /// into the view, in the order they were counted.
    pub fn examples(&self) -> &[u32] {
        let kept = (self.count as usize).min(FILTER_EXAMPLES);
        self.first.get(..kept).unwrap_or(&[])
    }
}

impl Incompatible {
    /// The reason's position in [`Incompatible::ALL`].
    fn position(self) -> usize {
        // Fieldless and declared in the order of `ALL` (a test checks it).
        self as usize
    }

    /// A stable code for the reason, as explanations and the REST API
    /// carry it (the same words as its serde form).
    pub fn code(self) -> &'static str {
        match self {
            Incompatible::Offline => "offline",
            Incompatible::Runtime => "runtime",
            Incompatible::Arch => "arch",
            Incompatible::Labels => "labels",
            Incompatible::Gpu => "gpu",
            Incompatible::GpuKind => "gpu_kind",
            Incompatible::GpuMemory => "gpu_memory",
            Incompatible::Fp64 => "fp64",
            Incompatible::Memory => "memory",
            Incompatible::EnergyBudget => "energy_budget",
        }
    }
}

/// Why the nodes a policy looked at for one task were filtered out, with the
/// first few of each reason, and how many passed every filter: what an
/// explanation says about the nodes that were not chosen. Each node is meant
/// to be counted once per task (a policy that tries several power levels
/// counts the node, not the levels). Fixed-size: counting never allocates.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FilterTally {
    filtered: [NodeSample; Incompatible::ALL.len()],
    passed: u32,
}

impl FilterTally {
    /// Counts `node` (an index into the view) as filtered out for `reason`.
    // Kept out of line so that the evaluation it is called from stays small
    // enough to be inlined into the policies' scans, estimates included, as
    // before the tally kept examples (the full-scan baselines decided 25%
    // slower otherwise; `cargo bench -p starling-placement --bench decide`).
    #[inline(never)]
    pub fn add(&mut self, reason: Incompatible, node: usize) {
        if let Some(sample) = self.filtered.get_mut(reason.position()) {
            sample.push(node);
        }
    }

    /// Counts a whole sample of nodes filtered out for `reason` (a hardware
    /// group whose profile fails a static filter, the offline nodes).
    pub fn add_sample(&mut self, reason: Incompatible, nodes: &NodeSample) {
        if let Some(sample) = self.filtered.get_mut(reason.position()) {
            sample.merge(nodes);
        }
    }

    /// Counts a node that passed every filter.
    pub fn pass(&mut self) {
        self.passed = self.passed.saturating_add(1);
    }

    /// Nodes filtered out for `reason`, with the first few of them.
    pub fn sample(&self, reason: Incompatible) -> NodeSample {
        self.filtered
            .get(reason.position())
            .copied()
            .unwrap_or_default()
    }

    /// Nodes filtered out, whatever the reason.
    pub fn filtered(&self) -> u32 {
        self.filtered
            .iter()
            .fold(0_u32, |sum, sample| sum.saturating_add(sample.count()))
    }

    /// Nodes looked at: filtered out or passed.
    pub fn considered(&self) -> u32 {
        self.filtered().saturating_add(self.passed)
    }

    /// The rejections, most frequent first, as text for people.
    pub fn describe(&self) -> String {
        let mut reasons: Vec<(u32, Incompatible)> = Incompatible::ALL
            .iter()
            .map(|reason| (self.sample(*reason).count(), *reason))
            .filter(|(count, _)| *count > 0)
            .collect();
        reasons.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
        if reasons.is_empty() {
            return "no nodes".to_owned();
        }
        reasons
            .iter()
            .map(|(count, reason)| format!("{count} × {reason}"))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// Accounting a placement is an estimate of what it will cost the node, so
/// it lives here beside the other estimates; the model stays plain data.
impl NodeLoad {
    /// Accounts one task placed on `node` at `power_level` finishing at `finish_ms`.
    pub fn commit(
        &mut self,
        node: &NodeView,
        task: &PendingTask,
        power_level: u8,
        now_ms: f64,
        finish_ms: f64,
    ) {
        let lanes = lanes(node, task);
        self.free_cpu_cores = (self.free_cpu_cores - f64::from(task.demand.cpu_cores)).max(0.0);
        self.free_memory_bytes = self
            .free_memory_bytes
            .saturating_sub(task.demand.memory_bytes);
        self.free_io_mbps = (self.free_io_mbps - f64::from(task.demand.io_mbps)).max(0.0);
        self.queued_tasks = self.queued_tasks.saturating_add(1);
        let run_s = execution_s(node, task, power_level);
        if runs_on_gpu(node, task) {
            self.backlog_gpu_s += run_s;
        } else {
            self.backlog_cpu_s += run_s * f64::from(lanes);
        }
        if let Some(deadline) = task.deadline_ms {
            let slack = deadline as f64 - finish_ms;
            self.earliest_slack_ms = Some(self.earliest_slack_ms.map_or(slack, |s| s.min(slack)));
        }
        let _ = now_ms;
        self.committed_joules += energy_joules(node, task, power_level);
    }
}

impl ClusterView {
    /// Accounts a task placed (or already running) on a node: reserves its demand,
    /// adds its work to the node's queue. An index out of range changes nothing.
    pub fn commit(&mut self, node: usize, task: &PendingTask, power_level: u8) {
        let now_ms = self.now_ms as f64;
        if let Some(view) = self.nodes.get(node) {
            let finish_ms = finish_ms(view, &view.load, task, power_level, now_ms);
            let mut load = view.load;
            load.commit(view, task, power_level, now_ms, finish_ms);
            if let Some(view) = self.nodes.get_mut(node) {
                view.load = load;
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use crate::model::DeviceKinds;
    use crate::testing::{gpu_capacity, node, task};

    #[test]
    fn transfer_time_is_rtt_plus_bytes_over_goodput() {
        let mut n = node("a", 4.0, 1.0);
        n.network.bandwidth_mbps = 80.0;
        n.network.rtt_ms = 20.0;
        n.network.loss = 0.0;
        // 10 MB at 80 Mbit/s is 1 s, plus 20 ms.
        assert!((transfer_s(&n, 10_000_000) - 1.02).abs() < 1e-9);
        n.network.loss = 0.5;
        assert!((transfer_s(&n, 10_000_000) - 2.02).abs() < 1e-9);
    }

    #[test]
    fn execution_time_scales_with_speed_lanes_and_power_level() {
        let mut n = node("a", 4.0, 0.5);
        n.power_levels[0].speed_factor = 0.25;
        let mut t = task(1, TaskClass::Cpu);
        t.work = 2.0;
        t.demand.cpu_cores = 1.0;
        assert!((execution_s(&n, &t, 1) - 4.0).abs() < 1e-9);
        assert!((execution_s(&n, &t, 0) - 16.0).abs() < 1e-9);
        t.demand.cpu_cores = 2.0;
        assert!((execution_s(&n, &t, 1) - 2.0).abs() < 1e-9);
        // More lanes than cores are capped at the cores.
        t.demand.cpu_cores = 16.0;
        assert!((execution_s(&n, &t, 1) - 1.0).abs() < 1e-9);
    }

    #[test]
    fn gpu_tasks_use_the_gpu_and_io_tasks_the_disk() {
        let mut n = node("a", 4.0, 1.0);
        let mut t = task(1, TaskClass::Gpu);
        t.work = 6.0;
        assert!(
            (execution_s(&n, &t, 1) - 6.0).abs() < 1e-9,
            "no GPU: one core"
        );
        n.gpu = Some(gpu_capacity(3.0, 1 << 30));
        assert!((execution_s(&n, &t, 1) - 2.0).abs() < 1e-9);
        let mut io = task(2, TaskClass::Io);
        io.work = 1.0;
        n.io_mbps = REFERENCE_IO_MBPS / 2.0;
        // 0.7 s of storage at half the reference rate, 0.3 s of CPU at speed 1.
        assert!((execution_s(&n, &io, 1) - 1.7).abs() < 1e-9);
    }

    #[test]
    fn energy_is_dynamic_power_times_share_times_time() {
        let mut n = node("a", 4.0, 1.0);
        n.power_levels[1].idle_watts = 6.0;
        n.power_levels[1].active_watts = 26.0;
        let mut t = task(1, TaskClass::Cpu);
        t.work = 3.0;
        t.demand.cpu_cores = 1.0;
        // 20 W dynamic × 1/4 of the cores × 3 s.
        assert!((energy_joules(&n, &t, 1) - 15.0).abs() < 1e-9);
        // The lower level runs slower but draws far less: cheaper in joules.
        assert!(energy_joules(&n, &t, 0) < energy_joules(&n, &t, 1));
    }

    #[test]
    fn hard_filters_name_the_failing_constraint() {
        let mut n = node("a", 4.0, 1.0);
        let mut t = task(1, TaskClass::Cpu);
        assert_eq!(check(&n, &n.load, &t, 0), Ok(()));
        t.demand.gpu = true;
        assert_eq!(check(&n, &n.load, &t, 0), Err(Incompatible::Gpu));
        t.demand.gpu = false;
        t.demand.memory_bytes = n.load.free_memory_bytes + 1;
        assert_eq!(check(&n, &n.load, &t, 0), Err(Incompatible::Memory));
        t.demand.memory_bytes = 1;
        t.constraints.arch = Some("riscv64".into());
        assert_eq!(check(&n, &n.load, &t, 0), Err(Incompatible::Arch));
        t.constraints.arch = None;
        n.online = false;
        assert_eq!(check(&n, &n.load, &t, 0), Err(Incompatible::Offline));
    }

    /// A node whose only OpenCL device is its CPU through PoCL, 4 GiB, no fp64.
    fn pocl_node() -> NodeView {
        let mut n = node("pocl", 4.0, 1.0);
        n.runtimes.push(Runtime::Opencl);
        let mut gpu = gpu_capacity(0.0, 4 << 30);
        gpu.devices = 0;
        gpu.cpu_device_speed = 3.5;
        gpu.kinds = DeviceKinds {
            cpu: true,
            ..DeviceKinds::default()
        };
        gpu.fp64 = false;
        n.gpu = Some(gpu);
        n
    }

    /// A node with one 2 GiB GPU of speed 20, double precision included.
    fn gpu_node() -> NodeView {
        let mut n = node("gpu", 4.0, 0.3);
        n.runtimes.push(Runtime::Opencl);
        n.gpu = Some(gpu_capacity(20.0, 2 << 30));
        n
    }

    fn kernel(device_kind: Option<GpuKind>, gpu_memory_bytes: u64) -> PendingTask {
        let mut t = task(1, TaskClass::Gpu);
        t.constraints.runtime = Runtime::Opencl;
        t.constraints.device_kind = device_kind;
        t.demand.gpu_memory_bytes = gpu_memory_bytes;
        t
    }

    #[test]
    fn a_gpu_kernel_is_refused_by_a_cpu_opencl_node_and_taken_by_a_gpu_node() {
        let t = kernel(Some(GpuKind::Gpu), 256 << 20);
        assert_eq!(check_static(&pocl_node(), &t), Err(Incompatible::GpuKind));
        assert_eq!(check_static(&gpu_node(), &t), Ok(()));
        assert_eq!(
            Incompatible::GpuKind.to_string(),
            "no OpenCL device of the wanted type"
        );
        // And the other way round: a kernel for a CPU device.
        let cpu_kernel = kernel(Some(GpuKind::Cpu), 256 << 20);
        assert_eq!(check_static(&pocl_node(), &cpu_kernel), Ok(()));
        assert_eq!(
            check_static(&gpu_node(), &cpu_kernel),
            Err(Incompatible::GpuKind)
        );
    }

    #[test]
    fn any_kind_kernel_runs_on_a_pocl_cpu_device_with_every_core() {
        let n = pocl_node();
        let mut t = kernel(None, 256 << 20);
        t.work = 7.0;
        assert_eq!(check(&n, &n.load, &t, 1), Ok(()));
        assert_eq!(runner(&n, &t), Runner::CpuDevice { speed: 3.5 });
        assert!(!runs_on_gpu(&n, &t), "PoCL runs on the CPU lanes");
        assert_eq!(lanes(&n, &t), 4, "PoCL keeps every core busy");
        // At the device's speed, not the cores': 7 / 3.5.
        assert!((execution_s(&n, &t, 1) - 2.0).abs() < 1e-9);
        assert!((power_share(&n, &t) - 1.0).abs() < 1e-9);
        // A GPU-class task that needs no device runs on one core there.
        let mut wasm = task(2, TaskClass::Gpu);
        wasm.work = 7.0;
        assert_eq!(runner(&n, &wasm), Runner::Cores);
        assert!((execution_s(&n, &wasm, 1) - 7.0).abs() < 1e-9);
    }

    #[test]
    fn a_kernel_runs_on_the_gpu_lane_at_the_gpu_speed() {
        let n = gpu_node();
        let mut t = kernel(None, 256 << 20);
        t.class = TaskClass::Cpu;
        t.work = 10.0;
        assert!(
            runs_on_gpu(&n, &t),
            "an OpenCL task runs on the device whatever its class"
        );
        assert!((execution_s(&n, &t, 1) - 0.5).abs() < 1e-9);
        assert_eq!(lanes(&n, &t), 1);
        // Both a GPU and PoCL: any kind goes to the faster device, and a kernel
        // for the CPU to the CPU device.
        let mut both = gpu_node();
        if let Some(gpu) = both.gpu.as_mut() {
            gpu.kinds.cpu = true;
            gpu.cpu_device_speed = 1.0;
        }
        assert_eq!(runner(&both, &t), Runner::Device { speed: 20.0 });
        t.constraints.device_kind = Some(GpuKind::Cpu);
        assert_eq!(runner(&both, &t), Runner::CpuDevice { speed: 1.0 });
    }

    #[test]
    fn device_memory_and_double_precision_are_hard_constraints() {
        let gpu = gpu_node();
        let mut t = kernel(None, (2 << 30) + 1);
        assert_eq!(check_static(&gpu, &t), Err(Incompatible::GpuMemory));
        assert_eq!(
            Incompatible::GpuMemory.to_string(),
            "not enough device memory"
        );
        t.demand.gpu_memory_bytes = 2 << 30;
        assert_eq!(check_static(&gpu, &t), Ok(()));
        t.constraints.fp64 = true;
        assert_eq!(check_static(&gpu, &t), Ok(()));
        assert_eq!(check_static(&pocl_node(), &t), Err(Incompatible::Fp64));
        // A node without any device says so first.
        let mut plain = node("plain", 4.0, 1.0);
        plain.runtimes.push(Runtime::Opencl);
        assert_eq!(check_static(&plain, &t), Err(Incompatible::Gpu));
        // `gpu: true` on a wasm task asks for a device the same way.
        let mut declared = task(3, TaskClass::Gpu);
        declared.demand.gpu = true;
        declared.constraints.device_kind = Some(GpuKind::Gpu);
        assert_eq!(
            check_static(&pocl_node(), &declared),
            Err(Incompatible::GpuKind)
        );
        // A task that needs no device ignores the device fields.
        declared.demand.gpu = false;
        declared.demand.gpu_memory_bytes = u64::MAX;
        assert_eq!(check_static(&pocl_node(), &declared), Ok(()));
    }

    #[test]
    fn the_tally_counts_every_reason_and_names_them() {
        let mut tally = FilterTally::default();
        for (count, reason) in Incompatible::ALL.iter().enumerate() {
            for node in 0..=count {
                tally.add(*reason, node);
            }
        }
        let text = tally.describe();
        assert!(text.starts_with("10 × energy budget exhausted, 9 × not enough free memory, 8 × no double-precision OpenCL device, 7 × not enough device memory, 6 × no OpenCL device of the wanted type"), "{text}");
        assert!(text.ends_with("1 × node offline"), "{text}");
    }

    #[test]
    fn reasons_sit_at_their_position_with_their_serde_code() {
        for (position, reason) in Incompatible::ALL.iter().enumerate() {
            assert_eq!(reason.position(), position, "{reason:?}");
            let serde = serde_json::to_value(reason).unwrap();
            assert_eq!(serde.as_str(), Some(reason.code()), "{reason:?}");
        }
    }

    #[test]
    fn the_tally_keeps_the_first_five_nodes_of_each_reason_and_counts_the_rest() {
        let mut tally = FilterTally::default();
        for node in 0..8 {
            tally.add(Incompatible::Memory, node);
        }
        tally.add(Incompatible::Arch, 42);
        tally.pass();
        tally.pass();
        let memory = tally.sample(Incompatible::Memory);
        assert_eq!(memory.count(), 8);
        assert_eq!(memory.examples(), &[0, 1, 2, 3, 4]);
        assert_eq!(tally.sample(Incompatible::Arch).examples(), &[42]);
        assert_eq!(tally.sample(Incompatible::Gpu).count(), 0);
        assert!(tally.sample(Incompatible::Gpu).examples().is_empty());
        assert_eq!((tally.filtered(), tally.considered()), (9, 11));
        // A bulk sample tops up the examples and adds its whole count.
        let mut group = NodeSample::default();
        for node in 100..107 {
            group.push(node);
        }
        tally.add_sample(Incompatible::Arch, &group);
        let arch = tally.sample(Incompatible::Arch);
        assert_eq!(arch.count(), 8);
        assert_eq!(arch.examples(), &[42, 100, 101, 102, 103]);
    }
}
