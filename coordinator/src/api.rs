//! The REST API under `/api/v1` (axum), with its OpenAPI document (utoipa).
//! Errors are JSON `{"error": CODE, "message": WHAT TO DO}` with the matching
//! HTTP status. When an API token is configured, every mutating call needs it.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, JsonRejection};
use axum::extract::{DefaultBodyLimit, MatchedPath, Path, Query, Request, State};
use axum::http::{header, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use base64::Engine as _;
use rumqttc::QoS;
use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};
use starling_opencl::Package;
use starling_proto::limits::{ARG_LEN, MAX_ARGS, MAX_INLINE_INPUT_BYTES, MAX_INLINE_OUTPUT_BYTES};
use starling_proto::{
    encode, Cancel, Channel, Digest, NodeId, PublisherSignature, Runtime, TaskId, PROTOCOL_VERSION,
};
use utoipa::{IntoParams, OpenApi, ToSchema};

use crate::access::{self, NodeCredentials, Role};
use crate::access_store::{ApiTokenRecord, EnrollOutcome};
use crate::registry::NodeEntry;
use crate::store::{AttemptRecord, CancelOutcome, EventRecord, NewTask, TaskRecord};
use crate::task::{unix_now_ms, TaskDemand, TaskGrants, TaskKind, TaskLimits, TaskStatus};
use crate::Shared;

/// Default number of tasks a list returns.
const DEFAULT_LIST_LIMIT: u32 = 50;
/// Most tasks a list returns.
const MAX_LIST_LIMIT: u32 = 1000;
/// Largest JSON request body (a task with its inline input in base64).
const MAX_JSON_BODY_BYTES: usize = 2 * 1024 * 1024;

/// An error answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ApiError {
    /// A stable code programs can match (`not_found`, `invalid_artifact`, ...).
    pub error: String,
    /// What went wrong and what to do, for people.
    pub message: String,
    #[serde(skip)]
    #[schema(ignore)]
    status: u16,
}

impl ApiError {
    /// An error with a status, a code and a message.
    pub fn new(status: StatusCode, error: &str, message: impl Into<String>) -> Self {
        Self {
            error: error.to_string(),
            message: message.into(),
            status: status.as_u16(),
        }
    }

    fn internal(error: impl std::fmt::Display) -> Self {
        tracing::error!(%error, "request failed");
        Self::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            format!("the coordinator failed: {error}; see its log"),
        )
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        (status, Json(self)).into_response()
    }
}

impl From<crate::store::StoreError> for ApiError {
    fn from(error: crate::store::StoreError) -> Self {
        Self::internal(error)
    }
}

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

/// A stored artifact.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ArtifactStored {
    /// Its sha256, 64 hex digits.
    pub digest: String,
    /// Its size in bytes.
    pub size: u64,
    /// The runtime that runs it: `wasm` or `opencl`.
    pub runtime: String,
    /// Whether these bytes were new to the coordinator.
    pub created: bool,
}

/// A publisher's signature over an artifact's digest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ArtifactSignature {
    /// The publisher's ed25519 public key, 64 hex digits (`starling keygen` prints it).
    pub key: String,
    /// The ed25519 signature of the artifact's 32-byte sha256 digest, 128 hex digits.
    pub signature: String,
}

/// A task submission.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct SubmitTask {
    /// The module's digest (64 hex digits), as `POST /artifacts` returned it.
    pub artifact: String,
    /// Input, base64 (give this or `input_text`, not both): the task's stdin for
    /// wasm tasks; the kernel's input buffers, concatenated, for OpenCL tasks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input_base64: Option<String>,
    /// Input for the task's stdin, as text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input_text: Option<String>,
    /// Arguments: argv after the program name for wasm tasks; the kernel's
    /// scalars as `name=value` for OpenCL tasks.
    #[serde(default)]
    pub args: Vec<String>,
    /// Deadline in milliseconds from now.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline_ms: Option<u64>,
    /// Priority, higher first (0..=255, default 0).
    #[serde(default)]
    pub priority: u8,
    /// Dominant resource: `cpu` (default), `gpu` or `io`.
    #[serde(default)]
    pub class: TaskKind,
    /// Resources the task needs.
    #[serde(default)]
    pub demand: TaskDemand,
    /// Limits enforced on each attempt.
    #[serde(default)]
    pub limits: TaskLimits,
    /// Estimated work, in seconds on one reference core (default 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub work_seconds: Option<f64>,
    /// What a wasm task may use: `{"clock": true, "random": true}`; nothing
    /// when absent. Given here, it replaces `limits.grants`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grants: Option<TaskGrants>,
}

/// A task in a list.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct TaskSummary {
    /// The task's id.
    pub id: String,
    /// Its state.
    pub state: TaskStatus,
    /// Its module's digest.
    pub artifact: String,
    /// The node of its current or last attempt.
    pub node_id: Option<String>,
    /// Its current attempt (0 before the first).
    pub attempt: u32,
    /// Its priority.
    pub priority: u8,
    /// When it was submitted, Unix milliseconds.
    pub created_ms: u64,
    /// When it last changed, Unix milliseconds.
    pub updated_ms: u64,
    /// Failure code, for failed tasks.
    pub reason: Option<String>,
    /// The site its current attempt was forwarded to; absent when it runs here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub site: Option<String>,
}

/// The task list.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct TaskList {
    /// Tasks, newest first.
    pub tasks: Vec<TaskSummary>,
}

/// One task in full.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct TaskDetail {
    /// The task's id.
    pub id: String,
    /// Its state.
    pub state: TaskStatus,
    /// Its module's digest.
    pub artifact: String,
    /// The runtime.
    pub runtime: String,
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
    /// Absolute deadline, Unix milliseconds.
    pub deadline_unix_ms: Option<u64>,
    /// Input size in bytes.
    pub input_bytes: u64,
    /// When it was submitted, Unix milliseconds.
    pub created_ms: u64,
    /// When it last changed, Unix milliseconds.
    pub updated_ms: u64,
    /// The node of its current or last attempt.
    pub node_id: Option<String>,
    /// The site its current attempt was forwarded to; absent when it runs here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub site: Option<String>,
    /// The node at that site that ran it, as the site reported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub site_node: Option<String>,
    /// For a task another site forwarded here: that site.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub origin_site: Option<String>,
    /// Its current attempt (0 before the first).
    pub attempt: u32,
    /// The power level chosen for the current attempt.
    pub power_level: Option<u8>,
    /// Output of a successful run, base64.
    pub output_base64: Option<String>,
    /// Output of a successful run, when it is UTF-8.
    pub output_text: Option<String>,
    /// The module's exit code, when it exited.
    pub exit_code: Option<i32>,
    /// Failure code (`timeout`, `trap`, `node_lost`, ...).
    pub reason: Option<String>,
    /// Failure message for people.
    pub message: Option<String>,
    /// Whether a cancel was requested.
    pub cancel_requested: bool,
    /// The latest placement decision's explanation.
    #[schema(value_type = Option<Object>)]
    pub explanation: Option<serde_json::Value>,
    /// Attempts, first first.
    pub attempts: Vec<AttemptRecord>,
    /// Events received from agents, oldest first.
    pub events: Vec<EventRecord>,
}

