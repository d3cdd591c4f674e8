//! The I/O loop: the MQTT connection (rumqttc, persistent session, last will),
//! the telemetry timer and the attempt runners, wired to the [`Session`] that
//! decides what to say.
//!
//! Two tasks share the work. The connection task polls rumqttc's event loop
//! (which also writes outgoing packets and reconnects with backoff) and
//! forwards what arrives; the main task owns the session, publishes through
//! the client and starts runners. The connection task never waits on the main
//! task (its channel is unbounded), so a full client queue cannot deadlock them.

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use rumqttc::{
    AsyncClient, ConnectionError, Event, EventLoop, LastWill, MqttOptions,
    Outgoing as MqttOutgoing, Packet, QoS,
};
use starling_proto::limits::MAX_MESSAGE_BYTES;
use starling_proto::{EncodeError, LinkState, NodeState, Topics};
use tokio::sync::mpsc;

use crate::artifact::{ArtifactStore, OpenStoreError};
use crate::config::{AgentConfig, BrokerAddress, ConfigError};
use crate::journal::{AttemptJournal, JournalError};
use crate::probe::{add_opencl, probe, probe_opencl, ProbeError};
use crate::runner::Runner;
use crate::session::{Action, Outgoing, Session};
use crate::telemetry::TelemetrySampler;
use crate::wasm::{ExecError, WasmExecutor};

/// MQTT packet size limit: the largest message plus room for the topic and
/// the fixed header.
pub const MAX_PACKET_BYTES: usize = MAX_MESSAGE_BYTES + 16 * 1024;

/// How long the first connection may take before the agent gives up.
const FIRST_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Longest wait between reconnection attempts.
const MAX_RECONNECT_BACKOFF: Duration = Duration::from_secs(10);

/// How long shutdown waits for the offline status and disconnect to go out.
const SHUTDOWN_FLUSH_TIMEOUT: Duration = Duration::from_secs(3);

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
    /// A message of the agent's own could not be encoded.
    #[error(transparent)]
    Encode(#[from] EncodeError),
    /// The attempt journal could not be opened.
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
    Reconnected {
        session_present: bool,
    },
}

/// Round-trip time toward the broker, from MQTT pings (and the first connect).
#[derive(Debug, Default)]
struct LinkTracker {
    ping_sent: Mutex<Option<Instant>>,
    /// The last RTT in milliseconds as f32 bits; `u32::MAX` when unmeasured.
    rtt_bits: AtomicU32,
}

impl LinkTracker {
    fn new(initial: Option<Duration>) -> Self {
        let tracker = Self {
            ping_sent: Mutex::new(None),
            rtt_bits: AtomicU32::new(u32::MAX),
        };
        if let Some(rtt) = initial {
            tracker.record(rtt);
        }
        tracker
    }

    fn record(&self, rtt: Duration) {
        let ms = rtt.as_secs_f32() * 1000.0;
        self.rtt_bits.store(ms.to_bits(), Ordering::Relaxed);
    }

    fn ping(&self) {
        *self
            .ping_sent
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(Instant::now());
    }

    fn pong(&self) {
        if let Some(sent) = self
            .ping_sent
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
        {
            self.record(sent.elapsed());
        }
    }

    fn state(&self) -> LinkState {
        let bits = self.rtt_bits.load(Ordering::Relaxed);
        LinkState {
            rtt_ms: (bits != u32::MAX).then(|| f32::from_bits(bits)),
            bandwidth_mbps: None,
            loss: None,
        }
    }
}

