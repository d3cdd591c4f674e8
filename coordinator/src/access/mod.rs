//! Who may do what: REST roles and bearer tokens, join tokens, nodes' MQTT
//! credentials, and the files Mosquitto authenticates and confines them with.
//!
//! Every secret the coordinator hands out (API token, join token, MQTT
//! password) is 32 random bytes shown once; the store keeps only its sha256,
//! so the database lets nobody in. Lookups compare hashes in constant time.
//!
//! [`MosquittoFiles`] (`mosquitto`) writes a password file (`$7$`
//! PBKDF2-SHA512 lines), an ACL that confines each node to its own topics,
//! and the settings that bind client ids to logins and bound sizes and
//! queues, then signals Mosquitto to reload them: the coordinator's own
//! broker (`mqtt::broker`) or an operator's. [`MosquittoWriter`] (`rewrite`)
//! lets one rewrite cover every enrollment and revocation that arrived while
//! the previous one ran. Ingest asks [`MqttAccess`] whether a message comes
//! from a revoked node, and for the key its reports must be signed with.

mod mosquitto;
mod rewrite;

pub(crate) use mosquitto::write_atomically;
pub use mosquitto::{
    MosquittoFiles, Reload, MAX_PACKET_BYTES, MOSQUITTO_MAX_QUEUED_BYTES,
    MOSQUITTO_MAX_QUEUED_MESSAGES, PACKET_HEADROOM_BYTES,
};
pub use rewrite::{MosquittoWriter, REWRITE_WAIT};

use std::path::PathBuf;
use std::sync::RwLock;

use base64::Engine as _;
use sha2::{Digest as _, Sha256, Sha512};

use crate::store::access::{NewCredentials, NodeCredentialRow};
use crate::store::{Store, StoreError};

/// Prefix of REST API tokens, so a leaked one is recognisable in logs and scanners.
pub const API_TOKEN_PREFIX: &str = "stk_";
/// Prefix of join tokens.
pub const JOIN_TOKEN_PREFIX: &str = "sjt_";
/// Random bytes in every secret.
pub const SECRET_BYTES: usize = 32;
/// PBKDF2 rounds of a Mosquitto `$7$` hash: what `mosquitto_passwd` writes.
/// The passwords are 256-bit random strings, so the rounds are not what
/// protects them.
pub const MOSQUITTO_PBKDF2_ROUNDS: u32 = 101;
/// Salt length of a Mosquitto `$7$` hash, as `mosquitto_passwd` writes it.
const MOSQUITTO_SALT_BYTES: usize = 12;
/// The user name of the coordinator's own MQTT connection to the embedded
/// broker (a node may not enroll under it).
pub const INTERNAL_MQTT_USER: &str = "starling-coordinator";

