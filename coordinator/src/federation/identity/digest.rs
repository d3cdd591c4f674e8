//! Signed site digests: a site signs its digest with its own key and sends
//! its certificate with it, so a member holding the cluster key cannot
//! publish a digest in another site's name. The receiver checks the
//! certificate against its trust root and revocations, that the
//! certificate's site is the digest's, and the signature; anything else is
//! dropped before the digest reaches the site table.
//!
//! Wire form (one gossip broadcast): version byte, certificate length (two
//! bytes, big-endian), certificate, the digest's CBOR, and the site's
//! signature over all that precedes it. At most [`MAX_SIGNED_DIGEST_BYTES`].

use ed25519_dalek::Signature;
use starling_proto::site::MAX_DIGEST_BYTES;
use starling_proto::{DecodeError, SiteDigest};

use super::{verify_labelled, CertificateError, SiteIdentity, Trust, MAX_CERTIFICATE_BYTES};

/// Version byte of a signed digest.
const SIGNED_DIGEST_VERSION: u8 = 1;
/// Binds a digest signature to its purpose.
const DIGEST_LABEL: &[u8] = b"starling-site-digest/1";
/// Bytes a signed digest adds to the digest: version, certificate length,
/// the longest certificate, the signature.
pub const SIGNED_DIGEST_OVERHEAD: usize = 1 + 2 + MAX_CERTIFICATE_BYTES + 64;
/// Most bytes a signed digest takes: what one gossip broadcast carries
/// beside foca's largest header within a 1400-byte sealed datagram
/// (`gossip::tests::the_largest_signed_digest_fits_one_datagram_beside_the_largest_header`).
pub const MAX_SIGNED_DIGEST_BYTES: usize = 1170;

// The largest digest with the largest certificate fits one broadcast.
const _: () = assert!(MAX_DIGEST_BYTES + SIGNED_DIGEST_OVERHEAD <= MAX_SIGNED_DIGEST_BYTES);

/// Why this site's digest could not be signed.
#[derive(Debug, thiserror::Error)]
pub enum DigestSealError {
    /// The digest names another site than this identity.
    #[error("cannot sign a digest of site {digest} with site {identity}'s credentials")]
    OtherSite {
        /// The digest's site.
        digest: String,
        /// This identity's site.
        identity: String,
    },
    /// The digest does not encode, or exceeds its bound.
    #[error("cannot encode the site digest: {0}")]
    Encode(#[from] starling_proto::EncodeError),
    /// The digest is over [`MAX_DIGEST_BYTES`].
    #[error("site digest of {0} bytes exceeds {MAX_DIGEST_BYTES}")]
    Oversize(usize),
}

/// Why a signed digest was dropped.
#[derive(Debug, thiserror::Error)]
pub enum OpenDigestError {
    /// Longer than one broadcast may be.
    #[error("signed digest of {0} bytes exceeds {MAX_SIGNED_DIGEST_BYTES}")]
    Oversize(usize),
    /// Not a signed digest of this format.
    #[error("malformed signed digest: {0}")]
    Malformed(&'static str),
    /// The certificate was refused (forged, expired, another root's, revoked).
    #[error(transparent)]
    Certificate(#[from] CertificateError),
    /// The certificate is another site's than the digest's.
    #[error("a digest of site {digest} signed with site {certified}'s certificate")]
    OtherSite {
        /// The digest's site.
        digest: String,
        /// The certificate's site.
        certified: String,
    },
    /// The signature is not the certificate's key's.
    #[error("the digest's signature does not verify with its certificate's key")]
    Forged,
    /// The digest itself does not decode.
    #[error(transparent)]
    Decode(#[from] DecodeError),
}

/// Signs this site's digest: the bytes to broadcast.
pub fn seal_digest(
    identity: &SiteIdentity,
    digest: &SiteDigest,
) -> Result<Vec<u8>, DigestSealError> {
    if digest.site != *identity.site() {
        return Err(DigestSealError::OtherSite {
            digest: digest.site.to_string(),
            identity: identity.site().to_string(),
        });
    }
    let encoded = starling_proto::encode(digest)?;
    if encoded.len() > MAX_DIGEST_BYTES {
        return Err(DigestSealError::Oversize(encoded.len()));
    }
    let certificate = identity.certificate().to_bytes();
    let mut out = Vec::with_capacity(3 + certificate.len() + encoded.len() + 64);
    out.push(SIGNED_DIGEST_VERSION);
    // A certificate is at most MAX_CERTIFICATE_BYTES (178): two bytes hold it.
    out.extend_from_slice(
        &u16::try_from(certificate.len())
            .unwrap_or(u16::MAX)
            .to_be_bytes(),
    );
    out.extend_from_slice(certificate);
    out.extend_from_slice(&encoded);
    let signature = identity.sign(DIGEST_LABEL, &out);
    out.extend_from_slice(&signature.to_bytes());
    Ok(out)
}

/// Checks and decodes a signed digest received at `now_ms`: the certificate
/// against `trust` (root, expiry, revocations), its site against the
/// digest's, and the site's signature.
pub fn open_digest(
    trust: &Trust,
    sealed: &[u8],
    now_ms: u64,
) -> Result<SiteDigest, OpenDigestError> {
    let malformed = OpenDigestError::Malformed;
    if sealed.len() > MAX_SIGNED_DIGEST_BYTES {
        return Err(OpenDigestError::Oversize(sealed.len()));
    }
    if sealed.len() < 3 + 64 {
        return Err(malformed("too short"));
    }
    let (signed, signature) = sealed.split_at(sealed.len() - 64);
    if signed[0] != SIGNED_DIGEST_VERSION {
        return Err(malformed("unknown version"));
    }
    let certificate_len = usize::from(u16::from_be_bytes([signed[1], signed[2]]));
    let rest = &signed[3..];
    if certificate_len > rest.len() {
        return Err(malformed("certificate length past the end"));
    }
    let (certificate, encoded) = rest.split_at(certificate_len);
    let certificate = trust.verify_certificate(certificate, now_ms)?;
    let signature = Signature::from_slice(signature).map_err(|_| malformed("signature"))?;
    if !verify_labelled(&certificate.public_key, DIGEST_LABEL, signed, &signature) {
        return Err(OpenDigestError::Forged);
    }
    // Decoded only once the signature holds: unauthenticated bytes never
    // reach the decoder.
    let digest: SiteDigest = starling_proto::decode(encoded)?;
    if digest.site != certificate.site {
        return Err(OpenDigestError::OtherSite {
            digest: digest.site.to_string(),
            certified: certificate.site.to_string(),
        });
    }
    Ok(digest)
}
