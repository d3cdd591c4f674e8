//! Who sent a report: the rules that open a node's signed report before any
//! state changes, and the high-water marks that make a replay worthless.
//!
//! A node that enrolled with a report key must sign every report with it
//! (`starling_proto::SignedReport`); the signature covers the node, the report
//! channel, a counter and the message, so a report cannot be moved to another
//! node's topic, to another channel, or be sent again once a higher counter
//! was accepted. A node without a key (enrolled before reports were signed,
//! or on a development broker) is heard unsigned only when the coordinator
//! allows it. Pure: no I/O, no clock; the caller keeps the marks durable.

use std::borrow::Cow;
use std::collections::HashMap;

use starling_proto::{
    counter_admitted, decode, Channel, NodeId, ReportChannel, ReportSignatureError, SignedReport,
};

/// Why a report was refused. Nothing changed when one of these is returned.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReportRefused {
    /// The node has a key, but the payload is not a signed report.
    #[error("node {node} signs its reports, but this one is not a signed report ({detail})")]
    NotSigned {
        /// The node in the topic.
        node: String,
        /// What did not decode.
        detail: String,
    },
    /// The node has no key, and unsigned reports are not allowed.
    #[error("node {node} has no report key and this coordinator requires signed reports; revoke it and enroll it again")]
    NoKey {
        /// The node in the topic.
        node: String,
    },
    /// The report names another node than its topic.
    #[error("a report signed as node {signer} on the topic of node {node}")]
    OtherNode {
        /// The node in the topic.
        node: String,
        /// The node the report names.
        signer: String,
    },
    /// The report's kind does not travel on the topic's channel.
    #[error("a {channel:?} report on the {topic} topic of node {node}")]
    WrongChannel {
        /// The node in the topic.
        node: String,
        /// The report's kind.
        channel: ReportChannel,
        /// The topic's channel.
        topic: &'static str,
    },
    /// The signature does not verify with the node's key.
    #[error("report from node {node}: {source}")]
    Signature {
        /// The node in the topic.
        node: String,
        /// What failed.
        #[source]
        source: ReportSignatureError,
    },
    /// The counter is not above what was accepted on the channel.
    #[error("report {counter} on {channel:?} from node {node} is a replay: counters up to {mark} were accepted")]
    Replay {
        /// The node in the topic.
        node: String,
        /// The report's kind.
        channel: ReportChannel,
        /// Its counter.
        counter: u64,
        /// The highest accepted.
        mark: u64,
    },
}

impl ReportRefused {
    /// A short name for the refusal, the `reason` label on `/metrics`.
    pub fn reason(&self) -> &'static str {
        match self {
            ReportRefused::NotSigned { .. } => "unsigned",
            ReportRefused::NoKey { .. } => "no_key",
            ReportRefused::OtherNode { .. } => "other_node",
            ReportRefused::WrongChannel { .. } => "wrong_channel",
            ReportRefused::Signature { .. } => "signature",
            ReportRefused::Replay { .. } => "replay",
        }
    }

    /// Every reason, for exporting zeros before the first refusal.
    pub const REASONS: [&'static str; 6] = [
        "unsigned",
        "no_key",
        "other_node",
        "wrong_channel",
        "signature",
        "replay",
    ];
}

/// What the coordinator knows of a report's sender.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sender {
    /// The node signs with this key.
    Keyed([u8; 32]),
    /// The node has no key; its unsigned reports are heard only when `true`.
    Unkeyed {
        /// Whether unsigned reports are allowed (a development broker).
        accept_unsigned: bool,
    },
}

/// A report whose sender is proven (or, for an unkeyed node, allowed).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Opened<'a> {
    /// The message, still encoded.
    pub message: Cow<'a, [u8]>,
    /// The report's kind and counter, to raise the mark with once applied;
    /// `None` for an unsigned report.
    pub counted: Option<(ReportChannel, u64)>,
}

/// Whether a counter is admitted on `channel` above `mark`. A retained
/// capability or status (and the last will) is handed out again by the broker
/// at every subscription, so one delivered as retained may repeat the mark: a
/// node never signs two reports with one counter, so it is the same report.
pub fn admitted(mark: Option<u64>, counter: u64, redelivered_retained: bool) -> bool {
    counter_admitted(mark, counter) || (redelivered_retained && mark == Some(counter))
}

