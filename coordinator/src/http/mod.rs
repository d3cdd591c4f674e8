//! The REST API under `/api/v1` (axum) and the HTTP server around it.
//! Handlers only parse and answer: each resource's handlers live in
//! `handlers/`, the route table with the role each route needs in `routes`,
//! the bearer-token check in `auth`, the federation routes' signed-request
//! check in `peer`, the mapping of every error to a status
//! and `{"error": CODE, "message": ...}` body in `error`, the OpenAPI
//! document in `openapi`. The request and response types are
//! `starling_api`'s.

mod auth;
pub(crate) mod connections;
pub(crate) mod console;
pub mod error;
mod handlers;
pub mod openapi;
mod peer;
mod routes;
mod state;
mod views;

pub(crate) use state::Shared;

use std::sync::Arc;

use axum::extract::rejection::JsonRejection;
use axum::extract::DefaultBodyLimit;
use axum::routing::{get, post};
use axum::{Json, Router};
use starling_api::ErrorCode;

use auth::authorize;
use error::HttpError;
use handlers::{
    access::*, artifacts::*, batch::*, events::*, federation::*, metrics::*, nodes::*,
    revocations::*, tasks::*,
};
use openapi::openapi_document;

pub use openapi::{openapi_json, ApiDoc};

/// Default number of tasks a list returns.
pub(crate) const DEFAULT_LIST_LIMIT: u32 = 50;

/// Most tasks a list returns.
pub(crate) const MAX_LIST_LIMIT: u32 = 1000;

/// Largest JSON request body (a task with its inline input in base64).
pub(crate) const MAX_JSON_BODY_BYTES: usize = 2 * 1024 * 1024;

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
        .route(
            "/api/v1/tasks:batch",
            post(submit_batch).layer(DefaultBodyLimit::max(MAX_BATCH_BODY_BYTES)),
        )
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
        .route("/api/v1/sites", get(list_sites))
        .route("/api/v1/events", get(events))
        .route("/api/v1/federation/tasks", post(accept_forward))
        .route(
            "/api/v1/federation/tasks/{site}/{task}",
            get(forward_status),
        )
        .route(
            "/api/v1/federation/tasks/{site}/{task}/cancel",
            post(cancel_forward),
        )
        .route("/api/v1/federation/revocations", post(accept_revocation))
        .route("/metrics", get(metrics))
        .fallback(not_found)
        .layer(DefaultBodyLimit::max(MAX_JSON_BODY_BYTES))
        .layer(axum::middleware::from_fn_with_state(
            shared.clone(),
            authorize,
        ))
        // The operator's console, behind its own gate (sessions, CSRF),
        // merged after the API's layers so they do not apply to it.
        .merge(console::router(shared.clone()))
        .with_state(shared)
}

async fn not_found() -> HttpError {
    HttpError::new(
        ErrorCode::NotFound,
        "no such endpoint; see GET /api/v1/openapi.json for the API",
    )
}

pub(crate) fn json_body<T>(
    body: Result<Json<T>, JsonRejection>,
    schema: &str,
) -> Result<T, HttpError> {
    body.map(|Json(value)| value).map_err(|rejection| {
        HttpError::with_status(
            rejection.status(),
            ErrorCode::InvalidJson,
            format!(
                "{}; see {schema} in GET /api/v1/openapi.json",
                rejection.body_text()
            ),
        )
    })
}

/// How long a client has to send a request's headers once the server
/// starts reading them. A connection that sends part of its headers and
/// stalls is closed when it runs out, so slow clients cannot hold sockets
/// and memory open indefinitely (issue 15, item 10). Ten seconds is ample
/// for a header block on any link the API serves.
pub const HEADER_READ_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// The most a connection buffers, reading or writing (hyper's default is
/// about 400 KiB). A client that stops reading an event stream holds at
/// most this much of the coordinator's memory beside its socket buffers,
/// and falls behind the live feed's ring sooner (then it gets a `reset`).
const MAX_CONNECTION_BUFFER: usize = 64 * 1024;

/// The most connections the API holds open at once, unless the descriptor
/// limit leaves less room ([`connections::connection_cap`]; the packaged
/// unit sets `LimitNOFILE=65536`). At the cap, the oldest connection that
/// has not sent a byte is closed to make room.
pub const MAX_CONNECTIONS: usize = 4096;

/// How long requests in flight may finish after `shutdown` resolves.
const SHUTDOWN_GRACE: std::time::Duration = std::time::Duration::from_secs(5);

/// Serves the API (over HTTPS with `tls`) until `shutdown` resolves, then
/// lets requests in flight finish for up to [`SHUTDOWN_GRACE`]. Both
/// schemes go through axum-server, because `axum::serve` does not expose
/// hyper's builder and so cannot set [`HEADER_READ_TIMEOUT`]. `connections`
/// caps the connections open at once; a connection's first request must
/// arrive within [`HEADER_READ_TIMEOUT`] of its accept (of its handshake,
/// under TLS), so one that sends nothing is closed too.
pub(crate) async fn serve(
    listener: tokio::net::TcpListener,
    router: Router,
    tls: Option<Arc<rustls::ServerConfig>>,
    connections: connections::ConnectionLimit,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let handle = axum_server::Handle::new();
    let stopper = handle.clone();
    tokio::spawn(async move {
        shutdown.await;
        stopper.graceful_shutdown(Some(SHUTDOWN_GRACE));
    });
    let listener = listener.into_std()?;
    let service = router.into_make_service();
    match tls {
        None => {
            let mut server = axum_server::from_tcp(listener)?
                .acceptor(connections)
                .first_request_timeout(HEADER_READ_TIMEOUT);
            // axum-server installs the timer this needs and turns hyper's
            // own default off; set ours.
            server
                .http_builder()
                .http1()
                .header_read_timeout(HEADER_READ_TIMEOUT)
                .max_buf_size(MAX_CONNECTION_BUFFER);
            server.handle(handle).serve(service).await
        }
        Some(tls) => {
            let config = axum_server::tls_rustls::RustlsConfig::from_config(tls);
            let mut server = axum_server::from_tcp_rustls(listener, config)?
                .map(|tls| tls.acceptor(connections))
                .first_request_timeout(HEADER_READ_TIMEOUT);
            // axum-server installs the timer this needs and turns hyper's
            // own default off; set ours.
            server
                .http_builder()
                .http1()
                .header_read_timeout(HEADER_READ_TIMEOUT)
                .max_buf_size(MAX_CONNECTION_BUFFER);
            server.handle(handle).serve(service).await
        }
    }
}