/// Filters for the task list.
#[derive(Debug, Clone, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct TaskListQuery {
    /// Only tasks in this state (`pending`, `assigned`, `running`, `succeeded`, `failed`, `cancelled`).
    pub state: Option<String>,
    /// Most tasks returned (default 50, at most 1000).
    pub limit: Option<u32>,
}

/// Declares the optional bearer token in the OpenAPI document.
struct BearerToken;

impl utoipa::Modify for BearerToken {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
    }
}

/// The OpenAPI document of this API.
#[derive(OpenApi)]
#[openapi(
    modifiers(&BearerToken),
    info(
        title = "Starling coordinator API",
        description = "Nodes, artifacts and tasks of a Starling coordinator. When the coordinator has an API token, every call except health, identity, enrollment, this document and artifacts by digest needs `Authorization: Bearer TOKEN` with a role: viewer reads; developer also uploads, submits and cancels; operator also creates join tokens and revokes nodes; admin also manages API tokens. 401: missing, unknown or revoked token; 403: role too low."
    ),
    paths(
        health,
        list_nodes,
        get_node,
        upload_artifact,
        get_artifact,
        sign_artifact,
        submit_task,
        list_tasks,
        get_task,
        cancel_task,
        openapi_document,
        metrics,
        identity,
        enroll,
        create_join_token,
        revoke_node,
        create_api_token,
        list_api_tokens,
        revoke_api_token,
        crate::federation::rest::list_sites,
        crate::federation::rest::accept_forward,
        crate::federation::rest::forward_status,
        crate::federation::rest::cancel_forward
    ),
    components(schemas(
        ApiError,
        crate::federation::rest::SiteList,
        crate::federation::SiteEntry,
        crate::federation::SiteState,
        crate::federation::wire::ForwardRequest,
        crate::federation::wire::ForwardAccepted,
        crate::federation::wire::ForwardStatus,
        Health,
        NodeSummary,
        NodeList,
        NodeDetail,
        ArtifactStored,
        ArtifactSignature,
        SubmitTask,
        TaskSummary,
        TaskList,
        TaskDetail,
        TaskStatus,
        TaskKind,
        TaskDemand,
        TaskLimits,
        TaskGrants,
        AttemptRecord,
        EventRecord,
        Role,
        Identity,
        EnrollRequest,
        NodeCredentials,
        CreateJoinToken,
        JoinTokenCreated,
        CreateApiToken,
        ApiTokenCreated,
        ApiTokenRecord,
        ApiTokenList,
        NodeRevoked
    ))
)]
pub struct ApiDoc;

/// The OpenAPI document as pretty JSON (the checked-in `openapi.json`).
pub fn openapi_json() -> String {
    ApiDoc::openapi()
        .to_pretty_json()
        .unwrap_or_else(|error| format!("{{\"error\": \"{error}\"}}"))
}

/// The API's routes over the coordinator's shared state.
pub(crate) fn router(shared: Arc<Shared>) -> Router {
    let artifact_limit = shared.max_artifact_bytes;
    Router::new()
        .route("/api/v1/health", get(health))
        .route("/api/v1/nodes", get(list_nodes))
        .route("/api/v1/nodes/{id}", get(get_node))
        .route(
            "/api/v1/artifacts",
            post(upload_artifact).layer(DefaultBodyLimit::max(artifact_limit)),
        )
        .route("/api/v1/artifacts/{digest}", get(get_artifact))
        .route("/api/v1/artifacts/{digest}/signature", post(sign_artifact))
        .route("/api/v1/tasks", post(submit_task).get(list_tasks))
        .route("/api/v1/tasks/{id}", get(get_task))
        .route("/api/v1/tasks/{id}/cancel", post(cancel_task))
        .route("/api/v1/openapi.json", get(openapi_document))
        .route("/api/v1/identity", get(identity))
        .route("/api/v1/enroll", post(enroll))
        .route("/api/v1/join-tokens", post(create_join_token))
        .route("/api/v1/nodes/{id}/revoke", post(revoke_node))
        .route(
            "/api/v1/api-tokens",
            post(create_api_token).get(list_api_tokens),
        )
        .route("/api/v1/api-tokens/{id}/revoke", post(revoke_api_token))
        .route("/api/v1/sites", get(crate::federation::rest::list_sites))
        .route(
            "/api/v1/federation/tasks",
            post(crate::federation::rest::accept_forward),
        )
        .route(
            "/api/v1/federation/tasks/{site}/{task}",
            get(crate::federation::rest::forward_status),
        )
        .route(
            "/api/v1/federation/tasks/{site}/{task}/cancel",
            post(crate::federation::rest::cancel_forward),
        )
        .route("/metrics", get(metrics))
        .fallback(not_found)
        .layer(DefaultBodyLimit::max(MAX_JSON_BODY_BYTES))
        .layer(axum::middleware::from_fn_with_state(
            shared.clone(),
            authorize,
        ))
        .with_state(shared)
}

async fn not_found() -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "not_found",
        "no such endpoint; see GET /api/v1/openapi.json for the API",
    )
}

/// What a route asks of its caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RouteAccess {
    /// Anyone: health, identity, enrollment, the OpenAPI document, and
    /// artifacts by digest (agents fetch them with no API token; the digest
    /// is the capability and the bytes are verified against it).
    Public,
    /// A bearer token with at least this role.
    Role(Role),
    /// Another site of the federation: the peer token derived from the
    /// cluster key, required whether or not API tokens are enforced.
    Peer,
}