/// Runs the agent until `shutdown` resolves, then publishes `offline` and
/// disconnects. Fails at start when the configuration, the probe or the
/// broker is wrong; after a successful start, connection losses are retried.
pub async fn run(
    config: AgentConfig,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), AgentError> {
    config.validate()?;
    let address = BrokerAddress::parse(&config.broker)?;
    let node_id = config.resolved_node_id()?;
    let topics = Topics::new(&config.topic_prefix).map_err(ConfigError::from)?;

    let probe_config = config.clone();
    let mut capability = tokio::task::spawn_blocking(move || probe(&probe_config))
        .await
        .map_err(|e| AgentError::Internal(format!("the probe thread failed: {e}")))??;
    let opencl = probe_opencl(&config).await;
    if let Some(opencl) = &opencl {
        add_opencl(&mut capability, opencl);
    }
    let artifacts = ArtifactStore::open(&config.data_dir, config.max_artifact_bytes)?;
    let executor = Arc::new(WasmExecutor::new()?);

    let mut session = Session::new(node_id.clone(), topics);
    session.set_runtimes(&capability.runtimes);
    let (mut journal, remembered) = AttemptJournal::open(&config.data_dir)?;
    let interrupted = session.restore(remembered)?;
    write_journal(&mut journal, &mut session);
    let will = session.status(NodeState::Offline)?;
    let mut options = MqttOptions::new(node_id.as_str(), address.host.as_str(), address.port);
    options
        .set_clean_session(false)
        .set_keep_alive(config.keep_alive)
        .set_max_packet_size(MAX_PACKET_BYTES, MAX_PACKET_BYTES)
        .set_manual_acks(true)
        .set_last_will(LastWill::new(
            will.topic,
            will.payload,
            QoS::AtLeastOnce,
            true,
        ));
    let (client, mut eventloop) = AsyncClient::new(options, 256);

    let connect_started = Instant::now();
    let session_present = first_connect(&mut eventloop, &config.broker).await?;
    let link = Arc::new(LinkTracker::new(Some(connect_started.elapsed())));
    tracing::info!(node = %node_id, broker = %config.broker, session_present, "connected");

    subscribe(&client, &session).await;
    publish(&client, session.status(NodeState::Online)?).await;
    publish(&client, session.capability(&capability)?).await;
    for outgoing in interrupted {
        publish(&client, outgoing).await;
    }

    let (inbound_sender, mut inbound) = mpsc::unbounded_channel();
    let stopping = Arc::new(AtomicBool::new(false));
    let connection = tokio::spawn(drive_connection(
        eventloop,
        inbound_sender,
        Arc::clone(&link),
        Arc::clone(&stopping),
    ));

    let (event_sender, mut events) = mpsc::unbounded_channel();
    let top_level = capability
        .power_levels
        .last()
        .map(|level| level.level)
        .unwrap_or(0);
    let runner = Arc::new(Runner::new(
        node_id.clone(),
        executor,
        opencl.map(|node| node.worker),
        artifacts,
        config.max_tasks,
        top_level,
        event_sender,
    ));
    let counters = runner.counters();
    let mut sampler = TelemetrySampler::new(node_id, capability.power_levels.to_vec());
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
                        match session.on_publish(&message.topic, &message.payload) {
                            Ok(actions) => {
                                for action in actions {
                                    match action {
                                        Action::Publish(outgoing) => publish(&client, outgoing).await,
                                        Action::Start { assignment, cancel } => {
                                            tracing::info!(task = %assignment.task_id,
                                                attempt = assignment.attempt, "assignment accepted");
                                            tokio::spawn(Arc::clone(&runner).run_attempt(*assignment, cancel));
                                        }
                                    }
                                }
                            }
                            Err(error) => tracing::warn!(%error, "inbound message dropped"),
                        }
                        write_journal(&mut journal, &mut session);
                        if let Err(error) = client.ack(&message).await {
                            tracing::warn!(%error, "cannot queue an acknowledgement");
                        }
                    }
                    Inbound::Reconnected { session_present } => {
                        if !session_present {
                            // The broker forgot us (restarted without
                            // persistence): subscriptions must be renewed.
                            subscribe(&client, &session).await;
                            publish(&client, session.capability(&capability)?).await;
                        }
                        // The last will may have announced us offline meanwhile.
                        publish(&client, session.status(NodeState::Online)?).await;
                    }
                }
            }
            Some(event) = events.recv() => {
                match session.on_task_event(event) {
                    Ok(outgoing) => publish(&client, outgoing).await,
                    Err(error) => tracing::error!(%error, "cannot encode a task event"),
                }
                write_journal(&mut journal, &mut session);
            }
            _ = telemetry_timer.tick() => {
                let telemetry = sampler.sample(counters.snapshot(), runner.power_level(), link.state());
                match session.telemetry(&telemetry) {
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
    session.cancel_all();
    publish(&client, session.status(NodeState::Offline)?).await;
    stopping.store(true, Ordering::SeqCst);
    if let Err(error) = client.disconnect().await {
        tracing::debug!(%error, "disconnect request not queued");
    }
    match tokio::time::timeout(SHUTDOWN_FLUSH_TIMEOUT, connection).await {
        Ok(_) => {}
        Err(_) => tracing::warn!("the broker did not take the disconnect in time"),
    }
    Ok(())
}

/// Polls until the first CONNACK; any failure is fatal at start.
async fn first_connect(eventloop: &mut EventLoop, broker: &str) -> Result<bool, AgentError> {
    let unreachable = |detail: String| AgentError::BrokerUnreachable {
        broker: broker.to_owned(),
        detail,
    };
    let connect = async {
        loop {
            match eventloop.poll().await {
                Ok(Event::Incoming(Packet::ConnAck(ack))) => return Ok(ack.session_present),
                Ok(_) => continue,
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

/// Polls rumqttc's event loop for the agent's whole life: forwards publishes,
/// notes pings for RTT, and retries lost connections with backoff.
async fn drive_connection(
    mut eventloop: EventLoop,
    inbound: mpsc::UnboundedSender<Inbound>,
    link: Arc<LinkTracker>,
    stopping: Arc<AtomicBool>,
) {
    let mut backoff = Duration::from_millis(100);
    let mut connected = true;
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
                backoff = Duration::from_millis(100);
                let message = Inbound::Reconnected {
                    session_present: ack.session_present,
                };
                if inbound.send(message).is_err() {
                    return;
                }
            }
            Ok(Event::Incoming(Packet::PingResp)) => link.pong(),
            Ok(Event::Outgoing(MqttOutgoing::PingReq)) => link.ping(),
            Ok(Event::Outgoing(MqttOutgoing::Disconnect)) => return,
            Ok(_) => {}
            Err(error) => {
                if stopping.load(Ordering::SeqCst) {
                    return;
                }
                connected = false;
                tracing::warn!(error = %describe(&error), retry_in = ?backoff,
                    "lost the MQTT connection; retrying");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(MAX_RECONNECT_BACKOFF);
            }
        }
    }
}

async fn subscribe(client: &AsyncClient, session: &Session) {
    for (topic, qos) in session.subscriptions() {
        if let Err(error) = client.subscribe(topic.clone(), qos).await {
            tracing::error!(%topic, %error, "cannot queue a subscription");
        }
    }
}

async fn publish(client: &AsyncClient, outgoing: Outgoing) {
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

/// Appends what the session recorded to the journal. A failing disk costs the
/// crash-recovery memory, not the running service, so it is logged, not fatal.
fn write_journal(journal: &mut AttemptJournal, session: &mut Session) {
    for event in session.take_journal_entries() {
        if let Err(error) = journal.append(&event) {
            tracing::error!(%error, "cannot journal a task event");
        }
    }
}
