//! MQTT ingest: the loop that keeps the coordinator's broker session alive and
//! the handler that turns capability, telemetry, status and event messages into
//! registry and store changes. Bad input costs a warning and changes nothing.
//!
//! Every event the store has durably recorded (a duplicate and an event for an
//! unknown task too) is answered with an `EventAck` on the node's `ack`
//! channel, so the agent can drop it from its outbox; an `accepted` or
//! `running` of an attempt that is no longer current is answered with a
//! `Cancel`, so a node that comes back after being suspected stops its stale
//! work instead of duplicating it. Both are queued without waiting (see
//! [`reply`]): the handler must never wait on the request queue that only the
//! MQTT loop drains, while that loop waits on the handler.

use std::sync::Arc;

use rumqttc::QoS;
use starling_proto::{
    encode, Cancel, Channel, EventAck, NodeId, ReportChannel, TaskEvent, TaskState,
    PROTOCOL_VERSION,
};

pub use super::inbound::IngestError;
use super::inbound::{parse_inbound, Inbound, Senders};
use crate::access::MqttAccess;
use crate::counters::Counters;
use crate::domain::reports::{ReportMarks, Sender};
use crate::mqtt::client::MqttClient;
use crate::registry::{NodeRegistry, RegistryChange};
use crate::store::{EventOutcome, EventToRecord, ReportMark, Store};
use crate::task::TaskStatus;
use starling_api::{NodeChangeKind, TelemetrySample};

/// What ingest uses of the coordinator, and nothing else: the store and the
/// registry it changes, the client it answers nodes with, who may speak
/// (revocations, report keys and marks), and the scheduler it wakes.
#[derive(Clone)]
pub(crate) struct Ingest {
    pub(crate) store: Store,
    pub(crate) registry: Arc<NodeRegistry>,
    pub(crate) topics: starling_proto::Topics,
    pub(crate) mqtt: MqttClient,
    /// Revoked nodes and report keys.
    pub(crate) access: Arc<MqttAccess>,
    /// The highest report counter accepted per node and report channel
    /// (ingest with enrollment, which forgets a re-enrolled node's).
    pub(crate) report_marks: Arc<std::sync::Mutex<ReportMarks>>,
    /// Whether nodes without a report key are heard (development broker).
    pub(crate) accept_unsigned_reports: bool,
    pub(crate) max_attempts: u32,
    pub(crate) wake_scheduler: Arc<tokio::sync::Notify>,
    /// Since when the broker connection is up (0 while down), for liveness.
    pub(crate) broker_up_since_ms: Arc<std::sync::atomic::AtomicU64>,
    pub(crate) counters: Arc<Counters>,
    /// Where node changes and telemetry samples are announced.
    pub(crate) feed: crate::live::Feed,
}

/// The channels the coordinator consumes.
pub const CONSUMED_CHANNELS: [Channel; 4] = [
    Channel::Capability,
    Channel::Telemetry,
    Channel::Status,
    Channel::Events,
];

/// A message received from the broker, waiting for the handler.
#[derive(Debug, Clone)]
pub struct Received {
    /// Its topic.
    pub topic: String,
    /// Its payload.
    pub payload: Vec<u8>,
    /// Whether the broker handed it out as a retained message (at
    /// subscription), rather than forwarding it as it was published.
    pub retained: bool,
    /// When the MQTT loop read it, Unix ms: how long it waited for ingest.
    pub received_ms: u64,
}

/// What handling a message did, for logs and tests.
#[derive(Debug, Clone, PartialEq)]
pub enum Handled {
    /// The registry changed (or knowingly did not).
    Registry(RegistryChange),
    /// A task event was recorded (or recognised as a duplicate).
    Event(EventOutcome),
    /// An empty retained message (a cleared topic) was skipped.
    Cleared,
}

/// What the coordinator knows of the nodes that send it reports.
struct KnownSenders<'a>(&'a Ingest);

