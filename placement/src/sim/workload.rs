//! What the simulated world does independently of the policy: the nodes, the
//! arrivals, the failures and the link changes. Generated once per load level from
//! the seed, then replayed identically for every policy.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use starling_proto::{GpuKind, Label, Runtime};

use crate::model::{Constraints, Demand, NetworkLink, NodeView, PendingTask, TaskClass};
use crate::sample::normal;
use crate::sim::profiles::{scenario_profiles, DeviceProfile};
use crate::sim::scenario::{Arrival, ClassName, Scenario, TaskType, WorkDistribution};
use crate::sim::{LoadLevel, SimConfig, SimError};

const MIB: u64 = 1 << 20;

/// The simulated world of one load level.
#[derive(Debug, Clone)]
pub(crate) struct Environment {
    /// The nodes as they start: idle, online.
    pub nodes: Vec<NodeView>,
    /// Joules each node's link spends per byte moved.
    pub joules_per_byte: Vec<f64>,
    /// The arrivals, in time order; a task's key is its index.
    pub tasks: Vec<PendingTask>,
    /// Mean arrivals per second.
    pub arrival_rate_per_s: f64,
    /// Tasks submitted before this are simulated but not counted, ms.
    pub counted_from_ms: f64,
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
    /// Spread of the execution noise (σ of its logarithm).
    pub noise_sigma: f64,
    /// Each node's hidden speed bias: its work takes this many times what
    /// the model estimates (1: as declared).
    pub bias: Vec<f64>,
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

fn exponential(rng: &mut ChaCha8Rng, rate: f64) -> f64 {
    let u: f64 = rng.random_range(f64::EPSILON..1.0);
    -u.ln() / rate
}

/// A task type resolved against its scenario: mean work in reference seconds.
struct Kind<'s> {
    spec: &'s TaskType,
    work_s: f64,
}

/// The scenario a configuration simulates: its own, or its fleet's shipped
/// file with `nodes_per_profile` for every count and `task_mix` for the shares.
pub(crate) fn scenario_of(config: &SimConfig) -> Result<Scenario, SimError> {
    if let Some(scenario) = &config.scenario {
        return Ok((**scenario).clone());
    }
    let mut scenario = config.fleet.scenario()?;
    for device in &mut scenario.devices {
        device.count = config.nodes_per_profile;
        device.per_user = None;
    }
    let mix = config.task_mix;
    for task in &mut scenario.tasks {
        task.share = Some(match task.class {
            ClassName::Cpu => mix.cpu,
            ClassName::Gpu => mix.gpu,
            ClassName::Io => mix.io,
        });
    }
    Ok(scenario)
}

/// The users of a load level: those its scenario entry of the same name
/// gives (loads given as a utilisation have none).
pub(crate) fn users_of(scenario: &Scenario, load: &LoadLevel) -> f64 {
    scenario
        .loads
        .iter()
        .find(|spec| spec.name == load.name)
        .and_then(|spec| spec.users)
        .unwrap_or(0.0)
}

/// The work a rate-based scenario offers at `users` users over its fleet's
/// capacity then, both in reference-core seconds per second.
pub(crate) fn offered_utilisation(scenario: &Scenario, users: f64) -> f64 {
    let mips = scenario.settings.mips_per_reference_core.unwrap_or(1.0);
    let offered: f64 = scenario
        .tasks
        .iter()
        .map(|task| {
            let work = task
                .work_s
                .unwrap_or_else(|| task.length_mi.unwrap_or(0.0) / mips);
            task.rate_per_user_s.unwrap_or(0.0) * task.users_share * users * work
        })
        .sum();
    let capacity: f64 = scenario_profiles(scenario)
        .iter()
        .zip(&scenario.devices)
        .map(|(profile, spec)| capacity(profile, 0.0) * spec.count_at(users) as f64)
        .sum();
    offered / capacity.max(f64::EPSILON)
}

