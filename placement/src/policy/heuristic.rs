//! The default policy: a fast deterministic heuristic in the spirit of HiRL's
//! coordination engine.
//!
//! 1. **Order**: the queue is served by priority (higher first), then by deadline
//!    slack (least first), then by submission; tasks without a deadline come last.
//! 2. **Filter**: hard constraints (online, runtime, arch, labels, GPU, memory,
//!    energy budget) remove nodes.
//! 3. **Feasibility**: for each remaining node, the lowest power level whose
//!    estimated finish still meets the deadline with a safety margin (slack
//!    reclamation: slack left by a fast node becomes a lower frequency). The margin
//!    grows with the node's queue, since queued work is where estimates go wrong.
//! 4. **Choice**: among feasible (node, level) pairs, the least cost, in joules:
//!    the task's dynamic energy, plus a *crowding* charge per second of queue wait
//!    the placement leaves on the resource it uses (so that a cheap but scarce
//!    resource, a Jetson's GPU, is not piled up with work that could run elsewhere
//!    while OpenCL-only tasks need it), plus a small charge per second to finish,
//!    so that ties go to the faster node. When no node can meet the deadline: the
//!    earliest finish at full power (least lateness), except that a task which
//!    does not need a GPU but would run on one is charged, while the cluster's
//!    GPUs are congested, for the GPU time it borrows (see
//!    [`HeuristicTuning::gpu_reserve_s_per_s`]).
//!
//! Two further ideas are implemented as knobs ([`HeuristicTuning`]) and off by
//! default because the simulator measured them worse: holding tasks no node can
//! finish in time, and late binding (keeping tasks in the coordinator while their
//! best node is busy).
//!
//! With [`SearchMode::Indexed`] the candidates are not every node: nodes are
//! grouped by hardware profile, each group keeps a heap by queue wait, and a task
//! looks at the few least-waiting nodes of each compatible group plus a few nodes
//! drawn at random (seeded), which keeps a decision near-constant in the cluster's
//! size. [`SearchMode::Exhaustive`] scores every node; the simulator runs both to
//! show what the index costs in completion rate.

use std::cmp::Reverse;
use std::collections::hash_map::DefaultHasher;
use std::collections::{BinaryHeap, HashMap};
use std::hash::{Hash, Hasher};

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

use crate::estimate::{self, FilterTally, Incompatible, NodeSample};
use crate::model::{ClusterView, NodeView, PendingTask};
use crate::policy::{
    conclude, filter_counts, Candidate, Decision, Explanation, Outcome, Policy, Round,
    TopCandidates,
};

/// How the heuristic finds candidate nodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SearchMode {
    /// Score every node.
    Exhaustive,
    /// Score the least-waiting nodes of each hardware group plus a random sample.
    Indexed,
}

/// Extra pops allowed per group when the best nodes fail a load filter (memory).
const EXTRA_POPS: usize = 8;

