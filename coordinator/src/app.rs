//! Starting a coordinator: the wiring. [`start`] opens the store, binds the
//! REST listener, starts or reaches the broker, builds each part's narrow
//! handle (ingest's, the scheduler's, the outbox's, failure detection's,
//! the federation forwarder's, the publisher) and spawns them; [`Running`]
//! is the handle of what runs. [`Parts`] is everything the wiring built;
//! each loop gets its own narrow handle from it, and the REST router its
//! state (`http::Shared`: the use cases and what HTTP alone holds).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{watch, Notify};
use tokio::task::JoinHandle;

use crate::bind_error::describe_bind_error;
use crate::config::CoordinatorConfig;
use crate::counters::Counters;
use crate::mqtt::broker;
use crate::registry::NodeRegistry;
use crate::start_error::StartError;
use crate::store::Store;
use crate::{access, domain, federation, http, loops, models, mqtt, signing, task};
use starling_net::BrokerAddress;

/// Everything the wiring built, from which each part gets its handle.
pub(crate) struct Parts {
    pub(crate) store: Store,
    pub(crate) registry: Arc<NodeRegistry>,
    pub(crate) topics: starling_proto::Topics,
    pub(crate) mqtt: mqtt::client::MqttClient,
    pub(crate) public_url: String,
    pub(crate) policy_name: String,
    pub(crate) max_attempts: u32,
    /// Silence after which a node is suspected (see `liveness`), in ms.
    pub(crate) node_timeout_ms: u64,
    /// Signs every assignment sent.
    pub(crate) signer: signing::Signer,
    pub(crate) max_artifact_bytes: usize,
    /// Most bytes of stored artifacts, and most pending tasks, one API token may have.
    pub(crate) artifact_quota_bytes: u64,
    pub(crate) pending_quota: u64,
    pub(crate) api_token: Option<String>,
    /// Which nodes are revoked; the coordinator's own MQTT user.
    pub(crate) mqtt_access: Arc<access::MqttAccess>,
    /// Rewrites Mosquitto's password file and ACL, when the coordinator writes them.
    pub(crate) mosquitto: Option<Arc<access::MosquittoWriter>>,
    /// The highest report counter accepted per node and report channel.
    pub(crate) report_marks: Arc<std::sync::Mutex<domain::reports::ReportMarks>>,
    /// Whether nodes without a report key are heard (`--mqtt-allow-anonymous`,
    /// development only).
    pub(crate) accept_unsigned_reports: bool,
    pub(crate) wake_scheduler: Arc<Notify>,
    /// Since when (Unix ms) the coordinator's own broker connection is up; 0
    /// while it is down. Silence heard through a dead connection says nothing
    /// about the nodes, so failure detection waits for it (see `liveness`).
    pub(crate) broker_up_since_ms: Arc<std::sync::atomic::AtomicU64>,
    pub(crate) counters: Arc<Counters>,
    /// Membership of a federation of sites, when `--site` is set.
    pub(crate) federation: Option<Arc<federation::Federation>>,
    /// Sends assignments and cancels (the handle the loops get too).
    pub(crate) publisher: mqtt::publish::Publisher,
    /// The live events behind `GET /api/v1/events` and long polls.
    pub(crate) feed: crate::live::Feed,
}

impl Parts {
    /// The REST router's state: the use cases, built once, and what HTTP
    /// alone holds.
    fn http_state(
        &self,
        console: http::console::Console,
        connections: http::connections::ConnectionLimit,
    ) -> http::Shared {
        http::Shared {
            tasks: self.tasks(),
            access: self.access(),
            artifacts: self.artifacts(),
            peers: self.peers(),
            status: self.status(),
            registry: self.registry.clone(),
            federation: self.federation.clone(),
            mqtt_access: self.mqtt_access.clone(),
            counters: self.counters.clone(),
            feed: self.feed.clone(),
            public_url: self.public_url.clone(),
            api_token: self.api_token.clone(),
            max_artifact_bytes: self.max_artifact_bytes,
            console,
            connections,
        }
    }

