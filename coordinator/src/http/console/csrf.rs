//! Cross-site request forgery defences for the console's forms. Every POST
//! must (1) come from this origin when the browser says where it comes from
//! (`Sec-Fetch-Site`, `Origin`), and (2) carry its session's CSRF token in
//! the `csrf` field, compared in constant time. The session cookie's
//! `SameSite=Strict` is a third layer, not the one relied on.

use axum::http::{header, HeaderMap};

use crate::access;

/// The form field that carries the CSRF token.
pub(crate) const CSRF_FIELD: &str = "csrf";

/// Why a POST was refused before it was read further.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum CsrfRefused {
    /// The browser says the request comes from another site.
    #[error("the request comes from another site ({0}); the console takes forms only from its own pages")]
    CrossSite(String),
    /// The form has no CSRF token, or the wrong one.
    #[error("the form's CSRF token is missing or wrong; reload the page and submit it again")]
    BadToken,
}

/// Refuses a request a browser marks as cross-site: `Sec-Fetch-Site` must be
/// `same-origin` when sent, and `Origin` must name this host when sent.
/// Clients that send neither (curl, old browsers) still need the CSRF token.
pub(crate) fn check_same_origin(headers: &HeaderMap, secure: bool) -> Result<(), CsrfRefused> {
    if let Some(site) = headers.get("sec-fetch-site") {
        let site = site.to_str().unwrap_or("?");
        if site != "same-origin" {
            return Err(CsrfRefused::CrossSite(format!("Sec-Fetch-Site: {site}")));
        }
    }
    if let Some(origin) = headers.get(header::ORIGIN) {
        let origin = origin.to_str().unwrap_or("?");
        let host = headers
            .get(header::HOST)
            .and_then(|host| host.to_str().ok())
            .unwrap_or("");
        let scheme = if secure { "https" } else { "http" };
        if host.is_empty() || origin != format!("{scheme}://{host}") {
            return Err(CsrfRefused::CrossSite(format!("Origin: {origin}")));
        }
    }
    Ok(())
}

/// Checks the form's `csrf` field against the session's token.
pub(crate) fn check_token(fields: &[(String, String)], expected: &str) -> Result<(), CsrfRefused> {
    let given = fields
        .iter()
        .find(|(name, _)| name == CSRF_FIELD)
        .map(|(_, value)| value.as_str())
        .ok_or(CsrfRefused::BadToken)?;
    // Both sides hashed first, so the comparison is of equal lengths and
    // its time says nothing about the token's length or a guess's prefix.
    if access::constant_time_eq(
        access::sha256_hex(given).as_bytes(),
        access::sha256_hex(expected).as_bytes(),
    ) {
        Ok(())
    } else {
        Err(CsrfRefused::BadToken)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.insert(*name, HeaderValue::from_static(value));
        }
        map
    }

    #[test]
    fn only_this_origin_may_post() {
        let own = headers(&[
            ("host", "127.0.0.1:8080"),
            ("origin", "http://127.0.0.1:8080"),
        ]);
        assert!(check_same_origin(&own, false).is_ok());
        // The same host over the other scheme is another origin.
        assert!(check_same_origin(&own, true).is_err());
        let other = headers(&[
            ("host", "127.0.0.1:8080"),
            ("origin", "http://evil.example"),
        ]);
        assert!(check_same_origin(&other, false).is_err());
        let cross = headers(&[("host", "a"), ("sec-fetch-site", "cross-site")]);
        assert!(check_same_origin(&cross, false).is_err());
        let sibling = headers(&[("host", "a"), ("sec-fetch-site", "same-site")]);
        assert!(check_same_origin(&sibling, false).is_err());
        assert!(check_same_origin(&headers(&[("sec-fetch-site", "same-origin")]), false).is_ok());
        assert!(check_same_origin(&HeaderMap::new(), false).is_ok());
    }

    #[test]
    fn the_token_must_match() {
        let fields = |value: &str| vec![("csrf".to_string(), value.to_string())];
        assert!(check_token(&fields("abc"), "abc").is_ok());
        assert_eq!(
            check_token(&fields("abd"), "abc"),
            Err(CsrfRefused::BadToken)
        );
        assert_eq!(check_token(&fields(""), "abc"), Err(CsrfRefused::BadToken));
        assert_eq!(check_token(&[], "abc"), Err(CsrfRefused::BadToken));
    }
}
