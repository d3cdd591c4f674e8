//! First boot: the agent finds its join file (`starling.toml`, see
//! [`starling_net::join_file`]) on the boot partition or in its state
//! directory, enrolls with the token in it, and then removes the token from
//! the file, so a card taken out of a device no longer carries a secret.
//!
//! The packaged unit names the places to look (`--join-file`, first found
//! wins). Without a file and without credentials the agent waits, saying once
//! what it needs; a bad file gets one log line naming the key at fault, and
//! the agent waits for the file to change.
//!
//! The agent itself never writes the boot partition: it holds the kernel and
//! the firmware, and an agent that could rewrite them could own the device on
//! its next boot. Before the agent starts, the unit runs [`import`] as root:
//! it copies a join file that carries a token into the state directory (mode
//! 0600, the agent's user) and removes the token from the boot partition.

use std::path::{Path, PathBuf};
use std::time::Duration;

use starling_net::{JoinFile, JoinFileError};

use crate::config::{parse_coordinator_key, ConfigError, ConfigLayer};

/// How often a waiting agent looks for its join file again.
pub const POLL_INTERVAL: Duration = Duration::from_secs(2);

/// Why a join file could not be used or written.
#[derive(Debug, thiserror::Error)]
pub enum JoinError {
    /// The file exists but cannot be read.
    #[error("cannot read the join file {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// The file is not a usable join file.
    #[error("the join file {path} is invalid: {source}")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// What is wrong, naming the key.
        source: JoinFileError,
    },
    /// The file could not be written (token removal, or `starling-agent join`).
    #[error("cannot write the join file {path}: {source}")]
    Write {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
}

/// What is at the join file locations right now.
#[derive(Debug)]
pub enum Lookup {
    /// None of the paths holds a file.
    Absent,
    /// The first file found, parsed.
    Found {
        /// Where it is.
        path: PathBuf,
        /// What it says.
        file: JoinFile,
    },
    /// The first file found is unreadable or invalid.
    Bad(JoinError),
}

/// Looks at `paths` in order and reads the first file that exists.
pub fn look(paths: &[PathBuf]) -> Lookup {
    let Some(path) = paths.iter().find(|p| p.exists()) else {
        return Lookup::Absent;
    };
    match read(path) {
        Ok(file) => Lookup::Found {
            path: path.clone(),
            file,
        },
        Err(error) => Lookup::Bad(error),
    }
}

/// Reads and checks one join file.
pub fn read(path: &Path) -> Result<JoinFile, JoinError> {
    let text = std::fs::read_to_string(path).map_err(|source| JoinError::Read {
        path: path.to_owned(),
        source,
    })?;
    JoinFile::parse(&text).map_err(|source| JoinError::Invalid {
        path: path.to_owned(),
        source,
    })
}

/// Waits until one of `paths` holds a valid join file, looking `every` so
/// often ([`POLL_INTERVAL`] in the agent), logging once what is missing and
/// once for each distinct problem, and returns it.
pub async fn wait(paths: &[PathBuf], every: Duration) -> (PathBuf, JoinFile) {
    let mut said: Option<String> = None;
    loop {
        let message = match look(paths) {
            Lookup::Found { path, file } => return (path, file),
            Lookup::Absent => format!(
                "not enrolled and no join file: waiting for {} (keys coordinator-url, coordinator-key, join-token); write it with `starling image configure` before flashing, or `starling-agent join` on this device",
                paths
                    .iter()
                    .map(|p| p.display().to_string())
                    .collect::<Vec<_>>()
                    .join(" or ")
            ),
            Lookup::Bad(error) => format!("{error}; waiting for it to be fixed"),
        };
        if said.as_deref() != Some(message.as_str()) {
            tracing::warn!("{message}");
            said = Some(message);
        }
        tokio::time::sleep(every).await;
    }
}

