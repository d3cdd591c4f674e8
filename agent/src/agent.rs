//! The I/O loop: the MQTT connection (rumqttc, persistent session, manual
//! acknowledgements, last will), the journal, the telemetry timer and the
//! attempt runners, wired to the [`Session`] that decides what to say.
//!
//! Three tasks share the work, and none waits on another's progress:
//!
//! - the **connection** task polls rumqttc's event loop (which writes outgoing
//!   packets and reconnects with backoff) and forwards what arrives; it never
//!   publishes, since an awaiting publish from the task that polls the event
//!   loop deadlocks once the request queue is full;
//! - the **main** task owns the session and the journal writes: it journals,
//!   then hands publications, subscriptions and broker acknowledgements to
//!   the outbound task through an unbounded channel, so a lost link never
//!   stops it from journaling what the runners report;
//! - the **outbound** task sends those in order through the client, and sends
//!   the journal's unacknowledged events again every `event_resend_interval`
//!   and after each reconnect.
//!
//! [`run`] probes the host and hands over to [`run_node`], which is all of
//! the above for one node; `starling-agent swarm` calls [`run_node`] once per
//! virtual device with a [`NodeSetup`] built from a device profile, so a
//! swarm's devices speak, journal and execute through this same code.
//!
//! The orderings that make delivery survive a crash: an assignment is
//! acknowledged to the broker only after it is in the journal (a crash before
//! that means redelivery, not loss); an event is in the journal's outbox
//! before it is published, and stays there until the coordinator's receipt;
//! subscriptions are renewed on every CONNACK.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use rumqttc::{
    AsyncClient, ConnectionError, Event, EventLoop, LastWill, MqttOptions,
    Outgoing as MqttOutgoing, Packet, QoS,
};
use starling_net::BrokerAddress;
use starling_opencl::worker::WorkerClient;
use starling_proto::limits::MAX_MESSAGE_BYTES;
use starling_proto::Telemetry;
use starling_proto::{
    Assignment, Capability, Channel, EncodeError, LinkState, NodeState, ReportChannel, TaskEvent,
    Topics,
};
use tokio::sync::{mpsc, watch};

use crate::artifact::{ArtifactStore, OpenStoreError};
use crate::caps::TaskCaps;
use crate::config::{AgentConfig, ConfigError};
use crate::journal::{Journal, JournalError, JournalLimits};
use crate::link::LinkTracker;
use crate::power::PowerLevels;
use crate::probe::{add_opencl, probe_opencl, probe_power, probe_with_power, ProbeError};
use crate::report_key::{ReportKeyError, ReportSealer};
use crate::runner::{Execution, ModuleCache, Runner};
use crate::session::{Action, Outgoing, Session};
use crate::telemetry::{TaskCounts, TelemetrySampler};
use crate::verify::{AssignmentVerifier, DEFAULT_CLOCK_SKEW};
use crate::wasm::{ExecError, WasmExecutor};

/// MQTT packet size limit: the largest message plus room for the topic and
/// the fixed header.
pub const MAX_PACKET_BYTES: usize = MAX_MESSAGE_BYTES + 16 * 1024;

/// How long the first connection may take before the agent gives up.
const FIRST_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// The wait before a refused first login is tried again (see
/// [`NodeSetup::refused_retries`]).
const REFUSED_RETRY_DELAY: Duration = Duration::from_millis(500);

/// Longest wait between reconnection attempts.
const MAX_RECONNECT_BACKOFF: Duration = Duration::from_secs(10);

/// How long shutdown waits for the offline status and disconnect to go out.
const SHUTDOWN_FLUSH_TIMEOUT: Duration = Duration::from_secs(3);

/// How many unacknowledged events are read from the journal at a time when
/// sending them again.
const RESEND_PAGE: usize = 64;

