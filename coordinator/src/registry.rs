//! The registry of nodes: what each node said about itself (capability), what
//! it is doing (latest telemetry) and whether it is reachable (status). A plain
//! state machine fed by decoded messages; the MQTT loop lives in `ingest`.

use std::collections::{BTreeMap, VecDeque};

use starling_placement::correction::NodeCorrections;
use starling_placement::TaskClass;
use starling_proto::{Capability, NodeId, NodeState, Status, Telemetry};

use crate::domain::liveness::Silence;

/// What the registry knows about one node.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeEntry {
    /// The node's capability report.
    pub capability: Capability,
    /// Its latest telemetry, if any arrived.
    pub telemetry: Option<Telemetry>,
    /// Its latest status; `None` until the first status message.
    pub state: Option<NodeState>,
    /// When anything was last heard from it, Unix milliseconds.
    pub last_seen_ms: u64,
    /// When its latest telemetry arrived, Unix milliseconds.
    pub telemetry_received_ms: Option<u64>,
    /// Whether it is offline because it fell silent (no last will arrived):
    /// its next telemetry brings it back online.
    pub silent: bool,
    /// Whether the node announced a new session (an `online` status) since
    /// its latest telemetry: the next sample starts a new ordering, whatever
    /// its sequence number and uptime.
    pub new_session: bool,
    /// Whether it left an assignment unanswered past the grace period
    /// (`domain::attempts`): it is offered no work until it answers one, or
    /// connects again (an `online` status: a new session).
    pub unresponsive: bool,
    /// How its run times stood against their estimates, learned from its
    /// finished attempts (`starling_placement::correction`); reset when its
    /// capability declares other processors.
    pub corrections: NodeCorrections,
    /// Attempts placed on it whose run time is awaited, oldest first (at
    /// most [`MAX_EXPECTED_RUNS`]).
    pub expected: VecDeque<ExpectedRun>,
}

/// The most attempts awaited per node; past it the oldest is forgotten
/// (its sample is lost, nothing else).
pub const MAX_EXPECTED_RUNS: usize = 4096;

/// An attempt placed on a node, with the run time placement expected of it.
#[derive(Debug, Clone, PartialEq)]
pub struct ExpectedRun {
    /// The task.
    pub task_id: String,
    /// Its attempt.
    pub attempt: u32,
    /// Seconds of execution by the model alone (what corrections learn against).
    pub modelled_s: f64,
    /// Seconds of execution placement expected: the model times the
    /// correction it had then.
    pub predicted_s: f64,
    /// Its class of work.
    pub class: TaskClass,
    /// Its artifact's key (`starling_placement::correction::artifact_key`).
    pub artifact: u64,
}

/// What one finished attempt taught: its predicted and observed run time.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RunSample {
    /// Seconds placement expected.
    pub predicted_s: f64,
    /// Seconds it took.
    pub observed_s: f64,
}

impl NodeEntry {
    /// Whether the node is online: it said so and has not said otherwise.
    pub fn online(&self) -> bool {
        self.state == Some(NodeState::Online)
    }
}

/// Why a report was refused. The registry is unchanged after any of these.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RegistryError {
    /// Telemetry or status for a node that never sent its capability.
    #[error("node {0} has not published its capability; its report is ignored")]
    UnknownNode(String),
    /// The topic names one node and the payload another.
    #[error("message on the topic of node {topic_node} claims to come from node {payload_node}")]
    NodeMismatch {
        /// The node in the topic.
        topic_node: String,
        /// The node in the payload.
        payload_node: String,
    },
}

/// What a report changed, for the callers that must react.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RegistryChange {
    /// A node appeared or sent a new capability.
    NodeRegistered(NodeId),
    /// A node came online.
    NodeOnline(NodeId),
    /// A node went offline: its in-flight work is lost.
    NodeOffline(NodeId),
    /// Load figures changed.
    TelemetryUpdated(NodeId),
    /// An older telemetry report arrived after a newer one and was dropped.
    StaleTelemetry(NodeId),
    /// A status repeated the state already known.
    Unchanged(NodeId),
    /// A status arrived before the node's capability: it is held (not shown)
    /// and applied when the capability arrives. Agents may publish their status
    /// first, and a broker replays retained messages in its own order.
    AwaitingCapability(NodeId),
}