impl Senders for KnownSenders<'_> {
    fn revoked(&self, node: &NodeId) -> bool {
        self.0.access.is_revoked(node.as_str())
    }

    fn sender(&self, node: &NodeId) -> Sender {
        match self.0.access.report_key(node.as_str()) {
            Some(key) => Sender::Keyed(key),
            None => Sender::Unkeyed {
                accept_unsigned: self.0.accept_unsigned_reports,
            },
        }
    }

    fn mark(&self, node: &NodeId, channel: ReportChannel) -> Option<u64> {
        self.0
            .report_marks
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(node, channel)
    }
}

/// A message that passed every check (sender, signature, counter), not yet
/// applied.
pub(crate) struct Admitted {
    /// What it says.
    pub(crate) inbound: Inbound,
    /// Its report counter, to be kept durably as the node's highest on its
    /// channel (every channel but telemetry; see `ReportMarks`).
    pub(crate) mark: Option<ReportMark>,
}

/// Checks one message (`retained`: the broker handed it out as retained)
/// and raises its report mark in memory, so the same report cannot be
/// admitted twice whatever applying it does; the durable mark is written
/// when it is applied ([`apply_report`], [`handle_events`]).
pub(crate) async fn admit(
    ingest: &Ingest,
    topic: &str,
    payload: &[u8],
    retained: bool,
    now_ms: u64,
) -> Result<Admitted, IngestError> {
    // A node enrolled through another replica of the site is not in this
    // process's cache yet: look it up before deciding who sent this.
    if let Some((node, _)) = ingest.topics.parse(topic) {
        if let Err(error) =
            crate::access::learn_node(&ingest.store, &ingest.access, node.as_str(), now_ms).await
        {
            tracing::warn!(%error, node = %node, "cannot look the node's credentials up");
        }
    }
    let accepted = parse_inbound(
        &ingest.topics,
        topic,
        payload,
        retained,
        &KnownSenders(ingest),
    )?;
    let mark = accepted.counted.and_then(|(node, channel, counter)| {
        let durable = ingest
            .report_marks
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .raise(&node, channel, counter);
        durable.then(|| ReportMark {
            node_id: node.to_string(),
            channel: crate::domain::reports::channel_name(channel),
            counter,
        })
    });
    Ok(Admitted {
        inbound: accepted.inbound,
        mark,
    })
}

/// Applies one message (`retained`: the broker handed it out as retained).
/// On any error the registry and the store are unchanged. (The workers
/// admit and apply messages in batches; this is one message's whole path.)
#[cfg(test)]
pub(crate) async fn handle_message(
    ingest: &Ingest,
    topic: &str,
    payload: &[u8],
    retained: bool,
) -> Result<Handled, IngestError> {
    let now_ms = crate::task::unix_now_ms();
    let admitted = admit(ingest, topic, payload, retained, now_ms).await?;
    apply_report(ingest, admitted.inbound, admitted.mark, now_ms).await
}

/// Applies an admitted report other than an event: to the registry, and
/// what follows from it (a node that went offline has its work requeued).
pub(crate) async fn apply_report(
    ingest: &Ingest,
    inbound: Inbound,
    mark: Option<ReportMark>,
    now_ms: u64,
) -> Result<Handled, IngestError> {
    if let Inbound::Event(event) = inbound {
        let mut handled = handle_events(ingest, vec![(event, mark)], now_ms).await;
        // One event in, one answer out; the fallback is never taken.
        return handled.pop().unwrap_or(Ok(Handled::Cleared));
    }
    if let Some(mark) = mark {
        ingest
            .store
            .raise_report_mark(&mark.node_id, mark.channel, mark.counter)
            .await?;
    }
    let change = match inbound {
        Inbound::Cleared => return Ok(Handled::Cleared),
        Inbound::Capability(node, capability) => {
            ingest
                .registry
                .write()
                .apply_capability(&node, *capability, now_ms)?
        }
        Inbound::Telemetry(node, telemetry) => ingest
            .registry
            .write()
            .apply_telemetry(&node, telemetry, now_ms)?,
        Inbound::Status(node, status) => ingest
            .registry
            .write()
            .apply_status(&node, status, now_ms)?,
        // Taken above.
        Inbound::Event(_) => return Ok(Handled::Cleared),
    };
    announce(ingest, &change, now_ms);
    match &change {
        // Every replica hears the last will; the leader requeues.
        RegistryChange::NodeOffline(id) if ingest.store.leads() => {
            let lost = ingest
                .store
                .requeue_node_tasks(id.as_str(), ingest.max_attempts, now_ms)
                .await?;
            for task in &lost {
                tracing::warn!(
                    node = %id,
                    task = %task.task_id,
                    attempt = task.attempt,
                    now = %task.status,
                    "node went offline with the task in flight"
                );
            }
            ingest.wake_scheduler.notify_one();
        }
        RegistryChange::NodeOnline(id) | RegistryChange::NodeRegistered(id) => {
            tracing::info!(node = %id, change = ?change, "node registry updated");
            ingest.wake_scheduler.notify_one();
        }
        _ => {}
    }
    Ok(Handled::Registry(change))
}

