//! The live event stream, `GET /api/v1/events` (Server-Sent Events): what a
//! client subscribes to and the JSON each event carries.
//!
//! Each SSE event has `event:` set to the kind ([`EventKind::as_str`], or
//! `reset`), `id:` set to a [`StreamPosition`] a client hands back in
//! `Last-Event-ID` to resume, and `data:` set to one [`LiveEvent`] as JSON.
//! A `reset` event ([`StreamReset`]) means events were lost to this client
//! (it resumed from a position the coordinator no longer holds, or it read
//! too slowly); the client re-reads current state through the REST API and
//! subscribes again without `Last-Event-ID`.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::federation::SiteState;
use crate::task::TaskStatus;

/// The kinds of event a client can ask for (`kind=task,node`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum EventKind {
    /// A task changed state.
    Task,
    /// A node came online, was suspected, went offline, was revoked, or sent
    /// a new capability.
    Node,
    /// A node's telemetry sample (at most one a second per node).
    Telemetry,
    /// A federated site changed state.
    Site,
}

impl EventKind {
    /// Every kind.
    pub const ALL: [EventKind; 4] = [
        EventKind::Task,
        EventKind::Node,
        EventKind::Telemetry,
        EventKind::Site,
    ];

    /// The kind as the stream names it (`event:` and `kind=`).
    pub fn as_str(self) -> &'static str {
        match self {
            EventKind::Task => "task",
            EventKind::Node => "node",
            EventKind::Telemetry => "telemetry",
            EventKind::Site => "site",
        }
    }
}

impl fmt::Display for EventKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A string that names no event kind.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown event kind {0:?}; use task, node, telemetry or site (comma-separated)")]
pub struct UnknownEventKind(pub String);

impl FromStr for EventKind {
    type Err = UnknownEventKind;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        EventKind::ALL
            .into_iter()
            .find(|kind| kind.as_str() == s)
            .ok_or_else(|| UnknownEventKind(s.to_owned()))
    }
}

/// One event of the stream.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum LiveEvent {
    /// A task changed state.
    Task(TaskChange),
    /// A node changed.
    Node(NodeChange),
    /// A telemetry sample.
    Telemetry(TelemetrySample),
    /// A site changed state.
    Site(SiteChange),
}

impl LiveEvent {
    /// The event's kind.
    pub fn kind(&self) -> EventKind {
        match self {
            LiveEvent::Task(_) => EventKind::Task,
            LiveEvent::Node(_) => EventKind::Node,
            LiveEvent::Telemetry(_) => EventKind::Telemetry,
            LiveEvent::Site(_) => EventKind::Site,
        }
    }

    /// The task it concerns, if any.
    pub fn task_id(&self) -> Option<&str> {
        match self {
            LiveEvent::Task(change) => Some(&change.task_id),
            _ => None,
        }
    }

    /// The node it concerns, if any.
    pub fn node_id(&self) -> Option<&str> {
        match self {
            LiveEvent::Task(change) => change.node_id.as_deref(),
            LiveEvent::Node(change) => Some(&change.node_id),
            LiveEvent::Telemetry(sample) => Some(&sample.node_id),
            LiveEvent::Site(_) => None,
        }
    }
}

/// A task's new state.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct TaskChange {
    /// The task.
    pub task_id: String,
    /// Its state now.
    pub status: TaskStatus,
    /// Its current attempt; 0 before the first assignment.
    pub attempt: u32,
    /// The node of the attempt, when it runs at this site.
    pub node_id: Option<String>,
    /// The site the attempt was forwarded to, when it runs elsewhere.
    pub site: Option<String>,
    /// The power level chosen for the attempt.
    pub power_level: Option<u8>,
    /// For a failure: its reason code.
    pub reason: Option<String>,
    /// When the coordinator recorded the change, Unix ms.
    pub at_ms: u64,
}

/// What happened to a node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum NodeChangeKind {
    /// It came online (or back).
    Online,
    /// The coordinator stopped hearing from it; its work was requeued.
    Suspect,
    /// It said it went offline (its last will, or a clean stop).
    Offline,
    /// An operator revoked its credentials.
    Revoked,
    /// It appeared, or sent a new capability report.
    Capability,
}

