//! What a sealed gossip datagram (or sync frame) holds once opened: a kind,
//! the sender's clock when it sealed it, and the body. The clock and the
//! nonce of the seal let a receiver refuse a recorded datagram played again
//! ([`ReplayGuard`]): one outside the window is stale, one inside it whose
//! nonce was seen is a replay.

use std::collections::{HashSet, VecDeque};
use std::net::SocketAddr;

use foca::{Incarnation, ProbeNumber};
use ring::aead::NONCE_LEN;
use serde::{Deserialize, Serialize};

use super::MemberId;

/// How far a datagram's clock may be from this host's, either way. Sites'
/// clocks are expected within seconds of each other (NTP); a minute leaves
/// room for a bad one without accepting old recordings for long.
pub const REPLAY_WINDOW_MS: u64 = 60_000;
/// Most nonces remembered: a flood of authenticated datagrams (only a key
/// holder can send one) evicts the oldest rather than growing memory.
const MAX_REMEMBERED: usize = 262_144;
/// Kind byte and sender's clock.
const HEADER: usize = 1 + 8;

/// What a datagram carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// foca's SWIM message.
    Swim = 0,
    /// Lifeguard: a relay could not reach the member it was asked to probe.
    Nack = 1,
    /// Lifeguard: the sender's own probe of a member failed.
    Suspect = 2,
    /// A full state sync (over TCP).
    Sync = 3,
    /// Lifeguard: the sender raised a suspicion and holds its timer, so
    /// confirmations go to it.
    Holding = 4,
}

impl Kind {
    fn from_byte(byte: u8) -> Option<Self> {
        Some(match byte {
            0 => Self::Swim,
            1 => Self::Nack,
            2 => Self::Suspect,
            3 => Self::Sync,
            4 => Self::Holding,
            _ => return None,
        })
    }
}

/// Why an opened datagram was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    /// Shorter than the header, or of an unknown kind.
    #[error("gossip payload of {0} bytes has no valid header")]
    Header(usize),
    /// Sealed too long ago, or too far ahead of this host's clock.
    #[error("gossip datagram sealed {skew_ms} ms away from this host's clock (window {REPLAY_WINDOW_MS} ms); check the sites' clocks")]
    Stale {
        /// Sender's clock minus this host's.
        skew_ms: i64,
    },
    /// Seen before: a recorded datagram played again.
    #[error("gossip datagram replayed")]
    Replayed,
}

/// The plaintext of a datagram of `kind` sealed at `now_ms`.
pub fn frame(kind: Kind, now_ms: u64, body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER + body.len());
    out.push(kind as u8);
    out.extend_from_slice(&now_ms.to_be_bytes());
    out.extend_from_slice(body);
    out
}

/// An opened datagram, split.
#[derive(Debug, PartialEq, Eq)]
pub struct Opened<'a> {
    /// What it carries.
    pub kind: Kind,
    /// The sender's clock when it sealed it (Unix ms).
    pub sent_ms: u64,
    /// The rest.
    pub body: &'a [u8],
}

/// Splits a datagram's plaintext.
pub fn parse(plain: &[u8]) -> Result<Opened<'_>, WireError> {
    let header = plain.get(..HEADER).ok_or(WireError::Header(plain.len()))?;
    let kind = Kind::from_byte(header[0]).ok_or(WireError::Header(plain.len()))?;
    let mut clock = [0u8; 8];
    clock.copy_from_slice(&header[1..]);
    Ok(Opened {
        kind,
        sent_ms: u64::from_be_bytes(clock),
        body: &plain[HEADER..],
    })
}

/// The nonce of a sealed datagram: what a replay would repeat.
pub fn nonce(sealed: &[u8]) -> Option<[u8; NONCE_LEN]> {
    sealed.get(..NONCE_LEN)?.try_into().ok()
}

/// Remembers the nonces of authenticated datagrams for as long as their
/// clock is inside the window, so each is accepted once.
#[derive(Debug, Default)]
pub struct ReplayGuard {
    seen: HashSet<[u8; NONCE_LEN]>,
    /// In arrival order, with the instant each may be forgotten.
    order: VecDeque<(u64, [u8; NONCE_LEN])>,
    /// Nonces forgotten before their time (a flood).
    pub evicted: u64,
}

