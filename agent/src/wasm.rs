//! The wasm executor: compiles modules and runs them under WASI preview 1 with
//! hard limits on wall time, linear memory and output size, and with no
//! filesystem (no preopened directories) and no network.
//!
//! Wall time is enforced with epoch interruption: a ticker thread advances the
//! engine's epoch every [`EPOCH_TICK`], and each store's epoch callback checks
//! its deadline and cancel flag at every tick. Memory is enforced by a
//! resource limiter that wraps [`StoreLimits`] with trap-on-grow-failure and
//! records which limit was hit, so the failure is reported as
//! [`ExecError::MemoryLimit`] rather than a generic trap. Output goes to a
//! bounded in-memory pipe that traps the guest when it would overflow.
//!
//! The clock and randomness are capabilities ([`Grants`]): a module that was
//! not granted the clock reads the Unix epoch from the wall clock and 0 from
//! the monotonic clock, and one not granted randomness gets zeros. A fixed
//! value rather than an error keeps ordinary programs (whose runtimes seed
//! hash maps and read the time at start) running, deterministically. The
//! executor also holds the node's policy and refuses, before anything runs, a
//! request for a grant the policy does not allow.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use bytes::Bytes;
use starling_proto::{ExecLimits, ExecMetrics, FailureReason, Grants};
use wasmtime::{
    Engine, ExternType, InstancePre, Linker, Module, ResourceLimiter, Store, StoreLimits,
    StoreLimitsBuilder, UpdateDeadline,
};
use wasmtime_wasi::cli::{IsTerminal, StdoutStream};
use wasmtime_wasi::p1::WasiP1Ctx;
use wasmtime_wasi::p2::pipe::MemoryInputPipe;
use wasmtime_wasi::p2::{OutputStream, Pollable, StreamError, StreamResult};
use wasmtime_wasi::{Deterministic, HostMonotonicClock, HostWallClock, I32Exit, WasiCtxBuilder};

/// How often the ticker thread advances the engine's epoch. It bounds how late
/// a timeout or a cancel is noticed.
pub const EPOCH_TICK: Duration = Duration::from_millis(5);

/// Most stderr bytes kept for failure messages; the rest is dropped silently.
const STDERR_KEEP_BYTES: usize = 4 * 1024;

/// The program name the module sees as `argv[0]` unless the caller names one.
pub const DEFAULT_PROGRAM_NAME: &str = "task";

/// Why a module could not be compiled or run.
#[derive(Debug, thiserror::Error)]
pub enum ExecError {
    /// The bytes are not a valid WebAssembly module.
    #[error("the artifact is not a valid wasm module: {detail}")]
    InvalidModule {
        /// What the compiler said.
        detail: String,
    },
    /// The module does not fit this agent's runtime (missing `_start`, unknown imports).
    #[error("the module cannot be run: {detail}")]
    Unrunnable {
        /// What was wrong.
        detail: String,
    },
    /// The wall-clock limit was reached.
    #[error("the task ran past its wall-clock limit of {wall_ms} ms")]
    Timeout {
        /// The limit in milliseconds.
        wall_ms: u64,
    },
    /// The module tried to grow its memory past the limit.
    #[error("the task tried to grow its memory to {requested_bytes} bytes, over the limit of {limit_bytes} bytes")]
    MemoryLimit {
        /// The limit in bytes.
        limit_bytes: u64,
        /// What the module asked for.
        requested_bytes: u64,
    },
    /// The module wrote more output than allowed.
    #[error("the task wrote more than its output limit of {limit_bytes} bytes")]
    OutputLimit {
        /// The limit in bytes.
        limit_bytes: u64,
    },
    /// The module trapped.
    #[error("the task trapped: {detail}")]
    Trap {
        /// The trap and, when the module wrote some, the tail of its stderr.
        detail: String,
    },
    /// The module exited with a non-zero status.
    #[error("the task exited with status {code}{}", stderr_suffix(.stderr))]
    ExitCode {
        /// The exit status.
        code: i32,
        /// What the module wrote to stdout before exiting.
        output: Vec<u8>,
        /// The start of what it wrote to stderr.
        stderr: String,
    },
    /// The attempt was cancelled while it ran.
    #[error("the task was cancelled")]
    Cancelled,
    /// A precompiled module that is not the one the assignment named, or not
    /// one this engine can load; nothing of it was loaded.
    #[error("the precompiled module was refused: {detail}")]
    PrecompiledRefused {
        /// Why.
        detail: String,
    },
    /// A plain module reached an agent built without a compiler.
    #[error("this agent has no compiler (built without the `cranelift` feature) and the assignment carries no precompiled module; the coordinator compiles modules for such agents when its wasmtime matches theirs")]
    NoCompiler,
    /// The task asks for a grant this node's policy does not allow.
    #[error("the task asks for the {grant} grant, which this node does not allow (start the agent with --allow-grant {grant} to allow it)")]
    GrantRefused {
        /// The grant refused: `clock` or `random`.
        grant: &'static str,
    },
    /// The engine itself failed (a bug or resource exhaustion on the agent).
    #[error("the wasm engine failed: {detail}")]
    Internal {
        /// What failed.
        detail: String,
    },
}

