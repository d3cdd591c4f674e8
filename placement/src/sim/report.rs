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

fn percent(rate: f64) -> String {
    format!("{:.1}%", rate * 100.0)
}

fn micros(ns: f64) -> String {
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
        out
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
