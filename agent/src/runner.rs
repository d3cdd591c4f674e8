//! Runs one attempt from assignment to final event: waits for a slot, fetches
//! and verifies the module, compiles it (or takes it from the in-memory module
//! cache), executes it on a blocking thread, and reports each step as a
//! [`TaskEvent`] sent back to the I/O loop.
//!
//! A virtual device of `starling-agent swarm --execute modelled` runs its
//! attempts through the same runner with [`Execution::Modelled`]: caps, slot,
//! cancel and power level as for a real attempt, then a sleep as long as a
//! [`TaskModel`] says instead of fetching and running the module, so the
//! session, journal and events see the same sequence of events.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use starling_opencl::exec::{RunError, RunRequest as KernelRun};
use starling_opencl::worker::WorkerClient;
use starling_opencl::Package;
use starling_proto::limits::MAX_INLINE_OUTPUT_BYTES;
use starling_proto::{
    Assignment, Digest, ExecLimits, ExecMetrics, FailureReason, NodeId, PowerApplied, Runtime,
    TaskEvent, TaskState,
};
use tokio::sync::{mpsc, Semaphore};

use crate::artifact::{ArtifactStore, FetchedModule};
use crate::caps::{CapSettings, TaskCaps};
use crate::power::{PowerLevels, Ticket};
use crate::telemetry::TaskCounts;
use crate::wasm::{CompiledModule, ExecError, RunRequest, WasmExecutor};

/// How long past its wall limit an attempt blocked in a host call may run
/// before the runner gives up on it.
pub const HOST_CALL_GRACE: Duration = Duration::from_millis(500);

/// How often a queued attempt checks its cancel flag.
const QUEUED_CANCEL_POLL: Duration = Duration::from_millis(50);

/// How many compiled modules are kept in memory.
const COMPILED_MODULES_KEPT: usize = 32;

/// Live task counts, shared with telemetry.
#[derive(Debug, Default)]
pub struct Counters {
    running: AtomicUsize,
    queued: AtomicUsize,
    executions: AtomicUsize,
}

impl Counters {
    /// The counts now.
    pub fn snapshot(&self) -> TaskCounts {
        TaskCounts {
            running: self.running.load(Ordering::SeqCst),
            queued: self.queued.load(Ordering::SeqCst),
        }
    }

    /// How many module executions have started since the agent began.
    pub fn executions(&self) -> usize {
        self.executions.load(Ordering::SeqCst)
    }
}

/// Decrements a counter when dropped, so every exit path keeps counts right.
struct CountGuard<'a>(&'a AtomicUsize);

impl<'a> CountGuard<'a> {
    fn enter(counter: &'a AtomicUsize) -> Self {
        counter.fetch_add(1, Ordering::SeqCst);
        Self(counter)
    }
}

impl Drop for CountGuard<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The power level an attempt holds from the moment it runs: left when it
/// ends, and on unwinding too, so a panicking attempt cannot pin the CPU's
/// frequency ceiling.
struct PowerHold {
    power: Arc<PowerLevels>,
    ticket: Ticket,
    requested: u8,
    done: bool,
}

impl PowerHold {
    /// Leaves the level; returns the level in force while it ran.
    fn finish(mut self) -> PowerApplied {
        self.done = true;
        self.power.leave(self.ticket, self.requested)
    }
}

impl Drop for PowerHold {
    fn drop(&mut self) {
        if !self.done {
            self.power.leave(self.ticket, self.requested);
        }
    }
}

/// Compiled modules by digest, kept in memory. One per agent; the devices of
/// a swarm share one, so a module is compiled once per process rather than
/// once per virtual device. Cheap to clone: clones share the map.
#[derive(Clone, Default)]
pub struct ModuleCache(Arc<Mutex<HashMap<Digest, CompiledModule>>>);

impl std::fmt::Debug for ModuleCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let modules = self.0.lock().unwrap_or_else(PoisonError::into_inner).len();
        f.debug_struct("ModuleCache")
            .field("modules", &modules)
            .finish()
    }
}

