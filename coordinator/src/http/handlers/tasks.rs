//! Submitting, listing, reading and cancelling tasks.

use std::collections::hash_map::Entry;
use std::collections::HashMap;
use std::sync::Arc;

use axum::extract::rejection::JsonRejection;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::Json;
use base64::Engine as _;
use starling_api::{
    ApiError, ErrorCode, SubmitTask, TaskDetail, TaskKind, TaskLimits, TaskList, TaskListQuery,
    TaskStatus, TaskSummary,
};
use starling_opencl::Package;
use starling_placement::capable::{incapable, Scope};
use starling_placement::ClusterView;
use starling_proto::limits::{
    ARG_LEN, MAX_ARGS, MAX_INLINE_INPUT_BYTES, MAX_INLINE_OUTPUT_BYTES, MAX_TASK_MEMORY_BYTES,
    MAX_TASK_OUTPUT_BYTES, MAX_TASK_WALL_MS,
};
use starling_proto::{Digest, Runtime};

use super::artifacts::parse_digest;
use super::events::{parse_wait, wait_for_end};
use crate::http::error::HttpError;
use crate::http::{DEFAULT_LIST_LIMIT, MAX_LIST_LIMIT};
use crate::loops::cluster_view::pending_task;
use crate::store::{Admission, CancelOutcome, NewTask, TaskRecord};
use crate::task::unix_now_ms;
use crate::Shared;

pub(crate) fn check_submission(submission: &SubmitTask) -> Result<(Vec<u8>, f64), HttpError> {
    let input = match (&submission.input_base64, &submission.input_text) {
        (Some(_), Some(_)) => {
            return Err(HttpError::new(
                ErrorCode::InvalidInput,
                "give input_base64 or input_text, not both",
            ))
        }
        (Some(encoded), None) => base64::engine::general_purpose::STANDARD
            .decode(encoded.trim())
            .map_err(|error| {
                HttpError::new(
                    ErrorCode::InvalidInput,
                    format!("input_base64 is not valid base64: {error}"),
                )
            })?,
        (None, Some(text)) => text.as_bytes().to_vec(),
        (None, None) => Vec::new(),
    };
    if input.len() > MAX_INLINE_INPUT_BYTES {
        return Err(HttpError::new(ErrorCode::InputTooLarge,
            format!(
                "the input is {} bytes; tasks take at most {MAX_INLINE_INPUT_BYTES} bytes of inline input",
                input.len()
            ),
        ));
    }
    if submission.args.len() > MAX_ARGS {
        return Err(HttpError::new(
            ErrorCode::InvalidArgs,
            format!("at most {MAX_ARGS} arguments are allowed"),
        ));
    }
    if let Some(arg) = submission.args.iter().find(|arg| arg.len() > ARG_LEN) {
        return Err(HttpError::new(
            ErrorCode::InvalidArgs,
            format!(
                "argument {:?}… is longer than {ARG_LEN} bytes",
                arg.chars().take(20).collect::<String>()
            ),
        ));
    }
    let work_seconds = submission
        .work_seconds
        .unwrap_or(starling_placement::model::UNKNOWN_TASK_WORK_S);
    if !work_seconds.is_finite() || work_seconds < 0.0 {
        return Err(HttpError::new(
            ErrorCode::InvalidWork,
            "work_seconds must be a non-negative number",
        ));
    }
    let demand = &submission.demand;
    if !demand.cpu_cores.is_finite()
        || demand.cpu_cores <= 0.0
        || !demand.io_mbps.is_finite()
        || demand.io_mbps < 0.0
    {
        return Err(HttpError::new(
            ErrorCode::InvalidDemand,
            "demand.cpu_cores must be positive and demand.io_mbps non-negative",
        ));
    }
    check_limits(&submission.limits)?;
    Ok((input, work_seconds))
}

