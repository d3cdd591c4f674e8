//! Signed federation REST calls. The calling site signs the target site's
//! name, the method, the path with its query, a timestamp and the SHA-256
//! of the body with its own key, and sends its certificate beside the
//! signature; the receiver checks the certificate against its trust root,
//! the revocations it knows, the timestamp against its clock and the
//! signature. The answer is the site the request speaks for: routes then
//! check that it is the site the request names.
//!
//! The target's name is signed so that a request one site receives cannot
//! be replayed to another; the timestamp bounds a replay to the same site
//! to [`MAX_SKEW_MS`], within which every federation call is idempotent
//! (a forward is keyed on its origin task, a status read changes nothing,
//! a cancel asked twice is asked once).

use base64::Engine;
use ed25519_dalek::Signature;
use sha2::{Digest as _, Sha256};

use super::{verify_labelled, Certificate, CertificateError, SiteIdentity, Trust};

/// The calling site's name.
pub const SITE_HEADER: &str = "starling-site";
/// The calling site's certificate, base64.
pub const CERTIFICATE_HEADER: &str = "starling-site-certificate";
/// When the request was signed, Unix ms.
pub const TIMESTAMP_HEADER: &str = "starling-timestamp";
/// The site's ed25519 signature of the request, base64.
pub const SIGNATURE_HEADER: &str = "starling-signature";
/// How far a request's timestamp may be from the receiver's clock.
pub const MAX_SKEW_MS: u64 = 60_000;
/// Binds a request signature to its purpose.
const REQUEST_LABEL: &[u8] = b"starling-federation-request/1\n";

/// What a site signs for one request.
fn request_message(
    target_site: &str,
    method: &str,
    path_and_query: &str,
    timestamp_ms: u64,
    body: &[u8],
) -> Vec<u8> {
    // Newlines cannot occur in a site id, a method or a request target,
    // so the fields cannot be shifted into each other.
    format!(
        "{target_site}\n{method}\n{path_and_query}\n{timestamp_ms}\n{}",
        hex::encode(Sha256::digest(body))
    )
    .into_bytes()
}

/// The four headers of a signed request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SignedRequest {
    /// [`SITE_HEADER`].
    pub site: String,
    /// [`CERTIFICATE_HEADER`].
    pub certificate: String,
    /// [`TIMESTAMP_HEADER`].
    pub timestamp: String,
    /// [`SIGNATURE_HEADER`].
    pub signature: String,
}

impl SignedRequest {
    /// The headers, name and value.
    pub fn headers(&self) -> [(&'static str, &str); 4] {
        [
            (SITE_HEADER, &self.site),
            (CERTIFICATE_HEADER, &self.certificate),
            (TIMESTAMP_HEADER, &self.timestamp),
            (SIGNATURE_HEADER, &self.signature),
        ]
    }
}

impl SiteIdentity {
    /// Signs a request to `target_site`: `method`, the path with its query
    /// as it is sent, and the body, at `now_ms`.
    pub fn sign_request(
        &self,
        target_site: &str,
        method: &str,
        path_and_query: &str,
        body: &[u8],
        now_ms: u64,
    ) -> SignedRequest {
        let engine = base64::engine::general_purpose::STANDARD;
        let message = request_message(target_site, method, path_and_query, now_ms, body);
        let signature = self.sign(REQUEST_LABEL, &message);
        SignedRequest {
            site: self.site().to_string(),
            certificate: engine.encode(self.certificate.to_bytes()),
            timestamp: now_ms.to_string(),
            signature: engine.encode(signature.to_bytes()),
        }
    }
}

/// The signature headers a request carried, each `None` when absent or not text.
#[derive(Debug, Clone, Copy, Default)]
pub struct PresentedSignature<'a> {
    /// [`SITE_HEADER`].
    pub site: Option<&'a str>,
    /// [`CERTIFICATE_HEADER`].
    pub certificate: Option<&'a str>,
    /// [`TIMESTAMP_HEADER`].
    pub timestamp: Option<&'a str>,
    /// [`SIGNATURE_HEADER`].
    pub signature: Option<&'a str>,
}

/// Why a federation request was not taken as coming from a site.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PeerAuthError {
    /// A signature header is missing.
    #[error("federation routes take only requests signed by a site of this federation: the {0} header is missing (a coordinator signs with its --site-credentials)")]
    Missing(&'static str),
    /// A header is not what it should hold.
    #[error("the {0} header is malformed")]
    Malformed(&'static str),
    /// The certificate was refused.
    #[error(transparent)]
    Certificate(#[from] CertificateError),
    /// The site header names another site than the certificate.
    #[error(
        "the request says it is from site {claimed} but its certificate is site {certified}'s"
    )]
    SiteMismatch {
        /// The site header.
        claimed: String,
        /// The certificate's site.
        certified: String,
    },
    /// The timestamp is too far from this site's clock.
    #[error("the request was signed {skew_ms} ms away from this site's clock (at most {MAX_SKEW_MS} ms): a replay, or a clock to set right (NTP)")]
    Stale {
        /// How far, ms.
        skew_ms: u64,
    },
    /// The signature is not the certificate's key's over this request.
    #[error("the request's signature does not verify with its certificate's key (altered, replayed to another site, or signed for another path)")]
    Signature,
}

impl Trust {
    /// Checks a request to `own_site`: the certificate against the root and
    /// the revocations, the timestamp against `now_ms`, and the signature
    /// over `method`, `path_and_query` and `body`. The certificate of the
    /// site that signed it, when it holds.
    pub fn verify_request(
        &self,
        own_site: &str,
        method: &str,
        path_and_query: &str,
        presented: &PresentedSignature<'_>,
        body: &[u8],
        now_ms: u64,
    ) -> Result<Certificate, PeerAuthError> {
        let engine = base64::engine::general_purpose::STANDARD;
        let site = presented.site.ok_or(PeerAuthError::Missing(SITE_HEADER))?;
        let certificate = presented
            .certificate
            .ok_or(PeerAuthError::Missing(CERTIFICATE_HEADER))?;
        let timestamp = presented
            .timestamp
            .ok_or(PeerAuthError::Missing(TIMESTAMP_HEADER))?;
        let signature = presented
            .signature
            .ok_or(PeerAuthError::Missing(SIGNATURE_HEADER))?;
        let timestamp_ms: u64 = timestamp
            .parse()
            .map_err(|_| PeerAuthError::Malformed(TIMESTAMP_HEADER))?;
        let skew_ms = now_ms.abs_diff(timestamp_ms);
        if skew_ms > MAX_SKEW_MS {
            return Err(PeerAuthError::Stale { skew_ms });
        }
        let certificate = engine
            .decode(certificate)
            .map_err(|_| PeerAuthError::Malformed(CERTIFICATE_HEADER))?;
        let certificate = self.verify_certificate(&certificate, now_ms)?;
        if certificate.site.as_str() != site {
            return Err(PeerAuthError::SiteMismatch {
                claimed: site.chars().take(80).collect(),
                certified: certificate.site.to_string(),
            });
        }
        let signature = engine
            .decode(signature)
            .ok()
            .and_then(|bytes| Signature::from_slice(&bytes).ok())
            .ok_or(PeerAuthError::Malformed(SIGNATURE_HEADER))?;
        let message = request_message(own_site, method, path_and_query, timestamp_ms, body);
        if verify_labelled(&certificate.public_key, REQUEST_LABEL, &message, &signature) {
            Ok(certificate)
        } else {
            Err(PeerAuthError::Signature)
        }
    }
}
