//! The coordinator's health and the nodes it knows.

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::Json;
use starling_api::{ApiError, ErrorCode, Health, NodeDetail, NodeList, NodeSummary};
use starling_proto::NodeId;

use crate::http::error::HttpError;
use crate::http::Shared;
use crate::registry::NodeEntry;

/// Reports whether the coordinator and its database answer.
#[utoipa::path(
    get,
    path = "/api/v1/health",
    responses(
        (status = 200, description = "The coordinator serves and its database answers", body = Health),
        (status = 503, description = "The database does not answer", body = ApiError)
    )
)]
pub(crate) async fn health(State(shared): State<Arc<Shared>>) -> Result<Json<Health>, HttpError> {
    Ok(Json(shared.status().health().await?))
}

pub(crate) fn node_summary(entry: &NodeEntry) -> NodeSummary {
    let capability = &entry.capability;
    NodeSummary {
        id: capability.node_id.to_string(),
        online: entry.online(),
        arch: capability.arch.to_string(),
        cores: capability.cpu.cores,
        memory_bytes: capability.memory_bytes,
        gpus: capability.gpus.len(),
        runtimes: capability
            .runtimes
            .iter()
            .map(|runtime| runtime.as_str().to_string())
            .collect(),
        labels: capability.labels.iter().map(ToString::to_string).collect(),
        cpu_load: entry.telemetry.as_ref().map(|t| t.cpu_load),
        running_tasks: entry.telemetry.as_ref().map(|t| t.running_tasks),
        last_seen_ms: entry.last_seen_ms,
    }
}

/// Lists the nodes the coordinator knows.
#[utoipa::path(
    get,
    path = "/api/v1/nodes",
    responses((status = 200, description = "Known nodes, ordered by id", body = NodeList))
)]
pub(crate) async fn list_nodes(State(shared): State<Arc<Shared>>) -> Json<NodeList> {
    let nodes = shared.registry().nodes().map(node_summary).collect();
    Json(NodeList { nodes })
}

/// Shows one node: capability, latest telemetry and status.
#[utoipa::path(
    get,
    path = "/api/v1/nodes/{id}",
    params(("id" = String, Path, description = "The node's id")),
    responses(
        (status = 200, description = "The node", body = NodeDetail),
        (status = 404, description = "No such node", body = ApiError)
    )
)]
pub(crate) async fn get_node(
    State(shared): State<Arc<Shared>>,
    Path(id): Path<String>,
) -> Result<Json<NodeDetail>, HttpError> {
    let unknown = || {
        HttpError::new(
            ErrorCode::NodeNotFound,
            format!("no node {id:?} has reported; list nodes with GET /api/v1/nodes"),
        )
    };
    let node_id = NodeId::new(&id).map_err(|_| unknown())?;
    let registry = shared.registry();
    let entry = registry.get(&node_id).ok_or_else(unknown)?;
    let capability = serde_json::to_value(&entry.capability).map_err(HttpError::internal)?;
    let telemetry = entry
        .telemetry
        .as_ref()
        .map(serde_json::to_value)
        .transpose()
        .map_err(HttpError::internal)?;
    Ok(Json(NodeDetail {
        id: node_id.to_string(),
        online: entry.online(),
        status: entry.state.map(|state| match state {
            starling_proto::NodeState::Online => "online".to_string(),
            starling_proto::NodeState::Offline => "offline".to_string(),
        }),
        capability,
        telemetry,
        last_seen_ms: entry.last_seen_ms,
    }))
}