/// Every route with the access it needs. The middleware looks each request's
/// matched route up here; a route or method missing from it needs `admin`,
/// so forgetting a line locks a route rather than opening it.
const ROUTES: &[(Method, &str, RouteAccess)] = &[
    (Method::GET, "/api/v1/health", RouteAccess::Public),
    (Method::GET, "/api/v1/identity", RouteAccess::Public),
    (Method::POST, "/api/v1/enroll", RouteAccess::Public),
    (Method::GET, "/api/v1/openapi.json", RouteAccess::Public),
    (
        Method::GET,
        "/api/v1/artifacts/{digest}",
        RouteAccess::Public,
    ),
    (
        Method::GET,
        "/api/v1/nodes",
        RouteAccess::Role(Role::Viewer),
    ),
    (
        Method::GET,
        "/api/v1/nodes/{id}",
        RouteAccess::Role(Role::Viewer),
    ),
    (
        Method::GET,
        "/api/v1/tasks",
        RouteAccess::Role(Role::Viewer),
    ),
    (
        Method::GET,
        "/api/v1/tasks/{id}",
        RouteAccess::Role(Role::Viewer),
    ),
    (Method::GET, "/metrics", RouteAccess::Role(Role::Viewer)),
    (
        Method::GET,
        "/api/v1/sites",
        RouteAccess::Role(Role::Viewer),
    ),
    (Method::POST, "/api/v1/federation/tasks", RouteAccess::Peer),
    (
        Method::GET,
        "/api/v1/federation/tasks/{site}/{task}",
        RouteAccess::Peer,
    ),
    (
        Method::POST,
        "/api/v1/federation/tasks/{site}/{task}/cancel",
        RouteAccess::Peer,
    ),
    (
        Method::POST,
        "/api/v1/artifacts",
        RouteAccess::Role(Role::Developer),
    ),
    (
        Method::POST,
        "/api/v1/artifacts/{digest}/signature",
        RouteAccess::Role(Role::Developer),
    ),
    (
        Method::POST,
        "/api/v1/tasks",
        RouteAccess::Role(Role::Developer),
    ),
    (
        Method::POST,
        "/api/v1/tasks/{id}/cancel",
        RouteAccess::Role(Role::Developer),
    ),
    (
        Method::POST,
        "/api/v1/join-tokens",
        RouteAccess::Role(Role::Operator),
    ),
    (
        Method::POST,
        "/api/v1/nodes/{id}/revoke",
        RouteAccess::Role(Role::Operator),
    ),
    (
        Method::GET,
        "/api/v1/api-tokens",
        RouteAccess::Role(Role::Admin),
    ),
    (
        Method::POST,
        "/api/v1/api-tokens",
        RouteAccess::Role(Role::Admin),
    ),
    (
        Method::POST,
        "/api/v1/api-tokens/{id}/revoke",
        RouteAccess::Role(Role::Admin),
    ),
];

/// The access `method` on the route template `path` needs (HEAD as GET).
fn required_access(method: &Method, path: &str) -> RouteAccess {
    let method = if method == Method::HEAD {
        &Method::GET
    } else {
        method
    };
    ROUTES
        .iter()
        .find(|(m, p, _)| m == method && *p == path)
        .map_or(RouteAccess::Role(Role::Admin), |(_, _, access)| *access)
}

fn unauthorized(message: &str) -> Response {
    ApiError::new(StatusCode::UNAUTHORIZED, "unauthorized", message).into_response()
}

/// The role of the bearer token on a request: the bootstrap token is admin;
/// any other must be a live token in the store. `None` for a missing,
/// unknown or revoked token.
async fn caller_role(
    shared: &Shared,
    bootstrap: &str,
    given: Option<&str>,
) -> Result<Option<Role>, ApiError> {
    let Some(given) = given.map(str::trim).filter(|token| !token.is_empty()) else {
        return Ok(None);
    };
    // Hashes of equal length are compared, so the time taken says nothing
    // about how close a guess was, nor how long the real token is.
    let given_hash = access::sha256_hex(given);
    if access::constant_time_eq(
        given_hash.as_bytes(),
        access::sha256_hex(bootstrap).as_bytes(),
    ) {
        return Ok(Some(Role::Admin));
    }
    Ok(shared
        .store
        .api_token_by_hash(&given_hash)
        .await?
        .filter(|(_, stored)| access::constant_time_eq(stored.as_bytes(), given_hash.as_bytes()))
        .map(|(record, _)| record.role))
}

/// Checks every request's bearer token against the role its route needs,
/// before the body is read: a refused request changes nothing. Without a
/// bootstrap token (`--api-token`) nothing is enforced; `start` warns.
async fn authorize(State(shared): State<Arc<Shared>>, request: Request, next: Next) -> Response {
    // No matched route: the fallback answers 404 and touches nothing.
    let Some(route) = request
        .extensions()
        .get::<MatchedPath>()
        .map(|p| p.as_str().to_owned())
    else {
        return next.run(request).await;
    };
    let needed = match required_access(request.method(), &route) {
        RouteAccess::Public => return next.run(request).await,
        RouteAccess::Peer => return authorize_peer(&shared, request, next).await,
        RouteAccess::Role(role) => role,
    };
    let Some(bootstrap) = shared.api_token.as_deref() else {
        return next.run(request).await;
    };
    let has_header = request.headers().contains_key(header::AUTHORIZATION);
    // Copied out: the request's body is not Sync, so no reference to it may
    // be held across the store lookup.
    let given = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.strip_prefix("Bearer "))
        .map(str::to_owned);
    let method = request.method().clone();
    match caller_role(&shared, bootstrap, given.as_deref()).await {
        Ok(Some(role)) if role.allows(needed) => next.run(request).await,
        Ok(Some(role)) => ApiError::new(
            StatusCode::FORBIDDEN,
            "forbidden",
            format!(
                "{method} {route} needs the {needed} role; this token is {role}; ask an admin for a token with `starling api-token create --role {needed}`"
            ),
        )
        .into_response(),
        Ok(None) if has_header => unauthorized(
            "the bearer token is unknown or revoked; pass a valid API token (starling --token, STARLING_API_TOKEN)",
        ),
        Ok(None) => unauthorized(
            "this coordinator requires an API token; send Authorization: Bearer TOKEN (starling --token, STARLING_API_TOKEN)",
        ),
        Err(error) => error.into_response(),
    }
}

/// Lets through only a peer of the federation: the request must carry the
/// peer token derived from the cluster key (compared in constant time).
async fn authorize_peer(shared: &Shared, request: Request, next: Next) -> Response {
    let Some(federation) = shared.federation.as_ref() else {
        return ApiError::new(
            StatusCode::NOT_FOUND,
            "not_federated",
            "this coordinator does not federate; start it with --site and --cluster-key",
        )
        .into_response();
    };
    let given = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.strip_prefix("Bearer "))
        .unwrap_or("");
    if access::constant_time_eq(
        access::sha256_hex(given).as_bytes(),
        access::sha256_hex(&federation.peer_token).as_bytes(),
    ) {
        next.run(request).await
    } else {
        unauthorized("federation routes are for the sites of this federation: send the peer token derived from the same --cluster-key")
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

/// A node revocation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct NodeRevoked {
    /// The node.
    pub node_id: String,
    /// Tasks that were in flight on it and went back to the queue (or ended).
    pub requeued_tasks: Vec<String>,
}

/// Longest join token life.
const MAX_JOIN_TOKEN_TTL_SECONDS: u64 = 30 * 24 * 3600;
/// Default join token life.
const DEFAULT_JOIN_TOKEN_TTL_SECONDS: u64 = 3600;
/// Most nodes one join token may enroll.
const MAX_JOIN_TOKEN_USES: u32 = 10_000;
/// Longest API token name.
const MAX_TOKEN_NAME_LEN: usize = 128;

fn json_body<T>(body: Result<Json<T>, JsonRejection>, schema: &str) -> Result<T, ApiError> {
    body.map(|Json(value)| value).map_err(|rejection| {
        ApiError::new(
            rejection.status(),
            "invalid_json",
            format!(
                "{}; see {schema} in GET /api/v1/openapi.json",
                rejection.body_text()
            ),
        )
    })
}

