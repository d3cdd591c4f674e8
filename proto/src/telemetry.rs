//! What a node is doing now: published periodically (1 s by default).

use serde::{Deserialize, Serialize};

use crate::capability::Source;
use crate::ids::{NodeId, TaskId};
use crate::limits::MAX_LISTED_ATTEMPTS;

/// One attempt of a task, as the node holds it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AttemptRef {
    /// The task.
    pub task_id: TaskId,
    /// The attempt number the coordinator gave it.
    pub attempt: u32,
}

/// The network path from the node to the broker, as the agent measured it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct LinkState {
    /// Round-trip time to the broker in milliseconds, when measured.
    pub rtt_ms: Option<f32>,
    /// Bandwidth toward the broker in Mbit/s, when measured.
    pub bandwidth_mbps: Option<f32>,
    /// Fraction of probes lost (0..=1), when measured.
    pub loss: Option<f32>,
}

/// A periodic report of load and state.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Telemetry {
    /// Protocol version.
    pub v: u16,
    /// The node's id.
    pub node_id: NodeId,
    /// Sequence number, increasing per agent run; lets the coordinator drop stale reports.
    pub seq: u64,
    /// Milliseconds since the agent started.
    pub uptime_ms: u64,
    /// CPU load, 0..=1 over all cores.
    pub cpu_load: f32,
    /// Free memory in bytes.
    pub free_memory_bytes: u64,
    /// Disk read rate over the last period, bytes per second.
    pub io_read_bps: u64,
    /// Disk write rate over the last period, bytes per second.
    pub io_write_bps: u64,
    /// Network state toward the broker.
    pub link: LinkState,
    /// Tasks executing now.
    pub running_tasks: u16,
    /// Tasks accepted but waiting for a slot.
    pub queued_tasks: u16,
    /// The power level in force (an index into the capability's levels).
    pub power_level: u8,
    /// Energy used since the agent started, in joules: read from the
    /// node's energy sensors where it has them, modelled from its load
    /// otherwise (`energy_source` says which).
    pub energy_joules: f64,
    /// Where `energy_joules` came from: `sensor` or `model` (older agents:
    /// model).
    #[serde(default)]
    pub energy_source: Source,
    /// The busiest GPU's load over the last period, 0..=1, where the kernel
    /// exposes it (a sensor reading); absent elsewhere.
    #[serde(default)]
    pub gpu_load: Option<f32>,
    /// The attempts the node holds unfinished (accepted, waiting for a slot
    /// or running), at most [`MAX_LISTED_ATTEMPTS`]. The coordinator
    /// reconciles them with its own view: an attempt it does not know (or
    /// has ended) is cancelled, one missing from a complete list is placed
    /// again. Absent in reports of older agents.
    #[serde(default)]
    pub attempts: heapless::Vec<AttemptRef, MAX_LISTED_ATTEMPTS>,
    /// Whether `attempts` lists every unfinished attempt. False when the node
    /// holds more than fit, and in reports of agents that do not list them:
    /// the coordinator then re-places nothing for being missing.
    #[serde(default)]
    pub attempts_complete: bool,
}

impl Telemetry {
    /// What is wrong with the figures, if anything: a load, link measure or
    /// energy that is NaN, infinite or negative (the coordinator computes
    /// free capacity and energy use with them).
    pub fn problems(&self) -> Option<alloc::string::String> {
        let bad = |value: f64| !(value.is_finite() && value >= 0.0);
        let figures = [
            ("cpu_load", Some(f64::from(self.cpu_load))),
            ("link.rtt_ms", self.link.rtt_ms.map(f64::from)),
            (
                "link.bandwidth_mbps",
                self.link.bandwidth_mbps.map(f64::from),
            ),
            ("link.loss", self.link.loss.map(f64::from)),
            ("energy_joules", Some(self.energy_joules)),
            ("gpu_load", self.gpu_load.map(f64::from)),
        ];
        let negative_or_not_finite = figures.into_iter().find_map(|(name, value)| {
            value
                .filter(|value| bad(*value))
                .map(|value| alloc::format!("{name} {value} is not a finite, non-negative number"))
        });
        negative_or_not_finite.or_else(|| {
            // Fractions: a loss or a load past 1 is a broken sensor or a lie.
            [("link.loss", self.link.loss), ("gpu_load", self.gpu_load)]
                .into_iter()
                .find_map(|(name, value)| {
                    value
                        .filter(|value| *value > 1.0)
                        .map(|value| alloc::format!("{name} {value} is more than 1"))
                })
        })
    }
}
