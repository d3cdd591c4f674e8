//! The baselines the heuristic is measured against: random, round robin, least
//! loaded, Kubernetes-style scoring, earliest finish time at full power, and a
//! static optimisation (one fixed power level, each batch assigned by list
//! scheduling). All of them serve the queue in arrival order, and all but the
//! static optimisation run every task at the node's highest power level, which is
//! what a scheduler unaware of DVFS does.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::estimate::FilterTally;
use crate::model::{ClusterView, PendingTask};
use crate::policy::{conclude, hold, Candidate, Decision, Policy, Round, TopCandidates};

/// Scores every compatible node at its top level with `score` (higher is better)
/// and places on the best.
fn decide_by_score(
    policy: &str,
    why: &str,
    view: &ClusterView,
    queue: &[PendingTask],
    mut score: impl FnMut(&Round<'_>, &Candidate, &PendingTask) -> f64,
) -> Vec<Decision> {
    let mut round = Round::new(view);
    let mut decisions = Vec::with_capacity(queue.len());
    for task in queue {
        let mut top = TopCandidates::default();
        let mut tally = FilterTally::default();
        for (index, node) in view.nodes.iter().enumerate() {
            if let Some(mut candidate) =
                round.evaluate(index, task, node.top_power_level(), &mut tally)
            {
                candidate.score = score(&round, &candidate, task);
                top.offer(candidate);
            }
        }
        decisions.push(conclude(&mut round, policy, task, &top, &tally, why));
    }
    decisions
}

/// Places each task on the node with the least backlog per lane (ties: fewer
/// queued tasks, then the lower index), at full power.
#[derive(Debug, Clone, Copy, Default)]
pub struct LeastLoadedPolicy;

impl Policy for LeastLoadedPolicy {
    fn name(&self) -> &'static str {
        "least-loaded"
    }

    fn decide(&mut self, view: &ClusterView, queue: &[PendingTask]) -> Vec<Decision> {
        decide_by_score(
            self.name(),
            "least backlog per lane",
            view,
            queue,
            |round, candidate, _task| match round.node(candidate.node) {
                Some((node, load)) => {
                    let state = load.queue_state(node);
                    -(state.backlog_s + state.queued_tasks * 1e-3)
                }
                None => f64::NEG_INFINITY,
            },
        )
    }
}

/// Kubernetes' default scoring: least-allocated (the mean free fraction of CPU and
/// memory) plus balanced-allocation (1 minus the gap between the CPU and memory
/// fractions in use), each on 0..100, at full power.
#[derive(Debug, Clone, Copy, Default)]
pub struct KubernetesPolicy;

impl Policy for KubernetesPolicy {
    fn name(&self) -> &'static str {
        "kubernetes"
    }

    fn decide(&mut self, view: &ClusterView, queue: &[PendingTask]) -> Vec<Decision> {
        decide_by_score(
            self.name(),
            "least-allocated + balanced-allocation",
            view,
            queue,
            |round, candidate, task| match round.node(candidate.node) {
                Some((node, load)) => {
                    let cores = node.cpu_cores.max(1.0);
                    let cpu_used =
                        ((cores - load.free_cpu_cores + f64::from(task.demand.cpu_cores)) / cores)
                            .clamp(0.0, 1.0);
                    let memory = node.memory_bytes.max(1) as f64;
                    let memory_used = ((memory - load.free_memory_bytes as f64
                        + task.demand.memory_bytes as f64)
                        / memory)
                        .clamp(0.0, 1.0);
                    let least_allocated = ((1.0 - cpu_used) + (1.0 - memory_used)) / 2.0 * 100.0;
                    let balanced = (1.0 - (cpu_used - memory_used).abs()) * 100.0;
                    least_allocated + balanced
                }
                None => f64::NEG_INFINITY,
            },
        )
    }
}

/// Places each task where it finishes first, at full power.
#[derive(Debug, Clone, Copy, Default)]
pub struct EarliestFinishPolicy;

impl Policy for EarliestFinishPolicy {
    fn name(&self) -> &'static str {
        "earliest-finish"
    }

    fn decide(&mut self, view: &ClusterView, queue: &[PendingTask]) -> Vec<Decision> {
        decide_by_score(
            self.name(),
            "earliest finish at full power",
            view,
            queue,
            |round, candidate, _task| -(candidate.finish_ms - round.now_ms) / 1000.0,
        )
    }
}

/// Places each task on a uniformly drawn compatible node, at full power.
#[derive(Debug, Clone)]
pub struct RandomPolicy {
    rng: ChaCha8Rng,
}

impl RandomPolicy {
    /// A random policy drawing from a ChaCha stream seeded with `seed`.
    pub fn new(seed: u64) -> Self {
        Self {
            rng: ChaCha8Rng::seed_from_u64(seed ^ 0x7261_6e64_6f6d),
        }
    }
}

