//! The feature layout the learned policies read: one fixed-length vector per
//! (node, task, power level), the same for every fleet size.
//!
//! A network scores one candidate at a time, so a model trained on 20 devices
//! scores 200 (or 10 000) without change; the candidates of one decision are
//! told apart only by their features. Every feature is scaled to roughly
//! `-1..=1` (a few may reach 3 to 6 in extreme states) so that no input
//! dominates the first layer.
//!
//! The layout is versioned by [`LAYOUT`]: a model file names the layout (and the
//! features, in order) it was trained on, and a model whose layout differs from
//! this build's is refused on load rather than fed vectors it does not know.

use crate::estimate;
use crate::model::{NodeLoad, NodeView, PendingTask, TaskClass};

/// The name and version of this layout, written into every model file.
pub const LAYOUT: &str = "starling-placement-features/1";

/// How many features a candidate vector has.
pub const FEATURES: usize = 24;

/// A candidate's feature vector.
pub type Features = [f32; FEATURES];

/// The features' names, in order: `task.*` describe the task (the same for every
/// candidate of one decision), `node.*` the node and its five-dimensional queue
/// state as they bear on this task, `level.*` the power level considered.
pub const FEATURE_NAMES: [&str; FEATURES] = [
    "task.class.cpu",
    "task.class.gpu",
    "task.class.io",
    "task.work",
    "task.time_left",
    "task.priority",
    "task.needs_device",
    "node.rate",
    "node.runs_on_device",
    "node.queue.queued_tasks",
    "node.queue.backlog",
    "node.queue.earliest_slack",
    "node.queue.utilisation",
    "node.queue.energy_headroom",
    "node.wait",
    "node.transfer",
    "node.fit",
    "level.speed_factor",
    "level.active_watts",
    "level.finish",
    "level.slack_ratio",
    "level.meets_deadline",
    "level.energy",
    "level.is_top",
];

/// Seconds that scale time-like features (ten seconds maps to 1).
const TIME_SCALE_S: f64 = 10.0;
/// Time left assumed for a task without a deadline, seconds.
const NO_DEADLINE_S: f64 = 60.0;

fn clamp(value: f64, low: f64, high: f64) -> f32 {
    if value.is_nan() {
        return low as f32;
    }
    value.clamp(low, high) as f32
}

/// The features of placing `task` on `node` (with `load`, the node's load in this
/// round) at `power_level`, at time `now_ms`.
pub fn candidate(
    node: &NodeView,
    load: &NodeLoad,
    task: &PendingTask,
    power_level: u8,
    now_ms: f64,
) -> Features {
    let mut out = [0.0f32; FEATURES];
    fill_task(&mut out, task, now_ms);
    fill_node(&mut out, node, load, task);
    fill_level(&mut out, node, load, task, power_level, now_ms);
    out
}

fn time_left_s(task: &PendingTask, now_ms: f64) -> f64 {
    task.deadline_ms.map_or(NO_DEADLINE_S, |deadline| {
        (deadline as f64 - now_ms) / 1000.0
    })
}

fn fill_task(out: &mut Features, task: &PendingTask, now_ms: f64) {
    let class = match task.class {
        TaskClass::Cpu => 0,
        TaskClass::Gpu => 1,
        TaskClass::Io => 2,
    };
    out[class] = 1.0;
    out[3] = clamp(task.work.max(0.0).ln_1p(), 0.0, 6.0);
    out[4] = clamp(time_left_s(task, now_ms) / TIME_SCALE_S, -1.0, 6.0);
    out[5] = f32::from(task.priority) / 255.0;
    out[6] = f32::from(u8::from(estimate::needs_device(task)));
}