/// The coordinator's public key and protocol version, for nodes to pin.
#[utoipa::path(
    get,
    path = "/api/v1/identity",
    security(()),
    responses((status = 200, description = "The coordinator's identity", body = Identity))
)]
async fn identity(State(shared): State<Arc<Shared>>) -> Json<Identity> {
    Json(Identity {
        coordinator_key: shared.coordinator_key(),
        protocol_version: PROTOCOL_VERSION,
        topic_prefix: shared.topics.prefix().to_string(),
    })
}

/// Stores new node credentials and refreshes the broker's view of them.
pub(crate) async fn refresh_access(shared: &Shared) {
    if let Err(error) = access::refresh(
        &shared.store,
        &shared.mqtt_access,
        shared.mosquitto.as_ref(),
    )
    .await
    {
        // The store holds the truth; the next change or restart rewrites the
        // files, so the operator can fix the directory meanwhile.
        tracing::error!(%error, "cannot refresh MQTT credentials");
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
        (status = 400, description = "Invalid node id", body = ApiError),
        (status = 401, description = "The join token is invalid, expired or used up", body = ApiError),
        (status = 409, description = "The node is enrolled already (revoke it first)", body = ApiError)
    )
)]
async fn enroll(
    State(shared): State<Arc<Shared>>,
    body: Result<Json<EnrollRequest>, JsonRejection>,
) -> Result<(StatusCode, Json<NodeCredentials>), ApiError> {
    let request = json_body(body, "EnrollRequest")?;
    let node = NodeId::new(&request.node_id).map_err(|error| {
        bad_request(
            "invalid_node_id",
            format!("node id {:?}: {error}", request.node_id),
        )
    })?;
    if shared.mqtt_access.is_internal_user(node.as_str()) {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "node_id_reserved",
            format!("{node} is the coordinator's own MQTT user; pick another node id"),
        ));
    }
    let (password, hashes) = access::new_node_password().map_err(ApiError::internal)?;
    let outcome = shared
        .store
        .enroll_node(
            &access::sha256_hex(request.join_token.trim()),
            node.as_str(),
            &hashes.sha256,
            &hashes.mosquitto,
            unix_now_ms(),
        )
        .await?;
    match outcome {
        EnrollOutcome::Enrolled => {}
        EnrollOutcome::BadToken => {
            return Err(ApiError::new(
                StatusCode::UNAUTHORIZED,
                "invalid_join_token",
                "the join token is invalid, expired or used up; create one with `starling token create`",
            ))
        }
        EnrollOutcome::AlreadyEnrolled => {
            return Err(ApiError::new(
                StatusCode::CONFLICT,
                "node_enrolled",
                format!("node {node} is enrolled already; its credentials stay valid (an operator can `starling node revoke {node}` first to enroll it again)"),
            ))
        }
    }
    refresh_access(&shared).await;
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
async fn create_join_token(
    State(shared): State<Arc<Shared>>,
    body: Result<Json<CreateJoinToken>, JsonRejection>,
) -> Result<(StatusCode, Json<JoinTokenCreated>), ApiError> {
    let request = json_body(body, "CreateJoinToken")?;
    let ttl = request
        .ttl_seconds
        .unwrap_or(DEFAULT_JOIN_TOKEN_TTL_SECONDS);
    if ttl == 0 || ttl > MAX_JOIN_TOKEN_TTL_SECONDS {
        return Err(bad_request(
            "invalid_ttl",
            format!("ttl_seconds must be 1..={MAX_JOIN_TOKEN_TTL_SECONDS} (30 days)"),
        ));
    }
    let uses = request.uses.unwrap_or(1);
    if uses == 0 || uses > MAX_JOIN_TOKEN_USES {
        return Err(bad_request(
            "invalid_uses",
            format!("uses must be 1..={MAX_JOIN_TOKEN_USES}"),
        ));
    }
    let token = access::new_secret(access::JOIN_TOKEN_PREFIX).map_err(ApiError::internal)?;
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
async fn revoke_node(
    State(shared): State<Arc<Shared>>,
    Path(id): Path<String>,
) -> Result<Json<NodeRevoked>, ApiError> {
    let now_ms = unix_now_ms();
    if !shared.store.revoke_node_credentials(&id, now_ms).await? {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "node_not_enrolled",
            format!("node {id:?} has no live credentials (never enrolled, or revoked already)"),
        ));
    }
    refresh_access(&shared).await;
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
    let lost = shared
        .store
        .requeue_node_tasks(&id, shared.max_attempts, now_ms)
        .await?;
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
async fn create_api_token(
    State(shared): State<Arc<Shared>>,
    body: Result<Json<CreateApiToken>, JsonRejection>,
) -> Result<(StatusCode, Json<ApiTokenCreated>), ApiError> {
    let request = json_body(body, "CreateApiToken")?;
    let name = request.name.trim();
    if name.is_empty() || name.len() > MAX_TOKEN_NAME_LEN {
        return Err(bad_request(
            "invalid_name",
            format!("a token needs a name of 1..={MAX_TOKEN_NAME_LEN} bytes saying who it is for"),
        ));
    }
    let token = access::new_secret(access::API_TOKEN_PREFIX).map_err(ApiError::internal)?;
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
async fn list_api_tokens(
    State(shared): State<Arc<Shared>>,
) -> Result<Json<ApiTokenList>, ApiError> {
    Ok(Json(ApiTokenList {
        tokens: shared.store.api_tokens().await?,
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
async fn revoke_api_token(
    State(shared): State<Arc<Shared>>,
    Path(id): Path<String>,
) -> Result<Json<ApiTokenList>, ApiError> {
    if !shared.store.revoke_api_token(&id, unix_now_ms()).await? {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "token_not_found",
            format!("no live API token {id:?}; list them with `starling api-token list`"),
        ));
    }
    tracing::info!(%id, "API token revoked");
    Ok(Json(ApiTokenList {
        tokens: shared.store.api_tokens().await?,
    }))
}

/// Reports whether the coordinator and its database answer.
#[utoipa::path(
    get,
    path = "/api/v1/health",
    responses(
        (status = 200, description = "The coordinator serves and its database answers", body = Health),
        (status = 503, description = "The database does not answer", body = ApiError)
    )
)]
async fn health(State(shared): State<Arc<Shared>>) -> Result<Json<Health>, ApiError> {
    shared.store.ping().await.map_err(|error| {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "database_unavailable",
            format!("the database does not answer: {error}"),
        )
    })?;
    let (nodes, nodes_online) = {
        let registry = shared.registry();
        (
            registry.len(),
            registry.nodes().filter(|node| node.online()).count(),
        )
    };
    Ok(Json(Health {
        status: "ok".to_string(),
        version: env!("CARGO_PKG_VERSION").to_string(),
        database: shared.store.backend_name().to_string(),
        policy: shared.policy_name.clone(),
        nodes,
        nodes_online,
    }))
}