/// Opens the report `payload` received on node `node`'s `topic` channel.
/// `mark` gives the highest counter accepted from the node on a report
/// channel; `retained` says the broker delivered it as a retained message.
pub fn open_report<'a>(
    node: &NodeId,
    topic: Channel,
    payload: &'a [u8],
    retained: bool,
    sender: Sender,
    mark: impl Fn(ReportChannel) -> Option<u64>,
) -> Result<Opened<'a>, ReportRefused> {
    let key = match sender {
        Sender::Keyed(key) => key,
        Sender::Unkeyed {
            accept_unsigned: true,
        } => {
            return Ok(Opened {
                message: Cow::Borrowed(payload),
                counted: None,
            })
        }
        Sender::Unkeyed {
            accept_unsigned: false,
        } => {
            return Err(ReportRefused::NoKey {
                node: node.to_string(),
            })
        }
    };
    let report: SignedReport = decode(payload).map_err(|error| ReportRefused::NotSigned {
        node: node.to_string(),
        detail: error.to_string(),
    })?;
    if report.node_id != *node {
        return Err(ReportRefused::OtherNode {
            node: node.to_string(),
            signer: report.node_id.to_string(),
        });
    }
    if report.channel.topic() != topic {
        return Err(ReportRefused::WrongChannel {
            node: node.to_string(),
            channel: report.channel,
            topic: topic.as_str(),
        });
    }
    report
        .verify(&key)
        .map_err(|source| ReportRefused::Signature {
            node: node.to_string(),
            source,
        })?;
    let high = mark(report.channel);
    let retained_kind = matches!(
        report.channel,
        ReportChannel::Capability | ReportChannel::Status | ReportChannel::Will
    );
    if !admitted(high, report.counter, retained && retained_kind) {
        return Err(ReportRefused::Replay {
            node: node.to_string(),
            channel: report.channel,
            counter: report.counter,
            mark: high.unwrap_or(0),
        });
    }
    Ok(Opened {
        counted: Some((report.channel, report.counter)),
        message: Cow::Owned(report.message),
    })
}

/// The report channel's name in the store and on `/metrics`.
pub fn channel_name(channel: ReportChannel) -> &'static str {
    match channel {
        ReportChannel::Capability => "capability",
        ReportChannel::Telemetry => "telemetry",
        ReportChannel::Status => "status",
        ReportChannel::Will => "will",
        ReportChannel::Events => "events",
    }
}

/// The report channel a stored name stands for.
pub fn channel_named(name: &str) -> Option<ReportChannel> {
    ReportChannel::ALL
        .into_iter()
        .find(|channel| channel_name(*channel) == name)
}

/// The highest counter accepted per node and report channel.
///
/// Telemetry marks are kept in memory only (a sample a second per node is
/// too many writes); after a restart a node's telemetry mark starts at the
/// highest of its other marks, which the shared counter of the node has
/// passed by then, so only telemetry sent since its last durable report could
/// be replayed, once.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ReportMarks {
    marks: HashMap<(NodeId, ReportChannel), u64>,
}

impl ReportMarks {
    /// Marks loaded from the store: `(node, channel, counter)`; rows that do
    /// not parse are skipped (the node's next report sets them again).
    pub fn load(rows: impl IntoIterator<Item = (String, String, u64)>) -> Self {
        let mut marks = ReportMarks::default();
        for (node, channel, counter) in rows {
            if let (Ok(node), Some(channel)) = (NodeId::new(&node), channel_named(&channel)) {
                marks.raise(&node, channel, counter);
                let telemetry = marks
                    .marks
                    .entry((node, ReportChannel::Telemetry))
                    .or_insert(0);
                *telemetry = (*telemetry).max(counter);
            }
        }
        marks
    }

    /// The highest counter accepted from `node` on `channel`.
    pub fn get(&self, node: &NodeId, channel: ReportChannel) -> Option<u64> {
        self.marks.get(&(node.clone(), channel)).copied()
    }

    /// Raises the mark (never lowers it). Returns whether it should be made
    /// durable: every channel but telemetry.
    pub fn raise(&mut self, node: &NodeId, channel: ReportChannel, counter: u64) -> bool {
        let mark = self.marks.entry((node.clone(), channel)).or_insert(counter);
        *mark = (*mark).max(counter);
        channel != ReportChannel::Telemetry
    }

    /// Forgets a node's marks: it enrolled again, with a new key.
    pub fn forget(&mut self, node: &NodeId) {
        self.marks.retain(|(marked, _), _| marked != node);
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use ed25519_dalek::SigningKey;
    use starling_proto::encode;

    use super::*;

    fn key(seed: u8) -> SigningKey {
        SigningKey::from_bytes(&[seed; 32])
    }

    fn node(id: &str) -> NodeId {
        NodeId::new(id).unwrap()
    }

    fn signed(signer: &str, channel: ReportChannel, counter: u64, message: &[u8]) -> Vec<u8> {
        encode(&SignedReport::sign(
            &key(1),
            node(signer),
            channel,
            counter,
            message.to_vec(),
        ))
        .unwrap()
    }

    fn keyed() -> Sender {
        Sender::Keyed(key(1).verifying_key().to_bytes())
    }

    fn open(
        topic: Channel,
        payload: &[u8],
        retained: bool,
        sender: Sender,
        mark: Option<u64>,
    ) -> Result<Opened<'_>, ReportRefused> {
        open_report(&node("pi-1"), topic, payload, retained, sender, |_| mark)
    }

    #[test]
    fn a_signed_report_opens_to_its_message_and_counter() {
        let payload = signed("pi-1", ReportChannel::Events, 10, b"event");
        let opened = open(Channel::Events, &payload, false, keyed(), Some(9)).unwrap();
        assert_eq!(opened.message.as_ref(), b"event");
        assert_eq!(opened.counted, Some((ReportChannel::Events, 10)));
    }

