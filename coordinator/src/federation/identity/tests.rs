#![allow(clippy::unwrap_used, clippy::expect_used)]

use super::digest::{MAX_SIGNED_DIGEST_BYTES, SIGNED_DIGEST_OVERHEAD};
use super::request::{PresentedSignature, MAX_SKEW_MS};
use super::*;
use starling_proto::site::{
    ClassCapacity, PowerBand, WorkClass, DIGEST_URL_LEN, MAX_DIGEST_ARTIFACTS, MAX_POWER_BANDS,
};
use starling_proto::{Digest, SiteDigest, PROTOCOL_VERSION};

const NOW: u64 = 1_700_000_000_000;

fn site(name: &str) -> SiteId {
    SiteId::new(name).unwrap()
}

fn credentials(root: &TrustRoot, name: &str) -> SiteCredentials {
    root.issue(&site(name), NOW, None).unwrap()
}

fn trust(root: &TrustRoot) -> Trust {
    Trust::new(root.public_key())
}

#[test]
fn credentials_round_trip_and_verify_against_their_root_only() {
    let root = TrustRoot::generate().unwrap();
    let issued = credentials(&root, "plant-a");
    let text = issued.to_json();
    assert!(!text.contains(&base64::engine::general_purpose::STANDARD.encode(root.secret())));
    let loaded = SiteCredentials::from_json(&text).unwrap();
    assert_eq!(loaded.identity.site().as_str(), "plant-a");
    assert_eq!(loaded.root, root.public_key());
    let bytes = loaded.identity.certificate().to_bytes().to_vec();
    let certificate = trust(&root).verify_certificate(&bytes, NOW).unwrap();
    assert_eq!(certificate.site.as_str(), "plant-a");

    // Another federation's root, a flipped bit anywhere: refused.
    let other = TrustRoot::generate().unwrap();
    assert_eq!(
        trust(&other).verify_certificate(&bytes, NOW),
        Err(CertificateError::Forged)
    );
    for i in 0..bytes.len() {
        let mut altered = bytes.clone();
        altered[i] ^= 1;
        assert!(
            trust(&root).verify_certificate(&altered, NOW).is_err(),
            "byte {i}"
        );
    }
    assert!(trust(&root).verify_certificate(&bytes[..40], NOW).is_err());

    // A bundle whose key is not the certified one, or whose certificate is
    // another root's than it names, does not load.
    let mismatched = text.replace(
        &base64::engine::general_purpose::STANDARD.encode(issued.identity.key.to_bytes()),
        &base64::engine::general_purpose::STANDARD.encode([7u8; 32]),
    );
    assert!(SiteCredentials::from_json(&mismatched)
        .unwrap_err()
        .contains("site_key"));
    let foreign = text.replace(
        &hex::encode(root.public_key().as_bytes()),
        &hex::encode(other.public_key().as_bytes()),
    );
    assert!(SiteCredentials::from_json(&foreign)
        .unwrap_err()
        .contains("not signed"));
}

#[test]
fn credentials_files_are_owner_only_and_never_replaced() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("site.json");
    let root = TrustRoot::generate().unwrap();
    credentials(&root, "plant-a").write_new(&path).unwrap();
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt as _;
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
    }
    assert!(credentials(&root, "plant-b").write_new(&path).is_err());
    let loaded = SiteCredentials::load(&path).unwrap();
    assert_eq!(loaded.identity.site().as_str(), "plant-a");
}

#[test]
fn expired_and_revoked_certificates_are_refused_and_a_later_issue_is_not() {
    let root = TrustRoot::generate().unwrap();
    let trust = trust(&root);
    let expiring = root
        .issue(&site("plant-a"), NOW, Some(NOW + 1_000))
        .unwrap();
    let bytes = expiring.identity.certificate().to_bytes();
    assert!(trust.verify_certificate(bytes, NOW + 999).is_ok());
    assert!(matches!(
        trust.verify_certificate(bytes, NOW + 1_000),
        Err(CertificateError::Expired { .. })
    ));

    let old = credentials(&root, "plant-b");
    let revocation = root.revoke(&site("plant-b"), NOW + 10);
    assert_eq!(trust.revoke(&revocation), Ok(true));
    assert_eq!(trust.revoke(&revocation), Ok(false), "known already");
    assert!(matches!(
        trust.verify_certificate(old.identity.certificate().to_bytes(), NOW + 20),
        Err(CertificateError::Revoked { .. })
    ));
    assert!(trust.is_site_revoked("plant-b"));
    // New credentials issued after the revocation are valid again, and
    // once they are shown the site no longer stands revoked.
    let renewed = root.issue(&site("plant-b"), NOW + 11, None).unwrap();
    assert!(trust
        .verify_certificate(renewed.identity.certificate().to_bytes(), NOW + 20)
        .is_ok());
    assert!(!trust.is_site_revoked("plant-b"));
    assert_eq!(trust.revocations(), vec![revocation.clone()]);

    // A revocation another root signed, or one altered, changes nothing.
    let other = TrustRoot::generate().unwrap();
    let forged = other.revoke(&site("plant-c"), NOW);
    assert_eq!(trust.revoke(&forged), Err(RevocationError::Forged));
    let mut later = revocation.clone();
    later.revoked_ms += 1_000_000;
    assert_eq!(trust.revoke(&later), Err(RevocationError::Forged));
    let mut renamed = revocation;
    renamed.site = "plant-a".into();
    assert_eq!(trust.revoke(&renamed), Err(RevocationError::Forged));
    assert!(!trust.is_site_revoked("plant-a"));
    assert!(!trust.is_site_revoked("plant-c"));
}

