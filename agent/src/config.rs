//! The agent's configuration: defaults, a TOML file, environment variables and
//! flags, merged with the precedence flags > env > file > defaults. The binary
//! turns flags and env into one [`ConfigLayer`] (clap reads both), the file into
//! another, and [`AgentConfig::from_layers`] merges them.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;
use starling_net::{BrokerAddress, MqttTlsFiles};
use starling_proto::limits::{MAX_LABELS, NODE_ID_LEN};
use starling_proto::{Grants, Label, NodeId};

use crate::caps::CapSettings;

/// The broker an agent uses unless told otherwise.
pub const DEFAULT_BROKER: &str = "mqtt://127.0.0.1:1883";

/// Where the agent keeps its cache unless told otherwise.
pub const DEFAULT_DATA_DIR: &str = "./.starling/agent";

/// Everything the agent needs to run.
#[derive(Debug, Clone, PartialEq)]
pub struct AgentConfig {
    /// MQTT broker URL: `mqtt://host:port` (also `tcp://`, or bare `host[:port]`);
    /// several, separated by commas, are tried in turn whenever the
    /// connection is lost (brokers bridged to one core, see docs/operations.md).
    pub broker: String,
    /// The node id; derived from `/etc/machine-id` and the host name when absent.
    pub node_id: Option<String>,
    /// Directory for the module cache and the I/O measurement.
    pub data_dir: PathBuf,
    /// Operator labels, published in the capability.
    pub labels: Vec<Label>,
    /// How often telemetry is published.
    pub telemetry_interval: Duration,
    /// MQTT topic prefix.
    pub topic_prefix: String,
    /// How many tasks run at once; more are queued.
    pub max_tasks: usize,
    /// Measure the data dir's disk with a short sequential write, fsync and
    /// read at start (on by default; [`crate::probe::IO_PROBE_BYTES`]).
    pub measure_io: bool,
    /// Disk rates the operator declares for the data dir's disk, in MB/s (read, write).
    pub declared_io_mbps: Option<(f32, f32)>,
    /// One core's speed relative to placement's reference core, as the
    /// operator declares it; the agent then does not calibrate (the
    /// capability says `operator`).
    pub declared_cpu_speed: Option<f32>,
    /// MQTT keep-alive; pings double as round-trip measurements toward the broker.
    pub keep_alive: Duration,
    /// Largest module the agent downloads, in bytes.
    pub max_artifact_bytes: u64,
    /// Whether to look for OpenCL devices and run OpenCL tasks.
    pub opencl: bool,
    /// The `starling-opencl-worker` binary; found beside the agent's own
    /// executable when not set.
    pub opencl_worker: Option<PathBuf>,
    /// The coordinator's ed25519 public key, which every assignment's
    /// signature must verify against. Without it every assignment is refused
    /// as unverifiable, unless `allow_unsigned` is set.
    pub coordinator_key: Option<[u8; 32]>,
    /// Development only: without a coordinator key, run assignments whose
    /// signature cannot be checked (node and validity window still are).
    pub allow_unsigned: bool,
    /// Most task events the journal's outbox holds awaiting the coordinator's
    /// receipt; at the limit new assignments are refused (`agent_busy`).
    pub journal_max_entries: usize,
    /// Most attempts the journal remembers; finished ones are pruned oldest
    /// first once their assignment can no longer be replayed.
    pub journal_max_attempts: usize,
    /// How often task events without a receipt are sent again.
    pub event_resend_interval: Duration,
    /// The coordinator's REST base URL (`http://host:port`), used to enroll.
    pub coordinator_url: Option<String>,
    /// The CA (PEM) to trust for an `https://` coordinator URL and artifact
    /// URLs; the system roots when absent.
    pub coordinator_ca_file: Option<PathBuf>,
    /// A join token from `starling token create`, used once to enroll; ignored
    /// once `<data-dir>/credentials.json` exists.
    pub join_token: Option<String>,
    /// MQTT user name; enrollment sets it (to the node id).
    pub mqtt_username: Option<String>,
    /// MQTT password; enrollment sets it.
    pub mqtt_password: Option<String>,
    /// TLS files for `mqtts://` brokers.
    pub mqtt_tls: MqttTlsFiles,
    /// What wasm tasks may be granted on this node; a task asking for more is
    /// refused before it runs. Nothing by default: the operator opts in.
    pub allowed_grants: Grants,
    /// Publisher keys (ed25519) this node trusts. When any is set, a task runs
    /// only if its artifact carries a valid signature by one of them.
    pub trusted_publishers: Vec<[u8; 32]>,
    /// The most memory, wall time and output one task may ask for here
    /// ([`crate::caps`]); unset caps are sized to the device.
    pub task_caps: CapSettings,
    /// Where sysfs is (`/sys`): cpufreq, to apply power levels. Tests give a
    /// directory shaped like it.
    pub sysfs_root: PathBuf,
}