/// Tells watchers what a registry change means for them: a node's new state,
/// or its load.
fn announce(ingest: &Ingest, change: &RegistryChange, now_ms: u64) {
    let (id, kind) = match change {
        RegistryChange::NodeOnline(id) => (id, NodeChangeKind::Online),
        RegistryChange::NodeOffline(id) => (id, NodeChangeKind::Offline),
        RegistryChange::NodeRegistered(id) => (id, NodeChangeKind::Capability),
        RegistryChange::TelemetryUpdated(id) => {
            let sample = ingest
                .registry
                .read()
                .get(id)
                .and_then(|entry| telemetry_sample(id, entry, now_ms));
            if let Some(sample) = sample {
                ingest.feed.telemetry(sample);
            }
            return;
        }
        RegistryChange::StaleTelemetry(_)
        | RegistryChange::Unchanged(_)
        | RegistryChange::AwaitingCapability(_) => return,
    };
    ingest.feed.node(id.as_str(), kind, now_ms);
}

/// A node's latest telemetry as the live stream shows it.
pub(crate) fn telemetry_sample(
    id: &NodeId,
    entry: &crate::registry::NodeEntry,
    now_ms: u64,
) -> Option<TelemetrySample> {
    let telemetry = entry.telemetry.as_ref()?;
    let total = entry.capability.memory_bytes;
    let memory_used = if total == 0 {
        0.0
    } else {
        (1.0 - telemetry.free_memory_bytes as f64 / total as f64).clamp(0.0, 1.0) as f32
    };
    Some(TelemetrySample {
        node_id: id.to_string(),
        cpu_load: telemetry.cpu_load,
        memory_used,
        free_memory_bytes: telemetry.free_memory_bytes,
        rtt_ms: telemetry.link.rtt_ms,
        gpu_load: telemetry.gpu_load,
        energy_joules: telemetry.energy_joules,
        energy_source: telemetry.energy_source.as_str().to_owned(),
        power_level: telemetry.power_level,
        running_tasks: telemetry.running_tasks,
        queued_tasks: telemetry.queued_tasks,
        at_ms: entry.telemetry_received_ms.unwrap_or(now_ms),
    })
}

/// Queues a message for `node` without waiting. When the request queue is
/// full the message is dropped, which costs nothing lasting: the agent re-sends
/// an unacknowledged event, and the answer is made again for the redelivery.
fn reply<M: starling_proto::Message>(
    ingest: &Ingest,
    node: &NodeId,
    channel: Channel,
    message: &M,
) {
    let bytes = match encode(message) {
        Ok(bytes) => bytes,
        Err(error) => {
            tracing::error!(%error, channel = channel.as_str(), "cannot encode a reply");
            return;
        }
    };
    let topic = ingest.topics.node(node, channel);
    if let Err(error) = ingest
        .mqtt
        .try_publish(topic, QoS::AtLeastOnce, false, bytes)
    {
        tracing::debug!(%error, node = %node, channel = channel.as_str(), "reply dropped; the agent's redelivery will get another");
    }
}

/// Tells a node to stop an attempt that is no longer the task's current one.
fn cancel_stale(ingest: &Ingest, event: &TaskEvent) {
    tracing::info!(
        task = %event.task_id,
        attempt = event.attempt,
        node = %event.node_id,
        "node reports work on a stale attempt; cancelling it"
    );
    Counters::increment(&ingest.counters.stale_cancels);
    let cancel = Cancel {
        v: PROTOCOL_VERSION,
        task_id: event.task_id.clone(),
        attempt: event.attempt,
    };
    reply(ingest, &event.node_id, Channel::Cancel, &cancel);
}

