//! Enrollment: an agent trades a join token for its own credentials once, and
//! keeps them in `<data-dir>/credentials.json` (mode 0600) from then on.
//!
//! The agent makes its report key (see `report_key`) and sends the public
//! half. The coordinator answers `POST {coordinator_url}/api/v1/enroll` with the
//! node's MQTT user name and password, the topic prefix, and the coordinator's
//! ed25519 public key, which the agent pins: every assignment must verify
//! against it. A join token is single-use on the coordinator's side, so the
//! file, not the token, is what lets a rebooted agent back in; a token passed
//! again once the file exists is ignored.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use starling_proto::NodeId;

use crate::config::{parse_coordinator_key, AgentConfig, ConfigError};

/// The credentials file's name inside the data directory.
pub const CREDENTIALS_FILE: &str = "credentials.json";

/// The enrollment endpoint, relative to the coordinator URL.
pub const ENROLL_PATH: &str = "/api/v1/enroll";

/// How long one enrollment request may take.
const ENROLL_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(15);

/// What an enrolled node keeps: its identity on the broker and the key it
/// trusts. This is also the coordinator's enrollment answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Credentials {
    /// The node id the coordinator enrolled.
    pub node_id: String,
    /// MQTT user name (the node id, for the broker's ACL).
    pub mqtt_username: String,
    /// MQTT password.
    pub mqtt_password: String,
    /// The coordinator's ed25519 public key, 64 hex digits.
    pub coordinator_key: String,
    /// The MQTT topic prefix the coordinator uses.
    pub topic_prefix: String,
}

/// The enrollment request body.
#[derive(Debug, Serialize)]
struct EnrollRequest<'a> {
    join_token: &'a str,
    node_id: &'a str,
    report_key: &'a str,
}

