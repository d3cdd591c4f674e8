//! The frame every console page shares (head, navigation, sign-out), the
//! error page every refusal becomes, and the small formatters the pages use.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use maud::{html, Markup, DOCTYPE};
use starling_api::{ApiError, Role, TaskStatus};

use super::csrf::{CsrfRefused, CSRF_FIELD};
use super::session::NoRandomness;
use crate::http::error::HttpError;

/// Who is looking at a page: what the gate found, for the page to show the
/// actions the caller may take and to put the CSRF token in its forms.
#[derive(Debug, Clone)]
pub(crate) struct Caller {
    /// The role the caller's token has now.
    pub(crate) role: Role,
    /// The session's CSRF token.
    pub(crate) csrf: String,
    /// Whether the console is open (no `--api-token`): there is nobody to
    /// sign out.
    pub(crate) open: bool,
}

impl Caller {
    /// Whether the caller may do what `role` may.
    pub(crate) fn may(&self, role: Role) -> bool {
        self.role.allows(role)
    }

    /// The hidden field every POST form carries.
    pub(crate) fn csrf_field(&self) -> Markup {
        html! { input type="hidden" name=(CSRF_FIELD) value=(self.csrf); }
    }
}

/// Which section of the navigation a page belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Section {
    Fleet,
    Tasks,
    Artifacts,
    Sites,
    Access,
}

/// Headers every console answer carries: no caching of pages that show
/// live state, no framing (clickjacking), scripts and styles only from
/// this origin.
pub(crate) fn secure_headers(response: &mut Response) {
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; \
             connect-src 'self'; frame-ancestors 'none'; form-action 'self'; base-uri 'none'",
        ),
    );
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("same-origin"),
    );
    headers
        .entry(header::CACHE_CONTROL)
        .or_insert(HeaderValue::from_static("no-store"));
}

fn head(title: &str) -> Markup {
    html! {
        head {
            meta charset="utf-8";
            meta name="viewport" content="width=device-width, initial-scale=1";
            // htmx would otherwise add an inline <style>, which the CSP refuses.
            meta name="htmx-config" content=r#"{"includeIndicatorStyles":false}"#;
            title { (title) " · Starling" }
            link rel="stylesheet" href="/console/assets/console.css";
            script src="/console/assets/htmx.min.js" defer {}
            script src="/console/assets/sse.js" defer {}
        }
    }
}

/// A whole page: head, navigation for `caller`, and `body`.
pub(crate) fn page(title: &str, caller: &Caller, section: Section, body: Markup) -> Markup {
    let link = |href: &str, name: &str, this: Section| {
        html! { a href=(href) class=[(section == this).then_some("here")] { (name) } }
    };
    html! {
        (DOCTYPE)
        html lang="en" {
            (head(title))
            // htmx's SSE extension serves every `sse-connect` on the page.
            body hx-ext="sse" {
                header.top {
                    a.brand href="/" { "Starling" }
                    nav {
                        (link("/", "Fleet", Section::Fleet))
                        (link("/tasks", "Tasks", Section::Tasks))
                        (link("/artifacts", "Artifacts", Section::Artifacts))
                        (link("/sites", "Sites", Section::Sites))
                        @if caller.may(Role::Operator) {
                            (link("/access", "Access", Section::Access))
                        }
                    }
                    div.who {
                        span.role { (caller.role.as_str()) }
                        @if !caller.open {
                            form method="post" action="/logout" {
                                (caller.csrf_field())
                                button.link type="submit" { "Sign out" }
                            }
                        }
                    }
                }
                main { (body) }
            }
        }
    }
}

/// A page for someone not signed in (sign-in, errors).
pub(crate) fn bare_page(title: &str, body: Markup) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            (head(title))
            body {
                header.top { a.brand href="/" { "Starling" } }
                main { (body) }
            }
        }
    }
}

/// Answers a page with the console's headers.
pub(crate) fn respond(status: StatusCode, markup: Markup) -> Response {
    let mut response = (status, markup).into_response();
    secure_headers(&mut response);
    response
}