fn works_on(state: TaskState) -> bool {
    matches!(state, TaskState::Accepted | TaskState::Running)
}

/// Records admitted events (with their report marks) in one transaction
/// and answers each: one result per event, in order. When the batch's
/// transaction fails, each event is tried alone, so one that the store
/// cannot take holds up none of the others.
pub(crate) async fn handle_events(
    ingest: &Ingest,
    events: Vec<(TaskEvent, Option<ReportMark>)>,
    now_ms: u64,
) -> Vec<Result<Handled, IngestError>> {
    let batch: Vec<EventToRecord<'_>> = events
        .iter()
        .map(|(event, mark)| EventToRecord {
            event,
            mark: mark.clone(),
        })
        .collect();
    let outcomes: Vec<Result<EventOutcome, IngestError>> = match ingest
        .store
        .record_events(&batch, now_ms, ingest.max_attempts)
        .await
    {
        Ok(outcomes) => outcomes.into_iter().map(Ok).collect(),
        Err(error) if batch.len() == 1 => vec![Err(error.into())],
        Err(error) => {
            tracing::warn!(%error, events = batch.len(), "recording a batch of events failed; recording them one by one");
            let mut outcomes = Vec::with_capacity(batch.len());
            for item in &batch {
                outcomes.push(record_alone(ingest, item, now_ms).await);
            }
            outcomes
        }
    };
    let mut handled = Vec::with_capacity(events.len());
    for ((event, _), outcome) in events.into_iter().zip(outcomes) {
        handled.push(match outcome {
            Ok(outcome) => answer_event(ingest, event, outcome).await,
            Err(error) => Err(error),
        });
    }
    handled
}

/// A finished attempt's run time as its node measured it teaches the
/// node's estimates (`Registry::finish_run`) and counts in `/metrics`
/// (`starling_estimate_error_ratio`); a failed or cancelled one only ends
/// the wait for it. A stale attempt's measurement is as true as a current
/// one's.
fn learn_run_time(ingest: &Ingest, event: &TaskEvent, outcome: &EventOutcome) {
    if !matches!(
        outcome,
        EventOutcome::Recorded { .. } | EventOutcome::Stale { .. }
    ) {
        return;
    }
    let observed_s = match event.state {
        TaskState::Succeeded => event.metrics.map(|metrics| metrics.wall_ms as f64 / 1000.0),
        TaskState::Failed | TaskState::Cancelled => None,
        _ => return,
    };
    let sample = ingest.registry.write().finish_run(
        &event.node_id,
        event.task_id.as_str(),
        event.attempt,
        observed_s,
    );
    if let Some(sample) = sample {
        ingest
            .counters
            .estimate_errors
            .observe(sample.predicted_s, sample.observed_s);
    }
}

/// Records one event on its own, its mark first (two commits: the path
/// taken only when a batch failed).
async fn record_alone(
    ingest: &Ingest,
    item: &EventToRecord<'_>,
    now_ms: u64,
) -> Result<EventOutcome, IngestError> {
    if let Some(mark) = &item.mark {
        ingest
            .store
            .raise_report_mark(&mark.node_id, mark.channel, mark.counter)
            .await?;
    }
    Ok(ingest
        .store
        .record_event(item.event, now_ms, ingest.max_attempts)
        .await?)
}

