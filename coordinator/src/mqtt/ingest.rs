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
use std::time::Duration;

use rumqttc::{Event, EventLoop, Packet, QoS, SubscribeFilter};
use starling_proto::{
    encode, Cancel, Channel, EventAck, NodeId, ReportChannel, TaskEvent, TaskState,
    PROTOCOL_VERSION,
};
use tokio::sync::{mpsc, watch};

pub use super::inbound::IngestError;
use super::inbound::{parse_inbound, Inbound, Senders};
use crate::domain::reports::{ReportRefused, Sender};
use crate::registry::RegistryChange;
use crate::store::EventOutcome;
use crate::task::{unix_now_ms, TaskStatus};
use crate::{Counters, Shared};

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

/// Subscribes to every node's capability, telemetry, status and events.
/// Uses the non-blocking request path: it runs on the task that drives the
/// event loop, which must not wait on its own request queue.
pub(crate) fn subscribe(shared: &Shared) {
    let filters = CONSUMED_CHANNELS
        .into_iter()
        .map(|channel| SubscribeFilter::new(shared.topics.all_nodes(channel), QoS::AtLeastOnce));
    if let Err(error) = shared.mqtt.try_subscribe_many(filters) {
        tracing::error!(%error, "cannot queue the MQTT subscriptions");
    }
}

/// Only capability and status are meant to be retained (the last report
/// stands for a node that is not speaking). A retained telemetry sample or
/// event would be replayed to the coordinator at every resubscribe and held
/// by the broker for good, so it is cleared (an empty retained message) when
/// one arrives; the message itself is still checked like any other.
fn clear_unwanted_retained(shared: &Shared, topic: &str) {
    let unwanted = [Channel::Telemetry, Channel::Events]
        .into_iter()
        .any(|channel| topic.ends_with(&format!("/{}", channel.as_str())));
    if unwanted {
        if let Err(error) = shared
            .mqtt
            .try_publish(topic, QoS::AtLeastOnce, true, Vec::new())
        {
            tracing::warn!(%error, topic, "cannot clear a retained message");
        }
    }
}

/// Drives the MQTT session: forwards publishes to the handler, subscribes again
/// after each reconnect, and retries after errors until told to stop.
pub(crate) async fn run_mqtt_loop(
    mut eventloop: EventLoop,
    shared: Arc<Shared>,
    messages: mpsc::Sender<Received>,
    mut stop: watch::Receiver<bool>,
) {
    loop {
        let polled = tokio::select! {
            polled = eventloop.poll() => polled,
            _ = stop.wait_for(|stopped| *stopped) => break,
        };
        match polled {
            Ok(Event::Incoming(Packet::ConnAck(_))) => {
                shared
                    .broker_up_since_ms
                    .store(unix_now_ms(), std::sync::atomic::Ordering::Relaxed);
                tracing::info!("connected to the MQTT broker again; subscribing");
                subscribe(&shared);
            }
            Ok(Event::Incoming(Packet::Publish(publish))) => {
                if publish.retain && !publish.payload.is_empty() {
                    clear_unwanted_retained(&shared, &publish.topic);
                }
                let received = Received {
                    topic: publish.topic,
                    payload: publish.payload.to_vec(),
                    retained: publish.retain,
                };
                if messages.send(received).await.is_err() {
                    break;
                }
            }
            Ok(_) => {}
            Err(error) => {
                if *stop.borrow() {
                    break;
                }
                shared
                    .broker_up_since_ms
                    .store(0, std::sync::atomic::Ordering::Relaxed);
                tracing::warn!(%error, "MQTT connection error; retrying in 1 s");
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                    _ = stop.wait_for(|stopped| *stopped) => break,
                }
            }
        }
    }
}

/// How many refused messages are logged per [`LOG_WINDOW`]; the rest are
/// only counted (on `/metrics`), so a flood of junk cannot fill the disk.
const LOGGED_PER_WINDOW: u32 = 20;
/// See [`LOGGED_PER_WINDOW`].
const LOG_WINDOW: Duration = Duration::from_secs(10);