    /// The coordinator's public key (ed25519, 64 hex): what agents pin.
    pub(crate) fn coordinator_key(&self) -> String {
        self.signer.public_key_hex()
    }

    /// The node and token use cases (REST handlers, console pages, `starling up`).
    pub(crate) fn access(&self) -> crate::service::access::Access {
        crate::service::access::Access {
            store: self.store.clone(),
            mqtt_access: self.mqtt_access.clone(),
            mosquitto: self.mosquitto.clone(),
            registry: self.registry.clone(),
            feed: self.feed.clone(),
            report_marks: self.report_marks.clone(),
            max_attempts: self.max_attempts,
            wake_scheduler: self.wake_scheduler.clone(),
            coordinator_key: self.coordinator_key(),
            topic_prefix: self.topics.prefix().to_string(),
        }
    }

    /// The task use cases (REST handlers and console pages).
    pub(crate) fn tasks(&self) -> crate::service::tasks::Tasks {
        crate::service::tasks::Tasks {
            store: self.store.clone(),
            views: self.view_source(),
            federation: self.federation.clone(),
            publisher: self.publisher.clone(),
            wake_scheduler: self.wake_scheduler.clone(),
            pending_quota: self.pending_quota,
        }
    }

    /// The artifact use cases (REST handlers, console pages, the peers').
    pub(crate) fn artifacts(&self) -> crate::service::artifacts::Artifacts {
        crate::service::artifacts::Artifacts {
            store: self.store.clone(),
            quota_bytes: self.artifact_quota_bytes,
        }
    }

    /// What peer sites ask of this one, where it federates.
    fn peers(&self) -> Option<crate::service::peers::Peers> {
        Some(crate::service::peers::Peers {
            federation: self.federation.clone()?,
            store: self.store.clone(),
            tasks: self.tasks(),
            artifacts: self.artifacts(),
            max_artifact_bytes: self.max_artifact_bytes,
        })
    }

    /// The coordinator's own state (health, metrics).
    pub(crate) fn status(&self) -> crate::service::status::Status {
        crate::service::status::Status {
            store: self.store.clone(),
            registry: self.registry.clone(),
            policy_name: self.policy_name.clone(),
        }
    }

    /// Where cluster snapshots are read from (scheduler, site digest).
    pub(crate) fn view_source(&self) -> crate::cluster_view::ViewSource {
        crate::cluster_view::ViewSource {
            registry: self.registry.clone(),
            store: self.store.clone(),
            node_timeout_ms: self.node_timeout_ms,
            counters: self.counters.clone(),
            precompile: self.publisher.precompile.clone(),
        }
    }

    /// The handle ingest gets: only what it uses.
    pub(crate) fn ingest(&self) -> mqtt::ingest::Ingest {
        mqtt::ingest::Ingest {
            store: self.store.clone(),
            registry: self.registry.clone(),
            topics: self.topics.clone(),
            mqtt: self.mqtt.clone(),
            access: self.mqtt_access.clone(),
            report_marks: self.report_marks.clone(),
            accept_unsigned_reports: self.accept_unsigned_reports,
            max_attempts: self.max_attempts,
            wake_scheduler: self.wake_scheduler.clone(),
            broker_up_since_ms: self.broker_up_since_ms.clone(),
            counters: self.counters.clone(),
            feed: self.feed.clone(),
        }
    }
}

/// A started coordinator.
pub struct Running {
    rest_addr: SocketAddr,
    rest_tls: bool,
    mqtt_url: String,
    public_url: String,
    own_broker: Option<broker::ManagedBroker>,
    parts: Arc<Parts>,
    stop: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
}

impl std::fmt::Debug for Running {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Running")
            .field("rest_addr", &self.rest_addr)
            .field("mqtt_url", &self.mqtt_url)
            .field("public_url", &self.public_url)
            .finish_non_exhaustive()
    }
}

