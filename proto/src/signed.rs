//! Reports that prove their sender: the envelope every node → coordinator
//! message travels in once nodes hold an enrollment key.
//!
//! A broker that lets one client publish on another's topic must not let it
//! speak for that node. So the node signs each report with the ed25519 key it
//! generated at enrollment, and the signature covers the node id, the channel,
//! a per-node counter and the encoded message (see
//! [`SignedReport::signed_bytes`]): a report cannot be moved to another node's
//! topic, replayed as another kind of message, or replayed at all once the
//! receiver has seen a higher counter on that channel.
//!
//! The module does no I/O and reads no clock: the caller picks the counter
//! and keeps the high-water marks.

use alloc::vec::Vec;

use serde::{Deserialize, Serialize};

use crate::ids::NodeId;
use crate::topic::Channel;

/// Bytes every signed report's signed bytes start with, so a report signature
/// can never be mistaken for a signature of anything else the key signs.
pub const REPORT_DOMAIN: &[u8] = b"starling/report/v1\0";

/// The kinds of report a node signs. The last will is its own kind: it is
/// signed at connect time, before the session's later reports, so it has its
/// own counter and high-water mark (docs/design/coordinator.md, "Reports prove their sender").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ReportChannel {
    /// A [`crate::Capability`], on the capability topic.
    Capability,
    /// A [`crate::Telemetry`], on the telemetry topic.
    Telemetry,
    /// A [`crate::Status`] the node publishes itself, on the status topic.
    Status,
    /// A [`crate::Status`] the broker publishes for the node (its last will),
    /// on the status topic.
    Will,
    /// A [`crate::TaskEvent`], on the events topic.
    Events,
}

impl ReportChannel {
    /// Every report channel.
    pub const ALL: [ReportChannel; 5] = [
        ReportChannel::Capability,
        ReportChannel::Telemetry,
        ReportChannel::Status,
        ReportChannel::Will,
        ReportChannel::Events,
    ];

    /// The one byte that stands for the channel in the signed bytes.
    pub fn code(self) -> u8 {
        match self {
            ReportChannel::Capability => 1,
            ReportChannel::Telemetry => 2,
            ReportChannel::Status => 3,
            ReportChannel::Will => 4,
            ReportChannel::Events => 5,
        }
    }

    /// The kind of report a node publishes itself on topic channel
    /// `channel` (never [`ReportChannel::Will`], which the broker publishes);
    /// `None` for the channels the coordinator publishes.
    pub fn published_on(channel: Channel) -> Option<ReportChannel> {
        match channel {
            Channel::Capability => Some(ReportChannel::Capability),
            Channel::Telemetry => Some(ReportChannel::Telemetry),
            Channel::Status => Some(ReportChannel::Status),
            Channel::Events => Some(ReportChannel::Events),
            Channel::Assign | Channel::Cancel | Channel::Ack => None,
        }
    }

    /// The topic channel a report of this kind travels on.
    pub fn topic(self) -> Channel {
        match self {
            ReportChannel::Capability => Channel::Capability,
            ReportChannel::Telemetry => Channel::Telemetry,
            ReportChannel::Status | ReportChannel::Will => Channel::Status,
            ReportChannel::Events => Channel::Events,
        }
    }
}

/// A node's report with its signature: the message itself travels encoded in
/// `message` and is decoded only after the signature and counter are checked.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SignedReport {
    /// Protocol version.
    pub v: u16,
    /// The node that signed the report.
    pub node_id: NodeId,
    /// What kind of report `message` is.
    pub channel: ReportChannel,
    /// The node's counter for this channel; the receiver accepts only a
    /// counter above the highest it has accepted on the channel.
    pub counter: u64,
    /// The report, encoded by [`crate::encode`].
    #[serde(with = "serde_bytes")]
    pub message: Vec<u8>,
    /// The ed25519 signature of [`SignedReport::signed_bytes`] (64 bytes).
    #[serde(with = "serde_bytes")]
    pub signature: Vec<u8>,
}

impl SignedReport {
    /// The bytes the node signs: [`REPORT_DOMAIN`], the node id's length (one
    /// byte) and bytes, the channel's code, the counter (8 bytes, big endian)
    /// and the message. Lengths are fixed or prefixed, so no two different
    /// reports share signed bytes.
    pub fn signed_bytes(&self) -> Vec<u8> {
        signed_bytes(&self.node_id, self.channel, self.counter, &self.message)
    }
}

fn signed_bytes(node_id: &NodeId, channel: ReportChannel, counter: u64, message: &[u8]) -> Vec<u8> {
    let id = node_id.as_str().as_bytes();
    let mut bytes = Vec::with_capacity(REPORT_DOMAIN.len() + 1 + id.len() + 1 + 8 + message.len());
    bytes.extend_from_slice(REPORT_DOMAIN);
    // A node id is at most NODE_ID_LEN (64) bytes, so its length fits a byte.
    bytes.push(id.len() as u8);
    bytes.extend_from_slice(id);
    bytes.push(channel.code());
    bytes.extend_from_slice(&counter.to_be_bytes());
    bytes.extend_from_slice(message);
    bytes
}

