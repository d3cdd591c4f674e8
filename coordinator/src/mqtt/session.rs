//! The coordinator's MQTT session: subscribing, clearing retained messages
//! that should not be retained, and the loop that reads what the broker
//! delivers and hands it to the handler, each node within its budget.

use std::time::Duration;

use rumqttc::{Event, EventLoop, Packet, QoS, SubscribeFilter};
use starling_proto::limits::MAX_MESSAGE_BYTES;
use starling_proto::Channel;
use tokio::sync::{mpsc, watch};

use super::ingest::{Ingest, Received, CONSUMED_CHANNELS};
use crate::counters::Counters;
use crate::task::unix_now_ms;

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
        clear_retained(ingest, topic);
    }
}

/// Clears the retained message of `topic` (an empty retained message).
fn clear_retained(ingest: &Ingest, topic: &str) {
    if let Err(error) = ingest
        .mqtt
        .try_publish(topic, QoS::AtLeastOnce, true, Vec::new())
    {
        tracing::warn!(%error, topic, "cannot clear a retained message");
    }
}

/// How often a line about dropped messages is written at most.
const DROP_LOG_WINDOW: Duration = Duration::from_secs(10);

/// Why a message was dropped at ingest.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Dropped {
    /// Its node was over its budget on that channel.
    OverBudget,
    /// Telemetry or an event that found the handler's queue full.
    Backlog,
    /// Larger than any message Starling sends (a broker without the packet
    /// limit let it through); a retained one is cleared.
    Oversize,
}

/// Messages dropped at ingest since the last line about them.
struct Drops {
    since: tokio::time::Instant,
    counts: [u64; 3],
    last_node: String,
}

impl Drops {
    fn new() -> Self {
        Self {
            since: tokio::time::Instant::now(),
            counts: [0; 3],
            last_node: String::new(),
        }
    }

    /// Counts one dropped message (on `/metrics` at once; in the log once a
    /// window, however many, and at once for the first of a window).
    fn drop(&mut self, ingest: &Ingest, node: &str, why: Dropped) {
        let (slot, counter) = match why {
            Dropped::OverBudget => (0, &ingest.counters.messages_dropped_over_budget),
            Dropped::Backlog => (1, &ingest.counters.messages_dropped_backlog),
            Dropped::Oversize => (2, &ingest.counters.messages_dropped_oversize),
        };
        Counters::increment(counter);
        let first = self.counts.iter().all(|count| *count == 0);
        self.counts[slot] += 1;
        node.clone_into(&mut self.last_node);
        if first || self.since.elapsed() >= DROP_LOG_WINDOW {
            let [over_budget, backlog, oversize] = self.counts;
            tracing::warn!(
                over_budget,
                backlog,
                oversize,
                last_node = %self.last_node,
                "MQTT messages dropped at ingest: nodes over their per-channel budget, telemetry and events while the queue was full (agents send events again until acknowledged), or messages over the protocol's size limit (a retained one is cleared)"
            );
            if !first {
                *self = Self::new();
            }
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
                let sender = ingest.topics.parse(&publish.topic);
                if publish.payload.len() > MAX_MESSAGE_BYTES {
                    // Read (the client reads up to MAX_INCOMING_PACKET_BYTES
                    // so that it is not a connection error, again at every
                    // reconnect), refused, and, when the broker keeps it,
                    // cleared.
                    if publish.retain {
                        clear_retained(&ingest, &publish.topic);
                    }
                    let node = sender.as_ref().map_or("?", |(node, _)| node.as_str());
                    drops.drop(&ingest, node, Dropped::Oversize);
                    continue;
                }
                if publish.retain && !publish.payload.is_empty() {
                    clear_unwanted_retained(&ingest, &publish.topic);
                }
                let now_ms = unix_now_ms();
                if let Some((node, channel)) = &sender {
                    if !budgets.admit(node.as_str(), *channel, now_ms) {
                        drops.drop(&ingest, node.as_str(), Dropped::OverBudget);
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
                                drops.drop(&ingest, node.as_str(), Dropped::Backlog);
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
                if matches!(
                    error,
                    rumqttc::ConnectionError::MqttState(rumqttc::StateError::Deserialization(
                        rumqttc::mqttbytes::Error::PayloadSizeLimitExceeded(_)
                    ))
                ) {
                    tracing::error!(%error, "the broker delivers a message larger than the coordinator reads (16 MiB); set max_packet_size (Mosquitto) on the broker to what Starling sends, and clear the retained message; retrying in 1 s");
                } else {
                    tracing::warn!(%error, "MQTT connection error; retrying in 1 s");
                }
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                    _ = stop.wait_for(|stopped| *stopped) => break,
                }
            }
        }
    }
}
