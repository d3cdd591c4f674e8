//! The coordinator's own MQTT broker: a Mosquitto child process it writes the
//! configuration for, starts, supervises and reloads.
//!
//! Why Mosquitto and not a broker in the process: confining each node to its
//! own topics needs per-topic authorization on publish, subscribe and
//! delivery, a client id bound to the login, revocation that drops the live
//! session, and bounded queues and packet sizes. rumqttd 0.20 (the broker
//! this module used to embed) checks only the login at CONNECT, and its ACL
//! work is unreleased (bytebeamio/rumqtt#1071); rmqtt has the hooks but
//! brings a second async runtime and a plugin framework. Mosquitto has all of
//! it, the coordinator already writes its password file and ACL for operators
//! who run their own, and one set of files then serves both setups
//! ([`MosquittoFiles`]): the guarantees are the same whether the coordinator
//! starts the broker or an operator does.
//!
//! The child lives and dies with the coordinator: it is started through
//! `setpriv --pdeathsig KILL` from a supervisor thread that lives as long as
//! the process, so a coordinator killed with SIGKILL takes its broker along
//! instead of leaving it holding the port; a broker that exits on its own is
//! restarted (with backoff), and the coordinator's client reconnects to it.

use std::io::BufRead as _;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::access::{MosquittoFiles, Reload};
use crate::server_tls::{ServerTls, ServerTlsError};

/// The packet bound the broker's files set (`access` writes them, for this
/// broker and an operator's alike).
pub use crate::access::{MAX_PACKET_BYTES, PACKET_HEADROOM_BYTES};

/// How long the broker may take to accept its first connection.
const BROKER_START_TIMEOUT: Duration = Duration::from_secs(5);

/// The first and the longest wait before restarting a broker that exited.
const RESTART_BACKOFF: (Duration, Duration) = (Duration::from_millis(200), Duration::from_secs(30));

/// A broker that ran this long before exiting restarts without backoff.
const HEALTHY_RUN: Duration = Duration::from_secs(60);

/// How many of the broker's last log lines a start error quotes.
const LOG_TAIL_LINES: usize = 8;

/// Where the Mosquitto binary is looked for when none is configured: `PATH`
/// first, then Debian's and a source build's locations (sbin is often not in
/// an unprivileged user's `PATH`).
const MOSQUITTO_FALLBACKS: [&str; 2] = ["/usr/sbin/mosquitto", "/usr/local/sbin/mosquitto"];