/// Refuses limits that are zero or over the coordinator's maxima
/// (`starling_proto::limits::MAX_TASK_*`), so an unbounded limit is never
/// stored nor sent to a node. Forwarded tasks go through it too.
pub(crate) fn check_limits(limits: &TaskLimits) -> Result<(), HttpError> {
    if limits.wall_ms == 0 || limits.memory_bytes == 0 {
        return Err(HttpError::new(
            ErrorCode::InvalidLimits,
            "limits.wall_ms and limits.memory_bytes must be positive",
        ));
    }
    let over = [
        (
            "limits.wall_ms",
            limits.wall_ms,
            MAX_TASK_WALL_MS,
            "--timeout",
        ),
        (
            "limits.memory_bytes",
            limits.memory_bytes,
            MAX_TASK_MEMORY_BYTES,
            "--memory",
        ),
        (
            "limits.output_bytes",
            limits.output_bytes,
            MAX_TASK_OUTPUT_BYTES,
            "--max-output",
        ),
    ]
    .into_iter()
    .find(|(_, value, maximum, _)| value > maximum);
    match over {
        Some((field, value, maximum, flag)) => Err(HttpError::new(
            ErrorCode::InvalidLimits,
            format!("{field} is {value}, over the most this coordinator accepts ({maximum}); lower it (starling run {flag})"),
        )),
        None => Ok(()),
    }
}

/// What the coordinator keeps from binding a kernel to a submission.
pub(crate) struct KernelLaunch {
    device_bytes: u64,
    device: starling_opencl::DeviceType,
    fp64: bool,
}

/// Binds an OpenCL task's arguments and input to its package's spec, so that a
/// submission the kernel cannot take is refused now rather than failing on a node.
pub(crate) fn check_kernel_submission(
    package: &[u8],
    submission: &SubmitTask,
    input_len: usize,
) -> Result<KernelLaunch, HttpError> {
    // The package was validated on upload; failing here means the stored bytes
    // changed under us.
    let package = Package::from_bytes(package).map_err(HttpError::internal)?;
    let launch = package
        .spec
        .bind(&submission.args, input_len as u64)
        .map_err(|error| {
            let code = match error {
                starling_opencl::SpecError::InputSize { .. } => ErrorCode::InvalidInput,
                _ => ErrorCode::InvalidArgs,
            };
            HttpError::new(code, error.to_string())
        })?;
    let output_limit = submission
        .limits
        .output_bytes
        .min(MAX_INLINE_OUTPUT_BYTES as u64);
    if launch.output_bytes > output_limit {
        return Err(HttpError::new(ErrorCode::InvalidLimits,
            format!(
                "the kernel's output buffers take {} bytes, over the task's output limit of {output_limit} bytes (tasks return at most {MAX_INLINE_OUTPUT_BYTES} bytes inline); raise limits.output_bytes (--max-output) or shrink the output",
                launch.output_bytes
            ),
        ));
    }
    if launch.device_bytes > submission.limits.memory_bytes {
        return Err(HttpError::new(ErrorCode::InvalidLimits,
            format!(
                "the kernel's buffers take {} bytes of device memory, over the task's memory limit of {} bytes; raise limits.memory_bytes (--memory)",
                launch.device_bytes, submission.limits.memory_bytes
            ),
        ));
    }
    let fp64 = package
        .spec
        .args
        .iter()
        .any(|arg| arg.ty == starling_opencl::ScalarType::Double);
    Ok(KernelLaunch {
        device_bytes: launch.device_bytes,
        device: package.spec.device,
        fp64,
    })
}

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
    let task = prepare_task(&shared, submission, &mut KnownArtifacts::default()).await?;
    store_submitted(&shared, &headers, std::slice::from_ref(&task)).await?;
    let detail = task_detail(&shared, &task.id).await?;
    Ok((StatusCode::CREATED, Json(detail)))
}

