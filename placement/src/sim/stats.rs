//! Results over several seeds: each figure as a mean with a 95% confidence
//! interval (Student's t over the per-seed values), and the ratio of each
//! policy's mean to a baseline's.

use core::fmt::Write as _;

use serde::{Deserialize, Serialize};

use crate::sim::report::percent;
use crate::sim::{SimConfig, SimError, SimProgress, SimReport, Stopwatch};

/// Two-sided 95% quantiles of Student's t for 1 to 30 degrees of freedom.
const T95: [f64; 30] = [
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160,
    2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056,
    2.052, 2.048, 2.045, 2.042,
];

/// A mean and the half-width of its 95% confidence interval.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Interval {
    /// The mean over seeds.
    pub mean: f64,
    /// Half the width of the 95% interval (0 with one seed).
    pub half_width: f64,
}

impl Interval {
    /// The mean and 95% interval of `values`.
    pub fn of(values: &[f64]) -> Interval {
        let count = values.len();
        if count == 0 {
            return Interval::default();
        }
        let mean = values.iter().sum::<f64>() / count as f64;
        if count == 1 {
            return Interval {
                mean,
                half_width: 0.0,
            };
        }
        let variance = values
            .iter()
            .map(|value| (value - mean).powi(2))
            .sum::<f64>()
            / (count - 1) as f64;
        let t = T95.get(count - 2).copied().unwrap_or(1.96);
        Interval {
            mean,
            half_width: t * (variance / count as f64).sqrt(),
        }
    }
}

/// One policy at one load over every seed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SeedsRow {
    /// The load level's name.
    pub load: String,
    /// The policy.
    pub policy: String,
    /// Tasks that arrived, mean over seeds.
    pub tasks: f64,
    /// Deadline completion (success rate).
    pub deadline_completion_rate: Interval,
    /// Mean latency, ms.
    pub mean_latency_ms: Interval,
    /// 95th-percentile latency, ms.
    pub p95_latency_ms: Interval,
    /// Energy per finished task, J.
    pub energy_per_task_joules: Interval,
    /// Mean latency over the baseline's (means over seeds).
    pub latency_ratio: Option<f64>,
    /// Energy per task over the baseline's.
    pub energy_ratio: Option<f64>,
    /// Decision time per task, µs, by the caller's stopwatch (wall clock).
    pub decision_us: f64,
}

/// A scenario's results over several seeds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SeedsReport {
    /// The scenario's name.
    pub scenario: String,
    /// The seeds, in run order.
    pub seeds: Vec<u64>,
    /// The policy the ratios are to.
    pub baseline: String,
    /// One row per load and policy, in run order.
    pub rows: Vec<SeedsRow>,
    /// Each seed's full report.
    pub runs: Vec<SimReport>,
}

/// Runs `config` once per seed and gathers the intervals; ratios are to
/// `baseline` (the first policy when it is not among them).
pub fn run_seeds(
    config: &SimConfig,
    seeds: &[u64],
    baseline: &str,
    stopwatch: &mut dyn Stopwatch,
    progress: &mut dyn FnMut(SimProgress),
) -> Result<SeedsReport, SimError> {
    if seeds.is_empty() {
        return Err(SimError::InvalidConfig(
            "at least one seed is needed".into(),
        ));
    }
    let total_runs = seeds.len() * config.loads.len() * config.policies.len();
    let mut runs = Vec::with_capacity(seeds.len());
    for (index, seed) in seeds.iter().enumerate() {
        let seeded = SimConfig {
            seed: *seed,
            ..config.clone()
        };
        let done = index * config.loads.len() * config.policies.len();
        let report = crate::sim::run(&seeded, stopwatch, &mut |p: SimProgress| {
            progress(SimProgress {
                finished_runs: done + p.finished_runs,
                total_runs,
                load: format!("seed {seed} · {}", p.load),
                ..p
            });
        })?;
        runs.push(report);
    }
    let baseline = if config.policies.iter().any(|name| name == baseline) {
        baseline.to_owned()
    } else {
        config.policies.first().cloned().unwrap_or_default()
    };
    let mut rows = Vec::new();
    for (load_index, load) in config.loads.iter().enumerate() {
        let mut load_rows = Vec::new();
        for (policy_index, policy) in config.policies.iter().enumerate() {
            let per_seed: Vec<&crate::sim::PolicyRow> = runs
                .iter()
                .filter_map(|run| run.loads.get(load_index)?.rows.get(policy_index))
                .collect();
            let take = |field: fn(&crate::sim::PolicyRow) -> f64| {
                Interval::of(&per_seed.iter().map(|row| field(row)).collect::<Vec<_>>())
            };
            let decisions: u64 = per_seed.iter().map(|row| row.decisions).sum();
            let decision_ns: u64 = per_seed.iter().map(|row| row.decision_ns_total).sum();
            load_rows.push(SeedsRow {
                load: load.name.clone(),
                policy: policy.clone(),
                tasks: take(|row| row.tasks as f64).mean,
                deadline_completion_rate: take(|row| row.deadline_completion_rate),
                mean_latency_ms: take(|row| row.mean_latency_ms),
                p95_latency_ms: take(|row| row.p95_latency_ms),
                energy_per_task_joules: take(|row| row.energy_per_task_joules),
                latency_ratio: None,
                energy_ratio: None,
                decision_us: decision_ns as f64 / decisions.max(1) as f64 / 1000.0,
            });
        }
        let base = load_rows
            .iter()
            .find(|row| row.policy == baseline)
            .map(|row| (row.mean_latency_ms.mean, row.energy_per_task_joules.mean));
        if let Some((latency, energy)) = base {
            for row in &mut load_rows {
                row.latency_ratio = (latency > 0.0).then(|| row.mean_latency_ms.mean / latency);
                row.energy_ratio = (energy > 0.0).then(|| row.energy_per_task_joules.mean / energy);
            }
        }
        rows.extend(load_rows);
    }
    let scenario = config
        .scenario
        .as_ref()
        .map(|scenario| scenario.name.clone())
        .unwrap_or_else(|| format!("{:?}", config.fleet).to_lowercase());
    Ok(SeedsReport {
        scenario,
        seeds: seeds.to_vec(),
        baseline,
        rows,
        runs,
    })
}

