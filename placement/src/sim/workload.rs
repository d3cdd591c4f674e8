//! What the simulated world does independently of the policy: the nodes, the
//! arrivals, the failures and the link changes. Generated once per load level from
//! the seed, then replayed identically for every policy.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use starling_proto::{GpuKind, Label, Runtime};

use crate::model::{Constraints, Demand, NetworkLink, NodeView, PendingTask, TaskClass};
use crate::sim::profiles::DeviceProfile;
use crate::sim::{LoadLevel, SimConfig};

const MB: u64 = 1_000_000;
const MIB: u64 = 1 << 20;

/// Mean work of each class, reference seconds.
const MEAN_WORK_CPU: f64 = 1.5;
const MEAN_WORK_GPU: f64 = 4.0;
const MEAN_WORK_IO: f64 = 1.0;
/// Share of the OpenCL tasks whose kernel wants a GPU-type device.
const GPU_ONLY_KERNEL_SHARE: f64 = 0.5;

/// The simulated world of one load level.
#[derive(Debug, Clone)]
pub(crate) struct Environment {
    /// The nodes as they start: idle, online.
    pub nodes: Vec<NodeView>,
    /// The arrivals, in time order; a task's key is its index.
    pub tasks: Vec<PendingTask>,
    /// Mean arrivals per second.
    pub arrival_rate_per_s: f64,
    /// Failures: (time in ms, node index), in time order.
    pub failures: Vec<(f64, usize)>,
    /// Link of every node at each mobility tick (tick k holds from k × period).
    pub links: Vec<Vec<NetworkLink>>,
    /// Milliseconds between mobility ticks.
    pub mobility_period_ms: f64,
    /// When the run ends at the latest, ms.
    pub end_ms: f64,
    /// Seed of the execution-noise hash.
    pub noise_seed: u64,
}

/// Work one node gets through per second, in reference seconds, when busy with
/// the given mix (a GPU counts for GPU-class work only).
fn capacity(profile: &DeviceProfile, mix_gpu_share: f64) -> f64 {
    let cpu = profile.cores * profile.core_speed;
    // A CPU exposed through OpenCL adds no capacity: it is the same cores.
    match profile.gpu().filter(|gpu| gpu.devices > 0) {
        Some(gpu) => cpu + f64::from(gpu.devices) * gpu.speed * mix_gpu_share.min(1.0) * 2.0,
        None => cpu,
    }
}

/// A standard normal draw (Box–Muller), for the simulator and the learners'
/// exploration noise.
pub fn normal(rng: &mut ChaCha8Rng) -> f64 {
    let u1: f64 = rng.random_range(f64::EPSILON..1.0);
    let u2: f64 = rng.random_range(0.0..1.0);
    (-2.0 * u1.ln()).sqrt() * (2.0 * core::f64::consts::PI * u2).cos()
}

fn exponential(rng: &mut ChaCha8Rng, rate: f64) -> f64 {
    let u: f64 = rng.random_range(f64::EPSILON..1.0);
    -u.ln() / rate
}

