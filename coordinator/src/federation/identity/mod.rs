//! Per-site identity: each site of a federation has its own ed25519 key,
//! and a certificate (site name, site public key, issued time, optional
//! expiry) signed by the federation's trust root. Every coordinator knows
//! the root's public key (its trust anchor, [`Trust`]) and checks a peer's
//! certificate against it, so holding the cluster key no longer lets one
//! site speak for another: the cluster key only seals gossip.
//!
//! Map: this file holds the certificate, the trust anchor with its
//! revocations and the credentials bundle; `request` signs and checks the
//! federation's REST calls; `digest` signs and opens site digests;
//! `commands` is `starling-coordinator federation init | issue | revoke`.
//! Nothing here does network I/O; only the credentials files are read and
//! written.

pub mod commands;
pub mod digest;
pub mod request;

use std::collections::HashMap;
use std::path::Path;
use std::sync::{PoisonError, RwLock};

use base64::Engine;
use ed25519_dalek::{Signature, Signer as _, SigningKey, VerifyingKey};
use serde::{Deserialize, Serialize};
use starling_proto::SiteId;

/// A root-signed revocation of a site: what `federation revoke` prints and
/// `POST /api/v1/federation/revocations` takes.
pub use starling_api::SiteRevocation as Revocation;

pub use digest::{open_digest, seal_digest, DigestSealError, OpenDigestError};
pub use request::{PeerAuthError, PresentedSignature, SignedRequest};

/// Version byte of the certificate's binary form.
const CERTIFICATE_VERSION: u8 = 1;
/// Binds a certificate's signature to its purpose.
const CERTIFICATE_LABEL: &[u8] = b"starling-site-certificate/1";
/// Binds a revocation's signature to its purpose.
const REVOCATION_LABEL: &[u8] = b"starling-site-revocation/1";
/// Longest certificate: version, name length, the longest site name, key,
/// two times, signature.
pub const MAX_CERTIFICATE_BYTES: usize = 2 + starling_proto::limits::NODE_ID_LEN + 32 + 8 + 8 + 64;
/// The credentials bundle's format tag.
const CREDENTIALS_FORMAT: &str = "starling-site-credentials/1";

/// Why a certificate was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CertificateError {
    /// Not a certificate of this format.
    #[error("malformed site certificate: {0}")]
    Malformed(&'static str),
    /// The root's signature does not verify: forged, altered, or issued by
    /// another federation's root.
    #[error("the site certificate is not signed by this federation's trust root")]
    Forged,
    /// Past its expiry.
    #[error("the certificate of site {site} expired at {expires_ms} (Unix ms); issue new credentials with `starling-coordinator federation issue`")]
    Expired {
        /// The site it names.
        site: String,
        /// When it expired, Unix ms.
        expires_ms: u64,
    },
    /// The site was revoked by the root.
    #[error("site {site} was revoked by the federation's trust root")]
    Revoked {
        /// The site.
        site: String,
    },
}

/// A site's certificate, parsed (and, from [`Trust::verify_certificate`],
/// checked).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Certificate {
    /// The site it names.
    pub site: SiteId,
    /// The site's public key.
    pub public_key: VerifyingKey,
    /// When the root issued it, Unix ms.
    pub issued_ms: u64,
    /// When it stops being valid, Unix ms; `None` for never.
    pub expires_ms: Option<u64>,
    /// The binary form, signature included (what travels).
    bytes: Vec<u8>,
}

impl Certificate {
    /// The bytes the root signs: everything before the signature.
    fn signed_part(
        site: &SiteId,
        public_key: &VerifyingKey,
        issued_ms: u64,
        expires_ms: Option<u64>,
    ) -> Vec<u8> {
        let name = site.as_str().as_bytes();
        let mut out = Vec::with_capacity(MAX_CERTIFICATE_BYTES);
        out.push(CERTIFICATE_VERSION);
        // A site id is at most NODE_ID_LEN (64) bytes: it fits a byte.
        out.push(u8::try_from(name.len()).unwrap_or(u8::MAX));
        out.extend_from_slice(name);
        out.extend_from_slice(public_key.as_bytes());
        out.extend_from_slice(&issued_ms.to_be_bytes());
        out.extend_from_slice(&expires_ms.unwrap_or(0).to_be_bytes());
        out
    }