fn node_summary(entry: &NodeEntry) -> NodeSummary {
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
async fn list_nodes(State(shared): State<Arc<Shared>>) -> Json<NodeList> {
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
async fn get_node(
    State(shared): State<Arc<Shared>>,
    Path(id): Path<String>,
) -> Result<Json<NodeDetail>, ApiError> {
    let unknown = || {
        ApiError::new(
            StatusCode::NOT_FOUND,
            "node_not_found",
            format!("no node {id:?} has reported; list nodes with GET /api/v1/nodes"),
        )
    };
    let node_id = NodeId::new(&id).map_err(|_| unknown())?;
    let registry = shared.registry();
    let entry = registry.get(&node_id).ok_or_else(unknown)?;
    let capability = serde_json::to_value(&entry.capability).map_err(ApiError::internal)?;
    let telemetry = entry
        .telemetry
        .as_ref()
        .map(serde_json::to_value)
        .transpose()
        .map_err(ApiError::internal)?;
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

/// Checks that bytes are a valid WebAssembly module, saying why not.
pub fn validate_wasm(bytes: &[u8]) -> Result<(), String> {
    if !bytes.starts_with(b"\0asm") {
        return Err("the body is not a WebAssembly module (it does not start with \\0asm); upload a .wasm file".to_string());
    }
    wasmparser::Validator::new()
        .validate_all(bytes)
        .map(|_| ())
        .map_err(|error| format!("the WebAssembly module is invalid: {error}"))
}

/// Decides what an upload is (a WebAssembly module or an OpenCL package) and
/// checks it, so that nothing a node could not run is ever stored.
pub fn validate_artifact(bytes: &[u8]) -> Result<Runtime, ApiError> {
    if bytes.starts_with(b"\0asm") {
        validate_wasm(bytes).map_err(|message| bad_request("invalid_artifact", message))?;
        Ok(Runtime::Wasm)
    } else if Package::looks_like(bytes) {
        Package::from_bytes(bytes).map_err(|error| {
            bad_request(
                "invalid_kernel",
                format!("{error}; see tasks/README.md for the [opencl] section of task.toml"),
            )
        })?;
        Ok(Runtime::Opencl)
    } else {
        Err(bad_request(
            "invalid_artifact",
            "the body is not a WebAssembly module (it does not start with \\0asm), nor an OpenCL package (a JSON object); upload a .wasm file, or publish a .cl kernel with `starling publish`",
        ))
    }
}

/// Stores a WebAssembly module or an OpenCL package (kernel source and spec,
/// as `starling publish KERNEL.cl` builds it) under its sha256, after checking
/// it: a module must validate, a package's spec must match its kernel.
/// Uploading the same bytes again is fine.
#[utoipa::path(
    post,
    path = "/api/v1/artifacts",
    security((), ("bearer" = [])),
    request_body(content(
        (Vec<u8> = "application/wasm"),
        (Vec<u8> = "application/vnd.starling.opencl+json")
    ), description = "The module's bytes, or the OpenCL package"),
    responses(
        (status = 201, description = "Stored (or already stored)", body = ArtifactStored),
        (status = 400, description = "Not a valid WebAssembly module or OpenCL package", body = ApiError),
        (status = 401, description = "Missing or wrong API token", body = ApiError),
        (status = 413, description = "Larger than the coordinator accepts", body = ApiError)
    )
)]
async fn upload_artifact(
    State(shared): State<Arc<Shared>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<(StatusCode, Json<ArtifactStored>), ApiError> {
    let bytes = body.map_err(|rejection| {
        if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "artifact_too_large",
                format!(
                    "the module is larger than the {} bytes this coordinator accepts; shrink it (wasm-opt, strip debug info) or raise max-artifact-bytes",
                    shared.max_artifact_bytes
                ),
            )
        } else {
            ApiError::new(rejection.status(), "bad_body", rejection.body_text())
        }
    })?;
    if bytes.is_empty() {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_artifact",
            "the body is empty; send the .wasm file's bytes",
        ));
    }
    let runtime = validate_artifact(&bytes)?;
    let digest = Digest(Sha256::digest(&bytes).into());
    let created = shared
        .store
        .put_artifact(&digest, &bytes, runtime, unix_now_ms())
        .await?;
    Ok((
        StatusCode::CREATED,
        Json(ArtifactStored {
            digest: digest.to_hex(),
            size: bytes.len() as u64,
            runtime: runtime.as_str().to_string(),
            created,
        }),
    ))
}

/// Records a publisher's signature over a stored artifact; every later
/// assignment of the artifact carries it, and nodes that trust the publisher
/// (`--trusted-publisher`) run only artifacts so signed.
#[utoipa::path(
    post,
    path = "/api/v1/artifacts/{digest}/signature",
    security((), ("bearer" = [])),
    params(("digest" = String, Path, description = "sha256 of the artifact, 64 hex digits")),
    request_body = ArtifactSignature,
    responses(
        (status = 200, description = "Recorded (replacing any earlier signature)", body = ArtifactSignature),
        (status = 400, description = "Not hex, or the signature does not verify over the digest", body = ApiError),
        (status = 401, description = "Missing or wrong API token", body = ApiError),
        (status = 403, description = "Role below developer", body = ApiError),
        (status = 404, description = "No such artifact", body = ApiError)
    )
)]
async fn sign_artifact(
    State(shared): State<Arc<Shared>>,
    Path(digest): Path<String>,
    body: Result<Json<ArtifactSignature>, JsonRejection>,
) -> Result<Json<ArtifactSignature>, ApiError> {
    let digest = parse_digest(&digest)?;
    let body = json_body(body, "ArtifactSignature")?;
    let decode = |what: &str, text: &str| {
        hex::decode(text.trim()).map_err(|error| {
            bad_request(
                "invalid_signature",
                format!("the {what} is not hex ({error}); starling sign writes both"),
            )
        })
    };
    let publisher = PublisherSignature {
        key: decode("key", &body.key)?,
        signature: decode("signature", &body.signature)?,
    };
    starling_agent::verify::verify_publisher(&publisher, &digest).map_err(|detail| {
        bad_request(
            "invalid_signature",
            format!("the publisher signature is refused: {detail}"),
        )
    })?;
    if !shared
        .store
        .set_artifact_publisher(&digest, &publisher)
        .await?
    {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "artifact_not_found",
            format!("no artifact {digest}; upload it first (starling publish FILE)"),
        ));
    }
    tracing::info!(artifact = %digest, publisher = %hex::encode(&publisher.key), "publisher signature recorded");
    Ok(Json(ArtifactSignature {
        key: hex::encode(&publisher.key),
        signature: hex::encode(&publisher.signature),
    }))
}

fn parse_digest(text: &str) -> Result<Digest, ApiError> {
    Digest::parse(text).map_err(|error| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_digest",
            format!("{error}; use the digest POST /api/v1/artifacts returned"),
        )
    })
}

