//! The discrete-event edge simulator: device profiles, mobility, Poisson arrivals
//! at several loads, a mix of CPU-, GPU- and I/O-bound tasks with deadlines, device
//! failures; every policy runs against the very same arrivals, failures and link
//! changes, through the very same policy code the coordinator runs.
//!
//! The crate stays pure here too: the caller hands in a [`Stopwatch`] to time the
//! policies' decisions (a real clock in the coordinator's `sim` command, a fake one
//! in tests), and every random draw comes from ChaCha streams seeded from
//! [`SimConfig::seed`].

mod engine;
pub mod profiles;
mod report;
mod scale;
pub mod scenario;
mod sites;
mod stats;
mod workload;

use serde::{Deserialize, Serialize};

use crate::catalog::PolicyError;
use crate::learned::ModelFile;

pub use crate::sample::normal;
pub use report::{LoadReport, PolicyRow, SimReport};
pub use scale::{scale, ScaleConfig, ScaleReport, ScaleRow};
pub use scenario::{Scenario, ScenarioError};
pub use sites::{run_sites, SiteTally, SitesConfig, SitesReport, SitesRow};
pub use stats::{pinned, run_seeds, Interval, SeedsReport, SeedsRow, PINNED_SEEDS};

/// A source of elapsed time, injected by the caller.
pub trait Stopwatch {
    /// Nanoseconds since an arbitrary origin; never decreasing.
    fn now_ns(&mut self) -> u64;
}

/// A stopwatch that advances a fixed step on every reading: deterministic, for
/// tests and for runs where decision times do not matter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FakeStopwatch {
    /// The current reading.
    pub now_ns: u64,
    /// How far each reading advances.
    pub step_ns: u64,
}

impl Stopwatch for FakeStopwatch {
    fn now_ns(&mut self) -> u64 {
        self.now_ns = self.now_ns.saturating_add(self.step_ns);
        self.now_ns
    }
}

/// An offered load: the arrival rate as a fraction of the cluster's capacity.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LoadLevel {
    /// Name for tables (`low`, `medium`, `high`).
    pub name: String,
    /// Offered work per second over the cluster's work capacity per second.
    pub utilisation: f64,
}

impl LoadLevel {
    /// 20% of capacity.
    pub fn low() -> Self {
        Self {
            name: "low".to_owned(),
            utilisation: 0.2,
        }
    }
    /// 50% of capacity.
    pub fn medium() -> Self {
        Self {
            name: "medium".to_owned(),
            utilisation: 0.5,
        }
    }
    /// 85% of capacity.
    pub fn high() -> Self {
        Self {
            name: "high".to_owned(),
            utilisation: 0.85,
        }
    }
}

/// Shares of each task class in the arrivals (normalised when used).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct TaskMix {
    /// CPU-bound share.
    pub cpu: f64,
    /// GPU-bound share.
    pub gpu: f64,
    /// I/O-bound share.
    pub io: f64,
}

impl Default for TaskMix {
    fn default() -> Self {
        Self {
            cpu: 0.5,
            gpu: 0.25,
            io: 0.25,
        }
    }
}

/// What to simulate.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SimConfig {
    /// Seed of every random stream.
    pub seed: u64,
    /// Seconds of arrivals per load level (the run then drains).
    pub duration_s: f64,
    /// Nodes of each device profile.
    pub nodes_per_profile: usize,
    /// Which device profiles make up the fleet.
    #[serde(default)]
    pub fleet: profiles::Fleet,
    /// Failures per node per hour (exponential inter-failure times).
    pub failure_rate_per_hour: f64,
    /// Seconds a failed node stays down.
    pub repair_s: f64,
    /// Load levels, each a separate run.
    pub loads: Vec<LoadLevel>,
    /// Policy names (see [`crate::catalog::POLICY_NAMES`]).
    pub policies: Vec<String>,
    /// Milliseconds between placement rounds while tasks are pending.
    pub round_ms: u64,
    /// Seconds between link changes (mobility).
    pub mobility_period_s: f64,
    /// Most seconds the run continues after arrivals stop, to let queues drain.
    pub drain_s: f64,
    /// Task classes' shares.
    pub task_mix: TaskMix,
    /// Attempts a task gets before it counts as failed (failures re-queue it).
    pub max_attempts: u32,
    /// The heuristic's knobs.
    pub heuristic: crate::policy::HeuristicTuning,
    /// Seconds at the start whose arrivals run but are not counted.
    #[serde(default)]
    pub warm_up_s: f64,
    /// A scenario file's fleet, tasks and loads, in place of `fleet`,
    /// `nodes_per_profile` and `task_mix`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scenario: Option<Box<Scenario>>,
    /// How far the devices stand from what they declare, hidden from the
    /// policies, and whether placement learns it from finished attempts.
    #[serde(default)]
    pub estimates: EstimateTruth,
    /// Models for the learned policies, replacing the shipped ones (not written
    /// into reports: the training record in each model says where it came from).
    #[serde(skip)]
    pub models: Vec<ModelFile>,
}

