//! The scale benchmark: how long one decision takes with many nodes and a long
//! queue, per policy, as a ratio to the least-loaded baseline timed in the same run.

use core::fmt::Write as _;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

use crate::catalog::policy_with_tuning;
use crate::model::{ClusterView, PendingTask};
use crate::policy::{HeuristicTuning, Outcome};
use crate::sim::profiles::standard_profiles;
use crate::sim::workload::Environment;
use crate::sim::{LoadLevel, SimConfig, SimError, SimProgress, Stopwatch};

/// What to time.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ScaleConfig {
    /// Cluster sizes to time.
    pub node_counts: Vec<usize>,
    /// Pending tasks decided in one call.
    pub pending: usize,
    /// Seed of the cluster's loads and the tasks.
    pub seed: u64,
    /// Policies to time; include `least-loaded` to get ratios.
    pub policies: Vec<String>,
    /// Models for the learned policies, replacing the shipped ones.
    #[serde(skip)]
    pub models: Vec<crate::learned::ModelFile>,
}

impl Default for ScaleConfig {
    fn default() -> Self {
        Self {
            node_counts: vec![100, 1_000, 10_000],
            pending: 1_000,
            seed: 42,
            policies: crate::catalog::POLICY_NAMES
                .iter()
                .map(|name| (*name).to_owned())
                .collect(),
            models: Vec::new(),
        }
    }
}

/// One policy at one cluster size.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ScaleRow {
    /// Nodes in the cluster.
    pub nodes: usize,
    /// Tasks decided in the call.
    pub pending: usize,
    /// The policy.
    pub policy: String,
    /// Nanoseconds per decision.
    pub ns_per_decision: f64,
    /// That time over the least-loaded policy's, same size, same run (`None` without it).
    pub ratio_to_least_loaded: Option<f64>,
    /// Tasks placed (the rest were held).
    pub placed: usize,
}

/// The scale benchmark's results.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ScaleReport {
    /// The seed.
    pub seed: u64,
    /// One row per size and policy.
    pub rows: Vec<ScaleRow>,
}

impl ScaleReport {
    /// A Markdown table.
    pub fn to_markdown(&self) -> String {
        let mut out = String::new();
        out.push_str(
            "| nodes | pending | policy | µs per decision | ratio to least-loaded | placed |\n",
        );
        out.push_str("| ---: | ---: | --- | ---: | ---: | ---: |\n");
        for row in &self.rows {
            let ratio = row
                .ratio_to_least_loaded
                .map_or_else(|| "–".to_owned(), |ratio| format!("{ratio:.2}"));
            // Writing to a String cannot fail.
            let _ = writeln!(
                out,
                "| {} | {} | {} | {:.2} | {} | {} |",
                row.nodes,
                row.pending,
                row.policy,
                row.ns_per_decision / 1000.0,
                ratio,
                row.placed
            );
        }
        out
    }

    /// Pretty JSON.
    pub fn to_json(&self) -> String {
        // Plain structs with string keys and numbers always serialise.
        serde_json::to_string_pretty(self).unwrap_or_default()
    }
}

/// A cluster of `count` nodes cycling through the standard profiles, with random
/// loads and links, and 1% of the nodes offline.
pub(crate) fn busy_cluster(count: usize, rng: &mut ChaCha8Rng) -> ClusterView {
    let profiles = standard_profiles();
    let mut nodes = Vec::with_capacity(count);
    for index in 0..count {
        let Some(profile) = profiles.get(index % profiles.len()) else {
            continue;
        };
        let mut node = profile.node(index);
        node.online = rng.random_range(0..100) != 0;
        node.load.backlog_cpu_s = rng.random_range(0.0..20.0);
        if node.gpu_devices() > 0 {
            node.load.backlog_gpu_s = rng.random_range(0.0..10.0);
        }
        node.load.queued_tasks = rng.random_range(0..12);
        let used = rng.random_range(0.0..0.8);
        node.load.free_memory_bytes = ((node.memory_bytes as f64) * (1.0 - used)) as u64;
        node.load.free_cpu_cores = node.cpu_cores * rng.random_range(0.0..1.0);
        node.network.bandwidth_mbps *= rng.random_range(0.2..1.5);
        nodes.push(node);
    }
    ClusterView {
        now_ms: 1_000_000,
        nodes,
    }
}