/// How long after the held telemetry (by the coordinator's receive clock) a
/// sample with a lower sequence number still counts as a reordered copy and
/// is dropped. Past it, the later arrival wins: a node's numbering orders
/// samples that cross each other in flight, it never outranks our clock, so a
/// jump in `seq` (a bug, or a forged `seq: u64::MAX`) holds the node's figures
/// for at most this long. Telemetry is QoS 0 and never retained, so copies do
/// not linger in the broker longer than this.
pub const REORDER_WINDOW_MS: u64 = 2_000;

/// Most statuses held for nodes whose capability has not arrived; beyond it,
/// such statuses are refused so that a flood of made-up node ids costs nothing.
pub const MAX_HELD_STATUSES: usize = 1024;

/// All known nodes, ordered by id.
#[derive(Debug, Clone, Default)]
pub struct Registry {
    nodes: BTreeMap<NodeId, NodeEntry>,
    held_statuses: BTreeMap<NodeId, NodeState>,
}

fn same_node(topic_node: &NodeId, payload_node: &NodeId) -> Result<(), RegistryError> {
    if topic_node == payload_node {
        Ok(())
    } else {
        Err(RegistryError::NodeMismatch {
            topic_node: topic_node.to_string(),
            payload_node: payload_node.to_string(),
        })
    }
}

impl Registry {
    /// An empty registry.
    pub fn new() -> Self {
        Self::default()
    }

    /// Records a capability report received on `topic_node`'s topic.
    pub fn apply_capability(
        &mut self,
        topic_node: &NodeId,
        capability: Capability,
        now_ms: u64,
    ) -> Result<RegistryChange, RegistryError> {
        same_node(topic_node, &capability.node_id)?;
        let id = capability.node_id.clone();
        match self.nodes.get_mut(&id) {
            Some(entry) => {
                // Other processors make what was learned of the old ones moot.
                if entry.capability.cpu != capability.cpu
                    || entry.capability.gpus != capability.gpus
                    || entry.capability.disks != capability.disks
                {
                    entry.corrections = NodeCorrections::default();
                }
                entry.capability = capability;
                entry.last_seen_ms = now_ms;
            }
            None => {
                let state = self.held_statuses.remove(&id);
                self.nodes.insert(
                    id.clone(),
                    NodeEntry {
                        capability,
                        telemetry: None,
                        state,
                        last_seen_ms: now_ms,
                        telemetry_received_ms: None,
                        silent: false,
                        new_session: false,
                        unresponsive: false,
                        corrections: NodeCorrections::default(),
                        expected: VecDeque::new(),
                    },
                );
                // A held status counts as a change now that the node is known:
                // an offline one must still release the node's in-flight work.
                match state {
                    Some(NodeState::Online) => return Ok(RegistryChange::NodeOnline(id)),
                    Some(NodeState::Offline) => return Ok(RegistryChange::NodeOffline(id)),
                    None => {}
                }
            }
        }
        Ok(RegistryChange::NodeRegistered(id))
    }

    /// Records a telemetry report received at `now_ms` (the coordinator's
    /// clock). Liveness goes by that clock alone: any report from the node is
    /// proof of life, so `last_seen_ms` moves and a silent node is online
    /// again whatever the report's numbers say. The figures shown are
    /// replaced unless the report is an older copy of the held one
    /// ([`Registry::is_reordered`]).
    pub fn apply_telemetry(
        &mut self,
        topic_node: &NodeId,
        telemetry: Telemetry,
        now_ms: u64,
    ) -> Result<RegistryChange, RegistryError> {
        same_node(topic_node, &telemetry.node_id)?;
        let id = telemetry.node_id.clone();
        let entry = self
            .nodes
            .get_mut(&id)
            .ok_or_else(|| RegistryError::UnknownNode(id.to_string()))?;
        entry.last_seen_ms = now_ms;
        let reordered = Self::is_reordered(entry, &telemetry, now_ms);
        if !reordered {
            entry.telemetry = Some(telemetry);
            entry.telemetry_received_ms = Some(now_ms);
            entry.new_session = false;
        }
        if entry.silent {
            // Telemetry is never retained, so it is proof of life: the link
            // came back without the agent reconnecting (or before its status).
            entry.silent = false;
            entry.state = Some(NodeState::Online);
            return Ok(RegistryChange::NodeOnline(id));
        }
        Ok(if reordered {
            RegistryChange::StaleTelemetry(id)
        } else {
            RegistryChange::TelemetryUpdated(id)
        })
    }