impl Default for AgentConfig {
    fn default() -> Self {
        Self {
            broker: DEFAULT_BROKER.to_owned(),
            node_id: None,
            data_dir: PathBuf::from(DEFAULT_DATA_DIR),
            labels: Vec::new(),
            telemetry_interval: Duration::from_secs(1),
            topic_prefix: starling_proto::topic::DEFAULT_PREFIX.to_owned(),
            max_tasks: std::thread::available_parallelism()
                .map(usize::from)
                .unwrap_or(1),
            measure_io: true,
            declared_io_mbps: None,
            declared_cpu_speed: None,
            keep_alive: Duration::from_secs(5),
            max_artifact_bytes: 64 * 1024 * 1024,
            opencl: true,
            opencl_worker: None,
            coordinator_key: None,
            allow_unsigned: false,
            journal_max_entries: crate::journal::DEFAULT_MAX_ENTRIES,
            journal_max_attempts: crate::journal::DEFAULT_MAX_ATTEMPTS,
            event_resend_interval: Duration::from_secs(5),
            coordinator_url: None,
            coordinator_ca_file: None,
            join_token: None,
            mqtt_username: None,
            mqtt_password: None,
            mqtt_tls: MqttTlsFiles::default(),
            allowed_grants: Grants::default(),
            trusted_publishers: Vec::new(),
            task_caps: CapSettings::default(),
            sysfs_root: PathBuf::from("/sys"),
        }
    }
}