/// Why the agent could not obtain or use its credentials.
#[derive(Debug, thiserror::Error)]
pub enum EnrollError {
    /// The credentials file exists but could not be read or parsed.
    #[error("cannot read the credentials file {path}: {detail}; delete it and enroll again with a new join token")]
    ReadCredentials {
        /// The file.
        path: PathBuf,
        /// What was wrong.
        detail: String,
    },
    /// The credentials file could not be written.
    #[error("cannot write the credentials file {path}: {source}")]
    WriteCredentials {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// The credentials belong to another node than the one configured.
    #[error("the credentials in {path} are for node {enrolled:?}, but this agent is configured as {configured:?}; start it with --node-id {enrolled}, or use another --data-dir to enroll as {configured}")]
    NodeMismatch {
        /// The file.
        path: PathBuf,
        /// The node the file is for.
        enrolled: String,
        /// The node configured.
        configured: String,
    },
    /// A join token was given without a coordinator to redeem it at.
    #[error("a join token needs the coordinator's URL to enroll: pass --coordinator-url http://HOST:PORT")]
    NoCoordinatorUrl,
    /// The coordinator could not be reached.
    #[error("cannot reach the coordinator at {url} to enroll: {detail}")]
    Unreachable {
        /// The enrollment URL.
        url: String,
        /// What went wrong.
        detail: String,
    },
    /// The coordinator refused the join token.
    #[error("the coordinator refused to enroll this node: the join token is invalid, expired or used up; create one with `starling token create`")]
    InvalidToken,
    /// The coordinator refused the node id (taken by another node, or revoked).
    #[error("the coordinator refused to enroll node {node_id:?}: {message}")]
    NodeRefused {
        /// The node id asked for.
        node_id: String,
        /// What the coordinator said.
        message: String,
    },
    /// Any other answer.
    #[error("enrollment failed: the coordinator answered {status}: {message}")]
    Http {
        /// The HTTP status.
        status: u16,
        /// What the coordinator said.
        message: String,
    },
    /// The answer is not a usable set of credentials.
    #[error("the coordinator's enrollment answer is unusable: {detail}")]
    BadAnswer {
        /// What was wrong.
        detail: String,
    },
    /// The node's report key could not be made.
    #[error(transparent)]
    ReportKey(#[from] crate::report_key::ReportKeyError),
    /// The answer names another coordinator key than the one this agent was
    /// told to expect: something between it and the coordinator answered.
    #[error("the enrollment answer carries coordinator key {received}, not the expected {expected} (--coordinator-key); refusing it, nothing was saved. Check --coordinator-url, and the network between this node and the coordinator")]
    KeyMismatch {
        /// The key given with --coordinator-key, hex.
        expected: String,
        /// The key in the answer, hex.
        received: String,
    },
}

/// Where the credentials live for this configuration.
pub fn credentials_path(config: &AgentConfig) -> PathBuf {
    config.data_dir.join(CREDENTIALS_FILE)
}

/// Makes `config` ready to connect as an enrolled node: loads
/// `<data-dir>/credentials.json` when it exists, otherwise enrolls with the
/// join token when one is given, and fills in the node id, MQTT credentials,
/// topic prefix and coordinator key from the credentials. Settings given
/// explicitly (an MQTT user, a coordinator key) win over the file's.
///
/// Returns `None`, changing nothing, when there are neither credentials nor a
/// join token: the agent then connects as configured (an open development
/// broker).
pub async fn prepare(config: &mut AgentConfig) -> Result<Option<Credentials>, EnrollError> {
    let path = credentials_path(config);
    let credentials = if path.exists() {
        let credentials = load(&path)?;
        if let Some(configured) = &config.node_id {
            if *configured != credentials.node_id {
                return Err(EnrollError::NodeMismatch {
                    path,
                    enrolled: credentials.node_id,
                    configured: configured.clone(),
                });
            }
        }
        if config.join_token.is_some() {
            tracing::info!(path = %path.display(),
                "already enrolled; the join token is not needed and was not used");
        }
        credentials
    } else if let Some(token) = config.join_token.clone() {
        let url = config
            .coordinator_url
            .clone()
            .ok_or(EnrollError::NoCoordinatorUrl)?;
        let node_id = config
            .resolved_node_id()
            .map_err(|e| EnrollError::BadAnswer {
                detail: e.to_string(),
            })?;
        // The node's report key is made here, on the node; only its public
        // half goes with the request. A failed enrollment leaves a key that
        // the next attempt replaces.
        let report_key = crate::report_key::create(&config.data_dir)?;
        let credentials = enroll(
            &url,
            &token,
            node_id.as_str(),
            &crate::report_key::public_hex(&report_key),
            config.coordinator_ca_file.as_deref(),
        )
        .await?;
        // Enrollment runs over whatever the URL says, plain HTTP included;
        // the key given beside the join token (as `starling token create`
        // prints it) is what makes it safe: an answer from anyone but the
        // coordinator holding that key is refused before anything is kept.
        if let Some(expected) = config.coordinator_key {
            let received = parse_coordinator_key(&credentials.coordinator_key).map_err(|e| {
                EnrollError::BadAnswer {
                    detail: e.to_string(),
                }
            })?;
            if received != expected {
                return Err(EnrollError::KeyMismatch {
                    expected: hex::encode(expected),
                    received: hex::encode(received),
                });
            }
        }
        if credentials.node_id != node_id.as_str() {
            return Err(EnrollError::BadAnswer {
                detail: format!(
                    "it enrolled node {:?}, not {:?} as asked",
                    credentials.node_id,
                    node_id.as_str()
                ),
            });
        }
        save(&path, &credentials)?;
        tracing::info!(node = %credentials.node_id, path = %path.display(), "enrolled");
        credentials
    } else {
        return Ok(None);
    };
    apply(config, &credentials).map_err(|e| EnrollError::ReadCredentials {
        path: path.clone(),
        detail: e.to_string(),
    })?;
    Ok(Some(credentials))
}

/// Redeems a join token at the coordinator (over HTTPS trusting `ca_file`,
/// or the system roots without one, when the URL is `https://`).
pub async fn enroll(
    coordinator_url: &str,
    join_token: &str,
    node_id: &str,
    report_key: &str,
    ca_file: Option<&Path>,
) -> Result<Credentials, EnrollError> {
    let url = format!("{}{ENROLL_PATH}", coordinator_url.trim_end_matches('/'));
    let unreachable = |detail: String| EnrollError::Unreachable {
        url: url.clone(),
        detail,
    };
    let client = starling_net::tls::http_client(ca_file)
        .map_err(|e| unreachable(e.to_string()))?
        .timeout(ENROLL_TIMEOUT)
        .build()
        .map_err(|e| unreachable(e.to_string()))?;
    let response = client
        .post(&url)
        .json(&EnrollRequest {
            join_token,
            node_id,
            report_key,
        })
        .send()
        .await
        .map_err(|e| unreachable(describe(&e)))?;
    let status = response.status();
    let body = response
        .bytes()
        .await
        .map_err(|e| unreachable(describe(&e)))?;
    match status.as_u16() {
        200 | 201 => {
            let credentials: Credentials =
                serde_json::from_slice(&body).map_err(|e| EnrollError::BadAnswer {
                    detail: e.to_string(),
                })?;
            check(&credentials).map_err(|e| EnrollError::BadAnswer {
                detail: e.to_string(),
            })?;
            Ok(credentials)
        }
        401 => Err(EnrollError::InvalidToken),
        403 | 409 => Err(EnrollError::NodeRefused {
            node_id: node_id.to_owned(),
            message: error_message(&body),
        }),
        code => Err(EnrollError::Http {
            status: code,
            message: error_message(&body),
        }),
    }
}

/// Reads a credentials file.
pub fn load(path: &Path) -> Result<Credentials, EnrollError> {
    let bad = |detail: String| EnrollError::ReadCredentials {
        path: path.to_owned(),
        detail,
    };
    let text = std::fs::read(path).map_err(|e| bad(e.to_string()))?;
    let credentials: Credentials = serde_json::from_slice(&text).map_err(|e| bad(e.to_string()))?;
    check(&credentials).map_err(|e| bad(e.to_string()))?;
    Ok(credentials)
}

/// Writes a credentials file atomically, readable by its owner only: it
/// holds the MQTT password.
pub fn save(path: &Path, credentials: &Credentials) -> Result<(), EnrollError> {
    let fail = |source: std::io::Error| EnrollError::WriteCredentials {
        path: path.to_owned(),
        source,
    };
    let text =
        serde_json::to_vec_pretty(credentials).map_err(|e| fail(std::io::Error::other(e)))?;
    crate::private_file::write(path, &text).map_err(fail)
}

/// Fills `config` from `credentials`, explicit settings winning.
fn apply(config: &mut AgentConfig, credentials: &Credentials) -> Result<(), ConfigError> {
    let key = parse_coordinator_key(&credentials.coordinator_key)?;
    config.node_id = Some(credentials.node_id.clone());
    if config.mqtt_username.is_none() {
        config.mqtt_username = Some(credentials.mqtt_username.clone());
        config.mqtt_password = Some(credentials.mqtt_password.clone());
    }
    match config.coordinator_key {
        Some(configured) if configured != key => tracing::warn!(
            "the configured coordinator key differs from the one pinned at enrollment; using the configured one"
        ),
        Some(_) => {}
        None => config.coordinator_key = Some(key),
    }
    if config.topic_prefix != credentials.topic_prefix {
        tracing::info!(configured = %config.topic_prefix, enrolled = %credentials.topic_prefix,
            "using the topic prefix the coordinator enrolled this node under");
        config.topic_prefix = credentials.topic_prefix.clone();
    }
    config.validate()
}

/// Checks the fields a peer or a file could get wrong.
fn check(credentials: &Credentials) -> Result<(), ConfigError> {
    NodeId::new(&credentials.node_id).map_err(|source| ConfigError::NodeId {
        id: credentials.node_id.clone(),
        source,
    })?;
    parse_coordinator_key(&credentials.coordinator_key)?;
    starling_proto::Topics::new(&credentials.topic_prefix)?;
    if credentials.mqtt_username.is_empty() {
        return Err(ConfigError::Conflict(
            "the credentials hold an empty MQTT user name",
        ));
    }
    Ok(())
}

/// The `message` of a `{error, message}` body, or the body itself, cut short.
fn error_message(body: &[u8]) -> String {
    #[derive(Deserialize)]
    struct ApiError {
        message: String,
    }
    match serde_json::from_slice::<ApiError>(body) {
        Ok(error) => error.message,
        Err(_) => String::from_utf8_lossy(&body[..body.len().min(300)]).into_owned(),
    }
}

/// A request error with its cause, which reqwest's own text leaves out.
fn describe(error: &reqwest::Error) -> String {
    let mut text = error.to_string();
    let mut source = std::error::Error::source(error);
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    fn credentials(node: &str) -> Credentials {
        Credentials {
            node_id: node.to_owned(),
            mqtt_username: node.to_owned(),
            mqtt_password: "secret".to_owned(),
            coordinator_key: "11".repeat(32),
            topic_prefix: "starling/v1".to_owned(),
        }
    }

    #[test]
    fn saved_credentials_load_back_owner_only() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub").join(CREDENTIALS_FILE);
        save(&path, &credentials("pi-1")).unwrap();
        assert_eq!(load(&path).unwrap(), credentials("pi-1"));
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&path).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600);
        }
    }

    #[test]
    fn a_bad_key_in_the_file_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(CREDENTIALS_FILE);
        let mut bad = credentials("pi-1");
        bad.coordinator_key = "xyz".to_owned();
        save(&path, &bad).unwrap();
        assert!(matches!(
            load(&path),
            Err(EnrollError::ReadCredentials { .. })
        ));
    }
}
