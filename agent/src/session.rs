//! The agent's side of the protocol, without I/O: decides what to publish and
//! which attempts to start in response to inbound messages and task progress.
//! The I/O loop in [`crate::agent`] feeds it and carries out its actions.
//!
//! It keeps every attempt it has seen with the last event published for it,
//! so a redelivered assignment re-publishes that event instead of running the
//! task again, and a cancel finds the attempt's flag.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use rumqttc::QoS;
use starling_proto::{
    Assignment, Cancel, Capability, Channel, DecodeError, EncodeError, FailureReason, NodeId,
    NodeState, Runtime, Status, TaskEvent, TaskId, TaskState, Topics, PROTOCOL_VERSION,
};

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

/// What the I/O loop must do.
#[derive(Debug, Clone)]
pub enum Action {
    /// Publish a message.
    Publish(Outgoing),
    /// Run an attempt; `cancel` is set when a cancel arrives for it.
    Start {
        /// The assignment.
        assignment: Box<Assignment>,
        /// The attempt's cancel flag.
        cancel: Arc<AtomicBool>,
    },
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

/// An attempt: a task id and an attempt number.
pub type AttemptKey = (TaskId, u32);

struct AttemptRecord {
    last_event: TaskEvent,
    cancel: Arc<AtomicBool>,
}

/// How many finished attempts are remembered for deduplication.
pub const REMEMBERED_FINISHED_ATTEMPTS: usize = 4096;

/// The protocol state of one agent.
pub struct Session {
    node_id: NodeId,
    topics: Topics,
    assign_topic: String,
    cancel_topic: String,
    attempts: HashMap<AttemptKey, AttemptRecord>,
    finished: VecDeque<AttemptKey>,
    /// Accepted and final events not yet handed to the journal.
    unjournaled: Vec<TaskEvent>,
    /// The runtimes this agent runs (those it advertises).
    runtimes: Vec<Runtime>,
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
    /// A session for `node_id` under `topics`.
    pub fn new(node_id: NodeId, topics: Topics) -> Self {
        let assign_topic = topics.node(&node_id, Channel::Assign);
        let cancel_topic = topics.node(&node_id, Channel::Cancel);
        Self {
            node_id,
            topics,
            assign_topic,
            cancel_topic,
            attempts: HashMap::new(),
            finished: VecDeque::new(),
            unjournaled: Vec::new(),
            runtimes: vec![Runtime::Wasm],
        }
    }

    /// Sets the runtimes the agent runs, as its capability advertises them
    /// (wasm only until then); an assignment for another fails at once.
    pub fn set_runtimes(&mut self, runtimes: &[Runtime]) {
        self.runtimes = runtimes.to_vec();
    }

    /// Restores attempts from the journal of an earlier run. Attempts that
    /// were still in progress were cut short by a crash or kill: each becomes
    /// a `failed` event (agent busy), returned for publishing, so the
    /// coordinator can retry it instead of waiting on it.
    pub fn restore(&mut self, events: Vec<TaskEvent>) -> Result<Vec<Outgoing>, EncodeError> {
        let mut to_publish = Vec::new();
        for event in events {
            if event.state.is_terminal() {
                let key = (event.task_id.clone(), event.attempt);
                self.attempts.insert(
                    key.clone(),
                    AttemptRecord {
                        last_event: event,
                        cancel: Arc::new(AtomicBool::new(false)),
                    },
                );
                self.finished.push_back(key);
            } else {
                let failed = TaskEvent::failed(
                    event.task_id,
                    event.attempt,
                    self.node_id.clone(),
                    FailureReason::AgentBusy,
                    "the agent restarted while this attempt was in progress; it did not finish",
                );
                to_publish.push(self.record_event(failed)?);
            }
        }
        self.evict_finished();
        Ok(to_publish)
    }

    /// Accepted and final events recorded since the last call, for the journal.
    pub fn take_journal_entries(&mut self) -> Vec<TaskEvent> {
        std::mem::take(&mut self.unjournaled)
    }

