//! The route table: every route with the access it needs. The middleware in
//! `auth` looks each request's matched route up here; a route or method
//! missing from it needs `admin`, so forgetting a line locks a route rather
//! than opening it.

use axum::http::Method;
use starling_api::Role;

/// What a route asks of its caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum RouteAccess {
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
pub(super) const ROUTES: &[(Method, &str, RouteAccess)] = &[
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
pub(super) fn required_access(method: &Method, path: &str) -> RouteAccess {
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
}
