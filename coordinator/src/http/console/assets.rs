//! The console's static files, embedded in the binary: htmx and its SSE
//! extension (vendored, see `coordinator/assets/console/README.md`) and the
//! console's own stylesheet. No CDN is reached at run time.

use axum::extract::Path;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

/// Each file: name, content type, bytes.
const FILES: &[(&str, &str, &[u8])] = &[
    (
        "htmx.min.js",
        "text/javascript; charset=utf-8",
        include_bytes!("../../../assets/console/htmx.min.js"),
    ),
    (
        "sse.js",
        "text/javascript; charset=utf-8",
        include_bytes!("../../../assets/console/sse.js"),
    ),
    (
        "console.css",
        "text/css; charset=utf-8",
        include_bytes!("../../../assets/console/console.css"),
    ),
];

/// Serves one embedded file. They change only with the binary, so browsers
/// may keep them a day without asking again.
pub(crate) async fn asset(Path(file): Path<String>) -> Response {
    let Some((_, content_type, bytes)) = FILES.iter().find(|(name, _, _)| *name == file) else {
        return (StatusCode::NOT_FOUND, "no such console file").into_response();
    };
    let mut response = (*bytes).into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    headers.insert(
        header::CACHE_CONTROL,
        HeaderValue::from_static("public, max-age=86400"),
    );
    response
}
