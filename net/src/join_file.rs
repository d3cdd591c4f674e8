//! The join file, `starling.toml`: what a freshly flashed device needs to
//! join a fleet (the coordinator's URL and key, a join token, and optionally
//! a node id and broker), written by `starling image configure` into an
//! image's boot partition, by `starling-agent join` on an installed system,
//! or by hand on a flashed card, like balena's `config.json`.
//!
//! The agent reads it at every start (it is where the broker address lives),
//! uses the token once to enroll, and then removes the token from the file.
//! Every key is checked here, and an error names the key, because the person
//! who wrote it has no other feedback than one log line on a headless device.

use serde::Serialize;

/// The file's name, on a boot partition and elsewhere.
pub const FILE_NAME: &str = "starling.toml";

/// The MQTT port a broker is assumed on when only the coordinator is named:
/// the coordinator's embedded broker listens there by default (1884, beside a
/// system Mosquitto on 1883).
pub const DEFAULT_MQTT_PORT: u16 = 1884;

/// The keys a join file may hold.
const KEYS: [&str; 5] = [
    "coordinator-url",
    "coordinator-key",
    "join-token",
    "node-id",
    "broker",
];

/// A parsed, checked join file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub struct JoinFile {
    /// The coordinator's REST URL, `http://` or `https://`.
    pub coordinator_url: String,
    /// The coordinator's ed25519 public key, 64 hex digits (as
    /// `starling token create` prints it); enrollment answers are checked
    /// against it.
    pub coordinator_key: String,
    /// A join token; absent once the node has enrolled.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub join_token: Option<String>,
    /// The node id; derived from `/etc/machine-id` when absent, so devices
    /// flashed from one image never collide.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node_id: Option<String>,
    /// The MQTT broker; the coordinator's host on [`DEFAULT_MQTT_PORT`] when absent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub broker: Option<String>,
}

/// Why a join file was refused; each names the key at fault.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum JoinFileError {
    /// Not TOML, or a key the file may not hold.
    #[error("{0}")]
    Syntax(String),
    /// A key's value is unusable.
    #[error("key `{key}`: {problem}")]
    Field {
        /// The key, as written in the file.
        key: &'static str,
        /// What is wrong with it.
        problem: String,
    },
}

impl JoinFile {
    /// Parses and checks the text of a join file. The keys are read one by
    /// one rather than through serde, so that every error, a wrong type
    /// included, names its key.
    pub fn parse(text: &str) -> Result<Self, JoinFileError> {
        let table: toml::Table = text.parse().map_err(|e: toml::de::Error| {
            let line = e
                .span()
                .map(|span| text[..span.start.min(text.len())].lines().count().max(1));
            JoinFileError::Syntax(match line {
                Some(line) => format!("line {line}: {}", e.message().trim()),
                None => e.message().trim().to_owned(),
            })
        })?;
        if let Some(unknown) = table.keys().find(|k| !KEYS.contains(&k.as_str())) {
            return Err(JoinFileError::Syntax(format!(
                "unknown key `{unknown}`; the keys are {}",
                KEYS.join(", ")
            )));
        }
        let text_of = |key: &'static str| -> Result<Option<String>, JoinFileError> {
            match table.get(key) {
                None => Ok(None),
                Some(toml::Value::String(s)) => Ok(Some(s.clone())),
                Some(_) => Err(JoinFileError::Field {
                    key,
                    problem: "must be a string in double quotes".to_owned(),
                }),
            }
        };
        let required = |key: &'static str| -> Result<String, JoinFileError> {
            text_of(key)?.ok_or(JoinFileError::Field {
                key,
                problem: "is missing".to_owned(),
            })
        };
        let file = Self {
            coordinator_url: required("coordinator-url")?,
            coordinator_key: required("coordinator-key")?,
            join_token: text_of("join-token")?,
            node_id: text_of("node-id")?,
            broker: text_of("broker")?,
        };
        file.check()?;
        Ok(file)
    }

    /// Checks every key; [`JoinFile::parse`] calls it, and writers call it
    /// before writing so a file they make is one the agent accepts.
    pub fn check(&self) -> Result<(), JoinFileError> {
        let field = |key: &'static str, problem: &str| JoinFileError::Field {
            key,
            problem: problem.to_owned(),
        };
        url_host(&self.coordinator_url).ok_or_else(|| {
            field(
                "coordinator-url",
                "must be http://HOST[:PORT] or https://HOST[:PORT]",
            )
        })?;
        let key = self.coordinator_key.trim();
        if key.len() != 64 || !key.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(field(
                "coordinator-key",
                "must be 64 hex digits (the key `starling token create` prints)",
            ));
        }
        if let Some(token) = &self.join_token {
            if token.trim().is_empty() || token.chars().any(char::is_whitespace) {
                return Err(field(
                    "join-token",
                    "must be the token `starling token create` printed, without spaces",
                ));
            }
        }
        if let Some(id) = &self.node_id {
            let allowed = |c: char| c.is_ascii_alphanumeric() || c == '-' || c == '_';
            if id.is_empty() || id.len() > 64 || !id.chars().all(allowed) {
                return Err(field(
                    "node-id",
                    "must be 1 to 64 characters of A-Z, a-z, 0-9, - and _",
                ));
            }
        }
        if let Some(broker) = &self.broker {
            crate::BrokerAddress::parse(broker).map_err(|e| field("broker", &e.to_string()))?;
        }
        Ok(())
    }

    /// The broker to use: the one given, or the coordinator's host on the
    /// default MQTT port (the coordinator embeds its broker by default).
    pub fn broker_url(&self) -> String {
        match &self.broker {
            Some(broker) => broker.clone(),
            None => {
                let host = url_host(&self.coordinator_url).unwrap_or("127.0.0.1");
                format!("mqtt://{host}:{DEFAULT_MQTT_PORT}")
            }
        }
    }

    /// The file's text: a comment saying what it is, then the keys.
    pub fn render(&self) -> Result<String, JoinFileError> {
        self.check()?;
        let body = toml::to_string(self).map_err(|e| JoinFileError::Syntax(e.to_string()))?;
        Ok(format!(
            "# Starling: how this device joins its fleet. The agent reads this file at\n\
             # every start, enrolls once with the join token, then removes the token.\n\
             # Written by `starling image configure`; may be edited by hand.\n{body}"
        ))
    }
}

