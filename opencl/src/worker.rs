//! The worker process: its protocol, its `main`, and the agent's client.
//!
//! The agent never calls OpenCL itself. It starts `starling-opencl-worker`
//! once per probe and once per kernel run, and kills it (SIGKILL) when the
//! task's wall-time limit passes or the task is cancelled: a kernel that never
//! ends, a driver that hangs or a driver that crashes costs one child process,
//! not the agent.
//!
//! Protocol:
//! - `starling-opencl-worker probe [--cache-dir DIR] [--no-calibrate]` writes
//!   the devices as JSON (`Vec<DeviceInfo>`) on stdout.
//! - `starling-opencl-worker run [--cache-dir DIR]` reads one CBOR
//!   [`RunRequest`] from stdin (at most [`MAX_REQUEST_BYTES`]) and writes one
//!   CBOR `Result<RunOutcome, RunError>` on stdout.
//!
//! Logs go to stderr. The exit status is 0 when the worker answered (even
//! with a [`RunError`]), non-zero when it could not.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{ExitCode, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::{Parser, Subcommand};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};

use crate::device::DeviceInfo;
use crate::exec::{RunError, RunOutcome, RunRequest};
use crate::package::MAX_SOURCE_BYTES;

/// The worker binary's name.
pub const WORKER_BIN: &str = "starling-opencl-worker";

/// The largest task input the worker takes.
pub const MAX_INPUT_BYTES: usize = 2 * 1024 * 1024;

/// The largest encoded request the worker reads: the input, the source, and
/// room for the spec and arguments.
pub const MAX_REQUEST_BYTES: usize = MAX_INPUT_BYTES + MAX_SOURCE_BYTES + 64 * 1024;

/// Room in an answer beyond the output itself (device name, timings, an error
/// message with a build log).
const ANSWER_SLACK_BYTES: u64 = 1024 * 1024;

/// The most bytes of a probe's JSON answer read.
const MAX_PROBE_ANSWER_BYTES: u64 = 1024 * 1024;

/// The tail of the worker's stderr kept for error messages.
const STDERR_TAIL_BYTES: usize = 16 * 1024;

/// The lines of stderr quoted in a [`RunError::Worker`].
const STDERR_TAIL_LINES: usize = 12;

/// How often a running worker is checked for cancellation.
const CANCEL_POLL: Duration = Duration::from_millis(20);

/// Exit status when the worker could not answer.
const EXIT_FAILED: u8 = 2;

#[derive(Debug, Parser)]
#[command(
    name = WORKER_BIN,
    version,
    about = "Starling's OpenCL worker: probes OpenCL devices and runs one kernel.",
    long_about = "Starling's OpenCL worker: probes OpenCL devices and runs one kernel.\n\n\
        It is started by the Starling agent, not by people: the agent keeps every OpenCL call \
        in this child process so that it can kill a kernel that runs past its time limit, and \
        so that a driver that hangs or crashes does not take the agent down.\n\n\
        `probe` prints the devices as JSON on stdout. `run` reads one CBOR run request on \
        stdin and writes one CBOR result on stdout. Logs go to stderr (filter with RUST_LOG)."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Lists the OpenCL devices as JSON on stdout, calibrated unless told not to.
    Probe {
        /// Directory of the calibration cache (calibration.json).
        #[arg(long, value_name = "DIR")]
        cache_dir: Option<PathBuf>,
        /// Skip the calibration kernel; gflops is then null.
        #[arg(long)]
        no_calibrate: bool,
    },
    /// Reads one CBOR run request on stdin, runs it, writes one CBOR result on stdout.
    Run {
        /// Directory of the program binary cache (binaries/).
        #[arg(long, value_name = "DIR")]
        cache_dir: Option<PathBuf>,
    },
}

/// The worker's `main`: parses the command line, answers, and returns the
/// exit status (0 when it answered, non-zero when it could not).
pub fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Probe {
            cache_dir,
            no_calibrate,
        } => serve_probe(cache_dir.as_deref(), !no_calibrate),
        Command::Run { cache_dir } => serve_run(cache_dir.as_deref()),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            tracing::error!("{message}");
            ExitCode::from(EXIT_FAILED)
        }
    }
}

fn serve_probe(cache_dir: Option<&Path>, calibrate: bool) -> Result<(), String> {
    let mut devices = crate::probe::list_devices();
    if calibrate {
        crate::probe::calibrate(&mut devices, cache_dir);
    }
    let json = serde_json::to_vec(&devices).map_err(|error| format!("cannot encode: {error}"))?;
    write_stdout(&json)
}

