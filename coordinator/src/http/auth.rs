//! Who is calling: the bearer token's role for the API, a site's signed
//! request for the federation routes (checked in `peer`), and the console's session cookie (for the
//! console, and as an alternative to the bearer header on the API's GET
//! routes, so a browser's `EventSource` can read `GET /api/v1/events`). A
//! refused call (401, 403) is answered before its body is read, so it
//! changes nothing.

use std::sync::Arc;

use axum::extract::{MatchedPath, Request, State};
use axum::http::{header, HeaderMap, Method};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use starling_api::{ErrorCode, Role};

use super::console::session::Credential;
use super::error::HttpError;
use super::routes::{required_access, RouteAccess};
use crate::access;
use crate::http::Shared;
use crate::task::unix_now_ms;

/// The console's session cookie. Its value is a random session id; the API
/// token never travels in it.
pub(crate) const SESSION_COOKIE: &str = "starling_session";

/// How long a request with a wrong bearer token waits for its 401: a
/// guesser gets a few answers a second per connection (and connections are
/// capped), a person who mistyped does not notice.
const FAILED_TOKEN_DELAY: std::time::Duration = std::time::Duration::from_millis(250);

/// Requests refused for a wrong token since start (the log shows the
/// first and every hundredth).
static FAILED_TOKENS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// What every refusal of an unknown or revoked token pays, whether it came
/// as a bearer header or through the console's sign-in form: guessing costs
/// the guesser time, and is seen (the first refusal and every hundredth are
/// logged, so a guesser cannot flood the log either).
pub(crate) async fn refuse_slowly(method: &Method, route: &str) {
    let failures = FAILED_TOKENS.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
    if failures == 1 || failures.is_multiple_of(100) {
        tracing::warn!(
            failures,
            %method,
            route,
            "a request with an unknown or revoked token was refused"
        );
    }
    tokio::time::sleep(FAILED_TOKEN_DELAY).await;
}

/// Whom a request is charged to (the artifact quota): the sha256 (hex) of
/// its bearer token, or '' without one (no token enforced: one share for
/// everyone). The route's role was checked before the handler ran.
pub(crate) fn caller_key(headers: &HeaderMap) -> String {
    headers
        .get(header::AUTHORIZATION)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.strip_prefix("Bearer "))
        .map(str::trim)
        .filter(|token| !token.is_empty())
        .map(access::sha256_hex)
        .unwrap_or_default()
}

pub(crate) fn unauthorized(message: &str) -> Response {
    HttpError::new(ErrorCode::Unauthorized, message).into_response()
}

/// The role of the bearer token on a request: the bootstrap token is admin;
/// any other must be a live token in the store. `None` for a missing,
/// unknown or revoked token.
pub(crate) async fn caller_role(
    shared: &Shared,
    bootstrap: &str,
    given: Option<&str>,
) -> Result<Option<Role>, HttpError> {
    let Some(given) = given.map(str::trim).filter(|token| !token.is_empty()) else {
        return Ok(None);
    };
    role_of_token_hash(shared, bootstrap, &access::sha256_hex(given)).await
}

/// The role of the token whose sha256 (hex) is `given_hash`: what
/// [`caller_role`] decides, for a console session that holds only the hash.
pub(crate) async fn role_of_token_hash(
    shared: &Shared,
    bootstrap: &str,
    given_hash: &str,
) -> Result<Option<Role>, HttpError> {
    // Hashes of equal length are compared, so the time taken says nothing
    // about how close a guess was, nor how long the real token is.
    if access::constant_time_eq(
        given_hash.as_bytes(),
        access::sha256_hex(bootstrap).as_bytes(),
    ) {
        return Ok(Some(Role::Admin));
    }
    Ok(shared.access().role_of_token_hash(given_hash).await?)
}

/// The session id a request's `Cookie` header carries, if any.
pub(crate) fn session_cookie(headers: &HeaderMap) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(name, _)| *name == SESSION_COOKIE)
        .map(|(_, value)| value.trim().to_owned())
        .filter(|value| !value.is_empty())
}

/// A request's live console session, with the role its token has now.
#[derive(Debug, Clone)]
pub(crate) struct SessionCaller {
    /// The session id (the cookie's value).
    pub(crate) id: String,
    /// The role the session's token has now.
    pub(crate) role: Role,
    /// The session's CSRF token, for the forms a page renders.
    pub(crate) csrf: String,
}

