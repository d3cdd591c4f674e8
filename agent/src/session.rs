//! The agent's side of the protocol, without I/O: decides what to journal,
//! publish and start in response to inbound messages and task progress. The
//! I/O loop in [`crate::agent`] feeds it (with the time, so it never reads a
//! clock) and carries out its actions in order.
//!
//! It keeps every attempt the journal remembers with the last event
//! published for it, so a redelivered assignment re-publishes that event
//! instead of running the task again, and a cancel finds the attempt's flag.
//! A new assignment is checked first ([`AssignmentVerifier`]); a refused one
//! is answered with a `rejected` event and leaves no trace, so a forged copy
//! cannot shadow the real assignment of the same attempt.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use rumqttc::QoS;
use starling_proto::{
    Assignment, Cancel, Capability, Channel, DecodeError, EncodeError, EventAck, FailureReason,
    NodeId, NodeState, Runtime, Status, TaskEvent, TaskId, TaskState, Topics, PROTOCOL_VERSION,
};

pub use crate::journal::AttemptKey;
use crate::journal::JournaledAttempt;
use crate::verify::AssignmentVerifier;

/// An MQTT publish the session wants sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outgoing {
    /// Topic.
    pub topic: String,
    /// Encoded message.
    pub payload: Vec<u8>,
    /// Delivery guarantee.
    pub qos: QoS,
    /// Whether the broker keeps it for later subscribers.
    pub retain: bool,
}

/// What the I/O loop must do, in the order given.
#[derive(Debug, Clone)]
pub enum Action {
    /// Publish a message as it is, without journaling: the last event of an
    /// attempt again, or a refusal that must leave no trace.
    Publish(Outgoing),
    /// A new event: journal it (the outbox), then publish it.
    Emit(TaskEvent),
    /// A verified new assignment: journal it with its `accepted` event in one
    /// transaction, then publish the event and start the attempt. If the
    /// journal refuses (full), call [`Session::refuse`] instead.
    Accept {
        /// The assignment.
        assignment: Box<Assignment>,
        /// Its `accepted` event.
        accepted: TaskEvent,
        /// The attempt's cancel flag.
        cancel: Arc<AtomicBool>,
    },
    /// Run an attempt that is journaled already (one a restart interrupted).
    Start {
        /// The assignment.
        assignment: Box<Assignment>,
        /// The attempt's cancel flag.
        cancel: Arc<AtomicBool>,
    },
    /// The coordinator recorded an event: drop it from the outbox.
    Acked(EventAck),
}

/// Why an inbound message was dropped.
#[derive(Debug, thiserror::Error)]
pub enum InboundError {
    /// The payload is not a valid message for its topic.
    #[error("dropped a malformed message on {topic}: {source}")]
    Decode {
        /// The topic it came on.
        topic: String,
        /// Why it did not decode.
        source: DecodeError,
    },
    /// The topic is not one the agent subscribes to.
    #[error("dropped a message on unexpected topic {topic}")]
    UnexpectedTopic {
        /// The topic.
        topic: String,
    },
    /// A reply could not be encoded.
    #[error(transparent)]
    Encode(#[from] EncodeError),
}

struct AttemptRecord {
    last_event: TaskEvent,
    cancel: Arc<AtomicBool>,
}

/// The protocol state of one agent.
pub struct Session {
    node_id: NodeId,
    topics: Topics,
    assign_topic: String,
    cancel_topic: String,
    ack_topic: String,
    verifier: AssignmentVerifier,
    /// Mirrors the journal's `attempts`: the journal decides what is pruned
    /// and the I/O loop passes that on ([`Session::forget`]).
    attempts: HashMap<AttemptKey, AttemptRecord>,
    /// The runtimes this agent runs (those it advertises).
    runtimes: Vec<Runtime>,
    /// With a fresh journal: when this agent started (Unix ms, its own
    /// clock). An assignment issued before then is refused, since nothing
    /// remembers whether it already ran.
    issued_floor_ms: Option<u64>,
    /// The highest leader term among the authentic assignments seen (and
    /// those the journal remembers): one from a lower term was sent by a
    /// coordinator replica that has since been deposed, and is refused.
    newest_epoch: u64,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("node_id", &self.node_id)
            .field("attempts", &self.attempts.len())
            .finish_non_exhaustive()
    }
}

impl Session {
    /// A session for `node_id` under `topics`, checking assignments with `verifier`.
    pub fn new(node_id: NodeId, topics: Topics, verifier: AssignmentVerifier) -> Self {
        let assign_topic = topics.node(&node_id, Channel::Assign);
        let cancel_topic = topics.node(&node_id, Channel::Cancel);
        let ack_topic = topics.node(&node_id, Channel::Ack);
        Self {
            node_id,
            topics,
            assign_topic,
            cancel_topic,
            ack_topic,
            verifier,
            attempts: HashMap::new(),
            runtimes: vec![Runtime::Wasm],
            issued_floor_ms: None,
            newest_epoch: 0,
        }
    }