/// How many counter values a node reserves with one write of its high-water
/// mark: the agent persists a mark once per block, not once per report.
/// Counters follow Unix microseconds, so a block is ten minutes of them: a
/// node writes its mark about every ten minutes (flash wears out), and after
/// a crash with its clock set back it resumes at most ten minutes ahead.
pub const COUNTER_BLOCK: u64 = 600_000_000;

/// A node's counter for one report channel: strictly increasing for a key,
/// across restarts (it resumes from the persisted reservation) and across
/// loss of that reservation (it never runs below Unix time in microseconds,
/// which is above every counter issued earlier while the node sends less than
/// one report per microsecond on the channel).
///
/// Pure: the caller passes the time and persists what [`Issued::reserve`]
/// asks for before it sends the report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReportCounter {
    next: u64,
    reserved: u64,
}

/// One counter value, and the reservation to persist first if there is one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Issued {
    /// The counter to sign the report with.
    pub counter: u64,
    /// A new high-water mark to persist before the report leaves the node:
    /// every counter below it may have been used.
    pub reserve: Option<u64>,
}

impl ReportCounter {
    /// Resumes from the persisted reservation (0 when there is none).
    pub fn resume(persisted: u64) -> ReportCounter {
        ReportCounter {
            next: persisted,
            reserved: persisted,
        }
    }

    /// The next counter at Unix time `now_micros`.
    pub fn issue(&mut self, now_micros: u64) -> Issued {
        let counter = self.next.max(now_micros);
        self.next = counter.saturating_add(1);
        let reserve = if self.next > self.reserved {
            self.reserved = counter.saturating_add(COUNTER_BLOCK);
            Some(self.reserved)
        } else {
            None
        };
        Issued { counter, reserve }
    }
}

/// Whether a receiver that has accepted counters up to `high_water` on a
/// channel (`None`: none yet) accepts `counter`: only strictly above.
pub fn counter_admitted(high_water: Option<u64>, counter: u64) -> bool {
    high_water.is_none_or(|mark| counter > mark)
}

/// Why a signed report does not verify.
#[cfg(feature = "ed25519")]
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReportSignatureError {
    /// The node's key is not a point of the curve.
    #[error("the node's key is not an ed25519 public key")]
    NotAKey,
    /// The signature is not 64 bytes long.
    #[error("{0} bytes where an ed25519 signature has 64")]
    SignatureLength(usize),
    /// A well-formed signature by another key or over other bytes.
    #[error("the report's signature does not verify with the node's key")]
    Mismatch,
}

#[cfg(feature = "ed25519")]
impl SignedReport {
    /// Signs `message` (already encoded) as report `counter` of `node_id` on
    /// `channel`.
    pub fn sign(
        key: &ed25519_dalek::SigningKey,
        node_id: NodeId,
        channel: ReportChannel,
        counter: u64,
        message: Vec<u8>,
    ) -> SignedReport {
        use ed25519_dalek::Signer;
        let signature = key
            .sign(&signed_bytes(&node_id, channel, counter, &message))
            .to_bytes()
            .to_vec();
        SignedReport {
            v: crate::PROTOCOL_VERSION,
            node_id,
            channel,
            counter,
            message,
            signature,
        }
    }

    /// Checks the signature with the node's public key (ed25519
    /// `verify_strict`). It says nothing of the counter: the receiver compares
    /// it with its high-water mark.
    pub fn verify(&self, key: &[u8; 32]) -> Result<(), ReportSignatureError> {
        use ed25519_dalek::{Signature, VerifyingKey};
        let verifying = VerifyingKey::from_bytes(key).map_err(|_| ReportSignatureError::NotAKey)?;
        let signature = Signature::from_slice(&self.signature)
            .map_err(|_| ReportSignatureError::SignatureLength(self.signature.len()))?;
        verifying
            .verify_strict(&self.signed_bytes(), &signature)
            .map_err(|_| ReportSignatureError::Mismatch)
    }
}

#[cfg(all(test, feature = "ed25519"))]
mod tests {
    // Tests fail loudly on a broken fixture.
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use crate::{decode, encode};

    fn key(seed: u8) -> ed25519_dalek::SigningKey {
        ed25519_dalek::SigningKey::from_bytes(&[seed; 32])
    }

    fn node(id: &str) -> NodeId {
        NodeId::new(id).expect("a valid node id")
    }

    fn report() -> SignedReport {
        SignedReport::sign(
            &key(7),
            node("node-b"),
            ReportChannel::Events,
            42,
            b"event bytes".to_vec(),
        )
    }

    fn public(seed: u8) -> [u8; 32] {
        key(seed).verifying_key().to_bytes()
    }