impl ReplayGuard {
    /// Accepts a datagram sealed at `sent_ms` with `nonce` once, if its
    /// clock is inside the window around `now_ms`.
    pub fn check(
        &mut self,
        nonce: [u8; NONCE_LEN],
        sent_ms: u64,
        now_ms: u64,
    ) -> Result<(), WireError> {
        if sent_ms.saturating_add(REPLAY_WINDOW_MS) < now_ms
            || sent_ms > now_ms.saturating_add(REPLAY_WINDOW_MS)
        {
            let skew_ms =
                i64::try_from(i128::from(sent_ms) - i128::from(now_ms)).unwrap_or(i64::MIN);
            return Err(WireError::Stale { skew_ms });
        }
        while let Some(&(until, old)) = self.order.front() {
            if until >= now_ms && self.order.len() < MAX_REMEMBERED {
                break;
            }
            if until >= now_ms {
                self.evicted += 1;
            }
            self.order.pop_front();
            self.seen.remove(&old);
        }
        if !self.seen.insert(nonce) {
            return Err(WireError::Replayed);
        }
        // Refused as stale from then on, so no longer worth remembering.
        self.order
            .push_back((sent_ms.saturating_add(REPLAY_WINDOW_MS), nonce));
        Ok(())
    }

    /// Nonces remembered now.
    pub fn remembered(&self) -> usize {
        self.seen.len()
    }
}

/// Lifeguard's nack: `relay` asked to probe on our behalf (probe
/// `probe_number`) heard nothing back from the member in time.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Nack {
    /// The relay's gossip address.
    pub relay: SocketAddr,
    /// The requester's probe.
    pub probe_number: ProbeNumber,
}

/// Lifeguard's independent suspicion: the sender's own probe of `member`
/// (at `incarnation`) failed. Counted by members that hold a suspicion of
/// it, and sent to the member itself so it can refute at once.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Suspect {
    /// Who sends it (its gossip address).
    pub from: SocketAddr,
    /// The member suspected.
    pub member: MemberId,
    /// Its incarnation when the probe failed.
    pub incarnation: Incarnation,
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn a_frame_parses_back_and_a_bad_header_is_refused() {
        let plain = frame(Kind::Nack, 1_700_000_000_123, b"body");
        assert_eq!(
            parse(&plain).unwrap(),
            Opened {
                kind: Kind::Nack,
                sent_ms: 1_700_000_000_123,
                body: b"body"
            }
        );
        assert_eq!(parse(&plain[..5]), Err(WireError::Header(5)));
        let mut unknown = plain.clone();
        unknown[0] = 9;
        assert_eq!(parse(&unknown), Err(WireError::Header(plain.len())));
    }

    #[test]
    fn a_datagram_is_accepted_once_and_only_inside_the_window() {
        let now = 10_000_000;
        let mut guard = ReplayGuard::default();
        guard.check([1; NONCE_LEN], now - 5, now).unwrap();
        assert_eq!(
            guard.check([1; NONCE_LEN], now - 5, now + 10),
            Err(WireError::Replayed)
        );
        // Another nonce with the same clock is another datagram.
        guard.check([2; NONCE_LEN], now - 5, now + 10).unwrap();
        // Recorded long ago, or sealed by a clock far ahead.
        assert_eq!(
            guard.check([3; NONCE_LEN], now - REPLAY_WINDOW_MS - 1, now),
            Err(WireError::Stale {
                skew_ms: -(REPLAY_WINDOW_MS as i64) - 1
            })
        );
        assert!(matches!(
            guard.check([4; NONCE_LEN], now + REPLAY_WINDOW_MS + 1, now),
            Err(WireError::Stale { .. })
        ));
        // Once out of the window, a nonce is forgotten (and would be stale).
        let later = now + REPLAY_WINDOW_MS + 10;
        guard.check([5; NONCE_LEN], later, later).unwrap();
        assert_eq!(guard.remembered(), 1);
        assert_eq!(
            guard.check([1; NONCE_LEN], now - 5, later),
            Err(WireError::Stale {
                skew_ms: -(REPLAY_WINDOW_MS as i64) - 15
            })
        );
        assert_eq!(guard.evicted, 0);
    }
}
