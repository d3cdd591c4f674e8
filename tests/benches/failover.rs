//! Time from an agent's death to its task running on another agent, for the
//! two ways a node dies: its process is killed (the kernel closes the TCP
//! connection, so the broker publishes the last will at once) and its host
//! vanishes (a link cut in a network namespace: nobody is told, and only the
//! missing telemetry gives it away, after the coordinator's node timeout).
//!
//! `cargo bench --profile dev -p starling-tests --bench failover` (needs root
//! for the namespace), or with `-- --trials N`. Uses the coordinator's default
//! node timeout, so the figures are what a default install does. Prints a
//! Markdown table for BENCHMARKS.md beside the defaults of Nomad and Kubernetes.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::time::{Duration, Instant};

use starling_tests::{bench_progress, modules, Agent, Coordinator, Mosquitto, NetNs, Store};

#[derive(Clone, Copy)]
enum Death {
    /// `kill -9` of the agent process.
    Process,
    /// The agent's link cut, its process alive and unaware.
    Link,
}

/// One trial: a task runs on a doomed agent beside a healthy one; the doomed
/// one dies; returns the time until the task runs on the healthy one.
fn trial(death: Death) -> Duration {
    let ns = NetNs::create();
    let broker = Mosquitto::start_on(ns.host_octets());
    let listen = format!("{}:0", ns.host_ip());
    let coordinator = Coordinator::start(Some(&broker.url), Store::Sqlite, &["--listen", &listen]);
    let netns = matches!(death, Death::Link).then_some(&ns);
    let mut doomed = Agent::start_with(&coordinator, &broker.url, "doomed", "", netns, &[]);
    coordinator.wait_for_nodes(1, Duration::from_secs(60));
    let dir = tempfile::tempdir().unwrap();
    let digest = coordinator.publish_spin(dir.path(), 30 * modules::SPIN_SECOND);
    let id = coordinator.submit(&digest, "failover").unwrap();
    coordinator.wait_task(&id, Duration::from_secs(30), "running", |t| {
        t["state"] == "running" && t["node_id"] == "doomed"
    });
    // The healthy agent joins only now, so the task cannot have gone there first.
    let _healthy = Agent::start(&coordinator, &broker.url, "healthy", "");
    coordinator.wait_for_nodes(2, Duration::from_secs(60));

    let died = Instant::now();
    match death {
        Death::Process => doomed.kill(),
        Death::Link => ns.cut(),
    }
    coordinator.wait_task(&id, Duration::from_secs(120), "moved", |t| {
        t["state"] == "running" && t["node_id"] == "healthy"
    });
    let elapsed = died.elapsed();
    ns.restore();
    elapsed
}

fn median(samples: &mut [Duration]) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

fn main() {
    let mut trials = 5usize;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        if arg == "--trials" {
            trials = args.next().and_then(|n| n.parse().ok()).unwrap_or(trials);
        }
    }
    assert!(NetNs::available(), "needs root and iproute2");
    let mut rows = Vec::new();
    for (death, name) in [
        (Death::Process, "agent process killed (kill -9)"),
        (Death::Link, "host vanished (link cut, no FIN)"),
    ] {
        let bar = bench_progress(trials, name);
        let mut samples: Vec<Duration> = (0..trials)
            .map(|_| {
                let sample = trial(death);
                bar.inc(1);
                sample
            })
            .collect();
        bar.finish_and_clear();
        let (min, max) = (
            *samples.iter().min().unwrap(),
            *samples.iter().max().unwrap(),
        );
        let median = median(&mut samples);
        rows.push((name, median, min, max));
    }
    // The reference points are the documented defaults of the systems our
    // users know: Nomad marks a node down after its 10 s heartbeat grace;
    // Kubernetes marks it NotReady after 40 s and evicts its pods after 300 s
    // (node-monitor-grace-period, default-not-ready-toleration-seconds).
    println!("| death | median | min | max | vs Nomad 10 s | vs Kubernetes 40 s + 300 s |");
    println!("| --- | ---: | ---: | ---: | ---: | ---: |");
    for (name, median, min, max) in rows {
        let secs = median.as_secs_f64();
        println!(
            "| {name} | {:.2} s | {:.2} s | {:.2} s | {:.3}× | {:.4}× |",
            secs,
            min.as_secs_f64(),
            max.as_secs_f64(),
            secs / 10.0,
            secs / 340.0
        );
    }
    println!("\n{trials} trials each; the task moves when its new attempt reports `running`.");
}
