//! The coordinator's settings, from flags, environment variables, a TOML file
//! and defaults, in that order of precedence.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

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
    /// How often the scheduler looks at the queue when nothing wakes it.
    pub schedule_interval: Duration,
    /// A node silent this long gets no new work, whatever its last status said.
    pub silent_node_after: Duration,
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
            placement_seed: 0,
            public_url: None,
            topic_prefix: starling_proto::topic::DEFAULT_PREFIX.to_string(),
            api_token: None,
            max_attempts: DEFAULT_MAX_ATTEMPTS,
            max_artifact_bytes: DEFAULT_MAX_ARTIFACT_BYTES,
            schedule_interval: Duration::from_millis(1000),
            silent_node_after: Duration::from_secs(30),
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
    /// `--public-url`.
    pub public_url: Option<String>,
    /// `--topic-prefix`.
    pub topic_prefix: Option<String>,
    /// `--api-token`.
    pub api_token: Option<String>,
    /// Attempts per task.
    pub max_attempts: Option<u32>,
    /// Largest artifact, in bytes.
    pub max_artifact_bytes: Option<usize>,
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
    /// An address is not `IP:PORT`.
    #[error("{setting} {value:?} is not an address like 127.0.0.1:7878")]
    Address {
        /// Which setting.
        setting: &'static str,
        /// The value given.
        value: String,
    },
}

fn parse_addr(setting: &'static str, value: &str) -> Result<SocketAddr, ConfigError> {
    value.parse().map_err(|_| ConfigError::Address {
        setting,
        value: value.to_string(),
    })
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
        let pick = |flag: &Option<String>, from_file: &Option<String>| {
            flag.clone().or_else(|| from_file.clone())
        };
        Ok(CoordinatorConfig {
            listen: match pick(&self.listen, &file.listen) {
                Some(value) => parse_addr("--listen", &value)?,
                None => defaults.listen,
            },
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
            public_url: pick(&self.public_url, &file.public_url),
            topic_prefix: pick(&self.topic_prefix, &file.topic_prefix)
                .unwrap_or(defaults.topic_prefix),
            api_token: pick(&self.api_token, &file.api_token).filter(|token| !token.is_empty()),
            max_attempts: file.max_attempts.unwrap_or(defaults.max_attempts),
            max_artifact_bytes: file
                .max_artifact_bytes
                .unwrap_or(defaults.max_artifact_bytes),
            ..defaults
        })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn flags_beat_file_beats_defaults() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("coordinator.toml");
        std::fs::write(
            &path,
            "listen = \"127.0.0.1:9000\"\npolicy = \"random\"\nmqtt-listen = \"127.0.0.1:0\"\n",
        )
        .unwrap();
        let args = ServeArgs {
            config: Some(path),
            policy: Some("least-loaded".into()),
            ..ServeArgs::default()
        };
        let config = args.resolve().unwrap();
        assert_eq!(config.listen, "127.0.0.1:9000".parse().unwrap());
        assert_eq!(config.mqtt_listen, "127.0.0.1:0".parse().unwrap());
        assert_eq!(config.policy, "least-loaded");
        assert_eq!(config.topic_prefix, "starling/v1");
        assert_eq!(config.data_dir, PathBuf::from(DEFAULT_DATA_DIR));
    }

    #[test]
    fn bad_file_and_bad_address_are_reported() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("bad.toml");
        std::fs::write(&path, "no-such-setting = 1\n").unwrap();
        let args = ServeArgs {
            config: Some(path),
            ..ServeArgs::default()
        };
        assert!(matches!(args.resolve(), Err(ConfigError::Parse { .. })));
        let args = ServeArgs {
            listen: Some("localhost".into()),
            ..ServeArgs::default()
        };
        let error = args.resolve().unwrap_err().to_string();
        assert!(error.contains("--listen"), "{error}");
    }
}
