//! The operator's console, served at `/` on the REST listener: server-rendered
//! HTML (maud) made live by htmx and its SSE extension (vendored, embedded
//! in the binary; see `coordinator/assets/console/`).
//!
//! Map: `gate` is the middleware every console route passes (route table
//! `CONSOLE_ROUTES` in `routes`, sessions, roles, CSRF); `session` the
//! in-memory session table; `csrf` the form checks; `pages/` one file per
//! page; `fragments` the rows the event stream re-sends; `explain` the
//! placement explanation; `stream` `GET /console/events`; `history` and
//! `svg` the sparklines; `reads` the reads the streams share; `layout` the page frame, the error page and
//! formatters; `assets` the embedded files.
//!
//! It lives under `http` because it is HTTP (the architecture checks keep
//! axum and `Shared` there), and it calls the REST handlers' own functions
//! for every read and action, so the console and the API cannot disagree.

mod assets;
pub(crate) mod csrf;
mod explain;
mod fragments;
pub(crate) mod gate;
mod history;
mod layout;
mod pages;
pub(crate) mod reads;
pub(crate) mod session;
mod stream;
mod svg;

use std::sync::Arc;

use axum::extract::DefaultBodyLimit;
use axum::routing::{get, post};
use axum::Router;

use crate::http::Shared;
use pages::{access, catalog, fleet, login, node, task, tasks};

/// The console's state in `Shared`: sessions and the sparklines' history.
#[derive(Debug, Default)]
pub(crate) struct Console {
    /// Signed-in browsers.
    pub(crate) sessions: session::Sessions,
    /// Recent telemetry per node.
    pub(crate) history: Arc<history::History>,
    /// Reads the live streams share.
    pub(crate) reads: reads::StreamReads,
    /// Whether the listener is HTTPS (the cookie is then `Secure`).
    pub(crate) secure: bool,
}

impl Console {
    /// An empty console for a listener that is HTTPS when `secure`.
    pub(crate) fn new(secure: bool) -> Self {
        Self {
            secure,
            ..Self::default()
        }
    }
}

/// The console's routes, behind its gate. Starts the task that keeps the
/// sparklines' history (one per coordinator) when a runtime is there.
pub(crate) fn router(shared: Arc<Shared>) -> Router<Arc<Shared>> {
    if let Ok(runtime) = tokio::runtime::Handle::try_current() {
        runtime.spawn(history::follow(
            shared.feed.clone(),
            shared.console.history.clone(),
            shared.registry.clone(),
        ));
    }
    Router::new()
        .route("/", get(fleet::fleet))
        .route("/nodes/revoke", post(fleet::revoke_many))
        .route("/nodes/{id}", get(node::node))
        .route("/nodes/{id}/revoke", post(node::revoke))
        .route("/tasks", get(tasks::tasks))
        .route("/tasks/{id}", get(task::task))
        .route("/artifacts", get(catalog::artifacts))
        .route("/sites", get(catalog::sites))
        .route("/access", get(access::access))
        .route("/access/join-tokens", post(access::new_join_token))
        .route("/access/api-tokens", post(access::new_api_token))
        .route("/access/api-tokens/{id}/revoke", post(access::revoke_token))
        .route("/login", get(login::login_form).post(login::login))
        .route("/logout", post(login::logout))
        .route("/console/events", get(stream::console_events))
        .route("/console/assets/{file}", get(assets::asset))
        .layer(DefaultBodyLimit::max(gate::MAX_FORM_BYTES))
        .layer(axum::middleware::from_fn_with_state(shared, gate::gate))
}
