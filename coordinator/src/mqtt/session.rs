//! The coordinator's MQTT session: subscribing, clearing retained messages
//! that should not be retained, and the loop that reads what the broker
//! delivers and hands it to the handler, each node within its budget.

use std::time::Duration;

use rumqttc::{Event, EventLoop, Packet, QoS, SubscribeFilter};
use starling_proto::Channel;
use tokio::sync::{mpsc, watch};

use super::ingest::{Ingest, Received, CONSUMED_CHANNELS};
use crate::task::unix_now_ms;
use crate::Counters;

/// Subscribes to every node's capability, telemetry, status and events.
/// Uses the non-blocking request path: it runs on the task that drives the
/// event loop, which must not wait on its own request queue.
pub(crate) fn subscribe(ingest: &Ingest) {
    let filters = CONSUMED_CHANNELS
        .into_iter()
        .map(|channel| SubscribeFilter::new(ingest.topics.all_nodes(channel), QoS::AtLeastOnce));
    if let Err(error) = ingest.mqtt.try_subscribe_many(filters) {
        tracing::error!(%error, "cannot queue the MQTT subscriptions");
    }
}

/// Only capability and status are meant to be retained (the last report
/// stands for a node that is not speaking). A retained telemetry sample or
/// event would be replayed to the coordinator at every resubscribe and held
/// by the broker for good, so it is cleared (an empty retained message) when
/// one arrives; the message itself is still checked like any other.
fn clear_unwanted_retained(ingest: &Ingest, topic: &str) {
    let unwanted = [Channel::Telemetry, Channel::Events]
        .into_iter()
        .any(|channel| topic.ends_with(&format!("/{}", channel.as_str())));
    if unwanted {
        if let Err(error) = ingest
            .mqtt
            .try_publish(topic, QoS::AtLeastOnce, true, Vec::new())
        {
            tracing::warn!(%error, topic, "cannot clear a retained message");
        }
    }
}

/// How often a line about dropped messages is written at most.
const DROP_LOG_WINDOW: Duration = Duration::from_secs(10);

/// Messages dropped at ingest since the last line about them.
struct Drops {
    since: tokio::time::Instant,
    over_budget: u64,
    backlog: u64,
    last_node: String,
}

impl Drops {
    fn new() -> Self {
        Self {
            since: tokio::time::Instant::now(),
            over_budget: 0,
            backlog: 0,
            last_node: String::new(),
        }
    }

    /// Counts one dropped message (on `/metrics` at once; in the log once a
    /// window, however many).
    fn drop(&mut self, ingest: &Ingest, node: &str, over_budget: bool) {
        let counter = if over_budget {
            self.over_budget += 1;
            &ingest.counters.messages_dropped_over_budget
        } else {
            self.backlog += 1;
            &ingest.counters.messages_dropped_backlog
        };
        Counters::increment(counter);
        node.clone_into(&mut self.last_node);
        if self.since.elapsed() >= DROP_LOG_WINDOW {
            tracing::warn!(
                over_budget = self.over_budget,
                backlog = self.backlog,
                last_node = %self.last_node,
                "MQTT messages dropped at ingest: nodes over their per-channel budget, or telemetry and events while the queue was full (agents send events again until acknowledged)"
            );
            *self = Self::new();
        }
    }
}

/// Drives the MQTT session: forwards publishes to the handler, subscribes again
/// after each reconnect, and retries after errors until told to stop. Each
/// node's messages pass its budget (`domain::budget`) first; telemetry and
/// events that find the handler's queue full are dropped rather than waited
/// for, so the loop, and with it what the coordinator publishes, never waits
/// behind what it receives.
pub(crate) async fn run_mqtt_loop(
    mut eventloop: EventLoop,
    ingest: Ingest,
    messages: mpsc::Sender<Received>,
    mut stop: watch::Receiver<bool>,
) {
    let mut budgets = crate::domain::budget::NodeBudgets::default();
    let mut drops = Drops::new();
    loop {
        let polled = tokio::select! {
            polled = eventloop.poll() => polled,
            _ = stop.wait_for(|stopped| *stopped) => break,
        };
        match polled {
            Ok(Event::Incoming(Packet::ConnAck(_))) => {
                ingest
                    .broker_up_since_ms
                    .store(unix_now_ms(), std::sync::atomic::Ordering::Relaxed);
                tracing::info!("connected to the MQTT broker again; subscribing");
                subscribe(&ingest);
            }
            Ok(Event::Incoming(Packet::Publish(publish))) => {
                if publish.retain && !publish.payload.is_empty() {
                    clear_unwanted_retained(&ingest, &publish.topic);
                }
                let now_ms = unix_now_ms();
                let sender = ingest.topics.parse(&publish.topic);
                if let Some((node, channel)) = &sender {
                    if !budgets.admit(node.as_str(), *channel, now_ms) {
                        drops.drop(&ingest, node.as_str(), true);
                        continue;
                    }
                }
                let received = Received {
                    topic: publish.topic,
                    payload: publish.payload.to_vec(),
                    retained: publish.retain,
                    received_ms: now_ms,
                };
                match sender {
                    Some((node, Channel::Telemetry | Channel::Events)) => {
                        match messages.try_send(received) {
                            Ok(()) => {}
                            Err(mpsc::error::TrySendError::Full(_)) => {
                                drops.drop(&ingest, node.as_str(), false);
                            }
                            Err(mpsc::error::TrySendError::Closed(_)) => break,
                        }
                    }
                    // Capability and status (and anything the handler will
                    // refuse): rare, and lasting; they wait for room.
                    _ => {
                        if messages.send(received).await.is_err() {
                            break;
                        }
                    }
                }
            }
            Ok(_) => {}
            Err(error) => {
                if *stop.borrow() {
                    break;
                }
                ingest
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
