//! The peer side of forwarding, and the federation as this coordinator sees
//! it (`GET /api/v1/sites`). The federation routes need a request signed by
//! the calling site (`http::peer`) whatever the API-token settings; `GET /api/v1/sites` is for
//! viewers like the rest of the read API.

use std::sync::Arc;
use std::time::Instant;

use axum::extract::rejection::JsonRejection;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;
use base64::Engine;
use sha2::{Digest as _, Sha256};
use starling_proto::{Digest, Runtime};

use starling_api::{
    ApiError, ErrorCode, ForwardAccepted, ForwardRequest, ForwardStatus, SiteList, SubmitTask,
};

use super::artifacts::verified_publisher;
use crate::federation::Federation;
use crate::http::error::HttpError;
use crate::http::peer::PeerSite;
use crate::service::tasks::{check_submission, KnownArtifacts};
use crate::store::{CancelOutcome, TaskRecord};
use crate::task::unix_now_ms;
use crate::Shared;

pub(crate) fn federation(shared: &Shared) -> Result<&Arc<Federation>, HttpError> {
    shared.federation.as_ref().ok_or_else(|| {
        HttpError::new(
            ErrorCode::NotFederated,
            "this coordinator does not federate; start it with --site and --cluster-key",
        )
    })
}

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
    let federation = federation(&shared)?;
    let Json(request) = body.map_err(|rejection| {
        HttpError::with_status(
            rejection.status(),
            ErrorCode::InvalidJson,
            rejection.body_text(),
        )
    })?;
    // A site forwards only its own tasks.
    caller.require(&request.origin_site)?;
    if let Some(existing) = shared
        .store
        .task_by_origin(&request.origin_site, &request.origin_task)
        .await?
    {
        return Ok((
            StatusCode::CREATED,
            Json(ForwardAccepted {
                task_id: existing.spec.id,
                created: false,
            }),
        ));
    }
    let bad = |message: String| HttpError::new(ErrorCode::InvalidForward, message);
    let artifact = Digest::parse(&request.artifact).map_err(|e| bad(e.to_string()))?;
    let runtime = match request.runtime.as_str() {
        "wasm" => Runtime::Wasm,
        "opencl" => Runtime::Opencl,
        other => return Err(bad(format!("unknown runtime {other:?}"))),
    };
    // A peer is trusted to forward, not to lift this site's bounds: the task
    // is checked as `POST /api/v1/tasks` checks a submission, by the same
    // function, first without the artifact, so that a forward this site
    // would refuse costs it no download.
    let submission = SubmitTask {
        artifact: request.artifact,
        input_base64: Some(request.input_base64),
        input_text: None,
        args: request.args,
        deadline_ms: None,
        priority: request.priority,
        class: request.class,
        demand: request.demand,
        limits: request.limits,
        work_seconds: Some(request.work_seconds),
        grants: None,
        wait_for_node: false,
    };
    check_submission(&submission)?;
    // Provenance: the publisher signature must verify over this artifact
    // before anything is fetched or stored.
    let publisher = request
        .publisher
        .as_ref()
        .map(|publisher| verified_publisher(publisher, &artifact))
        .transpose()?;
    if shared.store.artifact_info(&artifact).await?.is_none() {
        fetch_artifact(&shared, federation, &request.origin_site, &artifact).await?;
    }
    let mut task = shared
        .tasks()
        .prepare(submission, &mut KnownArtifacts::default())
        .await?;
    if task.runtime != runtime {
        return Err(bad(format!(
            "the forward says runtime {}, but artifact {artifact} is a {} artifact",
            runtime.as_str(),
            task.runtime.as_str()
        )));
    }
    // The task keeps its home's clock: the deadline it must meet there, and
    // when it was submitted.
    task.deadline_unix_ms = request.deadline_unix_ms;
    task.created_ms = request.created_ms;
    if let Some(publisher) = &publisher {
        // Kept with the artifact, so assignments here carry it as they do
        // at home. One already recorded here stays: a peer may add a
        // signature, not replace one (it could swap in a key this site's
        // nodes do not trust and so stop them running the artifact).
        if shared.store.artifact_publisher(&artifact).await?.is_none() {
            shared
                .store
                .set_artifact_publisher(&artifact, publisher)
                .await?;
        }
    }
    let (task_id, created) = shared
        .store
        .insert_forwarded_task(&task, &request.origin_site, &request.origin_task)
        .await?;
    if created {
        tracing::info!(task = %task_id, origin = %request.origin_site, origin_task = %request.origin_task, "took a task forwarded by another site");
        shared.wake_scheduler.notify_one();
    }
    Ok((
        StatusCode::CREATED,
        Json(ForwardAccepted { task_id, created }),
    ))
}

