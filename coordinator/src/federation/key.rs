//! The cluster key: every gossip datagram and state-sync frame is sealed
//! with it (ChaCha20-Poly1305, a fresh random nonce each), so only
//! coordinators holding the key join, read or speak in the gossip. A
//! datagram that does not open is dropped before any of its bytes reach the
//! gossip library. It authenticates nothing else: each site's own identity
//! (`super::identity`) signs its digests and its REST calls.

use base64::Engine;
use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, CHACHA20_POLY1305, NONCE_LEN};
use ring::rand::{SecureRandom, SystemRandom};

/// Bytes a sealed datagram adds to its payload: the nonce and the tag.
pub const SEAL_OVERHEAD: usize = NONCE_LEN + 16;

/// Binds every datagram to this protocol and version: a key shared with
/// another system cannot be used to replay its traffic here.
const AAD: &[u8] = b"starling-gossip/1";

/// Why a cluster key was refused.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    /// Not base64.
    #[error(
        "the cluster key is not base64: {0}; generate one with `starling-coordinator cluster-key`"
    )]
    Base64(String),
    /// Wrong length.
    #[error("the cluster key decodes to {0} bytes; it must be 32 (generate one with `starling-coordinator cluster-key`)")]
    Length(usize),
    /// The system's random source failed.
    #[error("the system random source failed")]
    Random,
}

/// Why a datagram was dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum OpenError {
    /// Shorter than a nonce and a tag.
    #[error("datagram of {0} bytes is too short to be sealed")]
    Short(usize),
    /// Sealed with another key, or altered on the way.
    #[error("datagram does not authenticate (another cluster key, or altered)")]
    Forged,
}

/// The shared secret of a federation.
pub struct ClusterKey {
    key: LessSafeKey,
    random: SystemRandom,
}

impl std::fmt::Debug for ClusterKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ClusterKey(…)")
    }
}

impl ClusterKey {
    /// Parses 32 bytes written in standard base64 (the form `serf keygen`
    /// prints, so one key can serve a Serf cluster in benchmarks too).
    pub fn parse(text: &str) -> Result<Self, KeyError> {
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(text.trim())
            .map_err(|error| KeyError::Base64(error.to_string()))?;
        Self::from_bytes(&bytes)
    }

    fn from_bytes(bytes: &[u8]) -> Result<Self, KeyError> {
        let unbound = UnboundKey::new(&CHACHA20_POLY1305, bytes)
            .map_err(|_| KeyError::Length(bytes.len()))?;
        Ok(Self {
            key: LessSafeKey::new(unbound),
            random: SystemRandom::new(),
        })
    }

    /// A new random key in base64.
    pub fn generate() -> Result<String, KeyError> {
        let mut bytes = [0u8; 32];
        SystemRandom::new()
            .fill(&mut bytes)
            .map_err(|_| KeyError::Random)?;
        Ok(base64::engine::general_purpose::STANDARD.encode(bytes))
    }

    /// `nonce || ciphertext || tag` of `payload`.
    pub fn seal(&self, payload: &[u8]) -> Result<Vec<u8>, KeyError> {
        let mut nonce = [0u8; NONCE_LEN];
        self.random.fill(&mut nonce).map_err(|_| KeyError::Random)?;
        let mut out = Vec::with_capacity(payload.len() + SEAL_OVERHEAD);
        out.extend_from_slice(&nonce);
        out.extend_from_slice(payload);
        let tag = self
            .key
            .seal_in_place_separate_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(AAD),
                &mut out[NONCE_LEN..],
            )
            .map_err(|_| KeyError::Random)?;
        out.extend_from_slice(tag.as_ref());
        Ok(out)
    }

    /// The payload of a sealed datagram, opened in place.
    pub fn open<'a>(&self, datagram: &'a mut [u8]) -> Result<&'a [u8], OpenError> {
        if datagram.len() < SEAL_OVERHEAD {
            return Err(OpenError::Short(datagram.len()));
        }
        let (nonce, sealed) = datagram.split_at_mut(NONCE_LEN);
        let nonce = Nonce::try_assume_unique_for_key(nonce).map_err(|_| OpenError::Forged)?;
        let plain = self
            .key
            .open_in_place(nonce, Aad::from(AAD), sealed)
            .map_err(|_| OpenError::Forged)?;
        Ok(plain)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn a_sealed_datagram_opens_with_its_key_only() {
        let key = ClusterKey::parse(&ClusterKey::generate().unwrap()).unwrap();
        let other = ClusterKey::parse(&ClusterKey::generate().unwrap()).unwrap();
        let mut sealed = key.seal(b"hello sites").unwrap();
        assert_eq!(sealed.len(), 11 + SEAL_OVERHEAD);
        let mut copy = sealed.clone();
        assert_eq!(other.open(&mut copy), Err(OpenError::Forged));
        let mut tampered = sealed.clone();
        tampered[NONCE_LEN + 3] ^= 1;
        assert_eq!(key.open(&mut tampered), Err(OpenError::Forged));
        assert_eq!(key.open(&mut [0u8; 5]), Err(OpenError::Short(5)));
        assert_eq!(key.open(&mut sealed).unwrap(), b"hello sites");
    }

    #[test]
    fn keys_of_the_wrong_size_or_not_base64_are_refused() {
        assert!(matches!(
            ClusterKey::parse("AAAA"),
            Err(KeyError::Length(3))
        ));
        assert!(matches!(
            ClusterKey::parse("not base64!"),
            Err(KeyError::Base64(_))
        ));
    }
}
