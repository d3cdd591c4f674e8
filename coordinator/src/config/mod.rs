//! The coordinator's settings, from flags, environment variables, a TOML file
//! and defaults, in that order of precedence.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;
use starling_net::MqttTlsFiles;

mod parse;
pub use parse::parse_duration;
use parse::{parse_addr, tls_pair};

/// The REST API's default listen address.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:7878";
/// The embedded broker's default listen address (1884 rather than MQTT's 1883,
/// so that it does not clash with a Mosquitto already running on the host).
pub const DEFAULT_MQTT_LISTEN: &str = "127.0.0.1:1884";
/// The default data directory.
pub const DEFAULT_DATA_DIR: &str = "./.starling/coordinator";
/// The default placement policy.
pub const DEFAULT_POLICY: &str = "heuristic";
/// Attempts a task gets before a lost node makes it fail.
pub const DEFAULT_MAX_ATTEMPTS: u32 = 3;
/// Largest artifact accepted, in bytes.
pub const DEFAULT_MAX_ARTIFACT_BYTES: usize = 32 * 1024 * 1024;
/// Most bytes of artifacts one API token may have stored: 64 of the
/// largest, so no one token fills the database's disk (issue 33).
pub const DEFAULT_ARTIFACT_QUOTA_BYTES: u64 = 2 * 1024 * 1024 * 1024;
/// Most pending tasks one API token may have: one batch call of a client
/// gone wrong (or an attacker's) cannot queue without bound (issue 33).
pub const DEFAULT_PENDING_QUOTA: u64 = 10_000;
/// How long an artifact no task references is kept after its upload
/// before it is collected: a day, so `publish` and a later `run` meet.
pub const DEFAULT_ARTIFACT_GRACE: Duration = Duration::from_secs(24 * 3600);
/// Silence after which a node is suspected and its tasks re-placed: five
/// missed telemetry reports (agents send one a second).
pub const DEFAULT_NODE_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a signed assignment stays valid after it is sent.
pub const DEFAULT_ASSIGNMENT_TTL: Duration = Duration::from_secs(60);
/// The first wait before an unacknowledged assignment is sent again; it
/// doubles with each send up to 60 s.
pub const DEFAULT_RESEND_INTERVAL: Duration = Duration::from_secs(5);
/// How long the leading replica's lease lasts without renewal: another
/// replica places work within about 1.25 of it after the leader dies (the
/// lease runs out, then the next try takes it).
pub const DEFAULT_LEADER_LEASE: Duration = Duration::from_millis(1500);