fn serve_run(cache_dir: Option<&Path>) -> Result<(), String> {
    let mut bytes = Vec::new();
    std::io::stdin()
        .take(MAX_REQUEST_BYTES as u64 + 1)
        .read_to_end(&mut bytes)
        .map_err(|error| format!("cannot read the request on stdin: {error}"))?;
    if bytes.len() > MAX_REQUEST_BYTES {
        return Err(format!(
            "the request is more than {MAX_REQUEST_BYTES} bytes; refusing it"
        ));
    }
    let request: RunRequest = serde_cbor::from_slice(&bytes)
        .map_err(|error| format!("stdin is not a CBOR run request: {error}"))?;
    tracing::debug!(kernel = %request.spec.kernel, input = request.input.len(), "run");
    let result = crate::exec::run(&request, cache_dir);
    if let Err(error) = &result {
        tracing::info!(kernel = %request.spec.kernel, "run failed: {error}");
    }
    let answer = serde_cbor::to_vec(&result)
        .map_err(|error| format!("cannot encode the result: {error}"))?;
    write_stdout(&answer)
}

fn write_stdout(bytes: &[u8]) -> Result<(), String> {
    let mut stdout = std::io::stdout().lock();
    stdout
        .write_all(bytes)
        .and_then(|()| stdout.flush())
        .map_err(|error| format!("cannot write the answer on stdout: {error}"))
}

/// The agent's side: starts the worker, talks to it, and kills it at a
/// deadline or on cancellation.
#[derive(Debug, Clone)]
pub struct WorkerClient {
    program: PathBuf,
    cache_dir: PathBuf,
}

/// What a finished worker left behind.
struct Finished {
    status: std::process::ExitStatus,
    stdout: Vec<u8>,
    stdout_overflow: bool,
    stderr_tail: String,
}

impl WorkerClient {
    /// A client that starts `program` with `--cache-dir cache_dir` (where the
    /// worker keeps calibrations and compiled program binaries).
    pub fn new(program: PathBuf, cache_dir: PathBuf) -> Self {
        WorkerClient { program, cache_dir }
    }

    /// The worker program this client starts.
    pub fn program(&self) -> &Path {
        &self.program
    }

    /// Finds the worker binary: `explicit` when given; else
    /// `starling-opencl-worker` beside the running executable, or in its
    /// parent directory (cargo puts test binaries in `target/debug/deps/` and
    /// the binaries in `target/debug/`); else `None`.
    pub fn locate(explicit: Option<&Path>) -> Option<PathBuf> {
        if let Some(path) = explicit {
            return Some(path.to_path_buf());
        }
        let exe = std::env::current_exe().ok()?;
        let dir = exe.parent()?;
        let name = format!("{WORKER_BIN}{}", std::env::consts::EXE_SUFFIX);
        let found = [Some(dir), dir.parent()]
            .into_iter()
            .flatten()
            .map(|dir| dir.join(&name))
            .find(|candidate| candidate.is_file());
        found
    }

    /// Lists the node's OpenCL devices through the worker, calibrating them
    /// when `calibrate` (served from the calibration cache after the first
    /// time). Gives up and kills the worker after `timeout`.
    pub async fn probe(
        &self,
        calibrate: bool,
        timeout: Duration,
    ) -> Result<Vec<DeviceInfo>, RunError> {
        let mut args = vec!["probe"];
        if !calibrate {
            args.push("--no-calibrate");
        }
        let finished = self
            .exchange(&args, None, MAX_PROBE_ANSWER_BYTES, timeout, None)
            .await?;
        self.check_finished(&finished)?;
        serde_json::from_slice(&finished.stdout).map_err(|error| {
            RunError::Worker(format!(
                "its probe answer is not a device list ({error}){}",
                stderr_suffix(&finished.stderr_tail)
            ))
        })
    }