/// The settings a join file gives, as a config layer (below flags and
/// environment, above the config file). The token is included here, unlike
/// in the config file: this file exists to carry it once.
pub fn layer(file: &JoinFile) -> Result<ConfigLayer, ConfigError> {
    Ok(ConfigLayer {
        broker: Some(file.broker_url()),
        node_id: file.node_id.clone(),
        coordinator_url: Some(file.coordinator_url.clone()),
        coordinator_key: Some(parse_coordinator_key(file.coordinator_key.trim())?),
        join_token: file.join_token.clone(),
        ..ConfigLayer::default()
    })
}

/// Rewrites the join file at `path` without its `join-token` key, keeping
/// everything else as written (comments included). The new text goes to a
/// file beside it, then replaces it by rename, so a power cut leaves either
/// the old file or the new one (FAT renames within a directory too).
pub fn remove_token(path: &Path) -> Result<bool, JoinError> {
    let text = std::fs::read_to_string(path).map_err(|source| JoinError::Read {
        path: path.to_owned(),
        source,
    })?;
    let mut document: toml_edit::DocumentMut =
        text.parse()
            .map_err(|e: toml_edit::TomlError| JoinError::Invalid {
                path: path.to_owned(),
                source: JoinFileError::Syntax(e.message().to_owned()),
            })?;
    if document.remove("join-token").is_none() {
        return Ok(false);
    }
    replace(path, &document.to_string(), None)?;
    Ok(true)
}

/// What [`import`] found and did.
#[derive(Debug, PartialEq, Eq)]
pub enum Imported {
    /// None of the paths holds a file.
    Absent,
    /// The first file found carries no token: nothing to move (it was
    /// imported before, or only gives settings).
    NoToken(PathBuf),
    /// The file at `from` was copied into the state and its token removed.
    Moved {
        /// The boot partition's file, now without its token.
        from: PathBuf,
    },
}

/// Moves the first join file among `sources` that carries a token into
/// `into` (written atomically, mode 0600, given to `owner`), then removes the
/// token from the source. Copy first, remove second: a failure in between
/// leaves the token in both places, never in neither. A bad file is an error
/// naming the key and is left as it is, for the agent to report too.
pub fn import(
    sources: &[PathBuf],
    into: &Path,
    owner: Option<(u32, u32)>,
) -> Result<Imported, JoinError> {
    let (from, file) = match look(sources) {
        Lookup::Absent => return Ok(Imported::Absent),
        Lookup::Bad(error) => return Err(error),
        Lookup::Found { path, file } => (path, file),
    };
    if file.join_token.is_none() {
        return Ok(Imported::NoToken(from));
    }
    // The text as written, comments included, not a re-rendering.
    let text = std::fs::read_to_string(&from).map_err(|source| JoinError::Read {
        path: from.clone(),
        source,
    })?;
    replace(into, &text, owner)?;
    remove_token(&from)?;
    Ok(Imported::Moved { from })
}

