//! The node's report key and the sealer that signs every report with it.
//!
//! The key is ed25519, made on the node when it enrolls; only its public half
//! leaves the node (in the enrollment request). From then on every report the
//! node publishes (capability, telemetry, status, events and its last will)
//! travels in a [`SignedReport`], so the coordinator can tell the node's own
//! words from anything another client, or a broker, puts on its topics.
//!
//! The counter that orders a node's reports is [`ReportCounter`]: it follows
//! Unix microseconds and never runs below the block reserved in
//! `<data-dir>/report.counter`, so a node whose clock is set back after a
//! reboot still counts upwards.

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use ed25519_dalek::SigningKey;
use starling_proto::{
    encode, EncodeError, NodeId, ReportChannel, ReportCounter, SignedReport, Topics,
};

use crate::session::Outgoing;

/// The report key's file inside the data directory: the 32-byte secret as 64
/// hex digits, mode 0600.
pub const REPORT_KEY_FILE: &str = "report.key";

/// The persisted counter reservation inside the data directory.
pub const REPORT_COUNTER_FILE: &str = "report.counter";

/// Why the report key could not be made, read or used.
#[derive(Debug, thiserror::Error)]
pub enum ReportKeyError {
    /// The operating system gave no random bytes.
    #[error("cannot draw random bytes for the node's report key: {0}")]
    Random(String),
    /// The key file exists but is not a key.
    #[error("cannot read the report key {path}: {detail}; delete it and credentials.json from the data directory, and enroll again with a new join token")]
    Read {
        /// The file.
        path: PathBuf,
        /// What was wrong.
        detail: String,
    },
    /// The key file could not be written.
    #[error("cannot write the report key {path}: {source}")]
    Write {
        /// The file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
}

/// Where the report key lives for `data_dir`.
pub fn key_path(data_dir: &Path) -> PathBuf {
    data_dir.join(REPORT_KEY_FILE)
}

/// Makes a fresh report key and keeps it in `data_dir`, replacing any: a
/// node that enrolls again gets a new key, and the coordinator forgets the
/// old one with the old credentials.
pub fn create(data_dir: &Path) -> Result<SigningKey, ReportKeyError> {
    let mut secret = [0u8; 32];
    getrandom::fill(&mut secret).map_err(|error| ReportKeyError::Random(error.to_string()))?;
    let path = key_path(data_dir);
    let mut text = hex::encode(secret);
    text.push('\n');
    crate::private_file::write(&path, text.as_bytes())
        .map_err(|source| ReportKeyError::Write { path, source })?;
    Ok(SigningKey::from_bytes(&secret))
}

/// The report key kept in `data_dir`; `None` when there is none (a node that
/// enrolled before reports were signed, or one that never enrolled).
pub fn load(data_dir: &Path) -> Result<Option<SigningKey>, ReportKeyError> {
    let path = key_path(data_dir);
    let text = match std::fs::read_to_string(&path) {
        Ok(text) => text,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(error) => {
            return Err(ReportKeyError::Read {
                path,
                detail: error.to_string(),
            })
        }
    };
    let bad = |detail: String| ReportKeyError::Read {
        path: path.clone(),
        detail,
    };
    let bytes = hex::decode(text.trim()).map_err(|error| bad(error.to_string()))?;
    let secret: [u8; 32] = bytes
        .try_into()
        .map_err(|bytes: Vec<u8>| bad(format!("{} bytes where the key has 32", bytes.len())))?;
    Ok(Some(SigningKey::from_bytes(&secret)))
}

/// The public half of `key`, as 64 hex digits: what enrollment sends.
pub fn public_hex(key: &SigningKey) -> String {
    hex::encode(key.verifying_key().to_bytes())
}

/// Signs the node's reports, or passes them through unsigned for a node
/// without a report key (a development broker without enrollment).
#[derive(Debug)]
pub struct ReportSealer {
    topics: Topics,
    signer: Option<Mutex<Signer>>,
}

#[derive(Debug)]
struct Signer {
    key: SigningKey,
    node_id: NodeId,
    counter: ReportCounter,
    counter_path: PathBuf,
}

fn unix_micros() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |elapsed| {
            u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX)
        })
}

impl ReportSealer {
    /// A sealer that signs nothing.
    pub fn unsigned(topics: Topics) -> Self {
        Self {
            topics,
            signer: None,
        }
    }

    /// A sealer that signs as `node_id` with `key`, resuming the counter
    /// reserved in `data_dir`.
    pub fn signing(data_dir: &Path, node_id: NodeId, topics: Topics, key: SigningKey) -> Self {
        let counter_path = data_dir.join(REPORT_COUNTER_FILE);
        // A missing or unreadable reservation costs nothing lasting: the
        // counter never runs below the clock.
        let persisted = std::fs::read_to_string(&counter_path)
            .ok()
            .and_then(|text| text.trim().parse::<u64>().ok())
            .unwrap_or(0);
        Self {
            topics,
            signer: Some(Mutex::new(Signer {
                key,
                node_id,
                counter: ReportCounter::resume(persisted),
                counter_path,
            })),
        }
    }

    /// Whether reports leave signed.
    pub fn is_signing(&self) -> bool {
        self.signer.is_some()
    }