    /// The node id.
    pub fn node_id(&self) -> &NodeId {
        &self.node_id
    }

    /// The topic of one of this node's channels.
    pub fn topic(&self, channel: Channel) -> String {
        self.topics.node(&self.node_id, channel)
    }

    /// What to subscribe to, at QoS 1.
    pub fn subscriptions(&self) -> [(String, QoS); 2] {
        [
            (self.assign_topic.clone(), QoS::AtLeastOnce),
            (self.cancel_topic.clone(), QoS::AtLeastOnce),
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

    /// Handles a publish that arrived on a subscribed topic.
    pub fn on_publish(&mut self, topic: &str, payload: &[u8]) -> Result<Vec<Action>, InboundError> {
        let decode_error = |source| InboundError::Decode {
            topic: topic.to_owned(),
            source,
        };
        if topic == self.assign_topic {
            let assignment: Assignment = starling_proto::decode(payload).map_err(decode_error)?;
            self.on_assignment(assignment)
        } else if topic == self.cancel_topic {
            let cancel: Cancel = starling_proto::decode(payload).map_err(decode_error)?;
            self.on_cancel(cancel)
        } else {
            Err(InboundError::UnexpectedTopic {
                topic: topic.to_owned(),
            })
        }
    }

    fn on_assignment(&mut self, assignment: Assignment) -> Result<Vec<Action>, InboundError> {
        let key = (assignment.task_id.clone(), assignment.attempt);
        if let Some(record) = self.attempts.get(&key) {
            tracing::info!(task = %key.0, attempt = key.1, state = ?record.last_event.state,
                "assignment redelivered; re-publishing the attempt's last event instead of running it again");
            let event = record.last_event.clone();
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
            return Ok(vec![Action::Publish(self.record_event(event)?)]);
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
        self.unjournaled.push(accepted.clone());
        Ok(vec![
            Action::Publish(self.event_message(&accepted)?),
            Action::Start {
                assignment: Box::new(assignment),
                cancel,
            },
        ])
    }

    fn on_cancel(&mut self, cancel: Cancel) -> Result<Vec<Action>, InboundError> {
        let key = (cancel.task_id.clone(), cancel.attempt);
        match self.attempts.get(&key) {
            Some(record) if record.last_event.state.is_terminal() => {
                let event = record.last_event.clone();
                Ok(vec![Action::Publish(self.event_message(&event)?)])
            }
            Some(record) => {
                // The runner notices the flag and publishes `cancelled` itself,
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
                Ok(vec![Action::Publish(self.record_event(event)?)])
            }
        }
    }

    /// Records progress reported by a runner and returns the message to publish.
    pub fn on_task_event(&mut self, event: TaskEvent) -> Result<Outgoing, EncodeError> {
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

    /// Whether an attempt has been seen.
    pub fn knows(&self, task_id: &TaskId, attempt: u32) -> bool {
        self.attempts.contains_key(&(task_id.clone(), attempt))
    }

    /// Sets the cancel flag of every unfinished attempt (used at shutdown).
    pub fn cancel_all(&self) {
        for record in self.attempts.values() {
            if !record.last_event.state.is_terminal() {
                record.cancel.store(true, Ordering::SeqCst);
            }
        }
    }

    fn record_event(&mut self, event: TaskEvent) -> Result<Outgoing, EncodeError> {
        let message = self.event_message(&event)?;
        let key = (event.task_id.clone(), event.attempt);
        let terminal = event.state.is_terminal();
        match self.attempts.get_mut(&key) {
            Some(record) => {
                if record.last_event.state.is_terminal() {
                    // Never regress a finished attempt (a late `running`, say).
                    let last = record.last_event.clone();
                    return self.event_message(&last);
                }
                record.last_event = event;
            }
            None => {
                self.attempts.insert(
                    key.clone(),
                    AttemptRecord {
                        last_event: event,
                        cancel: Arc::new(AtomicBool::new(false)),
                    },
                );
            }
        }
        if terminal {
            if let Some(record) = self.attempts.get(&key) {
                self.unjournaled.push(record.last_event.clone());
            }
            self.finished.push_back(key);
            self.evict_finished();
        }
        Ok(message)
    }

    fn evict_finished(&mut self) {
        while self.finished.len() > REMEMBERED_FINISHED_ATTEMPTS {
            if let Some(oldest) = self.finished.pop_front() {
                self.attempts.remove(&oldest);
            }
        }
    }

    fn event_message(&self, event: &TaskEvent) -> Result<Outgoing, EncodeError> {
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
    use starling_proto::{Digest, ExecLimits};

    fn session() -> Session {
        Session::new(NodeId::new("n1").unwrap(), Topics::default())
    }

    fn assignment(task: &str, attempt: u32) -> Assignment {
        Assignment {
            v: PROTOCOL_VERSION,
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
        }
    }

    fn published_event(action: &Action) -> TaskEvent {
        match action {
            Action::Publish(out) => {
                assert_eq!(out.topic, "starling/v1/nodes/n1/events");
                assert_eq!(out.qos, QoS::AtLeastOnce);
                starling_proto::decode(&out.payload).unwrap()
            }
            Action::Start { .. } => panic!("expected a publish, got a start"),
        }
    }

    #[test]
    fn new_assignment_is_accepted_and_started_once() {
        let mut s = session();
        let topic = s.subscriptions()[0].0.clone();
        let payload = starling_proto::encode(&assignment("t1", 1)).unwrap();
        let actions = s.on_publish(&topic, &payload).unwrap();
        assert_eq!(actions.len(), 2);
        assert_eq!(published_event(&actions[0]).state, TaskState::Accepted);
        assert!(matches!(&actions[1], Action::Start { assignment, .. } if assignment.attempt == 1));

        let done = TaskEvent::state(
            TaskId::new("t1").unwrap(),
            1,
            s.node_id().clone(),
            TaskState::Succeeded,
        );
        s.on_task_event(done).unwrap();

        // Redelivery: the last event again, no start.
        let again = s.on_publish(&topic, &payload).unwrap();
        assert_eq!(again.len(), 1);
        assert_eq!(published_event(&again[0]).state, TaskState::Succeeded);

        // Another attempt of the same task is new work.
        let retry = starling_proto::encode(&assignment("t1", 2)).unwrap();
        assert_eq!(s.on_publish(&topic, &retry).unwrap().len(), 2);
    }

    #[test]
    fn malformed_payloads_are_typed_errors_and_change_nothing() {
        let mut s = session();
        let [(assign, _), (cancel, _)] = s.subscriptions();
        for garbage in [&b""[..], b"\xff\xff", b"not cbor", &[0x9f; 64]] {
            for topic in [&assign, &cancel] {
                let error = s.on_publish(topic, garbage).unwrap_err();
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
        assert!(s.on_publish(&assign, &wrong).is_err());
        assert!(matches!(
            s.on_publish("elsewhere", b"x"),
            Err(InboundError::UnexpectedTopic { .. })
        ));
        assert_eq!(s.attempts.len(), 0);
    }

    #[test]
    fn cancel_sets_the_flag_of_a_running_attempt() {
        let mut s = session();
        let [(assign, _), (cancel_topic, _)] = s.subscriptions();
        let actions = s
            .on_publish(
                &assign,
                &starling_proto::encode(&assignment("t", 1)).unwrap(),
            )
            .unwrap();
        let Action::Start { cancel, .. } = &actions[1] else {
            panic!("no start")
        };
        let message = starling_proto::encode(&Cancel {
            v: PROTOCOL_VERSION,
            task_id: TaskId::new("t").unwrap(),
            attempt: 1,
        })
        .unwrap();
        assert!(s.on_publish(&cancel_topic, &message).unwrap().is_empty());
        assert!(cancel.load(Ordering::SeqCst));
    }

    #[test]
    fn cancel_before_assignment_prevents_the_run() {
        let mut s = session();
        let [(assign, _), (cancel_topic, _)] = s.subscriptions();
        let message = starling_proto::encode(&Cancel {
            v: PROTOCOL_VERSION,
            task_id: TaskId::new("t").unwrap(),
            attempt: 1,
        })
        .unwrap();
        let actions = s.on_publish(&cancel_topic, &message).unwrap();
        assert_eq!(published_event(&actions[0]).state, TaskState::Cancelled);
        let actions = s
            .on_publish(
                &assign,
                &starling_proto::encode(&assignment("t", 1)).unwrap(),
            )
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
        ))
        .unwrap();
        let late = s
            .on_task_event(TaskEvent::state(task, 1, node, TaskState::Running))
            .unwrap();
        let event: TaskEvent = starling_proto::decode(&late.payload).unwrap();
        assert_eq!(event.state, TaskState::Succeeded);
    }

    #[test]
    fn restored_attempts_are_remembered_and_interrupted_ones_fail() {
        let mut s = session();
        let node = s.node_id().clone();
        let done = TaskEvent::state(
            TaskId::new("done").unwrap(),
            1,
            node.clone(),
            TaskState::Succeeded,
        );
        let cut = TaskEvent::state(TaskId::new("t").unwrap(), 1, node, TaskState::Accepted);
        let published = s.restore(vec![done, cut]).unwrap();
        assert_eq!(published.len(), 1);
        let event: TaskEvent = starling_proto::decode(&published[0].payload).unwrap();
        assert_eq!(event.reason, Some(FailureReason::AgentBusy));
        assert_eq!(s.take_journal_entries(), vec![event]);

        // A redelivery after the restart re-publishes instead of running.
        let topic = s.subscriptions()[0].0.clone();
        let again = s
            .on_publish(
                &topic,
                &starling_proto::encode(&assignment("done", 1)).unwrap(),
            )
            .unwrap();
        assert_eq!(again.len(), 1);
        assert_eq!(published_event(&again[0]).state, TaskState::Succeeded);
    }

    #[test]
    fn accepted_and_final_events_go_to_the_journal() {
        let mut s = session();
        let topic = s.subscriptions()[0].0.clone();
        s.on_publish(
            &topic,
            &starling_proto::encode(&assignment("j", 1)).unwrap(),
        )
        .unwrap();
        let node = s.node_id().clone();
        let task = TaskId::new("j").unwrap();
        s.on_task_event(TaskEvent::state(
            task.clone(),
            1,
            node.clone(),
            TaskState::Running,
        ))
        .unwrap();
        s.on_task_event(TaskEvent::state(task, 1, node, TaskState::Succeeded))
            .unwrap();
        let states: Vec<TaskState> = s.take_journal_entries().iter().map(|e| e.state).collect();
        assert_eq!(states, [TaskState::Accepted, TaskState::Succeeded]);
        assert!(s.take_journal_entries().is_empty());
    }

    #[test]
    fn opencl_assignments_fail_as_unsupported_unless_advertised() {
        let mut s = session();
        let mut a = assignment("gpu", 1);
        a.runtime = Runtime::Opencl;
        let topic = s.subscriptions()[0].0.clone();
        let actions = s
            .on_publish(&topic, &starling_proto::encode(&a).unwrap())
            .unwrap();
        assert_eq!(actions.len(), 1);
        let event = published_event(&actions[0]);
        assert_eq!(event.reason, Some(FailureReason::UnsupportedRuntime));
        assert!(event.message.unwrap().contains("it runs: wasm"));

        // Once the worker found a device, the same kind of assignment starts.
        s.set_runtimes(&[Runtime::Wasm, Runtime::Opencl]);
        let mut a = assignment("gpu", 2);
        a.runtime = Runtime::Opencl;
        let actions = s
            .on_publish(&topic, &starling_proto::encode(&a).unwrap())
            .unwrap();
        assert!(
            actions
                .iter()
                .any(|action| matches!(action, Action::Start { .. })),
            "{actions:?}"
        );
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
}