/// A budget of warning lines per window, and how many were held back.
struct LogBudget {
    window_start: tokio::time::Instant,
    logged: u32,
    held_back: u64,
}

impl LogBudget {
    fn new() -> Self {
        Self {
            window_start: tokio::time::Instant::now(),
            logged: 0,
            held_back: 0,
        }
    }

    /// Whether one more line may be written now; opening a new window first
    /// says how many lines the last one held back.
    fn allow(&mut self) -> bool {
        let now = tokio::time::Instant::now();
        if now.duration_since(self.window_start) >= LOG_WINDOW {
            if self.held_back > 0 {
                tracing::warn!(
                    held_back = self.held_back,
                    window = ?LOG_WINDOW,
                    "more MQTT messages were ignored than logged; see starling_mqtt_messages_ignored_total"
                );
            }
            self.window_start = now;
            self.logged = 0;
            self.held_back = 0;
        }
        if self.logged < LOGGED_PER_WINDOW {
            self.logged += 1;
            true
        } else {
            self.held_back += 1;
            false
        }
    }
}

/// Handles received messages one at a time, in arrival order.
pub(crate) async fn run_message_handler(
    shared: Arc<Shared>,
    mut messages: mpsc::Receiver<Received>,
) {
    let mut budget = LogBudget::new();
    while let Some(message) = messages.recv().await {
        let handled =
            handle_message(&shared, &message.topic, &message.payload, message.retained).await;
        match handled {
            Ok(handled) => {
                if handled == Handled::Event(EventOutcome::Duplicate) {
                    Counters::increment(&shared.counters.duplicate_events);
                }
                Counters::increment(&shared.counters.messages_handled);
                tracing::debug!(topic = %message.topic, ?handled, "message handled")
            }
            Err(error) => {
                Counters::increment(&shared.counters.messages_ignored);
                if let IngestError::Refused(refused) = &error {
                    let reason = ReportRefused::REASONS
                        .iter()
                        .position(|reason| *reason == refused.reason());
                    if let Some(counter) =
                        reason.and_then(|i| shared.counters.reports_refused.get(i))
                    {
                        Counters::increment(counter);
                    }
                }
                if budget.allow() {
                    tracing::warn!(topic = %message.topic, %error, "message ignored");
                }
            }
        }
    }
}

/// What the coordinator knows of the nodes that send it reports.
struct KnownSenders<'a>(&'a Shared);

