//! `starling-coordinator train`: trains a learned placement policy in the
//! simulator and writes its model file and learning curve. The learning is
//! `starling-learn`'s; this module brings the files, the clock and the
//! progress bar.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use indicatif::{ProgressBar, ProgressStyle};
use starling_learn::{EpisodeStats, LearnError, TrainConfig};
use starling_placement::learned::{LearnedKind, PowerAction, RewardShape};
use starling_placement::sim::LoadLevel;

/// Arguments of `starling-coordinator train`.
#[derive(Debug, Clone, clap::Args)]
#[command(after_help = "Examples:
  starling-coordinator train --policy hirl --out hirl.json
  starling-coordinator train --policy ddqn --load high --seed 7 --episodes 60 --out ddqn-high.json
  starling-coordinator train --policy hirl --latency-margin 0 --power-action speed --out first-hirl.json
  starling-coordinator serve --policy hirl --model hirl.json

Each episode is a fresh simulated world (arrivals, failures, link changes) of
--nodes-per-profile devices of each standard profile, played by the policy
with exploration on; the networks learn between episodes. Besides the model,
FILE's stem gets a .curve.csv with one line per episode (the learning curve).
The same seed and settings give the same model.")]
pub struct TrainArgs {
    /// Which policy: hirl (DDQN placement + TD3 power) or ddqn (one DDQN over node and level).
    #[arg(long, value_name = "hirl|ddqn")]
    pub policy: String,
    /// Offered loads to train at, cycled: low, medium, high or a fraction of capacity.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "low,medium,high",
        value_name = "LOAD,..."
    )]
    pub load: Vec<String>,
    /// Seed of the worlds, the initial weights and the exploration.
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// Devices of each of the four standard profiles in the training fleet.
    #[arg(long, default_value_t = 5, value_name = "N")]
    pub nodes_per_profile: usize,
    /// Episodes to play.
    #[arg(long, default_value_t = 150, value_name = "N")]
    pub episodes: u32,
    /// Seconds of arrivals per episode.
    #[arg(long, default_value_t = 30.0, value_name = "SECONDS")]
    pub episode_seconds: f64,
    /// Gradient steps after each episode.
    #[arg(long, default_value_t = 150, value_name = "N")]
    pub updates: u32,
    /// Width of the networks' hidden layers.
    #[arg(long, default_value_t = 32, value_name = "N")]
    pub hidden: usize,
    /// Share of each task's deadline budget its latency may use before the
    /// reward charges it (0: every millisecond costs, as the first models had).
    #[arg(long, default_value_t = RewardShape::DEADLINE_MARGIN.latency_margin, value_name = "SHARE")]
    pub latency_margin: f64,
    /// What HiRL's power actor answers: slack-share (the share of the task's
    /// slack it may spend running slower) or speed (a fraction of top speed, as
    /// the first models had).
    #[arg(long, default_value = "slack-share", value_name = "slack-share|speed")]
    pub power_action: String,
    /// Where to write the model file.
    #[arg(long, value_name = "FILE")]
    pub out: PathBuf,
    /// Print the summary as JSON.
    #[arg(long)]
    pub json: bool,
}

/// Why training failed.
#[derive(Debug, thiserror::Error)]
pub enum TrainCommandError {
    /// A setting is not understood.
    #[error("{0}")]
    Usage(String),
    /// The trainer failed.
    #[error(transparent)]
    Learn(#[from] LearnError),
    /// A file could not be written.
    #[error("cannot write {path}: {source}")]
    Write {
        /// The file.
        path: PathBuf,
        /// The OS's words.
        source: std::io::Error,
    },
}

/// A load by name (`low`, `medium`, `high`) or as a fraction of capacity.
pub fn parse_load(text: &str) -> Result<f64, TrainCommandError> {
    match text.trim().to_ascii_lowercase().as_str() {
        "low" => Ok(LoadLevel::low().utilisation),
        "medium" => Ok(LoadLevel::medium().utilisation),
        "high" => Ok(LoadLevel::high().utilisation),
        other => other
            .parse::<f64>()
            .ok()
            .filter(|load| load.is_finite() && *load > 0.0 && *load <= 5.0)
            .ok_or_else(|| {
                TrainCommandError::Usage(format!(
                    "--load {text:?}: expected low, medium, high or a fraction of capacity in (0, 5]"
                ))
            }),
    }
}

/// The learning curve's file beside the model: `hirl.json` → `hirl.curve.csv`.
pub fn curve_path(model: &Path) -> PathBuf {
    model.with_extension("curve.csv")
}

/// The learning curve as CSV, one line per episode.
pub fn curve_csv(curve: &[EpisodeStats]) -> String {
    let mut out = String::from(
        "episode,load,epsilon,tasks,on_time_rate,mean_reward,loss,power_loss,failure_share\n",
    );
    for point in curve {
        let _ = writeln!(
            out,
            "{},{},{:.3},{},{:.4},{:.4},{:.5},{:.5},{:.3}",
            point.episode,
            point.load,
            point.epsilon,
            point.tasks,
            point.on_time_rate,
            point.mean_reward,
            point.loss,
            point.power_loss,
            point.failure_share
        );
    }
    out
}

fn write(path: &Path, text: &str) -> Result<(), TrainCommandError> {
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent).map_err(|source| TrainCommandError::Write {
            path: parent.to_owned(),
            source,
        })?;
    }
    std::fs::write(path, text).map_err(|source| TrainCommandError::Write {
        path: path.to_owned(),
        source,
    })
}