/// Why the coordinator's broker could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartBrokerError {
    /// No Mosquitto binary.
    #[error("the coordinator runs its MQTT broker as a Mosquitto child process, and no `mosquitto` was found in PATH or /usr/sbin; install it (Debian: apt install mosquitto), pass --mosquitto-bin PATH, or use a broker of your own with --broker URL")]
    NoMosquitto,
    /// The MQTT listen address is taken or not ours to bind.
    #[error("cannot listen for MQTT on {addr}: {reason}; pass --mqtt-listen with a free port (port 0 picks one)")]
    Bind {
        /// The address asked for.
        addr: SocketAddr,
        /// The OS's words.
        reason: String,
    },
    /// The broker's certificate or key cannot be used.
    #[error("{0}; pass PEM files to --mqtt-tls-cert and --mqtt-tls-key")]
    Tls(#[from] ServerTlsError),
    /// A file of the broker's could not be written.
    #[error("cannot write the broker's files: {0}")]
    Files(#[from] crate::access::AccessError),
    /// The supervisor thread or the process could not be started.
    #[error("cannot start the MQTT broker ({program}): {source}")]
    Spawn {
        /// The program run.
        program: String,
        /// The OS's words.
        #[source]
        source: std::io::Error,
    },
    /// The broker exited or did not accept connections in time.
    #[error("the MQTT broker on {addr} did not start: {detail}; its last words:\n{log}")]
    NotReady {
        /// The address it should listen on.
        addr: SocketAddr,
        /// What was seen.
        detail: String,
        /// The broker's last log lines.
        log: String,
    },
}

/// What the broker is started with.
#[derive(Debug, Clone)]
pub struct BrokerSettings {
    /// Where agents connect (TLS when `tls` is given); port 0 picks one.
    pub listen: SocketAddr,
    /// The listener's certificate and key.
    pub tls: Option<ServerTls>,
    /// The Mosquitto binary; `None` looks in `PATH` and `/usr/sbin`.
    pub program: Option<PathBuf>,
    /// The password file, ACL and settings the broker reads. Its `dir` also
    /// holds the broker's own configuration file.
    pub files: MosquittoFiles,
}

/// A running broker: where it listens, and the handle that stops it.
#[derive(Debug)]
pub struct ManagedBroker {
    /// The address agents use (TLS when [`ManagedBroker::tls`]).
    pub listen: SocketAddr,
    /// Whether `listen` speaks TLS.
    pub tls: bool,
    /// A plain listener on the loopback interface for the coordinator's own
    /// client, so it needs neither a CA nor a certificate naming this host;
    /// logins are checked there too. The same as `listen` without TLS.
    pub local: SocketAddr,
    supervisor: Arc<Supervisor>,
    /// The files it reads, with the reload aimed at the running child.
    pub files: MosquittoFiles,
}

impl ManagedBroker {
    /// The broker process's id, 0 while it is being restarted.
    pub fn pid(&self) -> u32 {
        self.supervisor.pid.load(Ordering::Acquire)
    }

    /// Stops the broker and keeps it stopped.
    pub fn stop(&self) {
        self.supervisor.stopping.store(true, Ordering::Release);
        self.supervisor.with_child(|slot| {
            if let Some(child) = slot.as_mut() {
                // Fails only when it is already gone; the supervisor reaps it.
                let _ = child.kill();
            }
        });
    }
}

impl Drop for ManagedBroker {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The broker's last log lines, kept for a start error's message.
#[derive(Debug, Default)]
struct LogTail(Mutex<std::collections::VecDeque<String>>);

impl LogTail {
    fn push(&self, line: String) {
        let mut lines = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if lines.len() == LOG_TAIL_LINES {
            lines.pop_front();
        }
        lines.push_back(line);
    }

    fn text(&self) -> String {
        let lines = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if lines.is_empty() {
            "(nothing)".to_string()
        } else {
            lines.iter().cloned().collect::<Vec<_>>().join("\n")
        }
    }
}

/// What the supervisor thread and the handle share.
#[derive(Debug, Default)]
struct Supervisor {
    /// The running child's pid, 0 between runs: what SIGHUP goes to.
    pid: Arc<AtomicU32>,
    stopping: AtomicBool,
    child: Mutex<Option<Child>>,
    log: Arc<LogTail>,
}

impl Supervisor {
    fn log_tail(&self) -> String {
        self.log.text()
    }

    fn with_child<T>(&self, f: impl FnOnce(&mut Option<Child>) -> T) -> T {
        f(&mut self
            .child
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner))
    }
}

/// Writes the broker's files, starts Mosquitto on `settings.listen` (and,
/// with TLS, a plain listener on 127.0.0.1 for the coordinator itself), and
/// returns once it accepts connections. The broker reloads its password file
/// and ACL when the files are rewritten ([`MosquittoFiles::write`] signals
/// it), and drops the sessions of nodes no longer in them.
pub fn start_managed_broker(settings: BrokerSettings) -> Result<ManagedBroker, StartBrokerError> {
    let program = match &settings.program {
        Some(program) => program.clone(),
        None => find_mosquitto().ok_or(StartBrokerError::NoMosquitto)?,
    };
    let listen = reserve(settings.listen)?;
    let local = match settings.tls {
        Some(_) => reserve(SocketAddr::from(([127, 0, 0, 1], 0)))?,
        None => listen,
    };
    if let Some(tls) = &settings.tls {
        // Mosquitto reads the files after it starts and says little about
        // them; reading them here first turns a typo into a clear error.
        tls.rustls_config()?;
    }
    let supervisor = Arc::new(Supervisor::default());
    let mut files = settings.files;
    files.reload = Reload::Pid(supervisor.pid.clone());
    let config_path = files.dir.join("mosquitto.conf");
    let config = broker_config(&files, listen, settings.tls.as_ref(), local);
    // The password file and ACL are written by the caller's first refresh
    // (and on every change after); the configuration names them.
    files.create_dir()?;
    crate::access::write_atomically(&config_path, &config)?;

    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let thread_supervisor = supervisor.clone();
    let run = Run {
        program: program.clone(),
        config: config_path,
        probes: if local == listen {
            vec![listen]
        } else {
            vec![listen, local]
        },
    };
    std::thread::Builder::new()
        .name("mqtt-broker".to_string())
        .spawn(move || supervise(&thread_supervisor, &run, ready_tx))
        .map_err(|source| StartBrokerError::Spawn {
            program: program.display().to_string(),
            source,
        })?;
    let first = ready_rx
        .recv()
        .unwrap_or_else(|_| Err("the supervisor thread ended".to_string()));
    match first {
        Ok(()) => Ok(ManagedBroker {
            listen,
            tls: settings.tls.is_some(),
            local,
            supervisor,
            files,
        }),
        Err(detail) => {
            supervisor.stopping.store(true, Ordering::Release);
            Err(StartBrokerError::NotReady {
                addr: listen,
                detail,
                log: supervisor.log_tail(),
            })
        }
    }
}

/// How one broker run is started.
struct Run {
    program: PathBuf,
    config: PathBuf,
    probes: Vec<SocketAddr>,
}

/// A one-shot channel for the first start's outcome.
type Ready = std::sync::mpsc::Sender<Result<(), String>>;

/// The supervisor thread: starts the broker, reports the first start to
/// `ready`, and restarts the broker whenever it exits until stopped. The
/// children are started from this thread, which lives as long as the
/// process, because a parent-death signal fires when the thread that started
/// the child ends.
fn supervise(supervisor: &Supervisor, run: &Run, ready: Ready) {
    let mut ready = Some(ready);
    let mut backoff = RESTART_BACKOFF.0;
    while !supervisor.stopping.load(Ordering::Acquire) {
        let started = Instant::now();
        let outcome = run_once(supervisor, run, &mut ready);
        if let Some(ready) = ready.take() {
            // The first run never became ready: the caller reports why.
            let _ = ready.send(Err(outcome));
            return;
        }
        if supervisor.stopping.load(Ordering::Acquire) {
            return;
        }
        if started.elapsed() >= HEALTHY_RUN {
            backoff = RESTART_BACKOFF.0;
        }
        tracing::error!(
            outcome = %outcome,
            restart_in = ?backoff,
            log = %supervisor.log_tail(),
            "the MQTT broker exited; restarting it"
        );
        std::thread::sleep(backoff);
        backoff = (backoff * 2).min(RESTART_BACKOFF.1);
    }
}

/// One run of the broker, until it exits; returns how it ended. Sends `Ok`
/// to `ready` (and takes it) once the broker accepts connections.
fn run_once(supervisor: &Supervisor, run: &Run, ready: &mut Option<Ready>) -> String {
    let mut child = match child_command(&run.program, &run.config).spawn() {
        Ok(child) => child,
        Err(error) => return format!("cannot run {}: {error}", run.program.display()),
    };
    supervisor.pid.store(child.id(), Ordering::Release);
    if let Some(stderr) = child.stderr.take() {
        let log = supervisor.log.clone();
        // Without a reader the pipe fills and the broker blocks on its log.
        let _ = std::thread::Builder::new()
            .name("mqtt-broker-log".to_string())
            .spawn(move || {
                for line in std::io::BufReader::new(stderr)
                    .lines()
                    .map_while(Result::ok)
                {
                    forward_log_line(&line);
                    log.push(line);
                }
            });
    }
    supervisor.with_child(|slot| *slot = Some(child));

    if ready.is_some() {
        match wait_until_accepting(supervisor, &run.probes) {
            Ok(()) => {
                if let Some(ready) = ready.take() {
                    let _ = ready.send(Ok(()));
                }
            }
            Err(detail) => {
                supervisor.with_child(|slot| {
                    if let Some(child) = slot.as_mut() {
                        let _ = child.kill();
                        let _ = child.wait();
                    }
                    *slot = None;
                });
                supervisor.pid.store(0, Ordering::Release);
                return detail;
            }
        }
    }
    let outcome = wait_for_exit(supervisor);
    supervisor.pid.store(0, Ordering::Release);
    outcome
}

/// Polls the child until it exits. Polling, rather than a blocking wait,
/// leaves the child's lock free for [`ManagedBroker::stop`] to kill it.
fn wait_for_exit(supervisor: &Supervisor) -> String {
    loop {
        let exited = supervisor.with_child(|slot| match slot.as_mut() {
            None => Some("no broker process".to_string()),
            Some(child) => match child.try_wait() {
                Ok(Some(status)) => {
                    *slot = None;
                    Some(format!("exited with {status}"))
                }
                Ok(None) => None,
                Err(error) => {
                    *slot = None;
                    Some(format!("cannot wait for it: {error}"))
                }
            },
        });
        if let Some(outcome) = exited {
            return outcome;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Waits until every listener accepts TCP connections, or the child exits,
/// or [`BROKER_START_TIMEOUT`] passes.
fn wait_until_accepting(supervisor: &Supervisor, probes: &[SocketAddr]) -> Result<(), String> {
    let deadline = Instant::now() + BROKER_START_TIMEOUT;
    for bound in probes {
        let connect_to = if bound.ip().is_unspecified() {
            SocketAddr::from(([127, 0, 0, 1], bound.port()))
        } else {
            *bound
        };
        loop {
            if TcpStream::connect_timeout(&connect_to, Duration::from_millis(200)).is_ok() {
                break;
            }
            let exited = supervisor.with_child(|slot| {
                slot.as_mut()
                    .and_then(|child| child.try_wait().ok().flatten())
            });
            if let Some(status) = exited {
                return Err(format!("it exited with {status}"));
            }
            if Instant::now() >= deadline {
                return Err(format!(
                    "{connect_to} did not accept connections within {BROKER_START_TIMEOUT:?}"
                ));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    Ok(())
}

/// The command that starts the broker: through `setpriv --pdeathsig KILL`
/// where util-linux's setpriv exists (so the broker dies with the thread
/// that started it, even on SIGKILL), else directly, with a warning.
fn child_command(program: &Path, config: &Path) -> Command {
    let setpriv = ["/usr/bin/setpriv", "/bin/setpriv"]
        .into_iter()
        .map(Path::new)
        .find(|path| path.exists());
    let mut command = match setpriv {
        Some(setpriv) => {
            let mut command = Command::new(setpriv);
            command
                .arg("--pdeathsig")
                .arg("KILL")
                .arg("--")
                .arg(program);
            command
        }
        None => {
            tracing::warn!("no setpriv (util-linux): the MQTT broker would outlive a coordinator killed with SIGKILL");
            Command::new(program)
        }
    };
    command
        .arg("-c")
        .arg(config)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    command
}

/// Passes one line of Mosquitto's log on to tracing: errors and warnings as
/// warnings, everything else (connections, reloads) at debug.
fn forward_log_line(line: &str) {
    // Lines are "<unix time>: <text>".
    let text = line.split_once(": ").map_or(line, |(_, text)| text);
    if text.starts_with("Error") {
        tracing::warn!(target: "mosquitto", "{text}");
    } else if text.starts_with("Warning") && !text.contains("should not be run as root") {
        tracing::warn!(target: "mosquitto", "{text}");
    } else {
        tracing::debug!(target: "mosquitto", "{text}");
    }
}

/// The broker's configuration: its listeners and log, then the settings it
/// shares with an operator's Mosquitto ([`MosquittoFiles::settings_text`]).
fn broker_config(
    files: &MosquittoFiles,
    listen: SocketAddr,
    tls: Option<&ServerTls>,
    local: SocketAddr,
) -> String {
    let mut text = String::from(
        "# Written by starling-coordinator at each start; edits are lost.\n\
         per_listener_settings false\n\
         persistence false\n\
         # Small answered packets: Nagle would hold each behind a delayed ACK.\n\
         set_tcp_nodelay true\n\
         log_dest stderr\n\
         log_type error\nlog_type warning\nlog_type notice\nlog_type information\n\
         connection_messages true\n\
         log_timestamp true\n",
    );
    if running_as_root() {
        // Mosquitto started as root switches to the `mosquitto` user, which
        // cannot read the coordinator's 0600 files; stay who we are.
        text.push_str("user root\n");
    }
    let per_listener = files.listener_settings_text();
    text.push_str(&format!(
        "\nlistener {} {}\n{per_listener}",
        listen.port(),
        listen.ip()
    ));
    if let Some(tls) = tls {
        text.push_str(&format!(
            "certfile {}\nkeyfile {}\n",
            tls.cert.display(),
            tls.key.display()
        ));
        text.push_str(&format!(
            "\nlistener {} {}\n{per_listener}",
            local.port(),
            local.ip()
        ));
    }
    text.push('\n');
    text.push_str(&files.settings_text());
    text
}

/// Whether this process's effective user is root (from /proc, so no unsafe
/// `geteuid`).
fn running_as_root() -> bool {
    std::fs::read_to_string("/proc/self/status").is_ok_and(|status| {
        status
            .lines()
            .find_map(|line| line.strip_prefix("Uid:"))
            .and_then(|ids| ids.split_whitespace().nth(1))
            == Some("0")
    })
}

/// The first `mosquitto` in `PATH`, else in the usual sbin directories.
fn find_mosquitto() -> Option<PathBuf> {
    let in_path = std::env::var_os("PATH")
        .map(|path| {
            std::env::split_paths(&path)
                .map(|dir| dir.join("mosquitto"))
                .collect::<Vec<_>>()
        })
        .unwrap_or_default();
    in_path
        .into_iter()
        .chain(MOSQUITTO_FALLBACKS.iter().map(PathBuf::from))
        .find(|candidate| candidate.is_file())
}

/// Binds `listen` and lets it go, returning the address bound.
///
/// Mosquitto needs a concrete port, and reports a bind failure only in its
/// log. So we bind here first: that reports "address in use" to the caller
/// and, for port 0, picks a free port. We then release the port and hand it
/// to Mosquitto. Between the release and its bind another process could take
/// the port; the readiness check then fails with the broker's own words.
fn reserve(listen: SocketAddr) -> Result<SocketAddr, StartBrokerError> {
    let probe = TcpListener::bind(listen).map_err(|error| StartBrokerError::Bind {
        addr: listen,
        reason: crate::bind_error::describe_bind_error(&error),
    })?;
    probe.local_addr().map_err(|error| StartBrokerError::Bind {
        addr: listen,
        reason: error.to_string(),
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn log_lines_lose_their_timestamp_and_keep_the_last_few() {
        let tail = LogTail::default();
        for i in 0..20 {
            tail.push(format!("line {i}"));
        }
        let text = tail.text();
        assert!(text.starts_with(&format!("line {}", 20 - LOG_TAIL_LINES)));
        assert!(text.ends_with("line 19"));
    }

    #[test]
    fn reserve_reports_a_taken_port() {
        let taken = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = taken.local_addr().unwrap();
        assert!(matches!(
            reserve(addr),
            Err(StartBrokerError::Bind { addr: a, .. }) if a == addr
        ));
        assert_ne!(reserve("127.0.0.1:0".parse().unwrap()).unwrap().port(), 0);
    }
}
