//! Nodes and the coordinator's health, as the REST API shows them.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// The coordinator's health.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Health {
    /// `ok` when the database answers.
    pub status: String,
    /// The coordinator's version.
    pub version: String,
    /// The database backend (`sqlite` or `postgres`).
    pub database: String,
    /// The placement policy in force.
    pub policy: String,
    /// Nodes known.
    pub nodes: usize,
    /// Nodes online.
    pub nodes_online: usize,
    /// Whether this coordinator schedules for its site: always for a single
    /// coordinator, only while it holds the site's lease for one of several
    /// replicas on PostgreSQL.
    #[serde(default = "leads_by_default")]
    pub leader: bool,
    /// The leading replica's term (its lease's epoch); absent for a single
    /// coordinator and for a replica that does not lead.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub leader_term: Option<u64>,
}

/// A coordinator from before replicas always led.
fn leads_by_default() -> bool {
    true
}

/// One node, in a list.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct NodeSummary {
    /// The node's id.
    pub id: String,
    /// Whether it is online.
    pub online: bool,
    /// CPU architecture.
    pub arch: String,
    /// Logical cores.
    pub cores: u16,
    /// Total memory in bytes.
    pub memory_bytes: u64,
    /// OpenCL devices.
    pub gpus: usize,
    /// Runtimes it runs.
    pub runtimes: Vec<String>,
    /// Operator labels, `key=value`.
    pub labels: Vec<String>,
    /// CPU load (0..=1) from the latest telemetry.
    pub cpu_load: Option<f32>,
    /// Tasks running now, from the latest telemetry.
    pub running_tasks: Option<u16>,
    /// When it was last heard from, Unix milliseconds.
    pub last_seen_ms: u64,
}

/// The node list.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct NodeList {
    /// Nodes, ordered by id.
    pub nodes: Vec<NodeSummary>,
}

/// One node in full.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct NodeDetail {
    /// The node's id.
    pub id: String,
    /// Whether it is online.
    pub online: bool,
    /// Its last status (`online`, `offline`), if it sent one.
    pub status: Option<String>,
    /// Its capability report, as the agent sent it.
    #[schema(value_type = Object)]
    pub capability: serde_json::Value,
    /// Its latest telemetry report.
    #[schema(value_type = Option<Object>)]
    pub telemetry: Option<serde_json::Value>,
    /// When it was last heard from, Unix milliseconds.
    pub last_seen_ms: u64,
}

/// A node revocation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct NodeRevoked {
    /// The node.
    pub node_id: String,
    /// Tasks that were in flight on it and went back to the queue (or ended).
    pub requeued_tasks: Vec<String>,
}
