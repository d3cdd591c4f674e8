//! Shared helpers for the cross-process tests: spawn a real Mosquitto, the real
//! coordinator and agent binaries, and the `starling` CLI, each on ephemeral
//! ports and in temporary directories, and tear them all down on drop.
//!
//! The binaries are built once per test run (`cargo build --bins`), into the
//! same target directory as the tests, so the tests always run what the
//! workspace holds now.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::{mpsc, Once};
use std::time::{Duration, Instant};

use tempfile::TempDir;

/// The workspace root.
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ sits inside the workspace")
        .to_path_buf()
}

fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("target"))
}

/// Whether this test or benchmark was built with the release profile; the
/// binaries under test are then built and taken from the same profile.
fn release() -> bool {
    std::env::current_exe()
        .map(|p| p.components().any(|c| c.as_os_str() == "release"))
        .unwrap_or(false)
}

static BUILD: Once = Once::new();

/// The path of one of the workspace's binaries, built on first use.
pub fn binary(name: &str) -> PathBuf {
    BUILD.call_once(|| {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        // The same selection `cargo test --workspace` (and scripts/test) builds:
        // the features cargo unifies depend on it, and any other selection
        // would rebuild the dependencies with another feature set.
        let mut command = Command::new(cargo);
        command
            .current_dir(workspace_root())
            .args(["build", "--quiet", "--workspace", "--bins"]);
        if release() {
            command.args(["--release", "--benches"]);
        } else {
            command.arg("--tests");
        }
        let status = command
            .status()
            .expect("run cargo build for the binaries under test");
        assert!(status.success(), "building the binaries under test failed");
    });
    let profile = if release() { "release" } else { "debug" };
    let path = target_dir().join(profile).join(name);
    assert!(path.exists(), "{} was not built", path.display());
    path
}

/// A free TCP port on the loopback interface. Another process may take it
/// between this call and its use; the window is small and tests retry nothing
/// else, so a clash shows up as a clear bind error.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("bind an ephemeral port")
}