/// Random draws tried before falling back to a full scan.
const RANDOM_TRIES: usize = 32;

impl Policy for RandomPolicy {
    fn name(&self) -> &'static str {
        "random"
    }

    fn decide(&mut self, view: &ClusterView, queue: &[PendingTask]) -> Vec<Decision> {
        let mut round = Round::new(view);
        let mut decisions = Vec::with_capacity(queue.len());
        let count = view.nodes.len();
        // The nodes drawn for the current task: a node drawn twice is looked
        // at (and counted in the explanation) once. Within a task the round
        // does not change, so a node that failed once fails again.
        let mut drawn: Vec<usize> = Vec::with_capacity(RANDOM_TRIES);
        for task in queue {
            let mut tally = FilterTally::default();
            let mut chosen = None;
            drawn.clear();
            if count > 0 {
                for _ in 0..RANDOM_TRIES {
                    let index = self.rng.random_range(0..count);
                    if drawn.contains(&index) {
                        continue;
                    }
                    drawn.push(index);
                    let level = view.nodes[index].top_power_level();
                    if let Some(candidate) = round.evaluate(index, task, level, &mut tally) {
                        chosen = Some(candidate);
                        break;
                    }
                }
            }
            if chosen.is_none() {
                // Count each node's reason once for the hold message.
                tally = FilterTally::default();
                // Reservoir sampling over the compatible nodes: uniform, one pass.
                let mut seen = 0_u32;
                for (index, node) in view.nodes.iter().enumerate() {
                    if let Some(candidate) =
                        round.evaluate(index, task, node.top_power_level(), &mut tally)
                    {
                        seen += 1;
                        if self.rng.random_range(0..seen) == 0 {
                            chosen = Some(candidate);
                        }
                    }
                }
            }
            let mut top = TopCandidates::default();
            if let Some(candidate) = chosen {
                top.offer(candidate);
            }
            decisions.push(conclude(
                &mut round,
                self.name(),
                task,
                &top,
                &tally,
                "drawn at random",
            ));
        }
        decisions
    }
}

/// Places each task on the next compatible node after the previous placement.
#[derive(Debug, Clone, Default)]
pub struct RoundRobinPolicy {
    next: usize,
}

impl Policy for RoundRobinPolicy {
    fn name(&self) -> &'static str {
        "round-robin"
    }

    fn decide(&mut self, view: &ClusterView, queue: &[PendingTask]) -> Vec<Decision> {
        let mut round = Round::new(view);
        let mut decisions = Vec::with_capacity(queue.len());
        let count = view.nodes.len();
        for task in queue {
            let mut tally = FilterTally::default();
            let mut top = TopCandidates::default();
            for step in 0..count {
                let index = (self.next + step) % count;
                let level = view.nodes[index].top_power_level();
                if let Some(candidate) = round.evaluate(index, task, level, &mut tally) {
                    self.next = (index + 1) % count;
                    top.offer(candidate);
                    break;
                }
            }
            decisions.push(conclude(
                &mut round,
                self.name(),
                task,
                &top,
                &tally,
                "next in turn",
            ));
        }
        decisions
    }
}

/// A static optimisation: every node runs at one fixed level (its middle, "balanced"
/// level), and each batch is assigned by list scheduling, longest task first, each
/// to the node where it finishes first (LPT, a 4/3-approximation of the makespan on
/// identical machines). Decisions come back in the queue's order.
#[derive(Debug, Clone, Default)]
pub struct StaticOptimisationPolicy;

impl Policy for StaticOptimisationPolicy {
    fn name(&self) -> &'static str {
        "static-optimisation"
    }

    fn decide(&mut self, view: &ClusterView, queue: &[PendingTask]) -> Vec<Decision> {
        let mut round = Round::new(view);
        let mut order: Vec<usize> = (0..queue.len()).collect();
        order.sort_by(|a, b| queue[*b].work.total_cmp(&queue[*a].work).then(a.cmp(b)));
        let mut decisions: Vec<Option<Decision>> = vec![None; queue.len()];
        for position in order {
            let task = &queue[position];
            let mut top = TopCandidates::default();
            let mut tally = FilterTally::default();
            for (index, node) in view.nodes.iter().enumerate() {
                let level = node.top_power_level() / 2 + node.top_power_level() % 2;
                if let Some(mut candidate) = round.evaluate(index, task, level, &mut tally) {
                    candidate.score = -(candidate.finish_ms - round.now_ms) / 1000.0;
                    top.offer(candidate);
                }
            }
            decisions[position] = Some(conclude(
                &mut round,
                self.name(),
                task,
                &top,
                &tally,
                "fixed level, longest task first to earliest finish",
            ));
        }
        decisions
            .into_iter()
            .zip(queue)
            .map(|(decision, task)| {
                decision.unwrap_or_else(|| hold(view, task, self.name(), &FilterTally::default()))
            })
            .collect()
    }
}