/// The heuristic's knobs. The defaults are what the simulator's tables use.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct HeuristicTuning {
    /// Fraction of the time left to the deadline kept as a safety margin.
    pub margin_fraction: f64,
    /// Smallest safety margin, ms.
    pub margin_min_ms: f64,
    /// Extra margin fraction at full cluster pressure (mean queue wait at
    /// [`HeuristicTuning::pressure_horizon_s`] or more): under load, slow choices
    /// cost capacity later tasks need.
    pub pressure_margin: f64,
    /// Mean queue wait, seconds, at which the cluster counts as under full pressure.
    pub pressure_horizon_s: f64,
    /// Joules one second of earlier finish is worth when comparing feasible choices.
    pub joules_per_second: f64,
    /// Extra joules per second of finish time at full cluster pressure: under load,
    /// finishing early frees capacity for the tasks behind.
    pub pressure_joules_per_second: f64,
    /// Joules charged per second of queue wait a placement leaves on the resource
    /// it uses (CPU lanes or GPU), so that energy-cheap but scarce resources (a
    /// Jetson's GPU) are not piled up with work that could run elsewhere.
    pub crowding_joules_per_second: f64,
    /// Seconds of later finish one second of GPU time is worth, at full GPU
    /// pressure, when a task that does not need a GPU (it could run on CPU lanes)
    /// is placed on one and no node can meet its deadline with margin. GPUs are
    /// scarce, and some tasks (OpenCL) can run nowhere else: a task that is
    /// hard-pressed anyway and grabs the fastest device while the GPUs are
    /// congested pushes their queues past the point where queueing delay explodes,
    /// and the OpenCL tasks behind it miss their deadlines (at 85% load this was
    /// nearly every deadline the heuristic missed).
    pub gpu_reserve_s_per_s: f64,
    /// Mean GPU queue wait, seconds, over the online GPU nodes at which the GPUs
    /// count as under full pressure.
    pub gpu_pressure_horizon_s: f64,
    /// Least-waiting nodes taken from each compatible hardware group (indexed search).
    pub from_each_group: usize,
    /// Nodes drawn at random per task on top of the groups' best (indexed search).
    pub random_sample: usize,
    /// Hold a task that no node can finish by its deadline (estimated), rather than
    /// spend capacity on a late result, until a node frees up or the deadline
    /// passes; once it has passed, the task is placed at the earliest finish.
    pub hold_hopeless: bool,
    /// Place a task no node can finish in time where it costs least (energy plus
    /// crowding) instead of where it finishes first: a result that is late anyway
    /// should not push other tasks past their deadlines.
    pub hopeless_cheapest: bool,
    /// Late binding: keep a task in the coordinator's queue, rather than in a node's
    /// FIFO, while its best node is busy and its slack allows waiting, so that a
    /// more urgent task arriving later can still go first.
    pub late_binding: bool,
    /// Slack, ms, a task must keep beyond its transfer time to be held for late binding.
    pub late_binding_slack_ms: f64,
}

impl Default for HeuristicTuning {
    fn default() -> Self {
        Self {
            margin_fraction: 0.3,
            margin_min_ms: 100.0,
            pressure_margin: 0.5,
            pressure_horizon_s: 2.0,
            joules_per_second: 0.2,
            pressure_joules_per_second: 20.0,
            crowding_joules_per_second: 2.0,
            gpu_reserve_s_per_s: 3.0,
            gpu_pressure_horizon_s: 4.0,
            from_each_group: 3,
            random_sample: 6,
            hold_hopeless: false,
            hopeless_cheapest: false,
            late_binding: false,
            late_binding_slack_ms: 500.0,
        }
    }
}

/// The default heuristic policy.
#[derive(Debug, Clone)]
pub struct HeuristicPolicy {
    mode: SearchMode,
    rng: ChaCha8Rng,
    tuning: HeuristicTuning,
}

impl HeuristicPolicy {
    /// A heuristic searching in `mode`, sampling with a ChaCha stream from `seed`.
    pub fn new(mode: SearchMode, seed: u64) -> Self {
        Self::with_tuning(mode, seed, HeuristicTuning::default())
    }

    /// A heuristic with explicit knobs.
    pub fn with_tuning(mode: SearchMode, seed: u64, tuning: HeuristicTuning) -> Self {
        Self {
            mode,
            rng: ChaCha8Rng::seed_from_u64(seed ^ 0x6865_7572),
            tuning,
        }
    }
}

/// Nodes of one hardware profile, with heaps by queue wait.
struct Group {
    representative: usize,
    /// How many nodes the group has and the first few: when a static filter
    /// rules out the representative, it rules out all of them, and an
    /// explanation counts them without looking at each.
    members: NodeSample,
    by_cpu_wait: BinaryHeap<Reverse<(u64, usize, u32)>>,
    by_gpu_wait: BinaryHeap<Reverse<(u64, usize, u32)>>,
}

/// Candidate index over a view: hardware groups with lazily updated heaps.
/// The learned policies shortlist their candidates with it too.
pub(crate) struct Index {
    groups: Vec<Group>,
    group_of: Vec<usize>,
    version: Vec<u32>,
    /// The offline nodes (in no group): filtered out for every task.
    offline: NodeSample,
    /// Per group, whether a static filter ruled it out for the task of the
    /// latest [`Index::candidates`] call.
    rejected: Vec<bool>,
    /// Nodes that call popped and a load filter ruled out.
    load_filtered: Vec<usize>,
}

