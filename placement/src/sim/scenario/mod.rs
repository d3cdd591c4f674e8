//! Scenario files: a fleet, a workload, load levels and run settings described
//! in TOML, so that a user can simulate *their* fleet and so that published
//! setups (PureEdgeSim's, EdgeCloudSim's) can be reproduced.
//!
//! The built-in fleets are scenario files too (`placement/scenarios/`), compiled
//! in with `include_str!`: the files and the built-ins are one source. Parsing
//! takes a `&str`; reading the file is the caller's business, as the crate does
//! no I/O. A bad file gets a [`ScenarioError`] naming the field and its line.

mod parse;

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

pub use parse::{parse, ScenarioError};

/// The shipped scenario files, by name: `(name, TOML text)`.
pub const SHIPPED: &[(&str, &str)] = &[
    ("standard", include_str!("../../../scenarios/standard.toml")),
    ("unseen", include_str!("../../../scenarios/unseen.toml")),
    (
        "pureedgesim-default",
        include_str!("../../../scenarios/pureedgesim-default.toml"),
    ),
    (
        "edgecloudsim-sample-app1",
        include_str!("../../../scenarios/edgecloudsim-sample-app1.toml"),
    ),
];

/// A shipped scenario by name, parsed.
pub fn shipped(name: &str) -> Result<Scenario, ScenarioError> {
    match SHIPPED.iter().find(|(shipped, _)| *shipped == name) {
        Some((_, text)) => parse(text),
        None => Err(ScenarioError::Unknown {
            name: name.to_owned(),
            valid: SHIPPED.iter().map(|(name, _)| (*name).to_owned()).collect(),
        }),
    }
}

/// A whole scenario file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    /// Short name, for tables.
    pub name: String,
    /// What it models and where its figures come from.
    #[serde(default)]
    pub description: String,
    /// Run settings; each one left out keeps the simulator's default.
    #[serde(default)]
    pub settings: Settings,
    /// The device profiles, in node order.
    #[serde(rename = "device")]
    pub devices: Vec<DeviceSpec>,
    /// The task types, in draw order.
    #[serde(rename = "task")]
    pub tasks: Vec<TaskType>,
    /// The load levels, each a separate run.
    #[serde(rename = "load", default)]
    pub loads: Vec<LoadSpec>,
}

/// Run settings of a scenario.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Settings {
    /// Seconds of arrivals per load level.
    pub duration_s: Option<f64>,
    /// Seconds at the start whose arrivals are simulated but not counted.
    pub warm_up_s: Option<f64>,
    /// Most seconds the run continues after arrivals stop.
    pub drain_s: Option<f64>,
    /// Device failures per node-hour (a device may override it).
    pub failure_rate_per_hour: Option<f64>,
    /// Seconds a failed device stays down.
    pub repair_s: Option<f64>,
    /// Milliseconds between placement rounds.
    pub round_ms: Option<u64>,
    /// Seconds between link changes of mobile devices.
    pub mobility_period_s: Option<f64>,
    /// Attempts a task gets.
    pub max_attempts: Option<u32>,
    /// The seeds whose results are reported.
    #[serde(default)]
    pub seeds: Vec<u64>,
    /// Seeds used to tune anything (never reported; must not meet `seeds`).
    #[serde(default)]
    pub tuning_seeds: Vec<u64>,
    /// Million instructions per second of one reference core: devices given in
    /// MIPS and tasks given in million instructions are converted with it.
    pub mips_per_reference_core: Option<f64>,
    /// Policies to compare when none are named on the command line.
    #[serde(default)]
    pub policies: Vec<String>,
}