impl Running {
    /// The address the REST API is bound to.
    pub fn rest_addr(&self) -> SocketAddr {
        self.rest_addr
    }

    /// The REST API's base URL (`http://IP:PORT`, or `https://` with
    /// `--tls-cert`), as bound.
    pub fn rest_url(&self) -> String {
        let scheme = if self.rest_tls { "https" } else { "http" };
        format!("{scheme}://{}", self.rest_addr)
    }

    /// The broker's URL (`mqtt://HOST:PORT`): the coordinator's own broker or the external one.
    pub fn mqtt_url(&self) -> &str {
        &self.mqtt_url
    }

    /// The URL agents are told to fetch artifacts from.
    pub fn public_url(&self) -> &str {
        &self.public_url
    }

    /// Whether the broker is the coordinator's own (a Mosquitto child).
    pub fn embedded_broker(&self) -> bool {
        self.own_broker.is_some()
    }

    /// The process id of the coordinator's own broker (0 while it restarts),
    /// if it runs one.
    pub fn broker_pid(&self) -> Option<u32> {
        self.own_broker.as_ref().map(broker::ManagedBroker::pid)
    }

    /// The coordinator's public key (ed25519, 64 hex digits) that agents
    /// verify assignments with.
    pub fn coordinator_key(&self) -> String {
        self.parts.coordinator_key()
    }

    /// Mints MQTT credentials for `node_id`, whose reports are signed with
    /// `report_key` (64 hex digits), directly in the store, replacing any it
    /// had: for an agent this process runs itself (`starling up`),
    /// which needs no join token.
    pub async fn mint_node_credentials(
        &self,
        node_id: &str,
        report_key: &str,
    ) -> Result<starling_api::NodeCredentials, access::AccessError> {
        self.parts.access().mint(node_id, report_key).await
    }

    /// The store, for tools that run beside the coordinator.
    pub fn store(&self) -> &Store {
        &self.parts.store
    }

    /// The one line `serve` prints when ready; tests parse it.
    pub fn ready_line(&self) -> String {
        let mut line = format!(
            "starling-coordinator ready rest={} mqtt={}",
            self.rest_url(),
            self.mqtt_url
        );
        if let Some(federation) = &self.parts.federation {
            line.push_str(&format!(
                " site={} gossip={}",
                federation.site,
                federation.gossip.local_addr()
            ));
        }
        line
    }

    /// Stops serving: the REST server drains, the MQTT client disconnects, the
    /// scheduler stops, the database closes, the coordinator's own broker
    /// stops.
    pub async fn shutdown(self) {
        let _ = self.stop.send(true);
        let _ = self.parts.mqtt.try_disconnect();
        for task in self.tasks {
            if tokio::time::timeout(Duration::from_secs(5), task)
                .await
                .is_err()
            {
                tracing::warn!("a coordinator task did not stop within 5 s");
            }
        }
        self.parts.store.close().await;
        if let Some(broker) = self.own_broker {
            broker.stop();
        }
    }
}

/// The REST address as agents on other hosts may reach it.
fn default_public_url(rest_addr: SocketAddr, tls: bool) -> String {
    let scheme = if tls { "https" } else { "http" };
    if rest_addr.ip().is_unspecified() {
        // Bound to every interface: 127.0.0.1 works locally; agents elsewhere
        // need --public-url, which `start` says in a warning.
        format!("{scheme}://127.0.0.1:{}", rest_addr.port())
    } else {
        format!("{scheme}://{rest_addr}")
    }
}