/// Serves a module's bytes (agents fetch modules here).
#[utoipa::path(
    get,
    path = "/api/v1/artifacts/{digest}",
    params(("digest" = String, Path, description = "sha256 of the module, 64 hex digits")),
    responses(
        (status = 200, description = "The module", content_type = "application/wasm", body = Vec<u8>),
        (status = 400, description = "Not a digest", body = ApiError),
        (status = 404, description = "No such artifact", body = ApiError)
    )
)]
async fn get_artifact(
    State(shared): State<Arc<Shared>>,
    Path(digest): Path<String>,
) -> Result<Response, ApiError> {
    let digest = parse_digest(&digest)?;
    match shared.store.artifact(&digest).await? {
        Some(bytes) => {
            let media_type = if bytes.starts_with(b"\0asm") {
                "application/wasm"
            } else {
                starling_opencl::package::MEDIA_TYPE
            };
            Ok(([(header::CONTENT_TYPE, media_type)], bytes).into_response())
        }
        None => Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "artifact_not_found",
            format!("no artifact {digest}; upload it with POST /api/v1/artifacts (starling publish FILE.wasm)"),
        )),
    }
}

fn bad_request(error: &str, message: impl Into<String>) -> ApiError {
    ApiError::new(StatusCode::BAD_REQUEST, error, message)
}

fn check_submission(submission: &SubmitTask) -> Result<(Vec<u8>, f64), ApiError> {
    let input = match (&submission.input_base64, &submission.input_text) {
        (Some(_), Some(_)) => {
            return Err(bad_request(
                "invalid_input",
                "give input_base64 or input_text, not both",
            ))
        }
        (Some(encoded), None) => base64::engine::general_purpose::STANDARD
            .decode(encoded.trim())
            .map_err(|error| {
                bad_request(
                    "invalid_input",
                    format!("input_base64 is not valid base64: {error}"),
                )
            })?,
        (None, Some(text)) => text.as_bytes().to_vec(),
        (None, None) => Vec::new(),
    };
    if input.len() > MAX_INLINE_INPUT_BYTES {
        return Err(ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "input_too_large",
            format!(
                "the input is {} bytes; tasks take at most {MAX_INLINE_INPUT_BYTES} bytes of inline input",
                input.len()
            ),
        ));
    }
    if submission.args.len() > MAX_ARGS {
        return Err(bad_request(
            "invalid_args",
            format!("at most {MAX_ARGS} arguments are allowed"),
        ));
    }
    if let Some(arg) = submission.args.iter().find(|arg| arg.len() > ARG_LEN) {
        return Err(bad_request(
            "invalid_args",
            format!(
                "argument {:?}… is longer than {ARG_LEN} bytes",
                arg.chars().take(20).collect::<String>()
            ),
        ));
    }
    let work_seconds = submission
        .work_seconds
        .unwrap_or(starling_placement::model::UNKNOWN_TASK_WORK_S);
    if !work_seconds.is_finite() || work_seconds < 0.0 {
        return Err(bad_request(
            "invalid_work",
            "work_seconds must be a non-negative number",
        ));
    }
    let demand = &submission.demand;
    if !demand.cpu_cores.is_finite()
        || demand.cpu_cores <= 0.0
        || !demand.io_mbps.is_finite()
        || demand.io_mbps < 0.0
    {
        return Err(bad_request(
            "invalid_demand",
            "demand.cpu_cores must be positive and demand.io_mbps non-negative",
        ));
    }
    if submission.limits.wall_ms == 0 || submission.limits.memory_bytes == 0 {
        return Err(bad_request(
            "invalid_limits",
            "limits.wall_ms and limits.memory_bytes must be positive",
        ));
    }
    Ok((input, work_seconds))
}

/// What the coordinator keeps from binding a kernel to a submission.
struct KernelLaunch {
    device_bytes: u64,
    device: starling_opencl::DeviceType,
    fp64: bool,
}

/// Binds an OpenCL task's arguments and input to its package's spec, so that a
/// submission the kernel cannot take is refused now rather than failing on a node.
fn check_kernel_submission(
    package: &[u8],
    submission: &SubmitTask,
    input_len: usize,
) -> Result<KernelLaunch, ApiError> {
    // The package was validated on upload; failing here means the stored bytes
    // changed under us.
    let package = Package::from_bytes(package).map_err(ApiError::internal)?;
    let launch = package
        .spec
        .bind(&submission.args, input_len as u64)
        .map_err(|error| {
            let code = match error {
                starling_opencl::SpecError::InputSize { .. } => "invalid_input",
                _ => "invalid_args",
            };
            bad_request(code, error.to_string())
        })?;
    let output_limit = submission
        .limits
        .output_bytes
        .min(MAX_INLINE_OUTPUT_BYTES as u64);
    if launch.output_bytes > output_limit {
        return Err(bad_request(
            "invalid_limits",
            format!(
                "the kernel's output buffers take {} bytes, over the task's output limit of {output_limit} bytes (tasks return at most {MAX_INLINE_OUTPUT_BYTES} bytes inline); raise limits.output_bytes (--max-output) or shrink the output",
                launch.output_bytes
            ),
        ));
    }
    if launch.device_bytes > submission.limits.memory_bytes {
        return Err(bad_request(
            "invalid_limits",
            format!(
                "the kernel's buffers take {} bytes of device memory, over the task's memory limit of {} bytes; raise limits.memory_bytes (--memory)",
                launch.device_bytes, submission.limits.memory_bytes
            ),
        ));
    }
    let fp64 = package
        .spec
        .args
        .iter()
        .any(|arg| arg.ty == starling_opencl::ScalarType::Double);
    Ok(KernelLaunch {
        device_bytes: launch.device_bytes,
        device: package.spec.device,
        fp64,
    })
}

/// Submits a task: the module must be uploaded first.
#[utoipa::path(
    post,
    path = "/api/v1/tasks",
    request_body = SubmitTask,
    security((), ("bearer" = [])),
    responses(
        (status = 201, description = "Accepted; the task is pending", body = TaskDetail),
        (status = 400, description = "Invalid submission", body = ApiError),
        (status = 401, description = "Missing or wrong API token", body = ApiError),
        (status = 404, description = "Unknown artifact", body = ApiError),
        (status = 413, description = "Input too large", body = ApiError),
        (status = 422, description = "The JSON does not describe a task", body = ApiError)
    )
)]
async fn submit_task(
    State(shared): State<Arc<Shared>>,
    body: Result<Json<SubmitTask>, JsonRejection>,
) -> Result<(StatusCode, Json<TaskDetail>), ApiError> {
    let Json(submission) = body.map_err(|rejection| {
        ApiError::new(
            rejection.status(),
            "invalid_json",
            format!(
                "{}; see SubmitTask in GET /api/v1/openapi.json",
                rejection.body_text()
            ),
        )
    })?;
    let artifact = parse_digest(&submission.artifact)?;
    let Some((_, runtime)) = shared.store.artifact_info(&artifact).await? else {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "artifact_not_found",
            format!("no artifact {artifact}; upload the module first with POST /api/v1/artifacts (starling publish FILE.wasm)"),
        ));
    };
    let (input, work_seconds) = check_submission(&submission)?;
    let mut class = submission.class;
    let mut demand = submission.demand;
    if runtime == Runtime::Opencl {
        let bytes = shared.store.artifact(&artifact).await?.ok_or_else(|| {
            ApiError::new(
                StatusCode::NOT_FOUND,
                "artifact_not_found",
                format!("artifact {artifact} disappeared while submitting; upload it again"),
            )
        })?;
        let launch = check_kernel_submission(&bytes, &submission, input.len())?;
        // An OpenCL task always runs on a device, whatever class was declared,
        // and needs one of the wanted type with room for its buffers.
        class = TaskKind::Gpu;
        demand.gpu = true;
        demand.gpu_memory_bytes = launch.device_bytes;
        demand.device = launch.device;
        demand.fp64 = launch.fp64;
    }
    let now_ms = unix_now_ms();
    let task = NewTask {
        id: uuid::Uuid::now_v7().to_string(),
        artifact,
        runtime,
        input,
        args: submission.args,
        class,
        demand,
        limits: TaskLimits {
            grants: submission.grants.unwrap_or(submission.limits.grants),
            ..submission.limits
        },
        work_seconds,
        priority: submission.priority,
        deadline_unix_ms: submission.deadline_ms.map(|ms| now_ms.saturating_add(ms)),
        created_ms: now_ms,
    };
    shared.store.insert_task(&task).await?;
    shared.wake_scheduler.notify_one();
    let detail = task_detail(&shared, &task.id).await?;
    Ok((StatusCode::CREATED, Json(detail)))
}

