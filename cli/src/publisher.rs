//! Publisher keys: an app developer's ed25519 key that signs artifact digests.
//!
//! The key file holds the 32-byte secret as 64 hex digits and is created
//! with mode 0600; the public half is what operators list with
//! `starling-agent --trusted-publisher`. The coordinator only relays
//! signatures (it checks them, stores them, and sends them in assignments);
//! it never holds a publisher's secret, so a compromised coordinator cannot
//! make a node that trusts a publisher run something the publisher did not sign.

use std::io::Write as _;
use std::path::{Path, PathBuf};

use ed25519_dalek::{Signer as _, SigningKey, SECRET_KEY_LENGTH};
use starling_proto::Digest;

use starling_api::ArtifactSignature;

/// Why a publisher key could not be made, written or read.
#[derive(Debug, thiserror::Error)]
pub enum PublisherKeyError {
    /// The OS gave no randomness.
    #[error("cannot generate a key: the OS randomness source failed: {0}")]
    Random(getrandom::Error),
    /// The file exists; keys are never overwritten.
    #[error("{0} already exists; a key is never overwritten (pick another --out, or remove it yourself)")]
    Exists(PathBuf),
    /// The file could not be written or read.
    #[error("cannot use key file {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The file does not hold 64 hex digits.
    #[error(
        "key file {0} does not hold a publisher key (64 hex digits, as starling keygen writes)"
    )]
    Malformed(PathBuf),
}

/// A new random publisher key.
pub fn generate() -> Result<SigningKey, PublisherKeyError> {
    let mut secret = [0u8; SECRET_KEY_LENGTH];
    getrandom::fill(&mut secret).map_err(PublisherKeyError::Random)?;
    Ok(SigningKey::from_bytes(&secret))
}

/// Writes `key`'s secret to a new file readable only by its owner.
pub fn write(path: &Path, key: &SigningKey) -> Result<(), PublisherKeyError> {
    let io = |source| PublisherKeyError::Io {
        path: path.to_path_buf(),
        source,
    };
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt as _;
        options.mode(0o600);
    }
    let mut file = options.open(path).map_err(|source| {
        if source.kind() == std::io::ErrorKind::AlreadyExists {
            PublisherKeyError::Exists(path.to_path_buf())
        } else {
            io(source)
        }
    })?;
    writeln!(file, "{}", hex::encode(key.to_bytes())).map_err(io)?;
    file.sync_all().map_err(io)
}

/// Reads a key file that [`write`] made.
pub fn read(path: &Path) -> Result<SigningKey, PublisherKeyError> {
    let text = std::fs::read_to_string(path).map_err(|source| PublisherKeyError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    let secret: [u8; SECRET_KEY_LENGTH] = hex::decode(text.trim())
        .ok()
        .and_then(|bytes| bytes.try_into().ok())
        .ok_or_else(|| PublisherKeyError::Malformed(path.to_path_buf()))?;
    Ok(SigningKey::from_bytes(&secret))
}

/// The public key as hex, the form `--trusted-publisher` takes.
pub fn public_hex(key: &SigningKey) -> String {
    hex::encode(key.verifying_key().as_bytes())
}

/// `key`'s signature over `digest`, in the API's form.
pub fn sign(key: &SigningKey, digest: &Digest) -> ArtifactSignature {
    ArtifactSignature {
        key: public_hex(key),
        signature: hex::encode(key.sign(&digest.0).to_bytes()),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn a_written_key_reads_back_signs_verifiably_and_is_never_overwritten() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("publisher.key");
        let key = generate().unwrap();
        write(&path, &key).unwrap();
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt as _;
            let mode = std::fs::metadata(&path).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600);
        }
        let read_back = read(&path).unwrap();
        assert_eq!(read_back.to_bytes(), key.to_bytes());
        assert!(matches!(
            write(&path, &generate().unwrap()),
            Err(PublisherKeyError::Exists(_))
        ));
        assert_eq!(read(&path).unwrap().to_bytes(), key.to_bytes());

        let digest = Digest([3; 32]);
        let signed = sign(&key, &digest);
        let wire = starling_proto::PublisherSignature {
            key: hex::decode(&signed.key).unwrap(),
            signature: hex::decode(&signed.signature).unwrap(),
        };
        wire.verify(&digest).unwrap();
        assert!(wire.verify(&Digest([4; 32])).is_err());

        std::fs::write(dir.path().join("junk.key"), "not a key").unwrap();
        assert!(matches!(
            read(&dir.path().join("junk.key")),
            Err(PublisherKeyError::Malformed(_))
        ));
    }
}