    /// Refuses every assignment issued (`issued_unix_ms`) before
    /// `agent_started_ms`, the agent's start by its own clock. Called when the
    /// journal is fresh ([`crate::journal::Journal::is_fresh`]): an agent that
    /// lost its journal does not remember what it ran, so a genuine
    /// assignment replayed inside its validity window would run again. A
    /// genuine one sent after the start is unaffected, and one sent just
    /// before (or within the clock difference of the coordinator running
    /// behind ours) is answered `rejected`, which the coordinator's outbox
    /// answers with a newly signed copy issued later.
    pub fn refuse_issued_before(&mut self, agent_started_ms: u64) {
        self.issued_floor_ms = Some(agent_started_ms);
    }

    /// Sets the runtimes the agent runs, as its capability advertises them
    /// (wasm only until then); an assignment for another fails at once.
    pub fn set_runtimes(&mut self, runtimes: &[Runtime]) {
        self.runtimes = runtimes.to_vec();
    }

    /// Restores the attempts the journal remembers from an earlier run, at
    /// `now_ms`. Finished ones are remembered. Unfinished ones were cut short
    /// by a crash, a kill or a power cut: each runs again from its journaled
    /// assignment ([`Action::Start`]) unless the task's deadline has passed
    /// (then it is reported `failed/timeout`).
    pub fn restore(&mut self, attempts: Vec<JournaledAttempt>, now_ms: u64) -> Vec<Action> {
        let mut actions = Vec::new();
        for JournaledAttempt {
            assignment,
            last_event,
        } in attempts
        {
            if let Some(epoch) = assignment.as_ref().and_then(|a| a.leader_epoch) {
                self.newest_epoch = self.newest_epoch.max(epoch);
            }
            let key = (last_event.task_id.clone(), last_event.attempt);
            let cancel = Arc::new(AtomicBool::new(false));
            let terminal = last_event.state.is_terminal();
            self.attempts.insert(
                key.clone(),
                AttemptRecord {
                    last_event,
                    cancel: Arc::clone(&cancel),
                },
            );
            if terminal {
                continue;
            }
            let failed = |reason, message: &str| {
                TaskEvent::failed(key.0.clone(), key.1, self.node_id.clone(), reason, message)
            };
            let event = match assignment {
                Some(assignment)
                    if assignment
                        .deadline_unix_ms
                        .is_some_and(|deadline| deadline <= now_ms) =>
                {
                    failed(
                        FailureReason::Timeout,
                        "the task's deadline passed while a restart interrupted this attempt",
                    )
                }
                Some(assignment) => {
                    tracing::info!(task = %key.0, attempt = key.1,
                        "resuming attempt {}/{} that a restart interrupted: running it again from the journal",
                        key.0, key.1);
                    actions.push(Action::Start {
                        assignment: Box::new(assignment),
                        cancel,
                    });
                    continue;
                }
                None => failed(
                    FailureReason::AgentBusy,
                    "the agent restarted while this attempt was in progress and kept no assignment to run it again",
                ),
            };
            actions.push(self.record_event(event));
        }
        actions
    }

    /// Forgets attempts the journal pruned.
    pub fn forget(&mut self, keys: &[AttemptKey]) {
        for key in keys {
            self.attempts.remove(key);
        }
    }

    /// The node id.
    pub fn node_id(&self) -> &NodeId {
        &self.node_id
    }

    /// The topic of one of this node's channels.
    pub fn topic(&self, channel: Channel) -> String {
        self.topics.node(&self.node_id, channel)
    }

    /// What to subscribe to, at QoS 1, after every CONNACK: a clean session
    /// (a broker restarted without persistence) forgets subscriptions
    /// without a word, and renewing one that exists costs nothing.
    pub fn subscriptions(&self) -> [(String, QoS); 3] {
        [
            (self.assign_topic.clone(), QoS::AtLeastOnce),
            (self.cancel_topic.clone(), QoS::AtLeastOnce),
            (self.ack_topic.clone(), QoS::AtLeastOnce),
        ]
    }

    /// The retained status message for `state` (also the last will, for offline).
    pub fn status(&self, state: NodeState) -> Result<Outgoing, EncodeError> {
        let status = Status {
            v: PROTOCOL_VERSION,
            node_id: self.node_id.clone(),
            state,
        };
        Ok(Outgoing {
            topic: self.topic(Channel::Status),
            payload: starling_proto::encode(&status)?,
            qos: QoS::AtLeastOnce,
            retain: true,
        })
    }

    /// The retained capability message.
    pub fn capability(&self, capability: &Capability) -> Result<Outgoing, EncodeError> {
        Ok(Outgoing {
            topic: self.topic(Channel::Capability),
            payload: starling_proto::encode(capability)?,
            qos: QoS::AtLeastOnce,
            retain: true,
        })
    }