/// One device profile and how many devices have it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeviceSpec {
    /// Short name, used in node ids (ASCII letters, digits, '-').
    pub name: String,
    /// How many devices of this profile (besides `per_user`).
    #[serde(default)]
    pub count: usize,
    /// Devices of this profile per user of the load level (PureEdgeSim gives
    /// each device type a percentage of all edge devices), added to `count`.
    pub per_user: Option<f64>,
    /// CPU architecture (`aarch64`, `x86_64`, ...).
    pub arch: String,
    /// Logical cores.
    pub cores: f64,
    /// Per-core speed relative to the reference core (or give `mips`).
    pub core_speed: Option<f64>,
    /// Per-core MIPS (with `settings.mips_per_reference_core`).
    pub mips: Option<f64>,
    /// Memory, GiB.
    pub memory_gib: f64,
    /// Storage rate, MB/s.
    #[serde(default = "default_io_mbps")]
    pub io_mbps: f64,
    /// Link bandwidth, Mbit/s.
    pub bandwidth_mbps: f64,
    /// Round-trip time, ms.
    pub rtt_ms: f64,
    /// Energy the link spends per bit moved, nanojoules.
    #[serde(default)]
    pub energy_per_bit_nj: f64,
    /// Whether the device moves (its link varies widely).
    #[serde(default)]
    pub mobile: bool,
    /// Watts when idle.
    pub idle_watts: f64,
    /// Watts fully busy at the highest power level.
    pub max_watts: f64,
    /// Speed factors of the power levels, lowest first, ending at 1.
    #[serde(default = "default_levels")]
    pub level_speeds: Vec<f64>,
    /// Labels the device carries.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// Battery capacity, joules, for battery-powered devices.
    pub battery_joules: Option<f64>,
    /// Failures per hour of this profile (else the scenario's rate).
    pub failure_rate_per_hour: Option<f64>,
    /// Its OpenCL device, if any.
    pub opencl: Option<OpenclSpec>,
}

impl DeviceSpec {
    /// Devices of this profile when the load has `users` users.
    pub fn count_at(&self, users: f64) -> usize {
        let scaled = self
            .per_user
            .map_or(0.0, |per_user| (per_user * users.max(0.0)).round());
        // Bounded by the checks (per_user <= 1000, users finite), so the cast
        // cannot overflow in practice; `as` saturates anyway.
        self.count.saturating_add(scaled as usize)
    }
}

fn default_io_mbps() -> f64 {
    100.0
}

fn default_levels() -> Vec<f64> {
    vec![1.0]
}

/// An OpenCL device, with the fields an agent reports.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OpenclSpec {
    /// `gpu`, `cpu` or `accelerator`.
    #[serde(default = "default_kind")]
    pub kind: String,
    /// Calibrated GFLOP/s.
    pub gflops: f64,
    /// OpenCL platform name.
    #[serde(default)]
    pub platform: String,
    /// Vendor name.
    #[serde(default)]
    pub vendor: String,
    /// Device name.
    #[serde(default)]
    pub device_name: String,
    /// Compute units.
    #[serde(default = "one")]
    pub compute_units: u32,
    /// Clock, MHz.
    #[serde(default)]
    pub clock_mhz: u32,
    /// Device memory, GiB.
    pub memory_gib: f64,
    /// Largest allocation, GiB.
    pub max_alloc_gib: f64,
    /// Local memory, KiB.
    #[serde(default = "default_local_kib")]
    pub local_memory_kib: u64,
    /// Largest work-group.
    #[serde(default = "default_work_group")]
    pub max_work_group_size: u32,
    /// Double precision.
    #[serde(default)]
    pub fp64: bool,
}

fn default_kind() -> String {
    "gpu".to_owned()
}
fn one() -> u32 {
    1
}
fn default_local_kib() -> u64 {
    48
}
fn default_work_group() -> u32 {
    1024
}

/// The class of a task type, as the engine sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ClassName {
    /// CPU-bound.
    Cpu,
    /// GPU-bound.
    Gpu,
    /// I/O-bound.
    Io,
}

/// How a task type's arrivals are spaced.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Arrival {
    /// Exponential gaps.
    #[default]
    Poisson,
    /// Each user at a fixed period, from a random phase.
    Periodic,
}

/// How a task's work varies around its mean.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum WorkDistribution {
    /// Always the mean.
    #[default]
    Fixed,
    /// Lognormal with median below the mean so the mean holds (`work_sigma`).
    Lognormal,
    /// Exponential around the mean (EdgeCloudSim draws lengths so).
    Exponential,
}

