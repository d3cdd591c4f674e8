//! The console's gate: the middleware in front of every console route. It
//! looks the route up in `CONSOLE_ROUTES` (missing means admin), finds the
//! caller's session (its token checked live, as the API checks a bearer
//! token), refuses a role too low, and for a POST checks the origin and the
//! session's CSRF token before any handler runs, so a refused request
//! changes nothing. Handlers get a [`Caller`] and, for a POST, its
//! [`FormFields`].

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{MatchedPath, Request, State};
use axum::http::{header, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Redirect, Response};
use starling_api::Role;

use super::csrf::{check_same_origin, check_token};
use super::layout::{secure_headers, Caller, ConsoleError};
use super::session::{Credential, SESSION_TTL_MS};
use crate::http::auth::{session_caller, SessionCaller, SESSION_COOKIE};
use crate::http::routes::{required_console_access, ConsoleAccess};
use crate::http::Shared;
use crate::task::unix_now_ms;

/// Largest console form body: a few fields, or a page of node ids.
pub(crate) const MAX_FORM_BYTES: usize = 64 * 1024;

/// A POST's decoded form, in order, repeated names kept (bulk revoke).
#[derive(Debug, Clone, Default)]
pub(crate) struct FormFields(pub(crate) Vec<(String, String)>);

impl FormFields {
    /// The first value of `name`.
    pub(crate) fn get(&self, name: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(field, _)| field == name)
            .map(|(_, value)| value.as_str())
    }

    /// Every value of `name`.
    pub(crate) fn all<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a str> + 'a {
        self.0
            .iter()
            .filter(move |(field, _)| field == name)
            .map(|(_, value)| value.as_str())
    }

    /// Decodes an `application/x-www-form-urlencoded` body.
    pub(crate) fn parse(body: &[u8]) -> Self {
        Self(
            form_urlencoded::parse(body)
                .map(|(name, value)| (name.into_owned(), value.into_owned()))
                .collect(),
        )
    }
}

/// The session a request came with (its id), for sign-out.
#[derive(Debug, Clone)]
pub(crate) struct SessionKey(pub(crate) String);

/// The `Set-Cookie` value that opens a session: HttpOnly (no script reads
/// it), SameSite=Strict (no other site's page sends it), Path=/ (the
/// console and `GET /api/v1/events`), Secure over HTTPS.
pub(crate) fn session_cookie_header(id: &str, secure: bool) -> Option<HeaderValue> {
    let secure = if secure { "; Secure" } else { "" };
    HeaderValue::from_str(&format!(
        "{SESSION_COOKIE}={id}; Path=/; HttpOnly; SameSite=Strict; Max-Age={}{secure}",
        SESSION_TTL_MS / 1000
    ))
    .ok()
}

/// The `Set-Cookie` value that makes the browser forget its session.
pub(crate) fn clear_cookie_header(secure: bool) -> HeaderValue {
    if secure {
        HeaderValue::from_static(
            "starling_session=; Path=/; HttpOnly; SameSite=Strict; Max-Age=0; Secure",
        )
    } else {
        HeaderValue::from_static("starling_session=; Path=/; HttpOnly; SameSite=Strict; Max-Age=0")
    }
}

/// Where a signed-out reader is sent: the sign-in page, then back here.
fn to_sign_in(request: &Request) -> Response {
    let back = request
        .uri()
        .path_and_query()
        .map_or("/", |path| path.as_str());
    let back: String = form_urlencoded::byte_serialize(back.as_bytes()).collect();
    Redirect::to(&format!("/login?next={back}")).into_response()
}

/// The middleware; see the module's description.
pub(crate) async fn gate(
    State(shared): State<Arc<Shared>>,
    request: Request,
    next: Next,
) -> Response {
    let mut response = pass(&shared, request, next).await;
    secure_headers(&mut response);
    response
}

async fn pass(shared: &Shared, request: Request, next: Next) -> Response {
    // No matched route: the fallback answers 404 and touches nothing.
    let Some(route) = request
        .extensions()
        .get::<MatchedPath>()
        .map(|path| path.as_str().to_owned())
    else {
        return next.run(request).await;
    };
    let method = request.method().clone();
    let reads = method == Method::GET || method == Method::HEAD;
    let secure = shared.console.secure;
    if !reads {
        if let Err(refused) = check_same_origin(request.headers(), secure) {
            return ConsoleError::from(refused).into_response();
        }
    }
    let needed = match required_console_access(&method, &route) {
        ConsoleAccess::Public | ConsoleAccess::SignIn => return next.run(request).await,
        ConsoleAccess::Role(role) => role,
    };
    let open = shared.api_token.is_none();
    let found = match session_caller(shared, request.headers()).await {
        Ok(found) => found,
        Err(error) => return ConsoleError::from_http(error).await.into_response(),
    };
    let (caller, new_cookie) = match found {
        Some(caller) => (caller, None),
        // Nothing is enforced: a reader gets a session without signing in,
        // only so that its forms have a CSRF token.
        None if open && reads => {
            match shared
                .console
                .sessions
                .open(Role::Admin, Credential::Open, unix_now_ms())
            {
                Ok((id, session)) => {
                    let cookie = session_cookie_header(&id.0, secure);
                    let caller = SessionCaller {
                        id: id.0,
                        role: session.role,
                        csrf: session.csrf,
                    };
                    (caller, cookie)
                }
                Err(error) => return ConsoleError::from(error).into_response(),
            }
        }
        None if reads => return to_sign_in(&request),
        None => {
            return ConsoleError::Api(
                StatusCode::UNAUTHORIZED,
                starling_api::ApiError {
                    error: starling_api::ErrorCode::Unauthorized,
                    message: "your session ended (signed out, expired, or its token was revoked); sign in again".to_owned(),
                },
            )
            .into_response()
        }
    };
    if !caller.role.allows(needed) {
        return ConsoleError::Forbidden {
            needed,
            role: caller.role,
        }
        .into_response();
    }
    let mut request = if reads {
        request
    } else {
        let (parts, body) = request.into_parts();
        let Ok(bytes) = axum::body::to_bytes(body, MAX_FORM_BYTES).await else {
            return ConsoleError::BadRequest(format!(
                "the form is larger than {MAX_FORM_BYTES} bytes"
            ))
            .into_response();
        };
        let fields = FormFields::parse(&bytes);
        if let Err(refused) = check_token(&fields.0, &caller.csrf) {
            return ConsoleError::from(refused).into_response();
        }
        let mut request = Request::from_parts(parts, Body::empty());
        request.extensions_mut().insert(fields);
        request
    };
    request.extensions_mut().insert(Caller {
        role: caller.role,
        csrf: caller.csrf,
        open,
    });
    request.extensions_mut().insert(SessionKey(caller.id));
    let mut response = next.run(request).await;
    if let Some(cookie) = new_cookie {
        response.headers_mut().append(header::SET_COOKIE, cookie);
    }
    response
}