fn stderr_suffix(stderr: &str) -> String {
    if stderr.is_empty() {
        String::new()
    } else {
        format!("; stderr: {stderr}")
    }
}

impl ExecError {
    /// The wire code for this failure.
    pub fn failure_reason(&self) -> FailureReason {
        match self {
            ExecError::InvalidModule { .. }
            | ExecError::Unrunnable { .. }
            | ExecError::NoCompiler => FailureReason::InvalidModule,
            ExecError::PrecompiledRefused { .. } => FailureReason::DigestMismatch,
            // The wire has no policy code; "this node cannot run it" is the
            // closest, and the message names the grant and the flag.
            ExecError::GrantRefused { .. } => FailureReason::PolicyRefused,
            ExecError::Timeout { .. } => FailureReason::Timeout,
            ExecError::MemoryLimit { .. } => FailureReason::MemoryLimit,
            ExecError::OutputLimit { .. } => FailureReason::OutputLimit,
            ExecError::Trap { .. } => FailureReason::Trap,
            ExecError::ExitCode { .. } => FailureReason::ExitCode,
            // A cancelled attempt is reported with the `cancelled` state, not a
            // failure; this code is only what a caller gets if it asks anyway.
            ExecError::Cancelled => FailureReason::AgentBusy,
            ExecError::Internal { .. } => FailureReason::Internal,
        }
    }
}

/// What a finished run produced.
#[derive(Debug, Clone, PartialEq)]
pub struct ExecOutcome {
    /// Everything the module wrote to stdout.
    pub output: Vec<u8>,
    /// The exit status: 0 when `_start` returned or the module called `proc_exit(0)`.
    pub exit_code: i32,
    /// The start of what the module wrote to stderr.
    pub stderr: String,
    /// Wall time and peak memory; `compile_ms` and `cache_hit` are left for the
    /// caller, which knows how the module was obtained.
    pub metrics: ExecMetrics,
}

/// A compiled module, its imports already resolved against WASI preview 1,
/// ready to be instantiated and run any number of times by the executor that
/// compiled it.
#[derive(Clone)]
pub struct CompiledModule {
    module: Module,
    pre: InstancePre<TaskState>,
    /// How long compilation took.
    pub compile_time: Duration,
}

impl std::fmt::Debug for CompiledModule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CompiledModule")
            .field("compile_time", &self.compile_time)
            .finish_non_exhaustive()
    }
}

impl CompiledModule {
    /// The underlying wasmtime module.
    pub fn module(&self) -> &Module {
        &self.module
    }
}

/// One run's request beyond the module itself.
#[derive(Debug, Clone)]
pub struct RunRequest<'a> {
    /// `argv[0]` as the module sees it.
    pub program_name: &'a str,
    /// Bytes on stdin.
    pub input: &'a [u8],
    /// `argv[1..]`.
    pub args: &'a [String],
    /// Limits to enforce.
    pub limits: &'a ExecLimits,
    /// Set from another thread to stop the run at the next epoch tick.
    pub cancel: Option<Arc<AtomicBool>>,
    /// What the module may use; the executor's policy must allow all of it.
    pub grants: Grants,
}

/// The clock a module without the clock grant sees: always the Unix epoch.
struct FixedWallClock;

impl HostWallClock for FixedWallClock {
    fn resolution(&self) -> Duration {
        Duration::from_secs(1)
    }

    fn now(&self) -> Duration {
        Duration::ZERO
    }
}

/// The monotonic clock a module without the clock grant sees: it never moves.
struct FixedMonotonicClock;

impl HostMonotonicClock for FixedMonotonicClock {
    fn resolution(&self) -> u64 {
        1_000_000_000
    }

    fn now(&self) -> u64 {
        0
    }
}