/// The host of an `http://` or `https://` URL (brackets kept for IPv6), or
/// `None` when the URL is not one.
fn url_host(url: &str) -> Option<&str> {
    let rest = url
        .strip_prefix("http://")
        .or_else(|| url.strip_prefix("https://"))?;
    let authority = rest.split(['/', '?', '#']).next()?;
    if authority.contains('@') {
        return None;
    }
    let host = if authority.starts_with('[') {
        let end = authority.find(']')?;
        &authority[..=end]
    } else {
        authority.split(':').next()?
    };
    (!host.is_empty() && !host.contains(char::is_whitespace)).then_some(host)
}

/// The join file's settings as command-line flags, for every tool that
/// writes one (`starling-agent join`, `starling image configure`), so the
/// flags and their help are defined once.
#[cfg(feature = "clap")]
#[derive(Debug, Clone, clap::Args)]
pub struct JoinArgs {
    /// The coordinator's REST URL, as the device reaches it.
    #[arg(long, value_name = "URL")]
    pub coordinator_url: String,
    /// A join token from `starling token create`.
    #[arg(long, value_name = "TOKEN")]
    pub join_token: String,
    /// The coordinator's ed25519 public key, 64 hex digits (`starling token create` prints it).
    #[arg(long, value_name = "HEX")]
    pub coordinator_key: String,
    /// The node id [default: derived from the host name and /etc/machine-id].
    #[arg(long, value_name = "ID")]
    pub node_id: Option<String>,
    /// The MQTT broker [default: the coordinator's host, port 1884].
    #[arg(long, value_name = "URL")]
    pub broker: Option<String>,
}

#[cfg(feature = "clap")]
impl JoinArgs {
    /// The join file these flags describe (not yet checked: `render` checks).
    pub fn to_join_file(&self) -> JoinFile {
        JoinFile {
            coordinator_url: self.coordinator_url.clone(),
            coordinator_key: self.coordinator_key.clone(),
            join_token: Some(self.join_token.clone()),
            node_id: self.node_id.clone(),
            broker: self.broker.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    fn sample() -> JoinFile {
        JoinFile {
            coordinator_url: "http://10.0.0.2:8080".into(),
            coordinator_key: KEY.into(),
            join_token: Some("stj_abc".into()),
            node_id: None,
            broker: None,
        }
    }

    #[test]
    fn a_rendered_file_parses_back_to_the_same_settings() {
        let file = JoinFile {
            node_id: Some("pi-7".into()),
            broker: Some("mqtt://10.0.0.3:1884".into()),
            ..sample()
        };
        let text = file.render().unwrap();
        assert!(text.starts_with("# Starling"));
        assert_eq!(JoinFile::parse(&text).unwrap(), file);
    }

    #[test]
    fn the_broker_defaults_to_the_coordinators_host() {
        assert_eq!(sample().broker_url(), "mqtt://10.0.0.2:1884");
        let v6 = JoinFile {
            coordinator_url: "https://[fd00::2]:8443/".into(),
            ..sample()
        };
        assert_eq!(v6.broker_url(), "mqtt://[fd00::2]:1884");
    }

    #[test]
    fn each_bad_key_is_named() {
        let cases = [
            ("coordinator-url = \"ftp://x\"", "coordinator-url"),
            ("coordinator-url = \"http://u:p@x\"", "coordinator-url"),
            ("coordinator-key = \"abc\"", "coordinator-key"),
            ("join-token = \"two words\"", "join-token"),
            ("node-id = \"a.b\"", "node-id"),
            ("broker = \"mqtt://\"", "broker"),
            ("coordinator-url = 5", "coordinator-url"),
            ("node-id = [\"a\"]", "node-id"),
        ];
        for (line, key) in cases {
            let key_name = line.split(' ').next().unwrap();
            let mut text = format!(
                "coordinator-url = \"http://10.0.0.2:8080\"\ncoordinator-key = \"{KEY}\"\n"
            );
            // The line under test replaces a good one or is added.
            text = text
                .lines()
                .filter(|l| !l.starts_with(key_name))
                .map(|l| format!("{l}\n"))
                .collect();
            text.push_str(line);
            let error = JoinFile::parse(&text).unwrap_err();
            assert!(error.to_string().contains(key), "{line}: {error}");
        }
    }

    #[test]
    fn unknown_and_missing_keys_are_named() {
        let unknown = format!(
            "coordinator-url = \"http://x\"\ncoordinator-key = \"{KEY}\"\njoin-tokn = \"t\"\n"
        );
        assert!(JoinFile::parse(&unknown)
            .unwrap_err()
            .to_string()
            .contains("join-tokn"));
        let missing = "coordinator-url = \"http://x\"\n";
        assert!(JoinFile::parse(missing)
            .unwrap_err()
            .to_string()
            .contains("coordinator-key"));
        assert!(JoinFile::parse("not toml at all").is_err());
    }
}
