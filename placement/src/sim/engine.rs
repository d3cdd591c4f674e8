//! The discrete-event engine: replays one [`Environment`] under one policy.
//!
//! A placed task first moves its input over the node's link (at the link's state
//! when it leaves), then waits in the node's FIFO queue until enough lanes (cores)
//! or a GPU are free, runs for the estimated execution time times a per-task noise,
//! and sends its output back. A node failure loses everything placed on it; those
//! tasks return to the pending queue until they run out of attempts. A task still
//! pending when its deadline has passed is dropped, as is anything unfinished when
//! the run ends.
//!
//! The nodes and arrivals may be split between sites ([`Layout`]): each site
//! keeps its own queue and runs its own policy on its own nodes only, as one
//! coordinator per site does. With [`Gossip`] on, a site forwards a task it
//! cannot finish in time to a peer (see [`crate::federation`]); the task moves
//! over the inter-site link, joins the peer's queue, and its output travels
//! back the same way. A single site is the plain, unfederated simulator.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::ops::Range;

use crate::estimate;
use crate::learned::{Fate, TaskOutcome};
use crate::model::{ClusterView, NodeLoad, PendingTask};
use crate::policy::{Outcome, Policy};
use crate::sim::report::PolicyRow;
use crate::sim::sites::gossip::Gossip;
use crate::sim::sites::report::SiteTally;
use crate::sim::workload::Environment;
use crate::sim::{SimConfig, Stopwatch};

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Event {
    Arrival(usize),
    Failure(usize),
    Repair(usize),
    InputArrived {
        node: usize,
        task: usize,
        epoch: u32,
    },
    Finished {
        node: usize,
        task: usize,
        epoch: u32,
    },
    OutputArrived(usize),
    /// A placement round at one site.
    Round(usize),
    /// Every site publishes its digest.
    Gossip,
    /// A forwarded task reaches its new site.
    Handover(usize),
}

#[derive(Debug, Clone, Copy)]
struct Placed {
    task: usize,
    power_level: u8,
    /// Execution seconds including the node's bias and the noise, known
    /// when placed.
    run_s: f64,
    /// Execution seconds as the model has them (no correction, no bias, no
    /// noise): what a correction learns against.
    modelled_s: f64,
    lanes: u32,
    on_gpu: bool,
    /// When it started running, ms; `None` while in transfer or queued.
    started_ms: Option<f64>,
}

#[derive(Debug, Clone, Default)]
struct NodeState {
    epoch: u32,
    /// Placed tasks: in transfer, queued (in `queue`) or running.
    placed: Vec<Placed>,
    queue: VecDeque<usize>,
    free_lanes: u32,
    free_gpus: u32,
}

/// Simulated time in microseconds, the event queue's key.
fn key(at_ms: f64) -> u64 {
    (at_ms.max(0.0) * 1000.0).round() as u64
}

/// How nodes and arrivals are split between sites.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Layout {
    /// Each site's nodes, a range of indices into the environment's nodes.
    pub sites: Vec<Range<usize>>,
    /// The site each task arrives at, by task index.
    pub origin: Vec<usize>,
}

impl Layout {
    /// One site with every node and every task.
    pub fn single(env: &Environment) -> Layout {
        Layout {
            sites: core::iter::once(0..env.nodes.len()).collect(),
            origin: vec![0; env.tasks.len()],
        }
    }
}

/// What one multi-site run produced.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct SitesRun {
    /// Every site together.
    pub row: PolicyRow,
    /// Per site, tasks counted where they arrived.
    pub sites: Vec<SiteTally>,
}