/// Seeds the pinned small runs use: the first of the scenario's seeds.
pub const PINNED_SEEDS: usize = 2;

/// The pinned small size of a configuration, which the committed tables in
/// `docs/bench/pinned/` hold and a test re-runs: 15 s of arrivals (a warm-up
/// cut to a fifth of it), at most 3 devices of each fixed-count profile, a
/// 30 s drain.
pub fn pinned(config: &SimConfig) -> SimConfig {
    let mut small = SimConfig {
        duration_s: 15.0,
        warm_up_s: config.warm_up_s.min(3.0),
        drain_s: config.drain_s.min(30.0),
        nodes_per_profile: config.nodes_per_profile.min(3),
        ..config.clone()
    };
    if let Some(scenario) = small.scenario.as_mut() {
        for device in &mut scenario.devices {
            device.count = device.count.min(3);
        }
    }
    small
}

fn ratio(value: Option<f64>) -> String {
    value.map_or_else(|| "–".to_owned(), |ratio| format!("{ratio:.2}"))
}

impl SeedsReport {
    /// The table as Markdown. With `decision_time` false the wall-clock
    /// column is left out, so the table is the same on every run of the same
    /// seeds (what the committed tables hold).
    pub fn to_markdown(&self, decision_time: bool) -> String {
        let mut out = String::new();
        let seeds: Vec<String> = self.seeds.iter().map(u64::to_string).collect();
        let _ = writeln!(
            out,
            "Scenario `{}`, seeds {} ({} runs each); mean ± 95% confidence interval (Student's t over seeds); ratios of means to `{}` at the same load.\n",
            self.scenario,
            seeds.join(", "),
            self.seeds.len(),
            self.baseline
        );
        out.push_str("| load | policy | tasks | success (on time) | mean latency (ms) | p95 latency (ms) | energy per task (J) | latency ratio | energy ratio |");
        if decision_time {
            out.push_str(" decision (µs) |");
        }
        out.push_str("\n| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
        if decision_time {
            out.push_str(" ---: |");
        }
        out.push('\n');
        for row in &self.rows {
            let rate = row.deadline_completion_rate;
            let _ = write!(
                out,
                "| {} | {} | {:.0} | {} ± {:.1} | {:.0} ± {:.0} | {:.0} ± {:.0} | {:.3} ± {:.3} | {} | {} |",
                row.load,
                row.policy,
                row.tasks,
                percent(rate.mean),
                rate.half_width * 100.0,
                row.mean_latency_ms.mean,
                row.mean_latency_ms.half_width,
                row.p95_latency_ms.mean,
                row.p95_latency_ms.half_width,
                row.energy_per_task_joules.mean,
                row.energy_per_task_joules.half_width,
                ratio(row.latency_ratio),
                ratio(row.energy_ratio),
            );
            if decision_time {
                let _ = write!(out, " {:.1} |", row.decision_us);
            }
            out.push('\n');
        }
        out
    }

    /// The report as pretty JSON.
    pub fn to_json(&self) -> String {
        // Plain structs with string keys and numbers always serialise.
        serde_json::to_string_pretty(self).unwrap_or_default()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn intervals_follow_students_t() {
        let one = Interval::of(&[3.0]);
        assert_eq!((one.mean, one.half_width), (3.0, 0.0));
        // Five values 1..=5: mean 3, sample sd sqrt(2.5), t(4) 2.776.
        let five = Interval::of(&[1.0, 2.0, 3.0, 4.0, 5.0]);
        assert_eq!(five.mean, 3.0);
        let expected = 2.776 * (2.5_f64 / 5.0).sqrt();
        assert!((five.half_width - expected).abs() < 1e-12, "{five:?}");
        assert_eq!(Interval::of(&[]), Interval::default());
    }
}