impl Senders for KnownSenders<'_> {
    fn revoked(&self, node: &NodeId) -> bool {
        !crate::access::ingest_allows(self.0, node.as_str())
    }

    fn sender(&self, node: &NodeId) -> Sender {
        match self.0.mqtt_access.report_key(node.as_str()) {
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

/// Raises the mark of an accepted report before it is applied, so it cannot
/// be accepted twice whatever applying it does; durable for every channel
/// but telemetry (see `ReportMarks`).
async fn raise_mark(
    shared: &Shared,
    node: &NodeId,
    channel: ReportChannel,
    counter: u64,
) -> Result<(), IngestError> {
    let durable = shared
        .report_marks
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .raise(node, channel, counter);
    if durable {
        shared
            .store
            .raise_report_mark(
                node.as_str(),
                crate::domain::reports::channel_name(channel),
                counter,
            )
            .await?;
    }
    Ok(())
}

/// Applies one message (`retained`: the broker handed it out as retained).
/// On any error the registry and the store are unchanged.
pub(crate) async fn handle_message(
    shared: &Shared,
    topic: &str,
    payload: &[u8],
    retained: bool,
) -> Result<Handled, IngestError> {
    let now_ms = unix_now_ms();
    let accepted = parse_inbound(
        &shared.topics,
        topic,
        payload,
        retained,
        &KnownSenders(shared),
    )?;
    if let Some((node, channel, counter)) = &accepted.counted {
        raise_mark(shared, node, *channel, *counter).await?;
    }
    let change = match accepted.inbound {
        Inbound::Cleared => return Ok(Handled::Cleared),
        Inbound::Capability(node, capability) => {
            shared
                .registry_mut()
                .apply_capability(&node, *capability, now_ms)?
        }
        Inbound::Telemetry(node, telemetry) => shared
            .registry_mut()
            .apply_telemetry(&node, telemetry, now_ms)?,
        Inbound::Status(node, status) => {
            shared.registry_mut().apply_status(&node, status, now_ms)?
        }
        Inbound::Event(event) => return handle_event(shared, event, now_ms).await,
    };
    match &change {
        RegistryChange::NodeOffline(id) => {
            let lost = shared
                .store
                .requeue_node_tasks(id.as_str(), shared.max_attempts, now_ms)
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
            shared.wake_scheduler.notify_one();
        }
        RegistryChange::NodeOnline(id) | RegistryChange::NodeRegistered(id) => {
            tracing::info!(node = %id, change = ?change, "node registry updated");
            shared.wake_scheduler.notify_one();
        }
        _ => {}
    }
    Ok(Handled::Registry(change))
}

/// Queues a message for `node` without waiting. When the request queue is
/// full the message is dropped, which costs nothing lasting: the agent re-sends
/// an unacknowledged event, and the answer is made again for the redelivery.
fn reply<M: starling_proto::Message>(
    shared: &Shared,
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
    let topic = shared.topics.node(node, channel);
    if let Err(error) = shared
        .mqtt
        .try_publish(topic, QoS::AtLeastOnce, false, bytes)
    {
        tracing::debug!(%error, node = %node, channel = channel.as_str(), "reply dropped; the agent's redelivery will get another");
    }
}

/// Tells a node to stop an attempt that is no longer the task's current one.
fn cancel_stale(shared: &Shared, event: &TaskEvent) {
    tracing::info!(
        task = %event.task_id,
        attempt = event.attempt,
        node = %event.node_id,
        "node reports work on a stale attempt; cancelling it"
    );
    Counters::increment(&shared.counters.stale_cancels);
    let cancel = Cancel {
        v: PROTOCOL_VERSION,
        task_id: event.task_id.clone(),
        attempt: event.attempt,
    };
    reply(shared, &event.node_id, Channel::Cancel, &cancel);
}

fn works_on(state: TaskState) -> bool {
    matches!(state, TaskState::Accepted | TaskState::Running)
}

async fn handle_event(
    shared: &Shared,
    event: TaskEvent,
    now_ms: u64,
) -> Result<Handled, IngestError> {
    let outcome = shared
        .store
        .record_event(&event, now_ms, shared.max_attempts)
        .await?;
    // Recorded (or known already, or about a task that does not exist): the
    // agent may forget it.
    let ack = EventAck {
        v: PROTOCOL_VERSION,
        task_id: event.task_id.clone(),
        attempt: event.attempt,
        state: event.state,
    };
    reply(shared, &event.node_id, Channel::Ack, &ack);
    if event.state == TaskState::Rejected && outcome != EventOutcome::Duplicate {
        Counters::increment(&shared.counters.assignments_rejected);
        tracing::warn!(
            task = %event.task_id,
            attempt = event.attempt,
            node = %event.node_id,
            why = event.message.as_ref().map(|m| m.as_str()).unwrap_or("no reason given"),
            "the node refused an assignment; the task is unchanged and the assignment will be sent again"
        );
    }
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
                let task = shared.store.task(event.task_id.as_str()).await?;
                let current = task.is_some_and(|task| {
                    task.attempt == event.attempt
                        && task.node_id.as_deref() == Some(event.node_id.as_str())
                });
                if !current {
                    cancel_stale(shared, &event);
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
                cancel_stale(shared, &event);
            }
        }
        EventOutcome::Recorded { status, changed } => {
            if *changed {
                tracing::info!(task = %event.task_id, attempt = event.attempt, node = %event.node_id, state = %status, "task state changed");
            }
            if status.is_terminal() || *status == TaskStatus::Pending {
                // A slot freed up, or the task needs a new home.
                shared.wake_scheduler.notify_one();
            }
        }
    }
    Ok(Handled::Event(outcome))
}
