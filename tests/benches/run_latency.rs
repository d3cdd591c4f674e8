//! Time from `starling run` to output for a trivial task, over the whole real
//! path (CLI process → REST → store → placement → MQTT → agent → wasmtime →
//! event → store → CLI), beside the floor: instantiating and running the same
//! module in-process with the agent's own executor.
//!
//! `cargo bench -p starling-tests --bench run_latency` (release build), or with
//! `-- --runs N`. Prints a Markdown table for BENCHMARKS.md.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::time::{Duration, Instant};

use starling_agent::wasm::WasmExecutor;
use starling_proto::ExecLimits;
use starling_tests::{bench_progress, modules, wasm_file, Agent, Coordinator, Store};

fn median_and_p90(samples: &mut [Duration]) -> (Duration, Duration) {
    samples.sort();
    let p = |q: f64| samples[((samples.len() as f64 - 1.0) * q).round() as usize];
    (p(0.5), p(0.9))
}

fn main() {
    let mut runs = 100usize;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        if arg == "--runs" {
            runs = args.next().and_then(|n| n.parse().ok()).unwrap_or(runs);
        }
    }
    let input = b"ping";
    let module_bytes = wat::parse_str(modules::ECHO).unwrap();

    // The floor: the agent's executor, module compiled once, instantiate + run per sample.
    let executor = WasmExecutor::new().unwrap();
    let module = executor.compile(&module_bytes).unwrap();
    let limits = ExecLimits::default();
    let mut floor = Vec::with_capacity(runs);
    let bar = bench_progress(runs, "in-process instantiate");
    for _ in 0..runs {
        let start = Instant::now();
        let outcome = executor.run(&module, input, &[], &limits).unwrap();
        floor.push(start.elapsed());
        assert_eq!(outcome.output, b"echo:ping");
        bar.inc(1);
    }
    bar.finish_and_clear();

    // The whole path: embedded broker, SQLite, one agent, the CLI as a user runs it.
    let coordinator = Coordinator::start(None, Store::Sqlite, &[]);
    let _agent = Agent::start(&coordinator, &coordinator.mqtt, "bench", "");
    coordinator.wait_for_nodes(1, Duration::from_secs(30));
    let dir = tempfile::tempdir().unwrap();
    let path = wasm_file(dir.path(), "echo", modules::ECHO);
    let published = coordinator.cli(&["publish", path.to_str().unwrap(), "--json"], None);
    assert!(published.status.success());
    let digest = serde_json::from_slice::<serde_json::Value>(&published.stdout).unwrap()["digest"]
        .as_str()
        .unwrap()
        .to_string();
    // One warm-up run fills the agent's module cache, as in steady state.
    let warm = coordinator.cli(&["run", &digest, "--input", "-", "--wait"], Some(input));
    assert!(
        warm.status.success(),
        "{}",
        String::from_utf8_lossy(&warm.stderr)
    );
    let mut whole = Vec::with_capacity(runs);
    let bar = bench_progress(runs, "starling run --wait");
    for _ in 0..runs {
        let start = Instant::now();
        let out = coordinator.cli(&["run", &digest, "--input", "-", "--wait"], Some(input));
        whole.push(start.elapsed());
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(out.stdout, b"echo:ping");
        bar.inc(1);
    }
    bar.finish_and_clear();

    let (floor_median, floor_p90) = median_and_p90(&mut floor);
    let (whole_median, whole_p90) = median_and_p90(&mut whole);
    let profile = if cfg!(debug_assertions) {
        "debug"
    } else {
        "release"
    };
    println!("| path ({runs} runs, {profile} build) | median | p90 | ratio to floor (median) |");
    println!("| --- | ---: | ---: | ---: |");
    println!(
        "| in-process instantiate + run (floor) | {:.2} ms | {:.2} ms | 1.0 |",
        floor_median.as_secs_f64() * 1e3,
        floor_p90.as_secs_f64() * 1e3
    );
    println!(
        "| `starling run DIGEST --wait`, end to end | {:.2} ms | {:.2} ms | {:.0} |",
        whole_median.as_secs_f64() * 1e3,
        whole_p90.as_secs_f64() * 1e3,
        whole_median.as_secs_f64() / floor_median.as_secs_f64()
    );
}
