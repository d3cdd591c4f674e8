//! `POST /api/v1/federation/revocations`: a site revoked by the trust root.
//! The root's signature is the revocation's authority (as a join token is
//! an enrollment's), so the route needs no token: the operator posts it to
//! any member, and members pass it to each other. A revocation that does not
//! verify changes nothing.

use std::sync::Arc;

use axum::extract::rejection::JsonRejection;
use axum::extract::State;
use axum::Json;
use starling_api::{ApiError, RevocationAccepted, SiteRevocation};

use crate::http::error::HttpError;
use crate::http::json_body;
use crate::http::Shared;

/// Revokes a site: its certificates issued until the revocation's time are
/// refused on every federation route and its digests dropped, here and, as
/// this member passes it on, at every member.
#[utoipa::path(
    post,
    path = "/api/v1/federation/revocations",
    request_body = SiteRevocation,
    responses(
        (status = 200, description = "Known here now (`new`: it was not before)", body = RevocationAccepted),
        (status = 400, description = "Not signed by this federation's trust root, or not a revocation", body = ApiError),
        (status = 404, description = "This coordinator does not federate", body = ApiError),
        (status = 415, description = "Not JSON", body = ApiError),
        (status = 422, description = "Not a revocation", body = ApiError)
    )
)]
pub(crate) async fn accept_revocation(
    State(shared): State<Arc<Shared>>,
    body: Result<Json<SiteRevocation>, JsonRejection>,
) -> Result<Json<RevocationAccepted>, HttpError> {
    let peers = shared.peers()?;
    let revocation = json_body(body, "SiteRevocation")?;
    Ok(Json(peers.revoke_site(revocation).await?))
}