/// Times every policy's `decide` over `pending` tasks at each cluster size.
pub fn scale(
    config: &ScaleConfig,
    stopwatch: &mut dyn Stopwatch,
    progress: &mut dyn FnMut(SimProgress),
) -> Result<ScaleReport, SimError> {
    if config.node_counts.is_empty() || config.node_counts.iter().any(|n| *n == 0 || *n > 1_000_000)
    {
        return Err(SimError::InvalidConfig(
            "node_counts must list sizes in 1..=1000000".to_owned(),
        ));
    }
    if config.pending == 0 || config.pending > 1_000_000 {
        return Err(SimError::InvalidConfig(
            "pending must be in 1..=1000000".to_owned(),
        ));
    }
    for name in &config.policies {
        policy_with_tuning(
            name,
            config.seed,
            &HeuristicTuning::default(),
            &config.models,
        )?;
    }
    // Tasks come from the simulator's own generator, so the mix is the same.
    let sim_config = SimConfig {
        seed: config.seed,
        duration_s: 3600.0,
        nodes_per_profile: 1,
        failure_rate_per_hour: 0.0,
        ..SimConfig::default()
    };
    let environment = Environment::generate(
        &sim_config,
        0,
        &LoadLevel {
            name: "scale".to_owned(),
            utilisation: 5.0,
        },
    )?;
    let total_runs = config.node_counts.len() * config.policies.len();
    let mut finished_runs = 0;
    let mut rows = Vec::new();
    for &count in &config.node_counts {
        let mut rng = ChaCha8Rng::seed_from_u64(config.seed ^ count as u64);
        let view = busy_cluster(count, &mut rng);
        let queue: Vec<PendingTask> = environment
            .tasks
            .iter()
            .cycle()
            .take(config.pending)
            .enumerate()
            .map(|(index, task)| {
                let mut task = task.clone();
                task.key = index as u64;
                task.submitted_ms = view.now_ms;
                if let Some(deadline) = task.deadline_ms.as_mut() {
                    *deadline = view.now_ms + 60_000;
                }
                task
            })
            .collect();
        let mut size_rows = Vec::new();
        for name in &config.policies {
            let mut policy = policy_with_tuning(
                name,
                config.seed,
                &HeuristicTuning::default(),
                &config.models,
            )?;
            let started = stopwatch.now_ns();
            let decisions = policy.decide(&view, &queue);
            let elapsed = stopwatch.now_ns().saturating_sub(started);
            let placed = decisions
                .iter()
                .filter(|decision| matches!(decision.outcome, Outcome::Place { .. }))
                .count();
            size_rows.push(ScaleRow {
                nodes: count,
                pending: queue.len(),
                policy: policy.name().to_owned(),
                ns_per_decision: elapsed as f64 / queue.len().max(1) as f64,
                ratio_to_least_loaded: None,
                placed,
            });
            finished_runs += 1;
            progress(SimProgress {
                load: format!("{count} nodes"),
                policy: name.clone(),
                finished_runs,
                total_runs,
            });
        }
        let baseline = size_rows
            .iter()
            .find(|row| row.policy == "least-loaded")
            .map(|row| row.ns_per_decision);
        if let Some(baseline) = baseline.filter(|b| *b > 0.0) {
            for row in &mut size_rows {
                row.ratio_to_least_loaded = Some(row.ns_per_decision / baseline);
            }
        }
        rows.extend(size_rows);
    }
    Ok(ScaleReport {
        seed: config.seed,
        rows,
    })
}