    /// Whether `telemetry` is an older copy of the sample held: same node
    /// session (no `online` status since, uptime not gone down by more than
    /// the window), a sequence
    /// number not above the held one, and arrived within
    /// [`REORDER_WINDOW_MS`] of it by the coordinator's clock.
    fn is_reordered(entry: &NodeEntry, telemetry: &Telemetry, now_ms: u64) -> bool {
        let (Some(previous), Some(received_ms)) = (&entry.telemetry, entry.telemetry_received_ms)
        else {
            return false;
        };
        // Uptime far below the held one is a restarted agent; a little below
        // is an older sample of the same run that crossed the held one.
        let restarted = telemetry.uptime_ms.saturating_add(REORDER_WINDOW_MS) < previous.uptime_ms;
        let same_session = !entry.new_session && !restarted;
        same_session
            && telemetry.seq <= previous.seq
            && now_ms.saturating_sub(received_ms) < REORDER_WINDOW_MS
    }

    /// Records a status message (including an agent's last will).
    pub fn apply_status(
        &mut self,
        topic_node: &NodeId,
        status: Status,
        now_ms: u64,
    ) -> Result<RegistryChange, RegistryError> {
        same_node(topic_node, &status.node_id)?;
        let id = status.node_id.clone();
        let Some(entry) = self.nodes.get_mut(&id) else {
            let room = self.held_statuses.len() < MAX_HELD_STATUSES
                || self.held_statuses.contains_key(&id);
            if !room {
                return Err(RegistryError::UnknownNode(id.to_string()));
            }
            self.held_statuses.insert(id.clone(), status.state);
            return Ok(RegistryChange::AwaitingCapability(id));
        };
        let previous = entry.state.replace(status.state);
        entry.last_seen_ms = now_ms;
        entry.silent = false;
        if status.state == NodeState::Online {
            // A (re)connected agent: its telemetry numbering starts over,
            // and it may be offered work again.
            entry.new_session = true;
            entry.unresponsive = false;
        }
        Ok(match (previous, status.state) {
            (Some(before), after) if before == after => RegistryChange::Unchanged(id),
            (_, NodeState::Online) => RegistryChange::NodeOnline(id),
            (_, NodeState::Offline) => RegistryChange::NodeOffline(id),
        })
    }

    /// Marks offline every online node `silence` finds silent (as if its
    /// last will had arrived) and returns them: agents report telemetry
    /// every second, and a broker that lost its session state may never
    /// deliver a last will.
    pub fn suspect_silent(&mut self, silence: &Silence) -> Vec<NodeId> {
        let mut suspected = Vec::new();
        for (id, entry) in &mut self.nodes {
            if entry.online() && silence.is_silent(entry.last_seen_ms) {
                entry.state = Some(NodeState::Offline);
                entry.silent = true;
                suspected.push(id.clone());
            }
        }
        suspected
    }

    /// Marks a node that left an assignment unanswered past the grace: no
    /// more work for it until [`Registry::answered`] (or it starts again).
    /// Returns whether it was marked now (it is known and was not already).
    pub fn suspect_unresponsive(&mut self, id: &NodeId) -> bool {
        match self.nodes.get_mut(id) {
            Some(entry) if !entry.unresponsive => {
                entry.unresponsive = true;
                true
            }
            _ => false,
        }
    }

    /// Records that a node answered an assignment (any task event from it);
    /// returns whether it had been marked unresponsive.
    pub fn answered(&mut self, id: &NodeId) -> bool {
        match self.nodes.get_mut(id) {
            Some(entry) if entry.unresponsive => {
                entry.unresponsive = false;
                true
            }
            _ => false,
        }
    }

