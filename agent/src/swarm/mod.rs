//! `starling-agent swarm`: many virtual devices in one process, for tests,
//! benchmarks and demonstrations of a fleet larger than the machines at hand.
//!
//! Each device is a real node: its own MQTT session (client id = node id,
//! `PREFIX-00001` …), its own credentials (enrolled with a join token, or
//! none on a development broker), its own journal and report key under
//! `<data-dir>/<node id>/`, its retained capability, telemetry, last will, and
//! the agent's own session, journal and runner code: every device runs
//! [`crate::agent::run_node`], as `starling-agent run` does. What differs is
//! what [`crate::agent::NodeSetup`] gives it: a capability built from a
//! device profile ([`profiles`]) instead of a probe, telemetry modelled from
//! its running tasks ([`model::ModelledTelemetry`]), and one wasm engine,
//! module cache (on disk, `<data-dir>/artifacts`) and compiled-module cache
//! for the whole process. With `--execute modelled` a task is not run but
//! waited for, as long as the profile's speed makes it
//! ([`model::ProfileTaskModel`]).
//!
//! Start-up is in two phases: enrollment (concurrent, at most
//! `enroll_concurrency` at a time, with a progress bar), then the devices,
//! spread evenly over `ramp` so the broker never sees all CONNECTs at once.
//! Once every device is connected the swarm reports [`SwarmReady`]; a device
//! that cannot start stops the whole swarm with its error. On shutdown every
//! device publishes its offline status and disconnects, as an agent does.

pub mod model;
pub mod profiles;

use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use starling_proto::limits::NODE_ID_LEN;
use starling_proto::NodeId;
use tokio::sync::{mpsc, watch, Semaphore};
use tokio::task::JoinSet;
use tracing::Instrument;

use crate::agent::{run_node, AgentError, NodeSetup};
use crate::artifact::{ArtifactStore, OpenStoreError};
use crate::config::{AgentConfig, ConfigError};
use crate::enroll::EnrollError;
use crate::power::PowerLevels;
use crate::runner::{Execution, ModuleCache};
use crate::wasm::{ExecError, WasmExecutor};
use model::{ModelledTelemetry, ProfileTaskModel};
use profiles::{DeviceProfile, ProfileMix};

/// The most devices one swarm runs (node ids have five digits).
pub const MAX_DEVICES: usize = 99_999;

/// How many times a device's refused first login is tried again: the
/// coordinator writes the broker's password file and signals it at each
/// enrollment, and the broker may read it a moment after the device connects.
const REFUSED_RETRIES: u32 = 10;

/// How devices execute their tasks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ExecutionMode {
    /// Through the shared wasm engine, as `starling-agent run` does.
    #[default]
    Real,
    /// Waited for, as long as the profile's speed makes the task take.
    Modelled,
}

/// Everything a swarm needs.
#[derive(Debug, Clone)]
pub struct SwarmConfig {
    /// The settings every device starts from: broker, coordinator URL, join
    /// token and key, intervals, limits, labels. `data_dir` is the swarm's
    /// root; `node_id` must be unset.
    pub base: AgentConfig,
    /// How many devices.
    pub count: usize,
    /// Devices are named `{node_prefix}-00001` and up.
    pub node_prefix: String,
    /// Which profiles, in what proportions.
    pub profiles: ProfileMix,
    /// How tasks execute.
    pub execution: ExecutionMode,
    /// Reference-core work of a modelled task without a `work_ms=` argument.
    pub modelled_work: Duration,
    /// The devices start spread evenly over this long.
    pub ramp: Duration,
    /// Most enrollments in flight at once.
    pub enroll_concurrency: usize,
    /// Whether `max_tasks` was given (otherwise each device runs as many
    /// tasks at once as its profile has cores).
    pub max_tasks_given: bool,
    /// Show progress bars on stderr (when it is a terminal).
    pub progress: bool,
}

/// What the swarm reports once every device is connected.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct SwarmReady {
    /// Always `"ready"`: what a reader of the swarm's output waits for.
    pub event: &'static str,
    /// Devices connected.
    pub count: usize,
    /// Of them, how many enrolled in this start (the others had credentials,
    /// or run unenrolled on a development broker).
    pub enrolled: usize,
    /// Seconds from the start of the command to the last CONNACK.
    pub seconds: f64,
    /// The first node id.
    pub first: String,
    /// The last node id.
    pub last: String,
}