/// Why a configuration was refused.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The config file could not be read.
    #[error("cannot read config file {path}: {source}")]
    ReadFile {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// The config file is not valid TOML for the agent.
    #[error("config file {path} is invalid: {detail}")]
    ParseFile {
        /// The file.
        path: PathBuf,
        /// What the parser said.
        detail: String,
    },
    /// A label is malformed.
    #[error("invalid label {text:?}: {source}; write labels as key=value,key=value")]
    Label {
        /// The label as given.
        text: String,
        /// Why it is invalid.
        source: starling_proto::IdError,
    },
    /// Too many labels.
    #[error("{count} labels given; at most {MAX_LABELS} are allowed")]
    TooManyLabels {
        /// How many were given.
        count: usize,
    },
    /// A duration is malformed.
    #[error("invalid duration {text:?}: write a number with a unit, like 500ms, 1s or 2m")]
    Duration {
        /// The duration as given.
        text: String,
    },
    /// The broker URL is malformed.
    #[error(transparent)]
    Broker(#[from] starling_net::BrokerUrlError),
    /// The node id is malformed.
    #[error("invalid node id {id:?}: {source}")]
    NodeId {
        /// The id as given.
        id: String,
        /// Why it is invalid.
        source: starling_proto::IdError,
    },
    /// A numeric setting is out of range.
    #[error("{setting} must be {requirement}")]
    OutOfRange {
        /// The setting.
        setting: &'static str,
        /// What it must be.
        requirement: &'static str,
    },
    /// The topic prefix is malformed.
    #[error(transparent)]
    TopicPrefix(#[from] starling_proto::TopicError),
    /// A grant name is unknown.
    #[error("unknown grant {name:?}: write grants as a comma-separated list of clock, random (or all, none)")]
    Grant {
        /// The name as given.
        name: String,
    },
    /// Two settings contradict each other.
    #[error("{0}")]
    Conflict(&'static str),
    /// The MQTT TLS settings could not be turned into a client configuration.
    #[error(transparent)]
    Tls(#[from] starling_net::TlsError),
    /// The coordinator key is not 32 bytes of hex.
    #[error("invalid coordinator key: {detail}; give the coordinator's ed25519 public key as 64 hex digits")]
    CoordinatorKey {
        /// What was wrong.
        detail: String,
    },
    /// A task cap is malformed or zero.
    #[error(transparent)]
    TaskCaps(#[from] crate::caps::CapsError),
    /// A trusted publisher key is not 32 bytes of hex.
    #[error("invalid publisher key {key:?}: {detail}; give the publisher's ed25519 public key as 64 hex digits (starling keygen prints it)")]
    PublisherKey {
        /// The key as given.
        key: String,
        /// What was wrong.
        detail: String,
    },
}

/// One source of settings (flags and env, or a file); `None` means "not set here".
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ConfigLayer {
    /// See [`AgentConfig::broker`].
    pub broker: Option<String>,
    /// See [`AgentConfig::node_id`].
    pub node_id: Option<String>,
    /// See [`AgentConfig::data_dir`].
    pub data_dir: Option<PathBuf>,
    /// See [`AgentConfig::labels`].
    pub labels: Option<Vec<Label>>,
    /// See [`AgentConfig::telemetry_interval`].
    pub telemetry_interval: Option<Duration>,
    /// See [`AgentConfig::topic_prefix`].
    pub topic_prefix: Option<String>,
    /// See [`AgentConfig::max_tasks`].
    pub max_tasks: Option<usize>,
    /// See [`AgentConfig::measure_io`].
    pub measure_io: Option<bool>,
    /// See [`AgentConfig::declared_io_mbps`].
    pub declared_io_mbps: Option<(f32, f32)>,
    /// See [`AgentConfig::declared_cpu_speed`].
    pub declared_cpu_speed: Option<f32>,
    /// See [`AgentConfig::keep_alive`].
    pub keep_alive: Option<Duration>,
    /// See [`AgentConfig::max_artifact_bytes`].
    pub max_artifact_bytes: Option<u64>,
    /// See [`AgentConfig::opencl`].
    pub opencl: Option<bool>,
    /// See [`AgentConfig::opencl_worker`].
    pub opencl_worker: Option<PathBuf>,
    /// See [`AgentConfig::coordinator_key`].
    pub coordinator_key: Option<[u8; 32]>,
    /// See [`AgentConfig::allow_unsigned`].
    pub allow_unsigned: Option<bool>,
    /// See [`AgentConfig::journal_max_entries`].
    pub journal_max_entries: Option<usize>,
    /// See [`AgentConfig::journal_max_attempts`].
    pub journal_max_attempts: Option<usize>,
    /// See [`AgentConfig::event_resend_interval`].
    pub event_resend_interval: Option<Duration>,
    /// See [`AgentConfig::coordinator_url`].
    pub coordinator_url: Option<String>,
    /// See [`AgentConfig::coordinator_ca_file`].
    pub coordinator_ca_file: Option<PathBuf>,
    /// See [`AgentConfig::join_token`].
    pub join_token: Option<String>,
    /// See [`AgentConfig::mqtt_username`].
    pub mqtt_username: Option<String>,
    /// See [`AgentConfig::mqtt_password`].
    pub mqtt_password: Option<String>,
    /// See [`MqttTlsFiles::ca_file`].
    pub mqtt_ca_file: Option<PathBuf>,
    /// See [`MqttTlsFiles::client_cert`].
    pub mqtt_client_cert: Option<PathBuf>,
    /// See [`MqttTlsFiles::client_key`].
    pub mqtt_client_key: Option<PathBuf>,
    /// See [`AgentConfig::allowed_grants`].
    pub allowed_grants: Option<Grants>,
    /// See [`AgentConfig::trusted_publishers`].
    pub trusted_publishers: Option<Vec<[u8; 32]>>,
    /// See [`AgentConfig::task_caps`]; merged cap by cap.
    pub task_caps: CapSettings,
}

/// The TOML file's shape. Every key is optional; unknown keys are refused so a
/// typo does not silently fall back to a default.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct FileConfig {
    broker: Option<String>,
    node_id: Option<String>,
    data_dir: Option<PathBuf>,
    labels: Option<BTreeMap<String, String>>,
    telemetry_interval: Option<String>,
    topic_prefix: Option<String>,
    max_tasks: Option<usize>,
    measure_io: Option<bool>,
    disk_read_mbps: Option<f32>,
    disk_write_mbps: Option<f32>,
    cpu_speed: Option<f32>,
    keep_alive: Option<String>,
    max_artifact_bytes: Option<u64>,
    opencl: Option<bool>,
    opencl_worker: Option<PathBuf>,
    coordinator_key: Option<String>,
    allow_unsigned: Option<bool>,
    journal_max_entries: Option<usize>,
    journal_max_attempts: Option<usize>,
    event_resend_interval: Option<String>,
    coordinator_url: Option<String>,
    coordinator_ca_file: Option<PathBuf>,
    mqtt_username: Option<String>,
    mqtt_password: Option<String>,
    mqtt_ca_file: Option<PathBuf>,
    mqtt_client_cert: Option<PathBuf>,
    mqtt_client_key: Option<PathBuf>,
    allow_grants: Option<Vec<String>>,
    trusted_publishers: Option<Vec<String>>,
    task_caps: Option<crate::caps::CapsFile>,
}

impl ConfigLayer {
    /// Reads a TOML config file, for example:
    ///
    /// ```toml
    /// broker = "mqtt://10.0.0.2:1883"
    /// data-dir = "/var/lib/starling"
    /// telemetry-interval = "2s"
    /// max-tasks = 2
    /// disk-read-mbps = 90.0
    /// disk-write-mbps = 40.0
    /// [labels]
    /// zone = "kitchen"
    /// ```
    pub fn from_file(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::ReadFile {
            path: path.to_owned(),
            source,
        })?;
        Self::from_toml(&text).map_err(|error| match error {
            ConfigError::ParseFile { detail, .. } => ConfigError::ParseFile {
                path: path.to_owned(),
                detail,
            },
            other => other,
        })
    }

    /// Parses the text of a TOML config file.
    pub fn from_toml(text: &str) -> Result<Self, ConfigError> {
        let file: FileConfig = toml::from_str(text).map_err(|e| ConfigError::ParseFile {
            path: PathBuf::new(),
            detail: e.message().to_owned(),
        })?;
        let labels = file
            .labels
            .map(|map| {
                map.iter()
                    .map(|(key, value)| {
                        Label::new(key, value).map_err(|source| ConfigError::Label {
                            text: format!("{key}={value}"),
                            source,
                        })
                    })
                    .collect::<Result<Vec<_>, _>>()
            })
            .transpose()?;
        let declared_io_mbps = match (file.disk_read_mbps, file.disk_write_mbps) {
            (None, None) => None,
            (read, write) => Some((read.unwrap_or(0.0), write.unwrap_or(0.0))),
        };
        Ok(Self {
            broker: file.broker,
            node_id: file.node_id,
            data_dir: file.data_dir,
            labels,
            telemetry_interval: file
                .telemetry_interval
                .as_deref()
                .map(parse_duration)
                .transpose()?,
            topic_prefix: file.topic_prefix,
            max_tasks: file.max_tasks,
            measure_io: file.measure_io,
            declared_io_mbps,
            declared_cpu_speed: file.cpu_speed,
            keep_alive: file.keep_alive.as_deref().map(parse_duration).transpose()?,
            max_artifact_bytes: file.max_artifact_bytes,
            opencl: file.opencl,
            opencl_worker: file.opencl_worker,
            coordinator_key: file
                .coordinator_key
                .as_deref()
                .map(parse_coordinator_key)
                .transpose()?,
            allow_unsigned: file.allow_unsigned,
            journal_max_entries: file.journal_max_entries,
            journal_max_attempts: file.journal_max_attempts,
            event_resend_interval: file
                .event_resend_interval
                .as_deref()
                .map(parse_duration)
                .transpose()?,
            coordinator_url: file.coordinator_url,
            coordinator_ca_file: file.coordinator_ca_file,
            // A join token is a one-time secret: flags or environment only.
            join_token: None,
            mqtt_username: file.mqtt_username,
            mqtt_password: file.mqtt_password,
            mqtt_ca_file: file.mqtt_ca_file,
            mqtt_client_cert: file.mqtt_client_cert,
            mqtt_client_key: file.mqtt_client_key,
            allowed_grants: file
                .allow_grants
                .map(|names| parse_grants(&names.join(",")))
                .transpose()?,
            trusted_publishers: file
                .trusted_publishers
                .map(|keys| parse_publisher_keys(&keys.join(",")))
                .transpose()?,
            task_caps: file
                .task_caps
                .map(|t| t.settings())
                .transpose()?
                .unwrap_or_default(),
        })
    }
}

impl AgentConfig {
    /// Merges layers, earlier layers winning, over the defaults, and checks the result.
    pub fn from_layers(layers: &[ConfigLayer]) -> Result<Self, ConfigError> {
        fn first<T: Clone>(
            layers: &[ConfigLayer],
            field: impl Fn(&ConfigLayer) -> &Option<T>,
        ) -> Option<T> {
            layers.iter().find_map(|layer| field(layer).clone())
        }
        let defaults = Self::default();
        let config = Self {
            broker: first(layers, |l| &l.broker).unwrap_or(defaults.broker),
            node_id: first(layers, |l| &l.node_id).or(defaults.node_id),
            data_dir: first(layers, |l| &l.data_dir).unwrap_or(defaults.data_dir),
            labels: first(layers, |l| &l.labels).unwrap_or(defaults.labels),
            telemetry_interval: first(layers, |l| &l.telemetry_interval)
                .unwrap_or(defaults.telemetry_interval),
            topic_prefix: first(layers, |l| &l.topic_prefix).unwrap_or(defaults.topic_prefix),
            max_tasks: first(layers, |l| &l.max_tasks).unwrap_or(defaults.max_tasks),
            measure_io: first(layers, |l| &l.measure_io).unwrap_or(defaults.measure_io),
            declared_io_mbps: first(layers, |l| &l.declared_io_mbps).or(defaults.declared_io_mbps),
            declared_cpu_speed: first(layers, |l| &l.declared_cpu_speed)
                .or(defaults.declared_cpu_speed),
            keep_alive: first(layers, |l| &l.keep_alive).unwrap_or(defaults.keep_alive),
            max_artifact_bytes: first(layers, |l| &l.max_artifact_bytes)
                .unwrap_or(defaults.max_artifact_bytes),
            opencl: first(layers, |l| &l.opencl).unwrap_or(defaults.opencl),
            opencl_worker: first(layers, |l| &l.opencl_worker).or(defaults.opencl_worker),
            coordinator_key: first(layers, |l| &l.coordinator_key).or(defaults.coordinator_key),
            allow_unsigned: first(layers, |l| &l.allow_unsigned).unwrap_or(defaults.allow_unsigned),
            journal_max_entries: first(layers, |l| &l.journal_max_entries)
                .unwrap_or(defaults.journal_max_entries),
            journal_max_attempts: first(layers, |l| &l.journal_max_attempts)
                .unwrap_or(defaults.journal_max_attempts),
            event_resend_interval: first(layers, |l| &l.event_resend_interval)
                .unwrap_or(defaults.event_resend_interval),
            coordinator_url: first(layers, |l| &l.coordinator_url).or(defaults.coordinator_url),
            coordinator_ca_file: first(layers, |l| &l.coordinator_ca_file)
                .or(defaults.coordinator_ca_file),
            join_token: first(layers, |l| &l.join_token).or(defaults.join_token),
            mqtt_username: first(layers, |l| &l.mqtt_username).or(defaults.mqtt_username),
            mqtt_password: first(layers, |l| &l.mqtt_password).or(defaults.mqtt_password),
            mqtt_tls: MqttTlsFiles {
                ca_file: first(layers, |l| &l.mqtt_ca_file),
                client_cert: first(layers, |l| &l.mqtt_client_cert),
                client_key: first(layers, |l| &l.mqtt_client_key),
            },
            allowed_grants: first(layers, |l| &l.allowed_grants).unwrap_or(defaults.allowed_grants),
            trusted_publishers: first(layers, |l| &l.trusted_publishers)
                .unwrap_or(defaults.trusted_publishers),
            task_caps: CapSettings::merge(layers.iter().map(|l| &l.task_caps)),
            sysfs_root: defaults.sysfs_root,
        };
        config.validate()?;
        Ok(config)
    }

    /// Checks the settings that can be wrong independently of the environment.
    pub fn validate(&self) -> Result<(), ConfigError> {
        BrokerAddress::parse_list(&self.broker)?;
        starling_proto::Topics::new(&self.topic_prefix)?;
        if let Some(id) = &self.node_id {
            NodeId::new(id).map_err(|source| ConfigError::NodeId {
                id: id.clone(),
                source,
            })?;
        }
        if self.labels.len() > MAX_LABELS {
            return Err(ConfigError::TooManyLabels {
                count: self.labels.len(),
            });
        }
        self.task_caps.validate()?;
        if self.max_tasks == 0 {
            return Err(ConfigError::OutOfRange {
                setting: "max-tasks",
                requirement: "at least 1",
            });
        }
        if self.telemetry_interval < Duration::from_millis(10) {
            return Err(ConfigError::OutOfRange {
                setting: "telemetry-interval",
                requirement: "at least 10ms",
            });
        }
        if let Some((read, write)) = self.declared_io_mbps {
            if !(read.is_finite() && write.is_finite() && read >= 0.0 && write >= 0.0) {
                return Err(ConfigError::OutOfRange {
                    setting: "disk-read-mbps and disk-write-mbps",
                    requirement: "non-negative numbers",
                });
            }
        }
        if let Some(speed) = self.declared_cpu_speed {
            if !(speed.is_finite() && speed > 0.0) {
                return Err(ConfigError::OutOfRange {
                    setting: "cpu-speed",
                    requirement: "a number above 0 (1.0 is the reference core)",
                });
            }
        }
        if self.keep_alive < Duration::from_secs(1) {
            return Err(ConfigError::OutOfRange {
                setting: "keep-alive",
                requirement: "at least 1s",
            });
        }
        if self.journal_max_entries == 0 || self.journal_max_attempts == 0 {
            return Err(ConfigError::OutOfRange {
                setting: "journal-max-entries and journal-max-attempts",
                requirement: "at least 1",
            });
        }
        if self.event_resend_interval < Duration::from_millis(100) {
            return Err(ConfigError::OutOfRange {
                setting: "event-resend-interval",
                requirement: "at least 100ms",
            });
        }
        if self.mqtt_tls.client_cert.is_some() != self.mqtt_tls.client_key.is_some() {
            return Err(ConfigError::Conflict(
                "--mqtt-client-cert and --mqtt-client-key go together: give both or neither",
            ));
        }
        if self.mqtt_password.is_some() && self.mqtt_username.is_none() {
            return Err(ConfigError::Conflict(
                "an MQTT password needs an MQTT user name (--mqtt-username)",
            ));
        }
        Ok(())
    }

    /// The node id: the configured one, or one derived from the machine.
    pub fn resolved_node_id(&self) -> Result<NodeId, ConfigError> {
        let id = match &self.node_id {
            Some(id) => id.clone(),
            None => derived_node_id(),
        };
        NodeId::new(&id).map_err(|source| ConfigError::NodeId { id, source })
    }
}

/// Derives a stable node id from the host name and `/etc/machine-id`, keeping
/// only characters node ids allow.
pub fn derived_node_id() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty());
    let machine = std::fs::read_to_string("/etc/machine-id")
        .ok()
        .map(|m| m.trim().chars().take(8).collect::<String>())
        .filter(|m| !m.is_empty());
    let raw = match (host, machine) {
        (Some(host), Some(machine)) => format!("{host}-{machine}"),
        (Some(host), None) => host,
        (None, Some(machine)) => format!("node-{machine}"),
        (None, None) => "starling-node".to_owned(),
    };
    sanitize_node_id(&raw)
}

/// Replaces characters a node id may not hold with `-` and cuts it to length.
pub fn sanitize_node_id(raw: &str) -> String {
    let cleaned: String = raw
        .chars()
        .map(|c| {
            if starling_proto::ids::is_node_id_char(c) {
                c
            } else {
                '-'
            }
        })
        .take(NODE_ID_LEN)
        .collect();
    if cleaned.is_empty() {
        "starling-node".to_owned()
    } else {
        cleaned
    }
}

/// Parses `clock,random` (also `all` and `none`) into grants.
pub fn parse_grants(text: &str) -> Result<Grants, ConfigError> {
    let mut grants = Grants::default();
    for name in text.split(',').map(str::trim).filter(|n| !n.is_empty()) {
        match name {
            "clock" => grants.clock = true,
            "random" => grants.random = true,
            "all" => {
                grants.clock = true;
                grants.random = true;
            }
            "none" => {}
            other => {
                return Err(ConfigError::Grant {
                    name: other.to_owned(),
                })
            }
        }
    }
    Ok(grants)
}

/// Parses the coordinator's ed25519 public key: 64 hex digits (32 bytes).
pub fn parse_coordinator_key(text: &str) -> Result<[u8; 32], ConfigError> {
    let bytes = hex::decode(text.trim()).map_err(|error| ConfigError::CoordinatorKey {
        detail: error.to_string(),
    })?;
    <[u8; 32]>::try_from(bytes.as_slice()).map_err(|_| ConfigError::CoordinatorKey {
        detail: format!("{} bytes given, 32 expected", bytes.len()),
    })
}

/// Parses a comma-separated list of publisher public keys (64 hex digits each).
pub fn parse_publisher_keys(text: &str) -> Result<Vec<[u8; 32]>, ConfigError> {
    text.split(',')
        .map(str::trim)
        .filter(|key| !key.is_empty())
        .map(|key| {
            parse_coordinator_key(key).map_err(|error| ConfigError::PublisherKey {
                key: key.to_owned(),
                detail: match error {
                    ConfigError::CoordinatorKey { detail } => detail,
                    other => other.to_string(),
                },
            })
        })
        .collect()
}

/// Parses `k=v,k=v` labels.
pub fn parse_labels(text: &str) -> Result<Vec<Label>, ConfigError> {
    let labels = text
        .split(',')
        .map(str::trim)
        .filter(|part| !part.is_empty())
        .map(|part| {
            Label::parse(part).map_err(|source| ConfigError::Label {
                text: part.to_owned(),
                source,
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    if labels.len() > MAX_LABELS {
        return Err(ConfigError::TooManyLabels {
            count: labels.len(),
        });
    }
    Ok(labels)
}

/// Parses `500ms`, `1s`, `1.5s`, `2m`, `1h`; a bare number means seconds
/// (`starling_net::parse_duration`, with the agent's error).
pub fn parse_duration(text: &str) -> Result<Duration, ConfigError> {
    starling_net::parse_duration(text).map_err(|_| ConfigError::Duration {
        text: text.to_owned(),
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_with_units() {
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("1s").unwrap(), Duration::from_secs(1));
        assert_eq!(parse_duration("1.5s").unwrap(), Duration::from_millis(1500));
        assert_eq!(parse_duration("2m").unwrap(), Duration::from_secs(120));
        assert_eq!(parse_duration("3").unwrap(), Duration::from_secs(3));
        assert!(parse_duration("fast").is_err());
        assert!(parse_duration("1 fortnight").is_err());
        assert!(parse_duration("").is_err());
    }

    #[test]
    fn labels_parse_and_refuse() {
        let labels = parse_labels("zone=kitchen, floor=1").unwrap();
        assert_eq!(labels.len(), 2);
        assert_eq!(labels[1].to_string(), "floor=1");
        assert!(parse_labels("").unwrap().is_empty());
        assert!(matches!(
            parse_labels("zone"),
            Err(ConfigError::Label { .. })
        ));
        let many: Vec<String> = (0..=MAX_LABELS).map(|i| format!("k{i}=v")).collect();
        assert!(matches!(
            parse_labels(&many.join(",")),
            Err(ConfigError::TooManyLabels { .. })
        ));
    }

    #[test]
    fn layers_merge_flags_over_env_over_file_over_defaults() {
        let file = ConfigLayer::from_toml(
            r#"
            broker = "mqtt://file:1"
            max-tasks = 3
            telemetry-interval = "2s"
            disk-read-mbps = 90.0
            [labels]
            zone = "kitchen"
            "#,
        )
        .unwrap();
        let flags_and_env = ConfigLayer {
            broker: Some("mqtt://flag:2".into()),
            ..ConfigLayer::default()
        };
        let config = AgentConfig::from_layers(&[flags_and_env, file]).unwrap();
        assert_eq!(config.broker, "mqtt://flag:2");
        assert_eq!(config.max_tasks, 3);
        assert_eq!(config.telemetry_interval, Duration::from_secs(2));
        assert_eq!(config.declared_io_mbps, Some((90.0, 0.0)));
        assert_eq!(config.labels[0].to_string(), "zone=kitchen");
        assert_eq!(config.topic_prefix, "starling/v1");
    }

    #[test]
    fn bad_files_and_settings_are_refused() {
        assert!(matches!(
            ConfigLayer::from_toml("brokr = \"x\""),
            Err(ConfigError::ParseFile { .. })
        ));
        let zero = ConfigLayer {
            max_tasks: Some(0),
            ..ConfigLayer::default()
        };
        assert!(matches!(
            AgentConfig::from_layers(&[zero]),
            Err(ConfigError::OutOfRange { .. })
        ));
        let bad_id = ConfigLayer {
            node_id: Some("a/b".into()),
            ..ConfigLayer::default()
        };
        assert!(matches!(
            AgentConfig::from_layers(&[bad_id]),
            Err(ConfigError::NodeId { .. })
        ));
    }

    #[test]
    fn grants_parse_and_refuse() {
        assert_eq!(parse_grants("").unwrap(), Grants::default());
        assert_eq!(parse_grants("none").unwrap(), Grants::default());
        let both = Grants {
            clock: true,
            random: true,
        };
        assert_eq!(parse_grants("clock, random").unwrap(), both);
        assert_eq!(parse_grants("all").unwrap(), both);
        assert!(parse_grants("clock").unwrap().clock);
        assert!(!parse_grants("clock").unwrap().random);
        assert!(matches!(
            parse_grants("network"),
            Err(ConfigError::Grant { .. })
        ));
        let file = ConfigLayer::from_toml("allow-grants = [\"random\"]").unwrap();
        assert_eq!(
            file.allowed_grants,
            Some(Grants {
                clock: false,
                random: true
            })
        );
    }

    #[test]
    fn half_a_client_certificate_is_refused() {
        let layer = ConfigLayer {
            mqtt_client_cert: Some("cert.pem".into()),
            ..ConfigLayer::default()
        };
        assert!(matches!(
            AgentConfig::from_layers(&[layer]),
            Err(ConfigError::Conflict(_))
        ));
    }

    #[test]
    fn coordinator_keys_and_delivery_settings_parse_and_refuse() {
        let key = "ab".repeat(32);
        assert_eq!(parse_coordinator_key(&key).unwrap(), [0xab; 32]);
        assert!(matches!(
            parse_coordinator_key("abcd"),
            Err(ConfigError::CoordinatorKey { .. })
        ));
        assert!(parse_coordinator_key(&"zz".repeat(32)).is_err());
        let file = ConfigLayer::from_toml(&format!(
            "coordinator-key = \"{key}\"\nallow-unsigned = true\njournal-max-entries = 10\nevent-resend-interval = \"2s\"\n"
        ))
        .unwrap();
        let config = AgentConfig::from_layers(&[file]).unwrap();
        assert_eq!(config.coordinator_key, Some([0xab; 32]));
        assert!(config.allow_unsigned);
        assert_eq!(config.journal_max_entries, 10);
        assert_eq!(
            config.journal_max_attempts,
            crate::journal::DEFAULT_MAX_ATTEMPTS
        );
        assert_eq!(config.event_resend_interval, Duration::from_secs(2));
        let defaults = AgentConfig::default();
        assert_eq!(defaults.coordinator_key, None);
        assert!(!defaults.allow_unsigned);
        let zero = ConfigLayer {
            journal_max_entries: Some(0),
            ..ConfigLayer::default()
        };
        assert!(AgentConfig::from_layers(&[zero]).is_err());
    }

    #[test]
    fn derived_node_ids_are_valid() {
        assert!(NodeId::new(&derived_node_id()).is_ok());
        assert_eq!(sanitize_node_id("my host/1"), "my-host-1");
        // A host name with dots (pi.local) gives a node id the broker and
        // the coordinator accept.
        assert_eq!(sanitize_node_id("pi.local:1"), "pi-local-1");
        assert_eq!(sanitize_node_id(&"x".repeat(100)).len(), NODE_ID_LEN);
    }
}