/// Everything `start` needs.
#[derive(Debug, Clone, PartialEq)]
pub struct CoordinatorConfig {
    /// Where the REST API listens (port 0 picks a free port).
    pub listen: SocketAddr,
    /// Where the embedded MQTT broker listens (port 0 picks a free port);
    /// ignored when `broker` is set.
    pub mqtt_listen: SocketAddr,
    /// An external broker (`mqtt://host:port`); `None` starts the embedded one.
    pub broker: Option<String>,
    /// The database URL; `None` means `sqlite://{data_dir}/coordinator.db`.
    pub db: Option<String>,
    /// Where the coordinator keeps its files.
    pub data_dir: PathBuf,
    /// The placement policy's name.
    pub policy: String,
    /// A trained model for a learned policy (`hirl`, `ddqn`); `None` runs the
    /// model shipped with Starling.
    pub model: Option<PathBuf>,
    /// The seed handed to the placement policy (for the random baselines).
    pub placement_seed: u64,
    /// The URL agents use to reach this coordinator's REST API; `None` means
    /// `http://` plus the bound REST address.
    pub public_url: Option<String>,
    /// The MQTT topic prefix.
    pub topic_prefix: String,
    /// When set, mutating REST calls need `Authorization: Bearer TOKEN`.
    pub api_token: Option<String>,
    /// Attempts a task gets before it fails for good when nodes vanish.
    pub max_attempts: u32,
    /// Largest artifact accepted, in bytes.
    pub max_artifact_bytes: usize,
    /// Most bytes of stored artifacts one API token may have.
    pub artifact_quota_bytes: u64,
    /// Most pending tasks one API token may have (`pending-quota`).
    pub pending_quota: u64,
    /// How long an artifact no task references is kept after its upload.
    pub artifact_grace: Duration,
    /// Events the live stream holds for clients that resume or read slowly.
    pub event_buffer: usize,
    /// How often the scheduler looks at the queue when nothing wakes it.
    pub schedule_interval: Duration,
    /// A node silent this long is suspected: it gets no new work and its
    /// in-flight tasks are re-placed, whatever its last status said.
    pub node_timeout: Duration,
    /// How long a signed assignment stays valid after it is sent.
    pub assignment_ttl: Duration,
    /// The first wait before an unacknowledged assignment is sent again.
    pub resend_interval: Duration,
    /// With PostgreSQL: how long the leading replica's lease runs without
    /// renewal, so how long a site goes without a leader when it dies.
    pub leader_lease: Duration,
    /// The coordinator's MQTT user name: its own login to an external broker,
    /// and the user the Mosquitto files name; the embedded broker uses an
    /// internal one when unset.
    pub mqtt_username: Option<String>,
    /// The password that goes with `mqtt_username`.
    pub mqtt_password: Option<String>,
    /// Development only: the coordinator's broker lets in clients without
    /// credentials, on every topic; ingest still ignores revoked nodes.
    pub mqtt_allow_anonymous: bool,
    /// Where to write a Mosquitto password file (`passwd`) and ACL (`acl`).
    pub mosquitto_auth_dir: Option<PathBuf>,
    /// Mosquitto's `pid_file`: it gets SIGHUP after each rewrite of the files.
    pub mosquitto_pid_file: Option<PathBuf>,
    /// The Mosquitto binary the coordinator runs as its own broker; `None`
    /// looks in `PATH` and `/usr/sbin`.
    pub mosquitto_bin: Option<PathBuf>,
    /// PEM files for an `mqtts://` external broker: the CA to trust and, for
    /// brokers that require one, the coordinator's client certificate.
    pub mqtt_tls: MqttTlsFiles,
    /// The coordinator's own broker's certificate and key: with them it serves MQTT
    /// over TLS only (`mqtts://`) on `mqtt_listen`.
    pub mqtt_server_tls: Option<crate::server_tls::ServerTls>,
    /// The REST API's certificate and key: with them it serves HTTPS only.
    pub rest_tls: Option<crate::server_tls::ServerTls>,
    /// Gossip federation with other sites' coordinators; `None` serves one site alone.
    pub federation: Option<FederationConfig>,
}

/// The default UDP address gossip binds.
pub const DEFAULT_GOSSIP_LISTEN: &str = "127.0.0.1:7946";
/// Bandwidth assumed between sites when estimating a forward's transfers.
pub const DEFAULT_SITE_LINK_MBPS: f64 = 100.0;
/// How long a forward may go unanswered by its peer before it is taken back.
pub const DEFAULT_FORWARD_TIMEOUT: Duration = Duration::from_secs(10);

/// How this coordinator joins a federation of sites.
#[derive(Debug, Clone, PartialEq)]
pub struct FederationConfig {
    /// This site's name, unique in the federation.
    pub site: String,
    /// The UDP address gossip binds.
    pub gossip_listen: SocketAddr,
    /// The address peers reach gossip at, when not the bound one.
    pub gossip_advertise: Option<SocketAddr>,
    /// Gossip addresses of members to join through.
    pub seeds: Vec<SocketAddr>,
    /// The shared cluster key, base64 of 32 bytes: it seals gossip.
    pub cluster_key: String,
    /// This site's credentials (`starling-coordinator federation issue`):
    /// its key, its root-signed certificate, the trust root's public key.
    pub site_credentials: PathBuf,
    /// Bandwidth assumed between sites, Mbit/s.
    pub link_mbps: f64,
    /// How long a forward may go unanswered before it is taken back.
    pub forward_timeout: Duration,
}

