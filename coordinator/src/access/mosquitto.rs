//! The files Mosquitto authenticates and confines nodes with: a password
//! file (`$7$` PBKDF2-SHA512 lines), an ACL that confines each node to its
//! own topics, and the settings that bind client ids to logins and bound
//! sizes and queues; and how Mosquitto is told to reread them.

use std::path::{Path, PathBuf};

use super::AccessError;
use crate::store::access::NodeCredentialRow;

/// How Mosquitto is told to reread its files after a rewrite.
#[derive(Debug, Clone, Default)]
pub enum Reload {
    /// The operator reloads it.
    #[default]
    Manual,
    /// SIGHUP to the pid in this file (Mosquitto's `pid_file`).
    PidFile(PathBuf),
    /// SIGHUP to the coordinator's own broker child (0 while it restarts:
    /// it reads the files when it starts).
    Pid(std::sync::Arc<std::sync::atomic::AtomicU32>),
}

/// The password file, ACL and settings of a Mosquitto: the coordinator's own
/// broker, or an operator's. Rewritten whenever the set of enrolled nodes
/// changes, through the coordinator's one `MosquittoWriter`.
#[derive(Debug, Clone)]
pub struct MosquittoFiles {
    /// Where `passwd`, `acl` and `starling.conf` are written.
    pub dir: PathBuf,
    /// How Mosquitto rereads them.
    pub reload: Reload,
    /// The coordinator's own Mosquitto user.
    pub username: String,
    /// Its `$7$` hash line (computed once at start).
    pub password_hash: String,
    /// The topic prefix the ACL confines nodes under.
    pub topic_prefix: String,
    /// Development only: clients without a login may connect, and may use
    /// every topic under the prefix.
    pub allow_anonymous: bool,
}

/// Headroom over [`starling_proto::limits::MAX_MESSAGE_BYTES`] for the MQTT
/// packet's own header and topic name.
pub const PACKET_HEADROOM_BYTES: usize = 64 * 1024;

/// The largest MQTT packet the broker accepts from anyone and the
/// coordinator's client reads: Mosquitto's `max_packet_size`, so a larger
/// publish is refused at the broker and never reaches (or stalls) ingest.
pub const MAX_PACKET_BYTES: usize =
    starling_proto::limits::MAX_MESSAGE_BYTES + PACKET_HEADROOM_BYTES;

/// Messages Mosquitto queues for one client beyond those in flight, and the
/// bytes they may hold: a client that stops reading costs the broker at most
/// [`MOSQUITTO_MAX_QUEUED_BYTES`]. Assignments are the only large messages a
/// node receives. The count is high because the coordinator is a client
/// too, and it receives every node's reports: a burst from a fleet (a
/// round's events) must wait for it, not be dropped (at 100, bursts of a
/// few hundred events were, and a node that does not re-send lost them).
/// Its reports are small, so the bytes bound is what limits a client.
pub const MOSQUITTO_MAX_QUEUED_MESSAGES: usize = 10_000;
/// See [`MOSQUITTO_MAX_QUEUED_MESSAGES`].
pub const MOSQUITTO_MAX_QUEUED_BYTES: usize = 4 * MAX_PACKET_BYTES;

impl MosquittoFiles {
    /// The password file's path.
    pub fn passwd_path(&self) -> PathBuf {
        self.dir.join("passwd")
    }

    /// The ACL file's path.
    pub fn acl_path(&self) -> PathBuf {
        self.dir.join("acl")
    }

    /// The settings file's path: the part of a Mosquitto configuration the
    /// confinement depends on, for an operator's `include_dir`.
    pub fn settings_path(&self) -> PathBuf {
        self.dir.join("starling.conf")
    }

    /// The password file's text: the coordinator, then every node not revoked.
    pub fn passwd_text(&self, nodes: &[NodeCredentialRow]) -> String {
        let mut text = format!("{}:{}\n", self.username, self.password_hash);
        for node in nodes.iter().filter(|node| node.revoked_ms.is_none()) {
            text.push_str(&format!("{}:{}\n", node.node_id, node.mosquitto_hash));
        }
        text
    }