    /// Notes an attempt placed on `id` with the run time expected of it,
    /// until [`Registry::finish_run`] (an unknown node: nothing).
    pub fn expect_run(&mut self, id: &NodeId, run: ExpectedRun) {
        if let Some(entry) = self.nodes.get_mut(id) {
            if entry.expected.len() >= MAX_EXPECTED_RUNS {
                entry.expected.pop_front();
            }
            entry.expected.push_back(run);
        }
    }

    /// An attempt on `id` ended. With `observed_s` (it succeeded, and the
    /// node measured its execution) and an expectation noted for it, the
    /// sample goes into the node's corrections and is returned; the
    /// expectation is forgotten either way.
    pub fn finish_run(
        &mut self,
        id: &NodeId,
        task_id: &str,
        attempt: u32,
        observed_s: Option<f64>,
    ) -> Option<RunSample> {
        let entry = self.nodes.get_mut(id)?;
        let position = entry
            .expected
            .iter()
            .position(|run| run.task_id == task_id && run.attempt == attempt)?;
        let run = entry.expected.remove(position)?;
        let observed_s = observed_s?;
        entry
            .corrections
            .observe_work(run.class, run.artifact, run.modelled_s, observed_s)
            .then_some(RunSample {
                predicted_s: run.predicted_s,
                observed_s,
            })
    }

    /// One node.
    pub fn get(&self, id: &NodeId) -> Option<&NodeEntry> {
        self.nodes.get(id)
    }

    /// Every node, ordered by id.
    pub fn nodes(&self) -> impl Iterator<Item = &NodeEntry> {
        self.nodes.values()
    }

    /// How many nodes are known.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Whether no node is known.
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }
}

/// The registry shared by the parts that read and change it (ingest,
/// liveness, the scheduler's view, REST): a lock around [`Registry`].
#[derive(Debug, Default)]
pub struct NodeRegistry(std::sync::RwLock<Registry>);

impl NodeRegistry {
    /// An empty registry.
    pub fn new() -> Self {
        Self::default()
    }

    /// Reads the registry; a poisoned lock (a panic while writing) still holds
    /// a consistent map because every write is a single insert or field update.
    pub fn read(&self) -> std::sync::RwLockReadGuard<'_, Registry> {
        self.0
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Writes the registry (see [`NodeRegistry::read`] on poisoning).
    pub fn write(&self) -> std::sync::RwLockWriteGuard<'_, Registry> {
        self.0
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
pub(crate) mod tests {
    use super::*;
    use starling_proto::PROTOCOL_VERSION;

    /// Silence at `now_ms` under `timeout_ms`, listening since
    /// `listening_since_ms`, ingest caught up.
    fn silence(now_ms: u64, timeout_ms: u64, listening_since_ms: u64) -> Silence {
        Silence {
            now_ms,
            timeout_ms,
            ingest_lag_ms: 0,
            listening_since_ms,
        }
    }

    pub(crate) fn capability(id: &str) -> Capability {
        starling_proto::fixtures::capability(id)
    }

    pub(crate) fn telemetry(id: &str, seq: u64, uptime_ms: u64) -> Telemetry {
        Telemetry {
            cpu_load: 0.25,
            ..starling_proto::fixtures::telemetry(id, seq, uptime_ms)
        }
    }

    pub(crate) fn status(id: &str, state: NodeState) -> Status {
        Status {
            v: PROTOCOL_VERSION,
            node_id: NodeId::new(id).unwrap(),
            state,
        }
    }

    #[test]
    fn reports_for_unknown_nodes_change_nothing() {
        let mut registry = Registry::new();
        let id = NodeId::new("ghost").unwrap();
        assert_eq!(
            registry.apply_telemetry(&id, telemetry("ghost", 1, 10), 5),
            Err(RegistryError::UnknownNode(id.to_string()))
        );
        assert_eq!(
            registry.apply_status(&id, status("ghost", NodeState::Online), 5),
            Ok(RegistryChange::AwaitingCapability(id.clone()))
        );
        assert!(registry.is_empty());
        assert_eq!(registry.nodes().count(), 0);
    }