/// Why a console request failed; each becomes an error page with its status.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ConsoleError {
    /// No such node, task or page.
    #[error("{0}")]
    NotFound(String),
    /// The caller's role is too low.
    #[error("this needs the {needed} role; you are signed in as {role}. Ask an admin for a token with `starling api-token create --role {needed}`")]
    Forbidden {
        /// What the route needs.
        needed: Role,
        /// What the caller has.
        role: Role,
    },
    /// A form failed the CSRF checks.
    #[error(transparent)]
    Csrf(#[from] CsrfRefused),
    /// The request is malformed (a form field, a query).
    #[error("{0}")]
    BadRequest(String),
    /// What the REST logic refused, with its status and message.
    #[error("{}", .1.message)]
    Api(StatusCode, ApiError),
    /// No random bytes for a session.
    #[error(transparent)]
    Random(#[from] NoRandomness),
}

impl ConsoleError {
    /// Turns a refusal of the REST handlers' logic into the console's, with
    /// its status and message.
    pub(crate) async fn from_http(error: HttpError) -> Self {
        let response = error.into_response();
        let status = response.status();
        let body = axum::body::to_bytes(response.into_body(), 64 * 1024)
            .await
            .ok()
            .and_then(|bytes| serde_json::from_slice::<ApiError>(&bytes).ok());
        match body {
            Some(body) => ConsoleError::Api(status, body),
            None => ConsoleError::BadRequest(format!("the request failed ({status})")),
        }
    }

    fn status(&self) -> StatusCode {
        match self {
            ConsoleError::NotFound(_) => StatusCode::NOT_FOUND,
            ConsoleError::Forbidden { .. } | ConsoleError::Csrf(_) => StatusCode::FORBIDDEN,
            ConsoleError::BadRequest(_) => StatusCode::BAD_REQUEST,
            ConsoleError::Api(status, _) => *status,
            ConsoleError::Random(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }
}

impl From<crate::store::StoreError> for ConsoleError {
    fn from(error: crate::store::StoreError) -> Self {
        let error = HttpError::from(error);
        ConsoleError::Api(
            StatusCode::INTERNAL_SERVER_ERROR,
            ApiError {
                error: error.code(),
                message: "the coordinator's store failed; see its log".to_owned(),
            },
        )
    }
}

impl From<crate::service::ServiceError> for ConsoleError {
    fn from(error: crate::service::ServiceError) -> Self {
        match error {
            crate::service::ServiceError::Store(error) => error.into(),
            other => {
                let (status, body) = HttpError::from(other).into_parts();
                ConsoleError::Api(status, body)
            }
        }
    }
}

impl IntoResponse for ConsoleError {
    fn into_response(self) -> Response {
        let status = self.status();
        let title = status.canonical_reason().unwrap_or("Error");
        respond(
            status,
            bare_page(
                title,
                html! {
                    section.error {
                        h1 { (status.as_u16()) " " (title) }
                        p.message { (self.to_string()) }
                        p { a href="/" { "Back to the fleet" } " · " a href="/login" { "Sign in" } }
                    }
                },
            ),
        )
    }
}

/// Bytes for people: `1.5 GiB`.
pub(crate) fn bytes(value: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut amount = value as f64;
    let mut unit = 0;
    while amount >= 1024.0 && unit + 1 < UNITS.len() {
        amount /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{value} B")
    } else {
        format!("{amount:.1} {}", UNITS[unit])
    }
}

/// How long ago `then_ms` was, for people: `4 s ago`, `3 min ago`.
pub(crate) fn ago(now_ms: u64, then_ms: u64) -> String {
    let seconds = now_ms.saturating_sub(then_ms) / 1000;
    match seconds {
        0..=59 => format!("{seconds} s ago"),
        60..=3599 => format!("{} min ago", seconds / 60),
        3600..=172_799 => format!("{} h ago", seconds / 3600),
        _ => format!("{} d ago", seconds / 86_400),
    }
}

/// A Unix-ms time as UTC, `2026-12-05 09:31:56Z`.
pub(crate) fn utc(ms: u64) -> String {
    let seconds = ms / 1000;
    let (days, rest) = (seconds / 86_400, seconds % 86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02}Z",
        rest / 3600,
        (rest % 3600) / 60,
        rest % 60
    )
}

/// A 0..=1 fraction as a percentage.
pub(crate) fn percent(fraction: f32) -> String {
    format!("{:.0}%", fraction * 100.0)
}

/// A task state as a coloured badge.
pub(crate) fn task_badge(status: TaskStatus) -> Markup {
    html! { span class={ "badge task-" (status.as_str()) } data-state=(status.as_str()) { (status.as_str()) } }
}

/// Hex of a string, for element ids and event names: node and task ids
/// are chosen by others and must not shape markup or the event stream.
pub(crate) fn hex_id(id: &str) -> String {
    hex::encode(id.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formatters_read_well() {
        assert_eq!(bytes(512), "512 B");
        assert_eq!(bytes(3 * 1024 * 1024 * 1024 / 2), "1.5 GiB");
        assert_eq!(ago(10_000, 6_000), "4 s ago");
        assert_eq!(ago(0, 5), "0 s ago");
        assert_eq!(ago(7_200_000, 0), "2 h ago");
        assert_eq!(utc(0), "1970-01-01 00:00:00Z");
        assert_eq!(utc(1_796_463_116_000), "2026-12-05 09:31:56Z");
        assert_eq!(percent(0.256), "26%");
        assert_eq!(hex_id("a<b"), "613c62");
    }
}