    /// The ACL's text. Patterns come first because Mosquitto applies them to
    /// every user; `%u` is the user name, which is the node id (and, with
    /// `use_username_as_clientid`, the client id). Mosquitto checks read
    /// access again at delivery, so a node subscribed to `#` receives only
    /// its own orders.
    pub fn acl_text(&self) -> String {
        let prefix = &self.topic_prefix;
        let mut text = String::from(
            "# Written by starling-coordinator; it is rewritten on every enrollment and revocation.\n",
        );
        if self.allow_anonymous {
            // Lines before the first `user` line apply to anonymous clients.
            text.push_str(&format!(
                "# Development only (--mqtt-allow-anonymous): clients without a login use every topic.\n\
                 topic readwrite {prefix}/#\n\n"
            ));
        }
        text.push_str(
            "# Each node writes its own reports and reads its own orders, nothing else.\n",
        );
        for channel in ["capability", "telemetry", "status", "events"] {
            text.push_str(&format!("pattern write {prefix}/nodes/%u/{channel}\n"));
        }
        for channel in ["assign", "cancel", "ack"] {
            text.push_str(&format!("pattern read {prefix}/nodes/%u/{channel}\n"));
        }
        text.push_str(&format!(
            "\nuser {}\ntopic readwrite {prefix}/#\n",
            self.username
        ));
        text
    }

    /// The global settings Starling's confinement depends on, whoever runs
    /// the broker: logins from the password file, topics from the ACL, a
    /// packet size cap (a larger publish is refused at the broker,
    /// retained or not, and never reaches ingest), and bounded queues.
    pub fn settings_text(&self) -> String {
        format!(
            "# Written by starling-coordinator; the settings node confinement depends on.\n\
             # Put `use_username_as_clientid true` in each listener block too.\n\
             allow_anonymous {anonymous}\n\
             password_file {passwd}\n\
             acl_file {acl}\n\
             max_packet_size {packet}\n\
             max_inflight_messages 20\n\
             max_queued_messages {queued}\n\
             max_queued_bytes {queued_bytes}\n",
            anonymous = self.allow_anonymous,
            passwd = self.passwd_path().display(),
            acl = self.acl_path().display(),
            packet = MAX_PACKET_BYTES,
            queued = MOSQUITTO_MAX_QUEUED_MESSAGES,
            queued_bytes = MOSQUITTO_MAX_QUEUED_BYTES,
        )
    }

    /// The settings Mosquitto takes per listener, for every listener nodes
    /// use: the client id bound to the login, so no client can take over
    /// another's session. (Outside a listener block Mosquitto opens a
    /// default listener for it.)
    pub fn listener_settings_text(&self) -> String {
        // Mosquitto refuses every client without a login when client ids are
        // bound to logins, so development mode cannot bind them.
        format!("use_username_as_clientid {}\n", !self.allow_anonymous)
    }

