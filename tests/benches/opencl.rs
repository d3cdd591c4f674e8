//! The matrix-multiply example kernel on PoCL beside a plain Rust loop doing
//! the same multiply in the same run, and the cost of each layer around the
//! kernel: the executor in-process, the worker process the agent starts per
//! task, and the whole path from `starling run` to output.
//!
//! `cargo bench --profile dev -p starling-tests --bench opencl`, or with
//! `-- --runs N --size N`. Prints Markdown tables for BENCHMARKS.md.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{Duration, Instant};

use starling_cli::manifest::Manifest;
use starling_opencl::exec::{self, RunRequest};
use starling_opencl::worker::{WorkerClient, WORKER_BIN};
use starling_tests::{
    bench_progress, binary, f32_bytes, reference, workspace_root, Agent, Coordinator, Store,
};

fn median(samples: &mut [f64]) -> f64 {
    samples.sort_by(f64::total_cmp);
    samples[samples.len() / 2]
}

/// Runs `sample` `runs` times behind a progress bar and returns the medians.
fn measure<const N: usize>(
    runs: usize,
    what: &str,
    mut sample: impl FnMut() -> [f64; N],
) -> [f64; N] {
    let bar = bench_progress(runs, what);
    let mut columns: Vec<Vec<f64>> = vec![Vec::with_capacity(runs); N];
    for _ in 0..runs {
        for (column, value) in columns.iter_mut().zip(sample()) {
            column.push(value);
        }
        bar.inc(1);
    }
    bar.finish_and_clear();
    let mut medians = [0.0; N];
    for (median_out, column) in medians.iter_mut().zip(columns.iter_mut()) {
        *median_out = median(column);
    }
    medians
}

fn main() {
    let mut runs = 10usize;
    let mut size = 256usize;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--runs" => runs = args.next().and_then(|n| n.parse().ok()).unwrap_or(runs),
            "--size" => size = args.next().and_then(|n| n.parse().ok()).unwrap_or(size),
            _ => {}
        }
    }
    let n = size;
    let flops = 2.0 * (n as f64).powi(3);
    let gflops = |ms: f64| flops / (ms * 1e-3) / 1e9;

    let kernel_path = workspace_root().join("tasks/matmul/matmul.cl");
    let manifest_path = workspace_root().join("tasks/matmul/task.toml");
    let package = Manifest::load(&manifest_path)
        .unwrap()
        .package(&manifest_path)
        .unwrap();
    let a = reference::data(n * n, 1);
    let b = reference::data(n * n, 2);
    let mut input = f32_bytes(&a);
    input.extend(f32_bytes(&b));
    let scalars = vec![format!("m={n}"), format!("n={n}"), format!("k={n}")];
    let request = RunRequest {
        source: package.source.clone(),
        spec: package.spec.clone(),
        args: scalars.clone(),
        input: input.clone(),
        memory_limit_bytes: 1 << 30,
        output_limit_bytes: 64 << 20,
    };
    let want = reference::matmul(n, n, n, &a, &b);
    let check = |output: &[u8]| {
        let got = starling_tests::f32_values(output);
        let error = reference::max_relative_error(&got, &want);
        assert!(error < 1e-3, "the kernel differs from the CPU by {error}");
    };

    // The plain Rust loop, on one core.
    let [rust_ms] = measure(runs, "plain Rust loop", || {
        let start = Instant::now();
        let c = reference::matmul(n, n, n, &a, &b);
        let ms = start.elapsed().as_secs_f64() * 1e3;
        assert_eq!(c.len(), n * n);
        [ms]
    });

    // The executor in-process: the kernel alone (OpenCL profiling) and the
    // whole call (cached binary, buffers in and out).
    let cache = tempfile::tempdir().unwrap();
    let warm = exec::run(&request, Some(cache.path())).unwrap();
    check(&warm.output);
    let device = warm.device.clone();
    let [kernel_ms, exec_ms] = measure(runs, "kernel in-process", || {
        let start = Instant::now();
        let outcome = exec::run(&request, Some(cache.path())).unwrap();
        [
            outcome.kernel_ns as f64 / 1e6,
            start.elapsed().as_secs_f64() * 1e3,
        ]
    });

    // The worker process the agent starts for each task.
    let worker = WorkerClient::new(binary(WORKER_BIN), cache.path().to_path_buf());
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let [worker_ms] = measure(runs, "worker process", || {
        let start = Instant::now();
        let outcome = runtime
            .block_on(worker.run(
                &request,
                Duration::from_secs(120),
                Arc::new(AtomicBool::new(false)),
            ))
            .unwrap();
        check(&outcome.output);
        [start.elapsed().as_secs_f64() * 1e3]
    });

    // The whole path: embedded broker, SQLite, one agent, the CLI as a user runs it.
    let coordinator = Coordinator::start(None, Store::Sqlite, &[]);
    let _agent = Agent::start(&coordinator, &coordinator.mqtt, "bench", "");
    coordinator.wait_for_nodes(1, Duration::from_secs(60));
    let dir = tempfile::tempdir().unwrap();
    let input_file = dir.path().join("ab.f32");
    std::fs::write(&input_file, &input).unwrap();
    let mut command: Vec<String> = vec!["run".into(), kernel_path.display().to_string()];
    for scalar in &scalars {
        command.extend(["--arg".to_string(), scalar.clone()]);
    }
    command.extend(
        [
            "--input",
            input_file.to_str().unwrap(),
            "--max-output",
            "4MiB",
            "--timeout",
            "120s",
            "--wait",
        ]
        .map(String::from),
    );
    let command: Vec<&str> = command.iter().map(String::as_str).collect();
    let run_once = || {
        let start = Instant::now();
        let out = coordinator.cli(&command, None);
        let ms = start.elapsed().as_secs_f64() * 1e3;
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        check(&out.stdout);
        ms
    };
    // One warm-up fills the agent's artifact and binary caches, as in steady state.
    run_once();
    let [whole_ms] = measure(runs, "starling run --wait", || [run_once()]);

    let profile = if cfg!(debug_assertions) {
        "dev"
    } else {
        "release"
    };
    println!("Matrix multiply {n}×{n}×{n} (single precision), {runs} runs, medians, {profile} profile; device: {device}\n");
    println!("| implementation | time | GFLOP/s | speed-up over the Rust loop |");
    println!("| --- | ---: | ---: | ---: |");
    println!(
        "| plain Rust loop (i-k-j, one core) | {rust_ms:.1} ms | {:.2} | 1.0× |",
        gflops(rust_ms)
    );
    println!(
        "| `tasks/matmul` kernel on PoCL (kernel time) | {kernel_ms:.1} ms | {:.2} | {:.1}× |",
        gflops(kernel_ms),
        rust_ms / kernel_ms
    );
    println!("\n| layer | time | ratio to kernel time |");
    println!("| --- | ---: | ---: |");
    println!("| kernel alone (OpenCL profiling) | {kernel_ms:.1} ms | 1.0× |");
    println!(
        "| executor in-process (cached binary, buffers in and out) | {exec_ms:.1} ms | {:.1}× |",
        exec_ms / kernel_ms
    );
    println!(
        "| worker process (spawn, PoCL start, run, exit) | {worker_ms:.1} ms | {:.1}× |",
        worker_ms / kernel_ms
    );
    println!(
        "| `starling run KERNEL.cl --wait`, submit to output | {whole_ms:.1} ms | {:.1}× |",
        whole_ms / kernel_ms
    );
}
