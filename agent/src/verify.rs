//! Checks an assignment before anything of it runs: it must be for this node,
//! signed by the coordinator key the agent pinned, and inside its validity
//! window. A refusal names the check that failed; the session reports it as a
//! `rejected` event and runs nothing.
//!
//! The checks go from cheapest to dearest (node, signature present, window,
//! then the ed25519 verification), so a flood of junk costs little. Then the
//! artifact's publisher: a signature it carries must verify over the digest,
//! and a node that trusts publishers runs only what one of them signed.

use std::time::Duration;

use ed25519_dalek::{Signature, VerifyingKey};
use starling_proto::{Assignment, Digest, NodeId, PublisherSignature};

/// How far the coordinator's clock may be ahead of the agent's.
pub const DEFAULT_CLOCK_SKEW: Duration = Duration::from_secs(60);

/// Why an assignment was refused. The display text starts with the name of
/// the failed check (`wrong node`, `unverifiable`, `unsigned`, `not yet
/// valid`, `expired`, `bad signature`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// The assignment names another node.
    #[error("wrong node: the assignment is for {addressed}, not for this node")]
    WrongNode {
        /// The node it names.
        addressed: NodeId,
    },
    /// The agent has no coordinator key to check against.
    #[error(
        "unverifiable: this agent has no coordinator key (enroll it or pass --coordinator-key)"
    )]
    NoKey,
    /// The assignment carries no signature.
    #[error("unsigned: the assignment carries no signature")]
    Unsigned,
    /// Issued further in the future than the allowed clock skew.
    #[error("not yet valid: issued at {issued_unix_ms} ms, {ahead_ms} ms ahead of this node's clock (allowed skew {skew_ms} ms)")]
    NotYetValid {
        /// When it says it was issued (Unix ms).
        issued_unix_ms: u64,
        /// How far ahead of now.
        ahead_ms: u64,
        /// The allowed skew.
        skew_ms: u64,
    },
    /// Past its validity window: old, or replayed.
    #[error("expired: valid until {expires_unix_ms} ms, {late_ms} ms ago (an old or replayed assignment)")]
    Expired {
        /// Its expiry (Unix ms).
        expires_unix_ms: u64,
        /// How long ago.
        late_ms: u64,
    },
    /// The signature does not verify against the pinned key.
    #[error("bad signature: {detail}")]
    BadSignature {
        /// What was wrong.
        detail: String,
    },
    /// The node requires a publisher signature and the artifact has none.
    #[error("unsigned artifact: this node runs only artifacts signed by a publisher it trusts, and {digest} carries no signature (starling sign)")]
    UnsignedArtifact {
        /// The artifact's digest.
        digest: String,
    },
    /// The artifact's publisher signature does not verify over its digest.
    #[error("bad publisher signature: {detail}")]
    BadPublisherSignature {
        /// What was wrong.
        detail: String,
    },
    /// Signed by a publisher this node does not trust.
    #[error("untrusted publisher: {key} is not among this node's trusted publishers")]
    UntrustedPublisher {
        /// The publisher's key, hex.
        key: String,
    },
}

impl Refusal {
    /// Whether this is the node's policy refusing an authentic assignment
    /// (the publisher checks run only once the coordinator's signature
    /// verified), rather than a forged, stale or misdirected one. The task
    /// then fails with `policy_refused` instead of waiting to be sent again.
    pub fn is_policy(&self) -> bool {
        matches!(
            self,
            Refusal::UnsignedArtifact { .. }
                | Refusal::BadPublisherSignature { .. }
                | Refusal::UntrustedPublisher { .. }
        )
    }
}

/// Checks a publisher's signature over an artifact digest; returns the
/// publisher's key. The coordinator checks a signature with this before it
/// stores it, the agent before it runs the artifact.
pub fn verify_publisher(
    publisher: &PublisherSignature,
    digest: &Digest,
) -> Result<VerifyingKey, String> {
    let key = publisher
        .verify(digest)
        .map_err(|error| error.to_string())?;
    // The key verified a signature just now, so it is a valid point.
    VerifyingKey::from_bytes(&key).map_err(|_| "the key is not an ed25519 public key".to_owned())
}