struct Engine<'a> {
    config: &'a SimConfig,
    env: &'a Environment,
    view: ClusterView,
    nodes: Vec<NodeState>,
    events: BinaryHeap<Reverse<(u64, u64, Event)>>,
    sequence: u64,
    now_ms: f64,
    /// Each site's node range.
    sites: Vec<Range<usize>>,
    /// The site of each node.
    node_site: Vec<usize>,
    /// The site each task arrived at.
    origin: Vec<usize>,
    /// The site each task is queued or runs at now (its origin until forwarded).
    task_site: Vec<usize>,
    /// Per-site tallies, by origin.
    tallies: Vec<SiteTally>,
    /// Digests and forwarding, when federation is on.
    gossip: Option<Gossip>,
    /// Each site's pending tasks.
    pending: Vec<Vec<usize>>,
    attempts: Vec<u32>,
    round_scheduled: Vec<bool>,
    row: PolicyRow,
    latencies_ms: Vec<f64>,
    energy_joules: f64,
    /// Energy each task's current attempt has drawn, joules.
    task_energy: Vec<f64>,
    /// Whether each task's fate has been told to the observer.
    resolved: Vec<bool>,
    observer: &'a mut dyn FnMut(TaskOutcome),
}

impl<'a> Engine<'a> {
    /// Tells the observer what became of a task (or of one of its attempts).
    fn tell(&mut self, task: usize, fate: Fate, latency_ms: f64) {
        let Some(pending) = self.task(task) else {
            return;
        };
        let energy_joules = self.task_energy.get(task).copied().unwrap_or(0.0);
        if let Some(energy) = self.task_energy.get_mut(task) {
            *energy = 0.0;
        }
        if fate != Fate::AttemptLost {
            if let Some(resolved) = self.resolved.get_mut(task) {
                *resolved = true;
            }
        }
        (self.observer)(TaskOutcome {
            task_key: pending.key,
            fate,
            latency_ms,
            budget_ms: pending
                .deadline_ms
                .map(|deadline| deadline as f64 - pending.submitted_ms as f64),
            energy_joules,
        });
    }

    fn schedule(&mut self, at_ms: f64, event: Event) {
        self.sequence += 1;
        self.events
            .push(Reverse((key(at_ms), self.sequence, event)));
    }

