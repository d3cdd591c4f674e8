//! `exec::run` in process, on the machine's real OpenCL (PoCL in CI).
//!
//! `exec::run` serialises OpenCL use itself (PoCL has crashed when two threads
//! initialise it at once), so these tests may run in parallel threads.

use crate::common::{arg, saxpy_spec, tiled_matmul_args, SAXPY};
use starling_opencl::exec::{self, RunError, RunRequest};
use starling_opencl::{ArgKind, DeviceType, KernelSpec, ScalarType};

const MATMUL: &str = r#"
#define TILE 16
__kernel void matmul(const uint n, __global const float *a, __global const float *b,
                     __global float *c, __local float *ta, __local float *tb) {
    uint col = get_global_id(0), row = get_global_id(1);
    uint lx = get_local_id(0), ly = get_local_id(1);
    float sum = 0.0f;
    for (uint t = 0; t < n / TILE; t++) {
        ta[ly * TILE + lx] = a[row * n + t * TILE + lx];
        tb[ly * TILE + lx] = b[(t * TILE + ly) * n + col];
        barrier(CLK_LOCAL_MEM_FENCE);
        for (uint k = 0; k < TILE; k++) sum += ta[ly * TILE + k] * tb[k * TILE + lx];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    c[row * n + col] = sum;
}
"#;

fn floats(values: impl IntoIterator<Item = f32>) -> Vec<u8> {
    values.into_iter().flat_map(f32::to_le_bytes).collect()
}

fn to_floats(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|chunk| f32::from_le_bytes(chunk.try_into().unwrap()))
        .collect()
}

/// Saxpy over `n` elements. `a * x` is exact in f32 for these values, so the
/// result is the same whether or not the compiler contracts it into an FMA.
fn saxpy_request(n: u32) -> (RunRequest, Vec<f32>) {
    let a = 2.5f32;
    let x: Vec<f32> = (0..n).map(|i| i as f32).collect();
    let y: Vec<f32> = (0..n).map(|i| 1.0 - i as f32 * 0.25).collect();
    let expected = x.iter().zip(&y).map(|(x, y)| a * x + y).collect();
    let mut input = floats(x);
    input.extend(floats(y));
    let request = RunRequest {
        source: SAXPY.into(),
        spec: saxpy_spec(),
        args: vec![format!("n={n}"), format!("a={a}")],
        input,
        memory_limit_bytes: 64 << 20,
        output_limit_bytes: 64 << 20,
    };
    (request, expected)
}

#[test]
fn saxpy_matches_the_cpu_reference_exactly() {
    let (request, expected) = saxpy_request(1000);
    let outcome = exec::run(&request, None).unwrap();
    assert_eq!(to_floats(&outcome.output), expected);
    assert!(outcome.kernel_ns > 0, "{outcome:?}");
    assert!(!outcome.device.is_empty());
    assert!(!outcome.binary_cache_hit);
}

#[test]
fn tiled_matmul_with_local_tiles_matches_the_cpu_reference() {
    let n = 64usize;
    // Deterministic values in [0, 1), varied enough to catch index mistakes.
    let a: Vec<f32> = (0..n * n)
        .map(|i| ((i * 37 + 11) % 101) as f32 / 101.0)
        .collect();
    let b: Vec<f32> = (0..n * n)
        .map(|i| ((i * 53 + 7) % 97) as f32 / 97.0)
        .collect();
    let mut expected = vec![0f32; n * n];
    for row in 0..n {
        for col in 0..n {
            expected[row * n + col] = (0..n).map(|k| a[row * n + k] * b[k * n + col]).sum();
        }
    }
    let spec = KernelSpec {
        kernel: "matmul".into(),
        device: DeviceType::Any,
        global: vec!["n".into(), "n".into()],
        local: vec!["16".into(), "16".into()],
        build_options: "-cl-mad-enable".into(),
        args: tiled_matmul_args(),
    };
    let mut input = floats(a);
    input.extend(floats(b));
    let request = RunRequest {
        source: MATMUL.into(),
        spec,
        args: vec![format!("n={n}")],
        input,
        memory_limit_bytes: 1 << 20,
        output_limit_bytes: 1 << 20,
    };
    let outcome = exec::run(&request, None).unwrap();
    let got = to_floats(&outcome.output);
    assert_eq!(got.len(), n * n);
    for (index, (got, want)) in got.iter().zip(&expected).enumerate() {
        assert!(
            (got - want).abs() <= 1e-3,
            "c[{index}] = {got}, expected {want}"
        );
    }
}