/// Fetches an artifact from the site that forwards a task using it, from the
/// REST URL that site gossips (never one the request names), and keeps it
/// only if its bytes hash to the digest and validate like an upload.
pub(crate) async fn fetch_artifact(
    shared: &Shared,
    federation: &Federation,
    origin: &str,
    artifact: &Digest,
) -> Result<(), HttpError> {
    let conflict = |message: String| HttpError::new(ErrorCode::ArtifactUnavailable, message);
    let api_url = federation
        .gossip
        .table()
        .entries(Instant::now())
        .into_iter()
        .find(|entry| entry.site == origin)
        .and_then(|entry| entry.api_url)
        .ok_or_else(|| {
            conflict(format!(
                "site {origin} has no digest here yet; forward again once gossip has spread it"
            ))
        })?;
    let url = format!("{api_url}/api/v1/artifacts/{}", artifact.to_hex());
    let mut response = federation.http.get(&url).send().await.map_err(|e| {
        conflict(format!(
            "cannot fetch artifact {artifact} from {origin}: {e}"
        ))
    })?;
    if !response.status().is_success() {
        return Err(conflict(format!(
            "site {origin} answered {} for artifact {artifact}",
            response.status()
        )));
    }
    if response
        .content_length()
        .is_some_and(|len| len > shared.max_artifact_bytes as u64)
    {
        return Err(conflict(format!(
            "artifact {artifact} is larger than this site accepts"
        )));
    }
    // Read chunk by chunk and given up past the maximum: a peer may send no
    // Content-Length (chunked) or a false one.
    let mut bytes = Vec::new();
    while let Some(chunk) = response.chunk().await.map_err(|e| {
        conflict(format!(
            "cannot fetch artifact {artifact} from {origin}: {e}"
        ))
    })? {
        if bytes.len() + chunk.len() > shared.max_artifact_bytes {
            return Err(conflict(format!(
                "site {origin} sent more than the {} bytes this site accepts for artifact {artifact}",
                shared.max_artifact_bytes
            )));
        }
        bytes.extend_from_slice(&chunk);
    }
    let actual = Digest(Sha256::digest(&bytes).into());
    if actual != *artifact {
        return Err(conflict(format!(
            "site {origin} sent bytes that hash to {actual}, not {artifact}"
        )));
    }
    let runtime = super::artifacts::validate_artifact(&bytes)?;
    shared
        .store
        .put_artifact(
            artifact,
            &bytes,
            runtime,
            &format!("site:{origin}"),
            unix_now_ms(),
        )
        .await?;
    Ok(())
}

/// The task `site` forwarded here as `task`.
pub(crate) async fn forwarded(
    shared: &Shared,
    site: &str,
    task: &str,
) -> Result<TaskRecord, HttpError> {
    federation(shared)?;
    shared
        .store
        .task_by_origin(site, task)
        .await?
        .ok_or_else(|| {
            HttpError::new(
                ErrorCode::ForwardNotFound,
                format!("no task forwarded by site {site} as {task}"),
            )
        })
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
    let record = forwarded(&shared, &site, &task).await?;
    Ok(Json(ForwardStatus {
        task_id: record.spec.id,
        state: record.status,
        node_id: record.node_id,
        output_base64: record
            .output
            .map(|bytes| base64::engine::general_purpose::STANDARD.encode(bytes)),
        exit_code: record.exit_code,
        reason: record.failure_reason,
        message: record.failure_message,
    }))
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
    let record = forwarded(&shared, &site, &task).await?;
    if let CancelOutcome::SendCancel { node_id, attempt } = shared
        .store
        .request_cancel(&record.spec.id, unix_now_ms())
        .await?
    {
        shared
            .publisher
            .send_cancel(&record.spec.id, &node_id, attempt)
            .await?;
    }
    forward_status(State(shared), Path((site, task))).await
}