/// Per-store state: the WASI context and the limiter.
struct TaskState {
    wasi: WasiP1Ctx,
    limiter: TaskLimiter,
    /// Set by the epoch callback when it stops the run, and why.
    interrupted: Option<Interruption>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Interruption {
    Timeout,
    Cancelled,
}

/// [`StoreLimits`] with trap-on-grow-failure, plus a record of the peak memory
/// granted and of the first refused growth.
struct TaskLimiter {
    inner: StoreLimits,
    memory_limit: usize,
    peak_memory: usize,
    refused_memory_growth: Option<usize>,
}

impl ResourceLimiter for TaskLimiter {
    fn memory_growing(
        &mut self,
        current: usize,
        desired: usize,
        maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        if desired > self.memory_limit {
            self.refused_memory_growth = Some(desired);
        }
        let allowed = self.inner.memory_growing(current, desired, maximum);
        if let Ok(true) = allowed {
            self.peak_memory = self.peak_memory.max(desired);
        }
        allowed
    }

    fn memory_grow_failed(&mut self, error: wasmtime::Error) -> wasmtime::Result<()> {
        self.inner.memory_grow_failed(error)
    }

    fn table_growing(
        &mut self,
        current: usize,
        desired: usize,
        maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        self.inner.table_growing(current, desired, maximum)
    }

    fn table_grow_failed(&mut self, error: wasmtime::Error) -> wasmtime::Result<()> {
        self.inner.table_grow_failed(error)
    }

    fn instances(&self) -> usize {
        self.inner.instances()
    }

    fn tables(&self) -> usize {
        self.inner.tables()
    }

    fn memories(&self) -> usize {
        self.inner.memories()
    }
}

/// An in-memory output stream holding at most `capacity` bytes. A write that
/// would overflow keeps what fits, marks the pipe as overflowed and traps the
/// guest, so a module that ignores write errors cannot spin until its timeout.
#[derive(Clone)]
struct BoundedPipe {
    capacity: usize,
    trap_on_overflow: bool,
    buffer: Arc<Mutex<Vec<u8>>>,
    overflowed: Arc<AtomicBool>,
}

/// Largest permit handed to the guest in one `check_write`; WASI streams
/// conventionally use about 64 KiB so the host never allocates much at once.
const WRITE_PERMIT_BYTES: usize = 64 * 1024;

impl BoundedPipe {
    fn new(capacity: usize, trap_on_overflow: bool) -> Self {
        Self {
            capacity,
            trap_on_overflow,
            buffer: Arc::new(Mutex::new(Vec::new())),
            overflowed: Arc::new(AtomicBool::new(false)),
        }
    }

    fn contents(&self) -> Vec<u8> {
        self.buffer
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn overflowed(&self) -> bool {
        self.overflowed.load(Ordering::SeqCst)
    }
}

impl IsTerminal for BoundedPipe {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl StdoutStream for BoundedPipe {
    fn p2_stream(&self) -> Box<dyn OutputStream> {
        Box::new(self.clone())
    }

    fn async_stream(&self) -> Box<dyn tokio::io::AsyncWrite + Send + Sync> {
        // Preview 1 only uses `p2_stream`; this path exists for completeness and
        // drops what does not fit.
        Box::new(tokio::io::sink())
    }
}

#[wasmtime_wasi::async_trait]
impl Pollable for BoundedPipe {
    async fn ready(&mut self) {}
}

#[wasmtime_wasi::async_trait]
impl OutputStream for BoundedPipe {
    fn write(&mut self, bytes: Bytes) -> StreamResult<()> {
        let mut buffer = self.buffer.lock().unwrap_or_else(PoisonError::into_inner);
        let room = self.capacity.saturating_sub(buffer.len());
        if bytes.len() > room {
            buffer.extend_from_slice(&bytes[..room]);
            self.overflowed.store(true, Ordering::SeqCst);
            if self.trap_on_overflow {
                return Err(StreamError::trap("output limit exceeded"));
            }
            return Ok(());
        }
        buffer.extend_from_slice(&bytes);
        Ok(())
    }

    fn flush(&mut self) -> StreamResult<()> {
        Ok(())
    }

