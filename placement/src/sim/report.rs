//! The simulator's report: one table per load level, one row per policy, as
//! Markdown, JSON, and an SVG plot of latency and energy against load.

use core::fmt::Write as _;

use plotters::prelude::*;
use serde::{Deserialize, Serialize};

use crate::sim::{LoadLevel, SimConfig, SimError};

/// One policy's results at one load level.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PolicyRow {
    /// The policy.
    pub policy: String,
    /// Tasks that arrived.
    pub tasks: u64,
    /// Tasks that finished (output delivered).
    pub completed: u64,
    /// Tasks that finished by their deadline.
    pub on_time: u64,
    /// On-time tasks over arrived tasks.
    pub deadline_completion_rate: f64,
    /// Mean submission-to-output latency of finished tasks, ms.
    pub mean_latency_ms: f64,
    /// 95th percentile of that latency, ms.
    pub p95_latency_ms: f64,
    /// Dynamic energy of all executions (failed ones too) per finished task, joules.
    pub energy_per_task_joules: f64,
    /// Attempts lost to device failures (the task was re-queued).
    pub failed_attempts: u64,
    /// Tasks that ran out of attempts.
    pub failed: u64,
    /// Tasks dropped: still pending past their deadline, or unfinished at the end.
    pub dropped: u64,
    /// Decisions asked of the policy (a held task counts once per round).
    pub decisions: u64,
    /// Nanoseconds the policy spent deciding, by the injected stopwatch.
    pub decision_ns_total: u64,
    /// Mean nanoseconds per decision.
    pub decision_ns_per_task: f64,
    /// Placements the simulator refused for breaking a hard constraint (a policy bug; 0 expected).
    pub constraint_violations: u64,
}

impl PolicyRow {
    /// Computes the derived columns.
    pub(crate) fn finish(&mut self, latencies_ms: &mut [f64], energy_joules: f64) {
        latencies_ms.sort_by(f64::total_cmp);
        let count = latencies_ms.len();
        if count > 0 {
            self.mean_latency_ms = latencies_ms.iter().sum::<f64>() / count as f64;
            let rank = ((count as f64) * 0.95).ceil() as usize;
            self.p95_latency_ms = latencies_ms
                .get(rank.saturating_sub(1).min(count - 1))
                .copied()
                .unwrap_or(0.0);
        }
        if self.tasks > 0 {
            self.deadline_completion_rate = self.on_time as f64 / self.tasks as f64;
        }
        if self.completed > 0 {
            self.energy_per_task_joules = energy_joules / self.completed as f64;
        }
        if self.decisions > 0 {
            self.decision_ns_per_task = self.decision_ns_total as f64 / self.decisions as f64;
        }
    }
}

/// The results of every policy at one load level.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LoadReport {
    /// The load level.
    pub load: LoadLevel,
    /// Mean arrivals per second at this load.
    pub arrival_rate_per_s: f64,
    /// Tasks that arrived.
    pub tasks: usize,
    /// One row per policy, in the configured order.
    pub rows: Vec<PolicyRow>,
}

/// The whole run's results.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SimReport {
    /// The seed of every random stream.
    pub seed: u64,
    /// The settings it ran with.
    pub config: SimConfig,
    /// One entry per load level.
    pub loads: Vec<LoadReport>,
}

pub(crate) fn percent(rate: f64) -> String {
    format!("{:.1}%", rate * 100.0)
}

pub(crate) fn micros(ns: f64) -> String {
    format!("{:.1}", ns / 1000.0)
}