/// The truth behind the estimates in a run: every device runs its work
/// `exp(device_bias · z)` times slower than the model says (`z` drawn once
/// per device, normal), every attempt `exp(runtime_noise · z)` more (`z`
/// drawn per attempt); the policies see only what devices declare. With
/// `learning`, each finished attempt corrects the estimates of its node
/// (`crate::model::correction`), as the coordinator's do.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct EstimateTruth {
    /// Spread of the devices' hidden speed bias (σ of its logarithm; 0: each
    /// device is as fast as it declares).
    #[serde(default)]
    pub device_bias: f64,
    /// Spread of each attempt's run-time noise (σ of its logarithm).
    #[serde(default = "default_runtime_noise")]
    pub runtime_noise: f64,
    /// Whether finished attempts correct the estimates placement uses.
    #[serde(default)]
    pub learning: bool,
}

/// The runtime noise every run had before the setting came (about 10%).
fn default_runtime_noise() -> f64 {
    0.1
}

impl Default for EstimateTruth {
    fn default() -> Self {
        Self {
            device_bias: 0.0,
            runtime_noise: default_runtime_noise(),
            learning: false,
        }
    }
}

impl Default for SimConfig {
    fn default() -> Self {
        Self {
            seed: 42,
            duration_s: 60.0,
            nodes_per_profile: 25,
            fleet: profiles::Fleet::Standard,
            failure_rate_per_hour: 2.0,
            repair_s: 60.0,
            loads: vec![LoadLevel::low(), LoadLevel::medium(), LoadLevel::high()],
            policies: crate::catalog::POLICY_NAMES
                .iter()
                .map(|name| (*name).to_owned())
                .collect(),
            round_ms: 100,
            mobility_period_s: 5.0,
            drain_s: 120.0,
            task_mix: TaskMix::default(),
            max_attempts: 3,
            heuristic: crate::policy::HeuristicTuning::default(),
            warm_up_s: 0.0,
            scenario: None,
            estimates: EstimateTruth::default(),
            models: Vec::new(),
        }
    }
}

/// Where a run stands, for a progress bar.
#[derive(Debug, Clone, PartialEq)]
pub struct SimProgress {
    /// The load level being run.
    pub load: String,
    /// The policy being run.
    pub policy: String,
    /// Runs (load × policy) finished, this one included once it ends.
    pub finished_runs: usize,
    /// Runs in all.
    pub total_runs: usize,
}

