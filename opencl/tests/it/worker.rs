//! The worker process through its agent-side client, on the machine's real
//! OpenCL (PoCL in CI).

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::{arg, saxpy_spec, spec, SAXPY};
use starling_opencl::exec::{RunError, RunRequest};
use starling_opencl::worker::WorkerClient;
use starling_opencl::{ArgKind, ScalarType};

/// Every test here spawns workers and some check that none is left behind,
/// so they take turns.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn worker_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_starling-opencl-worker"))
}

fn client(cache: &tempfile::TempDir) -> WorkerClient {
    WorkerClient::new(worker_bin(), cache.path().to_path_buf())
}

fn saxpy() -> (RunRequest, Vec<u8>) {
    let n = 64u32;
    let x: Vec<f32> = (0..n).map(|i| i as f32).collect();
    let y: Vec<f32> = (0..n).map(|i| i as f32 * 0.5).collect();
    let expected: Vec<u8> = x
        .iter()
        .zip(&y)
        .flat_map(|(x, y)| (2.0 * x + y).to_le_bytes())
        .collect();
    let input = x.iter().chain(&y).flat_map(|v| v.to_le_bytes()).collect();
    let request = RunRequest {
        source: SAXPY.into(),
        spec: saxpy_spec(),
        args: vec![format!("n={n}"), "a=2".into()],
        input,
        memory_limit_bytes: 1 << 20,
        output_limit_bytes: 1 << 20,
    };
    (request, expected)
}

/// A kernel that never ends: it spins on a flag in global memory that
/// nothing changes, storing on every turn so the loop cannot be dropped.
fn endless() -> RunRequest {
    RunRequest {
        source: r#"
__kernel void spin(__global const int *flag, __global float *out) {
    uint i = get_global_id(0);
    while (flag[0] == 0) { out[i] += 1.0f; }
}
"#
        .into(),
        spec: spec(
            "spin",
            &["1"],
            vec![
                arg("flag", ArgKind::In, ScalarType::Int, Some("1")),
                arg("out", ArgKind::Out, ScalarType::Float, Some("1")),
            ],
        ),
        args: vec![],
        input: vec![0; 4],
        memory_limit_bytes: 1 << 20,
        output_limit_bytes: 1 << 20,
    }
}

/// Worker processes this test process started that still exist (zombies
/// included: a child that was killed but not reaped counts).
fn live_workers() -> Vec<u32> {
    let me = std::process::id();
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        // `pid (comm) state ppid ...`; comm may hold spaces, so split after
        // its closing parenthesis.
        let (Some(open), Some(close)) = (stat.find('('), stat.rfind(')')) else {
            continue;
        };
        let comm = &stat[open + 1..close];
        let ppid = stat[close + 1..]
            .split_whitespace()
            .nth(1)
            .and_then(|field| field.parse::<u32>().ok());
        if ppid == Some(me) && comm.starts_with("starling-openc") {
            found.push(pid);
        }
    }
    found
}

#[tokio::test]
async fn probe_reports_calibrated_devices_and_reuses_the_calibration() {
    let _turn = SERIAL.lock().await;
    let cache = tempfile::tempdir().unwrap();
    let client = client(&cache);

    let started = Instant::now();
    let devices = client.probe(true, Duration::from_secs(60)).await.unwrap();
    let first_time = started.elapsed();
    assert!(!devices.is_empty(), "PoCL gives at least one device");
    for device in &devices {
        assert!(!device.platform.is_empty(), "{device:?}");
        assert!(!device.vendor.is_empty(), "{device:?}");
        assert!(!device.name.is_empty(), "{device:?}");
        assert!(device.version.starts_with("OpenCL "), "{device:?}");
        assert!(!device.driver_version.is_empty(), "{device:?}");
        assert!(device.compute_units > 0, "{device:?}");
        assert!(device.max_clock_mhz > 0, "{device:?}");
        assert!(device.global_mem_bytes > 0, "{device:?}");
        assert!(device.local_mem_bytes > 0, "{device:?}");
        assert!(device.max_alloc_bytes > 0, "{device:?}");
        assert!(
            device.max_alloc_bytes <= device.global_mem_bytes,
            "{device:?}"
        );
        assert!(device.max_work_group_size > 0, "{device:?}");
        let gflops = device.gflops.expect("calibrated");
        assert!(gflops > 0.0 && gflops.is_finite(), "{device:?}");
        let proto = device.to_proto();
        assert_eq!(proto.gflops, Some(gflops as f32));
        assert_eq!(proto.memory_bytes, device.global_mem_bytes);
    }
    assert!(cache.path().join("calibration.json").is_file());

    let started = Instant::now();
    let again = client.probe(true, Duration::from_secs(60)).await.unwrap();
    let second_time = started.elapsed();
    assert_eq!(again, devices, "the cached figure is the same figure");
    assert!(
        second_time < first_time,
        "served from the cache: {second_time:?} vs {first_time:?}"
    );

    let uncalibrated = client.probe(false, Duration::from_secs(60)).await.unwrap();
    assert_eq!(uncalibrated.len(), devices.len());
    assert!(uncalibrated.iter().all(|device| device.gflops.is_none()));
}