impl Environment {
    pub fn generate(config: &SimConfig, load_index: usize, load: &LoadLevel) -> Environment {
        let stream = |salt: u64| {
            ChaCha8Rng::seed_from_u64(
                config
                    .seed
                    .wrapping_mul(0x9e37_79b9_7f4a_7c15)
                    .wrapping_add((load_index as u64) << 32)
                    .wrapping_add(salt),
            )
        };
        let profiles = config.fleet.profiles();
        let mut nodes = Vec::new();
        let mut mobile = Vec::new();
        let mut base_links = Vec::new();
        let mut total_capacity = 0.0;
        let mix = config.task_mix;
        let mix_total = (mix.cpu + mix.gpu + mix.io).max(f64::EPSILON);
        for profile in &profiles {
            for number in 0..config.nodes_per_profile {
                let node = profile.node(number);
                base_links.push(node.network);
                nodes.push(node);
                mobile.push(profile.mobile);
                total_capacity += capacity(profile, mix.gpu / mix_total);
            }
        }
        let mean_work =
            (mix.cpu * MEAN_WORK_CPU + mix.gpu * MEAN_WORK_GPU + mix.io * MEAN_WORK_IO) / mix_total;
        let arrival_rate_per_s = load.utilisation * total_capacity / mean_work;
        let duration_ms = config.duration_s * 1000.0;
        let end_ms = duration_ms + config.drain_s * 1000.0;

        let mut arrivals = stream(1);
        // OpenCL details come from a stream of their own, so that the arrivals
        // themselves stay what they were before tasks had them.
        let mut kernels = stream(4);
        let mut tasks = Vec::new();
        let mut now_ms = 0.0;
        loop {
            now_ms += exponential(&mut arrivals, arrival_rate_per_s) * 1000.0;
            if now_ms >= duration_ms {
                break;
            }
            let key = tasks.len() as u64;
            tasks.push(random_task(
                &mut arrivals,
                &mut kernels,
                key,
                now_ms,
                mix,
                mix_total,
            ));
        }

        let mut failure_rng = stream(2);
        let mut failures = Vec::new();
        if config.failure_rate_per_hour > 0.0 {
            let rate_per_ms = config.failure_rate_per_hour / 3_600_000.0;
            for node in 0..nodes.len() {
                let mut at = exponential(&mut failure_rng, rate_per_ms);
                while at < end_ms {
                    failures.push((at, node));
                    at += config.repair_s * 1000.0 + exponential(&mut failure_rng, rate_per_ms);
                }
            }
            failures.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
        }

        // Mobility: a mean-reverting walk of each link's log-bandwidth and RTT;
        // mobile devices wander far (a phone-like Wi-Fi link), fixed ones barely.
        let mut mobility_rng = stream(3);
        let mobility_period_ms = config.mobility_period_s * 1000.0;
        let ticks = (end_ms / mobility_period_ms).ceil() as usize + 1;
        let mut drift = vec![0.0_f64; nodes.len()];
        let mut links = Vec::with_capacity(ticks);
        for _ in 0..ticks {
            let mut tick = Vec::with_capacity(nodes.len());
            for (index, base) in base_links.iter().enumerate() {
                let spread = if mobile[index] { 0.6 } else { 0.05 };
                drift[index] = 0.8 * drift[index] + spread * normal(&mut mobility_rng);
                let factor = drift[index].exp();
                let loss = if mobile[index] {
                    (0.02 * (-drift[index]).exp() - 0.01).clamp(0.0, 0.3)
                } else {
                    0.0
                };
                tick.push(NetworkLink {
                    bandwidth_mbps: (base.bandwidth_mbps * factor).max(1.0),
                    rtt_ms: base.rtt_ms / factor.clamp(0.05, 4.0),
                    loss,
                });
            }
            links.push(tick);
        }
        Environment {
            nodes,
            tasks,
            arrival_rate_per_s,
            failures,
            links,
            mobility_period_ms,
            end_ms,
            noise_seed: config.seed ^ 0x006e_6f69_7365,
        }
    }

    /// A multiplicative execution noise for one attempt of one task (lognormal,
    /// median 1, ~10% spread), the same whatever the policy.
    pub fn noise(&self, key: u64, attempt: u32) -> f64 {
        let mut x = self.noise_seed ^ key.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ u64::from(attempt);
        let mut next = || {
            // splitmix64
            x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = x;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^ (z >> 31)
        };
        let u1 = ((next() >> 11) as f64 + 1.0) / (1u64 << 53) as f64;
        let u2 = (next() >> 11) as f64 / (1u64 << 53) as f64;
        let z = (-2.0 * u1.ln()).sqrt() * (2.0 * core::f64::consts::PI * u2).cos();
        (0.1 * z).exp()
    }

    /// The link of a node at a time.
    pub fn link(&self, node: usize, at_ms: f64) -> Option<NetworkLink> {
        let tick = (at_ms / self.mobility_period_ms).floor().max(0.0) as usize;
        let tick = tick.min(self.links.len().saturating_sub(1));
        self.links.get(tick)?.get(node).copied()
    }
}