/// A total order on non-negative waits, as heap keys.
fn wait_key(wait_s: f64) -> u64 {
    wait_s.max(0.0).to_bits()
}

fn profile_hash(node: &NodeView) -> u64 {
    let mut hasher = DefaultHasher::new();
    node.arch.hash(&mut hasher);
    node.runtimes.hash(&mut hasher);
    node.labels.hash(&mut hasher);
    node.cpu_cores.to_bits().hash(&mut hasher);
    node.cpu_speed.to_bits().hash(&mut hasher);
    node.memory_bytes.hash(&mut hasher);
    node.io_mbps.to_bits().hash(&mut hasher);
    node.energy
        .budget_joules
        .map(f64::to_bits)
        .hash(&mut hasher);
    // Everything the static filters and the estimates read, so that one
    // representative answers for the whole group.
    if let Some(gpu) = node.gpu {
        gpu.devices.hash(&mut hasher);
        gpu.speed.to_bits().hash(&mut hasher);
        gpu.cpu_device_speed.to_bits().hash(&mut hasher);
        gpu.memory_bytes.hash(&mut hasher);
        gpu.max_alloc_bytes.hash(&mut hasher);
        gpu.kinds.hash(&mut hasher);
        gpu.fp64.hash(&mut hasher);
    }
    for level in &node.power_levels {
        level.speed_factor.to_bits().hash(&mut hasher);
        level.active_watts.to_bits().hash(&mut hasher);
        level.idle_watts.to_bits().hash(&mut hasher);
    }
    hasher.finish()
}

impl Index {
    pub(crate) fn build(round: &Round<'_>) -> Self {
        let nodes = &round.view.nodes;
        let mut by_hash: HashMap<u64, usize> = HashMap::new();
        let mut groups: Vec<Group> = Vec::new();
        let mut group_of = vec![usize::MAX; nodes.len()];
        let mut offline = NodeSample::default();
        for (index, node) in nodes.iter().enumerate() {
            if !node.online {
                offline.push(index);
                continue;
            }
            let group = *by_hash.entry(profile_hash(node)).or_insert_with(|| {
                groups.push(Group {
                    representative: index,
                    members: NodeSample::default(),
                    by_cpu_wait: BinaryHeap::new(),
                    by_gpu_wait: BinaryHeap::new(),
                });
                groups.len() - 1
            });
            if let Some(group) = groups.get_mut(group) {
                group.members.push(index);
            }
            group_of[index] = group;
        }
        let mut index = Self {
            rejected: vec![false; groups.len()],
            groups,
            group_of,
            version: vec![0; nodes.len()],
            offline,
            load_filtered: Vec::new(),
        };
        for node in 0..nodes.len() {
            index.push(round, node);
        }
        index
    }

    fn push(&mut self, round: &Round<'_>, node: usize) {
        let Some(group) = self.group_of.get(node).copied() else {
            return;
        };
        let (Some(group), Some((view, load))) = (self.groups.get_mut(group), round.node(node))
        else {
            return;
        };
        let version = self.version.get(node).copied().unwrap_or(0);
        let cpu_wait = load.backlog_cpu_s / view.cpu_cores.max(1.0);
        group
            .by_cpu_wait
            .push(Reverse((wait_key(cpu_wait), node, version)));
        if view.gpu_devices() > 0 {
            let gpu_wait = load.backlog_gpu_s / f64::from(view.gpu_devices().max(1));
            group
                .by_gpu_wait
                .push(Reverse((wait_key(gpu_wait), node, version)));
        }
    }

    /// Marks a node's entries stale after a placement changed its load, and
    /// re-files it.
    pub(crate) fn update(&mut self, round: &Round<'_>, node: usize) {
        if let Some(version) = self.version.get_mut(node) {
            *version = version.wrapping_add(1);
        }
        self.push(round, node);
    }