fn presented(signed: &SignedRequest) -> PresentedSignature<'_> {
    PresentedSignature {
        site: Some(&signed.site),
        certificate: Some(&signed.certificate),
        timestamp: Some(&signed.timestamp),
        signature: Some(&signed.signature),
    }
}

#[test]
fn a_signed_request_verifies_only_as_signed_for_its_target_and_in_time() {
    let root = TrustRoot::generate().unwrap();
    let trust = trust(&root);
    let a = credentials(&root, "plant-a").identity;
    let path = "/api/v1/federation/tasks";
    let body = br#"{"origin_site":"plant-a"}"#;
    let signed = a.sign_request("plant-b", "POST", path, body, NOW);
    let certificate = trust
        .verify_request("plant-b", "POST", path, &presented(&signed), body, NOW + 5)
        .unwrap();
    assert_eq!(certificate.site.as_str(), "plant-a");

    // Another target, method, path or body; a stale or future timestamp.
    let check = |target: &str, method: &str, path: &str, body: &[u8], now: u64| {
        trust.verify_request(target, method, path, &presented(&signed), body, now)
    };
    assert_eq!(
        check("plant-c", "POST", path, body, NOW),
        Err(PeerAuthError::Signature)
    );
    assert_eq!(
        check("plant-b", "GET", path, body, NOW),
        Err(PeerAuthError::Signature)
    );
    assert_eq!(
        check("plant-b", "POST", "/api/v1/federation/tasks?x=1", body, NOW),
        Err(PeerAuthError::Signature)
    );
    assert_eq!(
        check("plant-b", "POST", path, b"{}", NOW),
        Err(PeerAuthError::Signature)
    );
    assert!(matches!(
        check("plant-b", "POST", path, body, NOW + MAX_SKEW_MS + 1),
        Err(PeerAuthError::Stale { .. })
    ));
    assert!(matches!(
        check("plant-b", "POST", path, body, NOW - MAX_SKEW_MS - 1),
        Err(PeerAuthError::Stale { .. })
    ));

    // Claiming another site's name with one's own certificate; a missing
    // or garbled header; a certificate of another root.
    let mut claimed = signed.clone();
    claimed.site = "plant-c".into();
    assert!(matches!(
        trust.verify_request("plant-b", "POST", path, &presented(&claimed), body, NOW),
        Err(PeerAuthError::SiteMismatch { .. })
    ));
    let mut missing = presented(&signed);
    missing.signature = None;
    assert!(matches!(
        trust.verify_request("plant-b", "POST", path, &missing, body, NOW),
        Err(PeerAuthError::Missing(_))
    ));
    let mut garbled = signed.clone();
    garbled.timestamp = "soon".into();
    assert!(matches!(
        trust.verify_request("plant-b", "POST", path, &presented(&garbled), body, NOW),
        Err(PeerAuthError::Malformed(_))
    ));
    let stranger = credentials(&TrustRoot::generate().unwrap(), "plant-a").identity;
    let foreign = stranger.sign_request("plant-b", "POST", path, body, NOW);
    assert_eq!(
        trust.verify_request("plant-b", "POST", path, &presented(&foreign), body, NOW),
        Err(PeerAuthError::Certificate(CertificateError::Forged))
    );

    // Revoked: refused although everything else holds.
    trust.revoke(&root.revoke(&site("plant-a"), NOW)).unwrap();
    assert!(matches!(
        trust.verify_request("plant-b", "POST", path, &presented(&signed), body, NOW),
        Err(PeerAuthError::Certificate(CertificateError::Revoked { .. }))
    ));
}