/// Why an access operation failed.
#[derive(Debug, thiserror::Error)]
pub enum AccessError {
    /// The operating system gave no random bytes.
    #[error("cannot draw random bytes for a secret: {0}")]
    Random(String),
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A Mosquitto file could not be written.
    #[error("cannot write {path}: {source}; check --mosquitto-auth-dir")]
    Write {
        /// The file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// A node's report key is unusable.
    #[error(transparent)]
    ReportKey(ReportKeyError),
    /// Mosquitto could not be told to reload its files.
    #[error("cannot signal Mosquitto to reload ({detail}); check --mosquitto-pid-file")]
    Reload {
        /// What went wrong.
        detail: String,
    },
    /// No rewrite of the Mosquitto files covered a change within the wait
    /// ([`REWRITE_WAIT`]): one is stuck on the disk or the signal.
    #[error("Mosquitto's password file was not rewritten within {waited:?}; the change is stored and the next rewrite applies it; check the disk under --mosquitto-auth-dir")]
    RewriteTimedOut {
        /// How long the change waited.
        waited: std::time::Duration,
    },
    /// A rewrite of the Mosquitto files stopped before it finished (it
    /// panicked, or the coordinator is shutting down).
    #[error("the rewrite of Mosquitto's files stopped ({detail}); the change is stored and the next rewrite applies it")]
    RewriteStopped {
        /// What stopped it.
        detail: String,
    },
}

/// A fresh secret: `prefix` and 32 random bytes in unpadded base64url.
pub fn new_secret(prefix: &str) -> Result<String, AccessError> {
    let mut bytes = [0u8; SECRET_BYTES];
    getrandom::fill(&mut bytes).map_err(|error| AccessError::Random(error.to_string()))?;
    Ok(format!(
        "{prefix}{}",
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
    ))
}

/// The sha256 of a secret, as 64 hex digits: what the store keeps.
pub fn sha256_hex(secret: &str) -> String {
    hex::encode(Sha256::digest(secret.as_bytes()))
}

/// Compares two byte strings without an early exit, so response times do not
/// leak how much of a guess was right.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// A Mosquitto `$7$` password hash (PBKDF2-SHA512, the format of
/// `mosquitto_passwd` in Mosquitto 2) of `password` with `salt`.
pub fn mosquitto_hash_with_salt(password: &str, salt: &[u8]) -> String {
    let mut derived = [0u8; 64];
    pbkdf2::pbkdf2_hmac::<Sha512>(
        password.as_bytes(),
        salt,
        MOSQUITTO_PBKDF2_ROUNDS,
        &mut derived,
    );
    let b64 = base64::engine::general_purpose::STANDARD;
    format!(
        "$7${MOSQUITTO_PBKDF2_ROUNDS}${}${}",
        b64.encode(salt),
        b64.encode(derived)
    )
}

/// A Mosquitto `$7$` password hash of `password` with a fresh random salt.
pub fn mosquitto_hash(password: &str) -> Result<String, AccessError> {
    let mut salt = [0u8; MOSQUITTO_SALT_BYTES];
    getrandom::fill(&mut salt).map_err(|error| AccessError::Random(error.to_string()))?;
    Ok(mosquitto_hash_with_salt(password, &salt))
}

/// The hashes stored for a new MQTT password.
#[derive(Debug, Clone)]
pub struct PasswordHashes {
    /// sha256 of the password, hex.
    pub sha256: String,
    /// The Mosquitto `$7$` line.
    pub mosquitto: String,
}

impl PasswordHashes {
    /// What the store keeps for a node with these hashes and `report_key`.
    pub fn for_node<'a>(&'a self, report_key: &'a str) -> NewCredentials<'a> {
        NewCredentials {
            password_sha256: &self.sha256,
            mosquitto_hash: &self.mosquitto,
            report_key,
        }
    }
}

/// Draws a node password and its hashes.
pub fn new_node_password() -> Result<(String, PasswordHashes), AccessError> {
    let password = new_secret("")?;
    let hashes = PasswordHashes {
        sha256: sha256_hex(&password),
        mosquitto: mosquitto_hash(&password)?,
    };
    Ok((password, hashes))
}

/// Which nodes are revoked, and the coordinator's own MQTT user: an
/// in-memory copy of the store's node credentials, filled at start and
/// updated node by node after each enrollment and revocation. The broker
/// checks logins itself (from [`MosquittoFiles`]); ingest asks this whether
/// a message's node is revoked.
#[derive(Debug)]
pub struct MqttAccess {
    internal_user: String,
    revoked: RwLock<std::collections::HashSet<String>>,
    /// Each enrolled node's report key, by node id; a node enrolled before
    /// reports were signed has none.
    report_keys: RwLock<std::collections::HashMap<String, [u8; 32]>>,
    /// When each node this process did not know was last looked up in the
    /// store, and how many lookups the current second has had.
    lookups: std::sync::Mutex<Lookups>,
}

/// The budget of store lookups for nodes a process has not cached.
#[derive(Debug, Default)]
struct Lookups {
    /// Node id → when it was last looked up (Unix ms).
    last: std::collections::HashMap<String, u64>,
    /// The second (Unix ms / 1000) `in_second` counts.
    second: u64,
    in_second: u32,
}

/// At most one store lookup per unknown node per this long (ms).
const LOOKUP_EVERY_MS: u64 = 1_000;

/// At most this many lookups of unknown nodes a second, whatever the
/// number of node ids messages name (a development broker lets anyone
/// publish under any id).
const LOOKUPS_PER_SECOND: u32 = 100;

/// Most nodes remembered as looked up; beyond it the memory starts over.
const LOOKUPS_REMEMBERED: usize = 100_000;

impl MqttAccess {
    /// Access for a coordinator whose own connection uses `internal_user`.
    pub fn new(internal_user: &str) -> Self {
        Self {
            internal_user: internal_user.to_string(),
            revoked: RwLock::new(std::collections::HashSet::new()),
            report_keys: RwLock::new(std::collections::HashMap::new()),
            lookups: std::sync::Mutex::new(Lookups::default()),
        }
    }