/// Writes `text` to `path` atomically with mode 0600 and, when `owner` is
/// given, that owner (uid, gid): `starling-agent join` and `import-join-file`
/// run as root and hand the file to the agent's user, in a directory that
/// user controls ([`private_file::write_owned`] says why that is safe).
///
/// [`private_file::write_owned`]: crate::private_file::write_owned
pub fn replace(path: &Path, text: &str, owner: Option<(u32, u32)>) -> Result<(), JoinError> {
    crate::private_file::write_owned(path, text.as_bytes(), owner).map_err(|source| {
        JoinError::Write {
            path: path.to_owned(),
            source,
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    fn good(token: bool) -> String {
        let mut text = format!(
            "# written by hand\ncoordinator-url = \"http://10.0.0.2:8080\"\ncoordinator-key = \"{KEY}\"\n"
        );
        if token {
            text.push_str("join-token = \"stj_secret\"\n");
        }
        text
    }

    #[test]
    fn the_first_existing_path_wins_and_absence_is_reported() {
        let dir = tempfile::tempdir().unwrap();
        let a = dir.path().join("a.toml");
        let b = dir.path().join("b.toml");
        assert!(matches!(look(&[a.clone(), b.clone()]), Lookup::Absent));
        std::fs::write(&b, good(true)).unwrap();
        match look(&[a.clone(), b.clone()]) {
            Lookup::Found { path, file } => {
                assert_eq!(path, b);
                assert_eq!(file.join_token.as_deref(), Some("stj_secret"));
            }
            other => panic!("{other:?}"),
        }
        std::fs::write(&a, "coordinator-url = 5\n").unwrap();
        match look(&[a.clone(), b]) {
            Lookup::Bad(error) => assert!(error.to_string().contains("coordinator-url")),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn the_layer_carries_the_token_and_a_broker_on_the_coordinators_host() {
        let file = JoinFile::parse(&good(true)).unwrap();
        let layer = layer(&file).unwrap();
        assert_eq!(layer.join_token.as_deref(), Some("stj_secret"));
        assert_eq!(layer.broker.as_deref(), Some("mqtt://10.0.0.2:1884"));
        assert_eq!(layer.coordinator_key.map(hex::encode).as_deref(), Some(KEY));
    }

    #[test]
    fn removing_the_token_keeps_the_rest_and_leaves_no_secret() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("starling.toml");
        std::fs::write(&path, good(true)).unwrap();
        assert!(remove_token(&path).unwrap());
        let after = std::fs::read_to_string(&path).unwrap();
        assert!(!after.contains("stj_secret"), "{after}");
        assert!(after.contains("# written by hand"));
        let file = JoinFile::parse(&after).unwrap();
        assert_eq!(file.join_token, None);
        assert_eq!(file.coordinator_url, "http://10.0.0.2:8080");
        // Nothing left behind beside it, and a second removal is a no-op.
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
        assert!(!remove_token(&path).unwrap());
    }

    #[test]
    fn import_moves_the_token_into_the_state_and_off_the_boot_partition() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let boot = dir.path().join("boot.toml");
        let absent = dir.path().join("absent.toml");
        let state = dir.path().join("state/join.toml");
        std::fs::create_dir(dir.path().join("state")).unwrap();
        let sources = [absent.clone(), boot.clone()];
        assert_eq!(import(&sources, &state, None).unwrap(), Imported::Absent);

        std::fs::write(&boot, good(true)).unwrap();
        assert_eq!(
            import(&sources, &state, None).unwrap(),
            Imported::Moved { from: boot.clone() }
        );
        let moved = std::fs::read_to_string(&state).unwrap();
        assert_eq!(moved, good(true), "copied as written, comments included");
        let mode = std::fs::metadata(&state).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        let left = std::fs::read_to_string(&boot).unwrap();
        assert!(!left.contains("stj_secret"), "{left}");
        assert!(left.contains("coordinator-url"));

        // A second start finds no token: the state keeps the one it has.
        assert_eq!(
            import(&sources, &state, None).unwrap(),
            Imported::NoToken(boot.clone())
        );
        assert_eq!(std::fs::read_to_string(&state).unwrap(), good(true));
    }

    #[test]
    fn import_refuses_a_bad_file_by_its_key_and_touches_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let boot = dir.path().join("boot.toml");
        let state = dir.path().join("join.toml");
        let bad = "coordinator-url = \"http://10.0.0.2:8080\"\ncoordinator-key = \"short\"\njoin-token = \"stj_secret\"\n";
        std::fs::write(&boot, bad).unwrap();
        let error = import(std::slice::from_ref(&boot), &state, None).unwrap_err();
        assert!(error.to_string().contains("coordinator-key"), "{error}");
        assert_eq!(std::fs::read_to_string(&boot).unwrap(), bad);
        assert!(!state.exists());
    }

    #[tokio::test]
    async fn waiting_ends_when_a_good_file_appears() {
        let every = Duration::from_millis(20);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("starling.toml");
        std::fs::write(&path, "coordinator-key = \"short\"\n").unwrap();
        let paths = vec![path.clone()];
        let waiting = tokio::spawn(async move { wait(&paths, every).await });
        tokio::time::sleep(every * 5).await;
        assert!(!waiting.is_finished(), "a bad file must not end the wait");
        std::fs::write(&path, good(true)).unwrap();
        let (found, file) = waiting.await.unwrap();
        assert_eq!(found, path);
        assert_eq!(file.join_token.as_deref(), Some("stj_secret"));
    }
}