    #[test]
    fn a_signed_report_verifies_with_its_key_and_survives_the_codec() {
        let signed = report();
        assert_eq!(signed.verify(&public(7)), Ok(()));
        let decoded: SignedReport = decode(&encode(&signed).expect("encodes")).expect("decodes");
        assert_eq!(decoded, signed);
        assert_eq!(decoded.verify(&public(7)), Ok(()));
    }

    #[test]
    fn another_key_does_not_verify() {
        assert_eq!(
            report().verify(&public(8)),
            Err(ReportSignatureError::Mismatch)
        );
    }

    #[test]
    fn a_report_moved_to_another_channel_does_not_verify() {
        for channel in ReportChannel::ALL {
            if channel == ReportChannel::Events {
                continue;
            }
            let mut moved = report();
            moved.channel = channel;
            assert_eq!(
                moved.verify(&public(7)),
                Err(ReportSignatureError::Mismatch),
                "{channel:?}"
            );
        }
    }

    #[test]
    fn a_report_moved_to_another_node_or_counter_does_not_verify() {
        let mut moved = report();
        moved.node_id = node("node-a");
        assert_eq!(
            moved.verify(&public(7)),
            Err(ReportSignatureError::Mismatch)
        );
        let mut renumbered = report();
        renumbered.counter = 43;
        assert_eq!(
            renumbered.verify(&public(7)),
            Err(ReportSignatureError::Mismatch)
        );
    }

    #[test]
    fn every_tampered_byte_of_the_message_or_signature_is_caught() {
        let signed = report();
        for index in 0..signed.message.len() {
            let mut tampered = signed.clone();
            tampered.message[index] ^= 0x01;
            assert!(tampered.verify(&public(7)).is_err(), "message byte {index}");
        }
        for index in 0..signed.signature.len() {
            let mut tampered = signed.clone();
            tampered.signature[index] ^= 0x01;
            assert!(
                tampered.verify(&public(7)).is_err(),
                "signature byte {index}"
            );
        }
        let mut short = signed;
        short.signature.pop();
        assert_eq!(
            short.verify(&public(7)),
            Err(ReportSignatureError::SignatureLength(63))
        );
    }

    #[test]
    fn signed_bytes_are_unambiguous_and_channel_codes_distinct() {
        // A node id that ends where another's counter would start must not
        // collide: the length prefix keeps them apart.
        let a = signed_bytes(&node("ab"), ReportChannel::Status, 1, b"");
        let b = signed_bytes(&node("a"), ReportChannel::Status, 1, b"");
        assert_ne!(a, b);
        let mut codes: Vec<u8> = ReportChannel::ALL.iter().map(|c| c.code()).collect();
        codes.sort_unstable();
        codes.dedup();
        assert_eq!(codes.len(), ReportChannel::ALL.len());
        assert!(a.starts_with(REPORT_DOMAIN));
    }

    #[test]
    fn counters_rise_within_a_block_and_reserve_once_per_block() {
        let mut counter = ReportCounter::resume(0);
        let first = counter.issue(1_000);
        assert_eq!(
            first,
            Issued {
                counter: 1_000,
                reserve: Some(1_000 + COUNTER_BLOCK)
            }
        );
        // A clock that stands still or steps back does not repeat a counter.
        let second = counter.issue(1_000);
        assert_eq!(
            second,
            Issued {
                counter: 1_001,
                reserve: None
            }
        );
        let third = counter.issue(500);
        assert_eq!(
            third,
            Issued {
                counter: 1_002,
                reserve: None
            }
        );
        // Past the block, the next report reserves a new one.
        let far = counter.issue(1_000 + COUNTER_BLOCK);
        assert_eq!(far.counter, 1_000 + COUNTER_BLOCK);
        assert!(far.reserve.is_some());
    }

    #[test]
    fn a_restart_resumes_above_every_counter_issued_before_it() {
        let mut before = ReportCounter::resume(0);
        let mut persisted = 0;
        let mut last = 0;
        for step in 0..10 {
            let issued = before.issue(step);
            if let Some(mark) = issued.reserve {
                persisted = mark;
            }
            last = issued.counter;
        }
        // Same clock, restarted from the persisted mark.
        let mut after = ReportCounter::resume(persisted);
        assert!(after.issue(10).counter > last);
        // Mark lost: the clock alone is above what a slow sender issued.
        let mut lost = ReportCounter::resume(0);
        assert!(lost.issue(1_000_000).counter > last);
    }

    #[test]
    fn only_counters_above_the_high_water_mark_are_admitted() {
        assert!(counter_admitted(None, 0));
        assert!(counter_admitted(Some(5), 6));
        assert!(!counter_admitted(Some(5), 5));
        assert!(!counter_admitted(Some(5), 4));
    }

    #[test]
    fn the_codec_refuses_an_envelope_without_a_whole_signature() {
        let mut signed = report();
        signed.signature.truncate(10);
        let bytes = serde_cbor::to_vec(&signed).expect("serializes");
        assert!(matches!(
            decode::<SignedReport>(&bytes),
            Err(crate::DecodeError::Invalid { .. })
        ));
        assert!(encode(&signed).is_err());
    }
}
