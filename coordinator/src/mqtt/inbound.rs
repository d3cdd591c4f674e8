//! What a node's message is, before anything changes: the topic names a node
//! and a channel under this coordinator's prefix, the node is not revoked,
//! the payload decodes as that channel's message, and an event's payload
//! names the node its topic names (the topic and the payload are both the
//! sender's words; a node may speak only for itself). No I/O: `ingest`
//! applies what this accepts.

use starling_proto::{
    decode, Capability, Channel, DecodeError, NodeId, Status, TaskEvent, Telemetry, Topics,
};

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

/// Checks one received message; `revoked` says whether a node's credentials
/// were revoked. An error means the message is dropped and nothing changes.
pub fn parse_inbound(
    topics: &Topics,
    topic: &str,
    payload: &[u8],
    revoked: impl Fn(&NodeId) -> bool,
) -> Result<Inbound, IngestError> {
    let (node, channel) = topics
        .parse(topic)
        .ok_or_else(|| IngestError::ForeignTopic(topic.to_string()))?;
    if revoked(&node) {
        return Err(IngestError::RevokedNode(node.to_string()));
    }
    if payload.is_empty() && matches!(channel, Channel::Capability | Channel::Status) {
        return Ok(Inbound::Cleared);
    }
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

    fn nobody_revoked(_: &NodeId) -> bool {
        false
    }

    fn parse(topic: &str, payload: &[u8]) -> Result<Inbound, IngestError> {
        parse_inbound(&Topics::default(), topic, payload, nobody_revoked)
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
    fn an_empty_retained_capability_or_status_is_a_cleared_topic_not_an_error() {
        assert_eq!(
            parse(&topic("a", Channel::Capability), b"").unwrap(),
            Inbound::Cleared
        );
        assert_eq!(
            parse(&topic("a", Channel::Status), b"").unwrap(),
            Inbound::Cleared
        );
        assert!(matches!(
            parse(&topic("a", Channel::Telemetry), b""),
            Err(IngestError::Decode { .. })
        ));
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
            |n| n.as_str() == "a",
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