/// Stores a submission's tasks as the caller's (its token's), within its
/// share of the queue (`pending-quota`): all of them, or none with
/// `pending_quota_exceeded`. Then wakes the scheduler.
pub(crate) async fn store_submitted(
    shared: &Shared,
    headers: &HeaderMap,
    tasks: &[NewTask],
) -> Result<(), HttpError> {
    let submitter = crate::http::auth::caller_key(headers);
    let quota = shared.pending_quota;
    match shared
        .store
        .insert_tasks_as(tasks, &submitter, Some(quota))
        .await?
    {
        Admission::Stored => {
            shared.wake_scheduler.notify_one();
            Ok(())
        }
        Admission::OverQuota { pending } => Err(HttpError::new(
            ErrorCode::PendingQuotaExceeded,
            format!(
                "this token has {pending} pending tasks and may have at most {quota} (pending-quota); {} more would pass it: wait for some to be placed, or cancel some (starling tasks --state pending)",
                tasks.len()
            ),
        )),
    }
}

/// What submitting needs of each artifact a submission names, looked up
/// once per request however many tasks name it: its runtime and, for an
/// OpenCL package, its bytes (the kernel's spec).
#[derive(Default)]
pub(crate) struct KnownArtifacts {
    artifacts: HashMap<Digest, (Runtime, Option<Vec<u8>>)>,
    /// The site's nodes, read at the first submission that needs them.
    nodes: Option<ClusterView>,
}

/// Refuses a task that no node of the site could run, online or not,
/// however idle (`no_capable_node`, with the reasons counted), unless the
/// submission asked to wait for one. A site that knows no node yet (just
/// started, its agents not connected) and a federated site (a peer may take
/// it) accept it; the scheduler parks it until the fleet changes.
fn check_capable(
    shared: &Shared,
    known: &mut KnownArtifacts,
    task: &NewTask,
) -> Result<(), HttpError> {
    if shared
        .federation
        .as_ref()
        .is_some_and(|federation| !federation.remote_sites(&[]).is_empty())
    {
        return Ok(());
    }
    let nodes = known
        .nodes
        .get_or_insert_with(|| shared.view_source().nodes().0);
    if nodes.nodes.is_empty() {
        return Ok(());
    }
    match incapable(nodes, &pending_task(0, task), Scope::Known) {
        None => Ok(()),
        Some(why) => Err(HttpError::new(
            ErrorCode::NoCapableNode,
            format!(
                "{}; submit it with \"wait_for_node\": true (starling run --wait-for-node) to keep it parked until such a node joins",
                why.summary
            ),
        )),
    }
}

/// Checks one submission against the limits, its artifact and, for an
/// OpenCL task, its kernel's spec, and makes the task to store (a fresh id,
/// submitted now). Stores nothing.
pub(crate) async fn prepare_task(
    shared: &Shared,
    submission: SubmitTask,
    known: &mut KnownArtifacts,
) -> Result<NewTask, HttpError> {
    let artifact = parse_digest(&submission.artifact)?;
    let (runtime, package) = match known.artifacts.entry(artifact) {
        Entry::Occupied(entry) => entry.into_mut(),
        Entry::Vacant(entry) => {
            let Some((_, runtime)) = shared.store.artifact_info(&artifact).await? else {
                return Err(HttpError::new(ErrorCode::ArtifactNotFound,
                    format!("no artifact {artifact}; upload the module first with POST /api/v1/artifacts (starling publish FILE.wasm)"),
                ));
            };
            let package = if runtime == Runtime::Opencl {
                Some(shared.store.artifact(&artifact).await?.ok_or_else(|| {
                    HttpError::new(
                        ErrorCode::ArtifactNotFound,
                        format!(
                            "artifact {artifact} disappeared while submitting; upload it again"
                        ),
                    )
                })?)
            } else {
                None
            };
            entry.insert((runtime, package))
        }
    };
    let runtime = *runtime;
    let (input, work_seconds) = check_submission(&submission)?;
    let mut class = submission.class;
    let mut demand = submission.demand;
    if let Some(bytes) = package {
        let launch = check_kernel_submission(bytes, &submission, input.len())?;
        // An OpenCL task always runs on a device, whatever class was declared,
        // and needs one of the wanted type with room for its buffers.
        class = TaskKind::Gpu;
        demand.gpu = true;
        demand.gpu_memory_bytes = launch.device_bytes;
        demand.device = launch.device;
        demand.fp64 = launch.fp64;
    }
    let now_ms = unix_now_ms();
    let wait_for_node = submission.wait_for_node;
    let task = NewTask {
        id: uuid::Uuid::now_v7().to_string(),
        artifact,
        runtime,
        input,
        args: submission.args,
        class,
        demand,
        limits: TaskLimits {
            grants: submission.grants.unwrap_or(submission.limits.grants),
            ..submission.limits
        },
        work_seconds,
        priority: submission.priority,
        deadline_unix_ms: submission.deadline_ms.map(|ms| now_ms.saturating_add(ms)),
        created_ms: now_ms,
    };
    if !wait_for_node {
        check_capable(shared, known, &task)?;
    }
    Ok(task)
}