/// One random task of the mix; `kernels` draws what only OpenCL tasks have (the
/// device type they want, their buffers).
fn random_task(
    rng: &mut ChaCha8Rng,
    kernels: &mut ChaCha8Rng,
    key: u64,
    now_ms: f64,
    mix: crate::sim::TaskMix,
    mix_total: f64,
) -> PendingTask {
    let draw: f64 = rng.random_range(0.0..mix_total);
    let class = if draw < mix.cpu {
        TaskClass::Cpu
    } else if draw < mix.cpu + mix.gpu {
        TaskClass::Gpu
    } else {
        TaskClass::Io
    };
    let spread = (0.5 * normal(rng) - 0.125).exp();
    let mut runtime = Runtime::Wasm;
    let mut arch = None;
    let mut labels = Vec::new();
    let mut device_kind = None;
    let mut gpu_memory_bytes = 0;
    let (work, cpu_cores, memory_bytes, gpu, io_mbps, input_bytes) = match class {
        TaskClass::Cpu => {
            let cores = if rng.random_bool(0.3) { 2.0 } else { 1.0 };
            let pick: f64 = rng.random_range(0.0..1.0);
            if pick < 0.1 {
                arch = Some("aarch64".to_owned());
            } else if pick < 0.2 {
                arch = Some("x86_64".to_owned());
            }
            let memory = rng.random_range(1..=4) * 128 * MIB;
            let input = rng.random_range(MB / 10..2 * MB);
            (MEAN_WORK_CPU * spread, cores, memory, false, 5.0, input)
        }
        TaskClass::Gpu => {
            let needs_gpu = rng.random_bool(0.6);
            if needs_gpu {
                runtime = Runtime::Opencl;
                // Half the kernels are written for a GPU (work-group sizes, local
                // memory tuned for one); the rest run on any OpenCL device.
                if kernels.random_bool(GPU_ONLY_KERNEL_SHARE) {
                    device_kind = Some(GpuKind::Gpu);
                }
                gpu_memory_bytes = kernels.random_range(1..=8) * 64 * MIB;
            }
            let memory = rng.random_range(2..=4) * 256 * MIB;
            let input = rng.random_range(2 * MB..8 * MB);
            (MEAN_WORK_GPU * spread, 1.0, memory, needs_gpu, 5.0, input)
        }
        TaskClass::Io => {
            if rng.random_bool(0.3) {
                if let Ok(label) = Label::new("storage", "fast") {
                    labels.push(label);
                }
            }
            let input = rng.random_range(5 * MB..20 * MB);
            (MEAN_WORK_IO * spread, 1.0, 256 * MIB, false, 100.0, input)
        }
    };
    // The deadline allows a multiple of the task's time on a good device for its
    // class (the reference core, or a Jetson-class GPU), plus a second for transfers.
    let good_device_s = match class {
        TaskClass::Cpu => work / cpu_cores,
        TaskClass::Gpu => work / 3.0,
        TaskClass::Io => work,
    };
    let factor: f64 = rng.random_range(2.5..6.0);
    let deadline_ms = now_ms + (good_device_s * factor + 1.0) * 1000.0;
    let output_bytes = rng.random_range(10_000..MB);
    PendingTask {
        key,
        class,
        demand: Demand {
            cpu_cores: cpu_cores as f32,
            memory_bytes,
            gpu,
            io_mbps,
            gpu_memory_bytes,
        },
        work,
        input_bytes,
        output_bytes,
        deadline_ms: Some(deadline_ms.ceil() as u64),
        priority: rng.random_range(0..=2),
        submitted_ms: now_ms.floor() as u64,
        constraints: Constraints {
            runtime,
            arch,
            labels,
            device_kind,
            fp64: false,
        },
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use crate::estimate;

    #[test]
    fn opencl_tasks_carry_a_device_type_and_buffers_some_node_can_hold() {
        let config = SimConfig {
            duration_s: 60.0,
            nodes_per_profile: 1,
            ..SimConfig::default()
        };
        let env = Environment::generate(&config, 2, &LoadLevel::high());
        let (kernels, others): (Vec<_>, Vec<_>) = env
            .tasks
            .iter()
            .partition(|task| task.constraints.runtime == Runtime::Opencl);
        assert!(kernels.len() > 40, "{} kernels", kernels.len());
        let gpu_only = kernels
            .iter()
            .filter(|task| task.constraints.device_kind == Some(GpuKind::Gpu))
            .count();
        assert!(
            gpu_only > kernels.len() / 4 && gpu_only < kernels.len() * 3 / 4,
            "{gpu_only} of {} want a GPU",
            kernels.len()
        );
        for task in &kernels {
            assert!(task.demand.gpu && task.demand.gpu_memory_bytes >= 64 * MIB);
            let hosts: Vec<_> = env
                .nodes
                .iter()
                .filter(|node| estimate::check_static(node, task).is_ok())
                .map(|node| node.id.as_str().to_owned())
                .collect();
            let expected = if task.constraints.device_kind.is_some() {
                vec!["jetson-0000"]
            } else {
                vec!["jetson-0000", "nuc-0000"]
            };
            assert_eq!(hosts, expected, "{task:?}");
        }
        for task in others {
            assert_eq!(task.demand.gpu_memory_bytes, 0);
            assert_eq!(task.constraints.device_kind, None);
        }
    }
}