/// How long a modelled attempt takes on a device: the stand-in for running
/// its module.
pub trait TaskModel: Send + Sync + std::fmt::Debug {
    /// The time `assignment` takes here with power level `level` in force.
    fn duration(&self, assignment: &Assignment, level: u8) -> Duration;
}

/// How the runner executes an attempt once it holds a slot.
#[derive(Debug, Clone, Default)]
pub enum Execution {
    /// Fetch, verify, compile and run the module (`starling-agent run`).
    #[default]
    Real,
    /// Fetch nothing and run nothing: report the attempt running, wait as
    /// long as the model says (cancellable), then report it succeeded with
    /// an empty output, or timed out when the model's time is over the
    /// attempt's wall-time limit. For virtual devices (`swarm --execute
    /// modelled`) that load a coordinator without loading this machine.
    Modelled(Arc<dyn TaskModel>),
}

/// Shared state of all attempts on this agent.
pub struct Runner {
    node_id: NodeId,
    executor: Arc<WasmExecutor>,
    opencl: Option<Arc<WorkerClient>>,
    artifacts: ArtifactStore,
    slots: Semaphore,
    counters: Arc<Counters>,
    compiled: ModuleCache,
    execution: Execution,
    initial_power_level: u8,
    power: Arc<PowerLevels>,
    events: mpsc::UnboundedSender<TaskEvent>,
    caps: TaskCaps,
}

impl std::fmt::Debug for Runner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runner")
            .field("node_id", &self.node_id)
            .finish_non_exhaustive()
    }
}

impl Runner {
    /// A runner allowing `max_tasks` concurrent executions, reporting on
    /// `events`; OpenCL tasks go to `opencl`'s worker when the node has devices.
    pub fn new(
        node_id: NodeId,
        executor: Arc<WasmExecutor>,
        opencl: Option<Arc<WorkerClient>>,
        artifacts: ArtifactStore,
        max_tasks: usize,
        initial_power_level: u8,
        events: mpsc::UnboundedSender<TaskEvent>,
    ) -> Self {
        Self {
            node_id,
            executor,
            opencl,
            artifacts,
            slots: Semaphore::new(max_tasks.max(1)),
            counters: Arc::new(Counters::default()),
            compiled: ModuleCache::default(),
            execution: Execution::Real,
            initial_power_level,
            // Arbitration only, until `with_power` gives the node's cpufreq.
            power: Arc::new(PowerLevels::new(None, Vec::new())),
            events,
            // The device's defaults until `with_task_caps` gives the configured ones.
            caps: CapSettings::default().resolve(),
        }
    }

    /// Sets the caps on the limits an attempt may have here
    /// (`AgentConfig::task_caps`, resolved); an assignment over them is
    /// refused before it queues.
    #[must_use]
    pub fn with_task_caps(mut self, caps: TaskCaps) -> Self {
        self.caps = caps;
        self
    }

    /// Applies the power levels through `power` (the node's cpufreq, when
    /// it has one it can write).
    #[must_use]
    pub fn with_power(mut self, power: Arc<PowerLevels>) -> Self {
        self.power = power;
        self
    }

    /// Keeps compiled modules in `cache` (shared with other runners of this
    /// process) instead of a cache of its own.
    #[must_use]
    pub fn with_module_cache(mut self, cache: ModuleCache) -> Self {
        self.compiled = cache;
        self
    }

    /// Executes attempts as `execution` says ([`Execution::Real`] unless set).
    #[must_use]
    pub fn with_execution(mut self, execution: Execution) -> Self {
        self.execution = execution;
        self
    }

    /// The caps in force.
    pub fn task_caps(&self) -> TaskCaps {
        self.caps
    }

    /// The live task counts.
    pub fn counters(&self) -> Arc<Counters> {
        Arc::clone(&self.counters)
    }

    /// The power level in force: the highest among running attempts, or
    /// the node's own (its top level) when none runs.
    pub fn power_level(&self) -> u8 {
        self.power.in_force().unwrap_or(self.initial_power_level)
    }