impl SimReport {
    /// The tables as Markdown, one per load level.
    pub fn to_markdown(&self) -> String {
        let mut out = String::new();
        let config = &self.config;
        // Writing to a String cannot fail; the results are ignored.
        let _ = writeln!(
            out,
            "Seed {}, {} s of arrivals per load, {} nodes of each of 4 profiles, {} failures per node-hour, placement every {} ms.\n",
            self.seed,
            config.duration_s,
            config.nodes_per_profile,
            config.failure_rate_per_hour,
            config.round_ms
        );
        for load in &self.loads {
            let _ = writeln!(
                out,
                "### Load: {} ({:.0}% of capacity, {:.2} arrivals/s, {} tasks)\n",
                load.load.name,
                load.load.utilisation * 100.0,
                load.arrival_rate_per_s,
                load.tasks
            );
            out.push_str("| policy | mean latency (ms) | p95 latency (ms) | deadline completion | energy per task (J) | failed attempts | failed | dropped | decision time per task (µs) |\n");
            out.push_str("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n");
            for row in &load.rows {
                let _ = writeln!(
                    out,
                    "| {} | {:.0} | {:.0} | {} | {:.2} | {} | {} | {} | {} |",
                    row.policy,
                    row.mean_latency_ms,
                    row.p95_latency_ms,
                    percent(row.deadline_completion_rate),
                    row.energy_per_task_joules,
                    row.failed_attempts,
                    row.failed,
                    row.dropped,
                    micros(row.decision_ns_per_task)
                );
            }
            out.push('\n');
        }
        out.push_str(
            "Deadline completion: tasks finished by their deadline over tasks arrived. \
             Energy per task: dynamic energy (above idle) of every execution, failed ones \
             included, over finished tasks; idle power is the same whatever the policy and \
             left out. Failed attempts: executions lost to a device failure (the task was \
             re-queued). Dropped: still pending past the deadline, or unfinished at the end. \
             Decision time: time in `Policy::decide` over decisions asked (a held task counts \
             once per round), by the caller's stopwatch.\n\n",
        );
        push_claims(
            &mut out,
            "Checks against the issue's targets:",
            &self.claims(),
        );
        out
    }

    /// Plain statements of whether the heuristic met the targets in this
    /// run, with the figures: deadline completion at the highest load against every
    /// baseline, energy at the lowest load against every baseline, and the indexed
    /// search against exhaustive scoring.
    pub fn claims(&self) -> Vec<String> {
        let mut claims = Vec::new();
        let is_baseline = |row: &&PolicyRow| !row.policy.starts_with("heuristic");
        let by_utilisation =
            |a: &&LoadReport, b: &&LoadReport| a.load.utilisation.total_cmp(&b.load.utilisation);
        if let Some(high) = self.loads.iter().max_by(by_utilisation) {
            let heuristic = high.rows.iter().find(|row| row.policy == "heuristic");
            let best = high.rows.iter().filter(is_baseline).max_by(|a, b| {
                a.deadline_completion_rate
                    .total_cmp(&b.deadline_completion_rate)
            });
            if let (Some(heuristic), Some(best)) = (heuristic, best) {
                let verdict = if heuristic.deadline_completion_rate > best.deadline_completion_rate
                {
                    "beats every baseline"
                } else {
                    "does NOT beat every baseline"
                };
                claims.push(format!(
                    "Deadline completion at {} load: the heuristic {verdict}: {} against {} for {}, the best baseline.",
                    high.load.name,
                    percent(heuristic.deadline_completion_rate),
                    percent(best.deadline_completion_rate),
                    best.policy
                ));
            }
        }
        if let Some(low) = self.loads.iter().min_by(by_utilisation) {
            let heuristic = low.rows.iter().find(|row| row.policy == "heuristic");
            let best = low
                .rows
                .iter()
                .filter(is_baseline)
                .filter(|row| row.completed > 0)
                .min_by(|a, b| {
                    a.energy_per_task_joules
                        .total_cmp(&b.energy_per_task_joules)
                });
            if let (Some(heuristic), Some(best)) = (heuristic, best) {
                let saving =
                    1.0 - heuristic.energy_per_task_joules / best.energy_per_task_joules.max(1e-12);
                let verdict = if saving > 0.0 {
                    format!(
                        "uses {:.0}% less energy per task than the most frugal baseline",
                        saving * 100.0
                    )
                } else {
                    format!(
                        "does NOT use less energy than every baseline ({:.0}% more)",
                        -saving * 100.0
                    )
                };
                claims.push(format!(
                    "Energy at {} load: the heuristic {verdict}: {:.2} J against {:.2} J for {}.",
                    low.load.name,
                    heuristic.energy_per_task_joules,
                    best.energy_per_task_joules,
                    best.policy
                ));
            }
        }
        for load in &self.loads {
            let indexed = load.rows.iter().find(|row| row.policy == "heuristic");
            let exhaustive = load
                .rows
                .iter()
                .find(|row| row.policy == "heuristic-exhaustive");
            if let (Some(indexed), Some(exhaustive)) = (indexed, exhaustive) {
                let gap = (exhaustive.deadline_completion_rate - indexed.deadline_completion_rate)
                    * 100.0;
                let verdict = if gap.abs() <= 1.0 {
                    "within"
                } else {
                    "NOT within"
                };
                claims.push(format!(
                    "Indexed search at {} load: deadline completion {} against {} with exhaustive scoring ({verdict} 1 point).",
                    load.load.name,
                    percent(indexed.deadline_completion_rate),
                    percent(exhaustive.deadline_completion_rate)
                ));
            }
        }
        claims
    }