fn task_summary(record: TaskRecord) -> TaskSummary {
    TaskSummary {
        id: record.spec.id,
        state: record.status,
        artifact: record.spec.artifact.to_hex(),
        node_id: record.node_id,
        attempt: record.attempt,
        priority: record.spec.priority,
        created_ms: record.spec.created_ms,
        updated_ms: record.updated_ms,
        reason: record.failure_reason,
        site: record.site,
    }
}

/// Lists tasks, newest first.
#[utoipa::path(
    get,
    path = "/api/v1/tasks",
    params(TaskListQuery),
    responses(
        (status = 200, description = "Tasks, newest first", body = TaskList),
        (status = 400, description = "Unknown state", body = ApiError)
    )
)]
async fn list_tasks(
    State(shared): State<Arc<Shared>>,
    query: Result<Query<TaskListQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<TaskList>, ApiError> {
    let Query(query) =
        query.map_err(|rejection| bad_request("invalid_query", rejection.body_text()))?;
    let status = query
        .state
        .as_deref()
        .map(str::parse::<TaskStatus>)
        .transpose()
        .map_err(|error| bad_request("invalid_state", error.to_string()))?;
    let limit = query
        .limit
        .unwrap_or(DEFAULT_LIST_LIMIT)
        .clamp(1, MAX_LIST_LIMIT);
    let tasks = shared.store.list_tasks(status, limit).await?;
    Ok(Json(TaskList {
        tasks: tasks.into_iter().map(task_summary).collect(),
    }))
}

fn task_not_found(id: &str) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "task_not_found",
        format!("no task {id:?}; list tasks with GET /api/v1/tasks (starling tasks)"),
    )
}

async fn task_detail(shared: &Shared, id: &str) -> Result<TaskDetail, ApiError> {
    let record = shared
        .store
        .task(id)
        .await?
        .ok_or_else(|| task_not_found(id))?;
    let events = shared.store.events(id).await?;
    let attempts = shared.store.attempts(id).await?;
    let spec = record.spec;
    Ok(TaskDetail {
        output_base64: record
            .output
            .as_ref()
            .map(|bytes| base64::engine::general_purpose::STANDARD.encode(bytes)),
        output_text: record
            .output
            .as_ref()
            .and_then(|bytes| String::from_utf8(bytes.clone()).ok()),
        id: spec.id,
        state: record.status,
        artifact: spec.artifact.to_hex(),
        runtime: spec.runtime.as_str().to_string(),
        args: spec.args,
        class: spec.class,
        demand: spec.demand,
        limits: spec.limits,
        work_seconds: spec.work_seconds,
        priority: spec.priority,
        deadline_unix_ms: spec.deadline_unix_ms,
        input_bytes: spec.input.len() as u64,
        created_ms: spec.created_ms,
        updated_ms: record.updated_ms,
        node_id: record.node_id,
        site: record.site,
        site_node: record.site_node,
        origin_site: record.origin.map(|(site, _)| site),
        attempt: record.attempt,
        power_level: record.power_level,
        exit_code: record.exit_code,
        reason: record.failure_reason,
        message: record.failure_message,
        cancel_requested: record.cancel_requested,
        explanation: record.explanation,
        attempts,
        events,
    })
}

/// Shows one task: state, node, attempt, output, failure, events and the placement explanation.
#[utoipa::path(
    get,
    path = "/api/v1/tasks/{id}",
    params(("id" = String, Path, description = "The task's id")),
    responses(
        (status = 200, description = "The task", body = TaskDetail),
        (status = 404, description = "No such task", body = ApiError)
    )
)]
async fn get_task(
    State(shared): State<Arc<Shared>>,
    Path(id): Path<String>,
) -> Result<Json<TaskDetail>, ApiError> {
    Ok(Json(task_detail(&shared, &id).await?))
}

/// Cancels a task: a pending one at once; a running one by sending its node a `Cancel`.
#[utoipa::path(
    post,
    path = "/api/v1/tasks/{id}/cancel",
    security((), ("bearer" = [])),
    params(("id" = String, Path, description = "The task's id")),
    responses(
        (status = 200, description = "Cancelled (it was pending)", body = TaskDetail),
        (status = 202, description = "Cancel sent to the node (or the site) running it", body = TaskDetail),
        (status = 401, description = "Missing or wrong API token", body = ApiError),
        (status = 404, description = "No such task", body = ApiError),
        (status = 409, description = "The task already ended", body = ApiError)
    )
)]
async fn cancel_task(
    State(shared): State<Arc<Shared>>,
    Path(id): Path<String>,
) -> Result<(StatusCode, Json<TaskDetail>), ApiError> {
    let status = match shared.store.request_cancel(&id, unix_now_ms()).await? {
        CancelOutcome::Cancelled => StatusCode::OK,
        CancelOutcome::SendCancel { node_id, attempt } => {
            send_cancel(&shared, &id, &node_id, attempt).await?;
            StatusCode::ACCEPTED
        }
        CancelOutcome::Forwarded => {
            if let Some(federation) = &shared.federation {
                federation.wake_forwarder.notify_one();
            }
            StatusCode::ACCEPTED
        }
        CancelOutcome::AlreadyEnded(state) => {
            return Err(ApiError::new(
                StatusCode::CONFLICT,
                "task_ended",
                format!("task {id} already ended ({state}); nothing to cancel"),
            ))
        }
        CancelOutcome::NotFound => return Err(task_not_found(&id)),
    };
    Ok((status, Json(task_detail(&shared, &id).await?)))
}

pub(crate) async fn send_cancel(
    shared: &Shared,
    task_id: &str,
    node_id: &str,
    attempt: u32,
) -> Result<(), ApiError> {
    let node = NodeId::new(node_id).map_err(ApiError::internal)?;
    let cancel = Cancel {
        v: PROTOCOL_VERSION,
        task_id: TaskId::new(task_id).map_err(ApiError::internal)?,
        attempt,
    };
    let bytes = encode(&cancel).map_err(ApiError::internal)?;
    shared
        .mqtt
        .publish(
            shared.topics.node(&node, Channel::Cancel),
            QoS::AtLeastOnce,
            false,
            bytes,
        )
        .await
        .map_err(ApiError::internal)
}