    fn send(&self, event: TaskEvent) {
        // The receiver lives as long as the agent; after shutdown there is
        // nobody left to tell.
        let _ = self.events.send(event);
    }

    fn state_event(&self, assignment: &Assignment, state: TaskState) -> TaskEvent {
        TaskEvent::state(
            assignment.task_id.clone(),
            assignment.attempt,
            self.node_id.clone(),
            state,
        )
    }

    fn failed_event(
        &self,
        assignment: &Assignment,
        reason: FailureReason,
        message: &str,
        metrics: Option<ExecMetrics>,
    ) -> TaskEvent {
        let mut event = TaskEvent::failed(
            assignment.task_id.clone(),
            assignment.attempt,
            self.node_id.clone(),
            reason,
            message,
        );
        event.metrics = metrics;
        event
    }

    /// Runs one attempt to its final event. The accepted event has already
    /// been published by the session.
    pub async fn run_attempt(self: Arc<Self>, assignment: Assignment, cancel: Arc<AtomicBool>) {
        // Limits over this node's caps are refused before the attempt takes
        // a slot or fetches anything. `agent_busy` makes the coordinator
        // place the task again (elsewhere, or failing it once its attempts
        // are spent), with this message in the task's history.
        if let Err(over) = self.caps.admit(&assignment.limits) {
            tracing::warn!(task = %assignment.task_id, attempt = assignment.attempt, %over,
                "assignment over this node's task caps; refused");
            let event = self.failed_event(
                &assignment,
                FailureReason::AgentBusy,
                &format!("refused: {over}"),
                None,
            );
            self.send(event);
            return;
        }
        let final_event = {
            let queued = CountGuard::enter(&self.counters.queued);
            let permit = {
                // Wait for a slot, but answer a cancel while queued at once
                // rather than when a slot frees up.
                let acquire = self.slots.acquire();
                tokio::pin!(acquire);
                loop {
                    tokio::select! {
                        permit = &mut acquire => break Some(permit),
                        () = tokio::time::sleep(QUEUED_CANCEL_POLL) => {
                            if cancel.load(Ordering::SeqCst) {
                                break None;
                            }
                        }
                    }
                }
            };
            drop(queued);
            match permit {
                None => self.state_event(&assignment, TaskState::Cancelled),
                Some(Ok(_permit)) => {
                    let _running = CountGuard::enter(&self.counters.running);
                    let mut hold = None;
                    let mut event = self.execute(&assignment, &cancel, &mut hold).await;
                    // The level it ran under goes with its last event.
                    event.power = hold.map(PowerHold::finish);
                    event
                }
                Some(Err(_)) => self.failed_event(
                    &assignment,
                    FailureReason::AgentBusy,
                    "the agent is shutting down",
                    None,
                ),
            }
        };
        tracing::info!(task = %assignment.task_id, attempt = assignment.attempt,
            state = ?final_event.state, reason = ?final_event.reason, "attempt finished");
        self.send(final_event);
    }