    #[test]
    fn each_forgery_is_refused_with_its_reason() {
        // What is sent, on which topic, by whom, above which mark: refused why.
        type Case = (Vec<u8>, Channel, Sender, Option<u64>, &'static str);
        let cases: Vec<Case> = vec![
            // Another node's raw message on a keyed node's topic.
            (
                b"not a report".to_vec(),
                Channel::Events,
                keyed(),
                None,
                "unsigned",
            ),
            // Signed by pi-2 (with pi-1's key even), put on pi-1's topic.
            (
                signed("pi-2", ReportChannel::Events, 5, b"x"),
                Channel::Events,
                keyed(),
                None,
                "other_node",
            ),
            // A telemetry report moved to the events topic.
            (
                signed("pi-1", ReportChannel::Telemetry, 5, b"x"),
                Channel::Events,
                keyed(),
                None,
                "wrong_channel",
            ),
            // Signed with another key.
            (
                signed("pi-1", ReportChannel::Events, 5, b"x"),
                Channel::Events,
                Sender::Keyed(key(2).verifying_key().to_bytes()),
                None,
                "signature",
            ),
            // Replayed: the mark is at the counter already.
            (
                signed("pi-1", ReportChannel::Events, 5, b"x"),
                Channel::Events,
                keyed(),
                Some(5),
                "replay",
            ),
            (
                signed("pi-1", ReportChannel::Events, 4, b"x"),
                Channel::Events,
                keyed(),
                Some(5),
                "replay",
            ),
            // Unsigned from a node without a key where that is not allowed.
            (
                b"raw".to_vec(),
                Channel::Status,
                Sender::Unkeyed {
                    accept_unsigned: false,
                },
                None,
                "no_key",
            ),
        ];
        for (payload, topic, sender, mark, reason) in cases {
            let refused = open(topic, &payload, false, sender, mark).unwrap_err();
            assert_eq!(refused.reason(), reason, "{refused}");
            assert!(ReportRefused::REASONS.contains(&reason));
        }
    }

    #[test]
    fn the_will_travels_on_the_status_topic_with_its_own_mark() {
        let will = signed("pi-1", ReportChannel::Will, 3, b"offline");
        let opened = open_report(
            &node("pi-1"),
            Channel::Status,
            &will,
            false,
            keyed(),
            |channel| (channel == ReportChannel::Status).then_some(100),
        )
        .unwrap();
        assert_eq!(opened.counted, Some((ReportChannel::Will, 3)));
    }

    #[test]
    fn only_a_retained_redelivery_may_repeat_the_mark_of_a_retained_kind() {
        let status = signed("pi-1", ReportChannel::Status, 7, b"online");
        assert!(open(Channel::Status, &status, true, keyed(), Some(7)).is_ok());
        assert_eq!(
            open(Channel::Status, &status, false, keyed(), Some(7))
                .unwrap_err()
                .reason(),
            "replay"
        );
        // Events are never retained: an equal counter is a replay.
        let event = signed("pi-1", ReportChannel::Events, 7, b"e");
        assert!(open(Channel::Events, &event, true, keyed(), Some(7)).is_err());
        assert!(!admitted(Some(7), 6, true));
    }

    #[test]
    fn unsigned_reports_pass_only_where_allowed() {
        let opened = open(
            Channel::Telemetry,
            b"raw",
            false,
            Sender::Unkeyed {
                accept_unsigned: true,
            },
            None,
        )
        .unwrap();
        assert_eq!(opened.message.as_ref(), b"raw");
        assert_eq!(opened.counted, None);
    }

    #[test]
    fn marks_rise_only_and_telemetry_starts_at_the_durable_ones_after_a_restart() {
        let pi = node("pi-1");
        let mut marks = ReportMarks::load([
            ("pi-1".to_string(), "events".to_string(), 50),
            ("pi-1".to_string(), "status".to_string(), 40),
            ("pi-1".to_string(), "nonsense".to_string(), 99),
            ("bad/id".to_string(), "events".to_string(), 99),
        ]);
        assert_eq!(marks.get(&pi, ReportChannel::Events), Some(50));
        assert_eq!(marks.get(&pi, ReportChannel::Telemetry), Some(50));
        assert_eq!(marks.get(&pi, ReportChannel::Capability), None);
        assert!(marks.raise(&pi, ReportChannel::Events, 60));
        assert!(marks.raise(&pi, ReportChannel::Events, 55));
        assert_eq!(marks.get(&pi, ReportChannel::Events), Some(60));
        assert!(!marks.raise(&pi, ReportChannel::Telemetry, 70));
        marks.forget(&pi);
        assert_eq!(marks.get(&pi, ReportChannel::Events), None);
        for channel in ReportChannel::ALL {
            assert_eq!(channel_named(channel_name(channel)), Some(channel));
        }
    }
}