#[test]
fn a_syntax_error_gives_the_build_log() {
    let (mut request, _) = saxpy_request(16);
    request.source = "__kernel void saxpy(const uint n, const float a, __global const float *x, __global float *y) {\n    uint i = get_global_id(0)\n    y[i] = a * x[i] + y[i];\n}\n".into();
    let error = exec::run(&request, None).unwrap_err();
    let RunError::Build { device, log } = &error else {
        panic!("expected a build error, got {error:?}");
    };
    assert!(!device.is_empty());
    assert!(log.contains("error"), "{log}");
    // The missing ';' is reported against line 2 of the source.
    assert!(log.contains("kernel.cl:2:"), "{log}");
    assert!(
        !log.contains("/kcache/"),
        "the node's paths stay private: {log}"
    );
    assert_eq!(
        error.failure_reason(),
        starling_proto::FailureReason::BuildFailed
    );
}

/// Saxpy with a scratch buffer whose length comes from a scalar.
fn scratch_request(scratch_len: u64, memory_limit_bytes: u64) -> RunRequest {
    let (mut request, _) = saxpy_request(256);
    request.source = SAXPY.replace(
        "__global float *y)",
        "__global float *y, __global float *scratch, const ulong m)",
    );
    request.spec.args.push(arg(
        "scratch",
        ArgKind::Scratch,
        ScalarType::Float,
        Some("m"),
    ));
    request
        .spec
        .args
        .push(arg("m", ArgKind::Scalar, ScalarType::Ulong, None));
    request.args.push(format!("m={scratch_len}"));
    request.memory_limit_bytes = memory_limit_bytes;
    request
}

#[test]
fn a_buffer_over_the_device_max_alloc_is_refused_before_allocating() {
    let device = &starling_opencl::probe::list_devices()[0];
    // One element more than the device's largest allocation: allocating it
    // would fail (or, worse, succeed lazily); the check must come first.
    let huge = device.max_alloc_bytes / 4 + 1;
    let started = std::time::Instant::now();
    let error = exec::run(&scratch_request(huge, u64::MAX), None).unwrap_err();
    let RunError::TooLarge(message) = &error else {
        panic!("expected TooLarge, got {error:?}");
    };
    assert!(message.contains("`scratch`"), "{message}");
    assert!(message.contains(&(huge * 4).to_string()), "{message}");
    assert!(message.contains("max alloc"), "{message}");
    assert!(
        message.contains(&device.max_alloc_bytes.to_string()),
        "{message}"
    );
    assert!(started.elapsed() < std::time::Duration::from_secs(10));
}

#[test]
fn buffers_over_the_memory_limit_are_refused() {
    // x and y take 2 × 256 × 4 = 2048 bytes, scratch 4096 more.
    let error = exec::run(&scratch_request(1024, 4096), None).unwrap_err();
    let RunError::TooLarge(message) = &error else {
        panic!("expected TooLarge, got {error:?}");
    };
    assert!(message.contains("6144 bytes"), "{message}");
    assert!(message.contains("memory limit (4096 bytes)"), "{message}");
    assert!(message.contains("`scratch`"), "{message}");
    // Within the limit, the same kernel runs and the scratch buffer is unused.
    let outcome = exec::run(&scratch_request(1024, 6144), None).unwrap();
    assert_eq!(outcome.output.len(), 1024);
}

#[test]
fn output_over_the_limit_is_refused() {
    let (mut request, _) = saxpy_request(256);
    request.output_limit_bytes = 1023;
    assert_eq!(
        exec::run(&request, None).unwrap_err(),
        RunError::OutputLimit {
            bytes: 1024,
            limit: 1023
        }
    );
}

#[test]
fn the_second_run_loads_the_cached_binary_and_a_bad_binary_is_rebuilt() {
    let cache = tempfile::tempdir().unwrap();
    let (mut request, expected) = saxpy_request(300);
    // A source of its own, so no other test's run shares the cache entry.
    request.source = format!("// binary cache test\n{SAXPY}");
    let first = exec::run(&request, Some(cache.path())).unwrap();
    assert!(!first.binary_cache_hit);
    let binaries: Vec<_> = std::fs::read_dir(cache.path().join("binaries"))
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .collect();
    assert_eq!(binaries.len(), 1, "{binaries:?}");

    let second = exec::run(&request, Some(cache.path())).unwrap();
    assert!(second.binary_cache_hit);
    assert_eq!(to_floats(&second.output), expected);
    assert_eq!(second.output, first.output);

    // A binary the driver refuses is dropped and rebuilt from source.
    std::fs::write(&binaries[0], b"not a program binary").unwrap();
    let third = exec::run(&request, Some(cache.path())).unwrap();
    assert!(!third.binary_cache_hit);
    assert_eq!(to_floats(&third.output), expected);
    let fourth = exec::run(&request, Some(cache.path())).unwrap();
    assert!(fourth.binary_cache_hit);
}