    /// The least-waiting compatible nodes of every group that passes the static
    /// filters for `task`. Counts in `tally` what it rules out: the offline
    /// nodes and every node of a group a static filter rules out, in bulk,
    /// and each node it popped that a load filter rules out; the nodes it
    /// returns are left for the caller to count as it evaluates them.
    pub(crate) fn candidates(
        &mut self,
        round: &Round<'_>,
        task: &PendingTask,
        from_each_group: usize,
        out: &mut Vec<usize>,
        tally: &mut FilterTally,
    ) {
        self.load_filtered.clear();
        if self.offline.count() > 0 {
            tally.add_sample(Incompatible::Offline, &self.offline);
        }
        for (group, rejected) in self.groups.iter_mut().zip(self.rejected.iter_mut()) {
            let Some(representative) = round.view.nodes.get(group.representative) else {
                *rejected = true;
                continue;
            };
            // The profile hash covers everything the static filters read, so
            // the representative's answer is every member's.
            *rejected = match estimate::check_static(representative, task) {
                Ok(()) => false,
                Err(reason) => {
                    tally.add_sample(reason, &group.members);
                    true
                }
            };
            if *rejected {
                continue;
            }
            let heap = if estimate::runs_on_gpu(representative, task) {
                &mut group.by_gpu_wait
            } else {
                &mut group.by_cpu_wait
            };
            let mut popped = Vec::new();
            let mut taken = 0;
            let mut tries = 0;
            while taken < from_each_group && tries < from_each_group + EXTRA_POPS {
                let Some(entry) = heap.pop() else {
                    break;
                };
                let Reverse((_, node, version)) = entry;
                if self.version.get(node).copied() != Some(version) {
                    continue; // stale: a newer entry for this node is in the heap
                }
                tries += 1;
                popped.push(entry);
                let fits = match round.node(node) {
                    Some((view, load)) => estimate::check_load(view, load, task, 0),
                    None => continue,
                };
                match fits {
                    Ok(()) => {
                        taken += 1;
                        out.push(node);
                    }
                    Err(reason) => {
                        tally.add(reason, node);
                        self.load_filtered.push(node);
                    }
                }
            }
            heap.extend(popped);
        }
    }

    /// Whether the latest [`Index::candidates`] call already counted `node`
    /// (offline, in a group ruled out, or popped and ruled out): a node drawn
    /// at random on top of the shortlist is then evaluated without counting
    /// it again.
    pub(crate) fn counted(&self, node: usize) -> bool {
        let in_bulk = match self.group_of.get(node) {
            // `usize::MAX` (offline) is no group: counted with the offline nodes.
            Some(group) => self.rejected.get(*group).copied().unwrap_or(true),
            None => false,
        };
        in_bulk || self.load_filtered.contains(&node)
    }
}

/// The knobs in force for one round, pressure applied.
struct Knobs {
    margin_fraction: f64,
    margin_min_ms: f64,
    joules_per_second: f64,
    crowding_joules_per_second: f64,
    /// [`HeuristicTuning::gpu_reserve_s_per_s`] times this round's GPU pressure.
    gpu_reserve_s_per_s: f64,
    hopeless_cheapest: bool,
}

impl Knobs {
    fn for_round(tuning: &HeuristicTuning, view: &ClusterView) -> Self {
        let (wait_s, nodes) = view
            .nodes
            .iter()
            .filter(|node| node.online)
            .fold((0.0, 0_usize), |(wait, count), node| {
                (wait + node.queue_state().backlog_s, count + 1)
            });
        let mean_wait_s = if nodes == 0 {
            0.0
        } else {
            wait_s / nodes as f64
        };
        let pressure = (mean_wait_s / tuning.pressure_horizon_s.max(1e-3)).clamp(0.0, 1.0);
        let (gpu_wait_s, gpu_nodes) = view
            .nodes
            .iter()
            .filter(|node| node.online && node.gpu_devices() > 0)
            .fold((0.0, 0_usize), |(wait, count), node| {
                let devices = f64::from(node.gpu_devices().max(1));
                (wait + node.load.backlog_gpu_s / devices, count + 1)
            });
        let gpu_pressure = if gpu_nodes == 0 {
            0.0
        } else {
            (gpu_wait_s / gpu_nodes as f64 / tuning.gpu_pressure_horizon_s.max(1e-3))
                .clamp(0.0, 1.0)
        };
        Self {
            margin_fraction: tuning.margin_fraction + tuning.pressure_margin * pressure,
            margin_min_ms: tuning.margin_min_ms,
            joules_per_second: tuning.joules_per_second
                + tuning.pressure_joules_per_second * pressure,
            crowding_joules_per_second: tuning.crowding_joules_per_second,
            gpu_reserve_s_per_s: tuning.gpu_reserve_s_per_s * gpu_pressure,
            hopeless_cheapest: tuning.hopeless_cheapest,
        }
    }
}