/// The console session of a request, checked the way a bearer token is:
/// the token it was opened with must still be live (a revoked token ends
/// its sessions here, at their next request). `None` without a cookie, for
/// an unknown or expired session, or when its token is revoked.
pub(crate) async fn session_caller(
    shared: &Shared,
    headers: &HeaderMap,
) -> Result<Option<SessionCaller>, HttpError> {
    let Some(id) = session_cookie(headers) else {
        return Ok(None);
    };
    let sessions = &shared.console.sessions;
    let Some(session) = sessions.get(&id, unix_now_ms()) else {
        return Ok(None);
    };
    let role = match (&session.credential, shared.api_token.as_deref()) {
        // Nothing is enforced: the console is open like the API.
        (_, None) => Some(Role::Admin),
        // Tokens became enforced after an open session began (they cannot
        // at run time, but a session must never outlive its grounds).
        (Credential::Open, Some(_)) => None,
        (Credential::Token { hash }, Some(bootstrap)) => {
            let role = role_of_token_hash(shared, bootstrap, hash).await?;
            if role.is_none() {
                sessions.close_token(hash);
            }
            role
        }
    };
    Ok(role.map(|role| SessionCaller {
        id,
        role,
        csrf: session.csrf,
    }))
}

/// Checks every request's bearer token against the role its route needs,
/// before the body is read: a refused request changes nothing. Without a
/// bootstrap token (`--api-token`) nothing is enforced; `start` warns.
pub(crate) async fn authorize(
    State(shared): State<Arc<Shared>>,
    request: Request,
    next: Next,
) -> Response {
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
        RouteAccess::Peer => {
            return super::peer::authorize_peer(&shared, request, next, super::MAX_JSON_BODY_BYTES)
                .await
        }
        RouteAccess::Role(role) => role,
    };
    let Some(bootstrap) = shared.api_token.as_deref() else {
        // Open: no token to steal, so what a browser on this machine may be
        // made to send is checked instead.
        return match open_mode_refusal(request.method(), request.headers(), &shared.public_url) {
            None => next.run(request).await,
            Some(why) => HttpError::new(ErrorCode::Forbidden, why).into_response(),
        };
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
    // A browser has no bearer header to send (an `EventSource` cannot set
    // one): on GET routes, the console's session cookie stands in for it.
    // Never on other methods, whose requests a cookie alone must not make.
    let role = if !has_header && (method == Method::GET || method == Method::HEAD) {
        session_caller(&shared, request.headers())
            .await
            .map(|caller| caller.map(|caller| caller.role))
    } else {
        caller_role(&shared, bootstrap, given.as_deref()).await
    };
    match role {
        Ok(Some(role)) if role.allows(needed) => next.run(request).await,
        Ok(Some(role)) => HttpError::new(ErrorCode::Forbidden,
            format!(
                "{method} {route} needs the {needed} role; this token is {role}; ask an admin for a token with `starling api-token create --role {needed}`"
            ),
        )
        .into_response(),
        Ok(None) if has_header => {
            refuse_slowly(&method, &route).await;
            unauthorized(
                "the bearer token is unknown or revoked; pass a valid API token (starling --token, STARLING_API_TOKEN)",
            )
        }
        Ok(None) => unauthorized(
            "this coordinator requires an API token; send Authorization: Bearer TOKEN (starling --token, STARLING_API_TOKEN)",
        ),
        Err(error) => error.into_response(),
    }
}