/// Prometheus metrics: nodes, tasks by state, MQTT messages handled and ignored.
#[utoipa::path(
    get,
    path = "/metrics",
    responses(
        (status = 200, description = "Metrics in the Prometheus text format", content_type = "text/plain"),
        (status = 500, description = "The database failed", body = ApiError)
    )
)]
async fn metrics(State(shared): State<Arc<Shared>>) -> Result<Response, ApiError> {
    use std::fmt::Write as _;
    use std::sync::atomic::Ordering::Relaxed;
    let counts = shared.store.task_counts().await?;
    let (nodes, online) = {
        let registry = shared.registry();
        (
            registry.len(),
            registry.nodes().filter(|node| node.online()).count(),
        )
    };
    let counters = &shared.counters;
    let mut text = String::new();
    // Writing to a String cannot fail.
    let mut metric = |name: &str, kind: &str, help: &str, samples: &[(String, u64)]| {
        let _ = writeln!(text, "# HELP {name} {help}\n# TYPE {name} {kind}");
        for (labels, value) in samples {
            let _ = writeln!(text, "{name}{labels} {value}");
        }
    };
    metric(
        "starling_nodes",
        "gauge",
        "Nodes known to the coordinator.",
        &[(String::new(), nodes as u64)],
    );
    metric(
        "starling_nodes_online",
        "gauge",
        "Nodes online.",
        &[(String::new(), online as u64)],
    );
    let tasks: Vec<(String, u64)> = TaskStatus::ALL
        .into_iter()
        .map(|status| {
            let count = counts
                .iter()
                .find(|(s, _)| *s == status)
                .map_or(0, |(_, c)| *c);
            (format!("{{state=\"{status}\"}}"), count)
        })
        .collect();
    metric("starling_tasks", "gauge", "Tasks by state.", &tasks);
    metric(
        "starling_mqtt_messages_handled_total",
        "counter",
        "MQTT messages applied (or recognised as redeliveries).",
        &[(String::new(), counters.messages_handled.load(Relaxed))],
    );
    metric(
        "starling_mqtt_messages_ignored_total",
        "counter",
        "MQTT messages refused: malformed, unknown node or task, mismatched ids.",
        &[(String::new(), counters.messages_ignored.load(Relaxed))],
    );
    metric(
        "starling_task_events_duplicate_total",
        "counter",
        "Task events received again and recorded only once.",
        &[(String::new(), counters.duplicate_events.load(Relaxed))],
    );
    metric(
        "starling_assignments_published_total",
        "counter",
        "Assignments published to nodes.",
        &[(String::new(), counters.assignments_published.load(Relaxed))],
    );
    metric(
        "starling_assignments_resent_total",
        "counter",
        "Assignments sent again because their node had not acknowledged them.",
        &[(String::new(), counters.assignments_resent.load(Relaxed))],
    );
    metric(
        "starling_assignments_rejected_total",
        "counter",
        "Assignments a node refused (bad signature, other node, expired, policy).",
        &[(String::new(), counters.assignments_rejected.load(Relaxed))],
    );
    metric(
        "starling_nodes_suspected_total",
        "counter",
        "Nodes marked offline because nothing was heard from them within the node timeout.",
        &[(String::new(), counters.nodes_suspected.load(Relaxed))],
    );
    metric(
        "starling_stale_attempts_cancelled_total",
        "counter",
        "Cancels sent to nodes reporting work on an attempt that is no longer current.",
        &[(String::new(), counters.stale_cancels.load(Relaxed))],
    );
    if let Some(federation) = &shared.federation {
        let gossip = federation.gossip.counters();
        let sites = federation.gossip.table().entries(std::time::Instant::now());
        let states: Vec<(String, u64)> = ["alive", "suspect", "down"]
            .into_iter()
            .map(|state| {
                let count = sites
                    .iter()
                    .filter(|entry| entry.state.as_str() == state)
                    .count();
                (format!("{{state=\"{state}\"}}"), count as u64)
            })
            .collect();
        metric(
            "starling_federation_sites",
            "gauge",
            "Other sites of the federation by failure-detector state.",
            &states,
        );
        for (name, help, counter) in [
            ("starling_gossip_datagrams_sent_total", "Gossip datagrams sent.", &gossip.datagrams_out),
            ("starling_gossip_bytes_sent_total", "Gossip bytes sent, sealed.", &gossip.bytes_out),
            ("starling_gossip_datagrams_received_total", "Gossip datagrams received.", &gossip.datagrams_in),
            ("starling_gossip_bytes_received_total", "Gossip bytes received.", &gossip.bytes_in),
            ("starling_gossip_datagrams_refused_total", "Gossip datagrams dropped: not sealed with the cluster key, or over the size bound.", &gossip.refused),
            ("starling_gossip_datagrams_malformed_total", "Authenticated gossip datagrams the membership protocol could not use.", &gossip.malformed),
            ("starling_gossip_digests_dropped_total", "Site digests dropped because they did not decode.", &gossip.digests_dropped),
        ] {
            metric(name, "counter", help, &[(String::new(), counter.load(Relaxed))]);
        }
    }
    Ok(([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text).into_response())
}

/// This document.
#[utoipa::path(
    get,
    path = "/api/v1/openapi.json",
    responses((status = 200, description = "The OpenAPI document of this API", content_type = "application/json"))
)]
async fn openapi_document() -> Response {
    ([(header::CONTENT_TYPE, "application/json")], openapi_json()).into_response()
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn every_route_has_an_access_rule() {
        for (i, (method, path, access)) in ROUTES.iter().enumerate() {
            assert_eq!(required_access(method, path), *access, "{method} {path}");
            assert!(
                !ROUTES[..i].iter().any(|(m, p, _)| m == method && p == path),
                "{method} {path} is listed twice"
            );
        }
        assert_eq!(
            required_access(&Method::POST, "/api/v1/tasks"),
            RouteAccess::Role(Role::Developer)
        );
        assert_eq!(
            required_access(&Method::HEAD, "/api/v1/tasks"),
            RouteAccess::Role(Role::Viewer)
        );
        // A method no rule names needs the highest role rather than none.
        assert_eq!(
            required_access(&Method::DELETE, "/api/v1/tasks/{id}"),
            RouteAccess::Role(Role::Admin)
        );
        assert_eq!(
            required_access(&Method::POST, "/api/v1/enroll"),
            RouteAccess::Public
        );
    }

    #[test]
    fn wasm_validation_explains() {
        assert!(validate_wasm(b"\0asm\x01\0\0\0").is_ok());
        assert!(validate_wasm(b"hello").unwrap_err().contains("\\0asm"));
        assert!(validate_wasm(b"\0asm\x01\0\0\0\x01")
            .unwrap_err()
            .contains("invalid"));
    }
}
