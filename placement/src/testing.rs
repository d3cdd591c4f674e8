//! Small builders for nodes and tasks, shared by this crate's tests, its property
//! tests and its examples. Not for production views: those come from
//! [`NodeView::from_reports`] or the simulator's device profiles.

use starling_proto::{NodeId, Runtime};

use crate::model::{
    Constraints, Demand, DeviceKinds, EnergyState, GpuCapacity, NetworkLink, NodeLoad, NodeView,
    PendingTask, PowerLevelModel, TaskClass,
};

/// An idle x86_64 node running wasm with 8 GiB, two power levels (half speed at
/// 10 W busy, full speed at 26 W busy), a 100 Mbit/s link and a 500 MB/s disk.
/// A name that is not a valid node id falls back to `node`.
pub fn node(name: &str, cores: f64, speed: f64) -> NodeView {
    let memory_bytes = 8 << 30;
    #[allow(clippy::expect_used)]
    let id = NodeId::new(name)
        .or_else(|_| NodeId::new("node"))
        .expect("\"node\" is a valid node id");
    NodeView {
        id,
        online: true,
        arch: "x86_64".to_owned(),
        runtimes: vec![Runtime::Wasm],
        labels: Vec::new(),
        cpu_cores: cores,
        cpu_speed: speed,
        memory_bytes,
        gpu: None,
        io_mbps: 500.0,
        network: NetworkLink {
            bandwidth_mbps: 100.0,
            rtt_ms: 5.0,
            loss: 0.0,
        },
        power_levels: vec![
            PowerLevelModel {
                speed_factor: 0.5,
                idle_watts: 5.0,
                active_watts: 10.0,
            },
            PowerLevelModel {
                speed_factor: 1.0,
                idle_watts: 6.0,
                active_watts: 26.0,
            },
        ],
        energy: EnergyState {
            budget_joules: None,
            used_joules: 0.0,
        },
        load: NodeLoad {
            free_cpu_cores: cores,
            free_memory_bytes: memory_bytes,
            free_io_mbps: 500.0,
            queued_tasks: 0,
            backlog_cpu_s: 0.0,
            backlog_gpu_s: 0.0,
            earliest_slack_ms: None,
            committed_joules: 0.0,
            power_level: 1,
        },
        corrections: Default::default(),
    }
}

/// A wasm task of one reference second, one core, 64 MiB, no deadline, with 1 MB in
/// and 10 kB out.
pub fn task(key: u64, class: TaskClass) -> PendingTask {
    PendingTask {
        key,
        class,
        demand: Demand {
            cpu_cores: 1.0,
            memory_bytes: 64 << 20,
            gpu: false,
            io_mbps: 10.0,
            gpu_memory_bytes: 0,
        },
        work: 1.0,
        input_bytes: 1_000_000,
        output_bytes: 10_000,
        deadline_ms: None,
        priority: 0,
        submitted_ms: 0,
        constraints: Constraints {
            runtime: Runtime::Wasm,
            arch: None,
            labels: Vec::new(),
            device_kind: None,
            fp64: false,
        },
        artifact: 0,
    }
}

/// One GPU-type OpenCL device of `speed` reference cores and `memory_bytes`,
/// double precision included, with a quarter of its memory as the largest buffer.
pub fn gpu_capacity(speed: f64, memory_bytes: u64) -> GpuCapacity {
    GpuCapacity {
        devices: 1,
        speed,
        cpu_device_speed: 0.0,
        memory_bytes,
        max_alloc_bytes: memory_bytes / 4,
        kinds: DeviceKinds {
            gpu: true,
            ..DeviceKinds::default()
        },
        fp64: true,
    }
}
