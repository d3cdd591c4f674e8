//! Verifications of signed reports per second on one core, beside what
//! ingest needs at 10,000 nodes × 1 Hz telemetry. Prints the markdown table
//! that `scripts/bench-report-verify` writes into BENCHMARKS.md.
//!
//! Payloads are opaque bytes of a typical size (verification cost depends on
//! the length only): telemetry 256 bytes, a task event with a small output
//! 1,024 bytes, and an event carrying 64 KiB of output.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::hint::black_box;
use std::time::{Duration, Instant};

use starling_proto::{decode, encode, NodeId, ReportChannel, SignedReport};

/// Reports per second ingest must verify: 10,000 nodes sending telemetry at 1 Hz.
const REQUIRED_PER_SECOND: f64 = 10_000.0;

fn rate(bytes: usize, channel: ReportChannel) -> f64 {
    let key = ed25519_dalek::SigningKey::from_bytes(&[7; 32]);
    let public = key.verifying_key().to_bytes();
    let node = NodeId::new("node-0042").unwrap();
    let wire = encode(&SignedReport::sign(
        &key,
        node,
        channel,
        1,
        vec![0xa5; bytes],
    ))
    .unwrap();
    let mut done = 0u64;
    let start = Instant::now();
    // Decode the envelope and verify it, as ingest does for each message.
    while start.elapsed() < Duration::from_secs(2) {
        for _ in 0..100 {
            let report: SignedReport = decode(black_box(&wire)).unwrap();
            report.verify(&public).unwrap();
        }
        done += 100;
    }
    done as f64 / start.elapsed().as_secs_f64()
}

fn main() {
    println!("| report | message bytes | verified / s / core | × required (10,000/s) |");
    println!("| --- | ---: | ---: | ---: |");
    for (name, bytes, channel) in [
        ("telemetry", 256, ReportChannel::Telemetry),
        ("task event", 1024, ReportChannel::Events),
        (
            "task event, 64 KiB output",
            64 * 1024,
            ReportChannel::Events,
        ),
    ] {
        let per_second = rate(bytes, channel);
        println!(
            "| {name} | {bytes} | {per_second:.0} | {:.1} |",
            per_second / REQUIRED_PER_SECOND
        );
    }
}