    /// Whether `name` is the coordinator's own MQTT user, which no node may take.
    pub fn is_internal_user(&self, name: &str) -> bool {
        name == self.internal_user
    }

    /// Whether `node_id` was enrolled and then revoked.
    pub fn is_revoked(&self, node_id: &str) -> bool {
        self.revoked
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .contains(node_id)
    }

    /// The key `node_id`'s reports must be signed with, if it has one.
    pub fn report_key(&self, node_id: &str) -> Option<[u8; 32]> {
        self.report_keys
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(node_id)
            .copied()
    }

    /// Whether the cache has `node_id`: with a report key, or revoked.
    pub fn knows(&self, node_id: &str) -> bool {
        self.report_key(node_id).is_some() || self.is_revoked(node_id)
    }

    /// Adds or replaces one node's cached credentials.
    pub fn learn(&self, row: &NodeCredentialRow) {
        let mut revoked = self
            .revoked
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if row.revoked_ms.is_some() {
            revoked.insert(row.node_id.clone());
        } else {
            revoked.remove(&row.node_id);
        }
        let mut keys = self
            .report_keys
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        match row.report_key.as_deref() {
            // As in `replace`: an unusable key verifies nothing.
            Some(key) => {
                keys.insert(
                    row.node_id.clone(),
                    parse_report_key(key).unwrap_or([0; 32]),
                );
            }
            None => {
                keys.remove(&row.node_id);
            }
        }
    }

    /// Whether `node_id`, not cached, may be looked up in the store at
    /// `now_ms` (once a second per node, [`LOOKUPS_PER_SECOND`] in all).
    fn may_look_up(&self, node_id: &str, now_ms: u64) -> bool {
        let mut lookups = self
            .lookups
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if lookups
            .last
            .get(node_id)
            .is_some_and(|at| now_ms.saturating_sub(*at) < LOOKUP_EVERY_MS)
        {
            return false;
        }
        let second = now_ms / 1000;
        if lookups.second != second {
            lookups.second = second;
            lookups.in_second = 0;
        }
        if lookups.in_second >= LOOKUPS_PER_SECOND {
            return false;
        }
        lookups.in_second += 1;
        if lookups.last.len() >= LOOKUPS_REMEMBERED {
            lookups.last.clear();
        }
        lookups.last.insert(node_id.to_owned(), now_ms);
        true
    }

    /// Replaces the cached credentials with the store's.
    pub fn replace(&self, rows: &[NodeCredentialRow]) {
        let revoked = rows
            .iter()
            .filter(|row| row.revoked_ms.is_some())
            .map(|row| row.node_id.clone())
            .collect();
        // A key that does not parse was refused at enrollment; one that got
        // into the store some other way leaves its node unable to report
        // rather than able to report unsigned.
        let keys = rows
            .iter()
            .filter_map(|row| {
                let key = parse_report_key(row.report_key.as_deref()?).unwrap_or([0; 32]);
                Some((row.node_id.clone(), key))
            })
            .collect();
        *self
            .revoked
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = revoked;
        *self
            .report_keys
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = keys;
    }
}

/// Why a node's report key was refused at enrollment.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReportKeyError {
    /// Not 64 hex digits.
    #[error("the report key must be 64 hex digits (an ed25519 public key)")]
    NotHex,
    /// 32 bytes that are not a usable ed25519 public key.
    #[error("the report key is not an ed25519 public key")]
    NotAKey,
}