impl Default for CoordinatorConfig {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 7878)),
            mqtt_listen: SocketAddr::from(([127, 0, 0, 1], 1884)),
            broker: None,
            db: None,
            data_dir: PathBuf::from(DEFAULT_DATA_DIR),
            policy: DEFAULT_POLICY.to_string(),
            model: None,
            placement_seed: 0,
            public_url: None,
            topic_prefix: starling_proto::topic::DEFAULT_PREFIX.to_string(),
            api_token: None,
            max_attempts: DEFAULT_MAX_ATTEMPTS,
            max_artifact_bytes: DEFAULT_MAX_ARTIFACT_BYTES,
            artifact_quota_bytes: DEFAULT_ARTIFACT_QUOTA_BYTES,
            pending_quota: DEFAULT_PENDING_QUOTA,
            artifact_grace: DEFAULT_ARTIFACT_GRACE,
            event_buffer: crate::live::DEFAULT_CAPACITY,
            schedule_interval: Duration::from_millis(1000),
            node_timeout: DEFAULT_NODE_TIMEOUT,
            assignment_ttl: DEFAULT_ASSIGNMENT_TTL,
            resend_interval: DEFAULT_RESEND_INTERVAL,
            leader_lease: DEFAULT_LEADER_LEASE,
            mqtt_username: None,
            mqtt_password: None,
            mqtt_allow_anonymous: false,
            mosquitto_auth_dir: None,
            mosquitto_pid_file: None,
            mosquitto_bin: None,
            mqtt_tls: MqttTlsFiles::default(),
            mqtt_server_tls: None,
            rest_tls: None,
            federation: None,
        }
    }
}

impl CoordinatorConfig {
    /// A configuration for tests and embedding: ephemeral ports on 127.0.0.1,
    /// data under `data_dir`.
    pub fn ephemeral(data_dir: &Path) -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            mqtt_listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            data_dir: data_dir.to_path_buf(),
            schedule_interval: Duration::from_millis(200),
            ..Self::default()
        }
    }

    /// The database URL in force.
    pub fn database_url(&self) -> String {
        match &self.db {
            Some(url) => url.clone(),
            None => format!(
                "sqlite://{}",
                self.data_dir.join("coordinator.db").display()
            ),
        }
    }
}

/// The settings a TOML config file may hold; names match the flags.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct FileConfig {
    /// `--listen`.
    pub listen: Option<String>,
    /// `--mqtt-listen`.
    pub mqtt_listen: Option<String>,
    /// `--broker`.
    pub broker: Option<String>,
    /// `--db`.
    pub db: Option<String>,
    /// `--data-dir`.
    pub data_dir: Option<PathBuf>,
    /// `--policy`.
    pub policy: Option<String>,
    /// `--model`.
    pub model: Option<PathBuf>,
    /// `--public-url`.
    pub public_url: Option<String>,
    /// `--topic-prefix`.
    pub topic_prefix: Option<String>,
    /// `--api-token`.
    pub api_token: Option<String>,
    /// `--insecure-no-auth`.
    pub insecure_no_auth: Option<bool>,
    /// Attempts per task.
    pub max_attempts: Option<u32>,
    /// Largest artifact, in bytes.
    pub max_artifact_bytes: Option<usize>,
    /// Most bytes of stored artifacts per API token.
    pub artifact_quota_bytes: Option<u64>,
    /// Most pending tasks per API token.
    pub pending_quota: Option<u64>,
    /// How long an unreferenced artifact is kept (`36h`, `30m`).
    pub artifact_grace: Option<String>,
    /// `--event-buffer`.
    pub event_buffer: Option<usize>,
    /// `--node-timeout`.
    pub node_timeout: Option<String>,
    /// `--assignment-ttl`.
    pub assignment_ttl: Option<String>,
    /// `--resend-interval`.
    pub resend_interval: Option<String>,
    /// `--leader-lease`.
    pub leader_lease: Option<String>,
    /// `--mqtt-username`.
    pub mqtt_username: Option<String>,
    /// `--mqtt-password`.
    pub mqtt_password: Option<String>,
    /// `--mqtt-allow-anonymous`.
    pub mqtt_allow_anonymous: Option<bool>,
    /// `--mosquitto-auth-dir`.
    pub mosquitto_auth_dir: Option<PathBuf>,
    /// `--mosquitto-pid-file`.
    pub mosquitto_pid_file: Option<PathBuf>,
    /// `--mosquitto-bin`.
    pub mosquitto_bin: Option<PathBuf>,
    /// `--mqtt-ca-file`.
    pub mqtt_ca_file: Option<PathBuf>,
    /// `--mqtt-client-cert`.
    pub mqtt_client_cert: Option<PathBuf>,
    /// `--mqtt-client-key`.
    pub mqtt_client_key: Option<PathBuf>,
    /// `--mqtt-tls-cert`.
    pub mqtt_tls_cert: Option<PathBuf>,
    /// `--mqtt-tls-key`.
    pub mqtt_tls_key: Option<PathBuf>,
    /// `--tls-cert`.
    pub tls_cert: Option<PathBuf>,
    /// `--tls-key`.
    pub tls_key: Option<PathBuf>,
    /// `--site`.
    pub site: Option<String>,
    /// `--gossip-listen`.
    pub gossip_listen: Option<String>,
    /// `--gossip-advertise`.
    pub gossip_advertise: Option<String>,
    /// `--seed`, one or more.
    pub seeds: Option<Vec<String>>,
    /// `--cluster-key`.
    pub cluster_key: Option<String>,
    /// `--site-credentials`.
    pub site_credentials: Option<PathBuf>,
    /// `--cluster-key-file`.
    pub cluster_key_file: Option<PathBuf>,
    /// `--site-link-mbps`.
    pub site_link_mbps: Option<f64>,
    /// `--forward-timeout`.
    pub forward_timeout: Option<String>,
}