    #[test]
    fn a_status_before_the_capability_is_applied_when_it_arrives() {
        let mut registry = Registry::new();
        let id = NodeId::new("early").unwrap();
        registry
            .apply_status(&id, status("early", NodeState::Online), 1)
            .unwrap();
        assert_eq!(
            registry.apply_capability(&id, capability("early"), 2),
            Ok(RegistryChange::NodeOnline(id.clone()))
        );
        assert!(registry.get(&id).unwrap().online());
    }

    #[test]
    fn held_statuses_are_bounded() {
        let mut registry = Registry::new();
        for n in 0..MAX_HELD_STATUSES {
            let name = format!("n{n}");
            let id = NodeId::new(&name).unwrap();
            registry
                .apply_status(&id, status(&name, NodeState::Online), 1)
                .unwrap();
        }
        let id = NodeId::new("one-too-many").unwrap();
        assert_eq!(
            registry.apply_status(&id, status("one-too-many", NodeState::Online), 1),
            Err(RegistryError::UnknownNode("one-too-many".into()))
        );
        assert!(registry.is_empty());
    }

    #[test]
    fn topic_and_payload_must_name_the_same_node() {
        let mut registry = Registry::new();
        let topic_node = NodeId::new("a").unwrap();
        let result = registry.apply_capability(&topic_node, capability("b"), 1);
        assert!(matches!(result, Err(RegistryError::NodeMismatch { .. })));
        assert!(registry.is_empty());
    }

    #[test]
    fn node_lifecycle_and_stale_telemetry() {
        let mut registry = Registry::new();
        let id = NodeId::new("pi-1").unwrap();
        registry
            .apply_capability(&id, capability("pi-1"), 1)
            .unwrap();
        assert!(!registry.get(&id).unwrap().online());
        assert_eq!(
            registry.apply_status(&id, status("pi-1", NodeState::Online), 2),
            Ok(RegistryChange::NodeOnline(id.clone()))
        );
        assert_eq!(
            registry.apply_status(&id, status("pi-1", NodeState::Online), 3),
            Ok(RegistryChange::Unchanged(id.clone()))
        );
        assert_eq!(
            registry.apply_telemetry(&id, telemetry("pi-1", 5, 5000), 4),
            Ok(RegistryChange::TelemetryUpdated(id.clone()))
        );
        assert_eq!(
            registry.apply_telemetry(&id, telemetry("pi-1", 4, 6000), 5),
            Ok(RegistryChange::StaleTelemetry(id.clone()))
        );
        // A restarted agent (smaller uptime) starts again from sequence 1.
        assert_eq!(
            registry.apply_telemetry(&id, telemetry("pi-1", 1, 100), 6),
            Ok(RegistryChange::TelemetryUpdated(id.clone()))
        );
        assert_eq!(
            registry.apply_status(&id, status("pi-1", NodeState::Offline), 7),
            Ok(RegistryChange::NodeOffline(id.clone()))
        );
        assert!(!registry.get(&id).unwrap().online());
        assert_eq!(registry.get(&id).unwrap().last_seen_ms, 7);
    }

