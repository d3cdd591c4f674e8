//! The discrete-event engine: replays one [`Environment`] under one policy.
//!
//! A placed task first moves its input over the node's link (at the link's state
//! when it leaves), then waits in the node's FIFO queue until enough lanes (cores)
//! or a GPU are free, runs for the estimated execution time times a per-task noise,
//! and sends its output back. A node failure loses everything placed on it; those
//! tasks return to the pending queue until they run out of attempts. A task still
//! pending when its deadline has passed is dropped, as is anything unfinished when
//! the run ends.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};

use crate::estimate;
use crate::learned::{Fate, TaskOutcome};
use crate::model::{ClusterView, NodeLoad, PendingTask};
use crate::policy::{Outcome, Policy};
use crate::sim::report::PolicyRow;
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
    Round,
}

#[derive(Debug, Clone, Copy)]
struct Placed {
    task: usize,
    power_level: u8,
    /// Execution seconds including noise, known when placed.
    run_s: f64,
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

struct Engine<'a> {
    config: &'a SimConfig,
    env: &'a Environment,
    view: ClusterView,
    nodes: Vec<NodeState>,
    events: BinaryHeap<Reverse<(u64, u64, Event)>>,
    sequence: u64,
    now_ms: f64,
    pending: Vec<usize>,
    attempts: Vec<u32>,
    round_scheduled: bool,
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

    fn schedule_round(&mut self, at_ms: f64) {
        if !self.round_scheduled {
            self.round_scheduled = true;
            let round = self.config.round_ms as f64;
            let at = (at_ms / round).ceil() * round;
            self.schedule(at, Event::Round);
        }
    }

    /// Refreshes the view's loads, links and online flags from the engine's state.
    fn refresh_view(&mut self) {
        let now = self.now_ms;
        for (index, (node_view, state)) in self.view.nodes.iter_mut().zip(&self.nodes).enumerate() {
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

    fn round(&mut self, policy: &mut dyn Policy, stopwatch: &mut dyn Stopwatch) {
        self.round_scheduled = false;
        if self.pending.is_empty() {
            return;
        }
        self.refresh_view();
        let queue: Vec<PendingTask> = self
            .pending
            .iter()
            .filter_map(|index| self.env.tasks.get(*index).cloned())
            .collect();
        let started = stopwatch.now_ns();
        let decisions = policy.decide(&self.view, &queue);
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
            match decision.outcome {
                Outcome::Place { node, power_level } => {
                    if !self.dispatch(task_index, node, power_level) {
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
                self.row.dropped += 1;
                self.tell(index, Fate::Lost, 0.0);
            } else {
                kept.push(index);
            }
        }
        kept.sort_unstable();
        self.pending = kept;
        if !self.pending.is_empty() {
            self.schedule_round(now + self.config.round_ms as f64);
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
        let run_s =
            estimate::execution_s(node_view, task, power_level) * self.env.noise(task.key, attempt);
        let placed = Placed {
            task: task_index,
            power_level,
            run_s,
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
        let Some(state) = self.nodes.get_mut(node) else {
            return false;
        };
        state.placed.push(placed);
        let epoch = state.epoch;
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
        self.energy_joules += energy;
        if let Some(spent) = self.task_energy.get_mut(task) {
            *spent += energy;
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
        self.schedule(self.now_ms + output_s * 1000.0, Event::OutputArrived(task));
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
                self.energy_joules += energy;
                if let Some(spent) = self.task_energy.get_mut(placed.task) {
                    *spent += energy;
                }
            }
            self.row.failed_attempts += 1;
            self.tell(placed.task, Fate::AttemptLost, 0.0);
            if let Some(attempts) = self.attempts.get_mut(placed.task) {
                *attempts += 1;
                if *attempts >= self.config.max_attempts {
                    self.row.failed += 1;
                    self.tell(placed.task, Fate::Lost, 0.0);
                    continue;
                }
            }
            self.pending.push(placed.task);
        }
        self.pending.sort_unstable();
        if !self.pending.is_empty() {
            self.schedule_round(now);
        }
        self.schedule(now + self.config.repair_s * 1000.0, Event::Repair(node));
    }

    fn complete(&mut self, task: usize) {
        let Some(pending) = self.task(task) else {
            return;
        };
        let latency = self.now_ms - pending.submitted_ms as f64;
        self.latencies_ms.push(latency);
        self.row.completed += 1;
        let on_time = pending
            .deadline_ms
            .is_none_or(|deadline| self.now_ms <= deadline as f64);
        if on_time {
            self.row.on_time += 1;
        }
        let fate = if on_time { Fate::OnTime } else { Fate::Late };
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
    let nodes = env
        .nodes
        .iter()
        .map(|view| NodeState {
            free_lanes: view.cpu_cores.floor().max(1.0) as u32,
            free_gpus: view.gpu_devices(),
            ..NodeState::default()
        })
        .collect();
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
        pending: Vec::new(),
        attempts: vec![0; env.tasks.len()],
        round_scheduled: false,
        row: PolicyRow {
            policy: policy.name().to_owned(),
            tasks: env.tasks.len() as u64,
            ..PolicyRow::default()
        },
        latencies_ms: Vec::with_capacity(env.tasks.len()),
        energy_joules: 0.0,
        task_energy: vec![0.0; env.tasks.len()],
        resolved: vec![false; env.tasks.len()],
        observer,
    };
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
                engine.pending.push(task);
                engine.schedule_round(at_ms);
            }
            Event::Round => engine.round(policy, stopwatch),
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
                if !engine.pending.is_empty() {
                    engine.schedule_round(at_ms);
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
    engine.row
}