/// Settings given on the command line or in the environment (clap merges those
/// two, flags first); `None` where neither gave one.
#[derive(Debug, Clone, Default, PartialEq, clap::Args)]
pub struct ServeArgs {
    /// TOML file with any of the settings below (keys named like the flags, e.g. `mqtt-listen = "..."`).
    #[arg(long, env = "STARLING_CONFIG", value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// REST API address [default: 127.0.0.1:7878]; port 0 picks a free port.
    #[arg(long, env = "STARLING_LISTEN", value_name = "ADDR")]
    pub listen: Option<String>,
    /// Embedded MQTT broker address [default: 127.0.0.1:1884]; port 0 picks a free port.
    #[arg(long, env = "STARLING_MQTT_LISTEN", value_name = "ADDR")]
    pub mqtt_listen: Option<String>,
    /// Use an external MQTT broker (mqtt://HOST:PORT) instead of the embedded one.
    #[arg(long, env = "STARLING_BROKER", value_name = "URL")]
    pub broker: Option<String>,
    /// Database: sqlite://PATH or postgres://USER@HOST/DB [default: sqlite under the data dir].
    #[arg(long, env = "STARLING_DB", value_name = "URL")]
    pub db: Option<String>,
    /// Directory for the coordinator's files [default: ./.starling/coordinator].
    #[arg(long, env = "STARLING_DATA_DIR", value_name = "DIR")]
    pub data_dir: Option<PathBuf>,
    /// Placement policy [default: heuristic]; an unknown name lists the valid ones.
    #[arg(long, env = "STARLING_POLICY", value_name = "NAME")]
    pub policy: Option<String>,
    /// Model file for a learned policy (hirl, ddqn), from `starling-coordinator train`
    /// [default: the model shipped for the standard device profiles].
    #[arg(long, env = "STARLING_MODEL", value_name = "FILE")]
    pub model: Option<PathBuf>,
    /// URL agents use to reach this coordinator [default: http:// + the REST address].
    #[arg(long, env = "STARLING_PUBLIC_URL", value_name = "URL")]
    pub public_url: Option<String>,
    /// MQTT topic prefix [default: starling/v1].
    #[arg(long, env = "STARLING_TOPIC_PREFIX", value_name = "PREFIX")]
    pub topic_prefix: Option<String>,
    /// Require this bearer token on every mutating REST call.
    #[arg(
        long,
        env = "STARLING_API_TOKEN",
        value_name = "TOKEN",
        hide_env_values = true
    )]
    pub api_token: Option<String>,
    /// Let a coordinator whose --listen is not a loopback address start without --api-token,
    /// so that anyone who reaches it may call every route (an isolated test network only).
    #[arg(long, env = "STARLING_INSECURE_NO_AUTH")]
    pub insecure_no_auth: bool,
    /// Silence after which a node is suspected and its tasks re-placed, like 5s or 500ms [default: 5s].
    #[arg(long, env = "STARLING_NODE_TIMEOUT", value_name = "DURATION")]
    pub node_timeout: Option<String>,
    /// Events the live stream (GET /api/v1/events) keeps for clients that resume with
    /// Last-Event-ID or read slowly; a client further behind gets a reset [default: 4096].
    #[arg(long, env = "STARLING_EVENT_BUFFER", value_name = "EVENTS", value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub event_buffer: Option<u64>,
    /// How long a signed assignment stays valid after it is sent [default: 60s].
    #[arg(long, env = "STARLING_ASSIGNMENT_TTL", value_name = "DURATION")]
    pub assignment_ttl: Option<String>,
    /// First wait before an unacknowledged assignment is sent again; doubles up to 60s [default: 5s].
    #[arg(long, env = "STARLING_RESEND_INTERVAL", value_name = "DURATION")]
    pub resend_interval: Option<String>,
    /// With --db postgres://…: how long the leading replica's lease lasts without renewal, so
    /// how long a site goes without a leader when it dies (renewed four times per lease) [default: 1500ms].
    #[arg(long, env = "STARLING_LEADER_LEASE", value_name = "DURATION")]
    pub leader_lease: Option<String>,
    /// The coordinator's own MQTT user name (needed with --broker when the broker requires logins,
    /// and with --mosquitto-auth-dir).
    #[arg(long, env = "STARLING_MQTT_USERNAME", value_name = "USER")]
    pub mqtt_username: Option<String>,
    /// The password of --mqtt-username.
    #[arg(
        long,
        env = "STARLING_MQTT_PASSWORD",
        value_name = "PASSWORD",
        hide_env_values = true
    )]
    pub mqtt_password: Option<String>,
    /// Development only: let clients without enrolled credentials onto the embedded broker.
    #[arg(long, env = "STARLING_MQTT_ALLOW_ANONYMOUS")]
    pub mqtt_allow_anonymous: bool,
    /// Write a Mosquitto password file and ACL (DIR/passwd, DIR/acl) confining each enrolled node
    /// to its own topics; point Mosquitto's password_file and acl_file at them.
    #[arg(long, env = "STARLING_MOSQUITTO_AUTH_DIR", value_name = "DIR")]
    pub mosquitto_auth_dir: Option<PathBuf>,
    /// Mosquitto's pid_file: the coordinator sends it SIGHUP to reload the files after each change.
    #[arg(long, env = "STARLING_MOSQUITTO_PID_FILE", value_name = "FILE")]
    pub mosquitto_pid_file: Option<PathBuf>,
    /// The Mosquitto binary the coordinator runs as its own MQTT broker (without --broker)
    /// [default: `mosquitto` in PATH, then /usr/sbin/mosquitto].
    #[arg(long, env = "STARLING_MOSQUITTO_BIN", value_name = "PATH")]
    pub mosquitto_bin: Option<PathBuf>,
    /// CA certificate (PEM) to trust for an mqtts:// --broker [default: the system's roots].
    #[arg(long, env = "STARLING_MQTT_CA_FILE", value_name = "FILE")]
    pub mqtt_ca_file: Option<PathBuf>,
    /// Client certificate (PEM) for an mqtts:// --broker that requires one; needs --mqtt-client-key.
    #[arg(
        long,
        env = "STARLING_MQTT_CLIENT_CERT",
        value_name = "FILE",
        requires = "mqtt_client_key"
    )]
    pub mqtt_client_cert: Option<PathBuf>,
    /// Private key (PEM) of --mqtt-client-cert.
    #[arg(
        long,
        env = "STARLING_MQTT_CLIENT_KEY",
        value_name = "FILE",
        requires = "mqtt_client_cert"
    )]
    pub mqtt_client_key: Option<PathBuf>,
    /// The embedded broker's certificate chain (PEM): it then speaks only TLS on
    /// --mqtt-listen, and agents connect with mqtts:// (needs --mqtt-tls-key).
    #[arg(long, env = "STARLING_MQTT_TLS_CERT", value_name = "FILE")]
    pub mqtt_tls_cert: Option<PathBuf>,
    /// The private key (PEM) of --mqtt-tls-cert.
    #[arg(long, env = "STARLING_MQTT_TLS_KEY", value_name = "FILE")]
    pub mqtt_tls_key: Option<PathBuf>,
    /// The REST API's certificate chain (PEM): it then serves HTTPS only, and agents and the CLI
    /// use https:// with --coordinator-ca-file / --ca-file (needs --tls-key).
    #[arg(long, env = "STARLING_TLS_CERT", value_name = "FILE")]
    pub tls_cert: Option<PathBuf>,
    /// The private key (PEM) of --tls-cert.
    #[arg(long, env = "STARLING_TLS_KEY", value_name = "FILE")]
    pub tls_key: Option<PathBuf>,
    /// Federate with other sites under this site name (needs --cluster-key): gossip membership
    /// and capacity, and forward work that cannot meet its deadline here.
    #[arg(long, env = "STARLING_SITE", value_name = "NAME")]
    pub site: Option<String>,
    /// UDP address gossip binds [default: 127.0.0.1:7946].
    #[arg(long, env = "STARLING_GOSSIP_LISTEN", value_name = "ADDR")]
    pub gossip_listen: Option<String>,
    /// Address other sites reach gossip at, when not --gossip-listen (bound to 0.0.0.0, NAT).
    #[arg(long, env = "STARLING_GOSSIP_ADVERTISE", value_name = "ADDR")]
    pub gossip_advertise: Option<String>,
    /// Gossip address of a site to join through; repeat for several (comma-separated in the env).
    #[arg(
        long = "seed",
        env = "STARLING_SEEDS",
        value_name = "ADDR",
        value_delimiter = ','
    )]
    pub seeds: Vec<String>,
    /// The federation's shared key, base64 of 32 bytes (`starling-coordinator cluster-key` makes
    /// one): it seals every gossip datagram and authenticates forwards between sites.
    #[arg(
        long,
        env = "STARLING_CLUSTER_KEY",
        value_name = "KEY",
        hide_env_values = true
    )]
    pub cluster_key: Option<String>,
    /// A file holding the cluster key (what `starling-coordinator cluster-key` prints), instead
    /// of --cluster-key, whose value any local user can read in /proc.
    #[arg(
        long,
        env = "STARLING_CLUSTER_KEY_FILE",
        value_name = "FILE",
        conflicts_with = "cluster_key"
    )]
    pub cluster_key_file: Option<PathBuf>,
    /// This site's credentials file, issued from the federation's trust root (`starling-coordinator
    /// federation init` on the first site, `federation issue` for the others): it signs this
    /// site's calls to peers, and holds the root's public key that peers' calls are checked with.
    #[arg(long, env = "STARLING_SITE_CREDENTIALS", value_name = "FILE")]
    pub site_credentials: Option<PathBuf>,
    /// Bandwidth assumed between sites when estimating a forward, Mbit/s [default: 100].
    #[arg(long, env = "STARLING_SITE_LINK_MBPS", value_name = "MBPS")]
    pub site_link_mbps: Option<f64>,
    /// How long a forward may go unanswered by its peer before it is taken back and
    /// placed again, like 10s [default: 10s].
    #[arg(long, env = "STARLING_FORWARD_TIMEOUT", value_name = "DURATION")]
    pub forward_timeout: Option<String>,
}

