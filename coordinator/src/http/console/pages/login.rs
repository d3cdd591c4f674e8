//! Sign-in and sign-out. The user pastes an API token (or the bootstrap
//! `--api-token`); it is checked with the REST API's own `caller_role`, and
//! a session is opened whose cookie carries only a random session id.

use std::sync::Arc;

use axum::extract::{Query, State};
use axum::http::{header, Method, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use axum::Extension;
use maud::{html, Markup};
use serde::Deserialize;

use super::super::gate::{clear_cookie_header, session_cookie_header, FormFields, SessionKey};
use super::super::layout::{bare_page, respond, ConsoleError};
use super::super::session::Credential;
use crate::access;
use crate::http::auth::{caller_role, refuse_slowly};
use crate::http::Shared;
use crate::task::unix_now_ms;

/// Where to go after signing in.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct Next {
    next: Option<String>,
}

/// Only a path on this console: never another site (an open redirect),
/// never a scheme-relative `//host`.
fn safe_next(next: Option<&str>) -> &str {
    match next {
        Some(next) if next.starts_with('/') && !next.starts_with("//") && !next.contains('\\') => {
            next
        }
        _ => "/",
    }
}

fn form(next: &str, problem: Option<&str>) -> Markup {
    bare_page(
        "Sign in",
        html! {
            section.login {
                h1 { "Sign in" }
                p { "Paste an API token (" code { "starling api-token create" } ", or the coordinator's " code { "--api-token" } ")." }
                @if let Some(problem) = problem { p.badge.revoked #problem { (problem) } }
                form method="post" action="/login" {
                    input type="hidden" name="next" value=(next);
                    input #token type="password" name="token" autocomplete="off" required placeholder="API token";
                    button #sign-in type="submit" { "Sign in" }
                }
                p.muted { "The token stays on the server's side: your browser keeps only a session cookie." }
            }
        },
    )
}

/// `GET /login`.
pub(crate) async fn login_form(
    State(shared): State<Arc<Shared>>,
    Query(next): Query<Next>,
) -> Response {
    let next = safe_next(next.next.as_deref());
    if shared.api_token.is_none() {
        // Nothing is enforced: there is nothing to sign in to.
        return Redirect::to(next).into_response();
    }
    respond(StatusCode::OK, form(next, None))
}

/// `POST /login`: checks the token like the API does and opens a session.
pub(crate) async fn login(State(shared): State<Arc<Shared>>, body: axum::body::Bytes) -> Response {
    let fields = FormFields::parse(&body);
    let next = safe_next(fields.get("next")).to_owned();
    let Some(bootstrap) = shared.api_token.as_deref() else {
        return Redirect::to(&next).into_response();
    };
    let token = fields.get("token").unwrap_or("").trim();
    let role = match caller_role(&shared, bootstrap, Some(token)).await {
        Ok(Some(role)) => role,
        Ok(None) => {
            refuse_slowly(&Method::POST, "/login").await;
            return respond(
                StatusCode::UNAUTHORIZED,
                form(&next, Some("That token is unknown or revoked.")),
            );
        }
        Err(error) => return ConsoleError::from_http(error).await.into_response(),
    };
    let credential = Credential::Token {
        hash: access::sha256_hex(token),
    };
    let (id, _) = match shared
        .console
        .sessions
        .open(role, credential, unix_now_ms())
    {
        Ok(opened) => opened,
        Err(error) => return ConsoleError::from(error).into_response(),
    };
    tracing::info!(%role, "console sign-in");
    let mut response = Redirect::to(&next).into_response();
    if let Some(cookie) = session_cookie_header(&id.0, shared.console.secure) {
        response.headers_mut().insert(header::SET_COOKIE, cookie);
    }
    response
}

/// `POST /logout`: ends the session here and in the browser.
pub(crate) async fn logout(
    State(shared): State<Arc<Shared>>,
    Extension(session): Extension<SessionKey>,
) -> Response {
    shared.console.sessions.close(&session.0);
    let mut response = Redirect::to("/login").into_response();
    response.headers_mut().insert(
        header::SET_COOKIE,
        clear_cookie_header(shared.console.secure),
    );
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_local_paths_are_followed_after_sign_in() {
        assert_eq!(
            safe_next(Some("/tasks?state=failed")),
            "/tasks?state=failed"
        );
        for bad in [
            "https://evil.example/",
            "//evil.example",
            "/\\evil",
            "tasks",
            "",
        ] {
            assert_eq!(safe_next(Some(bad)), "/", "{bad}");
        }
        assert_eq!(safe_next(None), "/");
    }
}