/// A digest with every bounded field full and the longest values.
fn largest_digest(name: &str) -> SiteDigest {
    let mut classes = heapless::Vec::new();
    for class in [WorkClass::Cpu, WorkClass::Gpu, WorkClass::Io] {
        classes
            .push(ClassCapacity {
                class,
                free_slots: u16::MAX,
                speed: f32::MAX,
                wait_ms: u32::MAX,
            })
            .unwrap();
    }
    let mut power = heapless::Vec::new();
    for _ in 0..MAX_POWER_BANDS {
        power
            .push(PowerBand {
                max_watts: f32::MAX,
                free_slots: u16::MAX,
            })
            .unwrap();
    }
    let mut artifacts = heapless::Vec::new();
    for i in 0..MAX_DIGEST_ARTIFACTS {
        artifacts.push(Digest([i as u8 | 0x80; 32])).unwrap();
    }
    SiteDigest {
        v: PROTOCOL_VERSION,
        site: site(name),
        version: u64::MAX,
        api_url: heapless::String::try_from("h".repeat(DIGEST_URL_LEN).as_str()).unwrap(),
        nodes: u16::MAX,
        classes,
        power,
        pending: u32::MAX,
        running: u32::MAX,
        slack_ms: Some(i64::MIN),
        watts: f32::MAX,
        artifacts,
    }
}

#[test]
fn the_largest_signed_digest_with_the_longest_certificate_fits_one_broadcast() {
    let name = "s".repeat(starling_proto::limits::NODE_ID_LEN);
    let root = TrustRoot::generate().unwrap();
    let identity = root
        .issue(&site(&name), u64::MAX - 1, Some(u64::MAX))
        .unwrap()
        .identity;
    assert_eq!(
        identity.certificate().to_bytes().len(),
        MAX_CERTIFICATE_BYTES
    );
    let digest = largest_digest(&name);
    let sealed = seal_digest(&identity, &digest).unwrap();
    assert!(
        sealed.len() <= MAX_SIGNED_DIGEST_BYTES,
        "{} bytes > {MAX_SIGNED_DIGEST_BYTES}",
        sealed.len()
    );
    assert!(sealed.len() <= starling_proto::site::MAX_DIGEST_BYTES + SIGNED_DIGEST_OVERHEAD);
    assert_eq!(open_digest(&trust(&root), &sealed, 0).unwrap(), digest);
}

#[test]
fn a_digest_opens_only_signed_by_its_own_site_under_this_root() {
    let root = TrustRoot::generate().unwrap();
    let trust = trust(&root);
    let a = credentials(&root, "plant-a").identity;
    let b_digest = largest_digest("plant-b");
    // A site does not sign another's digest through this API...
    assert!(matches!(
        seal_digest(&a, &b_digest),
        Err(DigestSealError::OtherSite { .. })
    ));
    // ...and one forged by hand with its own certificate is dropped.
    let mut forged = vec![1u8];
    let certificate = a.certificate().to_bytes();
    forged.extend_from_slice(&u16::try_from(certificate.len()).unwrap().to_be_bytes());
    forged.extend_from_slice(certificate);
    forged.extend_from_slice(&starling_proto::encode(&b_digest).unwrap());
    let signature = a.sign(b"starling-site-digest/1", &forged);
    forged.extend_from_slice(&signature.to_bytes());
    assert!(matches!(
        open_digest(&trust, &forged, NOW),
        Err(OpenDigestError::OtherSite { .. })
    ));

    // Its own digest opens; altered anywhere, it does not.
    let own = largest_digest("plant-a");
    let sealed = seal_digest(&a, &own).unwrap();
    assert_eq!(open_digest(&trust, &sealed, NOW).unwrap(), own);
    for i in (0..sealed.len()).step_by(7) {
        let mut altered = sealed.clone();
        altered[i] ^= 0x10;
        assert!(open_digest(&trust, &altered, NOW).is_err(), "byte {i}");
    }
    assert!(open_digest(&trust, &sealed[..50], NOW).is_err());
    assert!(matches!(
        open_digest(&trust, &vec![0u8; MAX_SIGNED_DIGEST_BYTES + 1], NOW),
        Err(OpenDigestError::Oversize(_))
    ));

    // Another federation's site, an expired or a revoked certificate.
    let stranger = credentials(&TrustRoot::generate().unwrap(), "plant-a").identity;
    assert!(matches!(
        open_digest(&trust, &seal_digest(&stranger, &own).unwrap(), NOW),
        Err(OpenDigestError::Certificate(CertificateError::Forged))
    ));
    let expiring = root
        .issue(&site("plant-a"), NOW, Some(NOW + 1))
        .unwrap()
        .identity;
    assert!(matches!(
        open_digest(&trust, &seal_digest(&expiring, &own).unwrap(), NOW + 1),
        Err(OpenDigestError::Certificate(
            CertificateError::Expired { .. }
        ))
    ));
    trust.revoke(&root.revoke(&site("plant-a"), NOW)).unwrap();
    assert!(matches!(
        open_digest(&trust, &sealed, NOW),
        Err(OpenDigestError::Certificate(
            CertificateError::Revoked { .. }
        ))
    ));
}
