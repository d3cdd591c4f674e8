//! `starling-coordinator sim`: runs the placement engine's discrete-event
//! simulator (every policy side by side at low, medium and high load), the
//! multi-site federation comparison (`--sites`), or the scale benchmark, and
//! writes the report as Markdown, JSON and (single site) an SVG plot.
//! The engine is pure; this module brings the clock, the files and the
//! progress bar.

use std::path::PathBuf;
use std::time::Instant;

use indicatif::{ProgressBar, ProgressStyle};
use starling_placement::sim::profiles::Fleet;
use starling_placement::sim::{
    self, ScaleConfig, Scenario, ScenarioError, SimConfig, SimError, SimProgress, SitesConfig,
    Stopwatch,
};

/// Arguments of `starling-coordinator sim`.
#[derive(Debug, Clone, clap::Args)]
#[command(after_help = "Examples:
  starling-coordinator sim                               all policies, three loads, seed 42
  starling-coordinator sim --seed 7 --out bench/         also write sim.md, sim.json and sim.svg
  starling-coordinator sim --policies heuristic,least-loaded --duration 30
  starling-coordinator sim --scale                       time one decision at 100, 1 000 and 10 000 nodes
  starling-coordinator sim --policies hirl,heuristic --model hirl.json   a model from `train` instead of the shipped one
  starling-coordinator sim --fleet unseen --nodes-per-profile 50         200 devices of profiles no model trained on
  starling-coordinator sim --sites 3 --out bench/        federation off against on: site 0 overflowing, two
                                                         peers lightly loaded; writes federation.md and .json
  starling-coordinator sim --sites 4 --overflow-load 2 --site-rtt-ms 50 --gossip-interval-ms 500
  starling-coordinator sim --scenario placement/scenarios/pureedgesim-default.toml --out docs/bench
                                                         a fleet and workload from a file, over its seeds
  starling-coordinator sim --seeds 1,2,3,4,5 --out docs/bench   the built-in fleet over five seeds, with
                                                         95% confidence intervals (writes standard.md, .json)

The same seed gives the same table, except the decision-time column, which is
measured with the wall clock.")]
pub struct SimArgs {
    /// Seed of every random stream (arrivals, mobility, failures, random
    /// policy) [default: 42, or a scenario file's seeds].
    #[arg(long)]
    pub seed: Option<u64>,
    /// Run each of these seeds and report means with 95% confidence
    /// intervals (a scenario file's `settings.seeds` when it has some and
    /// neither --seed nor --seeds is given).
    #[arg(long, value_delimiter = ',', value_name = "N,...")]
    pub seeds: Vec<u64>,
    /// A scenario file (TOML): device profiles, task types, load levels and
    /// run settings, in place of the built-in fleet (see placement/scenarios/).
    #[arg(long, value_name = "FILE")]
    pub scenario: Option<PathBuf>,
    /// With several seeds: the policy the latency and energy ratios are to
    /// [default: static-optimisation when it runs, else the first policy].
    #[arg(long, value_name = "NAME")]
    pub baseline: Option<String>,
    /// Only these load levels, by name (`low`, `medium`, a scenario's own).
    #[arg(long, value_delimiter = ',', value_name = "NAME,...")]
    pub loads: Vec<String>,
    /// The pinned small size (2 seeds, shorter runs, fewer nodes) that the
    /// placement crate's tests re-run and compare with docs/bench/pinned/.
    #[arg(long)]
    pub small: bool,
    /// Seconds of arrivals per load level.
    #[arg(long, value_name = "SECONDS")]
    pub duration: Option<f64>,
    /// Nodes of each device profile (Raspberry Pi, Jetson, mini PC, I/O gateway).
    #[arg(long, value_name = "N")]
    pub nodes_per_profile: Option<usize>,
    /// Device failures per node-hour.
    #[arg(long, value_name = "RATE")]
    pub failure_rate: Option<f64>,
    /// Hidden spread of the devices' speed against what they declare: each
    /// device's work takes exp(σ·z) times the estimate (z normal, drawn once
    /// per device); the policies see only the declared speeds [default: 0].
    #[arg(long, value_name = "SIGMA")]
    pub device_bias: Option<f64>,
    /// Spread of each attempt's run-time noise, σ of its logarithm
    /// [default: 0.1].
    #[arg(long, value_name = "SIGMA")]
    pub runtime_noise: Option<f64>,
    /// Let finished attempts correct each node's estimates, as the
    /// coordinator does (per node and class of work, and per artifact).
    #[arg(long)]
    pub learn_estimates: bool,
    /// Policies to compare, comma-separated (default: all).
    #[arg(long, value_delimiter = ',', value_name = "NAME,...")]
    pub policies: Vec<String>,
    /// Write the report here as sim.md, sim.json and sim.svg (scale.md and
    /// scale.json with --scale, federation.md and federation.json with --sites).
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// Print JSON instead of Markdown.
    #[arg(long)]
    pub json: bool,
    /// Time single placement rounds on large clusters instead of simulating.
    #[arg(long)]
    pub scale: bool,
    /// Cluster sizes for --scale.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "100,1000,10000",
        value_name = "N,..."
    )]
    pub scale_nodes: Vec<usize>,
    /// Pending tasks per round for --scale.
    #[arg(long, default_value_t = 1000, value_name = "N")]
    pub pending: usize,
    /// Model files for the learned policies (hirl, ddqn), each replacing the
    /// shipped model of its policy; repeat or comma-separate.
    #[arg(long, value_delimiter = ',', value_name = "FILE")]
    pub model: Vec<PathBuf>,
    /// Device profiles of the fleet: standard (what the shipped models trained
    /// on) or unseen (Raspberry Pi 5 and Jetson Orin Nano in place of the Pi 4
    /// and the Jetson Nano).
    #[arg(long, default_value = "standard", value_name = "standard|unseen")]
    pub fleet: String,
    /// Simulate this many sites, each with its own fleet and arrivals, and
    /// compare federation (forwarding what a site cannot finish in time to a
    /// peer) off against on; 0: a single site, the usual tables. Default
    /// policies with sites: heuristic, least-loaded, earliest-finish.
    #[arg(long, default_value_t = 0, value_name = "N")]
    pub sites: usize,
    /// With --sites: load offered to site 0, as a fraction of its capacity
    /// (default 1.6: more than it can do).
    #[arg(long, value_name = "FRACTION")]
    pub overflow_load: Option<f64>,
    /// With --sites: load offered to every other site (default 0.3).
    #[arg(long, value_name = "FRACTION")]
    pub site_load: Option<f64>,
    /// With --sites: round-trip time between sites, ms (default 20).
    #[arg(long, value_name = "MS")]
    pub site_rtt_ms: Option<f64>,
    /// With --sites: bandwidth between sites, Mbit/s (default 100).
    #[arg(long, value_name = "MBPS")]
    pub site_mbps: Option<f64>,
    /// With --sites: milliseconds between two digests of a site (default
    /// 1000); peers decide on digests up to this old.
    #[arg(long, value_name = "MS")]
    pub gossip_interval_ms: Option<u64>,
}