/// The configured placement policy, with the model given by `--model` for a
/// learned one.
fn placement_policy(
    config: &CoordinatorConfig,
) -> Result<Box<dyn starling_placement::Policy>, StartError> {
    let mut models = Vec::new();
    if let Some(path) = &config.model {
        let model = models::read(path)?;
        let wanted = starling_placement::catalog::model_kind(&config.policy);
        if wanted != Some(model.policy) {
            return Err(StartError::ModelPolicy {
                path: path.clone(),
                model: model.policy.as_str(),
                policy: config.policy.clone(),
            });
        }
        models.push(model);
    }
    starling_placement::catalog::policy_with_tuning(
        &config.policy,
        config.placement_seed,
        &starling_placement::policy::HeuristicTuning::default(),
        &models,
    )
    .map_err(|error| match error {
        starling_placement::PolicyError::Unknown(unknown) => StartError::Policy(unknown),
        other => StartError::PolicyModel(other),
    })
}

/// Starts the coordinator: opens the store, binds the REST API, starts or
/// connects to the broker, and spawns ingest, scheduler and HTTP server on the
/// current tokio runtime.
pub async fn start(config: CoordinatorConfig) -> Result<Running, StartError> {
    let topics = starling_proto::Topics::new(&config.topic_prefix)?;
    let policy = placement_policy(&config)?;

    // Before anything opens descriptors: the soft limit raised to the hard
    // one, and the API's connection cap set below what is left.
    let descriptors = http::connections::raise_descriptor_limit();
    let connection_cap = http::connections::connection_cap(http::MAX_CONNECTIONS, descriptors);
    tracing::info!(
        descriptor_limit = ?descriptors,
        connection_cap,
        "REST connections capped"
    );
    let connections = http::connections::ConnectionLimit::new(connection_cap);

    let rest_listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .map_err(|error| StartError::Listen {
            addr: config.listen,
            reason: describe_bind_error(&error),
        })?;
    let rest_addr = rest_listener
        .local_addr()
        .map_err(|error| StartError::Listen {
            addr: config.listen,
            reason: error.to_string(),
        })?;

    let rest_tls_config = config
        .rest_tls
        .as_ref()
        .map(|tls| tls.rustls_config().map(Arc::new))
        .transpose()?;
    let public_url = config
        .public_url
        .clone()
        .map(|url| url.trim_end_matches('/').to_string())
        .unwrap_or_else(|| default_public_url(rest_addr, config.rest_tls.is_some()));
    let longest_artifact_url = format!("{public_url}/api/v1/artifacts/{}", "0".repeat(64));
    if longest_artifact_url.len() > starling_proto::limits::URL_LEN {
        return Err(StartError::PublicUrl {
            url: public_url,
            max: starling_proto::limits::URL_LEN,
        });
    }

    if config.db.is_none() {
        std::fs::create_dir_all(&config.data_dir).map_err(|source| StartError::DataDir {
            path: config.data_dir.clone(),
            source,
        })?;
    }
    let feed = crate::live::Feed::new(config.event_buffer);
    let store = Store::open(&config.database_url())
        .await?
        .with_feed(feed.clone());
    // On PostgreSQL several replicas may serve one site: each one serves
    // REST and ingests, and the one holding the site's lease also
    // schedules and keeps house. SQLite has one coordinator, always leading.
    let leadership = if store.is_shared() {
        crate::leader::Leadership::replica()
    } else {
        crate::leader::Leadership::single()
    };
    let store = store.with_leadership(leadership.clone());
    let signer =
        match signing::Signer::load(&store, config.assignment_ttl, task::unix_now_ms()).await {
            Ok(signer) => signer,
            Err(error) => {
                store.close().await;
                return Err(error.into());
            }
        };

    let (mqtt_access, mosquitto, internal_user, internal_password) =
        match setup_access(&config, &topics, &store).await {
            Ok(access) => access,
            Err(error) => {
                store.close().await;
                return Err(error);
            }
        };
    let report_marks = match store.report_marks().await {
        Ok(rows) => domain::reports::ReportMarks::load(rows),
        Err(error) => {
            store.close().await;
            return Err(access::AccessError::from(error).into());
        }
    };
    if config.api_token.is_none() {
        tracing::warn!(
            "no API token configured (--api-token / STARLING_API_TOKEN): every REST call is allowed; set one to enforce roles"
        );
    }

    // Where agents reach the broker, and where the coordinator's own client
    // connects: the same for an external broker; for the coordinator's own
    // with TLS, its plain loopback listener.
    let (address, own_address, own_broker, mosquitto) = match &config.broker {
        Some(url) => {
            let address = BrokerAddress::parse(url)?;
            (address.clone(), address, None, mosquitto)
        }
        None => {
            let Some(files) = mosquitto else {
                // setup_access always gives the coordinator's own broker its files.
                store.close().await;
                return Err(StartError::MqttLogin("the broker's files are missing"));
            };
            let started = broker::start_managed_broker(broker::BrokerSettings {
                listen: config.mqtt_listen,
                tls: config.mqtt_server_tls.clone(),
                program: config.mosquitto_bin.clone(),
                files,
            });
            let managed = match started {
                Ok(managed) => managed,
                Err(error) => {
                    store.close().await;
                    return Err(error.into());
                }
            };
            let at = |addr: SocketAddr, tls: bool| BrokerAddress {
                host: if addr.ip().is_unspecified() {
                    "127.0.0.1".to_string()
                } else {
                    addr.ip().to_string()
                },
                port: addr.port(),
                tls,
            };
            let files = Some(managed.files.clone());
            (
                at(managed.listen, managed.tls),
                at(managed.local, false),
                Some(managed),
                files,
            )
        }
    };
    let login = match &config.broker {
        None => Some((internal_user.as_str(), internal_password.as_str())),
        Some(_) => config
            .mqtt_username
            .as_deref()
            .map(|user| (user, config.mqtt_password.as_deref().unwrap_or(""))),
    };
    let operators_broker = config.broker.is_some();
    let connected = mqtt::client::connect(&own_address, &config.mqtt_tls, login, operators_broker);
    let (mqtt, eventloop) = match connected.await {
        Ok(connected) => connected,
        Err(error) => {
            store.close().await;
            return Err(error.into());
        }
    };

    if config.public_url.is_none() && rest_addr.ip().is_unspecified() {
        tracing::warn!(
            %public_url,
            "listening on every interface; agents on other hosts need --public-url with an address they can reach"
        );
    }

    let federation = match &config.federation {
        Some(settings) => match federation::Federation::start(settings, &store).await {
            Ok(federation) => Some(federation),
            Err(error) => {
                store.close().await;
                return Err(error.into());
            }
        },
        None => None,
    };

    if let Some(federation) = &federation {
        federation.gossip.table().announce_to(feed.clone());
    }
    let counters = Arc::new(Counters::default());
    let registry = Arc::new(NodeRegistry::new());
    let publisher = mqtt::publish::Publisher {
        precompile: crate::precompile::Precompile::new(store.clone(), registry.clone()),
        max_attempts: config.max_attempts.max(1),
        mqtt: mqtt.clone(),
        topics: topics.clone(),
        signer: signer.clone(),
        store: store.clone(),
        public_url: public_url.clone(),
        resend_interval: config.resend_interval,
        counters: counters.clone(),
    };
    let parts = Arc::new(Parts {
        store,
        registry,
        topics,
        mqtt,
        public_url: public_url.clone(),
        policy_name: policy.name().to_string(),
        max_attempts: config.max_attempts.max(1),
        node_timeout_ms: u64::try_from(config.node_timeout.as_millis()).unwrap_or(u64::MAX),
        signer,
        max_artifact_bytes: config.max_artifact_bytes,
        artifact_quota_bytes: config.artifact_quota_bytes,
        pending_quota: config.pending_quota,
        api_token: config.api_token.clone(),
        mqtt_access,
        mosquitto: mosquitto.map(|files| Arc::new(access::MosquittoWriter::new(files))),
        report_marks: Arc::new(std::sync::Mutex::new(report_marks)),
        accept_unsigned_reports: config.mqtt_allow_anonymous,
        wake_scheduler: Arc::new(Notify::new()),
        broker_up_since_ms: Arc::new(std::sync::atomic::AtomicU64::new(task::unix_now_ms())),
        counters,
        federation: federation.clone(),
        publisher,
        feed,
    });
    let (stop, stop_rx) = watch::channel(false);
    let (messages_tx, messages_rx) =
        tokio::sync::mpsc::channel(crate::mqtt::handler::RECEIVED_QUEUE);

    let ingest = parts.ingest();
    let mut tasks = Vec::new();
    if leadership.is_replica() {
        let holder = format!("{rest_addr}-{}", uuid::Uuid::now_v7().simple());
        tracing::info!(%holder, lease = ?config.leader_lease, "a replica on a shared database: this one schedules while it holds the site's lease");
        tasks.push(tokio::spawn(loops::lease::run(
            loops::lease::Lease {
                store: parts.store.clone(),
                leadership,
                holder,
                ttl: config.leader_lease,
                wake_scheduler: parts.wake_scheduler.clone(),
            },
            stop_rx.clone(),
        )));
    }
    tasks.extend([
        tokio::spawn(mqtt::session::run_mqtt_loop(
            eventloop,
            ingest.clone(),
            messages_tx,
            stop_rx.clone(),
        )),
        tokio::spawn(mqtt::handler::run_message_handler(
            ingest.clone(),
            messages_rx,
        )),
        tokio::spawn(loops::scheduler::run(
            loops::scheduler::Scheduler {
                views: parts.view_source(),
                publisher: parts.publisher.clone(),
                federation: parts.federation.clone(),
                wake: parts.wake_scheduler.clone(),
            },
            policy,
            config.schedule_interval,
            stop_rx.clone(),
        )),
        tokio::spawn(loops::outbox::run(
            loops::outbox::Outbox {
                publisher: parts.publisher.clone(),
            },
            stop_rx.clone(),
        )),
        tokio::spawn(loops::liveness::run(
            loops::liveness::Liveness {
                registry: parts.registry.clone(),
                store: parts.store.clone(),
                broker_up_since_ms: parts.broker_up_since_ms.clone(),
                counters: parts.counters.clone(),
                wake_scheduler: parts.wake_scheduler.clone(),
                node_timeout_ms: parts.node_timeout_ms,
                max_attempts: parts.max_attempts,
                feed: parts.feed.clone(),
            },
            stop_rx.clone(),
        )),
        tokio::spawn(loops::artifacts::run(
            loops::artifacts::Collector {
                store: parts.store.clone(),
                grace: config.artifact_grace,
            },
            stop_rx.clone(),
        )),
        tokio::spawn(loops::attempts::run(
            loops::attempts::Attempts {
                registry: parts.registry.clone(),
                store: parts.store.clone(),
                publisher: parts.publisher.clone(),
                counters: parts.counters.clone(),
                wake_scheduler: parts.wake_scheduler.clone(),
                grace_ms: parts
                    .node_timeout_ms
                    .saturating_mul(loops::attempts::GRACE_NODE_TIMEOUTS),
                max_attempts: parts.max_attempts,
            },
            stop_rx.clone(),
        )),
    ]);
    if let Some(federation) = federation {
        tasks.extend(federation::spawn(
            federation::DigestSource {
                store: parts.store.clone(),
                views: parts.view_source(),
                public_url: parts.public_url.clone(),
            },
            federation::Forwarder {
                store: parts.store.clone(),
                max_attempts: parts.max_attempts,
                wake_scheduler: parts.wake_scheduler.clone(),
            },
            federation,
            stop_rx.clone(),
        ));
    }
    let router = http::router(Arc::new(parts.http_state(
        http::console::Console::new(config.rest_tls.is_some()),
        connections.clone(),
    )));
    let mut http_stop = stop_rx;
    let feed = parts.feed.clone();
    tasks.push(tokio::spawn(async move {
        let shutdown = async move {
            let _ = http_stop.wait_for(|stopped| *stopped).await;
            // Streams and long polls end now, so the graceful shutdown does
            // not wait out its grace period on them.
            feed.close();
        };
        let served = http::serve(
            rest_listener,
            router,
            rest_tls_config,
            connections,
            shutdown,
        )
        .await;
        if let Err(error) = served {
            tracing::error!(%error, "REST server stopped");
        }
    }));
    // Subscriptions are made by the MQTT loop on each ConnAck; the first one
    // was consumed above, so subscribe now for it.
    mqtt::session::subscribe(&ingest);

    tracing::info!(
        rest = %rest_addr,
        mqtt = %address.url(),
        db = parts.store.backend_name(),
        policy = %parts.policy_name,
        "coordinator started"
    );
    Ok(Running {
        rest_addr,
        rest_tls: config.rest_tls.is_some(),
        mqtt_url: address.url(),
        public_url,
        own_broker,
        parts,
        stop,
        tasks,
    })
}