/// Answers a recorded event: its acknowledgement, and what its outcome
/// asks for (a cancel of stale work, a wake-up of the scheduler).
async fn answer_event(
    ingest: &Ingest,
    event: TaskEvent,
    outcome: EventOutcome,
) -> Result<Handled, IngestError> {
    // The node answers its assignments again: it may be offered work.
    if ingest.registry.write().answered(&event.node_id) {
        tracing::info!(node = %event.node_id, "the node answers its assignments again");
        ingest.wake_scheduler.notify_one();
    }
    // Recorded (or known already, or about a task that does not exist): the
    // agent may forget it.
    let ack = EventAck {
        v: PROTOCOL_VERSION,
        task_id: event.task_id.clone(),
        attempt: event.attempt,
        state: event.state,
    };
    reply(ingest, &event.node_id, Channel::Ack, &ack);
    if event.state == TaskState::Rejected && outcome != EventOutcome::Duplicate {
        Counters::increment(&ingest.counters.assignments_rejected);
        tracing::warn!(
            task = %event.task_id,
            attempt = event.attempt,
            node = %event.node_id,
            why = event.message.as_ref().map(|m| m.as_str()).unwrap_or("no reason given"),
            "the node refused an assignment; the task is unchanged and the assignment will be sent again"
        );
    }
    learn_run_time(ingest, &event, &outcome);
    match &outcome {
        EventOutcome::UnknownTask => {
            return Err(IngestError::UnknownTask {
                task_id: event.task_id.to_string(),
                node: event.node_id.to_string(),
                state: event.state,
            })
        }
        EventOutcome::Duplicate => {
            tracing::debug!(task = %event.task_id, attempt = event.attempt, "duplicate event ignored");
            if works_on(event.state) {
                // The first answer may have been the one lost; ask again.
                let task = ingest.store.task(event.task_id.as_str()).await?;
                let current = task.is_some_and(|task| {
                    task.attempt == event.attempt
                        && task.node_id.as_deref() == Some(event.node_id.as_str())
                });
                if !current {
                    cancel_stale(ingest, &event);
                }
            }
        }
        EventOutcome::NotAssigned => {
            // Acknowledged all the same, so the sender stops repeating it.
            tracing::warn!(task = %event.task_id, attempt = event.attempt, node = %event.node_id, state = ?event.state, "event from a node that was never assigned this attempt; not recorded");
        }
        EventOutcome::Stale { status } => {
            tracing::info!(task = %event.task_id, attempt = event.attempt, node = %event.node_id, state = ?event.state, now = %status, "event of a stale attempt kept as history");
            if works_on(event.state) {
                cancel_stale(ingest, &event);
            }
        }
        EventOutcome::Recorded { status, changed } => {
            if *changed {
                tracing::info!(task = %event.task_id, attempt = event.attempt, node = %event.node_id, state = %status, "task state changed");
            }
            if status.is_terminal() || *status == TaskStatus::Pending {
                // A slot freed up, or the task needs a new home.
                ingest.wake_scheduler.notify_one();
            }
        }
    }
    Ok(Handled::Event(outcome))
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    //! Ingest applying each kind of message to a real store and registry,
    //! without a broker: the client's event loop is never polled, so its
    //! replies wait in its queue.

    use starling_proto::{encode, NodeState, SignedReport, Status, TaskId};

    use super::*;
    use crate::registry::tests::{capability, telemetry};

    const NODE: &str = "pi-1";

    fn key() -> ed25519_dalek::SigningKey {
        ed25519_dalek::SigningKey::from_bytes(&[9; 32])
    }

    fn node() -> NodeId {
        NodeId::new(NODE).unwrap()
    }

    /// An ingest handle over a fresh SQLite store, with `NODE` keyed; the
    /// event loop is returned so the client's queue stays open.
    async fn ingest(dir: &std::path::Path) -> (Ingest, rumqttc::EventLoop) {
        let url = format!("sqlite://{}", dir.join("ingest.db").display());
        let store = Store::open(&url).await.unwrap();
        let access = Arc::new(MqttAccess::new(crate::access::INTERNAL_MQTT_USER));
        access.replace(&[crate::store::access::NodeCredentialRow {
            node_id: NODE.into(),
            password_sha256: String::new(),
            mosquitto_hash: String::new(),
            created_ms: 1,
            revoked_ms: None,
            report_key: Some(hex::encode(key().verifying_key().to_bytes())),
        }]);
        let (mqtt, eventloop) =
            rumqttc::AsyncClient::new(rumqttc::MqttOptions::new("test", "127.0.0.1", 1), 64);
        let handle = Ingest {
            store,
            registry: Arc::new(NodeRegistry::new()),
            topics: starling_proto::Topics::default(),
            mqtt,
            access,
            report_marks: Arc::new(std::sync::Mutex::new(ReportMarks::default())),
            accept_unsigned_reports: false,
            max_attempts: 3,
            wake_scheduler: Arc::new(tokio::sync::Notify::new()),
            broker_up_since_ms: Arc::new(std::sync::atomic::AtomicU64::new(1)),
            counters: Arc::new(Counters::default()),
            feed: crate::live::Feed::new(64),
        };
        (handle, eventloop)
    }

    fn signed<M: starling_proto::Message>(
        channel: ReportChannel,
        counter: u64,
        message: &M,
    ) -> Vec<u8> {
        encode(&SignedReport::sign(
            &key(),
            node(),
            channel,
            counter,
            encode(message).unwrap(),
        ))
        .unwrap()
    }

    fn topic(channel: Channel) -> String {
        starling_proto::Topics::default().node(&node(), channel)
    }

    fn status(state: NodeState) -> Status {
        Status {
            v: PROTOCOL_VERSION,
            node_id: node(),
            state,
        }
    }

    #[tokio::test]
    async fn each_report_kind_changes_the_registry_once_and_forgeries_change_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let (ingest, _eventloop) = ingest(dir.path()).await;
        let handle = |channel: Channel, payload: Vec<u8>| {
            let ingest = ingest.clone();
            async move { handle_message(&ingest, &topic(channel), &payload, false).await }
        };

        let mut own = capability(NODE);
        own.cpu.cores = 4;
        let registered = handle(
            Channel::Capability,
            signed(ReportChannel::Capability, 10, &own),
        )
        .await;
        assert_eq!(
            registered.unwrap(),
            Handled::Registry(RegistryChange::NodeRegistered(node()))
        );
        // Its mark is durable: a restarted coordinator still refuses the replay.
        assert_eq!(
            ingest.store.report_marks().await.unwrap(),
            [(NODE.to_string(), "capability".to_string(), 10)]
        );

        let sample = handle(
            Channel::Telemetry,
            signed(ReportChannel::Telemetry, 11, &telemetry(NODE, 1, 1_000)),
        )
        .await;
        assert_eq!(
            sample.unwrap(),
            Handled::Registry(RegistryChange::TelemetryUpdated(node()))
        );
        let online = handle(
            Channel::Status,
            signed(ReportChannel::Status, 12, &status(NodeState::Online)),
        )
        .await;
        assert!(matches!(online.unwrap(), Handled::Registry(_)));

        // Forgeries: unsigned, replayed, another node's key; none changes
        // what the registry holds of the node.
        let mut big = capability(NODE);
        big.cpu.cores = 64;
        let forged_key = ed25519_dalek::SigningKey::from_bytes(&[1; 32]);
        let other_key = encode(&SignedReport::sign(
            &forged_key,
            node(),
            ReportChannel::Capability,
            50,
            encode(&big).unwrap(),
        ))
        .unwrap();
        for forged in [
            encode(&big).unwrap(),
            signed(ReportChannel::Capability, 10, &big),
            other_key,
        ] {
            let refused = handle(Channel::Capability, forged).await;
            assert!(
                matches!(refused, Err(IngestError::Refused(_))),
                "{refused:?}"
            );
        }
        assert_eq!(
            ingest
                .registry
                .read()
                .get(&node())
                .unwrap()
                .capability
                .cpu
                .cores,
            4
        );

        // The last will takes the node offline; an event for a task the
        // coordinator does not know is refused after its acknowledgement.
        let will = handle(
            Channel::Status,
            signed(ReportChannel::Will, 5, &status(NodeState::Offline)),
        )
        .await;
        assert_eq!(
            will.unwrap(),
            Handled::Registry(RegistryChange::NodeOffline(node()))
        );
        let unknown = TaskEvent::state(
            TaskId::new("no-such-task").unwrap(),
            1,
            node(),
            TaskState::Running,
        );
        let refused = handle(Channel::Events, signed(ReportChannel::Events, 13, &unknown)).await;
        assert!(
            matches!(refused, Err(IngestError::UnknownTask { .. })),
            "{refused:?}"
        );
        // An empty message (a cleared retained topic) changes nothing.
        assert_eq!(
            handle(Channel::Capability, Vec::new()).await.unwrap(),
            Handled::Cleared
        );
    }
}