    /// A telemetry message (QoS 0: a lost sample is replaced by the next).
    pub fn telemetry(
        &self,
        telemetry: &starling_proto::Telemetry,
    ) -> Result<Outgoing, EncodeError> {
        Ok(Outgoing {
            topic: self.topic(Channel::Telemetry),
            payload: starling_proto::encode(telemetry)?,
            qos: QoS::AtMostOnce,
            retain: false,
        })
    }

    /// Handles a publish that arrived on a subscribed topic at `now_ms` (Unix ms).
    pub fn on_publish(
        &mut self,
        topic: &str,
        payload: &[u8],
        now_ms: u64,
    ) -> Result<Vec<Action>, InboundError> {
        let decode_error = |source| InboundError::Decode {
            topic: topic.to_owned(),
            source,
        };
        if topic == self.assign_topic {
            let assignment: Assignment = starling_proto::decode(payload).map_err(decode_error)?;
            self.on_assignment(assignment, now_ms)
        } else if topic == self.cancel_topic {
            let cancel: Cancel = starling_proto::decode(payload).map_err(decode_error)?;
            self.on_cancel(cancel)
        } else if topic == self.ack_topic {
            let ack: EventAck = starling_proto::decode(payload).map_err(decode_error)?;
            Ok(vec![Action::Acked(ack)])
        } else {
            Err(InboundError::UnexpectedTopic {
                topic: topic.to_owned(),
            })
        }
    }

    fn on_assignment(
        &mut self,
        assignment: Assignment,
        now_ms: u64,
    ) -> Result<Vec<Action>, InboundError> {
        let key = (assignment.task_id.clone(), assignment.attempt);
        if let Some(record) = self.attempts.get(&key) {
            // Not a replay: the broker or the coordinator's outbox delivered
            // it again because our events have not been acknowledged yet.
            tracing::info!(task = %key.0, attempt = key.1, state = ?record.last_event.state,
                "assignment redelivered; re-publishing the attempt's last event instead of running it again");
            let event = record.last_event.clone();
            return Ok(vec![Action::Publish(self.event_message(&event)?)]);
        }
        if let Err(refusal) = self.verifier.check(&assignment, now_ms) {
            if refusal.is_policy() {
                tracing::warn!(task = %key.0, attempt = key.1, %refusal, "assignment refused by this node's policy");
                let event = TaskEvent::failed(
                    key.0,
                    key.1,
                    self.node_id.clone(),
                    FailureReason::PolicyRefused,
                    &format!("refused: {refusal}"),
                );
                return Ok(vec![self.record_event(event)]);
            }
            tracing::warn!(task = %key.0, attempt = key.1, %refusal, "assignment refused");
            let mut event =
                TaskEvent::state(key.0, key.1, self.node_id.clone(), TaskState::Rejected);
            event.message = Some(starling_proto::task::truncate(&format!(
                "refused: {refusal}"
            )));
            return Ok(vec![Action::Publish(self.event_message(&event)?)]);
        }
        if let Some(epoch) = assignment.leader_epoch {
            if epoch < self.newest_epoch {
                tracing::warn!(task = %key.0, attempt = key.1, epoch, newest = self.newest_epoch,
                    "assignment from a deposed coordinator leader refused");
                let mut event =
                    TaskEvent::state(key.0, key.1, self.node_id.clone(), TaskState::Rejected);
                event.message = Some(starling_proto::task::truncate(&format!(
                    "refused: sent by a deposed coordinator leader (term {epoch}; this node has \
                     seen term {})",
                    self.newest_epoch
                )));
                return Ok(vec![Action::Publish(self.event_message(&event)?)]);
            }
            self.newest_epoch = epoch;
        }
        if let Some(floor) = self
            .issued_floor_ms
            .filter(|floor| assignment.issued_unix_ms < *floor)
        {
            tracing::warn!(task = %key.0, attempt = key.1, issued = assignment.issued_unix_ms,
                started = floor, "assignment issued before this agent started with a new journal; refused as a possible replay");
            let mut event =
                TaskEvent::state(key.0, key.1, self.node_id.clone(), TaskState::Rejected);
            event.message = Some(starling_proto::task::truncate(&format!(
                "refused: issued at {} ms, before this agent started at {floor} ms with a new \
                 journal; a replay cannot be told from work that already ran",
                assignment.issued_unix_ms
            )));
            return Ok(vec![Action::Publish(self.event_message(&event)?)]);
        }
        if !self.runtimes.contains(&assignment.runtime) {
            let offered: Vec<&str> = self.runtimes.iter().map(|r| r.as_str()).collect();
            let event = TaskEvent::failed(
                assignment.task_id.clone(),
                assignment.attempt,
                self.node_id.clone(),
                FailureReason::UnsupportedRuntime,
                &format!(
                    "this agent does not run {} tasks (it runs: {}); an OpenCL task needs a node \
                     where the OpenCL worker found a device",
                    assignment.runtime.as_str(),
                    offered.join(", ")
                ),
            );
            return Ok(vec![self.record_event(event)]);
        }
        let cancel = Arc::new(AtomicBool::new(false));
        let accepted = TaskEvent::state(
            assignment.task_id.clone(),
            assignment.attempt,
            self.node_id.clone(),
            TaskState::Accepted,
        );
        self.attempts.insert(
            key,
            AttemptRecord {
                last_event: accepted.clone(),
                cancel: Arc::clone(&cancel),
            },
        );
        Ok(vec![Action::Accept {
            assignment: Box::new(assignment),
            accepted,
            cancel,
        }])
    }

