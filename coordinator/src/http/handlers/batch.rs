//! Submitting many tasks in one request (`POST /api/v1/tasks:batch`): every
//! item is checked as `POST /api/v1/tasks` checks one, then all are stored in
//! one transaction, or none is.

use std::sync::Arc;

use axum::extract::rejection::JsonRejection;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::Json;
use starling_api::{ApiError, BatchSubmitted, SubmitBatch};

use crate::http::auth::caller_key;
use crate::http::error::HttpError;
use crate::http::json_body;
use crate::http::views::created_summary;
use crate::http::Shared;

/// The largest body of a batch: room for [`starling_api::MAX_BATCH_TASKS`] tasks with
/// small inline inputs (about 8 KiB each), four times the single submit's
/// limit. A batch of large inputs has to be split into smaller batches.
pub(crate) const MAX_BATCH_BODY_BYTES: usize = 8 * 1024 * 1024;

/// Submits up to 1000 tasks at once. Every item is checked first, as
/// `POST /api/v1/tasks` checks one; if any is refused, nothing is created
/// and the refusal is that item's, its message starting `tasks[INDEX]: `
/// (from 0). Otherwise all are stored in one transaction and the answer
/// lists them in the order given.
#[utoipa::path(
    post,
    path = "/api/v1/tasks:batch",
    request_body = SubmitBatch,
    security((), ("bearer" = [])),
    responses(
        (status = 201, description = "All accepted, in the order given; each task is pending", body = BatchSubmitted),
        (status = 400, description = "An empty batch (`empty_batch`), or an invalid item (its code; the message starts `tasks[INDEX]: `); nothing was created", body = ApiError),
        (status = 401, description = "Missing or wrong API token", body = ApiError),
        (status = 403, description = "The token's role cannot submit (developer needed)", body = ApiError),
        (status = 404, description = "An item names an unknown artifact (`tasks[INDEX]: `); nothing was created", body = ApiError),
        (status = 413, description = "More than 1000 tasks (`batch_too_large`), a body over 8 MiB, or an item's input too large; nothing was created", body = ApiError),
        (status = 415, description = "The body is not sent as application/json", body = ApiError),
        (status = 422, description = "The JSON does not describe a batch of tasks (`invalid_json`), or no node of the site could run an item (`no_capable_node`, `tasks[INDEX]: `; `wait_for_node` keeps it instead); nothing was created", body = ApiError),
        (status = 429, description = "With these tasks the caller's token would have more pending tasks than it may (`pending_quota_exceeded`); nothing was created", body = ApiError)
    )
)]
pub(crate) async fn submit_batch(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    body: Result<Json<SubmitBatch>, JsonRejection>,
) -> Result<(StatusCode, Json<BatchSubmitted>), HttpError> {
    let batch = json_body(body, "SubmitBatch")?;
    let tasks = shared
        .tasks()
        .submit_batch(&caller_key(&headers), batch.tasks)
        .await?;
    Ok((
        StatusCode::CREATED,
        Json(BatchSubmitted {
            tasks: tasks.iter().map(created_summary).collect(),
        }),
    ))
}