    /// Parses the binary form; the signature is not checked here.
    fn parse(bytes: &[u8]) -> Result<(Self, Signature, usize), CertificateError> {
        let malformed = CertificateError::Malformed;
        let (&version, rest) = bytes.split_first().ok_or(malformed("empty"))?;
        if version != CERTIFICATE_VERSION {
            return Err(malformed("unknown certificate version"));
        }
        let (&name_len, rest) = rest.split_first().ok_or(malformed("truncated"))?;
        let name_len = usize::from(name_len);
        if rest.len() != name_len + 32 + 8 + 8 + 64 {
            return Err(malformed("wrong length"));
        }
        let (name, rest) = rest.split_at(name_len);
        let name = std::str::from_utf8(name).map_err(|_| malformed("site name is not UTF-8"))?;
        let site = SiteId::new(name).map_err(|_| malformed("site name is not a valid site id"))?;
        let (key, rest) = rest.split_at(32);
        let key: [u8; 32] = key.try_into().map_err(|_| malformed("truncated key"))?;
        let public_key =
            VerifyingKey::from_bytes(&key).map_err(|_| malformed("not an ed25519 public key"))?;
        let (issued, rest) = rest.split_at(8);
        let (expires, signature) = rest.split_at(8);
        let be = |b: &[u8]| b.try_into().map(u64::from_be_bytes);
        let issued_ms = be(issued).map_err(|_| malformed("truncated"))?;
        let expires_ms = be(expires).map_err(|_| malformed("truncated"))?;
        let signature = Signature::from_slice(signature).map_err(|_| malformed("signature"))?;
        let signed_len = bytes.len() - 64;
        Ok((
            Self {
                site,
                public_key,
                issued_ms,
                expires_ms: (expires_ms != 0).then_some(expires_ms),
                bytes: bytes.to_vec(),
            },
            signature,
            signed_len,
        ))
    }

    /// The binary form, as it travels in headers and digests.
    pub fn to_bytes(&self) -> &[u8] {
        &self.bytes
    }
}

/// The federation's trust root: the key that issues and revokes sites'
/// certificates. It stays on the member where `federation init` made it.
pub struct TrustRoot {
    key: SigningKey,
}

impl std::fmt::Debug for TrustRoot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the secret.
        f.debug_struct("TrustRoot")
            .field("public_key", &hex::encode(self.public_key().as_bytes()))
            .finish()
    }
}

/// The OS gave no randomness for a new key.
#[derive(Debug, thiserror::Error)]
#[error("cannot generate a key: the OS randomness source failed: {0}")]
pub struct RandomError(getrandom::Error);

fn random_key() -> Result<SigningKey, RandomError> {
    let mut secret = [0u8; 32];
    getrandom::fill(&mut secret).map_err(RandomError)?;
    Ok(SigningKey::from_bytes(&secret))
}

impl TrustRoot {
    /// A new root from the OS's randomness.
    pub fn generate() -> Result<Self, RandomError> {
        Ok(Self { key: random_key()? })
    }

    /// The root from its 32-byte secret.
    pub fn from_secret(secret: &[u8; 32]) -> Self {
        Self {
            key: SigningKey::from_bytes(secret),
        }
    }

    /// The 32-byte secret (for the root's file only).
    pub fn secret(&self) -> [u8; 32] {
        self.key.to_bytes()
    }

    /// The trust anchor every member verifies with.
    pub fn public_key(&self) -> VerifyingKey {
        self.key.verifying_key()
    }

    /// A certificate for `site`'s key, issued at `issued_ms`.
    pub fn certify(
        &self,
        site: &SiteId,
        public_key: &VerifyingKey,
        issued_ms: u64,
        expires_ms: Option<u64>,
    ) -> Certificate {
        let mut bytes = Certificate::signed_part(site, public_key, issued_ms, expires_ms);
        let signature = self.sign(CERTIFICATE_LABEL, &bytes);
        bytes.extend_from_slice(&signature.to_bytes());
        Certificate {
            site: site.clone(),
            public_key: *public_key,
            issued_ms,
            expires_ms,
            bytes,
        }
    }

