//! Property tests: on random clusters and queues, no policy's decision breaks a
//! hard constraint (online, runtime, arch, labels, OpenCL device type, device
//! memory and double precision, memory), every task gets exactly one decision,
//! and the simulator is deterministic for a seed.

use std::collections::HashMap;

use proptest::prelude::*;
use starling_placement::catalog::{policy_by_name, POLICY_NAMES};
use starling_placement::estimate;
use starling_placement::model::{DeviceKinds, PowerLevelModel};
use starling_placement::policy::Outcome;
use starling_placement::sim::{self, FakeStopwatch, LoadLevel, SimConfig};
use starling_placement::testing::{gpu_capacity, node, task};
use starling_placement::{ClusterView, NodeView, PendingTask, TaskClass};
use starling_proto::{GpuKind, Label, Runtime};

const ARCHES: [&str; 2] = ["x86_64", "aarch64"];

fn label(value: &str) -> Label {
    Label::new("zone", value).unwrap()
}

prop_compose! {
    fn arb_node(index: usize)(
        online in prop::bool::weighted(0.85),
        arch in 0..2usize,
        cores in 1..9u32,
        speed in 0.1..2.0f64,
        memory_gib in 1..9u64,
        used in 0.0..1.0f64,
        // OpenCL devices: (GPU, PoCL or both; memory in GiB; double precision).
        gpu in prop::option::of((0..3usize, 1..9u64, prop::bool::ANY)),
        opencl in prop::bool::ANY,
        zone in prop::option::of(0..2usize),
        backlog in 0.0..30.0f64,
        levels in 1..4usize,
        bandwidth in 1.0..1000.0f64,
    ) -> NodeView {
        let mut n = node(&format!("n{index}"), f64::from(cores), speed);
        n.online = online;
        n.arch = ARCHES[arch].to_owned();
        n.memory_bytes = memory_gib << 30;
        n.load.free_memory_bytes = ((n.memory_bytes as f64) * (1.0 - used)) as u64;
        n.load.backlog_cpu_s = backlog;
        n.network.bandwidth_mbps = bandwidth;
        if let Some((kinds, memory_gib, fp64)) = gpu {
            let mut capacity = gpu_capacity(3.0, memory_gib << 30);
            capacity.fp64 = fp64;
            if kinds > 0 {
                capacity.kinds.cpu = true;
                capacity.cpu_device_speed = f64::from(cores) * speed;
            }
            if kinds == 1 {
                capacity.devices = 0;
                capacity.speed = 0.0;
                capacity.kinds = DeviceKinds { cpu: true, ..DeviceKinds::default() };
            }
            n.gpu = Some(capacity);
        }
        n.runtimes = if opencl { vec![Runtime::Wasm, Runtime::Opencl] } else { vec![Runtime::Wasm] };
        n.labels = zone.map(|z| vec![label(["a", "b"][z])]).unwrap_or_default();
        n.power_levels = (0..levels)
            .map(|level| {
                let speed = (level + 1) as f64 / levels as f64;
                PowerLevelModel { speed_factor: speed, idle_watts: 2.0, active_watts: 2.0 + 10.0 * speed * speed }
            })
            .collect();
        n.load.power_level = (levels - 1) as u8;
        n
    }
}

prop_compose! {
    fn arb_task(key: u64)(
        class in 0..3usize,
        memory_mib in 1..3000u64,
        needs_gpu in prop::bool::weighted(0.2),
        opencl in prop::bool::weighted(0.2),
        // (wanted device type, device memory in MiB, double precision).
        device in (prop::option::of(0..4usize), 0..6000u64, prop::bool::weighted(0.2)),
        arch in prop::option::weighted(0.2, 0..2usize),
        zone in prop::option::weighted(0.2, 0..2usize),
        work in 0.01..20.0f64,
        cores in 0.5..4.0f32,
        deadline in prop::option::of(0..60_000u64),
        priority in 0..4u8,
    ) -> PendingTask {
        let mut t = task(key, [TaskClass::Cpu, TaskClass::Gpu, TaskClass::Io][class]);
        t.demand.memory_bytes = memory_mib << 20;
        t.demand.gpu = needs_gpu;
        t.demand.cpu_cores = cores;
        t.work = work;
        t.priority = priority;
        t.submitted_ms = 1_000;
        t.deadline_ms = deadline.map(|d| 1_000 + d);
        t.constraints.runtime = if opencl { Runtime::Opencl } else { Runtime::Wasm };
        let (kind, device_mib, fp64) = device;
        t.constraints.device_kind =
            kind.map(|k| [GpuKind::Gpu, GpuKind::Cpu, GpuKind::Accelerator, GpuKind::Other][k]);
        t.demand.gpu_memory_bytes = device_mib << 20;
        t.constraints.fp64 = fp64;
        t.constraints.arch = arch.map(|a| ARCHES[a].to_owned());
        t.constraints.labels = zone.map(|z| vec![label(["a", "b"][z])]).unwrap_or_default();
        t
    }
}

