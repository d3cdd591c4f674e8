//! What a virtual device models instead of measuring: how long a task takes
//! on it ([`ProfileTaskModel`], for `--execute modelled`) and its load
//! ([`ModelledTelemetry`], for every virtual device, since the host's load is
//! the whole swarm's).
//!
//! **The modelled-duration rule.** A task's work is a number of milliseconds
//! on the reference core (the simulator's unit: a mini PC core at full
//! speed): the task's argument `work_ms=N` when it has one, otherwise the
//! swarm's `--modelled-work` (100 ms by default). It takes
//! `work / (speed × level speed factor)` on the device, where speed is the
//! profile's per-core speed for wasm and its OpenCL device's GFLOP/s over
//! the reference core's 10 for OpenCL, and the level is the power level in
//! force. A task whose time is over its wall-time limit fails with `timeout`
//! at the limit. A Pi 4 (0.35) thus takes 286 ms for the default work at its
//! top level, 714 ms at its lowest (0.4).

use std::time::{Duration, Instant};

use starling_proto::{
    Assignment, LinkState, NodeId, PowerLevel, Runtime, Telemetry, PROTOCOL_VERSION,
};

use super::profiles::DeviceProfile;
use crate::agent::TelemetrySource;
use crate::runner::TaskModel;
use crate::telemetry::TaskCounts;

/// The argument that sets a task's work, in reference-core milliseconds.
pub const WORK_ARG: &str = "work_ms=";

/// Memory a virtual device's system uses, whatever runs (MiB).
const SYSTEM_MEMORY_MIB: u64 = 256;

/// Memory each running task is taken to use (MiB).
const TASK_MEMORY_MIB: u64 = 64;

/// The modelled-duration rule for one profile (see the module docs).
#[derive(Debug, Clone)]
pub struct ProfileTaskModel {
    core_speed: f64,
    opencl_speed: Option<f64>,
    level_speeds: Vec<f64>,
    default_work: Duration,
}

impl ProfileTaskModel {
    /// The rule for `profile`, with `default_work` for tasks without a
    /// `work_ms=` argument.
    pub fn new(profile: &DeviceProfile, default_work: Duration) -> Self {
        Self {
            core_speed: f64::from(profile.core_speed),
            opencl_speed: profile.opencl_speed().map(f64::from),
            level_speeds: profile.level_speeds.iter().map(|s| f64::from(*s)).collect(),
            default_work,
        }
    }

    /// The work of `assignment` in reference-core milliseconds.
    pub fn work_ms(&self, assignment: &Assignment) -> f64 {
        assignment
            .args
            .iter()
            .find_map(|arg| arg.as_str().strip_prefix(WORK_ARG)?.parse::<f64>().ok())
            .filter(|work| work.is_finite() && *work >= 0.0)
            .unwrap_or(self.default_work.as_secs_f64() * 1000.0)
    }
}

impl TaskModel for ProfileTaskModel {
    fn duration(&self, assignment: &Assignment, level: u8) -> Duration {
        let speed = match assignment.runtime {
            Runtime::Wasm => self.core_speed,
            Runtime::Opencl => self.opencl_speed.unwrap_or(self.core_speed),
        };
        let level_speed = self
            .level_speeds
            .get(usize::from(level))
            .or(self.level_speeds.last())
            .copied()
            .unwrap_or(1.0);
        let seconds = self.work_ms(assignment) / 1000.0 / (speed * level_speed).max(1e-3);
        // Far past any wall-time limit (which caps the sleep) stays finite.
        Duration::from_secs_f64(seconds.min(1e9))
    }
}

/// Telemetry of a virtual device: the load its tasks would cause on the
/// profile's hardware, not the host's (which is the whole swarm's). CPU load
/// is running tasks over cores; free memory is the profile's less a fixed
/// system share and a share per running task; disk I/O is zero; energy is
/// integrated from the profile's power levels as the real sampler does; the
/// link is measured for real (MQTT pings).
#[derive(Debug)]
pub struct ModelledTelemetry {
    node_id: NodeId,
    cores: f64,
    memory_bytes: u64,
    power_levels: Vec<PowerLevel>,
    started: Instant,
    last_sample: Instant,
    energy_joules: f64,
    seq: u64,
}

impl ModelledTelemetry {
    /// Telemetry for `node_id`, a device of `profile` offering `power_levels`.
    pub fn new(node_id: NodeId, profile: &DeviceProfile, power_levels: Vec<PowerLevel>) -> Self {
        let now = Instant::now();
        Self {
            node_id,
            cores: f64::from(profile.cores.max(1)),
            memory_bytes: profile.memory_bytes(),
            power_levels,
            started: now,
            last_sample: now,
            energy_joules: 0.0,
            seq: 0,
        }
    }
}