/// Trains, writes the model and its curve, prints a summary.
pub fn run(args: &TrainArgs) -> Result<(), TrainCommandError> {
    let kind = LearnedKind::from_name(&args.policy).ok_or_else(|| {
        TrainCommandError::Usage(format!(
            "--policy {:?}: expected hirl or ddqn (the heuristic and the baselines are not trained)",
            args.policy
        ))
    })?;
    let loads = args
        .load
        .iter()
        .map(|load| parse_load(load))
        .collect::<Result<Vec<_>, _>>()?;
    let command = format!(
        "starling-coordinator train --policy {} --load {} --seed {} --nodes-per-profile {} --episodes {} --episode-seconds {} --updates {} --hidden {} --latency-margin {} --power-action {} --out {}",
        kind.as_str(),
        args.load.join(","),
        args.seed,
        args.nodes_per_profile,
        args.episodes,
        args.episode_seconds,
        args.updates,
        args.hidden,
        args.latency_margin,
        args.power_action,
        args.out.display()
    );
    let power_action = PowerAction::from_name(&args.power_action).ok_or_else(|| {
        TrainCommandError::Usage(format!(
            "--power-action {:?}: expected slack-share or speed",
            args.power_action
        ))
    })?;
    let reward = RewardShape {
        latency_margin: args.latency_margin,
    };
    if !reward.is_valid() {
        return Err(TrainCommandError::Usage(format!(
            "--latency-margin {}: expected a share of the budget in [0, 1)",
            args.latency_margin
        )));
    }
    let config = TrainConfig {
        kind,
        seed: args.seed,
        loads,
        nodes_per_profile: args.nodes_per_profile,
        episodes: args.episodes,
        episode_s: args.episode_seconds,
        updates_per_episode: args.updates,
        hidden: args.hidden,
        reward,
        power_action,
        command,
        ..TrainConfig::default()
    };
    let bar = ProgressBar::new(u64::from(args.episodes));
    bar.set_style(
        ProgressStyle::with_template(
            "{spinner} [{elapsed_precise}] {bar:30} {pos}/{len} episodes {msg}",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let started = std::time::Instant::now();
    let mut trained = starling_learn::train(&config, &mut |point| {
        bar.set_position(u64::from(point.episode) + 1);
        bar.set_message(format!(
            "load {:.2} · on time {:.1}% · loss {:.4} · ε {:.2}",
            point.load,
            point.on_time_rate * 100.0,
            point.loss,
            point.epsilon
        ));
        if point.episode % 10 == 9 {
            tracing::info!(
                episode = point.episode + 1,
                load = point.load,
                on_time = point.on_time_rate,
                reward = point.mean_reward,
                loss = point.loss,
                power_loss = point.power_loss,
                epsilon = point.epsilon,
                "training"
            );
        }
    })?;
    bar.finish_and_clear();
    trained.model.training.seconds = (started.elapsed().as_secs_f64() * 10.0).round() / 10.0;
    write(&args.out, &trained.model.to_json())?;
    let curve = curve_path(&args.out);
    write(&curve, &curve_csv(&trained.curve))?;
    if args.json {
        let evaluation: Vec<serde_json::Value> = trained
            .evaluation
            .iter()
            .map(|(load, row)| serde_json::json!({ "load": load, "result": row }))
            .collect();
        let summary = serde_json::json!({
            "model": args.out,
            "curve": curve,
            "training": trained.model.training,
            "evaluation": evaluation,
        });
        println!("{summary:#}");
    } else {
        println!(
            "trained {} in {:.1} s ({} episodes, {} gradient steps); model: {}; learning curve: {}",
            kind.as_str(),
            trained.model.training.seconds,
            trained.model.training.episodes,
            trained.model.training.steps,
            args.out.display(),
            curve.display()
        );
        for (load, row) in &trained.evaluation {
            println!(
                "  held-out world at load {load:.2}: {:.1}% on time, mean latency {:.0} ms, {:.2} J per task",
                row.deadline_completion_rate * 100.0,
                row.mean_latency_ms,
                row.energy_per_task_joules
            );
        }
    }
    Ok(())
}