    fn task(&self, index: usize) -> Option<&'a PendingTask> {
        self.env.tasks.get(index)
    }

    /// Whether a task counts in the row (it arrived after the warm-up).
    fn counted(&self, index: usize) -> bool {
        self.task(index).is_some_and(|task| self.env.counted(task))
    }

    /// Charges energy to a task, and to the row when the task counts.
    fn charge(&mut self, task: usize, joules: f64) {
        if self.counted(task) {
            self.energy_joules += joules;
        }
        if let Some(spent) = self.task_energy.get_mut(task) {
            *spent += joules;
        }
    }

    /// Joules a node's link spends moving `bytes`.
    fn network_joules(&self, node: usize, bytes: u64) -> f64 {
        self.env.joules_per_byte.get(node).copied().unwrap_or(0.0) * bytes as f64
    }

    fn schedule_round(&mut self, site: usize, at_ms: f64) {
        if let Some(scheduled) = self.round_scheduled.get_mut(site) {
            if !*scheduled {
                *scheduled = true;
                let round = self.config.round_ms as f64;
                let at = (at_ms / round).ceil() * round;
                self.schedule(at, Event::Round(site));
            }
        }
    }

    /// Queues a task at a site and makes sure a round will see it.
    fn enqueue(&mut self, site: usize, task: usize, at_ms: f64) {
        if let Some(pending) = self.pending.get_mut(site) {
            pending.push(task);
            pending.sort_unstable();
        }
        self.schedule_round(site, at_ms);
    }

    /// Refreshes the view's loads, links and online flags of the nodes in
    /// `range` from the engine's state.
    fn refresh_view(&mut self, range: Range<usize>) {
        let now = self.now_ms;
        for (index, (node_view, state)) in self
            .view
            .nodes
            .iter_mut()
            .zip(&self.nodes)
            .enumerate()
            .skip(range.start)
            .take(range.len())
        {
            if let Some(link) = self.env.link(index, now) {
                node_view.network = link;
            }
            let mut load = NodeLoad {
                free_cpu_cores: node_view.cpu_cores,
                free_memory_bytes: node_view.memory_bytes,
                free_io_mbps: node_view.io_mbps,
                queued_tasks: 0,
                backlog_cpu_s: 0.0,
                backlog_gpu_s: 0.0,
                earliest_slack_ms: None,
                committed_joules: 0.0,
                power_level: node_view.top_power_level(),
            };
            for placed in &state.placed {
                let Some(task) = self.env.tasks.get(placed.task) else {
                    continue;
                };
                load.free_cpu_cores -= f64::from(task.demand.cpu_cores);
                load.free_memory_bytes = load
                    .free_memory_bytes
                    .saturating_sub(task.demand.memory_bytes);
                load.free_io_mbps -= f64::from(task.demand.io_mbps);
                load.queued_tasks += 1;
                let remaining_s = match placed.started_ms {
                    Some(started) => (placed.run_s - (now - started) / 1000.0).max(0.0),
                    None => placed.run_s,
                };
                if placed.on_gpu {
                    load.backlog_gpu_s += remaining_s;
                } else {
                    load.backlog_cpu_s += remaining_s * f64::from(placed.lanes);
                }
                if let Some(deadline) = task.deadline_ms {
                    let slack = deadline as f64 - now - remaining_s * 1000.0;
                    load.earliest_slack_ms =
                        Some(load.earliest_slack_ms.map_or(slack, |s| s.min(slack)));
                }
            }
            load.free_cpu_cores = load.free_cpu_cores.max(0.0);
            load.free_io_mbps = load.free_io_mbps.max(0.0);
            node_view.load = load;
        }
        self.view.now_ms = now.floor() as u64;
    }

    /// The pending tasks of a site, as the policy sees them.
    fn queue(&self, site: usize) -> Vec<PendingTask> {
        self.pending
            .get(site)
            .map(|pending| {
                pending
                    .iter()
                    .filter_map(|index| self.env.tasks.get(*index).cloned())
                    .collect()
            })
            .unwrap_or_default()
    }

    /// A copy of the view of one site's nodes; `None` when there is one site,
    /// whose view is the whole view, used as it is rather than copied.
    fn site_view(&self, range: &Range<usize>) -> Option<ClusterView> {
        if self.sites.len() == 1 {
            return None;
        }
        Some(ClusterView {
            now_ms: self.view.now_ms,
            nodes: self
                .view
                .nodes
                .get(range.clone())
                .map(<[_]>::to_vec)
                .unwrap_or_default(),
        })
    }

    /// Every site publishes its digest, built from its view and queue as a
    /// coordinator would build it.
    fn gossip(&mut self) {
        if self.gossip.is_none() {
            return;
        }
        self.refresh_view(0..self.view.nodes.len());
        let mut capacities = Vec::with_capacity(self.sites.len());
        for (site, range) in self.sites.iter().enumerate() {
            let queue = self.queue(site);
            let capacity = match self.site_view(range) {
                Some(view) => crate::federation::site_capacity(&view, &queue),
                None => crate::federation::site_capacity(&self.view, &queue),
            };
            capacities.push(capacity);
        }
        let now = self.now_ms;
        if let Some(gossip) = self.gossip.as_mut() {
            gossip.publish(capacities);
            let next = now + gossip.interval_ms;
            if next <= self.env.end_ms {
                self.schedule(next, Event::Gossip);
            }
        }
    }

    /// Sends a task to a peer site: it leaves the local queue and reaches the
    /// peer after one way across the link and its input's transfer.
    fn forward(&mut self, task: usize, to: usize) {
        let Some(pending) = self.task(task) else {
            return;
        };
        let delay_ms = self
            .gossip
            .as_ref()
            .map_or(0.0, |gossip| gossip.handover_s(pending) * 1000.0);
        if let Some(site) = self.task_site.get_mut(task) {
            *site = to;
        }
        if let Some(from) = self.origin.get(task).copied() {
            if let Some(tally) = self.tallies.get_mut(from) {
                tally.forwarded_out += 1;
            }
        }
        if let Some(tally) = self.tallies.get_mut(to) {
            tally.received += 1;
        }
        self.schedule(self.now_ms + delay_ms, Event::Handover(task));
    }

    fn round(
        &mut self,
        site: usize,
        policies: &mut [&mut dyn Policy],
        stopwatch: &mut dyn Stopwatch,
    ) {
        if let Some(scheduled) = self.round_scheduled.get_mut(site) {
            *scheduled = false;
        }
        if self.pending.get(site).is_none_or(Vec::is_empty) {
            return;
        }
        let Some(range) = self.sites.get(site).cloned() else {
            return;
        };
        let Some(policy) = policies.get_mut(site) else {
            return;
        };
        self.refresh_view(range.clone());
        if self.config.estimates.learning {
            // As the coordinator does each round: nodes that have not run
            // an artifact or a class yet assume what the others measured.
            if let Some(nodes) = self.view.nodes.get_mut(range.clone()) {
                crate::model::correction::share_priors(nodes);
            }
        }
        let queue = self.queue(site);
        let view = self.site_view(&range);
        let started = stopwatch.now_ns();
        let decisions = policy.decide(view.as_ref().unwrap_or(&self.view), &queue);
        let elapsed = stopwatch.now_ns().saturating_sub(started);
        self.row.decision_ns_total = self.row.decision_ns_total.saturating_add(elapsed);
        self.row.decisions += queue.len() as u64;
        let mut still_pending = Vec::new();
        let mut decided = vec![false; queue.len()];
        for decision in decisions {
            let Ok(task_index) = usize::try_from(decision.task_key) else {
                continue;
            };
            let Some(position) = queue.iter().position(|task| task.key == decision.task_key) else {
                continue;
            };
            if decided[position] {
                continue;
            }
            decided[position] = true;
            let forward_to = match (self.gossip.as_mut(), queue.get(position)) {
                (Some(gossip), Some(task)) => {
                    gossip.route(site, task_index, task, self.view.now_ms, &decision)
                }
                _ => None,
            };
            if let Some(to) = forward_to {
                self.forward(task_index, to);
                continue;
            }
            match decision.outcome {
                Outcome::Place { node, power_level } => {
                    // The policy saw only its site's nodes: its index is local.
                    let in_site = node < range.len();
                    if !(in_site && self.dispatch(task_index, range.start + node, power_level)) {
                        self.row.constraint_violations += 1;
                        still_pending.push(task_index);
                    }
                }
                Outcome::Hold { .. } => still_pending.push(task_index),
            }
        }
        // A policy that skipped a task has held it.
        for (position, task) in queue.iter().enumerate() {
            if !decided[position] {
                if let Ok(index) = usize::try_from(task.key) {
                    still_pending.push(index);
                }
            }
        }
        let now = self.now_ms;
        let mut kept = Vec::with_capacity(still_pending.len());
        for index in still_pending {
            let expired = self
                .task(index)
                .and_then(|task| task.deadline_ms)
                .is_some_and(|deadline| (deadline as f64) < now);
            if expired {
                if self.counted(index) {
                    self.row.dropped += 1;
                }
                self.tell(index, Fate::Lost, 0.0);
            } else {
                kept.push(index);
            }
        }
        kept.sort_unstable();
        let again = !kept.is_empty();
        if let Some(pending) = self.pending.get_mut(site) {
            *pending = kept;
        }
        if again {
            self.schedule_round(site, now + self.config.round_ms as f64);
        }
    }

    /// Sends a task to a node; `false` (changing nothing) if it violates a hard
    /// constraint, which would be a policy bug.
    fn dispatch(&mut self, task_index: usize, node: usize, power_level: u8) -> bool {
        let Some(task) = self.task(task_index) else {
            return false;
        };
        let Some(node_view) = self.view.nodes.get(node) else {
            return false;
        };
        if estimate::check(node_view, &node_view.load, task, power_level).is_err() {
            return false;
        }
        let attempt = self.attempts.get(task_index).copied().unwrap_or(0);
        // The truth: the model's time (never the corrected estimate the
        // policy saw), times the node's hidden bias and this attempt's noise.
        let modelled_s = estimate::modelled_execution_s(node_view, task, power_level);
        let run_s = modelled_s * self.env.bias(node) * self.env.noise(task.key, attempt);
        let placed = Placed {
            task: task_index,
            power_level,
            run_s,
            modelled_s,
            lanes: estimate::lanes(node_view, task),
            on_gpu: estimate::runs_on_gpu(node_view, task),
            started_ms: None,
        };
        let transfer_s = estimate::transfer_s(node_view, task.input_bytes);
        // Keep the view's load current for the rest of this round's checks.
        let finish = self.now_ms + (transfer_s + run_s) * 1000.0;
        let mut load = node_view.load;
        load.commit(node_view, task, power_level, self.now_ms, finish);
        if let Some(view) = self.view.nodes.get_mut(node) {
            view.load = load;
        }
        let transfer_joules = self.network_joules(node, task.input_bytes);
        let Some(state) = self.nodes.get_mut(node) else {
            return false;
        };
        state.placed.push(placed);
        let epoch = state.epoch;
        self.charge(task_index, transfer_joules);
        self.schedule(
            self.now_ms + transfer_s * 1000.0,
            Event::InputArrived {
                node,
                task: task_index,
                epoch,
            },
        );
        true
    }

    fn try_start(&mut self, node: usize) {
        let now = self.now_ms;
        let mut finished = Vec::new();
        {
            let Some(state) = self.nodes.get_mut(node) else {
                return;
            };
            // One FIFO per resource: CPU lanes and GPU devices serve their own
            // queues, so a task waiting for the GPU does not block CPU work.
            let mut cpu_blocked = false;
            let mut gpu_blocked = false;
            let mut position = 0;
            while position < state.queue.len() && !(cpu_blocked && gpu_blocked) {
                let Some(&task) = state.queue.get(position) else {
                    break;
                };
                let Some(placed) = state.placed.iter_mut().find(|p| p.task == task) else {
                    state.queue.remove(position);
                    continue;
                };
                let fits = if placed.on_gpu {
                    !gpu_blocked && state.free_gpus >= 1
                } else {
                    !cpu_blocked && state.free_lanes >= placed.lanes
                };
                if !fits {
                    if placed.on_gpu {
                        gpu_blocked = true;
                    } else {
                        cpu_blocked = true;
                    }
                    position += 1;
                    continue;
                }
                if placed.on_gpu {
                    state.free_gpus -= 1;
                } else {
                    state.free_lanes -= placed.lanes;
                }
                placed.started_ms = Some(now);
                finished.push((now + placed.run_s * 1000.0, task, state.epoch));
                state.queue.remove(position);
            }
        }
        for (at, task, epoch) in finished {
            self.schedule(at, Event::Finished { node, task, epoch });
        }
    }

    fn energy_of(&self, node: usize, placed: &Placed, run_fraction: f64) -> f64 {
        match (self.view.nodes.get(node), self.task(placed.task)) {
            (Some(view), Some(task)) => {
                let nominal = estimate::execution_s(view, task, placed.power_level).max(1e-9);
                estimate::energy_joules(view, task, placed.power_level)
                    * (placed.run_s / nominal)
                    * run_fraction
            }
            _ => 0.0,
        }
    }

    fn finished(&mut self, node: usize, task: usize, epoch: u32) {
        let Some(state) = self.nodes.get_mut(node) else {
            return;
        };
        if state.epoch != epoch {
            return;
        }
        let Some(position) = state.placed.iter().position(|p| p.task == task) else {
            return;
        };
        let placed = state.placed.swap_remove(position);
        if placed.on_gpu {
            state.free_gpus += 1;
        } else {
            state.free_lanes += placed.lanes;
        }
        let energy = self.energy_of(node, &placed, 1.0);
        let output_joules = self.task(task).map_or(0.0, |pending| {
            self.network_joules(node, pending.output_bytes)
        });
        self.charge(task, energy + output_joules);
        if self.config.estimates.learning {
            let pending = self.task(task);
            if let (Some(pending), Some(view)) = (pending, self.view.nodes.get_mut(node)) {
                view.corrections
                    .observe(pending, placed.modelled_s, placed.run_s);
            }
        }
        let output_s = match (self.view.nodes.get(node), self.task(task)) {
            (Some(view), Some(pending)) => {
                let mut view = view.clone();
                if let Some(link) = self.env.link(node, self.now_ms) {
                    view.network = link;
                }
                estimate::transfer_s(&view, pending.output_bytes)
            }
            _ => 0.0,
        };
        // A forwarded task's output goes on to the site it arrived at.
        let away = self.task_site.get(task) != self.origin.get(task);
        let return_s = match (&self.gossip, self.task(task)) {
            (Some(gossip), Some(pending)) if away => gossip.return_s(pending),
            _ => 0.0,
        };
        self.schedule(
            self.now_ms + (output_s + return_s) * 1000.0,
            Event::OutputArrived(task),
        );
        self.try_start(node);
    }

    fn fail(&mut self, node: usize) {
        let now = self.now_ms;
        let lost: Vec<Placed> = match self.nodes.get_mut(node) {
            Some(state) => {
                if self.view.nodes.get(node).is_some_and(|view| !view.online) {
                    return;
                }
                state.epoch = state.epoch.wrapping_add(1);
                state.queue.clear();
                std::mem::take(&mut state.placed)
            }
            None => return,
        };
        if let Some(view) = self.view.nodes.get_mut(node) {
            view.online = false;
            if let Some(state) = self.nodes.get_mut(node) {
                state.free_lanes = view.cpu_cores.floor().max(1.0) as u32;
                state.free_gpus = view.gpu_devices();
            }
        }
        for placed in lost {
            if let Some(started) = placed.started_ms {
                let fraction = ((now - started) / 1000.0 / placed.run_s.max(1e-9)).clamp(0.0, 1.0);
                let energy = self.energy_of(node, &placed, fraction);
                self.charge(placed.task, energy);
            }
            let counted = self.counted(placed.task);
            if counted {
                self.row.failed_attempts += 1;
            }
            self.tell(placed.task, Fate::AttemptLost, 0.0);
            if let Some(attempts) = self.attempts.get_mut(placed.task) {
                *attempts += 1;
                if *attempts >= self.config.max_attempts {
                    if counted {
                        self.row.failed += 1;
                    }
                    self.tell(placed.task, Fate::Lost, 0.0);
                    continue;
                }
            }
            // Back to the queue of the site whose node it was on.
            let site = self.node_site.get(node).copied().unwrap_or(0);
            self.enqueue(site, placed.task, now);
        }
        let site = self.node_site.get(node).copied().unwrap_or(0);
        if self.pending.get(site).is_some_and(|p| !p.is_empty()) {
            self.schedule_round(site, now);
        }
        self.schedule(now + self.config.repair_s * 1000.0, Event::Repair(node));
    }

    fn complete(&mut self, task: usize) {
        let Some(pending) = self.task(task) else {
            return;
        };
        let latency = self.now_ms - pending.submitted_ms as f64;
        let on_time = pending
            .deadline_ms
            .is_none_or(|deadline| self.now_ms <= deadline as f64);
        if self.env.counted(pending) {
            self.latencies_ms.push(latency);
            self.row.completed += 1;
            self.row.on_time += u64::from(on_time);
        }
        let fate = if on_time { Fate::OnTime } else { Fate::Late };
        if let Some(tally) = self
            .origin
            .get(task)
            .and_then(|site| self.tallies.get_mut(*site))
        {
            tally.completed += 1;
            tally.on_time += u64::from(on_time);
        }
        self.tell(task, fate, latency);
    }
}

