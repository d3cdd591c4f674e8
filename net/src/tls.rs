//! TLS client configuration for MQTT (`mqtts://`) and HTTPS, from PEM files:
//! the agent's broker and REST connections, the coordinator's own broker
//! client and the `starling` CLI all build theirs here, so every end accepts
//! the same URLs and files.
//!
//! The rustls configuration names its crypto provider (ring) explicitly
//! rather than relying on a process-wide default: which providers a build
//! links depends on feature unification across the workspace, and rustls
//! panics when it has to guess between two.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::{ClientConfig, RootCertStore};

/// PEM files for a TLS connection (an `mqtts://` broker, or a coordinator's
/// HTTPS with only the CA file).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MqttTlsFiles {
    /// CA certificates to trust for the broker; the system roots when absent.
    pub ca_file: Option<PathBuf>,
    /// A client certificate chain, for brokers that require one.
    pub client_cert: Option<PathBuf>,
    /// The client certificate's private key (PKCS#8, PKCS#1 or SEC1).
    pub client_key: Option<PathBuf>,
}

/// Why the TLS client configuration could not be built.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A PEM file could not be read or holds nothing usable.
    #[error("cannot use {what} {path}: {detail}")]
    Pem {
        /// Which file it is (CA file, client certificate, client key).
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// What was wrong.
        detail: String,
    },
    /// No CA was given and the system has no usable root certificates.
    #[error("no CA certificates to trust: the system store is empty or unreadable ({detail}); pass --mqtt-ca-file")]
    NoRoots {
        /// What loading the system store said.
        detail: String,
    },
    /// rustls refused the assembled configuration (a key that does not match
    /// the certificate, an unsupported key type).
    #[error("invalid TLS client configuration: {0}")]
    Config(#[from] rustls::Error),
}

/// Builds a rustls client configuration: the CA file's certificates (or the
/// system roots when there is none) and, when given, a client certificate.
pub fn client_config(files: &MqttTlsFiles) -> Result<ClientConfig, TlsError> {
    let mut roots = RootCertStore::empty();
    match &files.ca_file {
        Some(path) => {
            for cert in read_certificates("CA file", path)? {
                roots.add(cert).map_err(|e| TlsError::Pem {
                    what: "CA file",
                    path: path.clone(),
                    detail: e.to_string(),
                })?;
            }
        }
        None => {
            let loaded = rustls_native_certs::load_native_certs();
            let (added, _ignored) = roots.add_parsable_certificates(loaded.certs);
            if added == 0 {
                let detail = loaded
                    .errors
                    .first()
                    .map(ToString::to_string)
                    .unwrap_or_else(|| "no certificates found".to_owned());
                return Err(TlsError::NoRoots { detail });
            }
        }
    }
    let builder =
        ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()?
            .with_root_certificates(roots);
    let config = match (&files.client_cert, &files.client_key) {
        (Some(cert), Some(key)) => {
            let chain = read_certificates("client certificate", cert)?;
            let key = PrivateKeyDer::from_pem_file(key).map_err(|e| TlsError::Pem {
                what: "client key",
                path: key.clone(),
                detail: e.to_string(),
            })?;
            builder.with_client_auth_cert(chain, key)?
        }
        _ => builder.with_no_client_auth(),
    };
    Ok(config)
}

#[cfg(feature = "http")]
/// An HTTP client builder for the coordinator's REST API and artifacts: HTTPS
/// trusts `ca_file`, or the system roots without one. Plain `http://` works
/// either way; on a machine with no system roots and no CA file, `https://`
/// fails at the handshake with an unknown-issuer error.
pub fn http_client(ca_file: Option<&Path>) -> Result<reqwest::ClientBuilder, TlsError> {
    let files = MqttTlsFiles {
        ca_file: ca_file.map(Path::to_path_buf),
        ..MqttTlsFiles::default()
    };
    let builder = reqwest::Client::builder();
    match client_config(&files) {
        Ok(config) => Ok(builder.use_preconfigured_tls(config)),
        Err(TlsError::NoRoots { detail }) => {
            tracing::debug!(%detail, "no system roots: HTTPS needs a CA file");
            Ok(builder)
        }
        Err(error) => Err(error),
    }
}

#[cfg(feature = "mqtt")]
/// The rumqttc transport for a TLS connection with these files.
pub fn transport(files: &MqttTlsFiles) -> Result<rumqttc::Transport, TlsError> {
    Ok(rumqttc::Transport::Tls(rumqttc::TlsConfiguration::Rustls(
        Arc::new(client_config(files)?),
    )))
}

fn read_certificates(
    what: &'static str,
    path: &Path,
) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let bad = |detail: String| TlsError::Pem {
        what,
        path: path.to_owned(),
        detail,
    };
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| bad(e.to_string()))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| bad(e.to_string()))?;
    if certs.is_empty() {
        return Err(bad("no PEM certificate in it".to_owned()));
    }
    Ok(certs)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn missing_and_empty_files_are_named_in_the_error() {
        let dir = tempfile::tempdir().unwrap();
        let missing = MqttTlsFiles {
            ca_file: Some(dir.path().join("nope.pem")),
            ..MqttTlsFiles::default()
        };
        let error = client_config(&missing).unwrap_err().to_string();
        assert!(error.contains("nope.pem"), "{error}");
        let empty = dir.path().join("empty.pem");
        std::fs::write(&empty, "not a certificate\n").unwrap();
        let error = client_config(&MqttTlsFiles {
            ca_file: Some(empty),
            ..MqttTlsFiles::default()
        })
        .unwrap_err()
        .to_string();
        assert!(error.contains("no PEM certificate"), "{error}");
    }
}
