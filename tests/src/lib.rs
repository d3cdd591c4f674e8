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
pub mod fabric;

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

/// Runs `cargo build --quiet` with `args` in the workspace (release when the
/// caller was built so), panicking with `what` when it fails.
fn cargo_build(args: &[&str], release_args: &[&str], what: &str) {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut command = Command::new(cargo);
    command.current_dir(workspace_root());
    // This build must see the environment scripts/test's own build saw, or
    // cargo takes the difference for a change and compiles again (and the
    // next outer build again after it). cargo test sets the package's
    // variables for the test process (a crate that reads CARGO_MANIFEST_DIR
    // with env!, as ring does, was rebuilt with everything above it: 45 s per
    // test binary), and scripts/test-runner sets RUSTC_BOOTSTRAP for the
    // test process alone (with it, everything would rebuild).
    for (name, _) in std::env::vars_os() {
        let name = name.to_string_lossy();
        if name == "RUSTC_BOOTSTRAP" || package_variable(&name) {
            command.env_remove(name.as_ref());
        }
    }
    command.args(["build", "--quiet"]).args(args);
    if release() {
        command.arg("--release").args(release_args);
    }
    let status = command
        .status()
        .unwrap_or_else(|e| panic!("run cargo build for {what}: {e}"));
    assert!(status.success(), "building {what} failed");
}

/// Whether `name` is one of the variables cargo sets for the package whose
/// tests run (not one that configures cargo, such as `CARGO_HOME` or
/// `CARGO_TARGET_DIR`, which the inner build must keep).
fn package_variable(name: &str) -> bool {
    name.starts_with("CARGO_PKG_")
        || matches!(
            name,
            "CARGO_MANIFEST_DIR"
                | "CARGO_MANIFEST_PATH"
                | "CARGO_MANIFEST_LINKS"
                | "CARGO_CRATE_NAME"
                | "CARGO_BIN_NAME"
                | "CARGO_PRIMARY_PACKAGE"
                | "CARGO_TARGET_TMPDIR"
                | "CARGO_RUSTC_CURRENT_DIR"
        )
}

/// Where a binary built by [`cargo_build`] lies, checked to exist.
fn built(name: &str) -> PathBuf {
    let profile = if release() { "release" } else { "debug" };
    let path = target_dir().join(profile).join(name);
    assert!(path.exists(), "{} was not built", path.display());
    path
}

/// The log filter of the processes the harness starts: `STARLING_TEST_LOG`
/// when set (benchmarks set `info`: a debug line per message costs the
/// coordinator what they measure), else Starling's debug lines.
pub fn log_filter() -> String {
    std::env::var("STARLING_TEST_LOG").unwrap_or_else(|_| "info,starling=debug".into())
}

/// Credentials for each of `sites` from one new trust root, the way an
/// operator makes them: `federation init` for the first site (the root
/// stays in `dir`), `federation issue` for the others. The files, in order.
pub fn site_credentials(dir: &Path, sites: &[&str]) -> Vec<PathBuf> {
    let coordinator = binary("starling-coordinator");
    let mut files = Vec::new();
    for (i, site) in sites.iter().enumerate() {
        let file = dir.join(format!("{site}.credentials.json"));
        let mut command = Command::new(&coordinator);
        if i == 0 {
            command.args(["federation", "init", "--site", site]);
        } else {
            command
                .args(["federation", "issue", "--site", site, "--out"])
                .arg(&file);
        }
        let out = command.arg("--data-dir").arg(dir).output().unwrap();
        assert!(
            out.status.success(),
            "federation credentials for {site}: {out:?}"
        );
        if i == 0 {
            std::fs::rename(dir.join("site-credentials.json"), &file).unwrap();
        }
        files.push(file);
    }
    files
}

/// The path of one of the workspace's binaries, built on first use.
pub fn binary(name: &str) -> PathBuf {
    BUILD.call_once(|| {
        // The same selection `cargo test --workspace` (and scripts/test) builds:
        // the features cargo unifies depend on it, and any other selection
        // would rebuild the dependencies with another feature set.
        let tests: &[&str] = if release() { &[] } else { &["--tests"] };
        cargo_build(
            &[&["--workspace", "--bins"], tests].concat(),
            &["--benches"],
            "the binaries under test",
        );
    });
    built(name)
}

static BUILD_SMALL: Once = Once::new();

/// The agent without a compiler (`starling-agent-small`), built on first
/// use. It builds only by name: in the workspace build above, cargo would
/// unify features and put the compiler back.
pub fn small_agent_binary() -> PathBuf {
    // The workspace build first, so that the two never run at once.
    let _ = binary("starling-agent");
    BUILD_SMALL.call_once(|| {
        cargo_build(
            &[
                "-p",
                "starling-agent-small",
                "--features",
                "small",
                "--bin",
                "starling-agent-small",
            ],
            &[],
            "starling-agent-small",
        );
    });
    built("starling-agent-small")
}