/// Parses a node's report key: 64 hex digits of an ed25519 public key that
/// is not of small order (such a key would accept forged signatures).
pub fn parse_report_key(text: &str) -> Result<[u8; 32], ReportKeyError> {
    let bytes = hex::decode(text).map_err(|_| ReportKeyError::NotHex)?;
    let key: [u8; 32] = bytes.try_into().map_err(|_| ReportKeyError::NotHex)?;
    let verifying =
        ed25519_dalek::VerifyingKey::from_bytes(&key).map_err(|_| ReportKeyError::NotAKey)?;
    if verifying.is_weak() {
        return Err(ReportKeyError::NotAKey);
    }
    Ok(key)
}

/// Rereads the node credentials from the store into the broker's cache and,
/// when configured, the Mosquitto files.
pub(crate) async fn refresh(
    store: &Store,
    mqtt: &MqttAccess,
    mosquitto: Option<&MosquittoFiles>,
) -> Result<(), AccessError> {
    let rows = store.node_credentials().await?;
    mqtt.replace(&rows);
    if let Some(files) = mosquitto {
        files.write(&rows)?;
    }
    Ok(())
}

/// After `node_id`'s credentials changed in the store (enrolled, minted
/// anew, revoked): caches its row, and returns once the Mosquitto files, if
/// the coordinator writes any, hold the change and Mosquitto has reread
/// them (where it is signalled), so the broker lets a new node in and
/// keeps a revoked one out from then on.
///
/// Only this node's row is read for the cache: a change touches one row,
/// and [`MqttAccess::learn`] sets that node's revocation and report key
/// exactly as [`MqttAccess::replace`] would, so reloading every row per
/// change (O(fleet) each, O(fleet²) for a fleet enrolling) bought nothing.
/// Nodes another replica changed are learned by `learn_node` and the
/// periodic reload, as before. The files are rewritten whole, but one
/// rewrite covers every change that arrived while the previous ran
/// ([`MosquittoWriter`]).
pub(crate) async fn node_changed(
    store: &Store,
    mqtt: &MqttAccess,
    mosquitto: Option<&MosquittoWriter>,
    node_id: &str,
) -> Result<(), AccessError> {
    // Before the files: the node's first reports, possible once the broker
    // lets it in, are checked against its new key.
    if let Some(row) = store.node_credential(node_id).await? {
        mqtt.learn(&row);
    }
    if let Some(writer) = mosquitto {
        writer.rewrite(store).await?;
    }
    Ok(())
}