/// The deadline as ms, or infinity without one.
fn best_deadline(task: &PendingTask) -> f64 {
    task.deadline_ms
        .map_or(f64::INFINITY, |deadline| deadline as f64)
}

/// The task's urgency order: priority first, then slack, then submission.
/// The order tasks are served in: priority (higher first), then deadline slack
/// (least first), then submission.
pub(crate) fn order(view: &ClusterView, queue: &[PendingTask]) -> Vec<usize> {
    let now = view.now_ms as f64;
    let slack = |task: &PendingTask| match task.deadline_ms {
        Some(deadline) => deadline as f64 - now - task.work * 1000.0,
        None => f64::INFINITY,
    };
    let mut positions: Vec<usize> = (0..queue.len()).collect();
    positions.sort_by(|a, b| {
        let (ta, tb) = (&queue[*a], &queue[*b]);
        tb.priority
            .cmp(&ta.priority)
            .then(slack(ta).total_cmp(&slack(tb)))
            .then(ta.submitted_ms.cmp(&tb.submitted_ms))
            .then(a.cmp(b))
    });
    positions
}

/// The best (node, level) of one node for a task: the lowest level meeting the
/// deadline with margin, else the top level. Scores: feasible choices beat
/// infeasible ones; among feasible, less energy (and earlier finish) wins; among
/// infeasible, earlier finish wins, less the charge for GPU time borrowed by a task
/// that could run on CPU lanes.
fn best_level(
    round: &Round<'_>,
    node_index: usize,
    task: &PendingTask,
    knobs: &Knobs,
    tally: &mut FilterTally,
) -> Option<Candidate> {
    let (node, load) = round.node(node_index)?;
    let top = node.top_power_level();
    // The wait this placement leaves behind on the resource it uses.
    let crowding = |candidate: &Candidate| {
        let run_s = estimate::execution_s(node, task, candidate.power_level);
        let after_s = if estimate::runs_on_gpu(node, task) {
            estimate::queue_wait_s(node, load, task) + run_s / f64::from(node.gpu_devices().max(1))
        } else {
            estimate::queue_wait_s(node, load, task)
                + run_s * f64::from(estimate::lanes(node, task)) / node.cpu_cores.max(1.0)
        };
        knobs.crowding_joules_per_second * after_s
    };
    // The node is counted once, at its top level; lower levels are tried
    // without counting (a level the energy budget rules out does not rule
    // out the node).
    let mut fastest = round.evaluate(node_index, task, top, tally)?;
    let Some(deadline) = task.deadline_ms else {
        let mut best = fastest;
        for level in 0..top {
            if let Some(candidate) = round.try_level(node_index, task, level) {
                if candidate.energy_joules < best.energy_joules {
                    best = candidate;
                }
            }
        }
        best.score = -best.energy_joules
            - crowding(&best)
            - knobs.joules_per_second * (best.finish_ms - round.now_ms) / 1000.0;
        return Some(best);
    };
    let deadline = deadline as f64;
    let left_ms = (deadline - round.now_ms).max(0.0);
    let queue_pressure = 1.0 + f64::from(load.queued_tasks) / node.cpu_cores.max(1.0);
    let margin = (left_ms * knobs.margin_fraction * queue_pressure).max(knobs.margin_min_ms);
    if fastest.finish_ms + margin > deadline {
        fastest.feasible = false;
        fastest.score = if knobs.hopeless_cheapest && fastest.finish_ms > deadline {
            -fastest.energy_joules - crowding(&fastest)
        } else {
            // Hard-pressed anyway: the earliest finish, but not at the price of a
            // congested GPU that tasks with nowhere else to go are queueing for.
            let borrowed_gpu_s =
                if estimate::runs_on_gpu(node, task) && !estimate::needs_device(task) {
                    estimate::execution_s(node, task, top)
                } else {
                    0.0
                };
            -(fastest.finish_ms - round.now_ms) / 1000.0
                - knobs.gpu_reserve_s_per_s * borrowed_gpu_s
        };
        return Some(fastest);
    }
    let mut chosen = fastest;
    for level in 0..top {
        if let Some(candidate) = round.try_level(node_index, task, level) {
            if candidate.finish_ms + margin <= deadline {
                chosen = candidate;
                break;
            }
        }
    }
    chosen.score = -chosen.energy_joules
        - crowding(&chosen)
        - knobs.joules_per_second * (chosen.finish_ms - round.now_ms) / 1000.0;
    Some(chosen)
}

