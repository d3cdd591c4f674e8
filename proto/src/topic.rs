//! MQTT topic names: `{prefix}/nodes/{node_id}/{channel}`, prefix
//! `starling/v1` unless configured otherwise.

use alloc::format;
use alloc::string::String;

use crate::ids::NodeId;

/// The default topic prefix.
pub const DEFAULT_PREFIX: &str = "starling/v1";

/// The per-node channels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Channel {
    /// [`crate::Capability`], agent → coordinator, retained.
    Capability,
    /// [`crate::Telemetry`], agent → coordinator.
    Telemetry,
    /// [`crate::Status`], agent → coordinator, retained; also the last will.
    Status,
    /// [`crate::Assignment`], coordinator → agent, QoS 1.
    Assign,
    /// [`crate::Cancel`], coordinator → agent, QoS 1.
    Cancel,
    /// [`crate::TaskEvent`], agent → coordinator, QoS 1.
    Events,
    /// [`crate::EventAck`], coordinator → agent, QoS 1.
    Ack,
}

impl Channel {
    /// Every channel.
    pub const ALL: [Channel; 7] = [
        Channel::Capability,
        Channel::Telemetry,
        Channel::Status,
        Channel::Assign,
        Channel::Cancel,
        Channel::Events,
        Channel::Ack,
    ];

    /// The channel's topic level.
    pub fn as_str(self) -> &'static str {
        match self {
            Channel::Capability => "capability",
            Channel::Telemetry => "telemetry",
            Channel::Status => "status",
            Channel::Assign => "assign",
            Channel::Cancel => "cancel",
            Channel::Events => "events",
            Channel::Ack => "ack",
        }
    }

    fn parse(s: &str) -> Option<Self> {
        Channel::ALL.into_iter().find(|c| c.as_str() == s)
    }
}

/// Why a topic or prefix was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TopicError {
    /// The prefix is empty, has wildcards, or starts or ends with `/`.
    #[error("topic prefix {0:?} must be non-empty, without '+', '#', or a leading/trailing '/'")]
    BadPrefix(String),
}

/// Builds and parses topic names under one prefix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Topics {
    prefix: String,
}

impl Default for Topics {
    fn default() -> Self {
        Self {
            prefix: String::from(DEFAULT_PREFIX),
        }
    }
}

impl Topics {
    /// Topics under `prefix` (for example `starling/v1` or `site-a/starling/v1`).
    pub fn new(prefix: &str) -> Result<Self, TopicError> {
        if prefix.is_empty()
            || prefix.contains(['+', '#'])
            || prefix.starts_with('/')
            || prefix.ends_with('/')
        {
            return Err(TopicError::BadPrefix(String::from(prefix)));
        }
        Ok(Self {
            prefix: String::from(prefix),
        })
    }

    /// The prefix.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The topic of one node's channel.
    pub fn node(&self, node: &NodeId, channel: Channel) -> String {
        format!("{}/nodes/{}/{}", self.prefix, node, channel.as_str())
    }

    /// The filter matching one channel of every node (`{prefix}/nodes/+/{channel}`).
    pub fn all_nodes(&self, channel: Channel) -> String {
        format!("{}/nodes/+/{}", self.prefix, channel.as_str())
    }

    /// The filter matching everything under the prefix.
    pub fn everything(&self) -> String {
        format!("{}/#", self.prefix)
    }

    /// Splits a topic into node and channel, if it is one of ours.
    pub fn parse(&self, topic: &str) -> Option<(NodeId, Channel)> {
        let rest = topic.strip_prefix(self.prefix.as_str())?;
        let rest = rest.strip_prefix("/nodes/")?;
        let (node, channel) = rest.split_once('/')?;
        Some((NodeId::new(node).ok()?, Channel::parse(channel)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn topics_round_trip() {
        let t = Topics::default();
        let n = NodeId::new("pi-1").unwrap();
        for c in Channel::ALL {
            let topic = t.node(&n, c);
            assert_eq!(t.parse(&topic), Some((n.clone(), c)));
        }
        assert_eq!(
            t.node(&n, Channel::Capability),
            "starling/v1/nodes/pi-1/capability"
        );
        assert_eq!(t.all_nodes(Channel::Events), "starling/v1/nodes/+/events");
    }

    #[test]
    fn foreign_topics_are_not_ours() {
        let t = Topics::new("site-a/starling").unwrap();
        assert_eq!(t.parse("starling/v1/nodes/x/status"), None);
        assert_eq!(t.parse("site-a/starling/nodes/x/bogus"), None);
        assert_eq!(t.parse("site-a/starling/nodes/x+y/status"), None);
        assert!(Topics::new("a/#").is_err());
        assert!(Topics::new("/a").is_err());
        assert!(Topics::new("").is_err());
    }
}