    /// New credentials for `site`: a fresh site key and its certificate.
    pub fn issue(
        &self,
        site: &SiteId,
        issued_ms: u64,
        expires_ms: Option<u64>,
    ) -> Result<SiteCredentials, RandomError> {
        let key = random_key()?;
        let certificate = self.certify(site, &key.verifying_key(), issued_ms, expires_ms);
        Ok(SiteCredentials {
            identity: SiteIdentity { key, certificate },
            root: self.public_key(),
        })
    }

    /// Revokes every certificate of `site` issued at or before `revoked_ms`
    /// (credentials issued later, after a new `issue`, are valid again).
    pub fn revoke(&self, site: &SiteId, revoked_ms: u64) -> Revocation {
        let signature = self.sign(REVOCATION_LABEL, &revocation_signed_part(site, revoked_ms));
        Revocation {
            site: site.to_string(),
            revoked_ms,
            signature: base64::engine::general_purpose::STANDARD.encode(signature.to_bytes()),
        }
    }

    fn sign(&self, label: &[u8], message: &[u8]) -> Signature {
        let mut bytes = Vec::with_capacity(label.len() + message.len());
        bytes.extend_from_slice(label);
        bytes.extend_from_slice(message);
        self.key.sign(&bytes)
    }
}

fn verify_labelled(
    key: &VerifyingKey,
    label: &[u8],
    message: &[u8],
    signature: &Signature,
) -> bool {
    let mut bytes = Vec::with_capacity(label.len() + message.len());
    bytes.extend_from_slice(label);
    bytes.extend_from_slice(message);
    key.verify_strict(&bytes, signature).is_ok()
}

/// Why a revocation was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RevocationError {
    /// The site is not a valid site id.
    #[error("the revocation names {0:?}, which is not a valid site name")]
    Site(String),
    /// The signature is not base64 of 64 bytes, or is not the root's.
    #[error("the revocation is not signed by this federation's trust root")]
    Forged,
}

fn revocation_signed_part(site: &SiteId, revoked_ms: u64) -> Vec<u8> {
    let name = site.as_str().as_bytes();
    let mut out = Vec::with_capacity(1 + name.len() + 8);
    out.push(u8::try_from(name.len()).unwrap_or(u8::MAX));
    out.extend_from_slice(name);
    out.extend_from_slice(&revoked_ms.to_be_bytes());
    out
}

/// Checks a revocation's signature against the trust root `root`.
pub fn verify_revocation(
    revocation: &Revocation,
    root: &VerifyingKey,
) -> Result<(), RevocationError> {
    let site = SiteId::new(&revocation.site)
        .map_err(|_| RevocationError::Site(revocation.site.clone()))?;
    let signature = base64::engine::general_purpose::STANDARD
        .decode(&revocation.signature)
        .ok()
        .and_then(|bytes| Signature::from_slice(&bytes).ok())
        .ok_or(RevocationError::Forged)?;
    if verify_labelled(
        root,
        REVOCATION_LABEL,
        &revocation_signed_part(&site, revocation.revoked_ms),
        &signature,
    ) {
        Ok(())
    } else {
        Err(RevocationError::Forged)
    }
}

/// What a coordinator trusts: the root's public key, and the revocations it
/// knows (from the store at start, then as they arrive).
#[derive(Debug)]
pub struct Trust {
    root: VerifyingKey,
    revoked: RwLock<HashMap<String, Revocation>>,
    /// The latest issue time of each site's certificates that verified
    /// here: a site revoked and issued new credentials since is trusted
    /// again once it shows them. At most one entry per site the root
    /// certified.
    latest_issued: RwLock<HashMap<String, u64>>,
}

impl Trust {
    /// Trusts certificates signed by `root`, none revoked yet.
    pub fn new(root: VerifyingKey) -> Self {
        Self {
            root,
            revoked: RwLock::new(HashMap::new()),
            latest_issued: RwLock::new(HashMap::new()),
        }
    }

    /// The trust anchor.
    pub fn root(&self) -> &VerifyingKey {
        &self.root
    }