/// Why the settings could not be assembled.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The config file could not be read.
    #[error("cannot read config file {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The config file is not valid TOML for these settings.
    #[error("config file {path} is invalid: {source}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// The parser's error.
        #[source]
        source: toml::de::Error,
    },
    /// A duration is not a positive number with an optional unit.
    #[error("{setting} {value:?} is not a duration like 5s, 500ms or 1m")]
    Duration {
        /// Which setting.
        setting: &'static str,
        /// The value given.
        value: String,
    },
    /// Only one of a certificate and its key was given.
    #[error("{cert} and {key} go together: give both, or neither")]
    TlsPair {
        /// The certificate's flag.
        cert: &'static str,
        /// The key's flag.
        key: &'static str,
    },
    /// Federation settings that do not go together.
    #[error("{0}")]
    Federation(String),
    /// The cluster key file could not be read.
    #[error("cannot read the cluster key file {path} (--cluster-key-file): {source}")]
    ClusterKeyFile {
        /// The file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The REST API would be reachable beyond this host with every route open.
    #[error(
        "--listen {listen} is reachable beyond this host and no --api-token is set, so anyone who \
         reaches it could run code on every node: set --api-token (STARLING_API_TOKEN, or \
         api-token in the config file), or listen on 127.0.0.1; on an isolated network where \
         that is intended, pass --insecure-no-auth"
    )]
    OpenToTheNetwork {
        /// The REST listen address.
        listen: SocketAddr,
    },
    /// An address is not `IP:PORT`.
    #[error("{setting} {value:?} is not an address like 127.0.0.1:7878")]
    Address {
        /// Which setting.
        setting: &'static str,
        /// The value given.
        value: String,
    },
}

