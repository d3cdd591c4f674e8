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
    /// Another site of the federation: a request signed with its own key
    /// and root-signed certificate (`peer`), required whether or not API
    /// tokens are enforced.
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
        "/api/v1/events",
        RouteAccess::Role(Role::Viewer),
    ),
    (
        Method::GET,
        "/api/v1/sites",
        RouteAccess::Role(Role::Viewer),
    ),
    (Method::POST, "/api/v1/federation/tasks", RouteAccess::Peer),
    // The trust root's signature is a revocation's authority: any member
    // passes it on, and one that does not verify changes nothing.
    (
        Method::POST,
        "/api/v1/federation/revocations",
        RouteAccess::Public,
    ),
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
        "/api/v1/tasks:batch",
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

/// What a console route asks of its caller (the console's gate reads it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum ConsoleAccess {
    /// Anyone: the sign-in page and the console's static files.
    Public,
    /// The sign-in form: anyone, but only from the console's own pages
    /// (the same-origin checks, without a session's CSRF token yet).
    SignIn,
    /// A live session whose token has at least this role; POSTs also carry
    /// the session's CSRF token.
    Role(Role),
}

/// Every console route with the access it needs, the same roles as the REST
/// routes that do the same thing. A route or method missing from it needs
/// `admin`, so forgetting a line locks a page rather than opening it.
pub(super) const CONSOLE_ROUTES: &[(Method, &str, ConsoleAccess)] = &[
    (Method::GET, "/login", ConsoleAccess::Public),
    (Method::POST, "/login", ConsoleAccess::SignIn),
    (Method::GET, "/console/assets/{file}", ConsoleAccess::Public),
    (Method::POST, "/logout", ConsoleAccess::Role(Role::Viewer)),
    (Method::GET, "/", ConsoleAccess::Role(Role::Viewer)),
    (
        Method::GET,
        "/nodes/{id}",
        ConsoleAccess::Role(Role::Viewer),
    ),
    (Method::GET, "/tasks", ConsoleAccess::Role(Role::Viewer)),
    (
        Method::GET,
        "/tasks/{id}",
        ConsoleAccess::Role(Role::Viewer),
    ),
    (Method::GET, "/artifacts", ConsoleAccess::Role(Role::Viewer)),
    (Method::GET, "/sites", ConsoleAccess::Role(Role::Viewer)),
    (
        Method::GET,
        "/console/events",
        ConsoleAccess::Role(Role::Viewer),
    ),
    (
        Method::POST,
        "/nodes/revoke",
        ConsoleAccess::Role(Role::Operator),
    ),
    (
        Method::POST,
        "/nodes/{id}/revoke",
        ConsoleAccess::Role(Role::Operator),
    ),
    (Method::GET, "/access", ConsoleAccess::Role(Role::Operator)),
    (
        Method::POST,
        "/access/join-tokens",
        ConsoleAccess::Role(Role::Operator),
    ),
    (
        Method::POST,
        "/access/api-tokens",
        ConsoleAccess::Role(Role::Admin),
    ),
    (
        Method::POST,
        "/access/api-tokens/{id}/revoke",
        ConsoleAccess::Role(Role::Admin),
    ),
];

/// The access `method` on the console route template `path` needs (HEAD as GET).
pub(super) fn required_console_access(method: &Method, path: &str) -> ConsoleAccess {
    let method = if method == Method::HEAD {
        &Method::GET
    } else {
        method
    };
    CONSOLE_ROUTES
        .iter()
        .find(|(m, p, _)| m == method && *p == path)
        .map_or(ConsoleAccess::Role(Role::Admin), |(_, _, access)| *access)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn every_console_route_has_an_access_rule() {
        for (i, (method, path, access)) in CONSOLE_ROUTES.iter().enumerate() {
            assert_eq!(
                required_console_access(method, path),
                *access,
                "{method} {path}"
            );
            assert!(
                !CONSOLE_ROUTES[..i]
                    .iter()
                    .any(|(m, p, _)| m == method && p == path),
                "{method} {path} is listed twice"
            );
            // The console and the API never share a path: each table
            // speaks for its own routes only.
            assert!(
                !ROUTES.iter().any(|(_, p, _)| p == path),
                "{path} is in both tables"
            );
        }
        // Reading needs a session; changing needs the role the API asks.
        assert_eq!(
            required_console_access(&Method::HEAD, "/"),
            ConsoleAccess::Role(Role::Viewer)
        );
        assert_eq!(
            required_console_access(&Method::POST, "/nodes/{id}/revoke"),
            required_access(&Method::POST, "/api/v1/nodes/{id}/revoke").into_console()
        );
        assert_eq!(
            required_console_access(&Method::POST, "/access/api-tokens"),
            required_access(&Method::POST, "/api/v1/api-tokens").into_console()
        );
        // A method or route no rule names needs the highest role.
        assert_eq!(
            required_console_access(&Method::DELETE, "/nodes/{id}"),
            ConsoleAccess::Role(Role::Admin)
        );
        assert_eq!(
            required_console_access(&Method::GET, "/secret"),
            ConsoleAccess::Role(Role::Admin)
        );
    }

    impl RouteAccess {
        fn into_console(self) -> ConsoleAccess {
            match self {
                RouteAccess::Role(role) => ConsoleAccess::Role(role),
                other => panic!("{other:?} has no console twin"),
            }
        }
    }
    /// The route table and the OpenAPI document name the same routes: a
    /// route documented and not listed would need `admin` by accident, one
    /// listed and not documented would be missing from the contract (and
    /// from `scripts/api-fuzz`).
    /// `rest.rs::openapi_document_is_checked_in_and_every_get_path_answers`
    /// checks that the router serves every documented route.
    #[test]
    fn the_route_table_and_the_openapi_document_name_the_same_routes() {
        let document: serde_json::Value =
            serde_json::from_str(&super::super::openapi::openapi_json()).unwrap();
        let mut documented = std::collections::BTreeSet::new();
        for (path, operations) in document["paths"].as_object().unwrap() {
            for method in operations.as_object().unwrap().keys() {
                if method != "parameters" {
                    documented.insert((method.to_uppercase(), path.clone()));
                }
            }
        }
        let listed: std::collections::BTreeSet<(String, String)> = ROUTES
            .iter()
            .map(|(method, path, _)| (method.as_str().to_string(), (*path).to_string()))
            .collect();
        let undocumented: Vec<_> = listed.difference(&documented).collect();
        let unlisted: Vec<_> = documented.difference(&listed).collect();
        assert!(
            undocumented.is_empty() && unlisted.is_empty(),
            "in ROUTES, not in the OpenAPI document: {undocumented:?}; documented, not in ROUTES: {unlisted:?}"
        );
    }

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
            required_access(&Method::POST, "/api/v1/tasks:batch"),
            required_access(&Method::POST, "/api/v1/tasks"),
            "a batch needs what one submit needs"
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
