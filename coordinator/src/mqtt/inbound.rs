//! What a node's message is, before anything changes: the topic names a node
//! and a channel under this coordinator's prefix, the node is not revoked,
//! the report is signed by that node's key for that channel and is not a
//! replay (`domain::reports`), the message decodes as that channel's, and its
//! payload names the node its topic names (the topic and the payload are both
//! the sender's words; a node may speak only for itself). No I/O: `ingest`
//! applies what this accepts.

use starling_proto::{
    decode, Capability, Channel, DecodeError, NodeId, ReportChannel, Status, TaskEvent, Telemetry,
    Topics,
};

use crate::domain::reports::{open_report, ReportRefused, Sender};
use crate::registry::RegistryError;
use crate::store::StoreError;

/// Why a message was ignored. Nothing changed when one of these is returned.
#[derive(Debug, thiserror::Error)]
pub enum IngestError {
    /// The topic is not `{prefix}/nodes/{node}/{channel}`.
    #[error("topic {0:?} is not a Starling node topic under this coordinator's prefix")]
    ForeignTopic(String),
    /// The node's credentials were revoked (`starling node revoke`).
    #[error("message from revoked node {0}; ignored")]
    RevokedNode(String),
    /// A channel the coordinator publishes but does not consume.
    #[error("message on {topic:?}: the coordinator does not consume the {channel} channel")]
    UnexpectedChannel {
        /// The topic.
        topic: String,
        /// The channel.
        channel: &'static str,
    },
    /// The payload does not decode as the channel's message.
    #[error("cannot decode the {channel} message from node {node}: {source}")]
    Decode {
        /// The node in the topic.
        node: String,
        /// The channel.
        channel: &'static str,
        /// The codec's error.
        #[source]
        source: DecodeError,
    },
    /// The report does not prove it comes from the node of its topic.
    #[error(transparent)]
    Refused(#[from] ReportRefused),
    /// The registry refused the report.
    #[error(transparent)]
    Registry(#[from] RegistryError),
    /// An event names a task this coordinator does not know.
    #[error("event {state:?} for unknown task {task_id} from node {node}")]
    UnknownTask {
        /// The task id in the event.
        task_id: String,
        /// The sender.
        node: String,
        /// The event's state.
        state: starling_proto::TaskState,
    },
    /// An event's payload names another node than its topic.
    #[error("event on the topic of node {topic_node} claims to come from node {payload_node}")]
    EventNodeMismatch {
        /// The node in the topic.
        topic_node: String,
        /// The node in the payload.
        payload_node: String,
    },
    /// The store failed.
    #[error("cannot record the message: {0}")]
    Store(#[from] StoreError),
}

/// A message that passed every check, ready to apply.
// One value lives for one message at a time; boxing the events too would buy nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq)]
pub enum Inbound {
    /// An empty retained capability or status: a topic cleared by hand.
    Cleared,
    /// A node's capability report (boxed: it is by far the largest message).
    Capability(NodeId, Box<Capability>),
    /// A node's telemetry sample.
    Telemetry(NodeId, Telemetry),
    /// A node's status (online, or its last will).
    Status(NodeId, Status),
    /// A task event, sent by the node it names.
    Event(TaskEvent),
}

/// What ingest knows of the nodes that send reports.
pub trait Senders {
    /// Whether `node`'s credentials were revoked.
    fn revoked(&self, node: &NodeId) -> bool;
    /// The key `node` signs with, or whether it may report unsigned.
    fn sender(&self, node: &NodeId) -> Sender;
    /// The highest counter accepted from `node` on `channel`.
    fn mark(&self, node: &NodeId, channel: ReportChannel) -> Option<u64>;
}

/// A message that passed every check, and the report mark to raise once it
/// is applied (`None` for an unsigned report or a cleared topic).
#[derive(Debug, Clone, PartialEq)]
pub struct Accepted {
    /// The message.
    pub inbound: Inbound,
    /// The report's sender, kind and counter.
    pub counted: Option<(NodeId, ReportChannel, u64)>,
}

fn decoded<M: starling_proto::Message>(
    node: &NodeId,
    channel: Channel,
    payload: &[u8],
) -> Result<M, IngestError> {
    decode::<M>(payload).map_err(|source| IngestError::Decode {
        node: node.to_string(),
        channel: channel.as_str(),
        source,
    })
}

/// Checks one received message (`retained`: the broker handed it out as a
/// retained message). An error means the message is dropped and nothing
/// changes.
pub fn parse_inbound(
    topics: &Topics,
    topic: &str,
    payload: &[u8],
    retained: bool,
    senders: &impl Senders,
) -> Result<Accepted, IngestError> {
    let (node, channel) = topics
        .parse(topic)
        .ok_or_else(|| IngestError::ForeignTopic(topic.to_string()))?;
    if senders.revoked(&node) {
        return Err(IngestError::RevokedNode(node.to_string()));
    }
    // An empty message changes nothing: a retained topic cleared (by an
    // operator, or by the coordinator itself for telemetry and events).
    if payload.is_empty() {
        return Ok(Accepted {
            inbound: Inbound::Cleared,
            counted: None,
        });
    }
    if ReportChannel::published_on(channel).is_none() {
        return Err(IngestError::UnexpectedChannel {
            topic: topic.to_string(),
            channel: channel.as_str(),
        });
    }
    let opened = open_report(
        &node,
        channel,
        payload,
        retained,
        senders.sender(&node),
        |report| senders.mark(&node, report),
    )?;
    let inbound = parse_message(&node, channel, topic, &opened.message)?;
    Ok(Accepted {
        inbound,
        counted: opened
            .counted
            .map(|(report, counter)| (node, report, counter)),
    })
}

fn parse_message(
    node: &NodeId,
    channel: Channel,
    topic: &str,
    payload: &[u8],
) -> Result<Inbound, IngestError> {
    let node = node.clone();
    match channel {
        Channel::Capability => Ok(Inbound::Capability(
            node.clone(),
            Box::new(decoded(&node, channel, payload)?),
        )),
        Channel::Telemetry => Ok(Inbound::Telemetry(
            node.clone(),
            decoded(&node, channel, payload)?,
        )),
        Channel::Status => Ok(Inbound::Status(
            node.clone(),
            decoded(&node, channel, payload)?,
        )),
        Channel::Events => {
            let event: TaskEvent = decoded(&node, channel, payload)?;
            if event.node_id != node {
                return Err(IngestError::EventNodeMismatch {
                    topic_node: node.to_string(),
                    payload_node: event.node_id.to_string(),
                });
            }
            Ok(Inbound::Event(event))
        }
        Channel::Assign | Channel::Cancel | Channel::Ack => Err(IngestError::UnexpectedChannel {
            topic: topic.to_string(),
            channel: channel.as_str(),
        }),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use starling_proto::{encode, NodeState, TaskId, TaskState};

    use super::*;

    fn node(id: &str) -> NodeId {
        NodeId::new(id).unwrap()
    }

    fn topic(id: &str, channel: Channel) -> String {
        Topics::default().node(&node(id), channel)
    }

    /// Senders as a test sets them: revoked nodes, keyed nodes (the rest
    /// report unsigned), and marks.
    #[derive(Default)]
    struct Known {
        revoked: Vec<&'static str>,
        keys: Vec<(&'static str, [u8; 32])>,
        marks: Vec<(&'static str, ReportChannel, u64)>,
    }

    impl Senders for Known {
        fn revoked(&self, node: &NodeId) -> bool {
            self.revoked.contains(&node.as_str())
        }
        fn sender(&self, node: &NodeId) -> Sender {
            self.keys
                .iter()
                .find(|(id, _)| *id == node.as_str())
                .map_or(
                    Sender::Unkeyed {
                        accept_unsigned: true,
                    },
                    |(_, key)| Sender::Keyed(*key),
                )
        }
        fn mark(&self, node: &NodeId, channel: ReportChannel) -> Option<u64> {
            self.marks
                .iter()
                .find(|(id, marked, _)| *id == node.as_str() && *marked == channel)
                .map(|(_, _, counter)| *counter)
        }
    }

    fn parse(topic: &str, payload: &[u8]) -> Result<Inbound, IngestError> {
        parse_inbound(&Topics::default(), topic, payload, false, &Known::default())
            .map(|accepted| accepted.inbound)
    }

    fn signing_key(seed: u8) -> ed25519_dalek::SigningKey {
        ed25519_dalek::SigningKey::from_bytes(&[seed; 32])
    }

    fn sign(seed: u8, id: &str, channel: ReportChannel, counter: u64, message: &[u8]) -> Vec<u8> {
        encode(&starling_proto::SignedReport::sign(
            &signing_key(seed),
            node(id),
            channel,
            counter,
            message.to_vec(),
        ))
        .unwrap()
    }

    fn status(id: &str) -> Status {
        Status {
            v: starling_proto::PROTOCOL_VERSION,
            node_id: node(id),
            state: NodeState::Offline,
        }
    }

    fn event(id: &str) -> TaskEvent {
        TaskEvent::state(
            TaskId::new("t1").unwrap(),
            1,
            node(id),
            TaskState::Succeeded,
        )
    }

    #[test]
    fn each_consumed_channel_decodes_to_its_message() {
        let status_bytes = encode(&status("a")).unwrap();
        assert_eq!(
            parse(&topic("a", Channel::Status), &status_bytes).unwrap(),
            Inbound::Status(node("a"), status("a"))
        );
        let event_bytes = encode(&event("a")).unwrap();
        assert_eq!(
            parse(&topic("a", Channel::Events), &event_bytes).unwrap(),
            Inbound::Event(event("a"))
        );
        // A status is not a capability nor telemetry: the channel decides
        // what the payload must be.
        for channel in [Channel::Capability, Channel::Telemetry] {
            assert!(matches!(
                parse(&topic("a", channel), &status_bytes),
                Err(IngestError::Decode { .. })
            ));
        }
    }

    #[test]
    fn an_empty_message_is_a_cleared_topic_not_an_error() {
        for channel in [
            Channel::Capability,
            Channel::Status,
            Channel::Telemetry,
            Channel::Events,
        ] {
            assert_eq!(parse(&topic("a", channel), b"").unwrap(), Inbound::Cleared);
        }
    }

    #[test]
    fn a_keyed_node_is_heard_only_through_its_signed_reports() {
        let known = Known {
            keys: vec![("b", signing_key(2).verifying_key().to_bytes())],
            marks: vec![("b", ReportChannel::Events, 100)],
            ..Known::default()
        };
        let check = |topic: &str, payload: &[u8]| {
            parse_inbound(&Topics::default(), topic, payload, false, &known)
        };
        let events = topic("b", Channel::Events);
        let event_bytes = encode(&event("b")).unwrap();
        // B's own signed event, above its mark: accepted, with its counter.
        let accepted = check(
            &events,
            &sign(2, "b", ReportChannel::Events, 101, &event_bytes),
        )
        .unwrap();
        assert_eq!(accepted.inbound, Inbound::Event(event("b")));
        assert_eq!(
            accepted.counted,
            Some((node("b"), ReportChannel::Events, 101))
        );
        // A (another node, its own key) publishing B's event on B's topic:
        // unsigned, signed by A's key as B, signed as A.
        let refusals = [
            (event_bytes.clone(), "unsigned"),
            (
                sign(1, "b", ReportChannel::Events, 101, &event_bytes),
                "signature",
            ),
            (
                sign(1, "a", ReportChannel::Events, 101, &event_bytes),
                "other_node",
            ),
            // B's genuine event sent again: a replay.
            (
                sign(2, "b", ReportChannel::Events, 100, &event_bytes),
                "replay",
            ),
        ];
        for (payload, reason) in refusals {
            match check(&events, &payload) {
                Err(IngestError::Refused(refused)) => assert_eq!(refused.reason(), reason),
                other => panic!("{reason}: {other:?}"),
            }
        }
        // B's status moved to its events topic.
        let status_bytes = encode(&status("b")).unwrap();
        assert!(matches!(
            check(
                &events,
                &sign(2, "b", ReportChannel::Status, 200, &status_bytes)
            ),
            Err(IngestError::Refused(ReportRefused::WrongChannel { .. }))
        ));
        // The last will arrives on the status topic.
        let will = check(
            &topic("b", Channel::Status),
            &sign(2, "b", ReportChannel::Will, 5, &status_bytes),
        )
        .unwrap();
        assert_eq!(will.inbound, Inbound::Status(node("b"), status("b")));
    }

    #[test]
    fn a_node_cannot_report_an_event_in_another_nodes_name() {
        let forged = encode(&event("b")).unwrap();
        match parse(&topic("a", Channel::Events), &forged) {
            Err(IngestError::EventNodeMismatch {
                topic_node,
                payload_node,
            }) => assert_eq!((topic_node.as_str(), payload_node.as_str()), ("a", "b")),
            other => panic!("a forged event was accepted: {other:?}"),
        }
    }

    #[test]
    fn revoked_nodes_foreign_topics_and_outbound_channels_are_refused() {
        let bytes = encode(&status("a")).unwrap();
        let revoked = parse_inbound(
            &Topics::default(),
            &topic("a", Channel::Status),
            &bytes,
            false,
            &Known {
                revoked: vec!["a"],
                ..Known::default()
            },
        );
        assert!(matches!(revoked, Err(IngestError::RevokedNode(id)) if id == "a"));
        assert!(matches!(
            parse("other/v1/nodes/a/status", &bytes),
            Err(IngestError::ForeignTopic(_))
        ));
        for channel in [Channel::Assign, Channel::Cancel, Channel::Ack] {
            assert!(matches!(
                parse(&topic("a", channel), &bytes),
                Err(IngestError::UnexpectedChannel { .. })
            ));
        }
    }

    #[test]
    fn garbage_is_a_decode_error_naming_node_and_channel() {
        let error = parse(&topic("a", Channel::Events), &[0xff; 64]).unwrap_err();
        let text = error.to_string();
        assert!(text.contains("events") && text.contains("node a"), "{text}");
    }
}