impl ServeArgs {
    /// Merges these settings over the config file's (if any) over the defaults.
    pub fn resolve(&self) -> Result<CoordinatorConfig, ConfigError> {
        let file = match &self.config {
            Some(path) => {
                let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
                    path: path.clone(),
                    source,
                })?;
                toml::from_str::<FileConfig>(&text).map_err(|source| ConfigError::Parse {
                    path: path.clone(),
                    source,
                })?
            }
            None => FileConfig::default(),
        };
        let defaults = CoordinatorConfig::default();
        let duration = |setting: &'static str,
                        flag: &Option<String>,
                        from_file: &Option<String>,
                        default: Duration| {
            match flag.as_ref().or(from_file.as_ref()) {
                Some(value) => parse_duration(setting, value),
                None => Ok(default),
            }
        };
        let pick = |flag: &Option<String>, from_file: &Option<String>| {
            flag.clone().or_else(|| from_file.clone())
        };
        let forward_timeout = duration(
            "--forward-timeout",
            &self.forward_timeout,
            &file.forward_timeout,
            DEFAULT_FORWARD_TIMEOUT,
        )?;
        let federation = self.federation(&file, forward_timeout)?;
        let listen = match pick(&self.listen, &file.listen) {
            Some(value) => parse_addr("--listen", &value)?,
            None => defaults.listen,
        };
        let api_token = pick(&self.api_token, &file.api_token).filter(|token| !token.is_empty());
        let insecure_no_auth = self.insecure_no_auth || file.insecure_no_auth.unwrap_or(false);
        if api_token.is_none() && !insecure_no_auth && !listen.ip().to_canonical().is_loopback() {
            return Err(ConfigError::OpenToTheNetwork { listen });
        }
        Ok(CoordinatorConfig {
            federation,
            listen,
            mqtt_listen: match pick(&self.mqtt_listen, &file.mqtt_listen) {
                Some(value) => parse_addr("--mqtt-listen", &value)?,
                None => defaults.mqtt_listen,
            },
            broker: pick(&self.broker, &file.broker),
            db: pick(&self.db, &file.db),
            data_dir: self
                .data_dir
                .clone()
                .or(file.data_dir)
                .unwrap_or(defaults.data_dir),
            policy: pick(&self.policy, &file.policy).unwrap_or(defaults.policy),
            model: self.model.clone().or(file.model),
            public_url: pick(&self.public_url, &file.public_url),
            topic_prefix: pick(&self.topic_prefix, &file.topic_prefix)
                .unwrap_or(defaults.topic_prefix),
            api_token,
            max_attempts: file.max_attempts.unwrap_or(defaults.max_attempts),
            max_artifact_bytes: file
                .max_artifact_bytes
                .unwrap_or(defaults.max_artifact_bytes),
            artifact_quota_bytes: file
                .artifact_quota_bytes
                .unwrap_or(defaults.artifact_quota_bytes),
            pending_quota: file.pending_quota.unwrap_or(defaults.pending_quota),
            artifact_grace: duration(
                "artifact-grace",
                &None,
                &file.artifact_grace,
                defaults.artifact_grace,
            )?,
            event_buffer: self
                .event_buffer
                .and_then(|events| usize::try_from(events).ok())
                .or(file.event_buffer)
                .unwrap_or(defaults.event_buffer)
                .max(1),
            node_timeout: duration(
                "--node-timeout",
                &self.node_timeout,
                &file.node_timeout,
                defaults.node_timeout,
            )?,
            assignment_ttl: duration(
                "--assignment-ttl",
                &self.assignment_ttl,
                &file.assignment_ttl,
                defaults.assignment_ttl,
            )?,
            resend_interval: duration(
                "--resend-interval",
                &self.resend_interval,
                &file.resend_interval,
                defaults.resend_interval,
            )?,
            leader_lease: duration(
                "--leader-lease",
                &self.leader_lease,
                &file.leader_lease,
                defaults.leader_lease,
            )?,
            mqtt_username: pick(&self.mqtt_username, &file.mqtt_username),
            mqtt_password: pick(&self.mqtt_password, &file.mqtt_password),
            mqtt_allow_anonymous: self.mqtt_allow_anonymous
                || file.mqtt_allow_anonymous.unwrap_or(false),
            mosquitto_auth_dir: self.mosquitto_auth_dir.clone().or(file.mosquitto_auth_dir),
            mosquitto_pid_file: self.mosquitto_pid_file.clone().or(file.mosquitto_pid_file),
            mosquitto_bin: self.mosquitto_bin.clone().or(file.mosquitto_bin),
            mqtt_tls: MqttTlsFiles {
                ca_file: self.mqtt_ca_file.clone().or(file.mqtt_ca_file),
                client_cert: self.mqtt_client_cert.clone().or(file.mqtt_client_cert),
                client_key: self.mqtt_client_key.clone().or(file.mqtt_client_key),
            },
            mqtt_server_tls: tls_pair(
                self.mqtt_tls_cert.clone().or(file.mqtt_tls_cert),
                self.mqtt_tls_key.clone().or(file.mqtt_tls_key),
                ("--mqtt-tls-cert", "--mqtt-tls-key"),
            )?,
            rest_tls: tls_pair(
                self.tls_cert.clone().or(file.tls_cert),
                self.tls_key.clone().or(file.tls_key),
                ("--tls-cert", "--tls-key"),
            )?,
            ..defaults
        })
    }

    /// The cluster key, from --cluster-key or --cluster-key-file (flag or
    /// environment), else from the config file's `cluster-key` or
    /// `cluster-key-file`; a file's surrounding whitespace is not the key's.
    fn cluster_key(&self, file: &FileConfig) -> Result<Option<String>, ConfigError> {
        let read = |path: &PathBuf| {
            std::fs::read_to_string(path)
                .map(|text| text.trim().to_string())
                .map_err(|source| ConfigError::ClusterKeyFile {
                    path: path.clone(),
                    source,
                })
        };
        if let Some(key) = &self.cluster_key {
            return Ok(Some(key.clone()));
        }
        if let Some(path) = &self.cluster_key_file {
            return read(path).map(Some);
        }
        match (&file.cluster_key, &file.cluster_key_file) {
            (Some(_), Some(_)) => Err(ConfigError::Federation(
                "the config file sets both cluster-key and cluster-key-file: keep one".into(),
            )),
            (Some(key), None) => Ok(Some(key.clone())),
            (None, Some(path)) => read(path).map(Some),
            (None, None) => Ok(None),
        }
    }

    /// The federation settings: all or nothing around --site and --cluster-key.
    fn federation(
        &self,
        file: &FileConfig,
        forward_timeout: Duration,
    ) -> Result<Option<FederationConfig>, ConfigError> {
        let site = self.site.clone().or_else(|| file.site.clone());
        let key = self.cluster_key(file)?;
        let seeds = if self.seeds.is_empty() {
            file.seeds.clone().unwrap_or_default()
        } else {
            self.seeds.clone()
        };
        let (site, cluster_key) = match (site, key) {
            (Some(site), Some(key)) => (site, key),
            (None, None) if seeds.is_empty() => return Ok(None),
            (None, _) => {
                return Err(ConfigError::Federation(
                    "--cluster-key and --seed need --site: name this coordinator's site to federate".into(),
                ))
            }
            (Some(_), None) => {
                return Err(ConfigError::Federation(
                    "--site needs --cluster-key-file or --cluster-key: every federation message is sealed with it (make one with `starling-coordinator cluster-key > FILE`)".into(),
                ))
            }
        };
        starling_proto::SiteId::new(&site)
            .map_err(|error| ConfigError::Federation(format!("--site {site:?}: {error}")))?;
        let site_credentials = self.site_credentials.clone().or_else(|| file.site_credentials.clone()).ok_or_else(|| ConfigError::Federation(format!(
            "--site needs --site-credentials: each site proves its name to the others with credentials issued from the federation's trust root. On the first site run `starling-coordinator federation init --site {site}`; for another site run `starling-coordinator federation issue --site {site} --out FILE` on the member holding the root and copy FILE here"
        )))?;
        let gossip_listen = self
            .gossip_listen
            .clone()
            .or_else(|| file.gossip_listen.clone())
            .unwrap_or_else(|| DEFAULT_GOSSIP_LISTEN.to_string());
        let link_mbps = self
            .site_link_mbps
            .or(file.site_link_mbps)
            .unwrap_or(DEFAULT_SITE_LINK_MBPS);
        if !(link_mbps.is_finite() && link_mbps > 0.0) {
            return Err(ConfigError::Federation(format!(
                "--site-link-mbps {link_mbps} must be a positive number"
            )));
        }
        Ok(Some(FederationConfig {
            site,
            gossip_listen: parse_addr("--gossip-listen", &gossip_listen)?,
            gossip_advertise: self
                .gossip_advertise
                .clone()
                .or_else(|| file.gossip_advertise.clone())
                .map(|value| parse_addr("--gossip-advertise", &value))
                .transpose()?,
            seeds: seeds
                .iter()
                .map(|seed| parse_addr("--seed", seed))
                .collect::<Result<_, _>>()?,
            cluster_key,
            site_credentials,
            link_mbps,
            forward_timeout,
        }))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests;