    #[test]
    fn a_silent_node_is_suspected_once_and_telemetry_brings_it_back() {
        let mut registry = Registry::new();
        let id = NodeId::new("quiet").unwrap();
        registry
            .apply_capability(&id, capability("quiet"), 1)
            .unwrap();
        registry
            .apply_status(&id, status("quiet", NodeState::Online), 1)
            .unwrap();
        assert_eq!(
            registry.suspect_silent(&silence(4_999, 5_000, 0)),
            Vec::<NodeId>::new()
        );
        // Not while the observer itself has only just been listening.
        assert_eq!(
            registry.suspect_silent(&silence(5_001, 5_000, 3_000)),
            Vec::<NodeId>::new()
        );
        assert_eq!(
            registry.suspect_silent(&silence(5_001, 5_000, 0)),
            vec![id.clone()]
        );
        assert!(!registry.get(&id).unwrap().online());
        assert_eq!(registry.get(&id).unwrap().last_seen_ms, 1);
        assert_eq!(
            registry.suspect_silent(&silence(9_000, 5_000, 0)),
            Vec::<NodeId>::new()
        );
        assert_eq!(
            registry.apply_telemetry(&id, telemetry("quiet", 2, 9_000), 9_000),
            Ok(RegistryChange::NodeOnline(id.clone()))
        );
        assert!(registry.get(&id).unwrap().online());
        // A last will is not undone by telemetry: the agent says so itself.
        registry
            .apply_status(&id, status("quiet", NodeState::Offline), 9_100)
            .unwrap();
        assert_eq!(
            registry.apply_telemetry(&id, telemetry("quiet", 3, 10_000), 9_200),
            Ok(RegistryChange::TelemetryUpdated(id.clone()))
        );
        assert!(!registry.get(&id).unwrap().online());
    }

    fn online_node(registry: &mut Registry, name: &str) -> NodeId {
        let id = NodeId::new(name).unwrap();
        registry.apply_capability(&id, capability(name), 0).unwrap();
        registry
            .apply_status(&id, status(name, NodeState::Online), 0)
            .unwrap();
        id
    }

    #[test]
    fn one_forged_sample_cannot_lock_a_node_out() {
        // Finding 3: `uptime_ms: 0, seq: u64::MAX` once made every real
        // sample look stale, so the node fell silent and stayed offline.
        let mut registry = Registry::new();
        let id = online_node(&mut registry, "victim");
        registry
            .apply_telemetry(&id, telemetry("victim", 10, 10_000), 1_000)
            .unwrap();
        assert_eq!(
            registry.apply_telemetry(&id, telemetry("victim", u64::MAX, 0), 1_100),
            Ok(RegistryChange::TelemetryUpdated(id.clone()))
        );
        // The real agent goes on with seq 11, 12, ... every 500 ms.
        let mut shown_real_at = None;
        for step in 1..=20u64 {
            let now = 1_100 + step * 500;
            let change = registry
                .apply_telemetry(
                    &id,
                    telemetry("victim", 10 + step, 10_000 + step * 500),
                    now,
                )
                .unwrap();
            let entry = registry.get(&id).unwrap();
            assert_eq!(entry.last_seen_ms, now, "every sample is proof of life");
            if change == RegistryChange::TelemetryUpdated(id.clone()) && shown_real_at.is_none() {
                shown_real_at = Some(now);
            }
        }
        let shown_real_at = shown_real_at.expect("real telemetry is shown again");
        assert!(
            shown_real_at - 1_100 <= REORDER_WINDOW_MS + 500,
            "held off for at most the reorder window: {shown_real_at}"
        );
        assert_eq!(
            registry.get(&id).unwrap().telemetry.as_ref().unwrap().seq,
            30
        );
        // Never suspected: silence is measured on our clock.
        assert!(registry
            .suspect_silent(&silence(11_100 + 4_999, 5_000, 0))
            .is_empty());
        assert!(registry.get(&id).unwrap().online());
    }

    #[test]
    fn liveness_goes_by_the_receive_clock_whatever_the_numbers() {
        let mut registry = Registry::new();
        let id = online_node(&mut registry, "n");
        registry
            .apply_telemetry(&id, telemetry("n", 5, 5_000), 1_000)
            .unwrap();
        // A reordered copy (lower seq, within the window) keeps the figures
        // but still counts as heard from.
        assert_eq!(
            registry.apply_telemetry(&id, telemetry("n", 4, 4_500), 1_200),
            Ok(RegistryChange::StaleTelemetry(id.clone()))
        );
        let entry = registry.get(&id).unwrap();
        assert_eq!(entry.telemetry.as_ref().unwrap().seq, 5);
        assert_eq!(entry.last_seen_ms, 1_200);
        assert_eq!(entry.telemetry_received_ms, Some(1_000));
        // A silent node comes back on any sample, even one whose figures are dropped.
        assert_eq!(
            registry.suspect_silent(&silence(7_000, 5_000, 0)),
            vec![id.clone()]
        );
        assert_eq!(
            registry.apply_telemetry(&id, telemetry("n", 1, 9_000), 7_000),
            Ok(RegistryChange::NodeOnline(id.clone()))
        );
    }