    /// Runs one kernel in a fresh worker. Kills the worker when `timeout`
    /// passes ([`RunError::Timeout`]) or `cancel` becomes true
    /// ([`RunError::Cancelled`], checked every 20 ms); a worker that dies or
    /// answers garbage gives [`RunError::Worker`] with its exit status and the
    /// end of its stderr.
    pub async fn run(
        &self,
        request: &RunRequest,
        timeout: Duration,
        cancel: Arc<AtomicBool>,
    ) -> Result<RunOutcome, RunError> {
        if request.input.len() > MAX_INPUT_BYTES {
            return Err(RunError::TooLarge(format!(
                "the input is {} bytes; OpenCL tasks take at most {MAX_INPUT_BYTES} bytes of input",
                request.input.len()
            )));
        }
        let bytes = serde_cbor::to_vec(request)
            .map_err(|error| RunError::Worker(format!("cannot encode the request: {error}")))?;
        if bytes.len() > MAX_REQUEST_BYTES {
            return Err(RunError::TooLarge(format!(
                "the request (source, spec, arguments and input) is {} bytes; the worker takes at \
                 most {MAX_REQUEST_BYTES}",
                bytes.len()
            )));
        }
        if cancel.load(Ordering::SeqCst) {
            return Err(RunError::Cancelled);
        }
        let limit = request
            .output_limit_bytes
            .saturating_add(ANSWER_SLACK_BYTES);
        let finished = self
            .exchange(&["run"], Some(bytes), limit, timeout, Some(&cancel))
            .await?;
        self.check_finished(&finished)?;
        serde_cbor::from_slice::<Result<RunOutcome, RunError>>(&finished.stdout).map_err(
            |error| {
                RunError::Worker(format!(
                    "it answered {} bytes that are not a CBOR run result ({error}){}",
                    finished.stdout.len(),
                    stderr_suffix(&finished.stderr_tail)
                ))
            },
        )?
    }

    fn check_finished(&self, finished: &Finished) -> Result<(), RunError> {
        if !finished.status.success() {
            return Err(RunError::Worker(format!(
                "{} exited with {}{}",
                self.program.display(),
                finished.status,
                stderr_suffix(&finished.stderr_tail)
            )));
        }
        if finished.stdout_overflow {
            return Err(RunError::Worker(format!(
                "its answer exceeded the {} bytes expected{}",
                finished.stdout.len(),
                stderr_suffix(&finished.stderr_tail)
            )));
        }
        Ok(())
    }