    /// Parses `bytes` and checks the root's signature, the expiry against
    /// `now_ms`, and the revocations.
    pub fn verify_certificate(
        &self,
        bytes: &[u8],
        now_ms: u64,
    ) -> Result<Certificate, CertificateError> {
        let (certificate, signature, signed_len) = Certificate::parse(bytes)?;
        if !verify_labelled(
            &self.root,
            CERTIFICATE_LABEL,
            &bytes[..signed_len],
            &signature,
        ) {
            return Err(CertificateError::Forged);
        }
        if let Some(expires_ms) = certificate.expires_ms.filter(|&at| now_ms >= at) {
            return Err(CertificateError::Expired {
                site: certificate.site.to_string(),
                expires_ms,
            });
        }
        if self.is_revoked(certificate.site.as_str(), certificate.issued_ms) {
            return Err(CertificateError::Revoked {
                site: certificate.site.to_string(),
            });
        }
        let mut latest = self
            .latest_issued
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        let seen = latest.entry(certificate.site.to_string()).or_insert(0);
        *seen = (*seen).max(certificate.issued_ms);
        Ok(certificate)
    }

    /// Whether a certificate of `site` issued at `issued_ms` is revoked.
    pub fn is_revoked(&self, site: &str, issued_ms: u64) -> bool {
        self.revoked
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(site)
            .is_some_and(|revocation| issued_ms <= revocation.revoked_ms)
    }

    /// Whether `site` stands revoked: a revocation names it, and no
    /// certificate of it issued since has verified here. No work goes to
    /// such a site, and what it answers is not taken.
    pub fn is_site_revoked(&self, site: &str) -> bool {
        let Some(revoked_ms) = self
            .revoked
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(site)
            .map(|revocation| revocation.revoked_ms)
        else {
            return false;
        };
        self.latest_issued
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(site)
            .is_none_or(|&issued| issued <= revoked_ms)
    }

    /// Verifies `revocation` and records it; true when it revokes more
    /// than what was known (a new site, or a later time).
    pub fn revoke(&self, revocation: &Revocation) -> Result<bool, RevocationError> {
        verify_revocation(revocation, &self.root)?;
        let mut revoked = self.revoked.write().unwrap_or_else(PoisonError::into_inner);
        let newer = revoked
            .get(&revocation.site)
            .is_none_or(|known| known.revoked_ms < revocation.revoked_ms);
        if newer {
            revoked.insert(revocation.site.clone(), revocation.clone());
        }
        Ok(newer)
    }

    /// Every revocation known, to pass on to peers.
    pub fn revocations(&self) -> Vec<Revocation> {
        let mut all: Vec<Revocation> = self
            .revoked
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .values()
            .cloned()
            .collect();
        all.sort_by(|a, b| a.site.cmp(&b.site));
        all
    }
}

/// A site's own identity: its private key and its certificate.
pub struct SiteIdentity {
    key: SigningKey,
    certificate: Certificate,
}

impl std::fmt::Debug for SiteIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the secret.
        f.debug_struct("SiteIdentity")
            .field("site", &self.certificate.site)
            .finish_non_exhaustive()
    }
}

impl SiteIdentity {
    /// The site this identity speaks for.
    pub fn site(&self) -> &SiteId {
        &self.certificate.site
    }

    /// Its certificate.
    pub fn certificate(&self) -> &Certificate {
        &self.certificate
    }

    fn sign(&self, label: &[u8], message: &[u8]) -> Signature {
        let mut bytes = Vec::with_capacity(label.len() + message.len());
        bytes.extend_from_slice(label);
        bytes.extend_from_slice(message);
        self.key.sign(&bytes)
    }
}

/// A site's credentials: its identity and the trust anchor, as `federation
/// issue` writes them (never the root's private key).
#[derive(Debug)]
pub struct SiteCredentials {
    /// The site's key and certificate.
    pub identity: SiteIdentity,
    /// The trust root's public key.
    pub root: VerifyingKey,
}

/// The credentials file (JSON).
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct CredentialsFile {
    format: String,
    site: String,
    /// The site's ed25519 secret, base64.
    site_key: String,
    /// The root-signed certificate, base64.
    certificate: String,
    /// The trust root's public key, hex.
    root_public_key: String,
}

/// Why a credentials file could not be used.
#[derive(Debug, thiserror::Error)]
pub enum CredentialsError {
    /// The file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: std::path::PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// Not a credentials file of this format.
    #[error("{path} is not a Starling site credentials file: {why}")]
    Invalid {
        /// The file.
        path: std::path::PathBuf,
        /// What is wrong.
        why: String,
    },
}