fn fill_node(out: &mut Features, node: &NodeView, load: &NodeLoad, task: &PendingTask) {
    let top = node.top_power_level();
    // The task's run rate at full power, in reference seconds of work per second.
    let rate = task.work.max(1e-3) / estimate::execution_s(node, task, top).max(1e-6);
    out[7] = clamp(rate.ln_1p(), 0.0, 6.0);
    out[8] = f32::from(u8::from(estimate::runs_on_gpu(node, task)));
    let state = load.queue_state(node);
    out[9] = clamp(state.queued_tasks / 10.0, 0.0, 5.0);
    out[10] = clamp(state.backlog_s / TIME_SCALE_S, 0.0, 5.0);
    out[11] = clamp(state.earliest_slack_s / TIME_SCALE_S, -1.0, 1.0);
    out[12] = clamp(state.utilisation, 0.0, 1.0);
    out[13] = clamp(state.energy_headroom, 0.0, 1.0);
    out[14] = clamp(
        estimate::queue_wait_s(node, load, task) / TIME_SCALE_S,
        0.0,
        5.0,
    );
    let transfer = estimate::transfer_s(node, task.input_bytes)
        + estimate::transfer_s(node, task.output_bytes);
    out[15] = clamp(transfer / TIME_SCALE_S, 0.0, 5.0);
    out[16] = clamp(estimate::fit(node, task), 0.0, 1.0);
}

fn fill_level(
    out: &mut Features,
    node: &NodeView,
    load: &NodeLoad,
    task: &PendingTask,
    power_level: u8,
    now_ms: f64,
) {
    let level = node.power_level(power_level);
    out[17] = clamp(level.speed_factor, 0.0, 1.0);
    out[18] = clamp(level.active_watts.max(0.0).ln_1p() / 4.0, 0.0, 2.0);
    let finish_ms = estimate::finish_ms(node, load, task, power_level, now_ms);
    out[19] = clamp((finish_ms - now_ms) / 1000.0 / TIME_SCALE_S, 0.0, 5.0);
    match task.deadline_ms {
        Some(deadline) => {
            let deadline = deadline as f64;
            let left_ms = (deadline - now_ms).max(100.0);
            out[20] = clamp((deadline - finish_ms) / left_ms, -3.0, 1.0);
            out[21] = f32::from(u8::from(finish_ms <= deadline));
        }
        None => {
            out[20] = 1.0;
            out[21] = 1.0;
        }
    }
    out[22] = clamp(
        estimate::energy_joules(node, task, power_level).ln_1p() / 4.0,
        0.0,
        3.0,
    );
    out[23] = f32::from(u8::from(power_level >= node.top_power_level()));
}

/// The layout's feature names as owned strings, as a model file records them.
pub fn names() -> Vec<String> {
    FEATURE_NAMES
        .iter()
        .map(|name| (*name).to_owned())
        .collect()
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use crate::testing::{node, task};

    #[test]
    fn features_are_finite_bounded_and_tell_levels_apart() {
        let view = node("n", 4.0, 1.0);
        let mut t = task(1, TaskClass::Cpu);
        t.deadline_ms = Some(3_000);
        let low = candidate(&view, &view.load, &t, 0, 0.0);
        let top = candidate(&view, &view.load, &t, 1, 0.0);
        for value in low.iter().chain(top.iter()) {
            assert!(value.is_finite() && (-3.0..=6.0).contains(value), "{value}");
        }
        assert_eq!(
            low[..17],
            top[..17],
            "task and node features do not depend on the level"
        );
        assert_eq!(low[0], 1.0);
        assert_eq!(top[23], 1.0);
        assert_eq!(low[23], 0.0);
        assert!(low[19] > top[19], "the lower level finishes later");
        assert!(low[22] < top[22], "and costs less energy");
        assert_eq!(FEATURE_NAMES.len(), FEATURES);
        let mut sorted = names();
        sorted.sort();
        sorted.dedup();
        assert_eq!(sorted.len(), FEATURES, "names are unique");
    }

    #[test]
    fn a_busier_node_looks_busier() {
        let idle = node("idle", 4.0, 1.0);
        let mut busy = node("busy", 4.0, 1.0);
        busy.load.backlog_cpu_s = 20.0;
        busy.load.queued_tasks = 6;
        let t = task(1, TaskClass::Cpu);
        let a = candidate(&idle, &idle.load, &t, 1, 0.0);
        let b = candidate(&busy, &busy.load, &t, 1, 0.0);
        assert!(b[9] > a[9] && b[10] > a[10] && b[14] > a[14] && b[19] > a[19]);
    }
}