/// Why the swarm could not start or keep running.
#[derive(Debug, thiserror::Error)]
pub enum SwarmError {
    /// `count` is out of range.
    #[error("--count must be between 1 and {MAX_DEVICES}, not {count}")]
    Count {
        /// The count given.
        count: usize,
    },
    /// The prefix makes invalid node ids.
    #[error("--node-prefix {prefix:?} does not make valid node ids ({detail}); use letters, digits, '-' and '_', at most {} characters", NODE_ID_LEN - 6)]
    NodePrefix {
        /// The prefix.
        prefix: String,
        /// Why.
        detail: String,
    },
    /// The base settings name one node.
    #[error("a swarm names its devices from --node-prefix; drop --node-id (or STARLING_NODE_ID)")]
    NodeIdGiven,
    /// The settings of a device are invalid.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The shared module cache could not be opened.
    #[error(transparent)]
    Artifacts(#[from] OpenStoreError),
    /// The shared wasm engine could not be built.
    #[error(transparent)]
    Executor(#[from] ExecError),
    /// A device could not enroll.
    #[error("device {node} could not enroll ({enrolled} of {count} had credentials by then): {error}{hint}")]
    Enroll {
        /// The device.
        node: String,
        /// Devices enrolled or already holding credentials by then.
        enrolled: usize,
        /// Devices in the swarm.
        count: usize,
        /// What went wrong (not a `source`: the message carries it).
        error: Box<EnrollError>,
        /// A hint when the join token ran out of uses.
        hint: &'static str,
    },
    /// A device failed; the others were stopped.
    #[error("device {node} failed: {error}")]
    Device {
        /// The device.
        node: String,
        /// What went wrong (not a `source`: the message carries it).
        error: Box<AgentError>,
    },
    /// A device's task ended abnormally.
    #[error("internal swarm failure: {0}")]
    Internal(String),
}

/// One device's settings and profile.
struct Device {
    config: AgentConfig,
    profile: DeviceProfile,
    node_id: NodeId,
}

/// The node id of device `index` (from 0).
pub fn node_id(prefix: &str, index: usize) -> String {
    format!("{prefix}-{:05}", index + 1)
}

/// Runs the swarm until `shutdown` resolves; `on_ready` is called once, when
/// every device is connected. Returns once every device has published its
/// offline status and disconnected (or a device failed: then with its error,
/// after stopping the others).
pub async fn run_swarm(
    config: SwarmConfig,
    shutdown: impl Future<Output = ()> + Send,
    on_ready: impl FnOnce(&SwarmReady),
) -> Result<(), SwarmError> {
    let started = Instant::now();
    let devices = devices(&config)?;
    tokio::pin!(shutdown);

    // Shared by every device: one engine, one module cache on disk and in memory.
    let executor = Arc::new(WasmExecutor::with_policy(config.base.allowed_grants)?);
    let artifacts = ArtifactStore::open_with_ca(
        &config.base.data_dir,
        config.base.max_artifact_bytes,
        config.base.coordinator_ca_file.as_deref(),
    )?;
    let modules = ModuleCache::default();

    let enrolled = tokio::select! {
        enrolled = enroll_all(&devices, &config) => enrolled?,
        () = &mut shutdown => return Ok(()),
    };
    let (devices, enrolled_now) = enrolled;

    let (stop_sender, stop) = watch::channel(false);
    let (connected_sender, mut connected) = mpsc::unbounded_channel::<()>();
    let mut running = JoinSet::new();
    let count = devices.len();
    let first = devices
        .first()
        .map(|d| d.node_id.to_string())
        .unwrap_or_default();
    let last = devices
        .last()
        .map(|d| d.node_id.to_string())
        .unwrap_or_default();
    let ramp_start = tokio::time::Instant::now();
    let connect_bar = progress_bar(config.progress, count, "connected");
    for (index, device) in devices.into_iter().enumerate() {
        let at = ramp_start + config.ramp.mul_f64(index as f64 / count as f64);
        let setup = node_setup(
            &device,
            &config,
            &executor,
            &artifacts,
            &modules,
            connected_sender.clone(),
        );
        let mut stop = stop.clone();
        let node = device.node_id.to_string();
        let span = tracing::info_span!("device", node = %node);
        running.spawn(
            async move {
                tokio::select! {
                    () = tokio::time::sleep_until(at) => {}
                    _ = stop.wait_for(|stopping| *stopping) => return (node, Ok(())),
                }
                let shutdown = async move {
                    // Resolves on a stop, or when the swarm is gone.
                    let _ = stop.wait_for(|stopping| *stopping).await;
                };
                (node, run_node(device.config, setup, shutdown).await)
            }
            .instrument(span),
        );
    }
    drop(connected_sender);

    let mut up = 0usize;
    let mut on_ready = Some(on_ready);
    let mut failure = None;
    let mut stopping = false;
    loop {
        tokio::select! {
            () = &mut shutdown, if !stopping => {
                tracing::info!(devices = count, "stopping every device");
                stopping = true;
                stop_sender.send_replace(true);
            }
            Some(()) = connected.recv() => {
                up += 1;
                connect_bar.inc(1);
                if up == count {
                    connect_bar.finish_and_clear();
                    if let Some(on_ready) = on_ready.take() {
                        on_ready(&SwarmReady {
                            event: "ready",
                            count,
                            enrolled: enrolled_now,
                            seconds: started.elapsed().as_secs_f64(),
                            first: first.clone(),
                            last: last.clone(),
                        });
                    }
                }
            }
            ended = running.join_next() => {
                let Some(ended) = ended else { break };
                let (node, result) = ended.map_err(|e| SwarmError::Internal(format!("a device task failed: {e}")))?;
                match result {
                    Ok(()) if stopping => {}
                    Ok(()) => {
                        // A device whose connection task ended.
                        tracing::error!(%node, "device stopped on its own; stopping the swarm");
                        failure.get_or_insert(SwarmError::Internal(format!("device {node} stopped on its own")));
                        stopping = true;
                        stop_sender.send_replace(true);
                    }
                    Err(error) => {
                        tracing::error!(%node, %error, "device failed; stopping the swarm");
                        if failure.is_none() {
                            failure = Some(SwarmError::Device {
                                node,
                                error: Box::new(error),
                            });
                        }
                        stopping = true;
                        stop_sender.send_replace(true);
                    }
                }
            }
        }
    }
    connect_bar.finish_and_clear();
    match failure {
        Some(error) => Err(error),
        None => Ok(()),
    }
}

/// Every device's settings, checked before anything starts.
fn devices(config: &SwarmConfig) -> Result<Vec<Device>, SwarmError> {
    if config.count == 0 || config.count > MAX_DEVICES {
        return Err(SwarmError::Count {
            count: config.count,
        });
    }
    if config.base.node_id.is_some() {
        return Err(SwarmError::NodeIdGiven);
    }
    let mut devices = Vec::with_capacity(config.count);
    for index in 0..config.count {
        let id = node_id(&config.node_prefix, index);
        let node_id = NodeId::new(&id).map_err(|e| SwarmError::NodePrefix {
            prefix: config.node_prefix.clone(),
            detail: e.to_string(),
        })?;
        let profile = config.profiles.pick(index).clone();
        let mut device = config.base.clone();
        device.node_id = Some(id.clone());
        device.data_dir = config.base.data_dir.join(&id);
        // A virtual device has no OpenCL worker; modelled ones model it.
        device.opencl = false;
        if !config.max_tasks_given {
            device.max_tasks = usize::from(profile.cores.max(1));
        }
        devices.push(Device {
            config: device,
            profile,
            node_id,
        });
    }
    Ok(devices)
}

/// Makes every device ready to connect: loads the credentials it has, or
/// enrolls it with the join token, at most `enroll_concurrency` at a time.
/// Returns the devices with their settings filled in, and how many enrolled.
async fn enroll_all(
    devices: &[Device],
    config: &SwarmConfig,
) -> Result<(Vec<Device>, usize), SwarmError> {
    let count = devices.len();
    let bar = progress_bar(
        config.progress && config.base.join_token.is_some(),
        count,
        "enrolled",
    );
    let limit = Arc::new(Semaphore::new(config.enroll_concurrency.max(1)));
    let mut pending = JoinSet::new();
    for (index, device) in devices.iter().enumerate() {
        let mut device_config = device.config.clone();
        let limit = Arc::clone(&limit);
        pending.spawn(async move {
            let had_credentials = crate::enroll::credentials_path(&device_config).exists();
            // The semaphore is never closed.
            let _permit = limit.acquire_owned().await;
            let result = crate::enroll::prepare(&mut device_config).await;
            (index, had_credentials, device_config, result)
        });
    }
    let mut configs: Vec<Option<AgentConfig>> = vec![None; count];
    let mut enrolled_now = 0;
    let mut ready = 0;
    while let Some(joined) = pending.join_next().await {
        let (index, had_credentials, device_config, result) =
            joined.map_err(|e| SwarmError::Internal(format!("an enrollment task failed: {e}")))?;
        match result {
            Ok(credentials) => {
                if credentials.is_some() && !had_credentials {
                    enrolled_now += 1;
                }
                ready += 1;
                bar.inc(1);
                configs[index] = Some(device_config);
            }
            Err(error) => {
                bar.abandon();
                let hint = if matches!(error, EnrollError::InvalidToken) {
                    "; a join token for a swarm needs one use per device: `starling token create --uses N`"
                } else {
                    ""
                };
                return Err(SwarmError::Enroll {
                    node: devices[index].node_id.to_string(),
                    enrolled: ready,
                    count,
                    error: Box::new(error),
                    hint,
                });
            }
        }
    }
    bar.finish_and_clear();
    if enrolled_now > 0 {
        tracing::info!(devices = enrolled_now, "enrolled");
    }
    let devices = devices
        .iter()
        .zip(configs)
        .map(|(device, config)| Device {
            config: config.unwrap_or_else(|| device.config.clone()),
            profile: device.profile.clone(),
            node_id: device.node_id.clone(),
        })
        .collect();
    Ok((devices, enrolled_now))
}

/// What `run_node` needs for one device, besides its settings.
fn node_setup(
    device: &Device,
    config: &SwarmConfig,
    executor: &Arc<WasmExecutor>,
    artifacts: &ArtifactStore,
    modules: &ModuleCache,
    connected: mpsc::UnboundedSender<()>,
) -> NodeSetup {
    let modelled = config.execution == ExecutionMode::Modelled;
    let capability =
        device
            .profile
            .capability(device.node_id.clone(), &device.config.labels, modelled);
    let speeds = capability
        .power_levels
        .iter()
        .map(|level| level.speed_factor)
        .collect();
    let execution = if modelled {
        Execution::Modelled(Arc::new(ProfileTaskModel::new(
            &device.profile,
            config.modelled_work,
        )))
    } else {
        Execution::Real
    };
    let telemetry = Box::new(ModelledTelemetry::new(
        device.node_id.clone(),
        &device.profile,
        capability.power_levels.to_vec(),
    ));
    NodeSetup {
        capability,
        executor: Arc::clone(executor),
        artifacts: artifacts.clone(),
        modules: modules.clone(),
        opencl: None,
        // Arbitration only: a virtual device writes no cpufreq.
        power: Arc::new(PowerLevels::new(None, speeds)),
        task_caps: device
            .config
            .task_caps
            .resolve_for(Some(device.profile.memory_bytes())),
        execution,
        telemetry,
        started: Some(Box::new(move || {
            // The swarm stops listening only when it ends.
            let _ = connected.send(());
        })),
        refused_retries: REFUSED_RETRIES,
    }
}

/// A progress bar on stderr, hidden when `show` is false (and by indicatif
/// when stderr is not a terminal).
fn progress_bar(show: bool, count: usize, what: &str) -> indicatif::ProgressBar {
    if !show {
        return indicatif::ProgressBar::hidden();
    }
    let bar = indicatif::ProgressBar::new(count as u64);
    if let Ok(style) = indicatif::ProgressStyle::with_template(&format!(
        "{{bar:40}} {{pos}}/{{len}} {what} ({{elapsed}})"
    )) {
        bar.set_style(style);
    }
    bar
}

/// The default data directory of a swarm.
pub fn default_data_dir() -> PathBuf {
    PathBuf::from("./.starling/swarm")
}