    /// The report as pretty JSON.
    pub fn to_json(&self) -> String {
        // Plain structs with string keys and numbers always serialise.
        serde_json::to_string_pretty(self).unwrap_or_default()
    }

    /// An SVG plot, as a string: mean latency and energy per task against load, one
    /// line per policy.
    pub fn to_svg(&self) -> Result<String, SimError> {
        let mut svg = String::new();
        {
            let plot_error = |error: &dyn core::fmt::Display| SimError::Plot(error.to_string());
            let root = SVGBackend::with_string(&mut svg, (1100, 480)).into_drawing_area();
            root.fill(&WHITE).map_err(|e| plot_error(&e))?;
            let (left, right) = root.split_horizontally(550);
            let policies: Vec<String> = self
                .loads
                .first()
                .map(|load| load.rows.iter().map(|row| row.policy.clone()).collect())
                .unwrap_or_default();
            let x_max = self
                .loads
                .iter()
                .map(|load| load.load.utilisation)
                .fold(0.0_f64, f64::max)
                .max(0.1)
                * 1.05;
            type Panel<'p, 'b> = (
                &'p DrawingArea<SVGBackend<'b>, plotters::coord::Shift>,
                &'static str,
                fn(&PolicyRow) -> f64,
            );
            let panels: [Panel<'_, '_>; 2] = [
                (&left, "mean latency (ms)", |row| row.mean_latency_ms),
                (&right, "energy per task (J)", |row| {
                    row.energy_per_task_joules
                }),
            ];
            for (area, label, value) in panels {
                let y_max = self
                    .loads
                    .iter()
                    .flat_map(|load| load.rows.iter().map(value))
                    .filter(|v| v.is_finite())
                    .fold(0.0_f64, f64::max)
                    .max(1e-3)
                    * 1.1;
                let mut chart = ChartBuilder::on(area)
                    .caption(format!("{label} against load"), ("sans-serif", 18))
                    .margin(12)
                    .x_label_area_size(36)
                    .y_label_area_size(56)
                    .build_cartesian_2d(0.0..x_max, 0.0..y_max)
                    .map_err(|e| plot_error(&e))?;
                chart
                    .configure_mesh()
                    .x_desc("offered load (fraction of capacity)")
                    .y_desc(label)
                    .draw()
                    .map_err(|e| plot_error(&e))?;
                for (index, policy) in policies.iter().enumerate() {
                    let color = Palette99::pick(index).to_rgba();
                    let points: Vec<(f64, f64)> = self
                        .loads
                        .iter()
                        .filter_map(|load| {
                            load.rows
                                .iter()
                                .find(|row| &row.policy == policy)
                                .map(|row| (load.load.utilisation, value(row)))
                        })
                        .collect();
                    chart
                        .draw_series(LineSeries::new(points, color.stroke_width(2)))
                        .map_err(|e| plot_error(&e))?
                        .label(policy.clone())
                        .legend(move |(x, y)| {
                            PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2))
                        });
                }
                chart
                    .configure_series_labels()
                    .position(SeriesLabelPosition::UpperLeft)
                    .background_style(WHITE.mix(0.8))
                    .border_style(BLACK)
                    .draw()
                    .map_err(|e| plot_error(&e))?;
            }
            root.present().map_err(|e| plot_error(&e))?;
        }
        Ok(svg)
    }
}

/// Appends `claims` as a Markdown list under `heading`; nothing when empty.
pub(crate) fn push_claims(out: &mut String, heading: &str, claims: &[String]) {
    if claims.is_empty() {
        return;
    }
    let _ = writeln!(out, "{heading}\n");
    for claim in claims {
        let _ = writeln!(out, "- {claim}");
    }
    out.push('\n');
}