fn arb_case() -> impl Strategy<Value = (ClusterView, Vec<PendingTask>)> {
    (1..12usize, 0..14usize).prop_flat_map(|(nodes, tasks)| {
        let nodes: Vec<_> = (0..nodes).map(arb_node).collect();
        let tasks: Vec<_> = (0..tasks as u64).map(|key| arb_task(key * 7 + 3)).collect();
        (nodes, tasks).prop_map(|(nodes, tasks)| {
            (
                ClusterView {
                    now_ms: 1_000,
                    nodes,
                },
                tasks,
            )
        })
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    #[test]
    fn no_decision_breaks_a_hard_constraint((view, queue) in arb_case(), seed in any::<u64>()) {
        for name in POLICY_NAMES {
            let mut policy = policy_by_name(name, seed).unwrap();
            let decisions = policy.decide(&view, &queue);
            prop_assert_eq!(decisions.len(), queue.len(), "{}: one decision per task", name);
            let mut reserved: HashMap<usize, u64> = HashMap::new();
            for (decision, task) in decisions.iter().zip(&queue) {
                prop_assert_eq!(decision.task_key, task.key, "{}: decisions in queue order", name);
                prop_assert_eq!(&decision.explanation.policy, name);
                let Outcome::Place { node, power_level } = decision.outcome else { continue };
                prop_assert!(node < view.nodes.len(), "{}: node index in range", name);
                let n = &view.nodes[node];
                prop_assert!(n.online, "{}: placed on offline {}", name, n.id);
                prop_assert!(n.runtimes.contains(&task.constraints.runtime), "{}: runtime", name);
                if let Some(arch) = &task.constraints.arch {
                    prop_assert_eq!(arch, &n.arch, "{}: arch", name);
                }
                for wanted in &task.constraints.labels {
                    prop_assert!(n.labels.contains(wanted), "{}: label {}", name, wanted);
                }
                if estimate::needs_device(task) {
                    let gpu = n.gpu.as_ref();
                    prop_assert!(gpu.is_some(), "{}: OpenCL device", name);
                    let gpu = gpu.unwrap();
                    prop_assert!(gpu.has_kind(task.constraints.device_kind), "{}: device type", name);
                    prop_assert!(task.demand.gpu_memory_bytes <= gpu.memory_bytes, "{}: device memory", name);
                    prop_assert!(!task.constraints.fp64 || gpu.fp64, "{}: fp64", name);
                }
                prop_assert!(usize::from(power_level) < n.power_levels.len(), "{}: power level", name);
                let total = reserved.entry(node).or_default();
                *total += task.demand.memory_bytes;
                prop_assert!(*total <= n.load.free_memory_bytes,
                    "{}: memory on {}: {} reserved of {} free", name, n.id, total, n.load.free_memory_bytes);
            }
        }
    }

    #[test]
    fn a_task_some_node_can_take_alone_is_never_held_by_the_heuristic_when_nothing_else_competes(
        (view, queue) in arb_case()
    ) {
        for task in queue.iter().take(3) {
            let fits = view.nodes.iter().any(|n| {
                starling_placement::estimate::check(n, &n.load, task, n.top_power_level()).is_ok()
            });
            let decisions = policy_by_name("heuristic", 1).unwrap().decide(&view, std::slice::from_ref(task));
            let placed = matches!(decisions[0].outcome, Outcome::Place { .. });
            prop_assert_eq!(placed, fits, "{:?}", decisions[0].explanation);
        }
    }
}

fn small_config(seed: u64) -> SimConfig {
    SimConfig {
        seed,
        duration_s: 20.0,
        nodes_per_profile: 2,
        failure_rate_per_hour: 20.0,
        loads: vec![LoadLevel::low(), LoadLevel::high()],
        drain_s: 30.0,
        ..SimConfig::default()
    }
}

#[test]
fn the_same_seed_gives_the_same_report() {
    let run = |seed| {
        let mut stopwatch = FakeStopwatch {
            now_ns: 0,
            step_ns: 1_000,
        };
        sim::run(&small_config(seed), &mut stopwatch, &mut |_| {}).unwrap()
    };
    let first = run(7);
    let second = run(7);
    assert_eq!(first.to_json(), second.to_json());
    assert_eq!(first.to_markdown(), second.to_markdown());
    let other = run(8);
    assert_ne!(
        first.to_json(),
        other.to_json(),
        "a different seed changes the arrivals"
    );
    for load in &first.loads {
        assert!(load.tasks > 0);
        for row in &load.rows {
            assert_eq!(
                row.constraint_violations, 0,
                "{} broke a hard constraint",
                row.policy
            );
            assert_eq!(
                row.completed + row.failed + row.dropped,
                row.tasks,
                "{}: every task accounted",
                row.policy
            );
            assert!(row.on_time <= row.completed);
        }
    }
}
