//! The assignment checks: only a current assignment for this node, signed by
//! the pinned coordinator key, passes; each refusal names its check.

use crate::support;

use ed25519_dalek::SigningKey;
use starling_agent::verify::{AssignmentVerifier, Refusal};
use starling_proto::{Assignment, Digest, ExecLimits, NodeId};

const NODE: &str = "verified-node";

fn verifier() -> AssignmentVerifier {
    AssignmentVerifier::new(
        NodeId::new(NODE).unwrap(),
        Some(support::coordinator_key().verifying_key()),
    )
}

fn unsigned(node: &str) -> Assignment {
    support::unsigned_assignment(
        node,
        "t",
        Digest([9; 32]),
        "http://127.0.0.1:1/a",
        b"input",
        ExecLimits::default(),
    )
}

fn signed(assignment: Assignment) -> Assignment {
    support::sign(assignment, &support::coordinator_key())
}

fn refusal_text(result: Result<(), Refusal>) -> String {
    result.unwrap_err().to_string()
}

#[test]
fn a_current_assignment_signed_for_this_node_passes() {
    let now = support::now_ms();
    verifier().check(&signed(unsigned(NODE)), now).unwrap();
    // Within the clock skew on either side of the window.
    verifier()
        .check(&signed(unsigned(NODE)), now - 30_000)
        .unwrap();
}

#[test]
fn wrong_node_expired_future_forged_and_unsigned_are_refused() {
    let now = support::now_ms();
    let v = verifier();

    let elsewhere = signed(unsigned("another-node"));
    assert!(matches!(
        v.check(&elsewhere, now),
        Err(Refusal::WrongNode { .. })
    ));
    assert!(refusal_text(v.check(&elsewhere, now)).starts_with("wrong node"));

    // A replay after the window: the same bytes, later.
    let current = signed(unsigned(NODE));
    let text = refusal_text(v.check(&current, current.expires_unix_ms + 1));
    assert!(text.starts_with("expired"), "{text}");

    let mut future = unsigned(NODE);
    future.issued_unix_ms = now + 120_000;
    future.expires_unix_ms = now + 180_000;
    let text = refusal_text(v.check(&signed(future), now));
    assert!(text.starts_with("not yet valid"), "{text}");

    // Any field changed after signing (here the input) breaks the signature.
    let mut tampered = signed(unsigned(NODE));
    tampered.input = b"other input".to_vec();
    let text = refusal_text(v.check(&tampered, now));
    assert!(text.starts_with("bad signature"), "{text}");

    // A valid signature by another key is a forgery too.
    let forged = support::sign(unsigned(NODE), &SigningKey::from_bytes(&[1; 32]));
    assert!(matches!(
        v.check(&forged, now),
        Err(Refusal::BadSignature { .. })
    ));

    // A widened window cannot be signed in afterwards.
    let mut widened = signed(unsigned(NODE));
    widened.expires_unix_ms += 3_600_000;
    assert!(matches!(
        v.check(&widened, widened.expires_unix_ms - 1),
        Err(Refusal::BadSignature { .. })
    ));

    let mut short = signed(unsigned(NODE));
    short.signature.truncate(10);
    assert!(matches!(
        v.check(&short, now),
        Err(Refusal::BadSignature { .. })
    ));

    let text = refusal_text(v.check(&unsigned(NODE), now));
    assert!(text.starts_with("unsigned"), "{text}");
}

/// What an attacker on the network or at the artifact server would try
/// against an agent without a compiler: point a signed assignment at its own
/// machine code. The signature covers the code's digest and URL, so neither
/// adding, swapping nor removing them passes.
#[test]
fn precompiled_code_cannot_be_added_swapped_or_removed_after_signing() {
    let now = support::now_ms();
    let v = verifier();
    let code = |digest: u8| starling_proto::PrecompiledModule {
        digest: Digest([digest; 32]),
        url: "http://127.0.0.1:1/api/v1/artifacts/c".try_into().unwrap(),
    };
    let mut with_code = unsigned(NODE);
    with_code.precompiled = Some(code(1));
    let with_code = signed(with_code);
    v.check(&with_code, now).unwrap();

    let mut swapped = with_code.clone();
    swapped.precompiled = Some(code(2));
    let mut moved = with_code.clone();
    if let Some(code) = moved.precompiled.as_mut() {
        code.url = "http://attacker.invalid/code".try_into().unwrap();
    }
    let mut removed = with_code.clone();
    removed.precompiled = None;
    let mut added = signed(unsigned(NODE));
    added.precompiled = Some(code(3));
    for forged in [swapped, moved, removed, added] {
        let text = refusal_text(v.check(&forged, now));
        assert!(text.starts_with("bad signature"), "{text}");
    }
}

#[test]
fn without_a_key_everything_is_unverifiable_unless_unsigned_is_allowed() {
    let now = support::now_ms();
    let mut v = AssignmentVerifier::new(NodeId::new(NODE).unwrap(), None);
    let text = refusal_text(v.check(&signed(unsigned(NODE)), now));
    assert!(text.starts_with("unverifiable"), "{text}");

    v.allow_unsigned = true;
    v.check(&unsigned(NODE), now).unwrap();
    // The node is still checked.
    assert!(matches!(
        v.check(&unsigned("another-node"), now),
        Err(Refusal::WrongNode { .. })
    ));
}

fn publisher_signature(key: &SigningKey, digest: &Digest) -> starling_proto::PublisherSignature {
    use ed25519_dalek::Signer as _;
    starling_proto::PublisherSignature {
        key: key.verifying_key().as_bytes().to_vec(),
        signature: key.sign(&digest.0).to_bytes().to_vec(),
    }
}

#[test]
fn a_node_that_trusts_publishers_runs_only_their_signed_artifacts() {
    let now = support::now_ms();
    let publisher = SigningKey::from_bytes(&[7; 32]);
    let stranger = SigningKey::from_bytes(&[8; 32]);
    let digest = Digest([9; 32]);
    let with_publisher = |key: &SigningKey| {
        let mut assignment = unsigned(NODE);
        assignment.publisher = Some(publisher_signature(key, &digest));
        signed(assignment)
    };

    // Without a policy: unsigned artifacts run, and a signature that is
    // there must still be valid.
    let open = verifier();
    open.check(&signed(unsigned(NODE)), now).unwrap();
    open.check(&with_publisher(&stranger), now).unwrap();
    let mut wrong_digest = unsigned(NODE);
    wrong_digest.publisher = Some(publisher_signature(&publisher, &Digest([1; 32])));
    let text = refusal_text(open.check(&signed(wrong_digest), now));
    assert!(text.starts_with("bad publisher signature"), "{text}");

    // With one trusted publisher: only its signature passes.
    let strict = AssignmentVerifier {
        trusted_publishers: vec![publisher.verifying_key()],
        ..verifier()
    };
    strict.check(&with_publisher(&publisher), now).unwrap();
    let text = refusal_text(strict.check(&signed(unsigned(NODE)), now));
    assert!(text.starts_with("unsigned artifact"), "{text}");
    let text = refusal_text(strict.check(&with_publisher(&stranger), now));
    assert!(text.starts_with("untrusted publisher"), "{text}");
    assert!(text.contains(&hex::encode(stranger.verifying_key().as_bytes())));

    // Swapping the publisher after the coordinator signed breaks its signature.
    let mut swapped = with_publisher(&stranger);
    swapped.publisher = Some(publisher_signature(&publisher, &digest));
    let text = refusal_text(strict.check(&swapped, now));
    assert!(text.starts_with("bad signature"), "{text}");
}