/// Runs one policy over one environment and returns its table row, telling
/// `observer` each task's fate (and each attempt lost) as it happens.
pub(crate) fn simulate(
    config: &SimConfig,
    env: &Environment,
    policy: &mut dyn Policy,
    stopwatch: &mut dyn Stopwatch,
    observer: &mut dyn FnMut(TaskOutcome),
) -> PolicyRow {
    let layout = Layout::single(env);
    simulate_sites(
        config,
        env,
        &layout,
        &mut [policy],
        None,
        stopwatch,
        observer,
    )
    .row
}

/// Runs one policy per site over one environment split by `layout`,
/// forwarding between sites when `gossip` is given.
pub(crate) fn simulate_sites(
    config: &SimConfig,
    env: &Environment,
    layout: &Layout,
    policies: &mut [&mut dyn Policy],
    gossip: Option<Gossip>,
    stopwatch: &mut dyn Stopwatch,
    observer: &mut dyn FnMut(TaskOutcome),
) -> SitesRun {
    let nodes = env
        .nodes
        .iter()
        .map(|view| NodeState {
            free_lanes: view.cpu_cores.floor().max(1.0) as u32,
            free_gpus: view.gpu_devices(),
            ..NodeState::default()
        })
        .collect();
    let mut node_site = vec![0; env.nodes.len()];
    for (site, range) in layout.sites.iter().enumerate() {
        for index in range.clone() {
            if let Some(slot) = node_site.get_mut(index) {
                *slot = site;
            }
        }
    }
    let site_count = layout.sites.len().max(1);
    let mut tallies: Vec<SiteTally> = (0..site_count)
        .map(|site| SiteTally {
            site,
            ..SiteTally::default()
        })
        .collect();
    let origin: Vec<usize> = (0..env.tasks.len())
        .map(|task| layout.origin.get(task).copied().unwrap_or(0))
        .collect();
    for site in &origin {
        if let Some(tally) = tallies.get_mut(*site) {
            tally.arrivals += 1;
        }
    }
    let name = policies
        .first()
        .map(|policy| policy.name().to_owned())
        .unwrap_or_default();
    let federated = gossip.is_some();
    let mut engine = Engine {
        config,
        env,
        view: ClusterView {
            now_ms: 0,
            nodes: env.nodes.clone(),
        },
        nodes,
        events: BinaryHeap::new(),
        sequence: 0,
        now_ms: 0.0,
        sites: layout.sites.clone(),
        node_site,
        task_site: origin.clone(),
        origin,
        tallies,
        gossip,
        pending: vec![Vec::new(); site_count],
        attempts: vec![0; env.tasks.len()],
        round_scheduled: vec![false; site_count],
        row: PolicyRow {
            policy: name,
            tasks: env.tasks.iter().filter(|task| env.counted(task)).count() as u64,
            ..PolicyRow::default()
        },
        latencies_ms: Vec::with_capacity(env.tasks.len()),
        energy_joules: 0.0,
        task_energy: vec![0.0; env.tasks.len()],
        resolved: vec![false; env.tasks.len()],
        observer,
    };
    // The first digests go out before the first arrival.
    if federated {
        engine.schedule(0.0, Event::Gossip);
    }
    for (index, task) in env.tasks.iter().enumerate() {
        engine.schedule(task.submitted_ms as f64, Event::Arrival(index));
    }
    for (at, node) in &env.failures {
        engine.schedule(*at, Event::Failure(*node));
    }
    while let Some(Reverse((at_us, _, event))) = engine.events.pop() {
        let at_ms = at_us as f64 / 1000.0;
        if at_ms > env.end_ms {
            break;
        }
        engine.now_ms = at_ms;
        match event {
            Event::Arrival(task) => {
                let site = engine.origin.get(task).copied().unwrap_or(0);
                engine.enqueue(site, task, at_ms);
            }
            Event::Round(site) => engine.round(site, policies, stopwatch),
            Event::Gossip => engine.gossip(),
            Event::Handover(task) => {
                let site = engine.task_site.get(task).copied().unwrap_or(0);
                engine.enqueue(site, task, at_ms);
            }
            Event::InputArrived { node, task, epoch } => {
                let current = engine.nodes.get(node).is_some_and(|s| s.epoch == epoch);
                if current {
                    if let Some(state) = engine.nodes.get_mut(node) {
                        state.queue.push_back(task);
                    }
                    engine.try_start(node);
                }
            }
            Event::Finished { node, task, epoch } => engine.finished(node, task, epoch),
            Event::OutputArrived(task) => engine.complete(task),
            Event::Failure(node) => engine.fail(node),
            Event::Repair(node) => {
                if let Some(view) = engine.view.nodes.get_mut(node) {
                    view.online = true;
                }
                let site = engine.node_site.get(node).copied().unwrap_or(0);
                if engine.pending.get(site).is_some_and(|p| !p.is_empty()) {
                    engine.schedule_round(site, at_ms);
                }
            }
        }
    }
    let unfinished = engine
        .row
        .tasks
        .saturating_sub(engine.row.completed + engine.row.failed + engine.row.dropped);
    engine.row.dropped += unfinished;
    for task in 0..env.tasks.len() {
        if !engine.resolved.get(task).copied().unwrap_or(true) {
            engine.tell(task, Fate::Lost, 0.0);
        }
    }
    engine
        .row
        .finish(&mut engine.latencies_ms, engine.energy_joules);
    for tally in &mut engine.tallies {
        tally.finish();
    }
    SitesRun {
        row: engine.row,
        sites: engine.tallies,
    }
}