pub(crate) fn task_summary(record: TaskRecord) -> TaskSummary {
    TaskSummary {
        id: record.spec.id,
        state: record.status,
        artifact: record.spec.artifact.to_hex(),
        node_id: record.node_id,
        attempt: record.attempt,
        priority: record.spec.priority,
        created_ms: record.spec.created_ms,
        updated_ms: record.updated_ms,
        reason: record.failure_reason,
        site: record.site,
    }
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
    let tasks = shared.store.list_tasks(status, limit).await?;
    Ok(Json(TaskList {
        tasks: tasks.into_iter().map(task_summary).collect(),
    }))
}

pub(crate) fn task_not_found(id: &str) -> HttpError {
    HttpError::new(
        ErrorCode::TaskNotFound,
        format!("no task {id:?}; list tasks with GET /api/v1/tasks (starling tasks)"),
    )
}

pub(crate) async fn task_detail(shared: &Shared, id: &str) -> Result<TaskDetail, HttpError> {
    let record = shared
        .store
        .task(id)
        .await?
        .ok_or_else(|| task_not_found(id))?;
    let events = shared.store.events(id).await?;
    let attempts = shared.store.attempts(id).await?;
    let spec = record.spec;
    Ok(TaskDetail {
        output_base64: record
            .output
            .as_ref()
            .map(|bytes| base64::engine::general_purpose::STANDARD.encode(bytes)),
        output_text: record
            .output
            .as_ref()
            .and_then(|bytes| String::from_utf8(bytes.clone()).ok()),
        id: spec.id,
        state: record.status,
        artifact: spec.artifact.to_hex(),
        runtime: spec.runtime.as_str().to_string(),
        args: spec.args,
        class: spec.class,
        demand: spec.demand,
        limits: spec.limits,
        work_seconds: spec.work_seconds,
        priority: spec.priority,
        deadline_unix_ms: spec.deadline_unix_ms,
        input_bytes: spec.input.len() as u64,
        created_ms: spec.created_ms,
        updated_ms: record.updated_ms,
        node_id: record.node_id,
        site: record.site,
        site_node: record.site_node,
        origin_site: record.origin.map(|(site, _)| site),
        attempt: record.attempt,
        power_level: record.power_level,
        exit_code: record.exit_code,
        reason: record.failure_reason,
        message: record.failure_message,
        cancel_requested: record.cancel_requested,
        explanation: record.explanation,
        attempts: attempts.into_iter().map(Into::into).collect(),
        events: events.into_iter().map(Into::into).collect(),
    })
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
    Ok(Json(task_detail(&shared, &id).await?))
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
    let status = match shared.store.request_cancel(&id, unix_now_ms()).await? {
        CancelOutcome::Cancelled => StatusCode::OK,
        CancelOutcome::SendCancel { node_id, attempt } => {
            shared.publisher.send_cancel(&id, &node_id, attempt).await?;
            StatusCode::ACCEPTED
        }
        CancelOutcome::Forwarded => {
            if let Some(federation) = &shared.federation {
                federation.wake_forwarder.notify_one();
            }
            StatusCode::ACCEPTED
        }
        CancelOutcome::AlreadyEnded(state) => {
            return Err(HttpError::new(
                ErrorCode::TaskEnded,
                format!("task {id} already ended ({state}); nothing to cancel"),
            ))
        }
        CancelOutcome::NotFound => return Err(task_not_found(&id)),
    };
    Ok((status, Json(task_detail(&shared, &id).await?)))
}