#[tokio::test]
async fn a_kernel_runs_through_the_worker_and_errors_come_back_typed() {
    let _turn = SERIAL.lock().await;
    let cache = tempfile::tempdir().unwrap();
    let client = client(&cache);
    let cancel = Arc::new(AtomicBool::new(false));
    let (request, expected) = saxpy();
    let outcome = client
        .run(&request, Duration::from_secs(60), cancel.clone())
        .await
        .unwrap();
    assert_eq!(outcome.output, expected);
    assert!(outcome.kernel_ns > 0);
    assert!(!outcome.binary_cache_hit);
    let outcome = client
        .run(&request, Duration::from_secs(60), cancel.clone())
        .await
        .unwrap();
    assert!(outcome.binary_cache_hit, "the cache dir is passed on");

    let mut broken = request.clone();
    broken.source = broken
        .source
        .replace("get_global_id(0);", "get_global_id(0)");
    let error = client
        .run(&broken, Duration::from_secs(60), cancel.clone())
        .await
        .unwrap_err();
    assert!(
        matches!(&error, RunError::Build { log, .. } if log.contains("kernel.cl:")),
        "{error:?}"
    );

    let mut short = request.clone();
    short.input.truncate(8);
    let error = client
        .run(&short, Duration::from_secs(60), cancel)
        .await
        .unwrap_err();
    assert!(matches!(error, RunError::Spec(_)), "{error:?}");
    assert!(live_workers().is_empty());
}

#[tokio::test]
async fn a_kernel_that_never_ends_is_killed_at_the_timeout() {
    let _turn = SERIAL.lock().await;
    let cache = tempfile::tempdir().unwrap();
    let client = client(&cache);
    let cancel = Arc::new(AtomicBool::new(false));

    let started = Instant::now();
    let error = client
        .run(&endless(), Duration::from_secs(1), cancel.clone())
        .await
        .unwrap_err();
    let took = started.elapsed();
    assert_eq!(error, RunError::Timeout { wall_ms: 1000 });
    assert!(took >= Duration::from_secs(1), "{took:?}");
    assert!(took < Duration::from_millis(2500), "{took:?}");
    assert_eq!(live_workers(), Vec::<u32>::new(), "the worker is gone");

    let (request, expected) = saxpy();
    let outcome = client
        .run(&request, Duration::from_secs(60), cancel)
        .await
        .unwrap();
    assert_eq!(outcome.output, expected);
}

#[tokio::test]
async fn a_cancelled_run_kills_the_worker() {
    let _turn = SERIAL.lock().await;
    let cache = tempfile::tempdir().unwrap();
    let client = client(&cache);
    let cancel = Arc::new(AtomicBool::new(false));
    let flag = cancel.clone();
    let canceller = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(500)).await;
        // The spinning worker is alive when the cancel comes, so the check
        // after the run sees a real disappearance.
        let alive = live_workers();
        flag.store(true, Ordering::SeqCst);
        alive
    });

    let started = Instant::now();
    let error = client
        .run(&endless(), Duration::from_secs(60), cancel)
        .await
        .unwrap_err();
    let took = started.elapsed();
    assert_eq!(error, RunError::Cancelled);
    assert_eq!(canceller.await.unwrap().len(), 1, "one worker ran");
    assert!(took >= Duration::from_millis(500), "{took:?}");
    assert!(took < Duration::from_millis(2000), "{took:?}");
    assert_eq!(live_workers(), Vec::<u32>::new(), "the worker is gone");

    // Already cancelled: no worker is started at all.
    let started = Instant::now();
    let error = client
        .run(
            &saxpy().0,
            Duration::from_secs(60),
            Arc::new(AtomicBool::new(true)),
        )
        .await
        .unwrap_err();
    assert_eq!(error, RunError::Cancelled);
    assert!(started.elapsed() < Duration::from_millis(200));

    let (request, expected) = saxpy();
    let outcome = client
        .run(
            &request,
            Duration::from_secs(60),
            Arc::new(AtomicBool::new(false)),
        )
        .await
        .unwrap();
    assert_eq!(outcome.output, expected);
}

