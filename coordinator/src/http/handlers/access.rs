//! Identity, enrollment, join tokens, node revocation and API tokens.

use std::sync::Arc;

use axum::extract::rejection::JsonRejection;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;
use starling_api::{
    ApiError, ApiTokenCreated, ApiTokenList, CreateApiToken, CreateJoinToken, EnrollRequest,
    ErrorCode, Identity, JoinTokenCreated, NodeCredentials, NodeRevoked,
};
use starling_proto::{NodeId, PROTOCOL_VERSION};

use crate::access;
use crate::http::error::HttpError;
use crate::http::json_body;
use crate::store::access::EnrollOutcome;
use crate::task::unix_now_ms;
use crate::Shared;

/// Longest join token life.
pub(crate) const MAX_JOIN_TOKEN_TTL_SECONDS: u64 = 30 * 24 * 3600;

/// Default join token life.
pub(crate) const DEFAULT_JOIN_TOKEN_TTL_SECONDS: u64 = 3600;

/// Most nodes one join token may enroll.
pub(crate) const MAX_JOIN_TOKEN_USES: u32 = 10_000;

/// Longest API token name.
pub(crate) const MAX_TOKEN_NAME_LEN: usize = 128;

/// The coordinator's public key and protocol version, for nodes to pin.
#[utoipa::path(
    get,
    path = "/api/v1/identity",
    security(()),
    responses((status = 200, description = "The coordinator's identity", body = Identity))
)]
pub(crate) async fn identity(State(shared): State<Arc<Shared>>) -> Json<Identity> {
    Json(Identity {
        coordinator_key: shared.coordinator_key(),
        protocol_version: PROTOCOL_VERSION,
        topic_prefix: shared.topics.prefix().to_string(),
    })
}