#[test]
fn a_scalar_of_the_wrong_type_is_a_mismatch() {
    let (mut request, _) = saxpy_request(16);
    // The kernel's `a` is a float; declaring it `int` would pass garbage.
    request.spec.args[1].ty = ScalarType::Int;
    request.args[1] = "a=2".into();
    let error = exec::run(&request, None).unwrap_err();
    let RunError::Mismatch(message) = &error else {
        panic!("expected Mismatch, got {error:?}");
    };
    assert!(message.contains("`a`"), "{message}");
    assert!(message.contains("float"), "{message}");
}

#[test]
fn a_buffer_declared_as_a_scalar_is_a_mismatch() {
    let (mut request, _) = saxpy_request(16);
    // Everything but the kernel says x is a scalar: bind accepts it (it never
    // reads the source), the compiled kernel's argument info does not.
    request.spec.args[2] = arg("x", ArgKind::Scalar, ScalarType::Float, None);
    request.spec.args[3].kind = ArgKind::In;
    request.args.push("x=1".into());
    request.input.truncate(16 * 4);
    let error = exec::run(&request, None).unwrap_err();
    let RunError::Mismatch(message) = &error else {
        panic!("expected Mismatch, got {error:?}");
    };
    assert!(message.contains("`x`"), "{message}");
    assert!(message.contains("__global"), "{message}");
}

#[test]
fn a_missing_kernel_and_a_wrong_argument_count_are_mismatches() {
    let (mut request, _) = saxpy_request(16);
    request.spec.kernel = "saxpy2".into();
    let error = exec::run(&request, None).unwrap_err();
    assert!(
        matches!(&error, RunError::Mismatch(message) if message.contains("saxpy2")),
        "{error:?}"
    );

    let (mut request, _) = saxpy_request(16);
    request.source = SAXPY.replace(
        "__global float *y)",
        "__global float *y, const uint unused)",
    );
    let error = exec::run(&request, None).unwrap_err();
    assert!(
        matches!(&error, RunError::Mismatch(message) if message.contains("takes 5 arguments")),
        "{error:?}"
    );
}

#[test]
fn a_gpu_only_kernel_on_a_cpu_only_node_finds_no_device() {
    let devices = starling_opencl::probe::list_devices();
    if devices
        .iter()
        .any(|device| device.kind == starling_proto::GpuKind::Gpu)
    {
        eprintln!("skipped: this machine has an OpenCL GPU");
        return;
    }
    let (mut request, _) = saxpy_request(16);
    request.spec.device = DeviceType::Gpu;
    let error = exec::run(&request, None).unwrap_err();
    let RunError::NoDevice { wanted, available } = &error else {
        panic!("expected NoDevice, got {error:?}");
    };
    assert_eq!(*wanted, DeviceType::Gpu);
    assert!(available.contains(&devices[0].name), "{available}");
}

#[test]
fn bad_arguments_are_refused_as_spec_errors() {
    let (mut request, _) = saxpy_request(16);
    request.input.pop();
    let error = exec::run(&request, None).unwrap_err();
    assert!(matches!(error, RunError::Spec(_)), "{error:?}");
    assert_eq!(
        error.failure_reason(),
        starling_proto::FailureReason::InvalidInput
    );
}

#[test]
fn argument_checks_hold_for_a_program_loaded_from_the_binary_cache() {
    let cache = tempfile::tempdir().unwrap();
    let (mut request, _) = saxpy_request(16);
    request.source = format!("// cached argument info test\n{SAXPY}");
    exec::run(&request, Some(cache.path())).unwrap();
    request.spec.args[1].ty = ScalarType::Int;
    request.args[1] = "a=2".into();
    let error = exec::run(&request, Some(cache.path())).unwrap_err();
    assert!(
        matches!(&error, RunError::Mismatch(message) if message.contains("`a`")),
        "{error:?}"
    );
}