    async fn execute(
        &self,
        assignment: &Assignment,
        cancel: &Arc<AtomicBool>,
        hold: &mut Option<PowerHold>,
    ) -> TaskEvent {
        if cancel.load(Ordering::SeqCst) {
            return self.state_event(assignment, TaskState::Cancelled);
        }
        // The node's grant policy is checked before anything is fetched, so a
        // refused task costs no download and never reports running.
        if assignment.runtime == Runtime::Wasm {
            if let Err(error) = self.executor.check_grants(&assignment.grants) {
                return self.failed_event(
                    assignment,
                    error.failure_reason(),
                    &error.to_string(),
                    None,
                );
            }
        }
        if let Execution::Modelled(model) = &self.execution {
            return self
                .execute_modelled(assignment, cancel, hold, model.as_ref())
                .await;
        }
        // A wasm task comes as code compiled for this node when the
        // assignment carries it (always, for an agent without a compiler),
        // as the module otherwise.
        let precompiled = match (assignment.runtime, &assignment.precompiled) {
            (Runtime::Wasm, Some(precompiled)) => Some(precompiled),
            _ => None,
        };
        if assignment.runtime == Runtime::Wasm && precompiled.is_none() && !self.executor.compiles()
        {
            let error = ExecError::NoCompiler;
            return self.failed_event(assignment, error.failure_reason(), &error.to_string(), None);
        }
        let (digest, url) = match precompiled {
            Some(precompiled) => (&precompiled.digest, precompiled.url.as_str()),
            None => (&assignment.artifact, assignment.artifact_url.as_str()),
        };
        let fetched = match self.artifacts.get(digest, url).await {
            Ok(fetched) => fetched,
            Err(error) => {
                return self.failed_event(
                    assignment,
                    error.failure_reason(),
                    &error.to_string(),
                    None,
                )
            }
        };
        if assignment.runtime == Runtime::Opencl {
            return self.execute_opencl(assignment, cancel, fetched, hold).await;
        }
        let module = match self
            .compiled_module(digest, fetched.bytes, precompiled.is_some())
            .await
        {
            Ok(module) => module,
            Err(error) => {
                return self.failed_event(
                    assignment,
                    error.failure_reason(),
                    &error.to_string(),
                    None,
                )
            }
        };
        match self.start_running(assignment, cancel) {
            Ok(held) => *hold = Some(held),
            Err(cancelled) => return *cancelled,
        }

        // Output travels inline in the event, so it can never exceed the
        // inline bound, whatever the assignment allows.
        let limits = ExecLimits {
            output_bytes: assignment
                .limits
                .output_bytes
                .min(MAX_INLINE_OUTPUT_BYTES as u64),
            ..assignment.limits
        };
        let executor = Arc::clone(&self.executor);
        let program_name = assignment.task_id.to_string();
        let input = assignment.input.clone();
        let args: Vec<String> = assignment.args.iter().map(|a| a.to_string()).collect();
        let run_cancel = Arc::clone(cancel);
        let assignment_grants = assignment.grants;
        let run_module = module.clone();
        let started = Instant::now();
        // A thread of its own, not `spawn_blocking`: WASI host calls (a
        // `poll_oneoff` sleep) run on the Tokio runtime of the calling
        // thread, and a blocking-pool thread would hand them the agent's.
        // A module still asleep in one when the agent shuts down (one whose
        // attempt already ended on the outer timer below) then polled a
        // timer of a runtime being shut down and panicked ("A Tokio 1.x
        // context was found, but it is being shutdown"), and the runtime's
        // drop waited for it. Outside the runtime, wasmtime-wasi uses its own
        // runtime, which lives as long as the process.
        let (result_sender, execution) = tokio::sync::oneshot::channel();
        let spawned = std::thread::Builder::new()
            .name("starling-task".into())
            .spawn(move || {
                let result = executor.run_request(
                    &run_module,
                    RunRequest {
                        program_name: &program_name,
                        input: &input,
                        args: &args,
                        limits: &limits,
                        cancel: Some(run_cancel),
                        grants: assignment_grants,
                    },
                );
                // The runner may have stopped waiting (wall time, shutdown).
                let _ = result_sender.send(result);
            });
        if let Err(error) = spawned {
            return self.failed_event(
                assignment,
                FailureReason::AgentBusy,
                &format!("cannot start a thread for the task: {error}"),
                None,
            );
        }
        // Epoch interruption stops wasm code, not a host call the module is
        // blocked in (a long `poll_oneoff` sleep). This outer timer catches
        // that case: the slot is released and the attempt reported as timed
        // out; the cancel flag stops the module if it ever returns to wasm.
        let outer_limit = Duration::from_millis(limits.wall_ms) + HOST_CALL_GRACE;
        let result = match tokio::time::timeout(outer_limit, execution).await {
            Ok(result) => result,
            Err(_) => {
                cancel.store(true, Ordering::SeqCst);
                Ok(Err(ExecError::Timeout {
                    wall_ms: limits.wall_ms,
                }))
            }
        };
        let wall_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
        let compile_ms = u64::try_from(module.compile_time.as_millis()).unwrap_or(u64::MAX);
        let cache_hit = fetched.cache_hit;
        match result {
            Ok(Ok(outcome)) => {
                let mut event = self.state_event(assignment, TaskState::Succeeded);
                event.output = outcome.output;
                event.exit_code = Some(outcome.exit_code);
                event.metrics = Some(ExecMetrics {
                    compile_ms,
                    cache_hit,
                    ..outcome.metrics
                });
                event
            }
            Ok(Err(ExecError::Cancelled)) => self.state_event(assignment, TaskState::Cancelled),
            Ok(Err(error)) => {
                let metrics = ExecMetrics {
                    wall_ms,
                    compile_ms,
                    peak_memory_bytes: 0,
                    cache_hit,
                };
                let mut event = self.failed_event(
                    assignment,
                    error.failure_reason(),
                    &error.to_string(),
                    Some(metrics),
                );
                if let ExecError::ExitCode { code, output, .. } = error {
                    event.exit_code = Some(code);
                    event.output = output;
                }
                event
            }
            // The thread ended without a result: the executor panicked.
            Err(_) => self.failed_event(
                assignment,
                FailureReason::Internal,
                "the execution thread failed without a result",
                None,
            ),
        }
    }