    fn check_write(&mut self) -> StreamResult<usize> {
        // Always grant a permit, even when full: the overflowing write is what
        // raises the trap (or, for stderr, is silently cut).
        Ok(WRITE_PERMIT_BYTES)
    }
}

/// Advances the engine's epoch until dropped.
struct EpochTicker {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl EpochTicker {
    fn start(engine: Engine) -> Result<Self, ExecError> {
        let stop = Arc::new(AtomicBool::new(false));
        let thread_stop = Arc::clone(&stop);
        let thread = std::thread::Builder::new()
            .name("starling-epoch".into())
            .spawn(move || {
                while !thread_stop.load(Ordering::Relaxed) {
                    std::thread::sleep(EPOCH_TICK);
                    engine.increment_epoch();
                }
            })
            .map_err(|e| ExecError::Internal {
                detail: format!("cannot start the epoch ticker thread: {e}"),
            })?;
        Ok(Self {
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for EpochTicker {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Compiles and runs wasm modules under limits. One executor serves every
/// task of an agent; it is `Send + Sync` and runs can proceed in parallel on
/// several threads.
pub struct WasmExecutor {
    engine: Engine,
    linker: Linker<TaskState>,
    allowed: Grants,
    _ticker: EpochTicker,
}

impl std::fmt::Debug for WasmExecutor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WasmExecutor").finish_non_exhaustive()
    }
}

impl WasmExecutor {
    /// Builds the engine, the WASI preview 1 linker and the epoch ticker,
    /// with a policy that allows no grant.
    pub fn new() -> Result<Self, ExecError> {
        Self::with_policy(Grants::default())
    }

    /// Like [`WasmExecutor::new`], allowing the grants in `allowed`.
    pub fn with_policy(allowed: Grants) -> Result<Self, ExecError> {
        // The settings the coordinator compiles for this node with, so that
        // its precompiled modules load here.
        let engine = Engine::new(&starling_wasm::config()).map_err(|e| ExecError::Internal {
            detail: format!("cannot build the wasm engine: {e}"),
        })?;
        let mut linker = Linker::new(&engine);
        wasmtime_wasi::p1::add_to_linker_sync(&mut linker, |state: &mut TaskState| &mut state.wasi)
            .map_err(|e| ExecError::Internal {
                detail: format!("cannot link WASI preview 1: {e}"),
            })?;
        let ticker = EpochTicker::start(engine.clone())?;
        Ok(Self {
            engine,
            linker,
            allowed,
            _ticker: ticker,
        })
    }

    /// Whether this node's policy allows `requested`; the refusal names the
    /// first grant it does not allow.
    pub fn check_grants(&self, requested: &Grants) -> Result<(), ExecError> {
        if requested.clock && !self.allowed.clock {
            return Err(ExecError::GrantRefused { grant: "clock" });
        }
        if requested.random && !self.allowed.random {
            return Err(ExecError::GrantRefused { grant: "random" });
        }
        Ok(())
    }

    /// Compiles a module from its binary form. Text (WAT) and anything that is
    /// not a valid module is refused with [`ExecError::InvalidModule`].
    ///
    /// A valid module that this runtime cannot run (imports beyond WASI
    /// preview 1, no `_start: () -> ()` export) is refused here with
    /// [`ExecError::Unrunnable`], before any attempt is made.
    #[cfg(feature = "cranelift")]
    pub fn compile(&self, bytes: &[u8]) -> Result<CompiledModule, ExecError> {
        let started = Instant::now();
        let module =
            Module::from_binary(&self.engine, bytes).map_err(|e| ExecError::InvalidModule {
                detail: format!("{e:#}"),
            })?;
        self.prepare(module, started)
    }

    /// Without a compiler, a plain module cannot run here.
    #[cfg(not(feature = "cranelift"))]
    pub fn compile(&self, _bytes: &[u8]) -> Result<CompiledModule, ExecError> {
        Err(ExecError::NoCompiler)
    }

    /// Whether this executor compiles plain modules (the agent was built
    /// with the `cranelift` feature).
    pub fn compiles(&self) -> bool {
        cfg!(feature = "cranelift")
    }

    /// Loads machine code the coordinator compiled for this node: `bytes`
    /// must hash to `digest`, the precompiled digest of an assignment whose
    /// signature verified (the `precompiled` module says why that is enough).
    pub fn load_precompiled(
        &self,
        bytes: &[u8],
        digest: &starling_proto::Digest,
    ) -> Result<CompiledModule, ExecError> {
        let started = Instant::now();
        let module = crate::precompiled::load(&self.engine, bytes, digest).map_err(|refused| {
            ExecError::PrecompiledRefused {
                detail: refused.to_string(),
            }
        })?;
        self.prepare(module, started)
    }

    /// Checks that a module is a WASI command this runtime can run and
    /// resolves its imports.
    fn prepare(&self, module: Module, started: Instant) -> Result<CompiledModule, ExecError> {
        match module.get_export("_start") {
            Some(ExternType::Func(signature))
                if signature.params().len() == 0 && signature.results().len() == 0 => {}
            _ => {
                return Err(ExecError::Unrunnable {
                    detail: "the module exports no `_start` function of type () -> () \
                             (build it as a WASI command, e.g. for wasm32-wasip1)"
                        .to_owned(),
                })
            }
        }
        let pre = self
            .linker
            .instantiate_pre(&module)
            .map_err(|e| ExecError::Unrunnable {
                detail: format!("{e:#}; tasks may import only wasi_snapshot_preview1"),
            })?;
        Ok(CompiledModule {
            module,
            pre,
            compile_time: started.elapsed(),
        })
    }

    /// Runs a module's `_start` with `input` on stdin and `args` as
    /// `argv[1..]`, enforcing `limits`. Returns the output when the module
    /// exits with status 0.
    pub fn run(
        &self,
        module: &CompiledModule,
        input: &[u8],
        args: &[String],
        limits: &ExecLimits,
    ) -> Result<ExecOutcome, ExecError> {
        self.run_request(
            module,
            RunRequest {
                program_name: DEFAULT_PROGRAM_NAME,
                input,
                args,
                limits,
                cancel: None,
                grants: Grants::default(),
            },
        )
    }

    /// Like [`WasmExecutor::run`], with a program name and a cancel flag.
    pub fn run_request(
        &self,
        module: &CompiledModule,
        request: RunRequest<'_>,
    ) -> Result<ExecOutcome, ExecError> {
        if !Engine::same(module.module.engine(), &self.engine) {
            return Err(ExecError::Internal {
                detail: "the module was compiled by another executor".to_owned(),
            });
        }
        self.check_grants(&request.grants)?;
        let limits = request.limits;
        let output_limit = usize::try_from(limits.output_bytes).unwrap_or(usize::MAX);
        let memory_limit = usize::try_from(limits.memory_bytes).unwrap_or(usize::MAX);
        let stdout = BoundedPipe::new(output_limit, true);
        let stderr = BoundedPipe::new(STDERR_KEEP_BYTES, false);

        let mut argv = Vec::with_capacity(request.args.len() + 1);
        argv.push(request.program_name.to_owned());
        argv.extend(request.args.iter().cloned());

        // No preopened directories and no socket permissions: the module sees
        // no filesystem and no network, only stdio, args, and the clock and
        // random bytes as granted.
        let mut builder = WasiCtxBuilder::new();
        builder
            .stdin(MemoryInputPipe::new(Bytes::copy_from_slice(request.input)))
            .stdout(stdout.clone())
            .stderr(stderr.clone())
            .args(&argv)
            .allow_tcp(false)
            .allow_udp(false)
            .allow_ip_name_lookup(false);
        if !request.grants.clock {
            builder
                .wall_clock(FixedWallClock)
                .monotonic_clock(FixedMonotonicClock);
        }
        if !request.grants.random {
            builder
                .secure_random(Deterministic::new(vec![0]))
                .insecure_random(Deterministic::new(vec![0]))
                .insecure_random_seed(0);
        }
        let wasi = builder.build_p1();
        let limiter = TaskLimiter {
            inner: StoreLimitsBuilder::new()
                .memory_size(memory_limit)
                .instances(1)
                .trap_on_grow_failure(true)
                .build(),
            memory_limit,
            peak_memory: 0,
            refused_memory_growth: None,
        };
        let mut store = Store::new(
            &self.engine,
            TaskState {
                wasi,
                limiter,
                interrupted: None,
            },
        );
        store.limiter(|state| &mut state.limiter);

        let started = Instant::now();
        let deadline = started + Duration::from_millis(limits.wall_ms);
        let cancel = request.cancel.clone();
        store.set_epoch_deadline(1);
        store.epoch_deadline_callback(move |mut context| {
            if cancel
                .as_ref()
                .is_some_and(|flag| flag.load(Ordering::SeqCst))
            {
                context.data_mut().interrupted = Some(Interruption::Cancelled);
                return Ok(UpdateDeadline::Interrupt);
            }
            if Instant::now() >= deadline {
                context.data_mut().interrupted = Some(Interruption::Timeout);
                return Ok(UpdateDeadline::Interrupt);
            }
            Ok(UpdateDeadline::Continue(1))
        });
        let run = self.instantiate_and_start(&mut store, module);
        let wall = started.elapsed();

        let state = store.data();
        let metrics = ExecMetrics {
            wall_ms: u64::try_from(wall.as_millis()).unwrap_or(u64::MAX),
            compile_ms: 0,
            peak_memory_bytes: state.limiter.peak_memory as u64,
            cache_hit: false,
        };
        let stderr_text = String::from_utf8_lossy(&stderr.contents()).into_owned();
        let exit_code = match run {
            Ok(()) => 0,
            Err(error) => {
                if let Some(exit) = error.downcast_ref::<I32Exit>() {
                    exit.0
                } else {
                    return Err(classify_failure(
                        error,
                        state,
                        &stdout,
                        limits,
                        &stderr_text,
                    ));
                }
            }
        };
        if stdout.overflowed() {
            return Err(ExecError::OutputLimit {
                limit_bytes: limits.output_bytes,
            });
        }
        let output = stdout.contents();
        if exit_code != 0 {
            return Err(ExecError::ExitCode {
                code: exit_code,
                output,
                stderr: stderr_text,
            });
        }
        Ok(ExecOutcome {
            output,
            exit_code,
            stderr: stderr_text,
            metrics,
        })
    }

    fn instantiate_and_start(
        &self,
        store: &mut Store<TaskState>,
        module: &CompiledModule,
    ) -> wasmtime::Result<()> {
        let instance = module.pre.instantiate(&mut *store)?;
        // `compile` checked that `_start` exists with this type.
        let start = instance.get_typed_func::<(), ()>(&mut *store, "_start")?;
        start.call(&mut *store, ())
    }
}

/// Works out which limit or fault ended a run that did not exit normally.
fn classify_failure(
    error: wasmtime::Error,
    state: &TaskState,
    stdout: &BoundedPipe,
    limits: &ExecLimits,
    stderr: &str,
) -> ExecError {
    match state.interrupted {
        Some(Interruption::Cancelled) => return ExecError::Cancelled,
        Some(Interruption::Timeout) => {
            return ExecError::Timeout {
                wall_ms: limits.wall_ms,
            }
        }
        None => {}
    }
    if let Some(requested) = state.limiter.refused_memory_growth {
        return ExecError::MemoryLimit {
            limit_bytes: limits.memory_bytes,
            requested_bytes: requested as u64,
        };
    }
    if stdout.overflowed() {
        return ExecError::OutputLimit {
            limit_bytes: limits.output_bytes,
        };
    }
    let text = format!("{error:#}");
    ExecError::Trap {
        detail: format!("{text}{}", stderr_suffix(stderr)),
    }
}

// The tests compile their modules from text, so they need the compiler.
#[cfg(all(test, feature = "cranelift"))]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    fn executor() -> WasmExecutor {
        WasmExecutor::new().unwrap()
    }

    fn compile(executor: &WasmExecutor, wat_text: &str) -> CompiledModule {
        executor
            .compile(&wat::parse_str(wat_text).unwrap())
            .unwrap()
    }

    /// Copies stdin to stdout through a 64 KiB buffer at offset 1024.
    const ECHO: &str = r#"
    (module
      (import "wasi_snapshot_preview1" "fd_read" (func $fd_read (param i32 i32 i32 i32) (result i32)))
      (import "wasi_snapshot_preview1" "fd_write" (func $fd_write (param i32 i32 i32 i32) (result i32)))
      (memory (export "memory") 2)
      (func (export "_start")
        (local $n i32)
        (loop $again
          ;; iovec at 0: buf=1024 len=65536
          (i32.store (i32.const 0) (i32.const 1024))
          (i32.store (i32.const 4) (i32.const 65536))
          (drop (call $fd_read (i32.const 0) (i32.const 0) (i32.const 1) (i32.const 8)))
          (local.set $n (i32.load (i32.const 8)))
          (if (i32.gt_u (local.get $n) (i32.const 0))
            (then
              (i32.store (i32.const 16) (i32.const 1024))
              (i32.store (i32.const 20) (local.get $n))
              (drop (call $fd_write (i32.const 1) (i32.const 16) (i32.const 1) (i32.const 24)))
              (br $again))))))
    "#;

    #[test]
    fn echo_copies_stdin_to_stdout() {
        let executor = executor();
        let module = compile(&executor, ECHO);
        let input = b"hello, starling".repeat(10_000);
        let outcome = executor
            .run(&module, &input, &[], &ExecLimits::default())
            .unwrap();
        assert_eq!(outcome.output, input);
        assert_eq!(outcome.exit_code, 0);
        assert!(outcome.metrics.peak_memory_bytes >= 2 * 65536);
    }

    #[test]
    fn text_and_garbage_are_invalid_modules() {
        let executor = executor();
        let err = executor.compile(b"(module)").unwrap_err();
        assert!(matches!(err, ExecError::InvalidModule { .. }), "{err}");
        assert_eq!(err.failure_reason(), FailureReason::InvalidModule);
        let err = executor.compile(&[0, 1, 2, 3, 4, 5]).unwrap_err();
        assert!(matches!(err, ExecError::InvalidModule { .. }), "{err}");
    }

    #[test]
    fn args_are_visible_with_program_name_first() {
        // Writes the argv buffer (NUL-separated strings) to stdout.
        let wat_text = r#"
        (module
          (import "wasi_snapshot_preview1" "args_sizes_get" (func $sizes (param i32 i32) (result i32)))
          (import "wasi_snapshot_preview1" "args_get" (func $args_get (param i32 i32) (result i32)))
          (import "wasi_snapshot_preview1" "fd_write" (func $fd_write (param i32 i32 i32 i32) (result i32)))
          (memory (export "memory") 1)
          (func (export "_start")
            (drop (call $sizes (i32.const 0) (i32.const 4)))
            (drop (call $args_get (i32.const 512) (i32.const 1024)))
            (i32.store (i32.const 16) (i32.const 1024))
            (i32.store (i32.const 20) (i32.load (i32.const 4)))
            (drop (call $fd_write (i32.const 1) (i32.const 16) (i32.const 1) (i32.const 24)))))
        "#;
        let executor = executor();
        let module = compile(&executor, wat_text);
        let args = vec!["--level".to_owned(), "3".to_owned()];
        let outcome = executor
            .run_request(
                &module,
                RunRequest {
                    program_name: "sum",
                    input: b"",
                    args: &args,
                    limits: &ExecLimits::default(),
                    cancel: None,
                    grants: Grants::default(),
                },
            )
            .unwrap();
        assert_eq!(outcome.output, b"sum\0--level\x003\0");
    }

    #[test]
    fn non_zero_exit_is_an_exit_code_failure() {
        let wat_text = r#"
        (module
          (import "wasi_snapshot_preview1" "proc_exit" (func $exit (param i32)))
          (memory (export "memory") 1)
          (func (export "_start") (call $exit (i32.const 7))))
        "#;
        let executor = executor();
        let module = compile(&executor, wat_text);
        let err = executor
            .run(&module, b"", &[], &ExecLimits::default())
            .unwrap_err();
        assert!(matches!(err, ExecError::ExitCode { code: 7, .. }), "{err}");
        assert_eq!(err.failure_reason(), FailureReason::ExitCode);
    }

    #[test]
    fn proc_exit_zero_is_success() {
        let wat_text = r#"
        (module
          (import "wasi_snapshot_preview1" "proc_exit" (func $exit (param i32)))
          (memory (export "memory") 1)
          (func (export "_start") (call $exit (i32.const 0))))
        "#;
        let executor = executor();
        let module = compile(&executor, wat_text);
        let outcome = executor
            .run(&module, b"", &[], &ExecLimits::default())
            .unwrap();
        assert_eq!(outcome.exit_code, 0);
    }

    #[test]
    fn infinite_loop_times_out_within_the_wall_limit() {
        let wat_text =
            r#"(module (memory (export "memory") 1) (func (export "_start") (loop $l (br $l))))"#;
        let executor = executor();
        let module = compile(&executor, wat_text);
        let limits = ExecLimits {
            wall_ms: 200,
            ..ExecLimits::default()
        };
        let started = Instant::now();
        let err = executor.run(&module, b"", &[], &limits).unwrap_err();
        let elapsed = started.elapsed();
        assert!(matches!(err, ExecError::Timeout { wall_ms: 200 }), "{err}");
        assert_eq!(err.failure_reason(), FailureReason::Timeout);
        assert!(elapsed >= Duration::from_millis(200), "{elapsed:?}");
        // Generous bound: the 2-core CI machine may be busy compiling.
        assert!(elapsed < Duration::from_secs(3), "{elapsed:?}");
    }

    #[test]
    fn cancel_flag_stops_a_running_module() {
        let wat_text =
            r#"(module (memory (export "memory") 1) (func (export "_start") (loop $l (br $l))))"#;
        let executor = executor();
        let module = compile(&executor, wat_text);
        let cancel = Arc::new(AtomicBool::new(false));
        let limits = ExecLimits {
            wall_ms: 30_000,
            ..ExecLimits::default()
        };
        let started = Instant::now();
        let err = std::thread::scope(|scope| {
            scope.spawn(|| {
                std::thread::sleep(Duration::from_millis(100));
                cancel.store(true, Ordering::SeqCst);
            });
            executor
                .run_request(
                    &module,
                    RunRequest {
                        program_name: "spin",
                        input: b"",
                        args: &[],
                        limits: &limits,
                        cancel: Some(Arc::clone(&cancel)),
                        grants: Grants::default(),
                    },
                )
                .unwrap_err()
        });
        assert!(matches!(err, ExecError::Cancelled), "{err}");
        assert!(started.elapsed() < Duration::from_secs(10));
    }

    #[test]
    fn memory_grow_past_the_limit_is_a_memory_limit_failure() {
        // Grows by 64 pages (4 MiB) at a time until growth fails.
        let wat_text = r#"
        (module
          (memory (export "memory") 1)
          (func (export "_start")
            (loop $l
              (br_if $l (i32.ne (memory.grow (i32.const 64)) (i32.const -1))))))
        "#;
        let executor = executor();
        let module = compile(&executor, wat_text);
        let limits = ExecLimits {
            memory_bytes: 16 * 1024 * 1024,
            ..ExecLimits::default()
        };
        let err = executor.run(&module, b"", &[], &limits).unwrap_err();
        assert!(
            matches!(
                err,
                ExecError::MemoryLimit {
                    limit_bytes: 16_777_216,
                    ..
                }
            ),
            "{err}"
        );
        assert_eq!(err.failure_reason(), FailureReason::MemoryLimit);
    }

    #[test]
    fn initial_memory_over_the_limit_is_a_memory_limit_failure() {
        // 512 pages = 32 MiB declared up front.
        let wat_text = r#"(module (memory (export "memory") 512) (func (export "_start")))"#;
        let executor = executor();
        let module = compile(&executor, wat_text);
        let limits = ExecLimits {
            memory_bytes: 1024 * 1024,
            ..ExecLimits::default()
        };
        let err = executor.run(&module, b"", &[], &limits).unwrap_err();
        assert!(matches!(err, ExecError::MemoryLimit { .. }), "{err}");
    }

    #[test]
    fn unbounded_writes_are_an_output_limit_failure() {
        // Writes 1 KiB forever, ignoring errors.
        let wat_text = r#"
        (module
          (import "wasi_snapshot_preview1" "fd_write" (func $fd_write (param i32 i32 i32 i32) (result i32)))
          (memory (export "memory") 1)
          (func (export "_start")
            (i32.store (i32.const 0) (i32.const 1024))
            (i32.store (i32.const 4) (i32.const 1024))
            (loop $l
              (drop (call $fd_write (i32.const 1) (i32.const 0) (i32.const 1) (i32.const 8)))
              (br $l))))
        "#;
        let executor = executor();
        let module = compile(&executor, wat_text);
        let limits = ExecLimits {
            output_bytes: 10_000,
            wall_ms: 20_000,
            ..ExecLimits::default()
        };
        let started = Instant::now();
        let err = executor.run(&module, b"", &[], &limits).unwrap_err();
        assert!(
            matches!(
                err,
                ExecError::OutputLimit {
                    limit_bytes: 10_000
                }
            ),
            "{err}"
        );
        assert_eq!(err.failure_reason(), FailureReason::OutputLimit);
        // The trap ends the run at once, long before the wall limit.
        assert!(started.elapsed() < Duration::from_secs(10));
    }

    #[test]
    fn opening_a_file_fails_without_preopens() {
        // path_open on fd 3 (the first preopen, if there were one) for "etc/passwd";
        // the errno it returns becomes the exit status.
        let wat_text = r#"
        (module
          (import "wasi_snapshot_preview1" "path_open"
            (func $path_open (param i32 i32 i32 i32 i32 i64 i64 i32 i32) (result i32)))
          (import "wasi_snapshot_preview1" "proc_exit" (func $exit (param i32)))
          (memory (export "memory") 1)
          (data (i32.const 100) "etc/passwd")
          (func (export "_start")
            (call $exit
              (call $path_open (i32.const 3) (i32.const 0) (i32.const 100) (i32.const 10)
                (i32.const 0) (i64.const 2) (i64.const 0) (i32.const 0) (i32.const 200)))))
        "#;
        let executor = executor();
        let module = compile(&executor, wat_text);
        let err = executor
            .run(&module, b"", &[], &ExecLimits::default())
            .unwrap_err();
        // WASI errno 8 is EBADF: there is no descriptor 3 at all.
        assert!(matches!(err, ExecError::ExitCode { code: 8, .. }), "{err}");
    }

    #[test]
    fn trap_is_reported_as_trap() {
        let wat_text =
            r#"(module (memory (export "memory") 1) (func (export "_start") unreachable))"#;
        let executor = executor();
        let module = compile(&executor, wat_text);
        let err = executor
            .run(&module, b"", &[], &ExecLimits::default())
            .unwrap_err();
        assert!(matches!(err, ExecError::Trap { .. }), "{err}");
        assert_eq!(err.failure_reason(), FailureReason::Trap);
    }

    #[test]
    fn module_without_start_or_with_foreign_imports_is_refused_at_compile() {
        let executor = executor();
        for text in [
            r#"(module (func (export "main")))"#,
            r#"(module (func (export "_start") (param i32)))"#,
            r#"(module (import "env" "open_socket" (func)) (func (export "_start")))"#,
        ] {
            let err = executor
                .compile(&wat::parse_str(text).unwrap())
                .unwrap_err();
            assert!(matches!(err, ExecError::Unrunnable { .. }), "{err}");
            assert_eq!(err.failure_reason(), FailureReason::InvalidModule);
        }
    }

    #[test]
    fn modules_are_tied_to_their_executor() {
        let first = executor();
        let second = executor();
        let module = compile(&first, ECHO);
        let err = second
            .run(&module, b"x", &[], &ExecLimits::default())
            .unwrap_err();
        assert!(matches!(err, ExecError::Internal { .. }), "{err}");
    }
}