/// Why a simulation or a scale benchmark could not run.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SimError {
    /// A policy name is not known, or its model is unusable.
    #[error(transparent)]
    Policy(#[from] PolicyError),
    /// A setting is out of range.
    #[error("invalid simulator setting: {0}")]
    InvalidConfig(String),
    /// The plot could not be drawn.
    #[error("could not draw the plot: {0}")]
    Plot(String),
    /// A scenario (a file, or a shipped one) is unusable.
    #[error(transparent)]
    Scenario(#[from] ScenarioError),
}

impl SimConfig {
    /// Checks the settings, naming the first one out of range.
    pub fn validate(&self) -> Result<(), SimError> {
        let invalid = |what: &str| Err(SimError::InvalidConfig(what.to_owned()));
        if !(self.duration_s.is_finite() && self.duration_s > 0.0 && self.duration_s <= 86_400.0) {
            return invalid("duration_s must be in (0, 86400]");
        }
        if self.nodes_per_profile == 0 || self.nodes_per_profile > 10_000 {
            return invalid("nodes_per_profile must be in 1..=10000");
        }
        if !(self.failure_rate_per_hour.is_finite() && self.failure_rate_per_hour >= 0.0) {
            return invalid("failure_rate_per_hour must be a non-negative number");
        }
        if !(self.repair_s.is_finite() && self.repair_s >= 0.0) {
            return invalid("repair_s must be a non-negative number");
        }
        if self.loads.is_empty() {
            return invalid("at least one load level is needed");
        }
        if self.loads.iter().any(|load| {
            !(load.utilisation.is_finite() && load.utilisation > 0.0 && load.utilisation <= 5.0)
        }) {
            return invalid("load utilisation must be in (0, 5]");
        }
        if self.policies.is_empty() {
            return invalid("at least one policy is needed");
        }
        if self.round_ms == 0 {
            return invalid("round_ms must be at least 1");
        }
        if !(self.mobility_period_s.is_finite() && self.mobility_period_s > 0.0) {
            return invalid("mobility_period_s must be positive");
        }
        if !(self.drain_s.is_finite() && self.drain_s >= 0.0) {
            return invalid("drain_s must be a non-negative number");
        }
        let mix = self.task_mix;
        if [mix.cpu, mix.gpu, mix.io]
            .iter()
            .any(|share| !(share.is_finite() && *share >= 0.0))
            || mix.cpu + mix.gpu + mix.io <= 0.0
        {
            return invalid("task_mix shares must be non-negative and not all zero");
        }
        if self.max_attempts == 0 {
            return invalid("max_attempts must be at least 1");
        }
        let spread = |sigma: f64| sigma.is_finite() && (0.0..=2.0).contains(&sigma);
        if !spread(self.estimates.device_bias) || !spread(self.estimates.runtime_noise) {
            return invalid("device_bias and runtime_noise must be in [0, 2]");
        }
        if !(self.warm_up_s.is_finite()
            && self.warm_up_s >= 0.0
            && self.warm_up_s < self.duration_s)
        {
            return invalid("warm_up_s must be non-negative and shorter than duration_s");
        }
        Ok(())
    }

    /// The settings a scenario file gives, over the defaults; its loads as
    /// load levels (a load given in users is shown with the utilisation it
    /// offers); the scenario itself replaces the built-in fleet.
    pub fn from_scenario(scenario: &Scenario) -> SimConfig {
        let defaults = SimConfig::default();
        let settings = &scenario.settings;
        let loads = scenario
            .loads
            .iter()
            .map(|load| LoadLevel {
                name: load.name.clone(),
                utilisation: match (load.utilisation, load.users) {
                    (Some(utilisation), _) => utilisation,
                    (None, Some(users)) => workload::offered_utilisation(scenario, users),
                    (None, None) => 0.0,
                },
            })
            .collect::<Vec<_>>();
        SimConfig {
            seed: settings.seeds.first().copied().unwrap_or(defaults.seed),
            duration_s: settings.duration_s.unwrap_or(defaults.duration_s),
            warm_up_s: settings.warm_up_s.unwrap_or(0.0),
            drain_s: settings.drain_s.unwrap_or(defaults.drain_s),
            failure_rate_per_hour: settings
                .failure_rate_per_hour
                .unwrap_or(defaults.failure_rate_per_hour),
            repair_s: settings.repair_s.unwrap_or(defaults.repair_s),
            round_ms: settings.round_ms.unwrap_or(defaults.round_ms),
            mobility_period_s: settings
                .mobility_period_s
                .unwrap_or(defaults.mobility_period_s),
            max_attempts: settings.max_attempts.unwrap_or(defaults.max_attempts),
            loads: if loads.is_empty() {
                defaults.loads.clone()
            } else {
                loads
            },
            policies: if settings.policies.is_empty() {
                defaults.policies.clone()
            } else {
                settings.policies.clone()
            },
            scenario: Some(Box::new(scenario.clone())),
            ..defaults
        }
    }
}

/// Runs every policy at every load level and gathers the report.
pub fn run(
    config: &SimConfig,
    stopwatch: &mut dyn Stopwatch,
    progress: &mut dyn FnMut(SimProgress),
) -> Result<SimReport, SimError> {
    config.validate()?;
    // Check every name before the first (long) run.
    let scenario = workload::scenario_of(config)?;
    for name in &config.policies {
        crate::catalog::for_scenario(
            name,
            config.seed,
            &config.heuristic,
            &config.models,
            scenario.mean_cloud_probability(),
        )?;
    }
    let total_runs = config.loads.len() * config.policies.len();
    let mut finished_runs = 0;
    let mut loads = Vec::with_capacity(config.loads.len());
    for (load_index, load) in config.loads.iter().enumerate() {
        let environment = workload::Environment::generate(config, load_index, load)?;
        let mut rows = Vec::with_capacity(config.policies.len());
        for name in &config.policies {
            let mut policy = crate::catalog::for_scenario(
                name,
                config.seed,
                &config.heuristic,
                &config.models,
                scenario.mean_cloud_probability(),
            )?;
            let row = engine::simulate(
                config,
                &environment,
                policy.as_mut(),
                stopwatch,
                &mut |_| {},
            );
            rows.push(row);
            finished_runs += 1;
            progress(SimProgress {
                load: load.name.clone(),
                policy: name.clone(),
                finished_runs,
                total_runs,
            });
        }
        loads.push(LoadReport {
            load: load.clone(),
            arrival_rate_per_s: environment.arrival_rate_per_s,
            tasks: environment
                .tasks
                .iter()
                .filter(|task| environment.counted(task))
                .count(),
            rows,
        });
    }
    Ok(SimReport {
        seed: config.seed,
        config: config.clone(),
        loads,
    })
}

/// Runs one policy through the world `config` and `load` generate (the first
/// load level's streams), telling `observer` each task's fate as it happens: an
/// episode for the learned policies' trainer, which varies `config.seed` to see
/// a new world each time.
pub fn episode(
    config: &SimConfig,
    load: &LoadLevel,
    policy: &mut dyn crate::policy::Policy,
    stopwatch: &mut dyn Stopwatch,
    observer: &mut dyn FnMut(crate::learned::TaskOutcome),
) -> Result<PolicyRow, SimError> {
    config.validate()?;
    let environment = workload::Environment::generate(config, 0, load)?;
    Ok(engine::simulate(
        config,
        &environment,
        policy,
        stopwatch,
        observer,
    ))
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    fn tiny() -> SimConfig {
        SimConfig {
            duration_s: 15.0,
            nodes_per_profile: 1,
            drain_s: 20.0,
            policies: vec!["heuristic".into(), "least-loaded".into()],
            ..SimConfig::default()
        }
    }

    #[test]
    fn report_has_a_table_per_load_and_a_plot() {
        let mut stopwatch = FakeStopwatch {
            now_ns: 0,
            step_ns: 500,
        };
        let mut seen = Vec::new();
        let report = run(&tiny(), &mut stopwatch, &mut |p| seen.push(p)).unwrap();
        assert_eq!(seen.len(), 6);
        assert_eq!(seen.last().unwrap().finished_runs, 6);
        let markdown = report.to_markdown();
        for load in ["low", "medium", "high"] {
            assert!(
                markdown.contains(&format!("### Load: {load}")),
                "{markdown}"
            );
        }
        assert_eq!(markdown.matches("| heuristic |").count(), 3);
        let json: serde_json::Value = serde_json::from_str(&report.to_json()).unwrap();
        assert_eq!(json["loads"].as_array().unwrap().len(), 3);
        assert_eq!(json["seed"], 42);
        let svg = report.to_svg().unwrap();
        assert!(svg.starts_with("<svg"), "{}", &svg[..80.min(svg.len())]);
        assert!(svg.contains("least-loaded") && svg.contains("energy per task"));
        let claims = report.claims();
        assert!(
            claims[0].starts_with("Deadline completion at high load: the heuristic "),
            "{claims:?}"
        );
        assert!(
            claims[1].starts_with("Energy at low load: the heuristic "),
            "{claims:?}"
        );
        assert!(markdown.contains(&claims[0]));
        // Every decision was timed by the fake stopwatch: one step per round.
        let row = &report.loads[0].rows[0];
        assert!(row.decisions > 0 && row.decision_ns_total > 0);
    }

    #[test]
    fn bad_settings_are_refused_before_running() {
        let mut stopwatch = FakeStopwatch {
            now_ns: 0,
            step_ns: 1,
        };
        let mut config = tiny();
        config.policies.push("oracle".into());
        let error = run(&config, &mut stopwatch, &mut |_| {}).unwrap_err();
        assert!(
            matches!(error, SimError::Policy(PolicyError::Unknown(_))),
            "{error}"
        );
        let mut config = tiny();
        config.duration_s = -1.0;
        let error = run(&config, &mut stopwatch, &mut |_| {}).unwrap_err();
        assert!(error.to_string().contains("duration_s"), "{error}");
        let mut config = tiny();
        config.loads.clear();
        assert!(run(&config, &mut stopwatch, &mut |_| {}).is_err());
        let error = scale(
            &ScaleConfig {
                node_counts: vec![0],
                ..ScaleConfig::default()
            },
            &mut stopwatch,
            &mut |_| {},
        )
        .unwrap_err();
        assert!(error.to_string().contains("node_counts"), "{error}");
    }

    #[test]
    fn scale_reports_ratios_to_least_loaded() {
        let mut stopwatch = FakeStopwatch {
            now_ns: 0,
            step_ns: 1_000_000,
        };
        let config = ScaleConfig {
            node_counts: vec![40, 80],
            pending: 25,
            seed: 3,
            policies: vec!["least-loaded".into(), "heuristic".into()],
            ..ScaleConfig::default()
        };
        let report = scale(&config, &mut stopwatch, &mut |_| {}).unwrap();
        assert_eq!(report.rows.len(), 4);
        for row in &report.rows {
            // The fake stopwatch advances 1 ms per reading: 1 ms per call of 25.
            assert_eq!(row.ns_per_decision, 40_000.0);
            assert_eq!(row.ratio_to_least_loaded, Some(1.0));
            assert!(row.placed > 0 && row.placed <= 25);
        }
        assert!(report.to_markdown().contains("| 80 | 25 | heuristic |"));
        assert!(report.to_json().contains("ratio_to_least_loaded"));
    }
}