/// The message inside a report an agent published: agents seal every report
/// in a `SignedReport`, and a test that reads their traffic off the broker
/// opens the envelope (panicking when the report is not signed).
pub fn report_message(bytes: &[u8]) -> Vec<u8> {
    let report: starling_proto::SignedReport =
        starling_proto::decode(bytes).expect("agents publish signed reports");
    assert_eq!(report.signature.len(), 64);
    report.message
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

/// Waits for `done`, polling every 50 ms; panics with `what` after
/// `timeout`. Returns how long it took.
pub fn wait_until(timeout: Duration, what: &str, mut done: impl FnMut() -> bool) -> Duration {
    let start = Instant::now();
    while !done() {
        assert!(start.elapsed() < timeout, "{what}: not within {timeout:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
    start.elapsed()
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
        // Appending keeps the log of a process that was killed and started
        // again in the same directory.
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .unwrap();
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

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Kills the process with SIGKILL, as a power cut or the OOM killer
    /// would, and reaps it.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
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
    ip: [u8; 4],
}

impl Mosquitto {
    /// The broker's process id.
    pub fn pid(&self) -> u32 {
        self.process.pid()
    }
}

impl Mosquitto {
    /// Starts `mosquitto` with a private config on a free port.
    pub fn start() -> Self {
        Self::start_on([127, 0, 0, 1])
    }

    /// Starts `mosquitto` on a free port of one local address (for agents in
    /// a network namespace, the host end of their link).
    pub fn start_on(ip: [u8; 4]) -> Self {
        Self::start_configured(ip, "allow_anonymous true")
    }

    /// Starts `mosquitto` on a free port of 127.0.0.1 with `extra` appended to
    /// its config and no `allow_anonymous` line of its own (Mosquitto 2
    /// refuses anonymous clients unless `extra` allows them): for tests of
    /// password files and ACLs.
    pub fn start_with_config(extra: &str) -> Self {
        Self::start_configured([127, 0, 0, 1], extra)
    }

    fn start_configured(ip: [u8; 4], extra: &str) -> Self {
        let dir = TempDir::new().unwrap();
        let port = free_port();
        let [a, b, c, d] = ip;
        let host = format!("{a}.{b}.{c}.{d}");
        std::fs::write(
            dir.path().join("mosquitto.conf"),
            format!(
                "listener {port} {host}\npersistence false\nmax_packet_size 2000000\n{extra}\n"
            ),
        )
        .unwrap();
        let process = Self::spawn(dir.path(), ip, port);
        Self {
            url: format!("mqtt://{host}:{port}"),
            port,
            process,
            dir,
            ip,
        }
    }

    /// Starts `mosquitto` on a free port of 127.0.0.1 that speaks only TLS,
    /// with `pki`'s server certificate; `url` is `mqtts://127.0.0.1:PORT`.
    pub fn start_tls(pki: &Pki) -> Self {
        let mut broker = Self::start_with_config(&format!(
            "allow_anonymous true\n{}",
            pki.mosquitto_listener_files()
        ));
        broker.url = broker.url.replacen("mqtt://", "mqtts://", 1);
        broker
    }

    /// Stops the broker and starts a fresh one (it keeps nothing) on the same port.
    pub fn restart(&mut self) {
        self.process.stop();
        self.process = Self::spawn(self.dir.path(), self.ip, self.port);
    }

    /// Kills the broker with SIGKILL (it keeps nothing: persistence is off,
    /// as a broker that had not yet written its queue would be) and starts a
    /// fresh one on the same port.
    pub fn kill_and_restart(&mut self) {
        self.kill();
        self.start_again();
    }

    /// Kills the broker with SIGKILL; it stays down until [`Mosquitto::start_again`].
    pub fn kill(&mut self) {
        self.process.kill();
    }

    /// Starts a fresh broker (it keeps nothing) on the same port.
    pub fn start_again(&mut self) {
        self.process = Self::spawn(self.dir.path(), self.ip, self.port);
    }

    fn spawn(dir: &Path, ip: [u8; 4], port: u16) -> Process {
        let binary = ["/usr/sbin/mosquitto", "/usr/bin/mosquitto"]
            .into_iter()
            .find(|p| Path::new(p).exists())
            .expect("mosquitto is installed (scripts/setup installs it)");
        let mut command = Command::new(binary);
        command.arg("-c").arg(dir.join("mosquitto.conf"));
        let process = Process::spawn("mosquitto", command, dir);
        wait_for_port(SocketAddr::from((ip, port)), Duration::from_secs(10));
        process
    }
}

/// A test CA, a server certificate for 127.0.0.1 and localhost signed by
/// it, and a client certificate, as PEM files.
pub struct Pki {
    /// The CA certificate.
    pub ca: PathBuf,
    /// The server certificate.
    pub server_cert: PathBuf,
    /// The server's private key.
    pub server_key: PathBuf,
    /// A client certificate (CN `edge-1`).
    pub client_cert: PathBuf,
    /// The client's private key.
    pub client_key: PathBuf,
}

impl Pki {
    /// Generates the certificates and keys into `dir`.
    pub fn create(dir: &Path) -> Self {
        use rcgen::{
            BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose,
        };
        let ca_key = KeyPair::generate().unwrap();
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(DnType::CommonName, "Starling test CA");
        ca_params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let ca_cert = ca_params.self_signed(&ca_key).unwrap();
        let issuer = Issuer::new(ca_params, ca_key);

        let server_key = KeyPair::generate().unwrap();
        let mut server_params =
            CertificateParams::new(vec!["127.0.0.1".to_owned(), "localhost".to_owned()]).unwrap();
        server_params
            .distinguished_name
            .push(DnType::CommonName, "127.0.0.1");
        let server_cert = server_params.signed_by(&server_key, &issuer).unwrap();

        let client_key = KeyPair::generate().unwrap();
        let mut client_params = CertificateParams::new(Vec::<String>::new()).unwrap();
        client_params
            .distinguished_name
            .push(DnType::CommonName, "edge-1");
        let client_cert = client_params.signed_by(&client_key, &issuer).unwrap();

        let write = |name: &str, text: String| {
            let path = dir.join(name);
            std::fs::write(&path, text).unwrap();
            path
        };
        Self {
            ca: write("ca.pem", ca_cert.pem()),
            server_cert: write("server.pem", server_cert.pem()),
            server_key: write("server.key", server_key.serialize_pem()),
            client_cert: write("client.pem", client_cert.pem()),
            client_key: write("client.key", client_key.serialize_pem()),
        }
    }

    /// The Mosquitto lines that make the listener before them speak TLS with
    /// these files.
    pub fn mosquitto_listener_files(&self) -> String {
        format!(
            "cafile {}\ncertfile {}\nkeyfile {}\n",
            self.ca.display(),
            self.server_cert.display(),
            self.server_key.display()
        )
    }
}

/// Where the coordinator keeps its state.
pub enum Store {
    /// SQLite under the coordinator's data dir (the default).
    Sqlite,
    /// A PostgreSQL database, by URL.
    Postgres(String),
}

/// A running `starling-coordinator serve` (or `starling up`).
pub struct Coordinator {
    /// The REST base URL, `http://127.0.0.1:PORT`.
    pub rest: String,
    /// The MQTT URL agents should use.
    pub mqtt: String,
    /// The bootstrap admin API token the CLI calls are made with.
    pub token: String,
    /// The process.
    pub process: Process,
    /// The data dir.
    pub dir: TempDir,
    /// The CA that signed the REST API's certificate, when it serves HTTPS.
    pub ca_file: Option<PathBuf>,
    /// The line it printed when ready.
    pub ready_line: String,
    program: PathBuf,
    args: Vec<std::ffi::OsString>,
}

impl Coordinator {
    /// Starts a coordinator with the embedded broker (`broker: None`) or against
    /// an external one, with the given store and extra flags. It listens on
    /// 127.0.0.1 unless `extra` holds its own `--listen`.
    pub fn start(broker: Option<&str>, store: Store, extra: &[&str]) -> Self {
        let (dir, token, args) = Self::serve_args(broker, store, extra);
        Self::launch(binary("starling-coordinator"), args, dir, Some(token))
    }

    /// [`Coordinator::start`] under a descriptor limit of `nofile` (soft
    /// and hard, through util-linux's `prlimit`), as systemd's default soft
    /// limit of 1,024 would leave it without `LimitNOFILE`.
    pub fn start_with_descriptor_limit(
        nofile: u64,
        broker: Option<&str>,
        store: Store,
        extra: &[&str],
    ) -> Self {
        let (dir, token, serve) = Self::serve_args(broker, store, extra);
        let mut args: Vec<std::ffi::OsString> = vec![
            format!("--nofile={nofile}:{nofile}").into(),
            "--".into(),
            binary("starling-coordinator").into(),
        ];
        args.extend(serve);
        Self::launch(PathBuf::from("prlimit"), args, dir, Some(token))
    }

    /// A data directory, an admin token and the `serve` arguments of
    /// [`Coordinator::start`].
    fn serve_args(
        broker: Option<&str>,
        store: Store,
        extra: &[&str],
    ) -> (TempDir, String, Vec<std::ffi::OsString>) {
        let dir = TempDir::new().unwrap();
        let token = random_token();
        let mut args: Vec<std::ffi::OsString> = vec!["serve".into()];
        if !extra.contains(&"--listen") {
            args.extend(["--listen".into(), "127.0.0.1:0".into()]);
        }
        args.extend([
            "--data-dir".into(),
            dir.path().into(),
            "--api-token".into(),
            token.clone().into(),
        ]);
        match broker {
            Some(url) => args.extend(["--broker".into(), url.into()]),
            None => args.extend(["--mqtt-listen".into(), "127.0.0.1:0".into()]),
        }
        if let Store::Postgres(url) = &store {
            args.extend(["--db".into(), url.into()]);
        }
        args.extend(extra.iter().map(Into::into));
        (dir, token, args)
    }

    /// Starts a coordinator inside network namespace `ns`, its REST API on
    /// `ip` (reachable from the other namespaces of a fabric and from the
    /// host), its embedded broker on the namespace's loopback (for agents in
    /// the same namespace), SQLite, and the extra flags (`--site`, gossip).
    pub fn start_in_namespace(ns: &str, ip: std::net::Ipv4Addr, extra: &[&str]) -> Self {
        let dir = TempDir::new().unwrap();
        let token = random_token();
        let mut args: Vec<std::ffi::OsString> = vec![
            "netns".into(),
            "exec".into(),
            ns.into(),
            binary("starling-coordinator").into(),
            "serve".into(),
            "--listen".into(),
            format!("{ip}:0").into(),
            "--mqtt-listen".into(),
            "127.0.0.1:0".into(),
            "--data-dir".into(),
            dir.path().into(),
            "--api-token".into(),
            token.clone().into(),
        ];
        args.extend(extra.iter().map(Into::into));
        Self::launch(PathBuf::from("ip"), args, dir, Some(token))
    }

    /// The value of `key=` in the ready line (`site`, `gossip`, ...).
    pub fn ready_field(&self, key: &str) -> Option<String> {
        self.ready_line
            .split_whitespace()
            .find_map(|w| w.strip_prefix(&format!("{key}=")))
            .map(str::to_string)
    }

    /// Starts `starling up`: coordinator, embedded broker, SQLite and a local
    /// agent in one process.
    pub fn start_up(extra: &[&str]) -> Self {
        let dir = TempDir::new().unwrap();
        let mut args: Vec<std::ffi::OsString> = vec![
            "up".into(),
            "--listen".into(),
            "127.0.0.1:0".into(),
            "--mqtt-listen".into(),
            "127.0.0.1:0".into(),
            "--data-dir".into(),
            dir.path().into(),
        ];
        args.extend(extra.iter().map(Into::into));
        Self::launch(binary("starling"), args, dir, None)
    }

    fn command(program: &Path, args: &[std::ffi::OsString]) -> Command {
        let mut command = Command::new(program);
        command
            .args(args)
            .env("RUST_LOG", log_filter())
            .env_remove("STARLING_URL")
            .env_remove("STARLING_API_TOKEN");
        command
    }

    /// Spawns the process and waits for its ready line.
    fn launch(
        program: PathBuf,
        args: Vec<std::ffi::OsString>,
        dir: TempDir,
        token: Option<String>,
    ) -> Self {
        let process = Process::spawn("coordinator", Self::command(&program, &args), dir.path());
        let (process, rest, mqtt, ready_line) = Self::ready(process);
        // `starling up` makes its own admin token and says where it is.
        let token = token.unwrap_or_else(|| {
            std::fs::read_to_string(dir.path().join("admin.token"))
                .map(|t| t.trim().to_string())
                .unwrap_or_default()
        });
        Self {
            rest,
            mqtt,
            token,
            process,
            dir,
            ca_file: None,
            ready_line,
            program,
            args,
        }
    }

    fn ready(mut process: Process) -> (Process, String, String, String) {
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
        let (rest, mqtt) = (field("rest="), field("mqtt="));
        (process, rest, mqtt, line)
    }

    /// Kills the coordinator with SIGKILL and starts it again on the same data
    /// directory, store and flags (its REST port may change; `rest` follows).
    pub fn kill_and_restart(&mut self) {
        self.process.kill();
        let process = Process::spawn(
            "coordinator",
            Self::command(&self.program, &self.args),
            self.dir.path(),
        );
        let (process, rest, mqtt, ready_line) = Self::ready(process);
        self.process = process;
        self.rest = rest;
        self.mqtt = mqtt;
        self.ready_line = ready_line;
    }

    /// Runs the `starling` CLI against this coordinator, as its admin.
    pub fn cli(&self, args: &[&str], stdin: Option<&[u8]>) -> Output {
        match &self.ca_file {
            Some(ca) => {
                let mut with_ca = vec!["--ca-file", ca.to_str().unwrap()];
                with_ca.extend_from_slice(args);
                cli_with_token(&self.rest, Some(&self.token), &with_ca, stdin)
            }
            None => cli_with_token(&self.rest, Some(&self.token), args, stdin),
        }
    }

    /// Starts a coordinator whose REST API serves HTTPS with `pki`'s server
    /// certificate; the CLI calls, REST helpers and agents of this harness
    /// trust `pki`'s CA.
    pub fn start_https(broker: Option<&str>, store: Store, extra: &[&str], pki: &Pki) -> Self {
        let mut args = vec![
            "--tls-cert",
            pki.server_cert.to_str().unwrap(),
            "--tls-key",
            pki.server_key.to_str().unwrap(),
        ];
        args.extend_from_slice(extra);
        let mut coordinator = Self::start(broker, store, &args);
        coordinator.ca_file = Some(pki.ca.clone());
        coordinator
    }

    /// Runs the CLI with `--json` appended, asserts it succeeded, and parses
    /// what it printed.
    pub fn cli_json(&self, args: &[&str], stdin: Option<&[u8]>) -> serde_json::Value {
        let mut args = args.to_vec();
        args.push("--json");
        let out = self.cli(&args, stdin);
        assert!(
            out.status.success(),
            "starling {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap()
    }

    /// A task as `starling task ID --json` shows it.
    pub fn task(&self, id: &str) -> serde_json::Value {
        self.cli_json(&["task", id], None)
    }

    /// One REST call as the admin: `body` is sent with `content_type` when
    /// given; returns the status and the answer's text.
    pub fn http(&self, method: &str, path: &str, body: Option<(&str, Vec<u8>)>) -> (u16, String) {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            let method = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
            let mut client = reqwest::Client::builder();
            if let Some(ca) = &self.ca_file {
                let pem = std::fs::read(ca).unwrap();
                client = client
                    .tls_built_in_root_certs(false)
                    .add_root_certificate(reqwest::Certificate::from_pem(&pem).unwrap());
            }
            let mut request = client
                .build()
                .unwrap()
                .request(method, format!("{}{path}", self.rest))
                .bearer_auth(&self.token);
            if let Some((content_type, bytes)) = body {
                request = request.header("content-type", content_type).body(bytes);
            }
            let response = request.send().await.unwrap();
            let status = response.status().as_u16();
            (status, response.text().await.unwrap())
        })
    }

    /// Publishes a [`modules::spin`] module and returns its digest.
    pub fn publish_spin(&self, dir: &Path, iterations: u64) -> String {
        let module = wasm_file(
            dir,
            &format!("spin{iterations}"),
            &modules::spin(iterations),
        );
        let out = self.cli(&["publish", module.to_str().unwrap()], None);
        assert!(
            out.status.success(),
            "publish: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    /// Submits one task by digest with `input` on stdin (60 s limit); its id
    /// when the coordinator accepted it, `None` when it could not.
    pub fn submit(&self, digest: &str, input: &str) -> Option<String> {
        let out = self.cli(
            &["run", digest, "--input", "-", "--timeout", "60s"],
            Some(input.as_bytes()),
        );
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
    }

    /// Polls a task until `done` holds for it; panics with the task and the
    /// coordinator's log after `timeout`.
    pub fn wait_task(
        &self,
        id: &str,
        timeout: Duration,
        what: &str,
        done: impl Fn(&serde_json::Value) -> bool,
    ) -> serde_json::Value {
        let start = Instant::now();
        loop {
            // Over REST in this process, as `task` shows it (the CLI prints
            // the same document): a CLI process twenty times a second per
            // waiting test was a share of a core, and on two cores it made
            // every node of every test look busier than it was.
            let (status, text) = self.http("GET", &format!("/api/v1/tasks/{id}"), None);
            assert_eq!(status, 200, "task {id}: {text}");
            let task: serde_json::Value = serde_json::from_str(&text).unwrap();
            if done(&task) {
                return task;
            }
            assert!(
                start.elapsed() < timeout,
                "task {id} not {what} after {timeout:?}: {task:#}\n{}",
                self.process.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The coordinator's public key, as `GET /api/v1/identity` serves it.
    pub fn coordinator_key(&self) -> String {
        let (status, text) = self.http("GET", "/api/v1/identity", None);
        assert_eq!(status, 200, "{text}");
        let identity: serde_json::Value = serde_json::from_str(&text).unwrap();
        identity["coordinator_key"]
            .as_str()
            .unwrap_or_else(|| panic!("no coordinator_key in {identity}"))
            .to_string()
    }

    /// Creates a single-use join token for one agent (`starling token create`).
    pub fn join_token(&self) -> String {
        let out = self.cli(&["token", "create", "--json"], None);
        assert!(
            out.status.success(),
            "starling token create: {}\n{}",
            String::from_utf8_lossy(&out.stderr),
            self.process.log()
        );
        let value: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        value["token"]
            .as_str()
            .unwrap_or_else(|| panic!("no token in {value}"))
            .to_string()
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

/// A random hex token for tests.
pub fn random_token() -> String {
    use std::hash::{BuildHasher, Hasher};
    let mut out = String::new();
    for _ in 0..4 {
        let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
        hasher.write_u128(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos(),
        );
        out.push_str(&format!("{:016x}", hasher.finish()));
    }
    out
}

/// Runs the `starling` CLI with `--coordinator URL` and no token.
pub fn cli(rest: &str, args: &[&str], stdin: Option<&[u8]>) -> Output {
    cli_with_token(rest, None, args, stdin)
}

/// Runs the `starling` CLI with `--coordinator URL` and, if given, `--token`.
pub fn cli_with_token(
    rest: &str,
    token: Option<&str>,
    args: &[&str],
    stdin: Option<&[u8]>,
) -> Output {
    use std::io::Write;
    let mut command = Command::new(binary("starling"));
    command.arg("--coordinator").arg(rest);
    if let Some(token) = token {
        command.arg("--token").arg(token);
    }
    command
        .env_remove("STARLING_API_TOKEN")
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

/// A running `starling-agent run`, enrolled with its coordinator.
pub struct Agent {
    /// Its node id.
    pub node_id: String,
    /// The process.
    pub process: Process,
    /// Its data dir (journal, credentials, module cache).
    pub dir: TempDir,
    netns: Option<String>,
    args: Vec<std::ffi::OsString>,
    program: PathBuf,
}

impl Agent {
    /// Starts an agent without a compiler ([`small_agent_binary`]), enrolled
    /// like [`Agent::start`]: it runs only what the coordinator compiled for it.
    pub fn start_small(coordinator: &Coordinator, broker: &str, node_id: &str) -> Self {
        Self::start_at(
            coordinator,
            &coordinator.rest,
            broker,
            node_id,
            None,
            &[],
            Some(small_agent_binary()),
        )
    }

    /// Starts an agent against `broker` with a fixed node id, enrolled with a
    /// fresh join token from `coordinator`.
    pub fn start(coordinator: &Coordinator, broker: &str, node_id: &str, labels: &str) -> Self {
        Self::start_with(coordinator, broker, node_id, labels, None, &[])
    }

    /// Starts an agent, optionally inside a network namespace, with extra flags.
    pub fn start_with(
        coordinator: &Coordinator,
        broker: &str,
        node_id: &str,
        labels: &str,
        netns: Option<&NetNs>,
        extra: &[&str],
    ) -> Self {
        let rest = match netns {
            Some(ns) => coordinator.rest.replace("127.0.0.1", &ns.host_ip()),
            None => coordinator.rest.clone(),
        };
        let mut flags: Vec<&str> = Vec::new();
        if !labels.is_empty() {
            flags.extend(["--labels", labels]);
        }
        flags.extend_from_slice(extra);
        Self::start_at(
            coordinator,
            &rest,
            broker,
            node_id,
            netns.map(|ns| ns.name.as_str()),
            &flags,
            None,
        )
    }

    /// Starts an agent in the network namespace named `ns` (a [`fabric`]
    /// member's), beside a coordinator started in that namespace: it reaches
    /// the coordinator's REST API and broker at the URLs the coordinator
    /// printed.
    pub fn start_in_namespace(
        coordinator: &Coordinator,
        node_id: &str,
        ns: &str,
        extra: &[&str],
    ) -> Self {
        Self::start_at(
            coordinator,
            &coordinator.rest,
            &coordinator.mqtt,
            node_id,
            Some(ns),
            extra,
            None,
        )
    }

    /// Starts an agent with exactly `args` (after `run`), its data directory
    /// passed to `args` to place; for tests of how an agent finds its settings.
    pub fn start_args(node_id: &str, args: impl FnOnce(&Path) -> Vec<std::ffi::OsString>) -> Self {
        let dir = TempDir::new().unwrap();
        let mut all: Vec<std::ffi::OsString> = vec!["run".into()];
        all.extend(args(dir.path()));
        let program = binary("starling-agent");
        let process = Self::spawn(&program, node_id, None, &all, dir.path());
        Self {
            node_id: node_id.to_string(),
            process,
            dir,
            netns: None,
            args: all,
            program,
        }
    }

    fn start_at(
        coordinator: &Coordinator,
        rest: &str,
        broker: &str,
        node_id: &str,
        netns: Option<&str>,
        extra: &[&str],
        program: Option<PathBuf>,
    ) -> Self {
        let dir = TempDir::new().unwrap();
        let program = program.unwrap_or_else(|| binary("starling-agent"));
        let mut args: Vec<std::ffi::OsString> = vec![
            "run".into(),
            "--broker".into(),
            broker.into(),
            "--node-id".into(),
            node_id.into(),
            "--data-dir".into(),
            dir.path().into(),
            "--telemetry-interval".into(),
            "500ms".into(),
            "--coordinator-url".into(),
            rest.into(),
            "--join-token".into(),
            coordinator.join_token().into(),
            "--coordinator-key".into(),
            coordinator.coordinator_key().into(),
        ];
        if let Some(ca) = &coordinator.ca_file {
            args.extend(["--coordinator-ca-file".into(), ca.into()]);
        }
        args.extend(extra.iter().map(Into::into));
        let netns = netns.map(str::to_string);
        let process = Self::spawn(&program, node_id, netns.as_deref(), &args, dir.path());
        Self {
            node_id: node_id.to_string(),
            process,
            dir,
            netns,
            args,
            program,
        }
    }

    fn spawn(
        binary: &Path,
        node_id: &str,
        netns: Option<&str>,
        args: &[std::ffi::OsString],
        dir: &Path,
    ) -> Process {
        let mut command = match netns {
            Some(ns) => {
                let mut command = Command::new("ip");
                command.args(["netns", "exec", ns]).arg(binary);
                command
            }
            None => Command::new(binary),
        };
        command.args(args).env("RUST_LOG", log_filter());
        // A test agent never touches the host's CPU frequency: its sysfs is
        // a directory without cpufreq, so it says power_control none on
        // every host, root or not.
        command.arg("--sysfs-root").arg(dir.join("no-sysfs"));
        Process::spawn(&format!("agent-{node_id}"), command, dir)
    }

    /// Kills the agent with SIGKILL, as a power cut would.
    pub fn kill(&mut self) {
        self.process.kill();
    }

    /// Starts the agent again on the same data directory (its journal and
    /// credentials), as a device does after a reboot.
    pub fn restart(&mut self) {
        self.process.kill();
        self.process = Self::spawn(
            &self.program,
            &self.node_id,
            self.netns.as_deref(),
            &self.args,
            self.dir.path(),
        );
    }
}

/// A running `starling-agent swarm`: many virtual devices in one process,
/// each a whole agent with its own MQTT session, credentials, journal,
/// capability and telemetry (see `agent/src/swarm`).
///
/// ```no_run
/// # use starling_tests::{Coordinator, Store, Swarm};
/// # use std::time::Duration;
/// let coordinator = Coordinator::start(None, Store::Sqlite, &[]);
/// // 50 devices enrolled with one join token of 50 uses, tasks run for real.
/// let mut swarm = Swarm::start(&coordinator, &coordinator.mqtt, 50, "it", &[]);
/// coordinator.wait_for_nodes(50, Duration::from_secs(60));
/// assert_eq!(swarm.ready["count"], 50);
/// swarm.kill(); // SIGKILL: the broker publishes every device's last will.
/// ```
///
/// The swarm's state (`<dir>/<node id>/`: credentials, journal, report key;
/// `<dir>/artifacts`: the shared module cache) lives in [`Swarm::dir`], so
/// [`Swarm::restart`] brings the same devices back with their credentials.
/// Dropping it stops the process (SIGTERM, then SIGKILL) and prints its log
/// when the test failed.
pub struct Swarm {
    /// The process.
    pub process: Process,
    /// Its `--data-dir`.
    pub dir: TempDir,
    /// The node id prefix: devices are `{prefix}-00001` …
    pub prefix: String,
    /// How many devices.
    pub count: usize,
    /// The readiness line it printed once every device was connected
    /// (`event`, `count`, `enrolled`, `seconds`, `first`, `last`); `Null`
    /// until [`Swarm::wait_ready`] has seen it.
    pub ready: serde_json::Value,
    lines: Option<mpsc::Receiver<String>>,
    args: Vec<std::ffi::OsString>,
}

impl Swarm {
    /// How long [`Swarm::start`] and [`Swarm::restart`] wait for the
    /// readiness line.
    pub const READY_TIMEOUT: Duration = Duration::from_secs(120);

    /// Starts `count` devices named `{prefix}-00001` … against `broker`,
    /// enrolled at `coordinator` with one join token of `count` uses (and
    /// its key pinned), telemetry every second, devices started over one
    /// second; `extra` flags go last (`--execute modelled`, `--profiles`,
    /// `--ramp`, …). Waits for the readiness line.
    pub fn start(
        coordinator: &Coordinator,
        broker: &str,
        count: usize,
        prefix: &str,
        extra: &[&str],
    ) -> Self {
        let token = Self::join_token(coordinator, count);
        let mut args: Vec<std::ffi::OsString> = vec![
            "--broker".into(),
            broker.into(),
            "--coordinator-url".into(),
            coordinator.rest.clone().into(),
            "--join-token".into(),
            token.into(),
            "--coordinator-key".into(),
            coordinator.coordinator_key().into(),
            "--ramp".into(),
            "1s".into(),
        ];
        if let Some(ca) = &coordinator.ca_file {
            args.extend(["--coordinator-ca-file".into(), ca.into()]);
        }
        args.extend(extra.iter().map(Into::into));
        let mut swarm = Self::start_args(count, prefix, args);
        swarm.wait_ready(Self::READY_TIMEOUT);
        swarm
    }

    /// Starts `count` devices named `{prefix}-00001` … with exactly `args`
    /// after `swarm --count N --node-prefix P --data-dir DIR` (for a
    /// development broker: `--broker URL --allow-unsigned`), without waiting
    /// for them: call [`Swarm::wait_ready`].
    pub fn start_args(count: usize, prefix: &str, args: Vec<std::ffi::OsString>) -> Self {
        let dir = TempDir::new().unwrap();
        let mut all: Vec<std::ffi::OsString> = vec![
            "swarm".into(),
            "--count".into(),
            count.to_string().into(),
            "--node-prefix".into(),
            prefix.into(),
            "--data-dir".into(),
            dir.path().into(),
        ];
        all.extend(args);
        let mut swarm = Self {
            process: Self::spawn(&all, dir.path()),
            dir,
            prefix: prefix.to_string(),
            count,
            ready: serde_json::Value::Null,
            lines: None,
            args: all,
        };
        swarm.read_stdout();
        swarm
    }

    /// A join token of `uses` uses from `coordinator` (`starling token
    /// create --uses N`).
    pub fn join_token(coordinator: &Coordinator, uses: usize) -> String {
        let uses = uses.to_string();
        let token = coordinator.cli_json(&["token", "create", "--uses", &uses], None);
        token["token"]
            .as_str()
            .unwrap_or_else(|| panic!("no token in {token}"))
            .to_string()
    }

    fn spawn(args: &[std::ffi::OsString], dir: &Path) -> Process {
        let mut command = Command::new(binary("starling-agent"));
        // Plain text, so tests can search the log for `node=…`.
        command
            .args(args)
            .env("RUST_LOG", "info")
            .env("NO_COLOR", "1");
        Process::spawn("swarm", command, dir)
    }

    fn read_stdout(&mut self) {
        let stdout = self.process.child.stdout.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        self.lines = Some(rx);
    }

    /// Waits for the readiness line (every device connected), keeps it in
    /// [`Swarm::ready`] and returns it; panics with the log after `timeout`
    /// or when the swarm exits first.
    pub fn wait_ready(&mut self, timeout: Duration) -> &serde_json::Value {
        let start = Instant::now();
        let lines = self.lines.as_ref().expect("stdout is read");
        loop {
            let left = timeout.saturating_sub(start.elapsed());
            match lines.recv_timeout(left.min(Duration::from_millis(500))) {
                Ok(line) => {
                    if let Ok(value) = serde_json::from_str::<serde_json::Value>(&line) {
                        if value["event"] == "ready" {
                            self.ready = value;
                            return &self.ready;
                        }
                    }
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    panic!(
                        "the swarm exited before it was ready:\n{}",
                        self.process.log()
                    )
                }
            }
            assert!(
                start.elapsed() < timeout,
                "the swarm was not ready after {timeout:?}:\n{}",
                self.process.log()
            );
        }
    }

    /// The node id of device `index` (from 0).
    pub fn node_id(&self, index: usize) -> String {
        format!("{}-{:05}", self.prefix, index + 1)
    }

    /// Every device's node id, in order.
    pub fn node_ids(&self) -> Vec<String> {
        (0..self.count).map(|index| self.node_id(index)).collect()
    }

    /// Device `node`'s data directory (credentials, journal, report key).
    pub fn device_dir(&self, node: &str) -> PathBuf {
        self.dir.path().join(node)
    }

    /// Device `node`'s MQTT user name and password, from the credentials it
    /// enrolled for.
    pub fn credentials(&self, node: &str) -> (String, String) {
        let path = self.device_dir(node).join("credentials.json");
        let text = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
        let value: serde_json::Value = serde_json::from_str(&text).unwrap();
        (
            value["mqtt_username"].as_str().unwrap().to_string(),
            value["mqtt_password"].as_str().unwrap().to_string(),
        )
    }

    /// The swarm's stderr so far (every device's log lines carry
    /// `device{node=…}`).
    pub fn log(&self) -> String {
        self.process.log()
    }

    /// Kills the swarm with SIGKILL, as a power cut would: no device says
    /// goodbye, and the broker publishes each one's last will.
    pub fn kill(&mut self) {
        self.process.kill();
    }

    /// Stops the swarm with SIGTERM (SIGKILL after 5 s) and returns its exit
    /// code: every device publishes its offline status and disconnects.
    pub fn stop(&mut self) -> Option<i32> {
        self.process.stop();
        self.process.exit_code()
    }

    /// Kills the swarm and starts it again with the same flags and data
    /// directory (the devices come back with their credentials and
    /// journals; the join token is not used again), then waits for it to be
    /// ready.
    pub fn restart(&mut self) {
        self.process.kill();
        self.process = Self::spawn(&self.args, self.dir.path());
        self.ready = serde_json::Value::Null;
        self.read_stdout();
        self.wait_ready(Self::READY_TIMEOUT);
    }
}

/// A network namespace joined to the host by a veth pair, for agents whose
/// link the tests cut and restore. Deleted on drop.
pub struct NetNs {
    /// The namespace's name.
    pub name: String,
    host_if: String,
    subnet: u8,
}

impl NetNs {
    /// Creates `stn<pid><n>` with `10.231.<subnet>.2/24` inside and
    /// `10.231.<subnet>.1/24` on the host end.
    pub fn create() -> Self {
        static COUNTER: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(0);
        let n = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        // A subnet per namespace and process, so parallel tests do not clash.
        let subnet = ((std::process::id() % 50) as u8) * 5 + n % 5 + 1;
        let name = format!("stn{}x{n}", std::process::id());
        let host_if = format!("sth{}x{n}", std::process::id() % 100_000);
        let ns_if = format!("stc{}x{n}", std::process::id() % 100_000);
        let _ = run_ip(&["netns", "del", &name]);
        run_ip(&["netns", "add", &name]).unwrap();
        let ns = Self {
            name: name.clone(),
            host_if: host_if.clone(),
            subnet,
        };
        run_ip(&[
            "link", "add", &host_if, "type", "veth", "peer", "name", &ns_if, "netns", &name,
        ])
        .unwrap();
        run_ip(&[
            "addr",
            "add",
            &format!("10.231.{subnet}.1/24"),
            "dev",
            &host_if,
        ])
        .unwrap();
        run_ip(&["link", "set", &host_if, "up"]).unwrap();
        for args in [
            vec![
                "addr",
                "add",
                &format!("10.231.{subnet}.2/24"),
                "dev",
                &ns_if,
            ],
            vec!["link", "set", &ns_if, "up"],
            vec!["link", "set", "lo", "up"],
        ] {
            let mut full = vec!["netns", "exec", &name, "ip"];
            full.extend(args.iter().copied());
            run_ip(&full).unwrap();
        }
        ns
    }

    /// Whether this machine can make network namespaces (root and iproute2).
    pub fn available() -> bool {
        let ok = run_ip(&["netns", "add", "starling-probe"]).is_ok();
        let _ = run_ip(&["netns", "del", "starling-probe"]);
        ok
    }

    /// The host end's address, where a broker or coordinator for the
    /// namespace's agents listens.
    pub fn host_ip(&self) -> String {
        format!("10.231.{}.1", self.subnet)
    }

    /// The host end's address as octets.
    pub fn host_octets(&self) -> [u8; 4] {
        [10, 231, self.subnet, 1]
    }

    /// Cuts the link: no packet passes either way, and nobody is told (no
    /// FIN, no RST), as when a cable is pulled or a radio link drops.
    pub fn cut(&self) {
        run_ip(&["link", "set", &self.host_if, "down"]).unwrap();
    }

    /// Restores the link.
    pub fn restore(&self) {
        run_ip(&["link", "set", &self.host_if, "up"]).unwrap();
    }
}

impl Drop for NetNs {
    fn drop(&mut self) {
        let _ = run_ip(&["link", "del", &self.host_if]);
        let _ = run_ip(&["netns", "del", &self.name]);
    }
}

fn run_ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| format!("ip {args:?}: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "ip {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        ))
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

impl PostgresDb {
    /// Runs `sql` in this database; returns what it printed, unaligned and
    /// without headers (`psql -At`), trimmed.
    pub fn query(&self, sql: &str) -> String {
        let out = Command::new("psql")
            .args(["-At", "-v", "ON_ERROR_STOP=1", &self.url, "-c", sql])
            .output()
            .expect("psql is installed");
        assert!(
            out.status.success(),
            "psql {sql:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_string()
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

/// Rewrites the table between `<!-- NAME:start -->` and `<!-- NAME:end -->`
/// in BENCHMARKS.md with `table`, so published figures are the output of the
/// benchmark that measured them. Panics when the markers are missing.
pub fn write_bench_table(name: &str, table: &str) {
    let path = workspace_root().join("BENCHMARKS.md");
    let text = std::fs::read_to_string(&path).unwrap();
    let (start, end) = (
        format!("<!-- {name}:start -->"),
        format!("<!-- {name}:end -->"),
    );
    let from = text
        .find(&start)
        .expect("the start marker in BENCHMARKS.md")
        + start.len();
    let to = text[from..]
        .find(&end)
        .expect("the end marker in BENCHMARKS.md")
        + from;
    let updated = format!("{}\n{table}\n{}", &text[..from], &text[to..]);
    std::fs::write(&path, updated).unwrap();
    eprintln!("wrote the {name} table into {}", path.display());
}

/// CPU references for the example kernels in `tasks/` (their own crate,
/// the one optimised in test builds).
pub use starling_reference as reference;

/// WAT modules with known behaviour, for the tests.
pub mod modules {
    /// About a second of [`spin`] on one core of this class of machine; tests
    /// use multiples of it and never depend on the exact time.
    pub const SPIN_SECOND: u64 = 1_000_000_000;

    /// Spins `iterations` times, then prints `done:` and its stdin: a task that
    /// is still running when a test's fault strikes, with an output that names
    /// its input.
    pub fn spin(iterations: u64) -> String {
        format!(
            r#"
(module
  (import "wasi_snapshot_preview1" "fd_read" (func $fd_read (param i32 i32 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "fd_write" (func $fd_write (param i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 2)
  (data (i32.const 0) "done:")
  (func (export "_start")
    (local $i i64)
    (local $n i32)
    (loop $spin
      (local.set $i (i64.add (local.get $i) (i64.const 1)))
      (br_if $spin (i64.lt_u (local.get $i) (i64.const {iterations}))))
    (i32.store (i32.const 1000) (i32.const 0))
    (i32.store (i32.const 1004) (i32.const 5))
    (drop (call $fd_write (i32.const 1) (i32.const 1000) (i32.const 1) (i32.const 1008)))
    (block $done
      (loop $again
        (i32.store (i32.const 1000) (i32.const 2048))
        (i32.store (i32.const 1004) (i32.const 4096))
        (br_if $done (call $fd_read (i32.const 0) (i32.const 1000) (i32.const 1) (i32.const 1008)))
        (local.set $n (i32.load (i32.const 1008)))
        (br_if $done (i32.eqz (local.get $n)))
        (i32.store (i32.const 1004) (local.get $n))
        (drop (call $fd_write (i32.const 1) (i32.const 1000) (i32.const 1) (i32.const 1008)))
        (br $again)))))
"#
        )
    }

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

#[cfg(test)]
mod tests {
    use super::package_variable;

    #[test]
    fn the_inner_build_drops_the_packages_variables_and_keeps_cargos_settings() {
        for name in [
            "CARGO_MANIFEST_DIR",
            "CARGO_MANIFEST_PATH",
            "CARGO_PKG_NAME",
            "CARGO_PKG_VERSION",
            "CARGO_CRATE_NAME",
            "CARGO_PRIMARY_PACKAGE",
            "CARGO_TARGET_TMPDIR",
        ] {
            assert!(package_variable(name), "{name} is the package's");
        }
        for name in [
            "CARGO",
            "CARGO_HOME",
            "CARGO_TARGET_DIR",
            "CARGO_INCREMENTAL",
            "CARGO_PROFILE_DEV_DEBUG",
            "CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_RUNNER",
            "PATH",
        ] {
            assert!(!package_variable(name), "{name} configures cargo");
        }
    }
}