/// After `node`'s credentials changed in the store: updates the cache of
/// them and returns once Mosquitto's files hold the change and Mosquitto
/// has reread them (`access::node_changed`).
pub(crate) async fn refresh_access(shared: &Shared, node: &str) {
    if let Err(error) = access::node_changed(
        &shared.store,
        &shared.mqtt_access,
        shared.mosquitto.as_ref(),
        node,
    )
    .await
    {
        // The store holds the truth; the next change or restart rewrites the
        // files, so the operator can fix the directory meanwhile.
        tracing::error!(%error, %node, "cannot refresh MQTT credentials");
    }
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
    let node = NodeId::new(&request.node_id).map_err(|error| {
        HttpError::new(
            ErrorCode::InvalidNodeId,
            format!("node id {:?}: {error}", request.node_id),
        )
    })?;
    if shared.mqtt_access.is_internal_user(node.as_str()) {
        return Err(HttpError::new(
            ErrorCode::NodeIdReserved,
            format!("{node} is the coordinator's own MQTT user; pick another node id"),
        ));
    }
    access::parse_report_key(&request.report_key).map_err(|error| {
        HttpError::new(
            ErrorCode::InvalidReportKey,
            format!("{error}; the agent makes it at enrollment"),
        )
    })?;
    let (password, hashes) = access::new_node_password().map_err(HttpError::internal)?;
    let outcome = shared
        .store
        .enroll_node(
            &access::sha256_hex(request.join_token.trim()),
            node.as_str(),
            hashes.for_node(&request.report_key),
            unix_now_ms(),
        )
        .await?;
    match outcome {
        EnrollOutcome::Enrolled => {}
        EnrollOutcome::BadToken => {
            return Err(HttpError::new(ErrorCode::InvalidJoinToken,
                "the join token is invalid, expired or used up; create one with `starling token create`",
            ))
        }
        EnrollOutcome::AlreadyEnrolled => {
            return Err(HttpError::new(ErrorCode::NodeEnrolled,
                format!("node {node} is enrolled already; its credentials stay valid (an operator can `starling node revoke {node}` first to enroll it again)"),
            ))
        }
    }
    // A new key counts its reports afresh (the store forgot the old marks).
    shared
        .report_marks
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .forget(&node);
    refresh_access(&shared, node.as_str()).await;
    tracing::info!(node = %node, "node enrolled");
    Ok((
        StatusCode::CREATED,
        Json(NodeCredentials {
            node_id: node.to_string(),
            mqtt_username: node.to_string(),
            mqtt_password: password,
            coordinator_key: shared.coordinator_key(),
            topic_prefix: shared.topics.prefix().to_string(),
        }),
    ))
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
    let ttl = request
        .ttl_seconds
        .unwrap_or(DEFAULT_JOIN_TOKEN_TTL_SECONDS);
    if ttl == 0 || ttl > MAX_JOIN_TOKEN_TTL_SECONDS {
        return Err(HttpError::new(
            ErrorCode::InvalidTtl,
            format!("ttl_seconds must be 1..={MAX_JOIN_TOKEN_TTL_SECONDS} (30 days)"),
        ));
    }
    let uses = request.uses.unwrap_or(1);
    if uses == 0 || uses > MAX_JOIN_TOKEN_USES {
        return Err(HttpError::new(
            ErrorCode::InvalidUses,
            format!("uses must be 1..={MAX_JOIN_TOKEN_USES}"),
        ));
    }
    let token = access::new_secret(access::JOIN_TOKEN_PREFIX).map_err(HttpError::internal)?;
    let id = uuid::Uuid::now_v7().to_string();
    let now_ms = unix_now_ms();
    let expires_ms = now_ms.saturating_add(ttl.saturating_mul(1000));
    shared
        .store
        .insert_join_token(&id, &access::sha256_hex(&token), uses, expires_ms, now_ms)
        .await?;
    Ok((
        StatusCode::CREATED,
        Json(JoinTokenCreated {
            id,
            token,
            expires_ms,
            uses,
            coordinator_key: shared.signer.public_key_hex(),
        }),
    ))
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
    let now_ms = unix_now_ms();
    if !shared.store.revoke_node_credentials(&id, now_ms).await? {
        return Err(HttpError::new(
            ErrorCode::NodeNotEnrolled,
            format!("node {id:?} has no live credentials (never enrolled, or revoked already)"),
        ));
    }
    refresh_access(&shared, &id).await;
    if let Ok(node) = NodeId::new(&id) {
        // Offline now rather than after the silence timeout: the scheduler
        // must not hand it more work while its connection lingers.
        let offline = starling_proto::Status {
            v: PROTOCOL_VERSION,
            node_id: node.clone(),
            state: starling_proto::NodeState::Offline,
        };
        let _ = shared.registry_mut().apply_status(&node, offline, now_ms);
    }
    shared
        .feed
        .node(&id, starling_api::NodeChangeKind::Revoked, now_ms);
    let lost = match shared
        .store
        .requeue_node_tasks(&id, shared.max_attempts, now_ms)
        .await
    {
        Ok(lost) => lost,
        // A replica that does not lead leaves it to the leader, which hears
        // the node's last will when the broker drops its revoked session.
        Err(crate::store::StoreError::Deposed) => Vec::new(),
        Err(error) => return Err(error.into()),
    };
    shared.wake_scheduler.notify_one();
    tracing::warn!(node = %id, requeued = lost.len(), "node revoked");
    Ok(Json(NodeRevoked {
        node_id: id,
        requeued_tasks: lost.into_iter().map(|task| task.task_id).collect(),
    }))
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
    let name = request.name.trim();
    if name.is_empty() || name.len() > MAX_TOKEN_NAME_LEN {
        return Err(HttpError::new(
            ErrorCode::InvalidName,
            format!("a token needs a name of 1..={MAX_TOKEN_NAME_LEN} bytes saying who it is for"),
        ));
    }
    let token = access::new_secret(access::API_TOKEN_PREFIX).map_err(HttpError::internal)?;
    let id = uuid::Uuid::now_v7().to_string();
    let now_ms = unix_now_ms();
    shared
        .store
        .insert_api_token(&id, name, request.role, &access::sha256_hex(&token), now_ms)
        .await?;
    tracing::info!(%id, name, role = %request.role, "API token created");
    Ok((
        StatusCode::CREATED,
        Json(ApiTokenCreated {
            id,
            name: name.to_string(),
            role: request.role,
            token,
            created_ms: now_ms,
        }),
    ))
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
    Ok(Json(ApiTokenList {
        tokens: shared
            .store
            .api_tokens()
            .await?
            .into_iter()
            .map(Into::into)
            .collect(),
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
    if !shared.store.revoke_api_token(&id, unix_now_ms()).await? {
        return Err(HttpError::new(
            ErrorCode::TokenNotFound,
            format!("no live API token {id:?}; list them with `starling api-token list`"),
        ));
    }
    tracing::info!(%id, "API token revoked");
    Ok(Json(ApiTokenList {
        tokens: shared
            .store
            .api_tokens()
            .await?
            .into_iter()
            .map(Into::into)
            .collect(),
    }))
}