/// One task type.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TaskType {
    /// Name, for people.
    pub name: String,
    /// Class.
    pub class: ClassName,
    /// Share of the arrivals, for loads given as a utilisation.
    pub share: Option<f64>,
    /// Arrivals per second of each of its users, for loads given as users.
    pub rate_per_user_s: Option<f64>,
    /// The share of the load's users that generate this type.
    #[serde(default = "one_f64")]
    pub users_share: f64,
    /// Arrival process.
    #[serde(default)]
    pub arrival: Arrival,
    /// Mean work, reference-core seconds (or give `length_mi`).
    pub work_s: Option<f64>,
    /// Mean length, million instructions.
    pub length_mi: Option<f64>,
    /// How the work varies.
    #[serde(default)]
    pub work_distribution: WorkDistribution,
    /// Lognormal sigma.
    #[serde(default)]
    pub work_sigma: f64,
    /// Cores a task uses.
    #[serde(default = "one_f64")]
    pub cores: f64,
    /// Chance that a task uses `wide_cores` instead.
    pub wide_share: Option<f64>,
    /// Cores of a wide task.
    #[serde(default = "two_f64")]
    pub wide_cores: f64,
    /// Chance that a task is an OpenCL kernel.
    pub opencl_share: Option<f64>,
    /// Chance that a kernel wants a GPU-type device.
    #[serde(default)]
    pub gpu_only_share: f64,
    /// Device memory of a kernel, MiB: `[min, max]` in steps of 64.
    #[serde(default = "default_gpu_memory")]
    pub gpu_memory_mib: [u64; 2],
    /// Chances of an architecture constraint, taken in name order.
    #[serde(default)]
    pub arch: BTreeMap<String, f64>,
    /// Chance that a task needs `label`.
    pub label_share: Option<f64>,
    /// The label (`key = value`) asked for.
    #[serde(default)]
    pub label: BTreeMap<String, String>,
    /// Memory, MiB: `[min, max]`, drawn in steps of `memory_step_mib`.
    pub memory_mib: [u64; 2],
    /// Step of the memory draw, MiB.
    #[serde(default = "default_memory_step")]
    pub memory_step_mib: u64,
    /// Storage rate a task needs, MB/s.
    #[serde(default = "default_task_io")]
    pub io_mbps: f64,
    /// Input size, kB: `[min, max)`.
    pub input_kb: [f64; 2],
    /// Output size, kB: `[min, max)`.
    pub output_kb: [f64; 2],
    /// A fixed deadline after submission, seconds.
    pub deadline_s: Option<f64>,
    /// Else: a factor drawn in `[min, max)` times the time on a good device.
    pub deadline_factor: Option<[f64; 2]>,
    /// Speed of that good device (reference cores per task core).
    #[serde(default = "one_f64")]
    pub deadline_speed: f64,
    /// Seconds added to that deadline for transfers.
    #[serde(default)]
    pub deadline_slack_s: f64,
    /// Priority, `[min, max]`.
    #[serde(default)]
    pub priority: [u8; 2],
    /// EdgeCloudSim's chance that its default orchestrator sends the task to the cloud.
    pub cloud_probability: Option<f64>,
}

fn one_f64() -> f64 {
    1.0
}
fn two_f64() -> f64 {
    2.0
}
fn default_gpu_memory() -> [u64; 2] {
    [64, 512]
}
fn default_memory_step() -> u64 {
    1
}
fn default_task_io() -> f64 {
    5.0
}

/// One load level.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LoadSpec {
    /// Name, for tables.
    pub name: String,
    /// Offered work over the fleet's capacity (task types with `share`).
    pub utilisation: Option<f64>,
    /// Users generating tasks (task types with `rate_per_user_s`).
    pub users: Option<f64>,
}

impl Scenario {
    /// Devices in all when the load has `users` users (0 for loads given as
    /// a utilisation).
    pub fn device_count(&self, users: f64) -> usize {
        self.devices
            .iter()
            .map(|device| device.count_at(users))
            .sum()
    }

    /// Whether arrivals are given per user (else as shares of a utilisation).
    pub fn rate_based(&self) -> bool {
        self.tasks.iter().any(|task| task.rate_per_user_s.is_some())
    }

    /// The arrival-weighted mean of the task types' cloud probabilities
    /// (EdgeCloudSim's per-application `prob_cloud_selection`); 0 when none
    /// is given.
    pub fn mean_cloud_probability(&self) -> f64 {
        let weight = |task: &TaskType| {
            task.rate_per_user_s
                .map(|rate| rate * task.users_share)
                .or(task.share)
                .unwrap_or(0.0)
                .max(0.0)
        };
        let total: f64 = self.tasks.iter().map(weight).sum();
        if total <= 0.0 {
            return 0.0;
        }
        self.tasks
            .iter()
            .map(|task| weight(task) * task.cloud_probability.unwrap_or(0.0))
            .sum::<f64>()
            / total
    }
}