/// The MQTT side of access control at start: the cache of revoked nodes
/// (with the coordinator's own login), and the Mosquitto files (always for
/// the coordinator's own broker; with --mosquitto-auth-dir for an external
/// one), both filled from the store.
async fn setup_access(
    config: &CoordinatorConfig,
    topics: &starling_proto::Topics,
    store: &Store,
) -> Result<
    (
        Arc<access::MqttAccess>,
        Option<access::MosquittoFiles>,
        String,
        String,
    ),
    StartError,
> {
    let (internal_user, internal_password) = match (&config.mqtt_username, &config.mqtt_password) {
        (Some(user), Some(password)) => (user.clone(), password.clone()),
        (Some(_), None) | (None, Some(_)) => {
            return Err(StartError::MqttLogin(
                "give --mqtt-username and --mqtt-password together",
            ))
        }
        // A fresh secret per start: only this process logs in with it.
        (None, None) => (
            access::INTERNAL_MQTT_USER.to_string(),
            access::new_secret("")?,
        ),
    };
    let mosquitto = match (&config.broker, &config.mosquitto_auth_dir) {
        // The coordinator's own broker reads its files from the data dir.
        (None, _) => Some(access::MosquittoFiles {
            dir: config.data_dir.join("broker"),
            reload: access::Reload::Manual,
            username: internal_user.clone(),
            password_hash: access::mosquitto_hash(&internal_password)?,
            topic_prefix: topics.prefix().to_string(),
            allow_anonymous: config.mqtt_allow_anonymous,
        }),
        (Some(_), Some(dir)) => {
            let (Some(username), Some(password)) = (&config.mqtt_username, &config.mqtt_password)
            else {
                return Err(StartError::MqttLogin(
                    "--mosquitto-auth-dir needs --mqtt-username and --mqtt-password: the coordinator's own Mosquitto login goes in the password file",
                ));
            };
            Some(access::MosquittoFiles {
                dir: dir.clone(),
                reload: config
                    .mosquitto_pid_file
                    .clone()
                    .map_or(access::Reload::Manual, access::Reload::PidFile),
                username: username.clone(),
                password_hash: access::mosquitto_hash(password)?,
                topic_prefix: topics.prefix().to_string(),
                allow_anonymous: config.mqtt_allow_anonymous,
            })
        }
        (Some(_), None) => None,
    };
    let mqtt_access = Arc::new(access::MqttAccess::new(&internal_user));
    if config.mqtt_allow_anonymous && config.broker.is_none() {
        tracing::warn!("--mqtt-allow-anonymous: the coordinator's broker lets in clients without credentials, on every topic; for development only");
    }
    access::refresh(store, &mqtt_access, mosquitto.as_ref()).await?;
    Ok((mqtt_access, mosquitto, internal_user, internal_password))
}