impl Environment {
    pub fn generate(
        config: &SimConfig,
        load_index: usize,
        load: &LoadLevel,
    ) -> Result<Environment, SimError> {
        let stream = |salt: u64| {
            ChaCha8Rng::seed_from_u64(
                config
                    .seed
                    .wrapping_mul(0x9e37_79b9_7f4a_7c15)
                    .wrapping_add((load_index as u64) << 32)
                    .wrapping_add(salt),
            )
        };
        let scenario = scenario_of(config)?;
        let users = users_of(&scenario, load);
        let profiles = scenario_profiles(&scenario);
        let mips = scenario.settings.mips_per_reference_core.unwrap_or(1.0);
        let kinds: Vec<Kind<'_>> = scenario
            .tasks
            .iter()
            .map(|spec| Kind {
                spec,
                work_s: spec
                    .work_s
                    .unwrap_or_else(|| spec.length_mi.unwrap_or(0.0) / mips),
            })
            .collect();
        let mut nodes = Vec::new();
        let mut joules_per_byte = Vec::new();
        let mut failure_rates = Vec::new();
        let mut mobile = Vec::new();
        let mut base_links = Vec::new();
        let mut total_capacity = 0.0;
        let share = |kind: &Kind<'_>| kind.spec.share.unwrap_or(0.0);
        let mix_total = kinds.iter().map(share).sum::<f64>().max(f64::EPSILON);
        let gpu_share: f64 = kinds
            .iter()
            .filter(|kind| kind.spec.class == ClassName::Gpu)
            .map(share)
            .sum();
        for (profile, spec) in profiles.iter().zip(&scenario.devices) {
            for number in 0..spec.count_at(users) {
                let node = profile.node(number);
                base_links.push(node.network);
                nodes.push(node);
                joules_per_byte.push(profile.energy_per_bit_nj * 8.0 * 1e-9);
                failure_rates.push(
                    profile
                        .failure_rate_per_hour
                        .unwrap_or(config.failure_rate_per_hour),
                );
                mobile.push(profile.mobile);
                total_capacity += capacity(profile, gpu_share / mix_total);
            }
        }
        if nodes.is_empty() {
            return Err(SimError::InvalidConfig(format!(
                "scenario {:?} has no devices at load {:?}",
                scenario.name, load.name
            )));
        }
        let duration_ms = config.duration_s * 1000.0;
        let end_ms = duration_ms + config.drain_s * 1000.0;

        let mut arrivals = stream(1);
        // OpenCL details come from a stream of their own, so that the arrivals
        // themselves stay what they were before tasks had them.
        let mut kernels = stream(4);
        let mut tasks = Vec::new();
        let arrival_rate_per_s;
        if scenario.rate_based() {
            // Each type's users at their own rate; the attributes are drawn in
            // arrival order once the streams are merged.
            let mut times: Vec<(f64, usize)> = Vec::new();
            let mut rate = 0.0;
            for (index, kind) in kinds.iter().enumerate() {
                let per_user = kind.spec.rate_per_user_s.unwrap_or(0.0);
                let type_users = users * kind.spec.users_share;
                rate += per_user * type_users;
                match kind.spec.arrival {
                    Arrival::Poisson => {
                        let type_rate = per_user * type_users;
                        if type_rate <= 0.0 {
                            continue;
                        }
                        let mut now_ms = 0.0;
                        loop {
                            now_ms += exponential(&mut arrivals, type_rate) * 1000.0;
                            if now_ms >= duration_ms {
                                break;
                            }
                            times.push((now_ms, index));
                        }
                    }
                    Arrival::Periodic => {
                        let period_ms = 1000.0 / per_user.max(1e-9);
                        for _ in 0..type_users.round() as usize {
                            let mut now_ms = arrivals.random_range(0.0..period_ms);
                            while now_ms < duration_ms {
                                times.push((now_ms, index));
                                now_ms += period_ms;
                            }
                        }
                    }
                }
            }
            times.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
            for (now_ms, index) in times {
                if let Some(kind) = kinds.get(index) {
                    let key = tasks.len() as u64;
                    tasks.push(random_task(&mut arrivals, &mut kernels, key, now_ms, kind));
                }
            }
            arrival_rate_per_s = rate;
        } else {
            let mean_work = kinds
                .iter()
                .fold(0.0, |sum, kind| sum + share(kind) * kind.work_s)
                / mix_total;
            let utilisation = load.utilisation;
            arrival_rate_per_s = utilisation * total_capacity / mean_work;
            let mut now_ms = 0.0;
            loop {
                now_ms += exponential(&mut arrivals, arrival_rate_per_s) * 1000.0;
                if now_ms >= duration_ms {
                    break;
                }
                let key = tasks.len() as u64;
                let draw: f64 = arrivals.random_range(0.0..mix_total);
                let mut cumulative = 0.0;
                let mut chosen = kinds.len().saturating_sub(1);
                for (index, kind) in kinds.iter().enumerate() {
                    cumulative += share(kind);
                    if draw < cumulative {
                        chosen = index;
                        break;
                    }
                }
                if let Some(kind) = kinds.get(chosen) {
                    tasks.push(random_task(&mut arrivals, &mut kernels, key, now_ms, kind));
                }
            }
        }

        let mut failure_rng = stream(2);
        let mut failures = Vec::new();
        for (node, rate_per_hour) in failure_rates.iter().enumerate() {
            if *rate_per_hour <= 0.0 {
                continue;
            }
            let rate_per_ms = rate_per_hour / 3_600_000.0;
            let mut at = exponential(&mut failure_rng, rate_per_ms);
            while at < end_ms {
                failures.push((at, node));
                at += config.repair_s * 1000.0 + exponential(&mut failure_rng, rate_per_ms);
            }
        }
        failures.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));

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
        // The devices' hidden bias, from a stream of its own: the other
        // streams, and so every run without a bias, are as they were.
        let mut bias_rng = stream(4);
        let bias = (0..nodes.len())
            .map(|_| (config.estimates.device_bias * normal(&mut bias_rng)).exp())
            .collect();
        Ok(Environment {
            nodes,
            joules_per_byte,
            tasks,
            arrival_rate_per_s,
            counted_from_ms: config.warm_up_s * 1000.0,
            failures,
            links,
            mobility_period_ms,
            end_ms,
            noise_seed: config.seed ^ 0x006e_6f69_7365,
            noise_sigma: config.estimates.runtime_noise.max(0.0),
            bias,
        })
    }

    /// Whether a task counts in the tables (it arrived after the warm-up).
    pub fn counted(&self, task: &PendingTask) -> bool {
        task.submitted_ms as f64 >= self.counted_from_ms
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
        (self.noise_sigma * z).exp()
    }

    /// How many times its modelled run time a node's work takes (hidden from
    /// the policies).
    pub fn bias(&self, node: usize) -> f64 {
        self.bias.get(node).copied().unwrap_or(1.0)
    }

    /// The link of a node at a time.
    pub fn link(&self, node: usize, at_ms: f64) -> Option<NetworkLink> {
        let tick = (at_ms / self.mobility_period_ms).floor().max(0.0) as usize;
        let tick = tick.min(self.links.len().saturating_sub(1));
        self.links.get(tick)?.get(node).copied()
    }
}