/// Waits until something accepts TCP connections on `addr`.
pub fn wait_for_port(addr: SocketAddr, timeout: Duration) {
    let start = Instant::now();
    while TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_err() {
        assert!(
            start.elapsed() < timeout,
            "nothing listens on {addr} after {timeout:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A child process killed when dropped, with its output kept in a log file
/// that is printed if the test fails.
pub struct Process {
    name: String,
    child: Child,
    log: PathBuf,
}

impl Process {
    fn spawn(name: &str, mut command: Command, dir: &Path) -> Self {
        let log = dir.join(format!("{name}.log"));
        let file = std::fs::File::create(&log).unwrap();
        command
            .stdout(Stdio::piped())
            .stderr(file)
            .stdin(Stdio::null());
        let child = command
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {name}: {e}"));
        Self {
            name: name.to_string(),
            child,
            log,
        }
    }

    /// Whether the process is still running.
    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// The process's stderr so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The exit code, once the process has ended.
    pub fn exit_code(&mut self) -> Option<i32> {
        self.child.try_wait().ok().flatten().and_then(|s| s.code())
    }

    /// Stops the process with SIGTERM, then SIGKILL after a grace period.
    pub fn stop(&mut self) {
        if self.is_running() {
            let _ = Command::new("kill")
                .args(["-TERM", &self.child.id().to_string()])
                .status();
            let start = Instant::now();
            while self.is_running() && start.elapsed() < Duration::from_secs(5) {
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        self.stop();
        if std::thread::panicking() {
            eprintln!("----- {} log -----\n{}", self.name, self.log());
        }
    }
}

/// A Mosquitto broker on an ephemeral port, killed on drop.
pub struct Mosquitto {
    /// The broker's URL, `mqtt://127.0.0.1:PORT`.
    pub url: String,
    /// Its port.
    pub port: u16,
    process: Process,
    dir: TempDir,
}

impl Mosquitto {
    /// Starts `mosquitto` with a private config on a free port.
    pub fn start() -> Self {
        let dir = TempDir::new().unwrap();
        let port = free_port();
        std::fs::write(
            dir.path().join("mosquitto.conf"),
            format!(
                "listener {port} 127.0.0.1\nallow_anonymous true\npersistence false\nmax_packet_size 2000000\n"
            ),
        )
        .unwrap();
        let process = Self::spawn(dir.path(), port);
        Self {
            url: format!("mqtt://127.0.0.1:{port}"),
            port,
            process,
            dir,
        }
    }

    /// Stops the broker and starts a fresh one (it keeps nothing) on the same port.
    pub fn restart(&mut self) {
        self.process.stop();
        self.process = Self::spawn(self.dir.path(), self.port);
    }

    fn spawn(dir: &Path, port: u16) -> Process {
        let binary = ["/usr/sbin/mosquitto", "/usr/bin/mosquitto"]
            .into_iter()
            .find(|p| Path::new(p).exists())
            .expect("mosquitto is installed (scripts/setup installs it)");
        let mut command = Command::new(binary);
        command.arg("-c").arg(dir.join("mosquitto.conf"));
        let process = Process::spawn("mosquitto", command, dir);
        wait_for_port(
            SocketAddr::from(([127, 0, 0, 1], port)),
            Duration::from_secs(10),
        );
        process
    }
}

/// Where the coordinator keeps its state.
pub enum Store {
    /// SQLite under the coordinator's data dir (the default).
    Sqlite,
    /// A PostgreSQL database, by URL.
    Postgres(String),
}

/// A running `starling-coordinator serve`.
pub struct Coordinator {
    /// The REST base URL, `http://127.0.0.1:PORT`.
    pub rest: String,
    /// The MQTT URL agents should use.
    pub mqtt: String,
    /// The process.
    pub process: Process,
    /// The data dir.
    pub dir: TempDir,
}

impl Coordinator {
    /// Starts a coordinator with the embedded broker (`broker: None`) or against
    /// an external one, with the given store and extra flags.
    pub fn start(broker: Option<&str>, store: Store, extra: &[&str]) -> Self {
        let dir = TempDir::new().unwrap();
        let mut command = Command::new(binary("starling-coordinator"));
        command
            .arg("serve")
            .arg("--listen")
            .arg("127.0.0.1:0")
            .arg("--data-dir")
            .arg(dir.path())
            .env("RUST_LOG", "info,starling=debug");
        match broker {
            Some(url) => {
                command.arg("--broker").arg(url);
            }
            None => {
                command.arg("--mqtt-listen").arg("127.0.0.1:0");
            }
        }
        if let Store::Postgres(url) = &store {
            command.arg("--db").arg(url);
        }
        command.args(extra);
        Self::launch(command, dir)
    }

    /// Starts `starling up`: coordinator, embedded broker, SQLite and a local
    /// agent in one process.
    pub fn start_up(extra: &[&str]) -> Self {
        let dir = TempDir::new().unwrap();
        let mut command = Command::new(binary("starling"));
        command
            .arg("up")
            .arg("--listen")
            .arg("127.0.0.1:0")
            .arg("--mqtt-listen")
            .arg("127.0.0.1:0")
            .arg("--data-dir")
            .arg(dir.path())
            .args(extra)
            .env("RUST_LOG", "info,starling=debug");
        Self::launch(command, dir)
    }

    /// Spawns the process and waits for its ready line.
    fn launch(mut command: Command, dir: TempDir) -> Self {
        command.env_remove("STARLING_URL");
        let mut process = Process::spawn("coordinator", command, dir.path());
        let stdout = process.child.stdout.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if line.starts_with("starling-coordinator ready") {
                    let _ = tx.send(line);
                }
            }
        });
        let line = rx
            .recv_timeout(Duration::from_secs(60))
            .unwrap_or_else(|_| panic!("coordinator not ready:\n{}", process.log()));
        let field = |key: &str| {
            line.split_whitespace()
                .find_map(|w| w.strip_prefix(key))
                .unwrap_or_else(|| panic!("no {key} in {line:?}"))
                .to_string()
        };
        Self {
            rest: field("rest="),
            mqtt: field("mqtt="),
            process,
            dir,
        }
    }

    /// Runs the `starling` CLI against this coordinator.
    pub fn cli(&self, args: &[&str], stdin: Option<&[u8]>) -> Output {
        cli(&self.rest, args, stdin)
    }

    /// Waits until the coordinator lists `count` online nodes.
    pub fn wait_for_nodes(&self, count: usize, timeout: Duration) -> serde_json::Value {
        let start = Instant::now();
        loop {
            let out = self.cli(&["nodes", "--json"], None);
            if out.status.success() {
                let nodes: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
                let online = nodes
                    .as_array()
                    .map(|a| {
                        a.iter()
                            .filter(|n| n["state"] == "online" || n["online"] == true)
                            .count()
                    })
                    .unwrap_or(0);
                if online >= count {
                    return nodes;
                }
            }
            assert!(
                start.elapsed() < timeout,
                "fewer than {count} nodes online after {timeout:?}: {}",
                String::from_utf8_lossy(&out.stdout)
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

/// Runs the `starling` CLI with `--coordinator URL`.
pub fn cli(rest: &str, args: &[&str], stdin: Option<&[u8]>) -> Output {
    use std::io::Write;
    let mut command = Command::new(binary("starling"));
    command
        .arg("--coordinator")
        .arg(rest)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        });
    let mut child = command.spawn().expect("spawn starling");
    if let Some(bytes) = stdin {
        let mut pipe = child.stdin.take().unwrap();
        pipe.write_all(bytes).unwrap();
    }
    child.wait_with_output().unwrap()
}

/// A running `starling-agent run`.
pub struct Agent {
    /// Its node id.
    pub node_id: String,
    /// The process.
    pub process: Process,
    /// Its data dir.
    pub dir: TempDir,
}

impl Agent {
    /// Starts an agent against `broker` with a fixed node id.
    pub fn start(broker: &str, node_id: &str, labels: &str) -> Self {
        let dir = TempDir::new().unwrap();
        let mut command = Command::new(binary("starling-agent"));
        command
            .arg("run")
            .arg("--broker")
            .arg(broker)
            .arg("--node-id")
            .arg(node_id)
            .arg("--data-dir")
            .arg(dir.path())
            .arg("--telemetry-interval")
            .arg("500ms")
            .env("RUST_LOG", "info,starling=debug");
        if !labels.is_empty() {
            command.arg("--labels").arg(labels);
        }
        let process = Process::spawn(&format!("agent-{node_id}"), command, dir.path());
        Self {
            node_id: node_id.to_string(),
            process,
            dir,
        }
    }
}

/// A fresh PostgreSQL database on the machine's server, dropped at the end.
pub struct PostgresDb {
    /// Its URL.
    pub url: String,
    name: String,
}

impl PostgresDb {
    /// Creates `starling_test_<pid>_<n>` on 127.0.0.1:5432 (trust auth).
    pub fn create() -> Self {
        static COUNTER: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let name = format!(
            "starling_test_{}_{}_{}",
            std::process::id(),
            COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_millis()
                % 1_000_000
        );
        psql(&format!("CREATE DATABASE {name}"));
        Self {
            url: format!("postgres://postgres@127.0.0.1:5432/{name}"),
            name,
        }
    }
}

impl Drop for PostgresDb {
    fn drop(&mut self) {
        psql(&format!(
            "DROP DATABASE IF EXISTS {} WITH (FORCE)",
            self.name
        ));
    }
}

fn psql(sql: &str) {
    let out = Command::new("psql")
        .args([
            "-h",
            "127.0.0.1",
            "-U",
            "postgres",
            "-d",
            "test",
            "-v",
            "ON_ERROR_STOP=1",
            "-c",
            sql,
        ])
        .output()
        .expect("psql is installed and PostgreSQL runs on 127.0.0.1:5432");
    assert!(
        out.status.success(),
        "psql {sql:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Writes a WAT module, compiled to wasm, into `dir` and returns its path.
pub fn wasm_file(dir: &Path, name: &str, wat_text: &str) -> PathBuf {
    let bytes = wat::parse_str(wat_text).expect("valid WAT");
    let path = dir.join(format!("{name}.wasm"));
    std::fs::write(&path, bytes).unwrap();
    path
}

/// Writes an OpenCL kernel and its `task.toml` into `dir` (the manifest's
/// `[opencl]` section is `opencl_toml`, without its header) and returns the
/// kernel's path, ready for `starling run FILE.cl`.
pub fn kernel_file(dir: &Path, name: &str, source: &str, opencl_toml: &str) -> PathBuf {
    let folder = dir.join(name);
    std::fs::create_dir_all(&folder).unwrap();
    let kernel = folder.join(format!("{name}.cl"));
    std::fs::write(&kernel, source).unwrap();
    std::fs::write(
        folder.join("task.toml"),
        format!(
            "name = \"{name}\"\nclass = \"gpu\"\n\n[opencl]\nsource = \"{name}.cl\"\n{opencl_toml}"
        ),
    )
    .unwrap();
    kernel
}

/// Little-endian bytes of f32s: the layout of OpenCL tasks' buffers.
pub fn f32_bytes(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// f32s from little-endian bytes.
pub fn f32_values(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// A progress bar for a benchmark's measured loop, on stderr so the Markdown
/// tables on stdout stay clean.
pub fn bench_progress(len: usize, what: &str) -> indicatif::ProgressBar {
    let bar = indicatif::ProgressBar::new(len as u64);
    bar.set_style(
        indicatif::ProgressStyle::with_template("{msg:>28} {bar:40} {pos}/{len} {elapsed}")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    bar.set_message(what.to_string());
    bar
}

/// CPU references for the example kernels in `tasks/`, to check their output
/// and to measure them against.
pub mod reference {
    /// `y = a·x + y`.
    pub fn saxpy(a: f32, x: &[f32], y: &[f32]) -> Vec<f32> {
        x.iter().zip(y).map(|(x, y)| a * x + y).collect()
    }

    /// `C = A·B` for row-major A (m×k) and B (k×n): a plain loop in i-k-j
    /// order, so the inner loop streams through B and C.
    pub fn matmul(m: usize, n: usize, k: usize, a: &[f32], b: &[f32]) -> Vec<f32> {
        let mut c = vec![0.0f32; m * n];
        for i in 0..m {
            for p in 0..k {
                let a_ip = a[i * k + p];
                let b_row = &b[p * n..(p + 1) * n];
                let c_row = &mut c[i * n..(i + 1) * n];
                for (c, b) in c_row.iter_mut().zip(b_row) {
                    *c += a_ip * b;
                }
            }
        }
        c
    }

    /// Deterministic test data in [-1, 1): a small linear congruential sequence.
    pub fn data(len: usize, seed: u32) -> Vec<f32> {
        let mut state = seed.wrapping_mul(2_654_435_761).wrapping_add(1);
        (0..len)
            .map(|_| {
                state = state.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                (state >> 8) as f32 / (1u32 << 23) as f32 - 1.0
            })
            .collect()
    }

    /// The largest difference between two vectors, relative to the larger magnitude (≥ 1).
    pub fn max_relative_error(got: &[f32], want: &[f32]) -> f32 {
        assert_eq!(got.len(), want.len(), "lengths differ");
        got.iter()
            .zip(want)
            .map(|(g, w)| (g - w).abs() / w.abs().max(1.0))
            .fold(0.0, f32::max)
    }
}

/// WAT modules with known behaviour, for the tests.
pub mod modules {
    /// Copies stdin to stdout, prefixed with `echo:`.
    pub const ECHO: &str = r#"
(module
  (import "wasi_snapshot_preview1" "fd_read" (func $fd_read (param i32 i32 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "fd_write" (func $fd_write (param i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 2)
  (data (i32.const 0) "echo:")
  (func (export "_start")
    (local $n i32)
    ;; write the prefix: iovec at 1000 = {ptr 0, len 5}
    (i32.store (i32.const 1000) (i32.const 0))
    (i32.store (i32.const 1004) (i32.const 5))
    (drop (call $fd_write (i32.const 1) (i32.const 1000) (i32.const 1) (i32.const 1008)))
    (block $done
      (loop $again
        ;; read up to 4096 bytes at 2048
        (i32.store (i32.const 1000) (i32.const 2048))
        (i32.store (i32.const 1004) (i32.const 4096))
        (br_if $done (call $fd_read (i32.const 0) (i32.const 1000) (i32.const 1) (i32.const 1008)))
        (local.set $n (i32.load (i32.const 1008)))
        (br_if $done (i32.eqz (local.get $n)))
        (i32.store (i32.const 1004) (local.get $n))
        (drop (call $fd_write (i32.const 1) (i32.const 1000) (i32.const 1) (i32.const 1008)))
        (br $again)))))
"#;

    /// Never returns.
    pub const LOOP_FOREVER: &str = r#"
(module
  (memory (export "memory") 1)
  (func (export "_start") (loop $l (br $l))))
"#;

    /// Grows memory by 64 MiB at a time until it cannot, then traps.
    pub const GROW_FOREVER: &str = r#"
(module
  (memory (export "memory") 1)
  (func (export "_start")
    (loop $l
      (br_if $l (i32.ne (memory.grow (i32.const 1024)) (i32.const -1))))
    unreachable))
"#;

    /// Writes the same 4 KiB to stdout forever.
    pub const SPEW_FOREVER: &str = r#"
(module
  (import "wasi_snapshot_preview1" "fd_write" (func $fd_write (param i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 1)
  (func (export "_start")
    (i32.store (i32.const 0) (i32.const 64))
    (i32.store (i32.const 4) (i32.const 4096))
    (loop $l
      (br_if $l (i32.eqz (call $fd_write (i32.const 1) (i32.const 0) (i32.const 1) (i32.const 8)))))
    unreachable))
"#;
}

/// The machine's logical CPU count and total memory, as the kernel reports them.
pub fn machine_cpus_and_memory() -> (u64, u64) {
    let cpus = std::fs::read_to_string("/proc/cpuinfo")
        .unwrap()
        .lines()
        .filter(|l| l.starts_with("processor"))
        .count() as u64;
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap();
    let kib: u64 = meminfo
        .lines()
        .find(|l| l.starts_with("MemTotal:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|n| n.parse().ok())
        .unwrap();
    (cpus, kib * 1024)
}