/// Why the agent could not start or keep running.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// The configuration is invalid.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The device could not be probed.
    #[error(transparent)]
    Probe(#[from] ProbeError),
    /// The module cache could not be opened.
    #[error(transparent)]
    Artifacts(#[from] OpenStoreError),
    /// The wasm engine could not be built.
    #[error(transparent)]
    Executor(#[from] ExecError),
    /// The broker could not be reached at start.
    #[error("cannot reach MQTT broker at {broker}: {detail}; start one or pass --broker")]
    BrokerUnreachable {
        /// The broker URL.
        broker: String,
        /// What went wrong.
        detail: String,
    },
    /// The broker answered and refused this agent's login.
    #[error("the MQTT broker at {broker} refused this agent: {detail}; check its credentials (enroll again with a new join token if it was revoked)")]
    BrokerRefused {
        /// The broker URL.
        broker: String,
        /// The broker's answer.
        detail: String,
    },
    /// A message of the agent's own could not be encoded.
    #[error(transparent)]
    Encode(#[from] EncodeError),
    /// The node's report key is unreadable.
    #[error(transparent)]
    ReportKey(#[from] ReportKeyError),
    /// The journal could not be opened.
    #[error(transparent)]
    Journal(#[from] JournalError),
    /// A background thread of the agent failed.
    #[error("internal agent failure: {0}")]
    Internal(String),
}

/// Something the connection task passes to the main task.
#[derive(Debug)]
enum Inbound {
    /// Acknowledged only after the session has handled it and the journal has
    /// it, so a crash in between means redelivery rather than loss.
    Publish(rumqttc::Publish),
    /// A CONNACK after a lost connection.
    Reconnected,
}

/// What the main task asks the outbound task to send, in order.
#[derive(Debug)]
enum Outbound {
    Publish(Outgoing),
    Subscribe(Vec<(String, QoS)>),
    /// The broker acknowledgement of an inbound QoS 1 message.
    Ack(rumqttc::Publish),
    /// Send every unacknowledged event again (after a CONNACK).
    ResendAll,
}

/// The current time as Unix milliseconds.
fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|elapsed| u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// Where a node's reports and tasks come from, besides its configuration:
/// probed from the host by [`run`], built from a device profile by the swarm
/// (`crate::swarm`). Everything else (the MQTT connection, session, journal,
/// outbound queue, telemetry timer and runner) is [`run_node`]'s, the same
/// code for both.
pub struct NodeSetup {
    /// What the node says it is: published, retained, after every CONNACK.
    pub capability: Capability,
    /// The wasm engine; a swarm's devices share one.
    pub executor: Arc<WasmExecutor>,
    /// The module cache on disk; a swarm's devices share one.
    pub artifacts: ArtifactStore,
    /// Compiled modules in memory; a swarm's devices share one.
    pub modules: ModuleCache,
    /// The OpenCL worker, when the node has OpenCL devices.
    pub opencl: Option<Arc<WorkerClient>>,
    /// Power levels and their arbitration (cpufreq when the node writes it).
    pub power: Arc<PowerLevels>,
    /// The caps on the limits a task may ask for here.
    pub task_caps: TaskCaps,
    /// How attempts execute: for real, or modelled.
    pub execution: Execution,
    /// Where telemetry figures come from.
    pub telemetry: Box<dyn TelemetrySource>,
    /// Called once, when the first connection is up (or the node has
    /// started offline to resume journaled work).
    pub started: Option<Box<dyn FnOnce() + Send>>,
    /// How many times a refused login at the first connection is tried
    /// again (0 for `run`, where a refusal is the operator's to fix). A
    /// swarm enrolls devices moments before they connect, and the broker
    /// may not have reread its password file yet.
    pub refused_retries: u32,
}

/// Something that samples a node's load for its telemetry reports.
pub trait TelemetrySource: Send {
    /// A report now, with the runner's counts, the power level in force and
    /// the link's state filled in.
    fn sample(&mut self, counts: TaskCounts, power_level: u8, link: LinkState) -> Telemetry;
}

impl TelemetrySource for TelemetrySampler {
    fn sample(&mut self, counts: TaskCounts, power_level: u8, link: LinkState) -> Telemetry {
        TelemetrySampler::sample(self, counts, power_level, link)
    }
}

/// Runs the agent until `shutdown` resolves, then publishes `offline` and
/// disconnects. Fails at start when the configuration, the probe, the
/// journal or the broker is wrong; after a successful start, connection
/// losses are retried.
pub async fn run(
    config: AgentConfig,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), AgentError> {
    config.validate()?;
    let node_id = config.resolved_node_id()?;

    let probe_config = config.clone();
    let power = probe_power(&config.sysfs_root);
    let probe_power_copy = power.clone();
    let mut capability =
        tokio::task::spawn_blocking(move || probe_with_power(&probe_config, &probe_power_copy))
            .await
            .map_err(|e| AgentError::Internal(format!("the probe thread failed: {e}")))??;
    let opencl = probe_opencl(&config).await;
    if let Some(opencl) = &opencl {
        add_opencl(&mut capability, opencl);
    }
    let artifacts = ArtifactStore::open_with_ca(
        &config.data_dir,
        config.max_artifact_bytes,
        config.coordinator_ca_file.as_deref(),
    )?;
    let executor = Arc::new(WasmExecutor::with_policy(config.allowed_grants)?);
    // The CPU's speed through the engine tasks run on (some 150 ms of one
    // core, off the async threads).
    let calibrating = Arc::clone(&executor);
    let sysfs_root = config.sysfs_root.clone();
    let declared_speed = config.declared_cpu_speed;
    let capability = tokio::task::spawn_blocking(move || {
        crate::calibrate::measure_cpu(&mut capability, &calibrating, &sysfs_root, declared_speed);
        capability
    })
    .await
    .map_err(|e| AgentError::Internal(format!("the calibration thread failed: {e}")))?;
    let telemetry = Box::new(
        TelemetrySampler::new(node_id, capability.power_levels.to_vec())
            .with_sensors(&config.sysfs_root),
    );
    let setup = NodeSetup {
        capability,
        executor,
        artifacts,
        modules: ModuleCache::default(),
        opencl: opencl.map(|node| node.worker),
        power: Arc::new(PowerLevels::new(power.cpufreq, power.speeds)),
        task_caps: config.task_caps.resolve(),
        execution: Execution::Real,
        telemetry,
        started: None,
        refused_retries: 0,
    };
    run_node(config, setup, shutdown).await
}

/// Runs one node, as `setup` describes it, until `shutdown` resolves, then
/// publishes `offline` and disconnects: the part of [`run`] after the probe,
/// which the swarm runs once per virtual device.
pub async fn run_node(
    config: AgentConfig,
    setup: NodeSetup,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), AgentError> {
    config.validate()?;
    let brokers = BrokerAddress::parse_list(&config.broker).map_err(ConfigError::from)?;
    let node_id = config.resolved_node_id()?;
    let topics = Topics::new(&config.topic_prefix).map_err(ConfigError::from)?;
    let verifier = verifier(&config, &node_id)?;
    let NodeSetup {
        capability,
        executor,
        artifacts,
        modules,
        opencl,
        power,
        task_caps,
        execution,
        mut telemetry,
        started,
        refused_retries,
    } = setup;

    let limits = JournalLimits {
        max_entries: config.journal_max_entries,
        max_attempts: config.journal_max_attempts,
        skew: verifier.skew,
    };
    let (journal, remembered) = Journal::open(&config.data_dir, limits).await?;
    tracing::info!(path = %journal.path().display(), attempts = remembered.len(), "journal open");
    let sealer = Arc::new(report_sealer(&config, &node_id, &topics)?);
    let mut session = Session::new(node_id.clone(), topics, verifier);
    session.set_runtimes(&capability.runtimes);
    if journal.is_fresh() {
        // Nothing remembers what this node ran before: refuse replays.
        let started_ms = unix_ms();
        tracing::info!(
            started_ms,
            "new journal: assignments issued before this start are refused"
        );
        session.refuse_issued_before(started_ms);
    }
    let resumed = session.restore(remembered, unix_ms());

    let will = session.status(NodeState::Offline)?;
    // Signed now and published by the broker later: it counts on a channel
    // of its own (see `ReportChannel::Will`).
    let will_payload = sealer.seal_as(ReportChannel::Will, will.payload.clone())?;
    let last_will = LastWill::new(will.topic.clone(), will_payload, QoS::AtLeastOnce, true);
    // One set of options per broker, the same but for the address: the
    // connection moves to the next one whenever it is lost.
    let options = brokers
        .iter()
        .map(|address| {
            let mut options =
                MqttOptions::new(node_id.as_str(), address.host.as_str(), address.port);
            options
                .set_clean_session(false)
                .set_keep_alive(config.keep_alive)
                .set_max_packet_size(MAX_PACKET_BYTES, MAX_PACKET_BYTES)
                // rumqttc would otherwise acknowledge a QoS 1 assignment on
                // receipt, and a crash before the journal write would lose it.
                .set_manual_acks(true)
                .set_last_will(last_will.clone());
            configure_mqtt(&mut options, address, &config).map(|()| (address.url(), options))
        })
        .collect::<Result<Vec<_>, _>>()
        .map_err(ConfigError::from)?;
    let mut brokers = BrokerRing::new(options);
    let (client, mut eventloop) = AsyncClient::new(brokers.current().clone(), 256);
    starling_net::mqtt::no_delay(&mut eventloop);

    let connect_started = Instant::now();
    // A node that was running work when it went down resumes it even while
    // the broker is away (a reboot during an outage): its events wait in the
    // journal. A node with nothing to resume fails fast instead, so a wrong
    // --broker shows at once. A refused login always stops it.
    let online = match first_connect(&mut eventloop, &mut brokers, refused_retries).await {
        Ok(session_present) => {
            tracing::info!(node = %node_id, broker = %brokers.url(), session_present, "connected");
            true
        }
        Err(AgentError::BrokerUnreachable { detail, .. }) if !resumed.is_empty() => {
            tracing::warn!(broker = %config.broker, %detail, attempts = resumed.len(),
                "broker unreachable at start; resuming journaled work offline, its events wait for the broker");
            false
        }
        Err(error) => return Err(error),
    };
    if let Some(started) = started {
        started();
    }
    let link = Arc::new(LinkTracker::new(online.then(|| connect_started.elapsed())));

    let (connected_sender, connected) = watch::channel(online);
    let (inbound_sender, mut inbound) = mpsc::unbounded_channel();
    let stopping = Arc::new(AtomicBool::new(false));
    let connection = tokio::spawn(tracing::Instrument::in_current_span(drive_connection(
        eventloop,
        Reconnect {
            brokers,
            last_words: LastWords {
                will,
                sealer: Arc::clone(&sealer),
            },
        },
        inbound_sender,
        Arc::clone(&link),
        Arc::clone(&stopping),
        connected_sender,
        online,
    )));
    let (outbound_sender, outbound) = mpsc::unbounded_channel();
    let outbound_task = tokio::spawn(tracing::Instrument::in_current_span(drive_outbound(
        client.clone(),
        Arc::clone(&sealer),
        journal.clone(),
        outbound,
        connected,
        session.topic(Channel::Events),
        config.event_resend_interval,
    )));

    let (event_sender, mut events) = mpsc::unbounded_channel();
    let top_level = capability
        .power_levels
        .last()
        .map(|level| level.level)
        .unwrap_or(0);
    // The downloads' bandwidth, for telemetry (the store measures them).
    let throughput = artifacts.throughput();
    let runner = Arc::new(
        Runner::new(
            node_id.clone(),
            executor,
            opencl,
            artifacts,
            config.max_tasks,
            top_level,
            event_sender,
        )
        .with_task_caps(task_caps)
        .with_power(power)
        .with_module_cache(modules)
        .with_execution(execution),
    );
    let counters = runner.counters();
    let mut io = Io {
        session,
        journal,
        outbound: outbound_sender,
        runner: Arc::clone(&runner),
        unjournaled: Vec::new(),
    };
    let mut journal_retry = tokio::time::interval(JOURNAL_RETRY_INTERVAL);
    journal_retry.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    io.on_connected(&capability)?;
    io.perform(resumed).await;

    let mut telemetry_timer = tokio::time::interval(config.telemetry_interval);
    telemetry_timer.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);

    let shutdown = shutdown;
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            () = &mut shutdown => break,
            message = inbound.recv() => {
                let Some(message) = message else {
                    tracing::error!("the MQTT connection task ended; stopping");
                    break;
                };
                match message {
                    Inbound::Publish(message) => {
                        match io.session.on_publish(&message.topic, &message.payload, unix_ms()) {
                            Ok(actions) => io.perform(actions).await,
                            Err(error) => tracing::warn!(%error, "inbound message dropped"),
                        }
                        // Only now: whatever the message asked is journaled.
                        io.send(Outbound::Ack(message));
                    }
                    Inbound::Reconnected => io.on_connected(&capability)?,
                }
            }
            Some(event) = events.recv() => {
                let action = io.session.on_task_event(event);
                io.perform(vec![action]).await;
            }
            _ = journal_retry.tick(), if !io.unjournaled.is_empty() => io.retry_unjournaled().await,
            _ = telemetry_timer.tick() => {
                let mut telemetry = telemetry.sample(counters.snapshot(), runner.power_level(), link.state(&throughput));
                io.session.list_attempts(&mut telemetry);
                match io.session.telemetry(&telemetry).and_then(|outgoing| sealer.seal(outgoing)) {
                    // Never wait for room: while the broker is unreachable the
                    // client's queue fills, and a stale sample is worth nothing.
                    Ok(outgoing) => {
                        if let Err(error) = client.try_publish(outgoing.topic, outgoing.qos, outgoing.retain, outgoing.payload) {
                            tracing::debug!(%error, "telemetry sample dropped");
                        }
                    }
                    Err(error) => tracing::error!(%error, "cannot encode telemetry"),
                }
            }
        }
    }

    tracing::info!("shutting down: cancelling running attempts, publishing offline status");
    io.session.cancel_all();
    io.retry_unjournaled().await;
    if !io.unjournaled.is_empty() {
        tracing::error!(
            events = io.unjournaled.len(),
            "stopping with task events the journal never took; the coordinator ends those attempts when this node no longer lists them"
        );
    }
    let Io {
        session,
        journal,
        outbound,
        ..
    } = io;
    // Closing the channel ends the outbound task once it has sent what was
    // queued; the offline status goes after it.
    drop(outbound);
    if tokio::time::timeout(SHUTDOWN_FLUSH_TIMEOUT, outbound_task)
        .await
        .is_err()
    {
        tracing::warn!(
            "queued messages were not all sent before shutdown; the journal keeps the events"
        );
    }
    publish(&client, &sealer, session.status(NodeState::Offline)?).await;
    stopping.store(true, Ordering::SeqCst);
    if let Err(error) = client.disconnect().await {
        tracing::debug!(%error, "disconnect request not queued");
    }
    match tokio::time::timeout(SHUTDOWN_FLUSH_TIMEOUT, connection).await {
        Ok(_) => {}
        Err(_) => tracing::warn!("the broker did not take the disconnect in time"),
    }
    journal.close().await;
    Ok(())
}

/// The sealer for this node's reports: signing with the report key made at
/// enrollment, or unsigned (with a warning when the node is enrolled) for a
/// node without one.
fn report_sealer(
    config: &AgentConfig,
    node_id: &starling_proto::NodeId,
    topics: &Topics,
) -> Result<ReportSealer, AgentError> {
    match crate::report_key::load(&config.data_dir)? {
        Some(key) => {
            tracing::info!(
                key = %crate::report_key::public_hex(&key),
                "reports are signed with this node's report key"
            );
            Ok(ReportSealer::signing(
                &config.data_dir,
                node_id.clone(),
                topics.clone(),
                key,
            ))
        }
        None => {
            if config.mqtt_username.is_some() {
                tracing::warn!("this node has no report key (enrolled before reports were signed, or given MQTT credentials by hand): its reports go unsigned, and a coordinator that requires signed reports refuses them; revoke it and enroll again with a new join token");
            }
            Ok(ReportSealer::unsigned(topics.clone()))
        }
    }
}

/// The assignment checks from the configuration, with a warning when they
/// are weakened or will refuse everything.
fn verifier(
    config: &AgentConfig,
    node_id: &starling_proto::NodeId,
) -> Result<AssignmentVerifier, AgentError> {
    let key = config
        .coordinator_key
        .map(|bytes| {
            ed25519_dalek::VerifyingKey::from_bytes(&bytes).map_err(|_| {
                ConfigError::CoordinatorKey {
                    detail: "the bytes are not an ed25519 public key".to_owned(),
                }
            })
        })
        .transpose()?;
    if key.is_none() {
        if config.allow_unsigned {
            tracing::warn!("no coordinator key and --allow-unsigned: assignments run WITHOUT signature checks; use this for development only");
        } else {
            tracing::warn!("no coordinator key: every assignment will be refused as unverifiable; enroll this node or pass --coordinator-key");
        }
    }
    let trusted_publishers = config
        .trusted_publishers
        .iter()
        .map(|bytes| {
            ed25519_dalek::VerifyingKey::from_bytes(bytes).map_err(|_| ConfigError::PublisherKey {
                key: hex::encode(bytes),
                detail: "the bytes are not an ed25519 public key".to_owned(),
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    if !trusted_publishers.is_empty() {
        tracing::info!(
            publishers = trusted_publishers.len(),
            "only artifacts signed by a trusted publisher will run"
        );
    }
    Ok(AssignmentVerifier {
        key,
        node_id: node_id.clone(),
        skew: DEFAULT_CLOCK_SKEW,
        allow_unsigned: config.allow_unsigned,
        trusted_publishers,
    })
}

/// How often events the journal failed to take are offered to it again.
const JOURNAL_RETRY_INTERVAL: Duration = Duration::from_secs(1);

/// The main task's state: the session, the journal and the ways out.
struct Io {
    session: Session,
    journal: Journal,
    outbound: mpsc::UnboundedSender<Outbound>,
    runner: Arc<Runner>,
    /// Events the journal failed to take (a failing disk), oldest first:
    /// offered to it again every [`JOURNAL_RETRY_INTERVAL`] until it does,
    /// and from then on in the outbox and re-sent until acknowledged.
    unjournaled: Vec<TaskEvent>,
}

impl Io {
    fn send(&self, request: Outbound) {
        // The outbound task lives until the channel closes at shutdown.
        let _ = self.outbound.send(request);
    }

    /// After every CONNACK: subscribe again (a clean session forgot them),
    /// announce the node, then send every unacknowledged event.
    fn on_connected(&self, capability: &Capability) -> Result<(), AgentError> {
        self.send(Outbound::Subscribe(self.session.subscriptions().to_vec()));
        // The last will may have announced us offline meanwhile.
        self.send(Outbound::Publish(self.session.status(NodeState::Online)?));
        self.send(Outbound::Publish(self.session.capability(capability)?));
        self.send(Outbound::ResendAll);
        Ok(())
    }

    async fn perform(&mut self, actions: Vec<Action>) {
        for action in actions {
            match action {
                Action::Publish(outgoing) => self.send(Outbound::Publish(outgoing)),
                Action::Emit(event) => self.emit(event).await,
                Action::Accept {
                    assignment,
                    accepted,
                    cancel,
                } => match self.journal.accept(&assignment, &accepted, unix_ms()).await {
                    Ok(pruned) => {
                        self.session.forget(&pruned);
                        self.publish_event(&accepted);
                        tracing::info!(task = %assignment.task_id,
                            attempt = assignment.attempt, "assignment accepted");
                        self.start(*assignment, cancel);
                    }
                    Err(error) => {
                        tracing::warn!(task = %assignment.task_id, attempt = assignment.attempt,
                            %error, "assignment refused: the journal cannot take it");
                        let busy = self.session.refuse(
                            &assignment.task_id,
                            assignment.attempt,
                            &error.to_string(),
                        );
                        self.publish_event(&busy);
                    }
                },
                Action::Start { assignment, cancel } => self.start(*assignment, cancel),
                Action::Acked(ack) => {
                    if let Err(error) = self.journal.ack(&ack.task_id, ack.attempt, ack.state).await
                    {
                        tracing::error!(%error, "cannot drop an acknowledged event from the journal");
                    }
                }
            }
        }
    }

    fn start(&self, assignment: Assignment, cancel: Arc<AtomicBool>) {
        tokio::spawn(tracing::Instrument::in_current_span(
            Arc::clone(&self.runner).run_attempt(assignment, cancel),
        ));
    }

    /// Journals a new event, then publishes it.
    async fn emit(&mut self, event: TaskEvent) {
        match self.journal.record(&event, unix_ms()).await {
            Ok(pruned) => self.session.forget(&pruned),
            Err(JournalError::Full { .. }) => {
                // Only an event that would start a new attempt meets a full
                // journal: it goes out once, unjournaled, and is forgotten.
                tracing::warn!(task = %event.task_id, attempt = event.attempt,
                    "the journal is full; publishing this event without keeping it");
                self.session
                    .forget(&[(event.task_id.clone(), event.attempt)]);
            }
            Err(error) => {
                tracing::error!(%error, task = %event.task_id, attempt = event.attempt,
                    "cannot journal a task event; publishing it now and journaling it again every second until the journal takes it");
                self.unjournaled.push(event.clone());
            }
        }
        self.publish_event(&event);
    }

    /// Offers the events the journal failed to take to it again, oldest
    /// first, stopping at the first that still fails. An event taken is in
    /// the outbox from then on, and the resend loop sends it until it is
    /// acknowledged.
    async fn retry_unjournaled(&mut self) {
        while let Some(event) = self.unjournaled.first() {
            match self.journal.record(event, unix_ms()).await {
                Ok(pruned) => {
                    tracing::info!(task = %event.task_id, attempt = event.attempt,
                        "the journal took a task event it had failed to take");
                    self.session.forget(&pruned);
                    self.unjournaled.remove(0);
                }
                Err(JournalError::Full { .. }) => {
                    // As in `emit`: only an event that would start a new
                    // attempt meets a full journal; it was published already.
                    let event = self.unjournaled.remove(0);
                    self.session.forget(&[(event.task_id, event.attempt)]);
                }
                Err(error) => {
                    tracing::debug!(%error, waiting = self.unjournaled.len(), "the journal still fails; retrying");
                    return;
                }
            }
        }
    }

    fn publish_event(&self, event: &TaskEvent) {
        match self.session.event_message(event) {
            Ok(outgoing) => self.send(Outbound::Publish(outgoing)),
            Err(error) => tracing::error!(%error, "cannot encode a task event"),
        }
    }
}

/// The brokers a node may use, in the order given, and the one in use.
struct BrokerRing {
    /// Each broker's URL and connection options (never empty: the list is
    /// parsed with `BrokerAddress::parse_list`, which refuses an empty one).
    brokers: Vec<(String, MqttOptions)>,
    current: usize,
}

impl BrokerRing {
    fn new(brokers: Vec<(String, MqttOptions)>) -> Self {
        Self {
            brokers,
            current: 0,
        }
    }

    fn entry(&self) -> Option<&(String, MqttOptions)> {
        self.brokers.get(self.current)
    }

    /// How many brokers the list has.
    fn len(&self) -> usize {
        self.brokers.len()
    }

    /// The options of the broker in use.
    fn current(&self) -> MqttOptions {
        self.entry()
            .map(|(_, options)| options.clone())
            .unwrap_or_else(|| MqttOptions::new("", "", 0))
    }

    /// The URL of the broker in use.
    fn url(&self) -> &str {
        self.entry().map_or("", |(url, _)| url.as_str())
    }

    /// Moves to the next broker (after the last, the first again) and
    /// points `eventloop` at it, keeping the will it carries; returns
    /// whether the list started over.
    fn advance(&mut self, eventloop: &mut EventLoop) -> bool {
        if self.brokers.len() < 2 {
            return true;
        }
        self.current = (self.current + 1) % self.brokers.len();
        let will = eventloop.mqtt_options.last_will();
        eventloop.mqtt_options = self.current();
        if let Some(will) = will {
            eventloop.mqtt_options.set_last_will(will);
        }
        self.current == 0
    }
}

/// Polls until the first CONNACK, trying each broker of the list in turn
/// while one cannot be reached. A refused login is tried again
/// `refused_retries` times, half a second apart, within the same timeout,
/// and is fatal after that (every broker of a list shares one login).
async fn first_connect(
    eventloop: &mut EventLoop,
    brokers: &mut BrokerRing,
    refused_retries: u32,
) -> Result<bool, AgentError> {
    let mut tried = Vec::new();
    loop {
        match connect_once(eventloop, brokers.url(), refused_retries).await {
            Err(AgentError::BrokerUnreachable { broker, detail }) if brokers.len() > 1 => {
                tried.push(format!("{broker} ({detail})"));
                if brokers.advance(eventloop) {
                    return Err(AgentError::BrokerUnreachable {
                        broker: tried.join(", "),
                        detail: "no broker of the list answered".to_owned(),
                    });
                }
                tracing::warn!(broker = %broker, %detail, next = %brokers.url(),
                    "broker unreachable; trying the next one");
            }
            other => return other,
        }
    }
}

/// Polls until the first CONNACK from the broker in use.
async fn connect_once(
    eventloop: &mut EventLoop,
    broker: &str,
    refused_retries: u32,
) -> Result<bool, AgentError> {
    let unreachable = |detail: String| AgentError::BrokerUnreachable {
        broker: broker.to_owned(),
        detail,
    };
    let connect = async {
        let mut refusals = 0;
        loop {
            match eventloop.poll().await {
                Ok(Event::Incoming(Packet::ConnAck(ack))) => return Ok(ack.session_present),
                Ok(_) => continue,
                Err(error @ ConnectionError::ConnectionRefused(_)) => {
                    if refusals < refused_retries {
                        refusals += 1;
                        tracing::debug!(error = %describe(&error), refusals,
                            "the broker refused the login; trying again");
                        tokio::time::sleep(REFUSED_RETRY_DELAY).await;
                        continue;
                    }
                    return Err(AgentError::BrokerRefused {
                        broker: broker.to_owned(),
                        detail: describe(&error),
                    });
                }
                Err(error) => return Err(unreachable(describe(&error))),
            }
        }
    };
    tokio::time::timeout(FIRST_CONNECT_TIMEOUT, connect)
        .await
        .map_err(|_| unreachable(format!("no answer within {FIRST_CONNECT_TIMEOUT:?}")))?
}

/// A connection error in the words an operator needs.
fn describe(error: &ConnectionError) -> String {
    match error {
        ConnectionError::Io(io) if io.kind() == std::io::ErrorKind::ConnectionRefused => {
            "connection refused".to_owned()
        }
        ConnectionError::Io(io) => io.to_string(),
        ConnectionError::ConnectionRefused(code) => {
            format!("the broker refused the connection ({code:?})")
        }
        other => other.to_string(),
    }
}

/// The node's last will, sealed afresh for every connection: a will the
/// broker published once is spent (its counter is the coordinator's mark),
/// so the next connection must leave one with a higher counter.
struct LastWords {
    will: Outgoing,
    sealer: Arc<ReportSealer>,
}

impl LastWords {
    fn renew(&self, options: &mut MqttOptions) {
        if !self.sealer.is_signing() {
            return;
        }
        match self
            .sealer
            .seal_as(ReportChannel::Will, self.will.payload.clone())
        {
            Ok(payload) => {
                options.set_last_will(LastWill::new(
                    self.will.topic.clone(),
                    payload,
                    QoS::AtLeastOnce,
                    true,
                ));
            }
            Err(error) => {
                tracing::error!(%error, "cannot seal the last will; the previous one stays")
            }
        }
    }
}

/// Where and how the connection is made again after a loss: the next broker
/// of the list, with the last will sealed afresh.
struct Reconnect {
    brokers: BrokerRing,
    last_words: LastWords,
}

/// Polls rumqttc's event loop for the agent's whole life: forwards publishes,
/// notes pings for RTT, and retries lost connections with backoff.
async fn drive_connection(
    mut eventloop: EventLoop,
    mut reconnect: Reconnect,
    inbound: mpsc::UnboundedSender<Inbound>,
    link: Arc<LinkTracker>,
    stopping: Arc<AtomicBool>,
    online: watch::Sender<bool>,
    connected_at_start: bool,
) {
    let mut backoff = Duration::from_millis(100);
    let mut connected = connected_at_start;
    loop {
        match eventloop.poll().await {
            Ok(Event::Incoming(Packet::Publish(publish))) => {
                if inbound.send(Inbound::Publish(publish)).is_err() {
                    return;
                }
            }
            Ok(Event::Incoming(Packet::ConnAck(ack))) => {
                if !connected {
                    tracing::info!(
                        session_present = ack.session_present,
                        "reconnected to the broker"
                    );
                }
                connected = true;
                online.send_replace(true);
                backoff = Duration::from_millis(100);
                if inbound.send(Inbound::Reconnected).is_err() {
                    return;
                }
            }
            Ok(Event::Incoming(Packet::PingResp)) => link.pong(Instant::now()),
            Ok(Event::Outgoing(MqttOutgoing::PingReq)) => link.ping(Instant::now()),
            Ok(Event::Outgoing(MqttOutgoing::Disconnect)) => return,
            Ok(_) => {}
            Err(error) => {
                if stopping.load(Ordering::SeqCst) {
                    return;
                }
                connected = false;
                online.send_replace(false);
                link.connection_lost();
                let lost = reconnect.brokers.url().to_owned();
                // The next broker of the list (the same one when there is
                // only one), with a will sealed afresh.
                reconnect.brokers.advance(&mut eventloop);
                tracing::warn!(error = %describe(&error), broker = %lost,
                    next = %reconnect.brokers.url(), retry_in = ?backoff,
                    "lost the MQTT connection; retrying");
                reconnect.last_words.renew(&mut eventloop.mqtt_options);
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(MAX_RECONNECT_BACKOFF);
            }
        }
    }
}

/// Sends what the main task queues, in order, and the journal's
/// unacknowledged events again: all of them after a CONNACK, and those older
/// than `interval` every `interval` while connected. Ends when the main task
/// drops its sender.
async fn drive_outbound(
    client: AsyncClient,
    sealer: Arc<ReportSealer>,
    journal: Journal,
    mut requests: mpsc::UnboundedReceiver<Outbound>,
    connected: watch::Receiver<bool>,
    events_topic: String,
    interval: Duration,
) {
    let mut timer = tokio::time::interval(interval);
    timer.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    timer.tick().await;
    loop {
        tokio::select! {
            request = requests.recv() => match request {
                None => return,
                Some(Outbound::Publish(outgoing)) => publish(&client, &sealer, outgoing).await,
                Some(Outbound::Subscribe(topics)) => {
                    for (topic, qos) in topics {
                        if let Err(error) = client.subscribe(topic.clone(), qos).await {
                            tracing::error!(%topic, %error, "cannot queue a subscription");
                        }
                    }
                }
                Some(Outbound::Ack(message)) => {
                    if let Err(error) = client.ack(&message).await {
                        tracing::warn!(%error, "cannot queue an acknowledgement");
                    }
                }
                Some(Outbound::ResendAll) => resend(&client, &sealer, &journal, &events_topic, u64::MAX).await,
            },
            _ = timer.tick() => {
                if *connected.borrow() {
                    let interval_ms = u64::try_from(interval.as_millis()).unwrap_or(u64::MAX);
                    resend(&client, &sealer, &journal, &events_topic, unix_ms().saturating_sub(interval_ms)).await;
                }
            }
        }
    }
}

/// Publishes every unacknowledged event journaled no later than
/// `created_before_ms`, oldest first. Each send is sealed afresh: a re-sent
/// event carries a new counter, or the coordinator would take it for a replay.
async fn resend(
    client: &AsyncClient,
    sealer: &ReportSealer,
    journal: &Journal,
    events_topic: &str,
    created_before_ms: u64,
) {
    let mut after = 0;
    let mut sent = 0usize;
    loop {
        let page = match journal.unacked(after, created_before_ms, RESEND_PAGE).await {
            Ok(page) => page,
            Err(error) => {
                tracing::error!(%error, "cannot read unacknowledged events from the journal");
                return;
            }
        };
        let Some(last) = page.last() else { break };
        after = last.seq;
        for entry in page {
            let sealed = starling_proto::encode(&entry.event)
                .and_then(|payload| sealer.seal_as(ReportChannel::Events, payload));
            let payload = match sealed {
                Ok(payload) => payload,
                Err(error) => {
                    tracing::error!(%error, "cannot encode a journaled event");
                    continue;
                }
            };
            sent += 1;
            if let Err(error) = client
                .publish(events_topic, QoS::AtLeastOnce, false, payload)
                .await
            {
                tracing::warn!(%error, "cannot queue a task event");
            }
        }
    }
    if sent > 0 {
        tracing::debug!(sent, "unacknowledged task events sent again");
    }
}

async fn publish(client: &AsyncClient, sealer: &ReportSealer, outgoing: Outgoing) {
    let outgoing = match sealer.seal(outgoing) {
        Ok(outgoing) => outgoing,
        Err(error) => {
            tracing::error!(%error, "cannot seal a report; not sent");
            return;
        }
    };
    let Outgoing {
        topic,
        payload,
        qos,
        retain,
    } = outgoing;
    if let Err(error) = client.publish(topic.clone(), qos, retain, payload).await {
        tracing::warn!(%topic, %error, "cannot queue a publish");
    }
}

/// Applies the agent's broker security to `options`: TLS when the broker URL
/// is `mqtts://`, and the MQTT user name and password when it has them.
fn configure_mqtt(
    options: &mut rumqttc::MqttOptions,
    address: &BrokerAddress,
    config: &AgentConfig,
) -> Result<(), starling_net::TlsError> {
    if address.tls {
        options.set_transport(starling_net::tls::transport(&config.mqtt_tls)?);
    }
    if let Some(username) = &config.mqtt_username {
        options.set_credentials(
            username.clone(),
            config.mqtt_password.clone().unwrap_or_default(),
        );
    }
    Ok(())
}
