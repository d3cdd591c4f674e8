//! Roles, API tokens, join tokens and enrollment: who may call what, and how a
//! node gets its MQTT credentials.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// A caller's rights over the REST API. Each role has every right of the ones
/// below it: viewer < developer < operator < admin.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, ToSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Reads nodes, tasks, artifacts' metadata and metrics.
    Viewer,
    /// Also uploads artifacts, submits and cancels tasks.
    Developer,
    /// Also creates join tokens and revokes nodes.
    Operator,
    /// Also creates, lists and revokes API tokens.
    Admin,
}

/// A role name that is not one of the four.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown role {0:?}; use viewer, developer, operator or admin")]
pub struct UnknownRole(pub String);

/// A node's MQTT credentials, as enrollment hands them out (once).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct NodeCredentials {
    /// The node's id.
    pub node_id: String,
    /// Its MQTT user name (the node id).
    pub mqtt_username: String,
    /// Its MQTT password; shown only here, stored hashed.
    pub mqtt_password: String,
    /// The coordinator's ed25519 public key (64 hex digits): the node pins it
    /// and verifies every assignment's signature against it.
    pub coordinator_key: String,
    /// The MQTT topic prefix (`starling/v1`).
    pub topic_prefix: String,
}

impl Role {
    /// Every role, lowest first.
    pub const ALL: [Role; 4] = [Role::Viewer, Role::Developer, Role::Operator, Role::Admin];

    /// The role's name as the API and the CLI write it.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Viewer => "viewer",
            Role::Developer => "developer",
            Role::Operator => "operator",
            Role::Admin => "admin",
        }
    }

    /// Whether a caller with this role may do what `needed` allows.
    pub fn allows(self, needed: Role) -> bool {
        self >= needed
    }
}

impl std::fmt::Display for Role {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for Role {
    type Err = UnknownRole;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Role::ALL
            .into_iter()
            .find(|role| role.as_str() == s)
            .ok_or_else(|| UnknownRole(s.to_string()))
    }
}

/// The coordinator's identity: what a node pins before trusting it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Identity {
    /// The ed25519 public key (64 hex digits) assignments are signed with.
    pub coordinator_key: String,
    /// The wire protocol version it speaks.
    pub protocol_version: u16,
    /// The MQTT topic prefix.
    pub topic_prefix: String,
}

/// An enrollment request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct EnrollRequest {
    /// A join token from `starling token create`.
    pub join_token: String,
    /// The node id to enroll (it becomes the MQTT user name).
    pub node_id: String,
    /// The ed25519 public key (64 hex digits) the node made for itself and
    /// signs its reports with; its secret half never leaves the node.
    pub report_key: String,
}

/// A join token request.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct CreateJoinToken {
    /// Seconds until it expires (default 3600, at most 30 days).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl_seconds: Option<u64>,
    /// How many nodes may enroll with it (default 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uses: Option<u32>,
}

/// A join token, shown once.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct JoinTokenCreated {
    /// Its id.
    pub id: String,
    /// The secret: give it to `starling-agent run --join-token`. Only its
    /// hash is stored; it cannot be shown again.
    pub token: String,
    /// When it expires, Unix milliseconds.
    pub expires_ms: u64,
    /// How many nodes may enroll with it.
    pub uses: u32,
    /// The coordinator's public key (64 hex digits): give it to the agent with
    /// `--coordinator-key` so that it refuses an enrollment answer from
    /// anyone else.
    pub coordinator_key: String,
}

/// An API token request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct CreateApiToken {
    /// Who or what it is for.
    pub name: String,
    /// Its role.
    pub role: Role,
}

/// An API token, shown once.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ApiTokenCreated {
    /// Its id (for revoking).
    pub id: String,
    /// Who or what it is for.
    pub name: String,
    /// Its role.
    pub role: Role,
    /// The secret (`stk_…`). Only its hash is stored; it cannot be shown again.
    pub token: String,
    /// When it was created, Unix milliseconds.
    pub created_ms: u64,
}

/// The API token list.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ApiTokenList {
    /// Tokens, oldest first, revoked ones included; never their secrets.
    pub tokens: Vec<ApiTokenRecord>,
}

/// An API token as listed (never with its secret).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ApiTokenRecord {
    /// The token's id (for `starling api-token revoke`).
    pub id: String,
    /// Who or what it is for.
    pub name: String,
    /// Its role.
    pub role: Role,
    /// When it was created, Unix milliseconds.
    pub created_ms: u64,
    /// When it was revoked, Unix milliseconds.
    pub revoked_ms: Option<u64>,
}
