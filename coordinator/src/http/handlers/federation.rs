//! The peer side of forwarding, and the federation as this coordinator sees
//! it (`GET /api/v1/sites`). The federation routes need a request signed by
//! the calling site (`http::peer`) whatever the API-token settings; `GET /api/v1/sites` is for
//! viewers like the rest of the read API.

use std::sync::Arc;

use axum::extract::rejection::JsonRejection;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;
use starling_api::{ApiError, ErrorCode, ForwardAccepted, ForwardRequest, ForwardStatus, SiteList};

use crate::http::error::HttpError;
use crate::http::peer::PeerSite;
use crate::http::views::forward_status_view;
use crate::http::Shared;

/// Lists the sites of the federation: state by the failure detector, REST
/// URL, digest age, measured round trip and the newest digest.
#[utoipa::path(
    get,
    path = "/api/v1/sites",
    responses((status = 200, description = "The federation", body = SiteList))
)]
pub(crate) async fn list_sites(State(shared): State<Arc<Shared>>) -> Json<SiteList> {
    Json(crate::service::sites::site_list(
        shared.federation.as_deref(),
    ))
}

/// Takes a task another site forwards; idempotent on (origin site, origin task).
#[utoipa::path(
    post,
    path = "/api/v1/federation/tasks",
    security(("site_signature" = [])),
    request_body = ForwardRequest,
    responses(
        (status = 201, description = "Stored (or stored before)", body = ForwardAccepted),
        (status = 400, description = "Not a task this site can take: checked as POST /api/v1/tasks checks a submission; or its publisher signature does not verify over its artifact", body = ApiError),
        (status = 401, description = "Not signed by a site of this federation (missing, forged, stale, revoked)", body = ApiError),
        (status = 403, description = "Signed by another site than the one the request names", body = ApiError),
        (status = 404, description = "The artifact went from this site while the forward was taken", body = ApiError),
        (status = 409, description = "The origin site is unknown here, or its artifact cannot be fetched", body = ApiError),
        (status = 413, description = "Input too large", body = ApiError)
    )
)]
pub(crate) async fn accept_forward(
    State(shared): State<Arc<Shared>>,
    caller: PeerSite,
    body: Result<Json<ForwardRequest>, JsonRejection>,
) -> Result<(StatusCode, Json<ForwardAccepted>), HttpError> {
    let peers = shared.peers()?;
    let Json(request) = body.map_err(|rejection| {
        HttpError::with_status(
            rejection.status(),
            ErrorCode::InvalidJson,
            rejection.body_text(),
        )
    })?;
    // A site forwards only its own tasks.
    caller.require(&request.origin_site)?;
    Ok((StatusCode::CREATED, Json(peers.accept(request).await?)))
}

/// Where a task forwarded here stands.
#[utoipa::path(
    get,
    path = "/api/v1/federation/tasks/{site}/{task}",
    security(("site_signature" = [])),
    params(
        ("site" = String, Path, description = "The site that forwarded it"),
        ("task" = String, Path, description = "Its id at that site")
    ),
    responses(
        (status = 200, description = "Its state here", body = ForwardStatus),
        (status = 401, description = "Not signed by a site of this federation (missing, forged, stale, revoked)", body = ApiError),
        (status = 403, description = "Signed by another site than the one the request names", body = ApiError),
        (status = 404, description = "Never forwarded here", body = ApiError)
    )
)]
pub(crate) async fn forward_status(
    State(shared): State<Arc<Shared>>,
    Path((site, task)): Path<(String, String)>,
) -> Result<Json<ForwardStatus>, HttpError> {
    let record = shared.peers()?.forwarded(&site, &task).await?;
    Ok(Json(forward_status_view(record)))
}

/// Cancels a task forwarded here, at its home site's request.
#[utoipa::path(
    post,
    path = "/api/v1/federation/tasks/{site}/{task}/cancel",
    security(("site_signature" = [])),
    params(
        ("site" = String, Path, description = "The site that forwarded it"),
        ("task" = String, Path, description = "Its id at that site")
    ),
    responses(
        (status = 200, description = "Cancelled, cancelling, or already ended", body = ForwardStatus),
        (status = 401, description = "Not signed by a site of this federation (missing, forged, stale, revoked)", body = ApiError),
        (status = 403, description = "Signed by another site than the one the request names", body = ApiError),
        (status = 404, description = "Never forwarded here", body = ApiError)
    )
)]
pub(crate) async fn cancel_forward(
    State(shared): State<Arc<Shared>>,
    Path((site, task)): Path<(String, String)>,
) -> Result<Json<ForwardStatus>, HttpError> {
    let record = shared.peers()?.cancel(&site, &task).await?;
    Ok(Json(forward_status_view(record)))
}