/// Bytes from a `[min, max)` range in kB, drawn (as the built-in world always
/// drew them, in whole bytes).
fn bytes_in(rng: &mut ChaCha8Rng, range_kb: [f64; 2]) -> u64 {
    let low = (range_kb[0] * 1000.0).round() as u64;
    let high = (range_kb[1] * 1000.0).round() as u64;
    if high > low {
        rng.random_range(low..high)
    } else {
        low
    }
}

/// One random task of a type; `kernels` draws what only OpenCL tasks have
/// (the device type they want, their buffers). The draws come in a fixed
/// order (work, width, kernel, architecture, label, memory, input, deadline,
/// output, priority), each only when the type varies it, so the standard
/// types draw exactly what the built-in generator drew before it read files.
fn random_task(
    rng: &mut ChaCha8Rng,
    kernels: &mut ChaCha8Rng,
    key: u64,
    now_ms: f64,
    kind: &Kind<'_>,
) -> PendingTask {
    let spec = kind.spec;
    let class = match spec.class {
        ClassName::Cpu => TaskClass::Cpu,
        ClassName::Gpu => TaskClass::Gpu,
        ClassName::Io => TaskClass::Io,
    };
    let spread = match spec.work_distribution {
        WorkDistribution::Fixed => 1.0,
        WorkDistribution::Lognormal => {
            let sigma = spec.work_sigma;
            (sigma * normal(rng) - sigma * sigma / 2.0).exp()
        }
        WorkDistribution::Exponential => exponential(rng, 1.0),
    };
    let work = kind.work_s * spread;
    let mut cores = spec.cores;
    if let Some(wide) = spec.wide_share {
        if rng.random_bool(wide) {
            cores = spec.wide_cores;
        }
    }
    let mut runtime = Runtime::Wasm;
    let mut device_kind = None;
    let mut gpu_memory_bytes = 0;
    let mut needs_gpu = false;
    if let Some(opencl) = spec.opencl_share {
        needs_gpu = rng.random_bool(opencl);
        if needs_gpu {
            runtime = Runtime::Opencl;
            if kernels.random_bool(spec.gpu_only_share) {
                device_kind = Some(GpuKind::Gpu);
            }
            let [low, high] = spec.gpu_memory_mib;
            gpu_memory_bytes = kernels.random_range(low / 64..=high / 64) * 64 * MIB;
        }
    }
    let mut arch = None;
    if !spec.arch.is_empty() {
        let pick: f64 = rng.random_range(0.0..1.0);
        let mut cumulative = 0.0;
        for (name, share) in &spec.arch {
            cumulative += share;
            if pick < cumulative {
                arch = Some(name.clone());
                break;
            }
        }
    }
    let mut labels = Vec::new();
    if let Some(label_share) = spec.label_share {
        if rng.random_bool(label_share) {
            labels.extend(
                spec.label
                    .iter()
                    .filter_map(|(key, value)| Label::new(key, value).ok()),
            );
        }
    }
    let [low, high] = spec.memory_mib;
    let step = spec.memory_step_mib.max(1);
    let memory_bytes = if high > low {
        rng.random_range(low / step..=high / step) * step * MIB
    } else {
        low * MIB
    };
    let input_bytes = bytes_in(rng, spec.input_kb);
    let deadline_ms = match (spec.deadline_s, spec.deadline_factor) {
        (Some(deadline), _) => now_ms + deadline * 1000.0,
        (None, Some([low, high])) => {
            // A multiple of the task's time on a good device for its class,
            // plus slack for transfers.
            let good_device_s = work / (spec.deadline_speed * cores);
            let factor: f64 = rng.random_range(low..high);
            now_ms + (good_device_s * factor + spec.deadline_slack_s) * 1000.0
        }
        (None, None) => now_ms + 3_600_000.0,
    };
    let output_bytes = bytes_in(rng, spec.output_kb);
    let [lowest, highest] = spec.priority;
    let priority = if highest > lowest {
        rng.random_range(lowest..=highest)
    } else {
        lowest
    };
    PendingTask {
        key,
        class,
        demand: Demand {
            cpu_cores: cores as f32,
            memory_bytes,
            gpu: needs_gpu,
            io_mbps: spec.io_mbps as f32,
            gpu_memory_bytes,
        },
        work,
        input_bytes,
        output_bytes,
        deadline_ms: Some(deadline_ms.ceil() as u64),
        priority,
        submitted_ms: now_ms.floor() as u64,
        constraints: Constraints {
            runtime,
            arch,
            labels,
            device_kind,
            fp64: false,
        },
        // Tasks of one type run one artifact.
        artifact: crate::model::correction::artifact_key(spec.name.as_bytes()),
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
        let env = Environment::generate(&config, 2, &LoadLevel::high()).unwrap();
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