    /// `message` (already encoded) as it goes on the wire for `channel`:
    /// a signed report, or the message itself without a key.
    pub fn seal_as(
        &self,
        channel: ReportChannel,
        message: Vec<u8>,
    ) -> Result<Vec<u8>, EncodeError> {
        let Some(signer) = &self.signer else {
            return Ok(message);
        };
        let mut signer = signer
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let issued = signer.counter.issue(unix_micros());
        if let Some(reserve) = issued.reserve {
            // The reservation must be on disk before a counter from it
            // leaves the node. Once per block (ten minutes), a few bytes.
            if let Err(error) =
                crate::private_file::write(&signer.counter_path, format!("{reserve}\n").as_bytes())
            {
                tracing::warn!(%error, path = %signer.counter_path.display(),
                    "cannot keep the report counter; after a restart with the clock set back, the coordinator may refuse reports until the clock passes it");
            }
        }
        let signed = SignedReport::sign(
            &signer.key,
            signer.node_id.clone(),
            channel,
            issued.counter,
            message,
        );
        encode(&signed)
    }

    /// `outgoing` sealed for the report channel its topic names; anything
    /// that is not one of the node's report topics goes out as it is.
    pub fn seal(&self, outgoing: Outgoing) -> Result<Outgoing, EncodeError> {
        let channel = self
            .topics
            .parse(&outgoing.topic)
            .and_then(|(_, channel)| ReportChannel::published_on(channel));
        let Some(channel) = channel else {
            return Ok(outgoing);
        };
        Ok(Outgoing {
            payload: self.seal_as(channel, outgoing.payload)?,
            ..outgoing
        })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use starling_proto::{decode, Channel, NodeState, Status, PROTOCOL_VERSION};

    use super::*;

    fn node() -> NodeId {
        NodeId::new("pi-1").unwrap()
    }

    fn status_outgoing(topics: &Topics) -> Outgoing {
        let status = Status {
            v: PROTOCOL_VERSION,
            node_id: node(),
            state: NodeState::Online,
        };
        Outgoing {
            topic: topics.node(&node(), Channel::Status),
            payload: encode(&status).unwrap(),
            qos: rumqttc::QoS::AtLeastOnce,
            retain: true,
        }
    }

    #[test]
    fn a_created_key_loads_back_and_is_private() {
        let dir = tempfile::tempdir().unwrap();
        assert!(load(dir.path()).unwrap().is_none());
        let key = create(dir.path()).unwrap();
        let loaded = load(dir.path()).unwrap().unwrap();
        assert_eq!(loaded.to_bytes(), key.to_bytes());
        assert_eq!(public_hex(&key).len(), 64);
        // Enrolling again makes another key.
        let again = create(dir.path()).unwrap();
        assert_ne!(again.to_bytes(), key.to_bytes());
    }

    #[test]
    fn a_damaged_key_file_is_a_clear_error() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(key_path(dir.path()), "abcd\n").unwrap();
        let error = load(dir.path()).unwrap_err().to_string();
        assert!(error.contains("2 bytes where the key has 32"), "{error}");
        assert!(error.contains("enroll again"), "{error}");
    }

    #[test]
    fn sealed_reports_verify_with_the_public_key_and_count_upwards_across_restarts() {
        let dir = tempfile::tempdir().unwrap();
        let topics = Topics::new("starling").unwrap();
        let key = create(dir.path()).unwrap();
        let public = key.verifying_key().to_bytes();
        let sealer = ReportSealer::signing(dir.path(), node(), topics.clone(), key.clone());
        assert!(sealer.is_signing());
        let plain = status_outgoing(&topics);
        let first: SignedReport = decode(&sealer.seal(plain.clone()).unwrap().payload).unwrap();
        let second: SignedReport = decode(&sealer.seal(plain.clone()).unwrap().payload).unwrap();
        assert_eq!(first.channel, ReportChannel::Status);
        assert_eq!(first.message, plain.payload);
        first.verify(&public).unwrap();
        assert!(second.counter > first.counter);
        let reserved: u64 = std::fs::read_to_string(dir.path().join(REPORT_COUNTER_FILE))
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        assert!(reserved > second.counter);
        // A restarted sealer resumes above the reservation even when the
        // clock is far behind it (a Pi without a battery-backed clock).
        std::fs::write(
            dir.path().join(REPORT_COUNTER_FILE),
            format!("{}\n", u64::MAX / 2),
        )
        .unwrap();
        let restarted = ReportSealer::signing(dir.path(), node(), topics, key);
        let third: SignedReport = decode(&restarted.seal(plain).unwrap().payload).unwrap();
        assert!(third.counter >= u64::MAX / 2);
    }

    #[test]
    fn without_a_key_reports_pass_unsigned_and_the_will_is_its_own_channel() {
        let topics = Topics::new("starling").unwrap();
        let plain = status_outgoing(&topics);
        let unsigned = ReportSealer::unsigned(topics.clone());
        assert!(!unsigned.is_signing());
        assert_eq!(unsigned.seal(plain.clone()).unwrap(), plain);
        let dir = tempfile::tempdir().unwrap();
        let key = create(dir.path()).unwrap();
        let sealer = ReportSealer::signing(dir.path(), node(), topics, key);
        let will: SignedReport =
            decode(&sealer.seal_as(ReportChannel::Will, plain.payload).unwrap()).unwrap();
        assert_eq!(will.channel, ReportChannel::Will);
    }
}