impl TelemetrySource for ModelledTelemetry {
    fn sample(&mut self, counts: TaskCounts, power_level: u8, link: LinkState) -> Telemetry {
        let now = Instant::now();
        let elapsed = now.duration_since(self.last_sample).as_secs_f64();
        self.last_sample = now;
        let cpu_load = (counts.running as f64 / self.cores).clamp(0.0, 1.0);
        let used_mib = SYSTEM_MEMORY_MIB + TASK_MEMORY_MIB * counts.running as u64;
        let free_memory_bytes = self.memory_bytes.saturating_sub(used_mib << 20);
        let level = self
            .power_levels
            .iter()
            .find(|l| l.level == power_level)
            .or(self.power_levels.last());
        if let Some(level) = level {
            let watts = f64::from(level.idle_watts)
                + f64::from(level.active_watts - level.idle_watts) * cpu_load;
            self.energy_joules += watts * elapsed;
        }
        self.seq += 1;
        Telemetry {
            v: PROTOCOL_VERSION,
            node_id: self.node_id.clone(),
            seq: self.seq,
            uptime_ms: u64::try_from(now.duration_since(self.started).as_millis())
                .unwrap_or(u64::MAX),
            cpu_load: cpu_load as f32,
            free_memory_bytes,
            io_read_bps: 0,
            io_write_bps: 0,
            link,
            running_tasks: u16::try_from(counts.running).unwrap_or(u16::MAX),
            queued_tasks: u16::try_from(counts.queued).unwrap_or(u16::MAX),
            power_level,
            energy_joules: self.energy_joules,
            energy_source: Default::default(),
            gpu_load: None,
            attempts: Default::default(),
            attempts_complete: false,
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use starling_proto::ExecLimits;

    use super::*;
    use crate::swarm::profiles::{jetson, mini_pc, raspberry_pi};

    /// An assignment with only the fields the model reads set (built from
    /// JSON, so optional fields added to the wire type later need no change).
    fn assignment(runtime: Runtime, args: &[&str]) -> Assignment {
        serde_json::from_value(serde_json::json!({
            "v": PROTOCOL_VERSION,
            "node_id": "swarm-00001",
            "task_id": "t-1",
            "attempt": 1,
            "runtime": runtime,
            "artifact": "11".repeat(32),
            "artifact_url": "http://127.0.0.1/a",
            "args": args,
            "input": [],
            "limits": ExecLimits::default(),
            "power_level": 0,
            "issued_unix_ms": 0,
            "expires_unix_ms": u64::MAX,
        }))
        .unwrap()
    }

    fn idle_link() -> LinkState {
        LinkState {
            rtt_ms: None,
            bandwidth_mbps: None,
            loss: None,
        }
    }

    /// Rounded: the speeds are binary fractions.
    fn ms(duration: Duration) -> u64 {
        (duration.as_secs_f64() * 1000.0).round() as u64
    }

    #[test]
    fn the_default_work_takes_work_over_speed_at_the_level_in_force() {
        let pi = ProfileTaskModel::new(&raspberry_pi(), Duration::from_millis(100));
        let task = assignment(Runtime::Wasm, &[]);
        assert_eq!(ms(pi.duration(&task, 2)), 286); // 100 / 0.35
        assert_eq!(ms(pi.duration(&task, 0)), 714); // 100 / (0.35 × 0.4)
                                                    // A level the profile lacks counts as its top one.
        assert_eq!(ms(pi.duration(&task, 9)), 286);
        let nuc = ProfileTaskModel::new(&mini_pc(), Duration::from_millis(100));
        assert_eq!(ms(nuc.duration(&task, 2)), 100);
    }

    #[test]
    fn a_work_argument_sets_the_work_and_opencl_runs_at_the_devices_speed() {
        let jetson = ProfileTaskModel::new(&jetson(), Duration::from_millis(100));
        let wasm = assignment(Runtime::Wasm, &["--x", "work_ms=30"]);
        assert_eq!(jetson.work_ms(&wasm), 30.0);
        assert_eq!(ms(jetson.duration(&wasm, 1)), 100); // 30 / 0.3
                                                        // 150 GFLOP/s is 15 reference cores.
        let kernel = assignment(Runtime::Opencl, &["work_ms=1500"]);
        assert_eq!(ms(jetson.duration(&kernel, 1)), 100);
        // A bad value falls back to the default.
        let bad = assignment(Runtime::Wasm, &["work_ms=-4"]);
        assert_eq!(jetson.work_ms(&bad), 100.0);
    }

    #[test]
    fn modelled_telemetry_follows_the_running_tasks() {
        let profile = raspberry_pi();
        let levels = profile.power_levels();
        let mut telemetry =
            ModelledTelemetry::new(NodeId::new("swarm-00001").unwrap(), &profile, levels);
        let idle = telemetry.sample(TaskCounts::default(), 2, idle_link());
        assert_eq!(idle.cpu_load, 0.0);
        assert_eq!(idle.free_memory_bytes, (4096 - 256) << 20);
        let busy = telemetry.sample(
            TaskCounts {
                running: 2,
                queued: 1,
            },
            2,
            idle_link(),
        );
        assert_eq!(busy.cpu_load, 0.5);
        assert_eq!((busy.running_tasks, busy.queued_tasks), (2, 1));
        assert_eq!(busy.seq, 2);
        let crowded = telemetry.sample(
            TaskCounts {
                running: 9,
                queued: 0,
            },
            2,
            idle_link(),
        );
        assert_eq!(crowded.cpu_load, 1.0);
    }
}
