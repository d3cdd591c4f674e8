//! OpenCL tasks end to end on PoCL: the example kernels in `tasks/` published
//! and run through `starling run` via a coordinator and an agent, checked
//! against CPU references; and every way a kernel can be wrong ends in a clear
//! error while the agent keeps serving.

use std::path::Path;
use std::time::Duration;

use starling_tests::{
    f32_bytes, f32_values, kernel_file, reference, workspace_root, Agent, Coordinator, Mosquitto,
    Store,
};

/// A coordinator on Mosquitto and SQLite with one agent whose OpenCL devices
/// (PoCL's CPU device) have been probed; returns the node's capability.
fn cluster() -> (Mosquitto, Coordinator, Agent, serde_json::Value) {
    let broker = Mosquitto::start();
    let coordinator = Coordinator::start(Some(&broker.url), Store::Sqlite, &[]);
    // The node's memory cap is raised past its RAM: the tests here ask for
    // the whole device, to reach the OpenCL limits behind the cap.
    let agent = Agent::start_with(
        &coordinator,
        &broker.url,
        "gpu-node",
        "",
        None,
        &["--max-task-memory", "1024GiB"],
    );
    coordinator.wait_for_nodes(1, Duration::from_secs(60));
    let out = coordinator.cli(&["node", "gpu-node"], None);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let node: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let capability = node["capability"].clone();
    (broker, coordinator, agent, capability)
}

/// Runs `starling run KERNEL --wait --json` with scalars and input bytes.
fn run_kernel(
    coordinator: &Coordinator,
    kernel: &Path,
    args: &[&str],
    input: &[u8],
    extra: &[&str],
) -> (Option<i32>, serde_json::Value, String) {
    let dir = tempfile::tempdir().unwrap();
    let input_file = dir.path().join("input.bin");
    std::fs::write(&input_file, input).unwrap();
    let mut command = vec!["run", kernel.to_str().unwrap()];
    for arg in args {
        command.extend(["--arg", arg]);
    }
    command.extend(["--input", input_file.to_str().unwrap()]);
    command.extend(extra);
    command.extend(["--wait", "--json"]);
    let out = coordinator.cli(&command, None);
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    let task = serde_json::from_slice(&out.stdout).unwrap_or(serde_json::Value::Null);
    (out.status.code(), task, stderr)
}

fn output_floats(task: &serde_json::Value) -> Vec<f32> {
    use base64::Engine as _;
    let encoded = task["output_base64"].as_str().unwrap_or_default();
    f32_values(
        &base64::engine::general_purpose::STANDARD
            .decode(encoded)
            .unwrap(),
    )
}

fn saxpy_kernel() -> std::path::PathBuf {
    workspace_root().join("tasks/saxpy/saxpy.cl")
}

/// Runs saxpy on n elements and checks the result against the CPU.
fn check_saxpy(coordinator: &Coordinator, n: usize) {
    let x = reference::data(n, 1);
    let y = reference::data(n, 2);
    let mut input = f32_bytes(&x);
    input.extend(f32_bytes(&y));
    let n_arg = format!("n={n}");
    let (code, task, stderr) = run_kernel(
        coordinator,
        &saxpy_kernel(),
        &[&n_arg, "a=1.5"],
        &input,
        &[],
    );
    assert_eq!(code, Some(0), "{stderr}\n{task}");
    assert_eq!(task["runtime"], "opencl", "{task}");
    let got = output_floats(&task);
    let want = reference::saxpy(1.5, &x, &y);
    // A device may fuse a·x + y into one FMA: one rounding instead of two.
    let error = reference::max_relative_error(&got, &want);
    assert!(error < 1e-6, "saxpy differs from the CPU by {error}");
}

#[test]
fn example_kernels_run_end_to_end_on_pocl_and_match_the_cpu() {
    let _turn = crate::alongside();
    let (_broker, coordinator, _agent, capability) = cluster();
    let runtimes = capability["runtimes"].as_array().unwrap();
    assert!(
        runtimes.iter().any(|r| r == "opencl"),
        "the agent advertises OpenCL: {capability}"
    );
    let device = &capability["gpus"][0];
    assert_eq!(device["kind"], "cpu", "PoCL's device: {device}");
    assert!(
        device["gflops"].as_f64().unwrap() > 0.0,
        "calibrated: {device}"
    );
    assert!(device["max_alloc_bytes"].as_u64().unwrap() > 0, "{device}");

    check_saxpy(&coordinator, 10_000);

    // Sizes that are not multiples of the 16×16 tile exercise the edges.
    let (m, n, k) = (70usize, 50usize, 40usize);
    let a = reference::data(m * k, 3);
    let b = reference::data(k * n, 4);
    let mut input = f32_bytes(&a);
    input.extend(f32_bytes(&b));
    let kernel = workspace_root().join("tasks/matmul/matmul.cl");
    let (code, task, stderr) = run_kernel(
        &coordinator,
        &kernel,
        &["m=70", "n=50", "k=40"],
        &input,
        &[],
    );
    assert_eq!(code, Some(0), "{stderr}\n{task}");
    let got = output_floats(&task);
    let want = reference::matmul(m, n, k, &a, &b);
    let error = reference::max_relative_error(&got, &want);
    assert!(error < 1e-4, "matmul differs from the CPU by {error}");
    assert_eq!(task["node_id"], "gpu-node");
}

