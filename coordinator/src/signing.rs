//! The coordinator's ed25519 key and the signing of assignments.
//!
//! Agents pin the public key at enrollment and refuse an assignment whose
//! signature does not verify, that names another node, or that is outside its
//! validity window. The key lives in the store (table `coordinator_keys`) so
//! that it survives restarts and is shared by every coordinator on one
//! database; it is generated from the OS's randomness on the first start.

use std::time::Duration;

use ed25519_dalek::{Signer as _, SigningKey, VerifyingKey, SECRET_KEY_LENGTH};
use starling_proto::{Assignment, NodeId};

use crate::store::{Store, StoreError};

/// The name of the assignment-signing key in the store.
pub const ASSIGNMENT_KEY: &str = "assignment";

/// Why the signing key could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    /// The OS gave no randomness for a new key.
    #[error("cannot generate the coordinator key: the OS randomness source failed: {0}")]
    Random(getrandom::Error),
    /// The store failed.
    #[error("cannot load the coordinator key: {0}")]
    Store(#[from] StoreError),
    /// The stored secret is not a 32-byte ed25519 secret.
    #[error(
        "the stored coordinator key is {0} bytes, not {SECRET_KEY_LENGTH}; the database is corrupt"
    )]
    Corrupt(usize),
}

/// Why an assignment could not be signed.
#[derive(Debug, thiserror::Error)]
pub enum SignError {
    /// The assignment does not encode (a field over its wire bound).
    #[error("cannot encode the assignment to sign it: {0}")]
    Encode(#[from] starling_proto::EncodeError),
}

/// Signs assignments with the coordinator's key.
#[derive(Clone)]
pub struct Signer {
    key: SigningKey,
    ttl: Duration,
}

impl std::fmt::Debug for Signer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the secret.
        f.debug_struct("Signer")
            .field("public_key", &self.public_key_hex())
            .field("ttl", &self.ttl)
            .finish()
    }
}

impl Signer {
    /// A signer from a 32-byte secret; assignments it signs are valid for `ttl`.
    pub fn from_secret(secret: [u8; SECRET_KEY_LENGTH], ttl: Duration) -> Self {
        Self {
            key: SigningKey::from_bytes(&secret),
            ttl,
        }
    }

    /// Loads the coordinator key from the store, creating it on first use.
    pub async fn load(store: &Store, ttl: Duration, now_ms: u64) -> Result<Self, KeyError> {
        let mut fresh = [0u8; SECRET_KEY_LENGTH];
        getrandom::fill(&mut fresh).map_err(KeyError::Random)?;
        let secret = store
            .coordinator_key(ASSIGNMENT_KEY, &fresh, now_ms)
            .await?;
        let secret: [u8; SECRET_KEY_LENGTH] = secret
            .as_slice()
            .try_into()
            .map_err(|_| KeyError::Corrupt(secret.len()))?;
        Ok(Self::from_secret(secret, ttl))
    }

    /// The public key agents verify with.
    pub fn verifying_key(&self) -> VerifyingKey {
        self.key.verifying_key()
    }

    /// The public key as 64 hex digits.
    pub fn public_key_hex(&self) -> String {
        hex::encode(self.verifying_key().as_bytes())
    }

    /// How long a signed assignment stays valid.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// Addresses `assignment` to `node`, opens its validity window at `now_ms`
    /// for the signer's TTL, and signs it. Every send is signed anew, so a
    /// re-sent assignment carries a fresh window.
    pub fn sign(
        &self,
        assignment: &mut Assignment,
        node: &NodeId,
        now_ms: u64,
    ) -> Result<(), SignError> {
        let ttl_ms = u64::try_from(self.ttl.as_millis()).unwrap_or(u64::MAX);
        assignment.node_id = node.clone();
        assignment.issued_unix_ms = now_ms;
        assignment.expires_unix_ms = now_ms.saturating_add(ttl_ms);
        let bytes = assignment.signed_bytes()?;
        assignment.signature = self.key.sign(&bytes).to_bytes().to_vec();
        Ok(())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use ed25519_dalek::Signature;
    use starling_proto::{Digest, ExecLimits, Grants, Runtime, TaskId, PROTOCOL_VERSION};

    fn assignment() -> Assignment {
        Assignment {
            v: PROTOCOL_VERSION,
            node_id: NodeId::new("placeholder").unwrap(),
            task_id: TaskId::new("t-1").unwrap(),
            attempt: 1,
            runtime: Runtime::Wasm,
            artifact: Digest([3; 32]),
            artifact_url: "http://127.0.0.1/a".try_into().unwrap(),
            args: heapless::Vec::new(),
            input: b"in".to_vec(),
            limits: ExecLimits::default(),
            power_level: 0,
            deadline_unix_ms: None,
            grants: Grants::default(),
            publisher: None,
            precompiled: None,
            leader_epoch: None,
            issued_unix_ms: 0,
            expires_unix_ms: 0,
            signature: Vec::new(),
        }
    }

    #[test]
    fn a_signed_assignment_verifies_and_a_changed_one_does_not() {
        let signer = Signer::from_secret([9; 32], Duration::from_secs(60));
        let node = NodeId::new("edge-1").unwrap();
        let mut signed = assignment();
        signer.sign(&mut signed, &node, 1_000).unwrap();
        assert_eq!(signed.node_id, node);
        assert_eq!(
            (signed.issued_unix_ms, signed.expires_unix_ms),
            (1_000, 61_000)
        );
        let signature = Signature::from_slice(&signed.signature).unwrap();
        let key = signer.verifying_key();
        key.verify_strict(&signed.signed_bytes().unwrap(), &signature)
            .unwrap();
        let mut other_node = signed.clone();
        other_node.node_id = NodeId::new("edge-2").unwrap();
        assert!(key
            .verify_strict(&other_node.signed_bytes().unwrap(), &signature)
            .is_err());
        let mut extended = signed.clone();
        extended.expires_unix_ms += 1;
        assert!(key
            .verify_strict(&extended.signed_bytes().unwrap(), &signature)
            .is_err());
        assert!(!format!("{signer:?}").contains("0909"));
    }
}