/// Learns from the store the credentials of `node_id`, which this process
/// has not cached: a node enrolled through another replica of the site (or
/// revoked there). Bounded by [`MqttAccess`]'s lookup budget, so messages
/// naming nodes that never enrolled cost the database little.
pub(crate) async fn learn_node(
    store: &Store,
    mqtt: &MqttAccess,
    node_id: &str,
    now_ms: u64,
) -> Result<(), AccessError> {
    if mqtt.knows(node_id) || !mqtt.may_look_up(node_id, now_ms) {
        return Ok(());
    }
    if let Some(row) = store.node_credential(node_id).await? {
        mqtt.learn(&row);
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use starling_api::Role;

    use super::*;

    #[test]
    fn roles_are_ordered_and_parse() {
        assert!(Role::Admin.allows(Role::Viewer));
        assert!(Role::Operator.allows(Role::Developer));
        assert!(!Role::Developer.allows(Role::Operator));
        assert!(!Role::Viewer.allows(Role::Developer));
        for role in Role::ALL {
            assert_eq!(role.as_str().parse::<Role>().unwrap(), role);
        }
        assert!("root".parse::<Role>().is_err());
    }

    #[test]
    fn secrets_are_fresh_and_prefixed() {
        let a = new_secret(API_TOKEN_PREFIX).unwrap();
        let b = new_secret(API_TOKEN_PREFIX).unwrap();
        assert!(a.starts_with("stk_"));
        assert_ne!(a, b);
        assert_eq!(a.len(), 4 + 43);
        assert_eq!(sha256_hex(&a).len(), 64);
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(!constant_time_eq(b"abc", b"abd"));
        assert!(!constant_time_eq(b"abc", b"abcd"));
    }

    #[test]
    fn mosquitto_hash_has_the_passwd_shape() {
        // Shape of `mosquitto_passwd -b` output in Mosquitto 2: $7$101$<salt b64>$<hash b64>.
        let line = mosquitto_hash_with_salt("secret", &[1u8; 12]);
        let parts: Vec<&str> = line.split('$').collect();
        assert_eq!(parts[..3], ["", "7", "101"]);
        let b64 = base64::engine::general_purpose::STANDARD;
        assert_eq!(b64.decode(parts[3]).unwrap(), vec![1u8; 12]);
        assert_eq!(b64.decode(parts[4]).unwrap().len(), 64);
        assert_ne!(line, mosquitto_hash_with_salt("other", &[1u8; 12]));
    }

    #[test]
    fn mqtt_access_knows_revoked_nodes_and_its_own_user() {
        let access = MqttAccess::new(INTERNAL_MQTT_USER);
        assert!(access.is_internal_user(INTERNAL_MQTT_USER));
        assert!(!access.is_internal_user("pi-1"));
        let row = |node_id: &str, revoked_ms| NodeCredentialRow {
            node_id: node_id.into(),
            password_sha256: sha256_hex("pw"),
            mosquitto_hash: String::new(),
            created_ms: 1,
            revoked_ms,
            report_key: None,
        };
        access.replace(&[row("pi-1", None), row("pi-2", Some(2))]);
        assert!(access.is_revoked("pi-2"));
        assert!(!access.is_revoked("pi-1"));
        assert!(!access.is_revoked("stranger"));
        access.replace(&[row("pi-1", None)]);
        assert!(!access.is_revoked("pi-2"));
    }

    #[test]
    fn lookups_of_unknown_nodes_are_bounded_per_node_and_per_second() {
        let access = MqttAccess::new(INTERNAL_MQTT_USER);
        let t = 1_000_000;
        assert!(access.may_look_up("n1", t));
        assert!(!access.may_look_up("n1", t + 999), "once a second per node");
        assert!(access.may_look_up("n1", t + 1_000));
        // Messages naming ever new ids (a development broker lets anyone
        // publish) get at most LOOKUPS_PER_SECOND lookups a second.
        let second = t + 5_000;
        let allowed = (0..1_000)
            .filter(|i| access.may_look_up(&format!("forged-{i}"), second))
            .count();
        assert_eq!(allowed, LOOKUPS_PER_SECOND as usize);
        assert!(
            access.may_look_up("forged-next", second + 1_000),
            "a new second"
        );
    }

    #[test]
    fn report_keys_are_cached_and_an_unusable_one_verifies_nothing() {
        let access = MqttAccess::new(INTERNAL_MQTT_USER);
        let key = ed25519_dalek::SigningKey::from_bytes(&[3; 32])
            .verifying_key()
            .to_bytes();
        let row = |node_id: &str, report_key: Option<String>| NodeCredentialRow {
            node_id: node_id.into(),
            password_sha256: sha256_hex("pw"),
            mosquitto_hash: String::new(),
            created_ms: 1,
            revoked_ms: None,
            report_key,
        };
        access.replace(&[
            row("pi-1", Some(hex::encode(key))),
            row("pi-2", None),
            row("pi-3", Some("not a key".into())),
        ]);
        assert_eq!(access.report_key("pi-1"), Some(key));
        assert_eq!(access.report_key("pi-2"), None);
        // Stored but unusable: still keyed (never unsigned), by a key no
        // signature verifies with.
        assert_eq!(access.report_key("pi-3"), Some([0; 32]));
        assert_eq!(parse_report_key(&hex::encode(key)), Ok(key));
        assert_eq!(parse_report_key("zz"), Err(ReportKeyError::NotHex));
        let identity = format!("01{}", "00".repeat(31));
        assert_eq!(parse_report_key(&identity), Err(ReportKeyError::NotAKey));
    }
}