impl Policy for HeuristicPolicy {
    fn name(&self) -> &'static str {
        match self.mode {
            SearchMode::Exhaustive => "heuristic-exhaustive",
            SearchMode::Indexed => "heuristic",
        }
    }

    fn decide(&mut self, view: &ClusterView, queue: &[PendingTask]) -> Vec<Decision> {
        let name = self.name();
        let mut round = Round::new(view);
        let mut index = match self.mode {
            SearchMode::Indexed => Some(Index::build(&round)),
            SearchMode::Exhaustive => None,
        };
        let mut decisions: Vec<Option<Decision>> = vec![None; queue.len()];
        let mut candidates = Vec::new();
        let count = view.nodes.len();
        let knobs = Knobs::for_round(&self.tuning, view);
        // Where nodes the index already counted are counted again, unread.
        let mut uncounted = FilterTally::default();
        for position in order(view, queue) {
            let task = &queue[position];
            let mut tally = FilterTally::default();
            let mut top = TopCandidates::default();
            candidates.clear();
            match index.as_mut() {
                Some(index) => {
                    index.candidates(
                        &round,
                        task,
                        self.tuning.from_each_group,
                        &mut candidates,
                        &mut tally,
                    );
                    if count > 0 {
                        for _ in 0..self.tuning.random_sample {
                            candidates.push(self.rng.random_range(0..count));
                        }
                    }
                    candidates.sort_unstable();
                    candidates.dedup();
                }
                None => candidates.extend(0..count),
            }
            for node in candidates.iter().copied() {
                let counted = index.as_ref().is_some_and(|index| index.counted(node));
                let node_tally = if counted { &mut uncounted } else { &mut tally };
                if let Some(candidate) = best_level(&round, node, task, &knobs, node_tally) {
                    top.offer(candidate);
                }
            }
            if top.first().is_none() && index.is_some() {
                // The index found nothing (every sampled node full): before holding,
                // make sure no node at all can take the task, counting each node's
                // reason once.
                tally = FilterTally::default();
                for node in 0..count {
                    if let Some(candidate) = best_level(&round, node, task, &knobs, &mut tally) {
                        top.offer(candidate);
                    }
                }
            }
            let hopeless = top
                .first()
                .is_some_and(|best| !best.feasible && best.finish_ms > best_deadline(task))
                && task
                    .deadline_ms
                    .is_some_and(|deadline| deadline as f64 >= round.now_ms);
            if hopeless && self.tuning.hold_hopeless {
                let alternatives = top
                    .iter()
                    .map(|candidate| round.alternative(candidate, task))
                    .collect();
                let reason = "no node can finish it by its deadline; waiting for capacity";
                decisions[position] = Some(Decision {
                    task_key: task.key,
                    outcome: Outcome::Hold {
                        reason: reason.to_owned(),
                    },
                    explanation: Explanation {
                        policy: name.to_owned(),
                        summary: format!("held: {reason}"),
                        considered: tally.considered(),
                        filtered: filter_counts(view, &tally),
                        alternatives,
                    },
                });
                continue;
            }
            if self.tuning.late_binding {
                if let (Some(best), Some(deadline)) = (top.first(), task.deadline_ms) {
                    if let Some((node, load)) = round.node(best.node) {
                        let wait_s = estimate::queue_wait_s(node, load, task);
                        let transfer_s = estimate::transfer_s(node, task.input_bytes);
                        let slack_ms = deadline as f64 - best.finish_ms;
                        if best.feasible
                            && wait_s > transfer_s + 0.1
                            && slack_ms > transfer_s * 1000.0 + self.tuning.late_binding_slack_ms
                        {
                            let reason = format!(
                                "best node {} is busy for {:.1} s and the task has {:.0} ms of slack: kept in the queue",
                                node.id, wait_s, slack_ms
                            );
                            let alternatives = top
                                .iter()
                                .map(|candidate| round.alternative(candidate, task))
                                .collect();
                            decisions[position] = Some(Decision {
                                task_key: task.key,
                                outcome: Outcome::Hold {
                                    reason: reason.clone(),
                                },
                                explanation: Explanation {
                                    policy: name.to_owned(),
                                    summary: format!("held: {reason}"),
                                    considered: tally.considered(),
                                    filtered: filter_counts(view, &tally),
                                    alternatives,
                                },
                            });
                            continue;
                        }
                    }
                }
            }
            let why = match top.first() {
                Some(best) if best.feasible => "least energy meeting the deadline",
                Some(_) => "no node meets the deadline: earliest finish",
                None => "",
            };
            let decision = conclude(&mut round, name, task, &top, &tally, why);
            if let (Some(index), Some(best)) = (index.as_mut(), top.first()) {
                index.update(&round, best.node);
            }
            decisions[position] = Some(decision);
        }
        decisions
            .into_iter()
            .zip(queue)
            .map(|(decision, task)| {
                decision.unwrap_or_else(|| {
                    crate::policy::hold(view, task, name, &FilterTally::default())
                })
            })
            .collect()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use crate::model::TaskClass;
    use crate::policy::Outcome;
    use crate::testing::{gpu_capacity, node, task};
    use starling_proto::Runtime;

    /// A GPU node whose GPU has 2 s of work queued, and an idle CPU-only node.
    fn busy_gpu_and_idle_cpu() -> ClusterView {
        let mut gpu = node("gpu", 4.0, 0.3);
        gpu.gpu = Some(gpu_capacity(3.0, 4 << 30));
        gpu.runtimes.push(Runtime::Opencl);
        gpu.load.backlog_gpu_s = 2.0;
        gpu.load.queued_tasks = 1;
        ClusterView {
            now_ms: 10_000,
            nodes: vec![gpu, node("cpu", 4.0, 1.0)],
        }
    }

    /// A GPU-class task of 4 reference seconds due in 4 s: no node meets the
    /// deadline with margin, and the busy GPU still finishes it first.
    fn hard_pressed_gpu_task(view: &ClusterView) -> PendingTask {
        let mut t = task(1, TaskClass::Gpu);
        t.work = 4.0;
        t.deadline_ms = Some(view.now_ms + 4_000);
        t
    }

    fn placed_on(view: &ClusterView, t: PendingTask) -> usize {
        let mut policy = HeuristicPolicy::new(SearchMode::Exhaustive, 0);
        match policy.decide(view, &[t]).remove(0).outcome {
            Outcome::Place { node, .. } => node,
            Outcome::Hold { reason } => panic!("held: {reason}"),
        }
    }

    #[test]
    fn a_task_that_can_use_cpu_lanes_spares_a_congested_gpu() {
        let view = busy_gpu_and_idle_cpu();
        let t = hard_pressed_gpu_task(&view);
        assert_eq!(
            placed_on(&view, t),
            1,
            "the CPU node, though it finishes later"
        );
    }

    #[test]
    fn a_task_that_needs_the_gpu_still_gets_it() {
        let view = busy_gpu_and_idle_cpu();
        let mut t = hard_pressed_gpu_task(&view);
        t.constraints.runtime = Runtime::Opencl;
        assert_eq!(placed_on(&view, t.clone()), 0);
        t.constraints.runtime = Runtime::Wasm;
        t.demand.gpu = true;
        assert_eq!(placed_on(&view, t), 0);
    }

    #[test]
    fn an_idle_gpu_is_not_spared() {
        let mut view = busy_gpu_and_idle_cpu();
        view.nodes[0].load.backlog_gpu_s = 0.0;
        view.nodes[0].load.queued_tasks = 0;
        let t = hard_pressed_gpu_task(&view);
        assert_eq!(placed_on(&view, t), 0);
    }
}