#[tokio::test]
async fn a_missing_or_broken_worker_is_a_worker_error() {
    let _turn = SERIAL.lock().await;
    let cache = tempfile::tempdir().unwrap();
    let cancel = Arc::new(AtomicBool::new(false));
    let (request, _) = saxpy();

    let missing = WorkerClient::new(
        PathBuf::from("/nonexistent/starling-opencl-worker"),
        cache.path().to_path_buf(),
    );
    let error = missing
        .run(&request, Duration::from_secs(10), cancel.clone())
        .await
        .unwrap_err();
    assert!(
        matches!(&error, RunError::Worker(message) if message.contains("/nonexistent/starling-opencl-worker")),
        "{error:?}"
    );
    let error = missing
        .probe(false, Duration::from_secs(10))
        .await
        .unwrap_err();
    assert!(matches!(error, RunError::Worker(_)), "{error:?}");

    // A program that exits 0 but answers text, not CBOR.
    let garbage = WorkerClient::new(PathBuf::from("/bin/echo"), cache.path().to_path_buf());
    let error = garbage
        .run(&request, Duration::from_secs(10), cancel.clone())
        .await
        .unwrap_err();
    assert!(
        matches!(&error, RunError::Worker(message) if message.contains("not a CBOR run result")),
        "{error:?}"
    );

    // A program that fails: its exit status is in the message.
    let failing = WorkerClient::new(PathBuf::from("/bin/false"), cache.path().to_path_buf());
    let error = failing
        .run(&request, Duration::from_secs(10), cancel)
        .await
        .unwrap_err();
    assert!(
        matches!(&error, RunError::Worker(message) if message.contains("exit status: 1")),
        "{error:?}"
    );
}

#[tokio::test]
async fn the_worker_refuses_a_request_that_is_not_cbor() {
    let _turn = SERIAL.lock().await;
    let output = tokio::process::Command::new(worker_bin())
        .arg("run")
        .stdin(std::process::Stdio::null())
        .output()
        .await
        .unwrap();
    assert!(!output.status.success());
    assert!(output.stdout.is_empty());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("not a CBOR run request"), "{stderr}");

    let help = tokio::process::Command::new(worker_bin())
        .arg("--help")
        .output()
        .await
        .unwrap();
    assert!(help.status.success());
    let text = String::from_utf8_lossy(&help.stdout);
    assert!(text.contains("started by the Starling agent"), "{text}");
}

#[test]
fn locate_finds_the_worker_beside_the_test_binary() {
    // Test binaries live in target/<profile>/deps/, the worker one level up.
    let found = WorkerClient::locate(None).expect("the worker is built for integration tests");
    assert!(found.is_file(), "{found:?}");
    assert_eq!(
        found.file_name().unwrap().to_string_lossy(),
        format!(
            "{}{}",
            starling_opencl::worker::WORKER_BIN,
            std::env::consts::EXE_SUFFIX
        )
    );
}

#[test]
fn a_machine_without_an_opencl_platform_reports_no_devices() {
    // The ICD loader finds no vendor file, as on a node without any driver.
    let output = std::process::Command::new(worker_bin())
        .args(["probe", "--no-calibrate"])
        .env("OCL_ICD_VENDORS", "/nonexistent-starling-test")
        .output()
        .unwrap();
    assert!(output.status.success(), "{output:?}");
    let devices: Vec<serde_json::Value> = serde_json::from_slice(&output.stdout).unwrap();
    assert!(devices.is_empty(), "{devices:?}");
    assert!(
        String::from_utf8_lossy(&output.stderr).contains("no OpenCL platform"),
        "the log line says why: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}
