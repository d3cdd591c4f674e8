//! Submitting, listing, reading and cancelling tasks: each handler parses
//! its request, calls `service::tasks` and converts the answer.

use std::sync::Arc;

use axum::extract::rejection::JsonRejection;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::Json;
use starling_api::{
    ApiError, ErrorCode, SubmitTask, TaskDetail, TaskList, TaskListQuery, TaskStatus,
};

use super::events::{parse_wait, wait_for_end};
use crate::http::auth::caller_key;
use crate::http::error::HttpError;
use crate::http::views::task_summary;
use crate::http::Shared;
use crate::http::{DEFAULT_LIST_LIMIT, MAX_LIST_LIMIT};
use crate::service::tasks::Cancelled;

/// Submits a task: the module must be uploaded first.
#[utoipa::path(
    post,
    path = "/api/v1/tasks",
    request_body = SubmitTask,
    security((), ("bearer" = [])),
    responses(
        (status = 201, description = "Accepted; the task is pending", body = TaskDetail),
        (status = 400, description = "Invalid submission", body = ApiError),
        (status = 401, description = "Missing or wrong API token", body = ApiError),
        (status = 404, description = "Unknown artifact", body = ApiError),
        (status = 413, description = "Input too large", body = ApiError),
        (status = 422, description = "The JSON does not describe a task (`invalid_json`), or no node of the site could run it (`no_capable_node`, with the reasons; `wait_for_node` keeps it instead)", body = ApiError),
        (status = 429, description = "The caller's token has as many pending tasks as it may (`pending_quota_exceeded`); nothing was stored", body = ApiError)
    )
)]
pub(crate) async fn submit_task(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    body: Result<Json<SubmitTask>, JsonRejection>,
) -> Result<(StatusCode, Json<TaskDetail>), HttpError> {
    let Json(submission) = body.map_err(|rejection| {
        HttpError::with_status(
            rejection.status(),
            ErrorCode::InvalidJson,
            format!(
                "{}; see SubmitTask in GET /api/v1/openapi.json",
                rejection.body_text()
            ),
        )
    })?;
    let tasks = shared.tasks();
    let task = tasks.submit(&caller_key(&headers), submission).await?;
    let detail = tasks.detail(&task.id).await?;
    Ok((StatusCode::CREATED, Json(detail.into())))
}

/// Lists tasks, newest first.
#[utoipa::path(
    get,
    path = "/api/v1/tasks",
    params(TaskListQuery),
    responses(
        (status = 200, description = "Tasks, newest first", body = TaskList),
        (status = 400, description = "Unknown state", body = ApiError)
    )
)]
pub(crate) async fn list_tasks(
    State(shared): State<Arc<Shared>>,
    query: Result<Query<TaskListQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<TaskList>, HttpError> {
    let Query(query) = query
        .map_err(|rejection| HttpError::new(ErrorCode::InvalidQuery, rejection.body_text()))?;
    let status = query
        .state
        .as_deref()
        .map(str::parse::<TaskStatus>)
        .transpose()
        .map_err(|error| HttpError::new(ErrorCode::InvalidState, error.to_string()))?;
    let limit = query
        .limit
        .unwrap_or(DEFAULT_LIST_LIMIT)
        .clamp(1, MAX_LIST_LIMIT);
    let tasks = shared.tasks().list(status, limit).await?;
    Ok(Json(TaskList {
        tasks: tasks.into_iter().map(task_summary).collect(),
    }))
}

/// A long poll's wait.
#[derive(Debug, serde::Deserialize, utoipa::IntoParams)]
pub(crate) struct TaskWaitQuery {
    /// Answer once the task has ended, or after this long (like 30s, at most
    /// 60s) with the task as it stands then.
    wait: Option<String>,
}

/// Shows one task: state, node, attempt, output, failure, events and the
/// placement explanation. With `wait`, a long poll: the answer comes when the
/// task has ended or the wait is over, whichever is first.
#[utoipa::path(
    get,
    path = "/api/v1/tasks/{id}",
    params(("id" = String, Path, description = "The task's id"), TaskWaitQuery),
    responses(
        (status = 200, description = "The task", body = TaskDetail),
        (status = 400, description = "A malformed wait", body = ApiError),
        (status = 404, description = "No such task", body = ApiError)
    )
)]
pub(crate) async fn get_task(
    State(shared): State<Arc<Shared>>,
    Path(id): Path<String>,
    query: Result<Query<TaskWaitQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<TaskDetail>, HttpError> {
    let Query(query) = query
        .map_err(|rejection| HttpError::new(ErrorCode::InvalidQuery, rejection.body_text()))?;
    if let Some(wait) = query.wait.as_deref().map(parse_wait).transpose()? {
        wait_for_end(&shared, &id, wait).await;
    }
    Ok(Json(shared.tasks().detail(&id).await?.into()))
}

/// Cancels a task: a pending one at once; a running one by sending its node a `Cancel`.
#[utoipa::path(
    post,
    path = "/api/v1/tasks/{id}/cancel",
    security((), ("bearer" = [])),
    params(("id" = String, Path, description = "The task's id")),
    responses(
        (status = 200, description = "Cancelled (it was pending)", body = TaskDetail),
        (status = 202, description = "Cancel sent to the node (or the site) running it", body = TaskDetail),
        (status = 401, description = "Missing or wrong API token", body = ApiError),
        (status = 404, description = "No such task", body = ApiError),
        (status = 409, description = "The task already ended", body = ApiError)
    )
)]
pub(crate) async fn cancel_task(
    State(shared): State<Arc<Shared>>,
    Path(id): Path<String>,
) -> Result<(StatusCode, Json<TaskDetail>), HttpError> {
    let tasks = shared.tasks();
    let status = match tasks.cancel(&id).await? {
        Cancelled::Now => StatusCode::OK,
        Cancelled::Sent => StatusCode::ACCEPTED,
    };
    Ok((status, Json(tasks.detail(&id).await?.into())))
}