    /// Starts the worker with `args`, feeds it `stdin`, and collects its
    /// output until it exits, the timeout passes, or `cancel` is set.
    async fn exchange(
        &self,
        args: &[&str],
        stdin: Option<Vec<u8>>,
        stdout_limit: u64,
        timeout: Duration,
        cancel: Option<&AtomicBool>,
    ) -> Result<Finished, RunError> {
        let started = Instant::now();
        let mut command = tokio::process::Command::new(&self.program);
        command
            .args(args)
            .arg("--cache-dir")
            .arg(&self.cache_dir)
            .stdin(if stdin.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        let mut child = command.spawn().map_err(|error| {
            RunError::Worker(format!(
                "cannot start {}: {error}; build it (cargo build -p starling-opencl) or point the \
                 agent at it",
                self.program.display()
            ))
        })?;
        let writer = match (child.stdin.take(), stdin) {
            (Some(mut pipe), Some(bytes)) => Some(tokio::spawn(async move {
                // A worker that dies before reading everything breaks the
                // pipe; its exit status tells the story, not this error.
                let _ = pipe.write_all(&bytes).await;
                let _ = pipe.shutdown().await;
            })),
            _ => None,
        };
        let stdout_reader = child
            .stdout
            .take()
            .map(|pipe| tokio::spawn(read_bounded(pipe, stdout_limit)));
        let stderr_reader = child
            .stderr
            .take()
            .map(|pipe| tokio::spawn(read_tail(pipe, STDERR_TAIL_BYTES)));
        let handles: Vec<tokio::task::AbortHandle> = writer
            .iter()
            .map(|task| task.abort_handle())
            .chain(stdout_reader.iter().map(|task| task.abort_handle()))
            .chain(stderr_reader.iter().map(|task| task.abort_handle()))
            .collect();
        let abort_io = || handles.iter().for_each(|handle| handle.abort());

        let deadline = tokio::time::sleep(timeout);
        tokio::pin!(deadline);
        let mut poll = tokio::time::interval(CANCEL_POLL);
        let status = loop {
            tokio::select! {
                status = child.wait() => break status,
                () = &mut deadline => {
                    kill(&mut child).await;
                    abort_io();
                    return Err(RunError::Timeout { wall_ms: timeout.as_millis() as u64 });
                }
                _ = poll.tick(), if cancel.is_some() => {
                    if cancel.is_some_and(|flag| flag.load(Ordering::SeqCst)) {
                        kill(&mut child).await;
                        abort_io();
                        return Err(RunError::Cancelled);
                    }
                }
            }
        };
        let status = status.map_err(|error| {
            abort_io();
            RunError::Worker(format!("cannot wait for the worker: {error}"))
        })?;
        // The pipes close when the worker exits, unless something it started
        // still holds them; do not wait on that past the deadline.
        let grace = timeout
            .saturating_sub(started.elapsed())
            .max(Duration::from_secs(1));
        let (stdout, stdout_overflow) = match stdout_reader {
            Some(task) => match tokio::time::timeout(grace, task).await {
                Ok(Ok(result)) => result,
                _ => (Vec::new(), false),
            },
            None => (Vec::new(), false),
        };
        let stderr_tail = match stderr_reader {
            Some(task) => match tokio::time::timeout(Duration::from_secs(1), task).await {
                Ok(Ok(bytes)) => last_lines(&bytes, STDERR_TAIL_LINES),
                _ => String::new(),
            },
            None => String::new(),
        };
        if let Some(task) = writer {
            task.abort();
        }
        Ok(Finished {
            status,
            stdout,
            stdout_overflow,
            stderr_tail,
        })
    }
}

/// SIGKILLs the worker and reaps it, so no zombie is left behind.
async fn kill(child: &mut tokio::process::Child) {
    if let Err(error) = child.kill().await {
        tracing::warn!("cannot kill the OpenCL worker: {error}");
    }
}

/// Reads a pipe to its end, keeping at most `limit` bytes; the rest is
/// drained (so the writer never blocks) and reported as an overflow.
async fn read_bounded(mut pipe: impl AsyncRead + Unpin, limit: u64) -> (Vec<u8>, bool) {
    let mut kept = Vec::new();
    let mut overflow = false;
    let mut chunk = vec![0u8; 64 * 1024];
    loop {
        match pipe.read(&mut chunk).await {
            Ok(0) | Err(_) => break,
            Ok(read) => {
                let room =
                    usize::try_from(limit.saturating_sub(kept.len() as u64)).unwrap_or(usize::MAX);
                if read > room {
                    overflow = true;
                }
                kept.extend_from_slice(&chunk[..read.min(room)]);
            }
        }
    }
    (kept, overflow)
}

/// Reads a pipe to its end, keeping its last `keep` bytes.
async fn read_tail(mut pipe: impl AsyncRead + Unpin, keep: usize) -> Vec<u8> {
    let mut tail = Vec::new();
    let mut chunk = vec![0u8; 8 * 1024];
    loop {
        match pipe.read(&mut chunk).await {
            Ok(0) | Err(_) => break,
            Ok(read) => {
                tail.extend_from_slice(&chunk[..read]);
                if tail.len() > keep * 2 {
                    tail.drain(..tail.len() - keep);
                }
            }
        }
    }
    if tail.len() > keep {
        tail.drain(..tail.len() - keep);
    }
    tail
}

fn last_lines(bytes: &[u8], lines: usize) -> String {
    let text = String::from_utf8_lossy(bytes);
    let all: Vec<&str> = text
        .lines()
        .filter(|line| !line.trim().is_empty())
        .collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

fn stderr_suffix(tail: &str) -> String {
    if tail.is_empty() {
        String::new()
    } else {
        format!("; its stderr ends with:\n{tail}")
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn last_lines_keeps_the_end_without_blank_lines() {
        let text = b"one\n\ntwo\nthree\n\n";
        assert_eq!(last_lines(text, 2), "two\nthree");
        assert_eq!(last_lines(text, 10), "one\ntwo\nthree");
        assert_eq!(last_lines(b"", 3), "");
    }

    #[tokio::test]
    async fn readers_bound_what_they_keep() {
        let data = vec![7u8; 100_000];
        let (kept, overflow) = read_bounded(&data[..], 1000).await;
        assert_eq!(kept.len(), 1000);
        assert!(overflow);
        let (kept, overflow) = read_bounded(&data[..], 100_000).await;
        assert_eq!(kept.len(), 100_000);
        assert!(!overflow);
        let mut numbered = Vec::new();
        for line in 0..10_000 {
            numbered.extend_from_slice(format!("{line}\n").as_bytes());
        }
        let tail = read_tail(&numbered[..], 100).await;
        assert_eq!(tail.len(), 100);
        assert!(String::from_utf8(tail).unwrap().ends_with("9998\n9999\n"));
    }

    #[test]
    fn locate_prefers_the_explicit_path() {
        let explicit = Path::new("/opt/starling/worker");
        assert_eq!(
            WorkerClient::locate(Some(explicit)),
            Some(explicit.to_path_buf())
        );
    }
}