#[test]
fn bad_kernels_fail_clearly_and_the_agent_keeps_serving() {
    let _turn = crate::alongside();
    let (_broker, coordinator, agent, capability) = cluster();
    let dir = tempfile::tempdir().unwrap();

    // A spec whose argument list does not match the kernel: refused by
    // `starling publish` before upload, and by the coordinator on upload.
    let mismatched = kernel_file(
        dir.path(),
        "mismatched",
        "__kernel void scale(__global float *y, const float a) { y[get_global_id(0)] *= a; }",
        "kernel = \"scale\"\nglobal = [\"4\"]\n[[opencl.args]]\nname = \"y\"\nkind = \"inout\"\ntype = \"float\"\nlen = \"4\"\n",
    );
    let out = coordinator.cli(&["publish", mismatched.to_str().unwrap()], None);
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("does not match"), "{stderr}");
    let package = serde_json::json!({
        "format": "starling-opencl/1",
        "source": "__kernel void scale(__global float *y, const float a) { y[get_global_id(0)] *= a; }",
        "spec": {
            "kernel": "scale",
            "global": ["4"],
            "args": [{"name": "y", "kind": "inout", "type": "float", "len": "4"}]
        }
    });
    let (status, body) = post_artifact(&coordinator, package.to_string().into_bytes());
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["error"], "invalid_kernel", "{body}");
    assert!(
        body["message"].as_str().unwrap().contains("does not match"),
        "{body}"
    );

    // Submissions that do not fit the spec are refused at once (exit 2).
    let (code, _, stderr) = run_kernel(&coordinator, &saxpy_kernel(), &["n=abc"], &[], &[]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("invalid kernel arguments"), "{stderr}");
    let (code, _, stderr) = run_kernel(
        &coordinator,
        &saxpy_kernel(),
        &["n=4"],
        &f32_bytes(&[1.0; 3]),
        &[],
    );
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains("32 bytes"),
        "the layout says what to send: {stderr}"
    );

    // A kernel that does not compile: the build log reaches the failure.
    let broken = kernel_file(
        dir.path(),
        "broken",
        "__kernel void broken(__global float *y) { y[0] = no_such_variable; }",
        "kernel = \"broken\"\nglobal = [\"1\"]\n[[opencl.args]]\nname = \"y\"\nkind = \"out\"\ntype = \"float\"\nlen = \"1\"\n",
    );
    let (code, task, stderr) = run_kernel(&coordinator, &broken, &[], &[], &[]);
    assert_eq!(code, Some(1), "{stderr}");
    assert_eq!(task["reason"], "build_failed", "{task}");
    assert!(
        task["message"]
            .as_str()
            .unwrap()
            .contains("no_such_variable"),
        "{task}"
    );

    // A kernel that never ends is stopped at its limit.
    let spin = kernel_file(
        dir.path(),
        "spin",
        "__kernel void spin(__global const int *flag, __global float *out) {\n  while (flag[0] == 0) { out[0] += 1.0f; }\n}",
        "kernel = \"spin\"\nglobal = [\"1\"]\n[[opencl.args]]\nname = \"flag\"\nkind = \"in\"\ntype = \"int\"\nlen = \"1\"\n[[opencl.args]]\nname = \"out\"\nkind = \"out\"\ntype = \"float\"\nlen = \"1\"\n",
    );
    let started = std::time::Instant::now();
    let (code, task, stderr) = run_kernel(&coordinator, &spin, &[], &[0; 4], &["--timeout", "2s"]);
    assert_eq!(code, Some(1), "{stderr}");
    assert_eq!(task["reason"], "timeout", "{task}");
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "stopped near its limit"
    );

    // A buffer larger than the device allows in one allocation, though within
    // its memory: the agent refuses it before allocating anything.
    let max_alloc = capability["gpus"][0]["max_alloc_bytes"].as_u64().unwrap();
    let global = capability["gpus"][0]["memory_bytes"].as_u64().unwrap();
    let elements = max_alloc / 4 + 1024;
    if elements * 4 <= global {
        let big = kernel_file(
            dir.path(),
            "big",
            "__kernel void big(const ulong n, __global float *scratch, __global float *out) { out[0] = scratch[n - 1]; }",
            "kernel = \"big\"\nglobal = [\"1\"]\n[[opencl.args]]\nname = \"n\"\nkind = \"scalar\"\ntype = \"ulong\"\n[[opencl.args]]\nname = \"scratch\"\nkind = \"scratch\"\ntype = \"float\"\nlen = \"n\"\n[[opencl.args]]\nname = \"out\"\nkind = \"out\"\ntype = \"float\"\nlen = \"1\"\n",
        );
        let n_arg = format!("n={elements}");
        let memory = format!("{}", global);
        let (code, task, stderr) =
            run_kernel(&coordinator, &big, &[&n_arg], &[], &["--memory", &memory]);
        assert_eq!(code, Some(1), "{stderr}");
        assert_eq!(task["reason"], "memory_limit", "{task}");
        assert!(
            task["message"].as_str().unwrap().contains("scratch"),
            "names the buffer: {task}"
        );
    }

    // A task whose buffers exceed the task's own memory limit is refused at submission.
    let (code, _, stderr) = run_kernel(
        &coordinator,
        &saxpy_kernel(),
        &["n=16384"],
        &vec![0; 128 << 10],
        &["--memory", "64KiB"],
    );
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("--memory"), "{stderr}");

    // Through all of that the agent stayed up and serves the next task.
    check_saxpy(&coordinator, 256);
    let mut agent = agent;
    assert!(agent.process.is_running(), "{}", agent.process.log());
}

/// POSTs raw bytes to `/api/v1/artifacts`, returning the status and JSON body.
fn post_artifact(coordinator: &Coordinator, bytes: Vec<u8>) -> (u16, serde_json::Value) {
    let (status, text) = coordinator.http(
        "POST",
        "/api/v1/artifacts",
        Some(("application/vnd.starling.opencl+json", bytes)),
    );
    (status, serde_json::from_str(&text).unwrap())
}
