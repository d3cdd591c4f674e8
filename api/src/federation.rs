//! The federation as the REST API shows it, and the JSON that sites exchange
//! when one forwards work to another.

use serde::{Deserialize, Serialize};
use starling_proto::SiteDigest;
use utoipa::ToSchema;

use crate::artifacts::ArtifactSignature;
use crate::task::{TaskDemand, TaskKind, TaskLimits, TaskStatus};

/// The federation as this coordinator sees it.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct SiteList {
    /// Whether this coordinator federates at all (`--site`).
    pub federated: bool,
    /// This site's name, when federated.
    pub site: Option<String>,
    /// Every site heard of, this one first.
    pub sites: Vec<SiteEntry>,
}

/// What the failure detector says of a site.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum SiteState {
    /// This coordinator.
    #[serde(rename = "self")]
    Myself,
    /// Answering probes.
    Alive,
    /// Missed probes; not yet declared down.
    Suspect,
    /// Declared down (or left); no work goes there.
    Down,
}

/// One site, for `GET /api/v1/sites` and `starling sites`.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct SiteEntry {
    /// The site's name.
    pub site: String,
    /// Its state.
    pub state: SiteState,
    /// Where it gossips.
    pub gossip_addr: Option<String>,
    /// Its REST API, from its digest.
    pub api_url: Option<String>,
    /// Milliseconds since its newest digest arrived (since it was published, for this site).
    pub digest_age_ms: Option<u64>,
    /// Milliseconds since its state last changed.
    pub state_age_ms: u64,
    /// Measured round trip to its REST API, milliseconds.
    pub rtt_ms: Option<f64>,
    /// Its newest digest.
    #[schema(value_type = Object)]
    pub digest: Option<SiteDigest>,
}

impl SiteState {
    /// The state as the API writes it.
    pub fn as_str(self) -> &'static str {
        match self {
            SiteState::Myself => "self",
            SiteState::Alive => "alive",
            SiteState::Suspect => "suspect",
            SiteState::Down => "down",
        }
    }
}

/// A task another site forwards here.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ForwardRequest {
    /// The site that forwards it (its home).
    pub origin_site: String,
    /// Its id at home: with the site, the key that makes a repeated forward harmless.
    pub origin_task: String,
    /// sha256 of its artifact; fetched from the home site when not held here.
    pub artifact: String,
    /// `wasm` or `opencl`.
    pub runtime: String,
    /// Its input, base64.
    pub input_base64: String,
    /// Arguments.
    pub args: Vec<String>,
    /// Dominant resource.
    pub class: TaskKind,
    /// Resources it needs.
    pub demand: TaskDemand,
    /// Limits enforced.
    pub limits: TaskLimits,
    /// Estimated work, seconds on one reference core.
    pub work_seconds: f64,
    /// Priority.
    pub priority: u8,
    /// Absolute deadline, Unix milliseconds (sites keep their clocks in sync, NTP).
    pub deadline_unix_ms: Option<u64>,
    /// When it was submitted at home, Unix milliseconds.
    pub created_ms: u64,
    /// The artifact's publisher signature at home, with the publisher's key,
    /// so that nodes that trust only signed work (`--trusted-publisher`) run
    /// it here too. The receiving site refuses a forward whose signature does
    /// not verify over `artifact`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub publisher: Option<ArtifactSignature>,
}

/// The answer to a forward.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ForwardAccepted {
    /// The task's id at this site.
    pub task_id: String,
    /// False when this origin task was forwarded here before: nothing new was created.
    pub created: bool,
}

/// Where a forwarded task stands at the site that took it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ForwardStatus {
    /// The task's id at this site.
    pub task_id: String,
    /// Its state here.
    pub state: TaskStatus,
    /// The node running or that ran it.
    pub node_id: Option<String>,
    /// Output of a success, base64.
    pub output_base64: Option<String>,
    /// The module's exit code.
    pub exit_code: Option<i32>,
    /// Failure code.
    pub reason: Option<String>,
    /// Failure message.
    pub message: Option<String>,
}

/// A site revoked by the federation's trust root (`starling-coordinator
/// federation revoke` prints it). Its signature is its authority: any
/// member may pass it on, and every member that receives it refuses the
/// site's certificates issued at or before `revoked_ms`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SiteRevocation {
    /// The revoked site.
    pub site: String,
    /// Certificates of the site issued at or before this time (Unix ms) are refused.
    pub revoked_ms: u64,
    /// The trust root's ed25519 signature, base64.
    pub signature: String,
}

/// The answer to a revocation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct RevocationAccepted {
    /// The revoked site.
    pub site: String,
    /// False when this member already knew this revocation (or a later one).
    pub new: bool,
}