impl SiteCredentials {
    /// The JSON text of the credentials file.
    pub fn to_json(&self) -> String {
        let engine = base64::engine::general_purpose::STANDARD;
        let file = CredentialsFile {
            format: CREDENTIALS_FORMAT.into(),
            site: self.identity.site().to_string(),
            site_key: engine.encode(self.identity.key.to_bytes()),
            certificate: engine.encode(self.identity.certificate.to_bytes()),
            root_public_key: hex::encode(self.root.as_bytes()),
        };
        let mut text = serde_json::to_string_pretty(&file).unwrap_or_default();
        text.push('\n');
        text
    }

    /// Parses a credentials file's text and checks it is whole: the
    /// certificate is signed by the root it names, and the key is the one
    /// it certifies. Expiry and revocation are checked by [`Trust`] later.
    pub fn from_json(text: &str) -> Result<Self, String> {
        let engine = base64::engine::general_purpose::STANDARD;
        let file: CredentialsFile = serde_json::from_str(text).map_err(|e| e.to_string())?;
        if file.format != CREDENTIALS_FORMAT {
            return Err(format!(
                "format {:?}, expected {CREDENTIALS_FORMAT:?}",
                file.format
            ));
        }
        let root: [u8; 32] = hex::decode(&file.root_public_key)
            .ok()
            .and_then(|bytes| bytes.try_into().ok())
            .ok_or("root_public_key is not 64 hex digits")?;
        let root = VerifyingKey::from_bytes(&root).map_err(|_| "root_public_key is not a key")?;
        let secret: [u8; 32] = engine
            .decode(&file.site_key)
            .ok()
            .and_then(|bytes| bytes.try_into().ok())
            .ok_or("site_key is not base64 of 32 bytes")?;
        let key = SigningKey::from_bytes(&secret);
        let certificate = engine
            .decode(&file.certificate)
            .map_err(|_| "certificate is not base64")?;
        // Checked as a signature only: an expired or revoked certificate is
        // refused where it is used, with its own message.
        let (certificate, signature, signed_len) =
            Certificate::parse(&certificate).map_err(|e| e.to_string())?;
        if !verify_labelled(
            &root,
            CERTIFICATE_LABEL,
            &certificate.bytes[..signed_len],
            &signature,
        ) {
            return Err("the certificate is not signed by root_public_key".into());
        }
        if certificate.public_key != key.verifying_key() {
            return Err("site_key is not the key the certificate names".into());
        }
        if certificate.site.as_str() != file.site {
            return Err(format!(
                "site {:?} but the certificate names {}",
                file.site, certificate.site
            ));
        }
        Ok(Self {
            identity: SiteIdentity { key, certificate },
            root,
        })
    }

    /// Reads and checks a credentials file; warns when others may read it.
    pub fn load(path: &Path) -> Result<Self, CredentialsError> {
        let text = std::fs::read_to_string(path).map_err(|source| CredentialsError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        #[cfg(unix)]
        if let Ok(meta) = std::fs::metadata(path) {
            use std::os::unix::fs::PermissionsExt as _;
            if meta.permissions().mode() & 0o077 != 0 {
                tracing::warn!(path = %path.display(), "the site credentials file is readable by other users; chmod 600 it");
            }
        }
        Self::from_json(&text).map_err(|why| CredentialsError::Invalid {
            path: path.to_path_buf(),
            why,
        })
    }

    /// Writes the credentials file, owner-only (0600); refuses to replace
    /// an existing file.
    pub fn write_new(&self, path: &Path) -> Result<(), CredentialsError> {
        write_private(path, self.to_json().as_bytes()).map_err(|source| CredentialsError::Io {
            path: path.to_path_buf(),
            source,
        })
    }
}

/// Creates `path` owner-only (0600) with `bytes`; an existing file is an error.
pub(crate) fn write_private(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write as _;
    if let Some(dir) = path.parent().filter(|dir| !dir.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)?;
    }
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt as _;
        options.mode(0o600);
    }
    let mut file = options.open(path)?;
    file.write_all(bytes)?;
    file.sync_all()
}

#[cfg(test)]
mod tests;
