//! The coordinator's server certificates: one for the REST API
//! (`--tls-cert`) and one for the embedded broker (`--mqtt-tls-cert`). Both
//! are read here at start, so a wrong path or a key that does not match its
//! certificate stops the coordinator with a message instead of failing the
//! first handshake.
//!
//! The rustls configuration names its crypto provider (ring) explicitly, as
//! the agent's client side does: which providers a build links depends on
//! feature unification, and rustls refuses to guess between two.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::ServerConfig;

/// A server certificate chain and its private key, as PEM files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerTls {
    /// PEM certificate chain, leaf first.
    pub cert: PathBuf,
    /// PEM private key of the leaf.
    pub key: PathBuf,
}

/// Why a server certificate cannot be used.
#[derive(Debug, thiserror::Error)]
#[error("cannot use {path} for TLS: {detail}")]
pub struct ServerTlsError {
    /// The file (or the certificate, when the pair does not match).
    pub path: PathBuf,
    /// What was wrong.
    pub detail: String,
}

impl ServerTls {
    /// A rustls server configuration serving this certificate (no client
    /// certificates asked), for HTTP/1.1.
    pub fn rustls_config(&self) -> Result<ServerConfig, ServerTlsError> {
        let bad = |path: &Path, detail: String| ServerTlsError {
            path: path.to_path_buf(),
            detail,
        };
        let chain = CertificateDer::pem_file_iter(&self.cert)
            .map_err(|e| bad(&self.cert, e.to_string()))?
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| bad(&self.cert, e.to_string()))?;
        if chain.is_empty() {
            return Err(bad(&self.cert, "no PEM certificate in it".to_string()));
        }
        let key =
            PrivateKeyDer::from_pem_file(&self.key).map_err(|e| bad(&self.key, e.to_string()))?;
        let mut config =
            ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
                .with_safe_default_protocol_versions()
                .map_err(|e| bad(&self.cert, e.to_string()))?
                .with_no_client_auth()
                .with_single_cert(chain, key)
                .map_err(|e| {
                    bad(
                        &self.key,
                        format!("{e} (does the key match the certificate?)"),
                    )
                })?;
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(config)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn a_good_pair_loads_and_bad_files_name_themselves() {
        let dir = tempfile::tempdir().unwrap();
        let pki = starling_tests::Pki::create(dir.path());
        let good = ServerTls {
            cert: pki.server_cert.clone(),
            key: pki.server_key.clone(),
        };
        let config = good.rustls_config().unwrap();
        assert_eq!(config.alpn_protocols, vec![b"http/1.1".to_vec()]);

        let missing = ServerTls {
            cert: dir.path().join("absent.pem"),
            ..good.clone()
        };
        let error = missing.rustls_config().unwrap_err();
        assert_eq!(error.path, dir.path().join("absent.pem"));

        // The client's key with the server's certificate: a mismatch.
        let mismatched = ServerTls {
            key: pki.client_key.clone(),
            ..good.clone()
        };
        let error = mismatched.rustls_config().unwrap_err();
        assert_eq!(error.path, pki.client_key);
        assert!(error.to_string().contains("match"), "{error}");

        // A key file where the certificate should be: no certificate in it.
        let swapped = ServerTls {
            cert: pki.server_key.clone(),
            ..good
        };
        let error = swapped.rustls_config().unwrap_err();
        assert!(error.to_string().contains("no PEM certificate"), "{error}");
    }
}