    /// The journal could not take a new attempt (full, or failing): the
    /// attempt is forgotten and this `failed/agent_busy` event is to be
    /// published without journaling, so the coordinator places the task
    /// elsewhere.
    pub fn refuse(&mut self, task_id: &TaskId, attempt: u32, why: &str) -> TaskEvent {
        self.attempts.remove(&(task_id.clone(), attempt));
        TaskEvent::failed(
            task_id.clone(),
            attempt,
            self.node_id.clone(),
            FailureReason::AgentBusy,
            &format!("refused: {why}"),
        )
    }

    fn on_cancel(&mut self, cancel: Cancel) -> Result<Vec<Action>, InboundError> {
        let key = (cancel.task_id.clone(), cancel.attempt);
        match self.attempts.get(&key) {
            Some(record) if record.last_event.state.is_terminal() => {
                let event = record.last_event.clone();
                Ok(vec![Action::Publish(self.event_message(&event)?)])
            }
            Some(record) => {
                // The runner notices the flag and reports `cancelled` itself,
                // so the event follows whatever it was doing.
                record.cancel.store(true, Ordering::SeqCst);
                Ok(Vec::new())
            }
            None => {
                // Remember the cancel so a late assignment for this attempt is
                // answered with `cancelled` instead of being run.
                let event = TaskEvent::state(
                    cancel.task_id,
                    cancel.attempt,
                    self.node_id.clone(),
                    TaskState::Cancelled,
                );
                Ok(vec![self.record_event(event)])
            }
        }
    }

    /// Records progress reported by a runner: [`Action::Emit`] for a new
    /// event, or [`Action::Publish`] of the last event when the attempt had
    /// already finished (a late `running` never regresses it).
    pub fn on_task_event(&mut self, event: TaskEvent) -> Action {
        match self.event_message(&event) {
            Ok(_) => self.record_event(event),
            Err(error) => {
                // An event that cannot be encoded (it should not happen: output
                // is bounded by the inline limit) becomes an internal failure,
                // so the coordinator still learns the attempt ended.
                let failed = TaskEvent::failed(
                    event.task_id,
                    event.attempt,
                    self.node_id.clone(),
                    FailureReason::Internal,
                    &format!("the agent could not encode the task's result: {error}"),
                );
                self.record_event(failed)
            }
        }
    }

    /// Whether an attempt is remembered.
    pub fn knows(&self, task_id: &TaskId, attempt: u32) -> bool {
        self.attempts.contains_key(&(task_id.clone(), attempt))
    }

    /// Lists the attempts held unfinished (accepted, waiting or running) in
    /// `telemetry`, so the coordinator can reconcile them with its own view;
    /// `attempts_complete` says whether all of them fit.
    pub fn list_attempts(&self, telemetry: &mut starling_proto::Telemetry) {
        let mut unfinished: Vec<&AttemptKey> = self
            .attempts
            .iter()
            .filter(|(_, record)| !record.last_event.state.is_terminal())
            .map(|(key, _)| key)
            .collect();
        unfinished.sort();
        telemetry.attempts.clear();
        telemetry.attempts_complete = true;
        for (task_id, attempt) in unfinished {
            let listed = starling_proto::AttemptRef {
                task_id: task_id.clone(),
                attempt: *attempt,
            };
            if telemetry.attempts.push(listed).is_err() {
                telemetry.attempts_complete = false;
                break;
            }
        }
    }

    /// How many attempts are remembered.
    pub fn remembered(&self) -> usize {
        self.attempts.len()
    }

    /// Sets the cancel flag of every unfinished attempt (used at shutdown).
    pub fn cancel_all(&self) {
        for record in self.attempts.values() {
            if !record.last_event.state.is_terminal() {
                record.cancel.store(true, Ordering::SeqCst);
            }
        }
    }

    fn record_event(&mut self, event: TaskEvent) -> Action {
        let key = (event.task_id.clone(), event.attempt);
        match self.attempts.get_mut(&key) {
            Some(record) if record.last_event.state.is_terminal() => {
                // Never regress a finished attempt (a late `running`, say).
                let last = record.last_event.clone();
                return match self.event_message(&last) {
                    Ok(message) => Action::Publish(message),
                    Err(_) => Action::Emit(last),
                };
            }
            Some(record) => record.last_event = event.clone(),
            None => {
                self.attempts.insert(
                    key,
                    AttemptRecord {
                        last_event: event.clone(),
                        cancel: Arc::new(AtomicBool::new(false)),
                    },
                );
            }
        }
        Action::Emit(event)
    }