    #[test]
    fn a_new_session_resets_the_ordering() {
        let mut registry = Registry::new();
        let id = online_node(&mut registry, "r");
        registry
            .apply_telemetry(&id, telemetry("r", u64::MAX, 0), 1_000)
            .unwrap();
        // The restarted agent announces itself online; its first sample
        // (seq 1, small uptime above the forged 0) is shown at once.
        registry
            .apply_status(&id, status("r", NodeState::Online), 1_100)
            .unwrap();
        assert_eq!(
            registry.apply_telemetry(&id, telemetry("r", 1, 300), 1_200),
            Ok(RegistryChange::TelemetryUpdated(id.clone()))
        );
        // Then ordering holds again within the new session.
        assert_eq!(
            registry.apply_telemetry(&id, telemetry("r", 1, 300), 1_300),
            Ok(RegistryChange::StaleTelemetry(id.clone()))
        );
        // Uptime going down is a new session too.
        registry
            .apply_telemetry(&id, telemetry("r", 9, 9_000), 1_400)
            .unwrap();
        assert_eq!(
            registry.apply_telemetry(&id, telemetry("r", 2, 100), 1_500),
            Ok(RegistryChange::TelemetryUpdated(id.clone()))
        );
    }

    #[test]
    fn a_finished_attempt_teaches_its_node_once_and_only_if_expected() {
        let mut registry = Registry::new();
        let node = NodeId::new("pi-1").unwrap();
        registry
            .apply_capability(&node, capability("pi-1"), 1)
            .unwrap();
        let run = |task: &str| ExpectedRun {
            task_id: task.to_owned(),
            attempt: 1,
            modelled_s: 1.0,
            predicted_s: 1.0,
            class: TaskClass::Cpu,
            artifact: 7,
        };
        registry.expect_run(&node, run("t1"));
        registry.expect_run(&node, run("t2"));
        // Not expected (another attempt): nothing learned.
        assert_eq!(registry.finish_run(&node, "t1", 2, Some(4.0)), None);
        let sample = registry.finish_run(&node, "t1", 1, Some(4.0)).unwrap();
        assert_eq!(sample.observed_s, 4.0);
        // Once: the expectation is gone.
        assert_eq!(registry.finish_run(&node, "t1", 1, Some(4.0)), None);
        // A failed attempt (no measurement) forgets its expectation, teaches nothing.
        assert_eq!(registry.finish_run(&node, "t2", 1, None), None);
        let entry = registry.get(&node).unwrap();
        assert!(entry.expected.is_empty());
        assert_eq!(entry.corrections.by_class[0].samples, 1);
        assert!(
            (entry.corrections.by_class[0].factor() - 2.0).abs() < 1e-9,
            "one sample moves it ×2 at most"
        );
        // Other processors: what was learned goes.
        let mut faster = capability("pi-1");
        faster.cpu.max_mhz *= 2;
        registry.apply_capability(&node, faster, 2).unwrap();
        assert_eq!(
            registry.get(&node).unwrap().corrections,
            NodeCorrections::default()
        );
    }

    #[test]
    fn a_node_awaits_a_bounded_number_of_runs() {
        let mut registry = Registry::new();
        let node = NodeId::new("pi-1").unwrap();
        registry
            .apply_capability(&node, capability("pi-1"), 1)
            .unwrap();
        for attempt in 0..(MAX_EXPECTED_RUNS as u32 + 10) {
            registry.expect_run(
                &node,
                ExpectedRun {
                    task_id: "t".to_owned(),
                    attempt,
                    modelled_s: 1.0,
                    predicted_s: 1.0,
                    class: TaskClass::Cpu,
                    artifact: 0,
                },
            );
        }
        let entry = registry.get(&node).unwrap();
        assert_eq!(entry.expected.len(), MAX_EXPECTED_RUNS);
        assert_eq!(entry.expected.front().unwrap().attempt, 10);
    }
}