/// The checks an agent applies to every new assignment.
#[derive(Debug, Clone)]
pub struct AssignmentVerifier {
    /// The coordinator's key, pinned at enrollment (or configured).
    pub key: Option<VerifyingKey>,
    /// This node.
    pub node_id: NodeId,
    /// How far the coordinator's clock may be ahead of this node's.
    pub skew: Duration,
    /// Development only: without a key, accept assignments whose signature
    /// cannot be checked. Only the node is checked then; the window means
    /// nothing without a signature binding it.
    pub allow_unsigned: bool,
    /// Publishers whose signed artifacts run here; empty: any artifact the
    /// coordinator assigns (a signature it carries is still checked).
    pub trusted_publishers: Vec<VerifyingKey>,
}

impl AssignmentVerifier {
    /// Checks for `node_id` against `key`, with the default clock skew.
    pub fn new(node_id: NodeId, key: Option<VerifyingKey>) -> Self {
        Self {
            key,
            node_id,
            skew: DEFAULT_CLOCK_SKEW,
            allow_unsigned: false,
            trusted_publishers: Vec::new(),
        }
    }

    /// Checks `assignment` at `now_ms` (Unix ms).
    pub fn check(&self, assignment: &Assignment, now_ms: u64) -> Result<(), Refusal> {
        if assignment.node_id != self.node_id {
            return Err(Refusal::WrongNode {
                addressed: assignment.node_id.clone(),
            });
        }
        let Some(key) = &self.key else {
            return if self.allow_unsigned {
                Ok(())
            } else {
                Err(Refusal::NoKey)
            };
        };
        if assignment.signature.is_empty() {
            return Err(Refusal::Unsigned);
        }
        let skew_ms = u64::try_from(self.skew.as_millis()).unwrap_or(u64::MAX);
        if assignment.issued_unix_ms > now_ms.saturating_add(skew_ms) {
            return Err(Refusal::NotYetValid {
                issued_unix_ms: assignment.issued_unix_ms,
                ahead_ms: assignment.issued_unix_ms - now_ms,
                skew_ms,
            });
        }
        if now_ms > assignment.expires_unix_ms {
            return Err(Refusal::Expired {
                expires_unix_ms: assignment.expires_unix_ms,
                late_ms: now_ms - assignment.expires_unix_ms,
            });
        }
        let signature =
            Signature::from_slice(&assignment.signature).map_err(|_| Refusal::BadSignature {
                detail: format!(
                    "{} bytes where an ed25519 signature has 64",
                    assignment.signature.len()
                ),
            })?;
        let signed = assignment
            .signed_bytes()
            .map_err(|error| Refusal::BadSignature {
                detail: format!("cannot re-encode the assignment to check it: {error}"),
            })?;
        key.verify_strict(&signed, &signature)
            .map_err(|_| Refusal::BadSignature {
                detail: "it does not verify against the pinned coordinator key".to_owned(),
            })?;
        self.check_publisher(assignment)
    }

    /// The publisher checks, after the coordinator's signature (which covers
    /// the publisher field, so nobody can strip or swap it in transit).
    fn check_publisher(&self, assignment: &Assignment) -> Result<(), Refusal> {
        let publisher = match &assignment.publisher {
            Some(publisher) => verify_publisher(publisher, &assignment.artifact)
                .map_err(|detail| Refusal::BadPublisherSignature { detail })?,
            None if self.trusted_publishers.is_empty() => return Ok(()),
            None => {
                return Err(Refusal::UnsignedArtifact {
                    digest: assignment.artifact.to_hex(),
                })
            }
        };
        if self.trusted_publishers.is_empty() || self.trusted_publishers.contains(&publisher) {
            Ok(())
        } else {
            Err(Refusal::UntrustedPublisher {
                key: hex::encode(publisher.as_bytes()),
            })
        }
    }
}