    /// The MQTT message carrying a task event.
    pub fn event_message(&self, event: &TaskEvent) -> Result<Outgoing, EncodeError> {
        Ok(Outgoing {
            topic: self.topic(Channel::Events),
            payload: starling_proto::encode(event)?,
            qos: QoS::AtLeastOnce,
            retain: false,
        })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use ed25519_dalek::{Signer, SigningKey};
    use starling_proto::{Digest, ExecLimits, Grants};

    const NOW: u64 = 1_700_000_000_000;

    fn key() -> SigningKey {
        SigningKey::from_bytes(&[7; 32])
    }

    fn session() -> Session {
        let node = NodeId::new("n1").unwrap();
        let verifier = AssignmentVerifier::new(node.clone(), Some(key().verifying_key()));
        Session::new(node, Topics::default(), verifier)
    }

    fn assignment(task: &str, attempt: u32) -> Assignment {
        let mut a = Assignment {
            v: PROTOCOL_VERSION,
            node_id: NodeId::new("n1").unwrap(),
            task_id: TaskId::new(task).unwrap(),
            attempt,
            runtime: Runtime::Wasm,
            artifact: Digest([1; 32]),
            artifact_url: heapless::String::try_from("http://127.0.0.1:1/a").unwrap(),
            args: heapless::Vec::new(),
            input: b"in".to_vec(),
            limits: ExecLimits::default(),
            power_level: 0,
            deadline_unix_ms: None,
            grants: Grants::default(),
            publisher: None,
            precompiled: None,
            leader_epoch: None,
            issued_unix_ms: NOW,
            expires_unix_ms: NOW + 60_000,
            signature: Vec::new(),
        };
        sign(&mut a);
        a
    }

    fn sign(a: &mut Assignment) {
        a.signature = key().sign(&a.signed_bytes().unwrap()).to_bytes().to_vec();
    }

    fn encoded(a: &Assignment) -> Vec<u8> {
        starling_proto::encode(a).unwrap()
    }

    fn published_event(action: &Action) -> TaskEvent {
        match action {
            Action::Publish(out) => {
                assert_eq!(out.topic, "starling/v1/nodes/n1/events");
                assert_eq!(out.qos, QoS::AtLeastOnce);
                starling_proto::decode(&out.payload).unwrap()
            }
            other => panic!("expected a publish, got {other:?}"),
        }
    }

    fn emitted_event(action: &Action) -> TaskEvent {
        match action {
            Action::Emit(event) => event.clone(),
            other => panic!("expected an emit, got {other:?}"),
        }
    }

    #[test]
    fn new_assignment_is_accepted_and_started_once() {
        let mut s = session();
        let topic = s.subscriptions()[0].0.clone();
        let payload = encoded(&assignment("t1", 1));
        let actions = s.on_publish(&topic, &payload, NOW).unwrap();
        assert_eq!(actions.len(), 1);
        assert!(
            matches!(&actions[0], Action::Accept { assignment, accepted, .. }
            if assignment.attempt == 1 && accepted.state == TaskState::Accepted)
        );

        let done = TaskEvent::state(
            TaskId::new("t1").unwrap(),
            1,
            s.node_id().clone(),
            TaskState::Succeeded,
        );
        assert_eq!(
            emitted_event(&s.on_task_event(done)).state,
            TaskState::Succeeded
        );

        // Redelivery: the last event again, no start.
        let again = s.on_publish(&topic, &payload, NOW).unwrap();
        assert_eq!(again.len(), 1);
        assert_eq!(published_event(&again[0]).state, TaskState::Succeeded);

        // Another attempt of the same task is new work.
        let retry = encoded(&assignment("t1", 2));
        assert!(matches!(
            s.on_publish(&topic, &retry, NOW).unwrap()[0],
            Action::Accept { .. }
        ));
    }

    #[test]
    fn refused_assignments_are_rejected_and_leave_no_trace() {
        let mut s = session();
        let topic = s.subscriptions()[0].0.clone();
        let mut forged = assignment("t", 1);
        forged.input = b"something else".to_vec();
        let mut elsewhere = assignment("t", 1);
        elsewhere.node_id = NodeId::new("n2").unwrap();
        sign(&mut elsewhere);
        for (bad, check) in [(forged, "bad signature"), (elsewhere, "wrong node")] {
            let actions = s.on_publish(&topic, &encoded(&bad), NOW).unwrap();
            let event = published_event(&actions[0]);
            assert_eq!(event.state, TaskState::Rejected);
            let message = event.message.unwrap();
            assert!(message.contains(check), "{message}");
        }
        // The real assignment of the same attempt still runs.
        let actions = s
            .on_publish(&topic, &encoded(&assignment("t", 1)), NOW)
            .unwrap();
        assert!(matches!(actions[0], Action::Accept { .. }));
    }

    #[test]
    fn a_full_journal_refusal_forgets_the_attempt() {
        let mut s = session();
        let topic = s.subscriptions()[0].0.clone();
        s.on_publish(&topic, &encoded(&assignment("busy", 1)), NOW)
            .unwrap();
        let event = s.refuse(&TaskId::new("busy").unwrap(), 1, "the journal is full");
        assert_eq!(event.reason, Some(FailureReason::AgentBusy));
        assert!(!s.knows(&TaskId::new("busy").unwrap(), 1));
    }

    #[test]
    fn malformed_payloads_are_typed_errors_and_change_nothing() {
        let mut s = session();
        let [(assign, _), (cancel, _), (ack, _)] = s.subscriptions();
        for garbage in [&b""[..], b"\xff\xff", b"not cbor", &[0x9f; 64]] {
            for topic in [&assign, &cancel, &ack] {
                let error = s.on_publish(topic, garbage, NOW).unwrap_err();
                assert!(matches!(error, InboundError::Decode { .. }), "{error}");
            }
        }
        // A cancel is not an assignment.
        let wrong = starling_proto::encode(&Cancel {
            v: PROTOCOL_VERSION,
            task_id: TaskId::new("t").unwrap(),
            attempt: 1,
        })
        .unwrap();
        assert!(s.on_publish(&assign, &wrong, NOW).is_err());
        assert!(matches!(
            s.on_publish("elsewhere", b"x", NOW),
            Err(InboundError::UnexpectedTopic { .. })
        ));
        assert_eq!(s.remembered(), 0);
    }

    #[test]
    fn subscriptions_cover_assign_cancel_and_ack() {
        let s = session();
        let topics: Vec<String> = s.subscriptions().into_iter().map(|(t, _)| t).collect();
        assert_eq!(
            topics,
            [
                "starling/v1/nodes/n1/assign",
                "starling/v1/nodes/n1/cancel",
                "starling/v1/nodes/n1/ack"
            ]
        );
    }

    #[test]
    fn receipts_become_acked_actions() {
        let mut s = session();
        let ack = EventAck {
            v: PROTOCOL_VERSION,
            task_id: TaskId::new("t").unwrap(),
            attempt: 3,
            state: TaskState::Succeeded,
        };
        let topic = s.subscriptions()[2].0.clone();
        let actions = s
            .on_publish(&topic, &starling_proto::encode(&ack).unwrap(), NOW)
            .unwrap();
        assert!(matches!(&actions[..], [Action::Acked(a)] if *a == ack));
    }

    #[test]
    fn cancel_sets_the_flag_of_a_running_attempt() {
        let mut s = session();
        let [(assign, _), (cancel_topic, _), _] = s.subscriptions();
        let actions = s
            .on_publish(&assign, &encoded(&assignment("t", 1)), NOW)
            .unwrap();
        let Action::Accept { cancel, .. } = &actions[0] else {
            panic!("no accept")
        };
        let message = starling_proto::encode(&Cancel {
            v: PROTOCOL_VERSION,
            task_id: TaskId::new("t").unwrap(),
            attempt: 1,
        })
        .unwrap();
        assert!(s
            .on_publish(&cancel_topic, &message, NOW)
            .unwrap()
            .is_empty());
        assert!(cancel.load(Ordering::SeqCst));
    }

    #[test]
    fn cancel_before_assignment_prevents_the_run() {
        let mut s = session();
        let [(assign, _), (cancel_topic, _), _] = s.subscriptions();
        let message = starling_proto::encode(&Cancel {
            v: PROTOCOL_VERSION,
            task_id: TaskId::new("t").unwrap(),
            attempt: 1,
        })
        .unwrap();
        let actions = s.on_publish(&cancel_topic, &message, NOW).unwrap();
        assert_eq!(emitted_event(&actions[0]).state, TaskState::Cancelled);
        let actions = s
            .on_publish(&assign, &encoded(&assignment("t", 1)), NOW)
            .unwrap();
        assert_eq!(actions.len(), 1);
        assert_eq!(published_event(&actions[0]).state, TaskState::Cancelled);
    }

    #[test]
    fn finished_attempts_do_not_regress() {
        let mut s = session();
        let task = TaskId::new("t").unwrap();
        let node = s.node_id().clone();
        s.on_task_event(TaskEvent::state(
            task.clone(),
            1,
            node.clone(),
            TaskState::Succeeded,
        ));
        let late = s.on_task_event(TaskEvent::state(task, 1, node, TaskState::Running));
        assert_eq!(published_event(&late).state, TaskState::Succeeded);
    }

    #[test]
    fn restore_remembers_finished_attempts_and_reruns_interrupted_ones() {
        let mut s = session();
        let node = s.node_id().clone();
        let done = JournaledAttempt {
            assignment: None,
            last_event: TaskEvent::state(
                TaskId::new("done").unwrap(),
                1,
                node.clone(),
                TaskState::Succeeded,
            ),
        };
        let cut = JournaledAttempt {
            assignment: Some(assignment("cut", 1)),
            last_event: TaskEvent::state(
                TaskId::new("cut").unwrap(),
                1,
                node.clone(),
                TaskState::Running,
            ),
        };
        let mut late_assignment = assignment("late", 1);
        late_assignment.deadline_unix_ms = Some(NOW - 1);
        let late = JournaledAttempt {
            assignment: Some(late_assignment),
            last_event: TaskEvent::state(
                TaskId::new("late").unwrap(),
                1,
                node,
                TaskState::Accepted,
            ),
        };
        // Restored long after the assignments expired: a restart re-runs
        // what it accepted, whatever the validity window says now.
        let actions = s.restore(vec![done, cut, late], NOW + 3_600_000);
        assert_eq!(actions.len(), 2, "{actions:?}");
        assert!(matches!(&actions[0], Action::Start { assignment, .. }
            if assignment.task_id.as_str() == "cut"));
        let timed_out = emitted_event(&actions[1]);
        assert_eq!(timed_out.task_id.as_str(), "late");
        assert_eq!(timed_out.reason, Some(FailureReason::Timeout));

        // A redelivery after the restart re-publishes instead of running.
        let topic = s.subscriptions()[0].0.clone();
        let again = s
            .on_publish(&topic, &encoded(&assignment("done", 1)), NOW)
            .unwrap();
        assert_eq!(published_event(&again[0]).state, TaskState::Succeeded);
        let again = s
            .on_publish(&topic, &encoded(&assignment("cut", 1)), NOW)
            .unwrap();
        assert_eq!(published_event(&again[0]).state, TaskState::Running);

        // Pruned attempts are forgotten.
        s.forget(&[(TaskId::new("done").unwrap(), 1)]);
        assert!(!s.knows(&TaskId::new("done").unwrap(), 1));
    }

    #[test]
    fn opencl_assignments_fail_as_unsupported_unless_advertised() {
        let mut s = session();
        let mut a = assignment("gpu", 1);
        a.runtime = Runtime::Opencl;
        sign(&mut a);
        let topic = s.subscriptions()[0].0.clone();
        let actions = s.on_publish(&topic, &encoded(&a), NOW).unwrap();
        assert_eq!(actions.len(), 1);
        let event = emitted_event(&actions[0]);
        assert_eq!(event.reason, Some(FailureReason::UnsupportedRuntime));
        assert!(event.message.unwrap().contains("it runs: wasm"));

        // Once the worker found a device, the same kind of assignment starts.
        s.set_runtimes(&[Runtime::Wasm, Runtime::Opencl]);
        let mut a = assignment("gpu", 2);
        a.runtime = Runtime::Opencl;
        sign(&mut a);
        let actions = s.on_publish(&topic, &encoded(&a), NOW).unwrap();
        assert!(matches!(actions[0], Action::Accept { .. }), "{actions:?}");
    }

    #[test]
    fn status_and_capability_are_retained() {
        let s = session();
        let online = s.status(NodeState::Online).unwrap();
        assert!(online.retain);
        assert_eq!(online.topic, "starling/v1/nodes/n1/status");
        let status: Status = starling_proto::decode(&online.payload).unwrap();
        assert_eq!(status.state, NodeState::Online);
    }

    #[test]
    fn an_assignment_from_a_deposed_leader_is_refused() {
        let mut s = session();
        let topic = s.subscriptions()[0].0.clone();
        let from = |task: &str, epoch: Option<u64>| {
            let mut a = assignment(task, 1);
            a.leader_epoch = epoch;
            sign(&mut a);
            a
        };
        let actions = s
            .on_publish(&topic, &encoded(&from("t1", Some(4))), NOW)
            .unwrap();
        assert!(matches!(actions[0], Action::Accept { .. }), "{actions:?}");
        // A newer leader's assignment raises the floor…
        let actions = s
            .on_publish(&topic, &encoded(&from("t2", Some(5))), NOW)
            .unwrap();
        assert!(matches!(actions[0], Action::Accept { .. }), "{actions:?}");
        // …and the deposed leader's, arriving later, is refused and forgotten.
        let actions = s
            .on_publish(&topic, &encoded(&from("t3", Some(4))), NOW)
            .unwrap();
        let event = published_event(&actions[0]);
        assert_eq!(event.state, TaskState::Rejected);
        assert!(event.message.unwrap().contains("deposed"), "names why");
        assert!(!s.knows(&TaskId::new("t3").unwrap(), 1), "leaves no trace");
        // The new leader's copy of the same attempt then runs.
        let actions = s
            .on_publish(&topic, &encoded(&from("t3", Some(5))), NOW)
            .unwrap();
        assert!(matches!(actions[0], Action::Accept { .. }), "{actions:?}");
        // A forged term cannot raise the floor: it fails the signature first.
        let mut forged = from("t4", Some(5));
        forged.leader_epoch = Some(u64::MAX);
        let actions = s.on_publish(&topic, &encoded(&forged), NOW).unwrap();
        assert_eq!(published_event(&actions[0]).state, TaskState::Rejected);
        let actions = s
            .on_publish(&topic, &encoded(&from("t5", Some(5))), NOW)
            .unwrap();
        assert!(matches!(actions[0], Action::Accept { .. }), "{actions:?}");
        // A coordinator without replicas (no term) is unaffected.
        let actions = s
            .on_publish(&topic, &encoded(&from("t6", None)), NOW)
            .unwrap();
        assert!(matches!(actions[0], Action::Accept { .. }), "{actions:?}");
    }

    #[test]
    fn the_journal_remembers_the_newest_leader_term() {
        let mut s = session();
        let mut old = assignment("t1", 1);
        old.leader_epoch = Some(9);
        sign(&mut old);
        let last_event = TaskEvent::state(
            old.task_id.clone(),
            1,
            s.node_id().clone(),
            TaskState::Succeeded,
        );
        s.restore(
            vec![JournaledAttempt {
                assignment: Some(old),
                last_event,
            }],
            NOW,
        );
        let topic = s.subscriptions()[0].0.clone();
        let mut stale = assignment("t2", 1);
        stale.leader_epoch = Some(8);
        sign(&mut stale);
        let actions = s.on_publish(&topic, &encoded(&stale), NOW).unwrap();
        assert_eq!(published_event(&actions[0]).state, TaskState::Rejected);
    }

    #[test]
    fn a_fresh_journal_refuses_assignments_issued_before_the_start() {
        // Finding 9: a node that lost its journal ran a genuine assignment
        // again when it was replayed inside its validity window.
        let started = NOW + 10_000;
        let mut s = session();
        s.refuse_issued_before(started);
        let topic = s.subscriptions()[0].0.clone();
        let replayed = assignment("ran-before", 1);
        assert!(
            replayed.expires_unix_ms > started,
            "still valid: only the new rule refuses it"
        );
        let actions = s.on_publish(&topic, &encoded(&replayed), started).unwrap();
        let event = published_event(&actions[0]);
        assert_eq!(event.state, TaskState::Rejected);
        assert!(event.message.unwrap().contains("before this agent started"));
        assert!(
            !s.knows(&TaskId::new("ran-before").unwrap(), 1),
            "leaves no trace"
        );

        // The coordinator's re-send is signed anew, issued after the start: it runs.
        let mut resent = assignment("ran-before", 1);
        resent.issued_unix_ms = started;
        resent.expires_unix_ms = started + 60_000;
        sign(&mut resent);
        let actions = s
            .on_publish(&topic, &encoded(&resent), started + 1)
            .unwrap();
        assert!(matches!(actions[0], Action::Accept { .. }), "{actions:?}");

        // Without the rule (the journal remembers), the same replay would run.
        let mut remembering = session();
        let actions = remembering
            .on_publish(&topic, &encoded(&replayed), started)
            .unwrap();
        assert!(matches!(actions[0], Action::Accept { .. }), "{actions:?}");
    }

    #[test]
    fn telemetry_lists_unfinished_attempts_and_says_when_it_is_cut() {
        let mut s = session();
        let topic = s.subscriptions()[0].0.clone();
        for n in 0..3 {
            s.on_publish(&topic, &encoded(&assignment(&format!("t{n}"), 1)), NOW)
                .unwrap();
        }
        s.on_task_event(TaskEvent::state(
            TaskId::new("t1").unwrap(),
            1,
            s.node_id().clone(),
            TaskState::Succeeded,
        ));
        let mut telemetry = starling_proto::Telemetry {
            free_memory_bytes: 0,
            ..starling_proto::fixtures::telemetry(s.node_id().as_str(), 1, 1)
        };
        s.list_attempts(&mut telemetry);
        let listed: Vec<(&str, u32)> = telemetry
            .attempts
            .iter()
            .map(|a| (a.task_id.as_str(), a.attempt))
            .collect();
        assert_eq!(
            listed,
            [("t0", 1), ("t2", 1)],
            "finished ones are not listed"
        );
        assert!(telemetry.attempts_complete);

        let limit = starling_proto::limits::MAX_LISTED_ATTEMPTS;
        for n in 0..limit {
            s.on_publish(&topic, &encoded(&assignment(&format!("u{n}"), 1)), NOW)
                .unwrap();
        }
        s.list_attempts(&mut telemetry);
        assert_eq!(telemetry.attempts.len(), limit);
        assert!(!telemetry.attempts_complete, "more held than fit");
    }
}