impl NodeChangeKind {
    /// The change as the stream writes it.
    pub fn as_str(self) -> &'static str {
        match self {
            NodeChangeKind::Online => "online",
            NodeChangeKind::Suspect => "suspect",
            NodeChangeKind::Offline => "offline",
            NodeChangeKind::Revoked => "revoked",
            NodeChangeKind::Capability => "capability",
        }
    }
}

/// A node's change.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct NodeChange {
    /// The node.
    pub node_id: String,
    /// What happened.
    pub change: NodeChangeKind,
    /// When the coordinator saw it, Unix ms.
    pub at_ms: u64,
}

/// One node's telemetry, as the coordinator accepted it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct TelemetrySample {
    /// The node.
    pub node_id: String,
    /// CPU load, 0..=1.
    pub cpu_load: f32,
    /// Memory in use, 0..=1 of the node's total.
    pub memory_used: f32,
    /// Free memory, bytes.
    pub free_memory_bytes: u64,
    /// Round trip to the broker, ms, when the agent measured it.
    pub rtt_ms: Option<f32>,
    /// The busiest GPU's load, 0..=1, where the node has a sensor for it.
    #[serde(default)]
    pub gpu_load: Option<f32>,
    /// Energy used since the agent started, joules.
    #[serde(default)]
    pub energy_joules: f64,
    /// Where `energy_joules` came from: `sensor` (the node's energy
    /// counters) or `model` (the power model over the measured load).
    #[serde(default)]
    pub energy_source: String,
    /// The power level in force.
    pub power_level: u8,
    /// Tasks running.
    pub running_tasks: u16,
    /// Tasks queued on the node.
    pub queued_tasks: u16,
    /// When the coordinator received it, Unix ms.
    pub at_ms: u64,
}

/// A site's new state.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct SiteChange {
    /// The site.
    pub site: String,
    /// Its state now.
    pub state: SiteState,
    /// When this coordinator saw the change, Unix ms.
    pub at_ms: u64,
}

/// Why the stream was reset (the `data` of a `reset` event).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct StreamReset {
    /// `unknown_position` (the `Last-Event-ID` is not held any more, or is
    /// from before a restart) or `too_slow` (the client fell behind).
    pub reason: String,
    /// For people.
    pub message: String,
}

/// A position in the stream, written `BOOT-SEQ` in `id:` and
/// `Last-Event-ID`: `BOOT` names the coordinator's run (positions of an
/// earlier run mean nothing to this one), `SEQ` counts events from 1.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct StreamPosition {
    /// The coordinator run.
    pub boot: u64,
    /// The event's number in that run.
    pub seq: u64,
}

impl fmt::Display for StreamPosition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:x}-{}", self.boot, self.seq)
    }
}

/// A `Last-Event-ID` this coordinator cannot read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid stream position {0:?}; send back an id: the stream gave, like 18c0f3a2-42")]
pub struct InvalidStreamPosition(pub String);

impl FromStr for StreamPosition {
    type Err = InvalidStreamPosition;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let invalid = || InvalidStreamPosition(s.chars().take(64).collect());
        let (boot, seq) = s.trim().split_once('-').ok_or_else(invalid)?;
        Ok(StreamPosition {
            boot: u64::from_str_radix(boot, 16).map_err(|_| invalid())?,
            seq: seq.parse().map_err(|_| invalid())?,
        })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn positions_round_trip_and_refuse_garbage() {
        let position = StreamPosition {
            boot: 0x18c0_f3a2,
            seq: 42,
        };
        assert_eq!(position.to_string(), "18c0f3a2-42");
        assert_eq!("18c0f3a2-42".parse::<StreamPosition>().unwrap(), position);
        for bad in ["", "42", "x-1", "1-", "1-x", "1--2"] {
            assert!(bad.parse::<StreamPosition>().is_err(), "{bad}");
        }
    }

    #[test]
    fn events_carry_their_kind() {
        let event = LiveEvent::Node(NodeChange {
            node_id: "pi-1".into(),
            change: NodeChangeKind::Suspect,
            at_ms: 5,
        });
        let json = serde_json::to_value(&event).unwrap();
        assert_eq!(json["kind"], "node");
        assert_eq!(json["change"], "suspect");
        let back: LiveEvent = serde_json::from_value(json).unwrap();
        assert_eq!(back, event);
        assert_eq!(back.kind(), EventKind::Node);
        assert_eq!(
            "telemetry".parse::<EventKind>().unwrap(),
            EventKind::Telemetry
        );
        assert!("tasks".parse::<EventKind>().is_err());
    }
}