    /// A modelled attempt: running at once, then the model's time (or the
    /// wall-time limit, when the model's time is over it), answering a
    /// cancel within [`QUEUED_CANCEL_POLL`].
    async fn execute_modelled(
        &self,
        assignment: &Assignment,
        cancel: &Arc<AtomicBool>,
        hold: &mut Option<PowerHold>,
        model: &dyn TaskModel,
    ) -> TaskEvent {
        match self.start_running(assignment, cancel) {
            Ok(held) => *hold = Some(held),
            Err(cancelled) => return *cancelled,
        }
        let modelled = model.duration(assignment, self.power_level());
        let wall_limit = Duration::from_millis(assignment.limits.wall_ms);
        let started = Instant::now();
        let end = tokio::time::Instant::now() + modelled.min(wall_limit);
        loop {
            if cancel.load(Ordering::SeqCst) {
                return self.state_event(assignment, TaskState::Cancelled);
            }
            let now = tokio::time::Instant::now();
            if now >= end {
                break;
            }
            tokio::time::sleep_until(end.min(now + QUEUED_CANCEL_POLL)).await;
        }
        let metrics = ExecMetrics {
            wall_ms: u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
            ..ExecMetrics::default()
        };
        if modelled > wall_limit {
            let error = ExecError::Timeout {
                wall_ms: assignment.limits.wall_ms,
            };
            return self.failed_event(
                assignment,
                error.failure_reason(),
                &error.to_string(),
                Some(metrics),
            );
        }
        let mut event = self.state_event(assignment, TaskState::Succeeded);
        event.exit_code = Some(0);
        event.metrics = Some(metrics);
        event
    }

    /// The last step before execution, whatever the runtime: a cancel that
    /// came in while fetching or compiling ends the attempt here (the
    /// returned event); otherwise its power level is applied and it is
    /// reported running with the level in force.
    fn start_running(
        &self,
        assignment: &Assignment,
        cancel: &AtomicBool,
    ) -> Result<PowerHold, Box<TaskEvent>> {
        if cancel.load(Ordering::SeqCst) {
            return Err(Box::new(self.state_event(assignment, TaskState::Cancelled)));
        }
        let (ticket, applied) = self.power.enter(assignment.power_level);
        let hold = PowerHold {
            power: Arc::clone(&self.power),
            ticket,
            requested: assignment.power_level,
            done: false,
        };
        if applied.in_force != applied.requested {
            tracing::info!(task = %assignment.task_id, requested = applied.requested,
                in_force = applied.in_force, "a task beside it asked for a higher power level, which wins");
        }
        // Counted before it is reported: whoever sees the Running event
        // (telemetry, a test) must also see the execution it announces.
        self.counters.executions.fetch_add(1, Ordering::SeqCst);
        let mut running = self.state_event(assignment, TaskState::Running);
        running.power = Some(applied);
        self.send(running);
        Ok(hold)
    }