    /// Creates the directory (mode 0700) if it is missing.
    pub fn create_dir(&self) -> Result<(), AccessError> {
        let error = |source| AccessError::Write {
            path: self.dir.clone(),
            source,
        };
        std::fs::create_dir_all(&self.dir).map_err(error)?;
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt as _;
            std::fs::set_permissions(&self.dir, std::fs::Permissions::from_mode(0o700))
                .map_err(error)?;
        }
        Ok(())
    }

    /// Writes the three files atomically (write beside, then rename) with
    /// mode 0600, and has Mosquitto reload them: it then drops the sessions
    /// of nodes no longer in the password file. Two writes of one directory
    /// must not overlap (they share the temporary files): the coordinator
    /// writes once at start, then only through its `MosquittoWriter`, which
    /// also makes sure Mosquitto acted on the signal.
    pub fn write(&self, nodes: &[NodeCredentialRow]) -> Result<(), AccessError> {
        self.write_files(nodes)?;
        self.signal().map(|_| ())
    }

    /// Writes the three files as [`MosquittoFiles::write`] does, without
    /// signalling Mosquitto. The password file is left with an access time
    /// of [`UNREAD`], so [`MosquittoFiles::reread_since_written`] can tell
    /// when Mosquitto has read it.
    pub(crate) fn write_files(&self, nodes: &[NodeCredentialRow]) -> Result<(), AccessError> {
        self.create_dir()?;
        write_beside(&self.passwd_path(), &self.passwd_text(nodes), true)?;
        write_atomically(&self.acl_path(), &self.acl_text())?;
        write_atomically(&self.settings_path(), &self.settings_text())
    }

    /// Whether the password file was read since [`MosquittoFiles::write_files`]
    /// wrote it: its access time moved off [`UNREAD`]. Mosquitto reads it
    /// when it reloads, and applies it (dropping revoked nodes' sessions)
    /// in the same turn of its single-threaded loop, so a login it handles
    /// after that is checked against the new file. Any other reader of the
    /// file counts too, so nothing else should read it.
    pub(crate) fn reread_since_written(&self) -> bool {
        std::fs::metadata(self.passwd_path())
            .and_then(|metadata| metadata.accessed())
            .is_ok_and(|accessed| accessed != UNREAD)
    }

    /// Whether reading a file in the directory moves its access time (not
    /// on a `noatime` mount, or where access times are not kept), which
    /// [`MosquittoFiles::reread_since_written`] depends on. Probes with the
    /// password file's temporary name, so it must not overlap a write.
    pub(crate) fn access_times_work(&self) -> bool {
        let probe = self.passwd_path().with_extension("tmp");
        let read_moves_access_time = || -> std::io::Result<bool> {
            std::fs::write(&probe, "probe\n")?;
            std::fs::File::options()
                .write(true)
                .open(&probe)?
                .set_times(std::fs::FileTimes::new().set_accessed(UNREAD))?;
            std::fs::read(&probe)?;
            Ok(std::fs::metadata(&probe)?.accessed()? != UNREAD)
        };
        let works = read_moves_access_time().unwrap_or(false);
        let _ = std::fs::remove_file(&probe);
        works
    }

    /// SIGHUP to Mosquitto: it rereads its password file and ACL. False
    /// when no signal was sent: the operator reloads it, or no Mosquitto
    /// runs yet (it reads the files when it starts).
    pub(crate) fn signal(&self) -> Result<bool, AccessError> {
        let pid = match &self.reload {
            Reload::Manual => return Ok(false),
            Reload::Pid(pid) => match pid.load(std::sync::atomic::Ordering::Acquire) {
                // Between runs: the next one reads the files when it starts.
                0 => return Ok(false),
                pid => pid,
            },
            Reload::PidFile(pid_file) => {
                let text = match std::fs::read_to_string(pid_file) {
                    Ok(text) => text,
                    // Mosquitto not started yet: it reads the files when it starts.
                    Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(false),
                    Err(error) => {
                        return Err(AccessError::Reload {
                            detail: format!("{}: {error}", pid_file.display()),
                        })
                    }
                };
                text.trim().parse().map_err(|_| AccessError::Reload {
                    detail: format!("{} holds no pid", pid_file.display()),
                })?
            }
        };
        // `kill` rather than libc: the workspace forbids unsafe code.
        let status = std::process::Command::new("kill")
            .arg("-HUP")
            .arg(pid.to_string())
            .status()
            .map_err(|error| AccessError::Reload {
                detail: format!("cannot run kill: {error}"),
            })?;
        if status.success() {
            Ok(true)
        } else {
            Err(AccessError::Reload {
                detail: format!("kill -HUP {pid} failed ({status})"),
            })
        }
    }
}

/// The access time the password file is written with: a read moves it
/// (where access times are kept), since it is older than the file's
/// modification time.
pub(crate) const UNREAD: std::time::SystemTime = std::time::SystemTime::UNIX_EPOCH;

/// Writes `text` to `path` atomically (beside, then rename), mode 0600.
pub(crate) fn write_atomically(path: &Path, text: &str) -> Result<(), AccessError> {
    write_beside(path, text, false)
}

/// [`write_atomically`], with the access time set to [`UNREAD`] when
/// `unread`.
fn write_beside(path: &Path, text: &str, unread: bool) -> Result<(), AccessError> {
    use std::io::Write as _;
    let error = |source| AccessError::Write {
        path: path.to_path_buf(),
        source,
    };
    let temporary = path.with_extension("tmp");
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt as _;
        options.mode(0o600);
    }
    let mut file = options.open(&temporary).map_err(error)?;
    file.write_all(text.as_bytes()).map_err(error)?;
    if unread {
        file.set_times(std::fs::FileTimes::new().set_accessed(UNREAD))
            .map_err(error)?;
    }
    file.sync_all().map_err(error)?;
    drop(file);
    std::fs::rename(&temporary, path).map_err(error)
}