/// Why the simulator command failed.
#[derive(Debug, thiserror::Error)]
pub enum SimCommandError {
    /// The simulator refused the settings or failed.
    #[error(transparent)]
    Sim(#[from] SimError),
    /// A model file given with --model cannot be used.
    #[error(transparent)]
    Model(#[from] crate::models::ModelReadError),
    /// A setting is not understood.
    #[error("{0}")]
    Usage(String),
    /// A scenario file cannot be read.
    #[error("cannot read scenario {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The OS's words.
        source: std::io::Error,
    },
    /// A scenario file is not a valid scenario.
    #[error("{path}: {source}")]
    Scenario {
        /// The file.
        path: PathBuf,
        /// What is wrong, with its line.
        source: ScenarioError,
    },
    /// A report file could not be written.
    #[error("cannot write {path}: {source}; pass --out with a writable directory")]
    Write {
        /// The file.
        path: PathBuf,
        /// The OS's words.
        source: std::io::Error,
    },
}

/// The wall clock, handed to the pure simulator to time policy decisions.
struct WallClock(Instant);

impl Stopwatch for WallClock {
    fn now_ns(&mut self) -> u64 {
        u64::try_from(self.0.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }
}

/// Runs the simulator or the scale benchmark and prints the report on stdout.
pub fn run(args: &SimArgs) -> Result<(), SimCommandError> {
    let mut clock = WallClock(Instant::now());
    let bar = ProgressBar::new(0);
    bar.set_style(
        ProgressStyle::with_template("{spinner} [{elapsed_precise}] {bar:30} {pos}/{len} {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let mut progress = |p: SimProgress| {
        bar.set_length(p.total_runs as u64);
        bar.set_position(p.finished_runs as u64);
        bar.set_message(format!("{} · {}", p.load, p.policy));
    };
    let models = args
        .model
        .iter()
        .map(|path| crate::models::read(path))
        .collect::<Result<Vec<_>, _>>()?;
    let fleet = match args.fleet.trim().to_ascii_lowercase().as_str() {
        "standard" => Fleet::Standard,
        "unseen" => Fleet::Unseen,
        other => {
            return Err(SimCommandError::Usage(format!(
                "--fleet {other:?}: expected standard or unseen"
            )))
        }
    };
    let site_flags = args.overflow_load.is_some()
        || args.site_load.is_some()
        || args.site_rtt_ms.is_some()
        || args.site_mbps.is_some()
        || args.gossip_interval_ms.is_some();
    if args.sites == 0 && site_flags {
        return Err(SimCommandError::Usage(
            "--overflow-load, --site-load, --site-rtt-ms, --site-mbps and --gossip-interval-ms need --sites".to_owned(),
        ));
    }
    if args.sites == 1 {
        return Err(SimCommandError::Usage(
            "--sites 1: federation needs at least 2 sites (0 runs the single-site tables)"
                .to_owned(),
        ));
    }
    if (args.sites > 0 || args.scale)
        && (args.scenario.is_some()
            || !args.seeds.is_empty()
            || args.small
            || !args.loads.is_empty())
    {
        return Err(SimCommandError::Usage(
            "--scenario, --seeds and --small run the single-site tables; leave out --sites and --scale".to_owned(),
        ));
    }
    if args.sites > 0 && args.scale {
        return Err(SimCommandError::Usage(
            "--sites and --scale are separate runs; pass one of them".to_owned(),
        ));
    }
    let files: Vec<(String, String)> = if args.sites > 0 {
        let defaults = SitesConfig::default();
        let mut config = SitesConfig {
            sites: args.sites,
            overflow_load: args.overflow_load.unwrap_or(defaults.overflow_load),
            site_load: args.site_load.unwrap_or(defaults.site_load),
            gossip_interval_ms: args
                .gossip_interval_ms
                .unwrap_or(defaults.gossip_interval_ms),
            ..defaults
        };
        config.link.rtt_ms = args.site_rtt_ms.unwrap_or(config.link.rtt_ms);
        config.link.bandwidth_mbps = args.site_mbps.unwrap_or(config.link.bandwidth_mbps);
        config.sim.seed = args.seed.unwrap_or(DEFAULT_SEED);
        config.sim.fleet = fleet;
        config.sim.models = models;
        apply_sim_flags(args, &mut config.sim);
        let report = sim::run_sites(&config, &mut clock, &mut progress)?;
        bar.finish_and_clear();
        print_report(args.json, &report.to_markdown(), &report.to_json());
        vec![
            ("federation.md".to_owned(), report.to_markdown()),
            ("federation.json".to_owned(), report.to_json()),
        ]
    } else if args.scale {
        let mut config = ScaleConfig {
            seed: args.seed.unwrap_or(DEFAULT_SEED),
            node_counts: args.scale_nodes.clone(),
            pending: args.pending,
            models: models.clone(),
            ..ScaleConfig::default()
        };
        if !args.policies.is_empty() {
            config.policies = args.policies.clone();
        }
        let report = sim::scale(&config, &mut clock, &mut progress)?;
        bar.finish_and_clear();
        print_report(args.json, &report.to_markdown(), &report.to_json());
        vec![
            ("scale.md".to_owned(), report.to_markdown()),
            ("scale.json".to_owned(), report.to_json()),
        ]
    } else {
        single_site(args, fleet, models, &mut clock, &mut progress)?
    };
    bar.finish_and_clear();
    if let Some(dir) = &args.out {
        std::fs::create_dir_all(dir).map_err(|source| SimCommandError::Write {
            path: dir.clone(),
            source,
        })?;
        for (name, content) in files {
            let path = dir.join(&name);
            std::fs::write(&path, content)
                .map_err(|source| SimCommandError::Write { path, source })?;
        }
    }
    Ok(())
}

/// The seed when none is given.
const DEFAULT_SEED: u64 = 42;

/// Reads and parses a scenario file.
fn read_scenario(path: &std::path::Path) -> Result<Scenario, SimCommandError> {
    let text = std::fs::read_to_string(path).map_err(|source| SimCommandError::Read {
        path: path.to_owned(),
        source,
    })?;
    sim::scenario::parse(&text).map_err(|source| SimCommandError::Scenario {
        path: path.to_owned(),
        source,
    })
}

/// The single-site tables: one seed as before, or several (a scenario's, or
/// --seeds) with confidence intervals. Returns the files to write.
fn single_site(
    args: &SimArgs,
    fleet: Fleet,
    models: Vec<starling_placement::learned::ModelFile>,
    clock: &mut WallClock,
    progress: &mut dyn FnMut(SimProgress),
) -> Result<Vec<(String, String)>, SimCommandError> {
    let scenario = args.scenario.as_deref().map(read_scenario).transpose()?;
    let mut config = match &scenario {
        Some(scenario) => SimConfig::from_scenario(scenario),
        None => SimConfig {
            fleet,
            ..SimConfig::default()
        },
    };
    config.models = models;
    if let Some(seed) = args.seed {
        config.seed = seed;
    } else if scenario.is_none() {
        config.seed = DEFAULT_SEED;
    }
    apply_sim_flags(args, &mut config);
    if !args.loads.is_empty() {
        config.loads.retain(|load| args.loads.contains(&load.name));
        if config.loads.is_empty() {
            return Err(SimCommandError::Usage(format!(
                "--loads {}: no such load level",
                args.loads.join(",")
            )));
        }
    }
    if let (Some(scenario), Some(nodes)) = (config.scenario.as_mut(), args.nodes_per_profile) {
        for device in &mut scenario.devices {
            if device.count > 0 {
                device.count = nodes;
            }
        }
    }
    let file_seeds = scenario
        .as_ref()
        .map(|scenario| scenario.settings.seeds.clone())
        .unwrap_or_default();
    let mut seeds = if !args.seeds.is_empty() {
        args.seeds.clone()
    } else if args.seed.is_none() && (!file_seeds.is_empty() || args.small) {
        if file_seeds.is_empty() {
            // The standard file's reported seeds.
            sim::scenario::shipped("standard")
                .map_err(SimError::from)?
                .settings
                .seeds
        } else {
            file_seeds
        }
    } else {
        Vec::new()
    };
    if args.small {
        config = sim::pinned(&config);
        seeds.truncate(sim::PINNED_SEEDS);
    }
    let tuning = match &scenario {
        Some(scenario) => scenario.settings.tuning_seeds.clone(),
        None => {
            fleet
                .scenario()
                .map_err(SimError::from)?
                .settings
                .tuning_seeds
        }
    };
    if let Some(seed) = seeds.iter().find(|seed| tuning.contains(seed)) {
        return Err(SimCommandError::Usage(format!(
            "--seeds {seed}: a tuning seed of this scenario; tables report other seeds"
        )));
    }
    if seeds.is_empty() {
        let report = sim::run(&config, clock, progress)?;
        print_report(args.json, &report.to_markdown(), &report.to_json());
        return Ok(vec![
            ("sim.md".to_owned(), report.to_markdown()),
            ("sim.json".to_owned(), report.to_json()),
            ("sim.svg".to_owned(), report.to_svg()?),
        ]);
    }
    let baseline = args
        .baseline
        .clone()
        .unwrap_or_else(|| "static-optimisation".to_owned());
    let report = sim::run_seeds(&config, &seeds, &baseline, clock, progress)?;
    let markdown = report.to_markdown(true);
    print_report(args.json, &markdown, &report.to_json());
    Ok(vec![
        (format!("{}.md", report.scenario), markdown),
        (format!("{}.json", report.scenario), report.to_json()),
    ])
}

/// The flags a single-site run and each site of a multi-site run share.
fn apply_sim_flags(args: &SimArgs, config: &mut SimConfig) {
    if let Some(duration) = args.duration {
        config.duration_s = duration;
    }
    if let Some(nodes) = args.nodes_per_profile {
        config.nodes_per_profile = nodes;
    }
    if let Some(rate) = args.failure_rate {
        config.failure_rate_per_hour = rate;
    }
    if !args.policies.is_empty() {
        config.policies = args.policies.clone();
    }
    if let Some(sigma) = args.device_bias {
        config.estimates.device_bias = sigma;
    }
    if let Some(sigma) = args.runtime_noise {
        config.estimates.runtime_noise = sigma;
    }
    if args.learn_estimates {
        config.estimates.learning = true;
    }
}

fn print_report(json: bool, markdown: &str, json_text: &str) {
    if json {
        println!("{json_text}");
    } else {
        println!("{markdown}");
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn a_bad_scenario_file_is_named_with_its_field_and_line() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("fleet.toml");
        std::fs::write(
            &path,
            "name = \"x\"\n\n[[device]]\nname = \"pi\"\ncount = \"many\"\n",
        )
        .unwrap();
        let error = read_scenario(&path).unwrap_err().to_string();
        assert!(
            error.contains("fleet.toml") && error.contains("line 5") && error.contains("count"),
            "{error}"
        );
        let missing = read_scenario(&dir.path().join("absent.toml")).unwrap_err();
        assert!(matches!(missing, SimCommandError::Read { .. }), "{missing}");
    }
}