    /// Runs an OpenCL task in a fresh worker process, killed at the wall-time
    /// limit or on cancel, so that a runaway kernel or a crashing driver costs
    /// one attempt and never the agent.
    async fn execute_opencl(
        &self,
        assignment: &Assignment,
        cancel: &Arc<AtomicBool>,
        fetched: FetchedModule,
        hold: &mut Option<PowerHold>,
    ) -> TaskEvent {
        let Some(worker) = self.opencl.as_ref() else {
            return self.failed_event(
                assignment,
                FailureReason::UnsupportedRuntime,
                "this node has no OpenCL device (or its OpenCL worker is missing); it does not advertise the opencl runtime",
                None,
            );
        };
        let package = match Package::from_bytes(&fetched.bytes) {
            Ok(package) => package,
            Err(error) => {
                return self.failed_event(
                    assignment,
                    FailureReason::InvalidModule,
                    &error.to_string(),
                    None,
                )
            }
        };
        match self.start_running(assignment, cancel) {
            Ok(held) => *hold = Some(held),
            Err(cancelled) => return *cancelled,
        }
        let request = KernelRun {
            source: package.source,
            spec: package.spec,
            args: assignment.args.iter().map(|a| a.to_string()).collect(),
            input: assignment.input.clone(),
            memory_limit_bytes: assignment.limits.memory_bytes,
            output_limit_bytes: assignment
                .limits
                .output_bytes
                .min(MAX_INLINE_OUTPUT_BYTES as u64),
        };
        let started = Instant::now();
        let result = worker
            .run(
                &request,
                Duration::from_millis(assignment.limits.wall_ms),
                Arc::clone(cancel),
            )
            .await;
        let wall_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
        match result {
            Ok(outcome) => {
                let mut event = self.state_event(assignment, TaskState::Succeeded);
                event.output = outcome.output;
                event.metrics = Some(ExecMetrics {
                    wall_ms,
                    compile_ms: outcome.build_ms,
                    peak_memory_bytes: 0,
                    cache_hit: fetched.cache_hit && outcome.binary_cache_hit,
                });
                event
            }
            Err(RunError::Cancelled) => self.state_event(assignment, TaskState::Cancelled),
            Err(error) => self.failed_event(
                assignment,
                error.failure_reason(),
                &error.to_string(),
                Some(ExecMetrics {
                    wall_ms,
                    cache_hit: fetched.cache_hit,
                    ..ExecMetrics::default()
                }),
            ),
        }
    }

    /// The module with `digest` ready to run: from memory, or compiled from
    /// `bytes`, or (`precompiled`) loaded from the machine code in `bytes`.
    async fn compiled_module(
        &self,
        digest: &Digest,
        bytes: Vec<u8>,
        precompiled: bool,
    ) -> Result<CompiledModule, ExecError> {
        if let Some(module) = self
            .compiled
            .0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(digest)
        {
            // A cached module costs no compile time this run.
            let mut module = module.clone();
            module.compile_time = Duration::ZERO;
            return Ok(module);
        }
        let executor = Arc::clone(&self.executor);
        let loaded_digest = *digest;
        let module = tokio::task::spawn_blocking(move || {
            if precompiled {
                executor.load_precompiled(&bytes, &loaded_digest)
            } else {
                executor.compile(&bytes)
            }
        })
        .await
        .map_err(|e| ExecError::Internal {
            detail: format!("the compile thread failed: {e}"),
        })??;
        let mut compiled = self
            .compiled
            .0
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if compiled.len() >= COMPILED_MODULES_KEPT {
            // Crude but bounded: forget everything rather than track recency.
            compiled.clear();
        }
        compiled.insert(*digest, module.clone());
        Ok(module)
    }
}
