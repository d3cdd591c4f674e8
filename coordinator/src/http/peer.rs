//! Who is calling a federation route: a site of this federation, proved by
//! a request signed with its own key and its root-signed certificate
//! (`federation::identity::request`), checked here before the handler runs.
//! A route's `{site}` must be the calling site, and the handlers that read
//! a site from the body ask [`PeerSite::require`]: a site forwards, reads
//! and cancels only in its own name. The cluster key plays no part here;
//! it seals gossip only.

use axum::body::Body;
use axum::extract::{FromRequestParts, RawPathParams, Request};
use axum::http::request::Parts;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use starling_api::ErrorCode;
use starling_proto::SiteId;

use super::error::HttpError;
use crate::federation::identity::request::{
    PresentedSignature, CERTIFICATE_HEADER, SIGNATURE_HEADER, SITE_HEADER, TIMESTAMP_HEADER,
};
use crate::http::Shared;
use crate::task::unix_now_ms;

/// The site a federation request was signed by (set by [`authorize_peer`]).
#[derive(Debug, Clone)]
pub(crate) struct PeerSite(pub(crate) SiteId);

impl PeerSite {
    /// Refuses (403) unless `site` is the calling site.
    pub(crate) fn require(&self, site: &str) -> Result<(), HttpError> {
        if self.0.as_str() == site {
            Ok(())
        } else {
            Err(forbidden(&self.0, site))
        }
    }
}

fn forbidden(caller: &SiteId, named: &str) -> HttpError {
    HttpError::new(
        ErrorCode::Forbidden,
        format!(
            "site {caller} may not act for site {}: a site forwards, reads and cancels only its own tasks",
            named.chars().take(80).collect::<String>()
        ),
    )
}

impl<S: Send + Sync> FromRequestParts<S> for PeerSite {
    type Rejection = HttpError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, HttpError> {
        // Only a route behind `authorize_peer` has one: failing closed.
        parts.extensions.get::<PeerSite>().cloned().ok_or_else(|| {
            HttpError::new(
                ErrorCode::Unauthorized,
                "this route takes only requests signed by a site of this federation",
            )
        })
    }
}

/// Lets through only a request signed by a site of this federation, whose
/// certificate holds (root, expiry, revocations), signed within the allowed
/// skew, for this site, this method, path and body; and whose route's
/// `{site}`, if any, is the signer. The body is read here (bounded) to be
/// hashed, and handed on unchanged.
pub(crate) async fn authorize_peer(
    shared: &Shared,
    request: Request,
    next: Next,
    body_limit: usize,
) -> Response {
    let Some(federation) = shared.federation.as_ref() else {
        return HttpError::new(
            ErrorCode::NotFederated,
            "this coordinator does not federate; start it with --site, --cluster-key-file and --site-credentials",
        )
        .into_response();
    };
    let (mut parts, body) = request.into_parts();
    let body = match axum::body::to_bytes(body, body_limit).await {
        Ok(body) => body,
        Err(error) => {
            return HttpError::new(ErrorCode::BadBody, format!("cannot read the body: {error}"))
                .into_response()
        }
    };
    let header = |name: &str| {
        parts
            .headers
            .get(name)
            .and_then(|value| value.to_str().ok())
    };
    let presented = PresentedSignature {
        site: header(SITE_HEADER),
        certificate: header(CERTIFICATE_HEADER),
        timestamp: header(TIMESTAMP_HEADER),
        signature: header(SIGNATURE_HEADER),
    };
    let path = parts
        .uri
        .path_and_query()
        .map_or_else(|| parts.uri.path(), |path| path.as_str());
    let verified = federation.trust.verify_request(
        federation.site.as_str(),
        parts.method.as_str(),
        path,
        &presented,
        &body,
        unix_now_ms(),
    );
    let certificate = match verified {
        Ok(certificate) => certificate,
        Err(error) => {
            tracing::warn!(%error, claimed = ?presented.site, "refused a federation request");
            return HttpError::new(ErrorCode::Unauthorized, error.to_string()).into_response();
        }
    };
    let caller = PeerSite(certificate.site);
    if let Ok(params) = RawPathParams::from_request_parts(&mut parts, &()).await {
        if let Some((_, named)) = params.iter().find(|(name, _)| *name == "site") {
            if caller.require(named).is_err() {
                tracing::warn!(caller = %caller.0, named, "a site called a federation route in another site's name");
                return forbidden(&caller.0, named).into_response();
            }
        }
    }
    parts.extensions.insert(caller);
    next.run(Request::from_parts(parts, Body::from(body))).await
}