/// Why an open coordinator (no `--api-token`) refuses a request a web page
/// could have made a browser send, if it does: with no token to present, a
/// cross-site `POST` from any page the operator opens would otherwise
/// revoke nodes or submit work (issue 33). Every request must name this
/// coordinator in `Host` (a loopback name or address, or the host of its
/// public URL: a DNS-rebinding page names its own); a request that changes
/// something must not come from another site (`Sec-Fetch-Site`) or another
/// origin (`Origin` naming another host than `Host`). Programs (the CLI,
/// curl) send neither header and pass.
pub(crate) fn open_mode_refusal(
    method: &Method,
    headers: &HeaderMap,
    public_url: &str,
) -> Option<&'static str> {
    let header_text = |name| headers.get(name).and_then(|value| value.to_str().ok());
    let host = header_text(header::HOST).unwrap_or("");
    let public_host = public_url
        .split_once("://")
        .map_or(public_url, |(_, rest)| rest)
        .split('/')
        .next()
        .unwrap_or("");
    if !host.is_empty() && !host.eq_ignore_ascii_case(public_host) && !is_loopback_host(host) {
        return Some("this coordinator runs without API tokens and answers only requests addressed to it (Host: a loopback name or its public URL's host); set --api-token to serve other names");
    }
    if *method == Method::GET || *method == Method::HEAD || *method == Method::OPTIONS {
        return None;
    }
    if let Some(site) = header_text(axum::http::HeaderName::from_static("sec-fetch-site")) {
        if site != "same-origin" && site != "none" {
            return Some("a cross-site request may not change anything on a coordinator without API tokens; call it from the CLI or set --api-token");
        }
    }
    if let Some(origin) = header_text(header::ORIGIN) {
        let origin_host = origin.split_once("://").map_or(origin, |(_, rest)| rest);
        if !origin_host.eq_ignore_ascii_case(host) {
            return Some("a request from another origin may not change anything on a coordinator without API tokens; call it from the CLI or set --api-token");
        }
    }
    None
}

/// Whether `host` (a `Host` header: name or address, with or without a
/// port) is this machine's loopback.
fn is_loopback_host(host: &str) -> bool {
    let name = if let Some(rest) = host.strip_prefix('[') {
        rest.split(']').next().unwrap_or("")
    } else {
        host.rsplit_once(':').map_or(host, |(name, port)| {
            if port.chars().all(|c| c.is_ascii_digit()) {
                name
            } else {
                host
            }
        })
    };
    name.eq_ignore_ascii_case("localhost")
        || name
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.to_canonical().is_loopback())
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.insert(
                axum::http::HeaderName::from_static(name),
                value.parse().unwrap(),
            );
        }
        map
    }

    const PUBLIC: &str = "http://127.0.0.1:8080";

    #[test]
    fn programs_and_same_origin_pages_pass() {
        for (method, pairs) in [
            (Method::POST, vec![("host", "127.0.0.1:8080")]),
            (Method::POST, vec![]),
            (
                Method::DELETE,
                vec![
                    ("host", "localhost:8080"),
                    ("origin", "http://localhost:8080"),
                    ("sec-fetch-site", "same-origin"),
                ],
            ),
            (Method::POST, vec![("host", "[::1]:8080")]),
            (
                Method::GET,
                vec![("host", "127.0.0.1:8080"), ("sec-fetch-site", "cross-site")],
            ),
        ] {
            assert_eq!(
                open_mode_refusal(&method, &headers(&pairs), PUBLIC),
                None,
                "{method} {pairs:?}"
            );
        }
        // The public URL's own host, whatever it is.
        let public = "https://edge.example:8443";
        assert_eq!(
            open_mode_refusal(
                &Method::POST,
                &headers(&[("host", "edge.example:8443")]),
                public
            ),
            None
        );
    }

    #[test]
    fn cross_site_writes_and_rebound_names_are_refused() {
        for (method, pairs) in [
            (
                Method::POST,
                vec![("host", "127.0.0.1:8080"), ("sec-fetch-site", "cross-site")],
            ),
            (
                Method::POST,
                vec![("host", "127.0.0.1:8080"), ("sec-fetch-site", "same-site")],
            ),
            (
                Method::DELETE,
                vec![
                    ("host", "127.0.0.1:8080"),
                    ("origin", "http://evil.example"),
                ],
            ),
            (
                Method::POST,
                vec![("host", "127.0.0.1:8080"), ("origin", "null")],
            ),
            // DNS rebinding: the page's own name, pointed at 127.0.0.1.
            (Method::GET, vec![("host", "evil.example:8080")]),
            (
                Method::POST,
                vec![
                    ("host", "evil.example:8080"),
                    ("origin", "http://evil.example:8080"),
                ],
            ),
        ] {
            assert!(
                open_mode_refusal(&method, &headers(&pairs), PUBLIC).is_some(),
                "{method} {pairs:?}"
            );
        }
    }
}
