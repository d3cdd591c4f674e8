//! Identity, enrollment, join tokens, node revocation and API tokens: each
//! handler parses its request, calls `service::access` and converts.

use std::sync::Arc;

use axum::extract::rejection::JsonRejection;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;
use starling_api::{
    ApiError, ApiTokenCreated, ApiTokenList, CreateApiToken, CreateJoinToken, EnrollRequest,
    Identity, JoinTokenCreated, NodeCredentials, NodeRevoked,
};
use starling_proto::PROTOCOL_VERSION;

use crate::http::error::HttpError;
use crate::http::json_body;
use crate::http::Shared;

/// The coordinator's public key and protocol version, for nodes to pin.
#[utoipa::path(
    get,
    path = "/api/v1/identity",
    security(()),
    responses((status = 200, description = "The coordinator's identity", body = Identity))
)]
pub(crate) async fn identity(State(shared): State<Arc<Shared>>) -> Json<Identity> {
    Json(Identity {
        coordinator_key: shared.access().coordinator_key.clone(),
        protocol_version: PROTOCOL_VERSION,
        topic_prefix: shared.access().topic_prefix.clone(),
    })
}

/// Enrolls a node with a join token: returns its MQTT credentials (shown
/// once) and the coordinator's key to pin.
#[utoipa::path(
    post,
    path = "/api/v1/enroll",
    security(()),
    request_body = EnrollRequest,
    responses(
        (status = 201, description = "Enrolled; keep the password, it is not shown again", body = NodeCredentials),
        (status = 400, description = "Invalid node id or report key", body = ApiError),
        (status = 401, description = "The join token is invalid, expired or used up", body = ApiError),
        (status = 409, description = "The node is enrolled already (revoke it first)", body = ApiError)
    )
)]
pub(crate) async fn enroll(
    State(shared): State<Arc<Shared>>,
    body: Result<Json<EnrollRequest>, JsonRejection>,
) -> Result<(StatusCode, Json<NodeCredentials>), HttpError> {
    let request = json_body(body, "EnrollRequest")?;
    let credentials = shared.access().enroll(request).await?;
    Ok((StatusCode::CREATED, Json(credentials)))
}

/// Creates a join token (operator).
#[utoipa::path(
    post,
    path = "/api/v1/join-tokens",
    request_body = CreateJoinToken,
    responses(
        (status = 201, description = "Created; the secret is shown only here", body = JoinTokenCreated),
        (status = 400, description = "Invalid lifetime or uses", body = ApiError),
        (status = 401, description = "Missing or unknown token", body = ApiError),
        (status = 403, description = "Needs the operator role", body = ApiError)
    )
)]
pub(crate) async fn create_join_token(
    State(shared): State<Arc<Shared>>,
    body: Result<Json<CreateJoinToken>, JsonRejection>,
) -> Result<(StatusCode, Json<JoinTokenCreated>), HttpError> {
    let request = json_body(body, "CreateJoinToken")?;
    let created = shared
        .access()
        .create_join_token(request.ttl_seconds, request.uses)
        .await?;
    Ok((StatusCode::CREATED, Json(created)))
}

/// Revokes a node's credentials (operator): the broker refuses its next
/// connection, its messages are ignored, and its in-flight tasks are re-placed.
#[utoipa::path(
    post,
    path = "/api/v1/nodes/{id}/revoke",
    params(("id" = String, Path, description = "The node's id")),
    responses(
        (status = 200, description = "Revoked", body = NodeRevoked),
        (status = 401, description = "Missing or unknown token", body = ApiError),
        (status = 403, description = "Needs the operator role", body = ApiError),
        (status = 404, description = "No enrolled, unrevoked node with this id", body = ApiError)
    )
)]
pub(crate) async fn revoke_node(
    State(shared): State<Arc<Shared>>,
    Path(id): Path<String>,
) -> Result<Json<NodeRevoked>, HttpError> {
    Ok(Json(shared.access().revoke_node(&id).await?))
}

/// Creates an API token (admin).
#[utoipa::path(
    post,
    path = "/api/v1/api-tokens",
    request_body = CreateApiToken,
    responses(
        (status = 201, description = "Created; the secret is shown only here", body = ApiTokenCreated),
        (status = 400, description = "Invalid name", body = ApiError),
        (status = 401, description = "Missing or unknown token", body = ApiError),
        (status = 403, description = "Needs the admin role", body = ApiError),
        (status = 422, description = "Unknown role", body = ApiError)
    )
)]
pub(crate) async fn create_api_token(
    State(shared): State<Arc<Shared>>,
    body: Result<Json<CreateApiToken>, JsonRejection>,
) -> Result<(StatusCode, Json<ApiTokenCreated>), HttpError> {
    let request = json_body(body, "CreateApiToken")?;
    let created = shared
        .access()
        .create_api_token(&request.name, request.role)
        .await?;
    Ok((StatusCode::CREATED, Json(created)))
}

/// Lists API tokens without their secrets (admin).
#[utoipa::path(
    get,
    path = "/api/v1/api-tokens",
    responses(
        (status = 200, description = "Tokens", body = ApiTokenList),
        (status = 401, description = "Missing or unknown token", body = ApiError),
        (status = 403, description = "Needs the admin role", body = ApiError)
    )
)]
pub(crate) async fn list_api_tokens(
    State(shared): State<Arc<Shared>>,
) -> Result<Json<ApiTokenList>, HttpError> {
    let tokens = shared.access().api_tokens().await?;
    Ok(Json(ApiTokenList {
        tokens: tokens.into_iter().map(Into::into).collect(),
    }))
}

/// Revokes an API token (admin); it is refused from then on.
#[utoipa::path(
    post,
    path = "/api/v1/api-tokens/{id}/revoke",
    params(("id" = String, Path, description = "The token's id")),
    responses(
        (status = 200, description = "Revoked", body = ApiTokenList),
        (status = 401, description = "Missing or unknown token", body = ApiError),
        (status = 403, description = "Needs the admin role", body = ApiError),
        (status = 404, description = "No live token with this id", body = ApiError)
    )
)]
pub(crate) async fn revoke_api_token(
    State(shared): State<Arc<Shared>>,
    Path(id): Path<String>,
) -> Result<Json<ApiTokenList>, HttpError> {
    let access = shared.access();
    access.revoke_api_token(&id).await?;
    let tokens = access.api_tokens().await?;
    Ok(Json(ApiTokenList {
        tokens: tokens.into_iter().map(Into::into).collect(),
    }))
}
