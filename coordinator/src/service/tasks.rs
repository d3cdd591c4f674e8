//! Tasks: submitting one or a batch (every bound checked, within the
//! caller's share of the queue), the checks a forwarded task passes too,
//! reading one with its history, listing, cancelling.

use std::collections::hash_map::Entry;
use std::collections::HashMap;
use std::sync::Arc;

use base64::Engine as _;
use starling_api::{
    batch_item_message, ErrorCode, SubmitTask, TaskKind, TaskLimits, TaskStatus, MAX_BATCH_TASKS,
};
use starling_opencl::Package;
use starling_placement::capable::{incapable, Scope};
use starling_placement::ClusterView;
use starling_proto::limits::{
    ARG_LEN, MAX_ARGS, MAX_INLINE_INPUT_BYTES, MAX_INLINE_OUTPUT_BYTES, MAX_TASK_MEMORY_BYTES,
    MAX_TASK_OUTPUT_BYTES, MAX_TASK_WALL_MS,
};
use starling_proto::{Digest, Runtime};
use tokio::sync::Notify;

use super::{parse_digest, ServiceError};
use crate::cluster_view::{pending_task, ViewSource};
use crate::federation::Federation;
use crate::mqtt::publish::Publisher;
use crate::store::{
    Admission, AttemptRecord, CancelOutcome, EventRecord, NewTask, Store, TaskRecord,
};
use crate::task::unix_now_ms;

/// What the task use cases need, and nothing else (built in `app.rs`).
#[derive(Clone)]
pub(crate) struct Tasks {
    /// Tasks, artifacts, their history.
    pub(crate) store: Store,
    /// The fleet, to refuse a task no node could run.
    pub(crate) views: ViewSource,
    /// Peers that may take what this site cannot: then nothing is refused
    /// for want of a node here.
    pub(crate) federation: Option<Arc<Federation>>,
    /// Sends a running task's node its cancel.
    pub(crate) publisher: Publisher,
    /// Woken when work is stored.
    pub(crate) wake_scheduler: Arc<Notify>,
    /// Most pending tasks one submitter may have (`pending-quota`).
    pub(crate) pending_quota: u64,
}

/// A task with its history: what `GET /api/v1/tasks/{id}` and the console
/// show (converted in `http::views`).
pub(crate) struct TaskHistory {
    /// The task as stored.
    pub(crate) record: TaskRecord,
    /// Its events, oldest first.
    pub(crate) events: Vec<EventRecord>,
    /// Its attempts, oldest first.
    pub(crate) attempts: Vec<AttemptRecord>,
}

/// What a cancel did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Cancelled {
    /// The task was pending: it is cancelled.
    Now,
    /// A cancel went to the node (or the site) running it.
    Sent,
}

impl Tasks {
    /// Checks one submission and stores it as `submitter`'s, within its
    /// share of the queue.
    pub(crate) async fn submit(
        &self,
        submitter: &str,
        submission: SubmitTask,
    ) -> Result<NewTask, ServiceError> {
        let task = self
            .prepare(submission, &mut KnownArtifacts::default())
            .await?;
        self.store_submitted(submitter, std::slice::from_ref(&task))
            .await?;
        Ok(task)
    }

    /// Checks every item of a batch as [`Tasks::submit`] checks one, then
    /// stores all of them in one transaction, or none: a refusal is its
    /// item's, its message starting `tasks[INDEX]: `.
    pub(crate) async fn submit_batch(
        &self,
        submitter: &str,
        submissions: Vec<SubmitTask>,
    ) -> Result<Vec<NewTask>, ServiceError> {
        if submissions.is_empty() {
            return Err(ServiceError::refused(
                ErrorCode::EmptyBatch,
                "the batch has no tasks; give at least one in \"tasks\"",
            ));
        }
        if submissions.len() > MAX_BATCH_TASKS {
            return Err(ServiceError::refused(
                ErrorCode::BatchTooLarge,
                format!(
                    "the batch has {} tasks; one request takes at most {MAX_BATCH_TASKS}: split it",
                    submissions.len()
                ),
            ));
        }
        let mut known = KnownArtifacts::default();
        let mut tasks = Vec::with_capacity(submissions.len());
        for (index, submission) in submissions.into_iter().enumerate() {
            let task = self
                .prepare(submission, &mut known)
                .await
                .map_err(|error| error.map_message(|message| batch_item_message(index, message)))?;
            tasks.push(task);
        }
        self.store_submitted(submitter, &tasks).await?;
        Ok(tasks)
    }

    /// Stores a submission's tasks as `submitter`'s (the sha256 of its API
    /// token), within its share of the queue (`pending-quota`): all of
    /// them, or none with `pending_quota_exceeded`. Then wakes the scheduler.
    async fn store_submitted(
        &self,
        submitter: &str,
        tasks: &[NewTask],
    ) -> Result<(), ServiceError> {
        let quota = self.pending_quota;
        match self
            .store
            .insert_tasks_as(tasks, submitter, Some(quota))
            .await?
        {
            Admission::Stored => {
                self.wake_scheduler.notify_one();
                Ok(())
            }
            Admission::OverQuota { pending } => Err(ServiceError::refused(
                ErrorCode::PendingQuotaExceeded,
                format!(
                    "this token has {pending} pending tasks and may have at most {quota} (pending-quota); {} more would pass it: wait for some to be placed, or cancel some (starling tasks --state pending)",
                    tasks.len()
                ),
            )),
        }
    }

    /// One task with its events and attempts.
    pub(crate) async fn detail(&self, id: &str) -> Result<TaskHistory, ServiceError> {
        let record = self
            .store
            .task(id)
            .await?
            .ok_or_else(|| task_not_found(id))?;
        let events = self.store.events(id).await?;
        let attempts = self.store.attempts(id).await?;
        Ok(TaskHistory {
            record,
            events,
            attempts,
        })
    }

    /// One task as stored, if there is one.
    pub(crate) async fn record(&self, id: &str) -> Result<Option<TaskRecord>, ServiceError> {
        Ok(self.store.task(id).await?)
    }

    /// Tasks, newest first, optionally only those in one state.
    pub(crate) async fn list(
        &self,
        status: Option<TaskStatus>,
        limit: u32,
    ) -> Result<Vec<TaskRecord>, ServiceError> {
        Ok(self.store.list_tasks(status, limit).await?)
    }

    /// Cancels a task: a pending one at once; a running one by sending its
    /// node (or the site it was forwarded to) a cancel.
    pub(crate) async fn cancel(&self, id: &str) -> Result<Cancelled, ServiceError> {
        match self.store.request_cancel(id, unix_now_ms()).await? {
            CancelOutcome::Cancelled => Ok(Cancelled::Now),
            CancelOutcome::SendCancel { node_id, attempt } => {
                self.publisher.send_cancel(id, &node_id, attempt).await?;
                Ok(Cancelled::Sent)
            }
            CancelOutcome::Forwarded => {
                if let Some(federation) = &self.federation {
                    federation.wake_forwarder.notify_one();
                }
                Ok(Cancelled::Sent)
            }
            CancelOutcome::AlreadyEnded(state) => Err(ServiceError::refused(
                ErrorCode::TaskEnded,
                format!("task {id} already ended ({state}); nothing to cancel"),
            )),
            CancelOutcome::NotFound => Err(task_not_found(id)),
        }
    }

    /// Refuses a task that no node of the site could run, online or not,
    /// however idle (`no_capable_node`, with the reasons counted), unless the
    /// submission asked to wait for one. A site that knows no node yet (just
    /// started, its agents not connected) and a federated site (a peer may take
    /// it) accept it; the scheduler parks it until the fleet changes.
    fn check_capable(
        &self,
        known: &mut KnownArtifacts,
        task: &NewTask,
    ) -> Result<(), ServiceError> {
        if self
            .federation
            .as_ref()
            .is_some_and(|federation| !federation.remote_sites(&[]).is_empty())
        {
            return Ok(());
        }
        let nodes = known.nodes.get_or_insert_with(|| self.views.nodes().0);
        if nodes.nodes.is_empty() {
            return Ok(());
        }
        match incapable(nodes, &pending_task(0, task), Scope::Known) {
            None => Ok(()),
            Some(why) => Err(ServiceError::refused(
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
    pub(crate) async fn prepare(
        &self,
        submission: SubmitTask,
        known: &mut KnownArtifacts,
    ) -> Result<NewTask, ServiceError> {
        let artifact = parse_digest(&submission.artifact)?;
        let (runtime, package) = match known.artifacts.entry(artifact) {
            Entry::Occupied(entry) => entry.into_mut(),
            Entry::Vacant(entry) => {
                let Some((_, runtime)) = self.store.artifact_info(&artifact).await? else {
                    return Err(ServiceError::refused(ErrorCode::ArtifactNotFound,
                        format!("no artifact {artifact}; upload the module first with POST /api/v1/artifacts (starling publish FILE.wasm)"),
                    ));
                };
                let package = if runtime == Runtime::Opencl {
                    Some(self.store.artifact(&artifact).await?.ok_or_else(|| {
                        ServiceError::refused(
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
            self.check_capable(known, &task)?;
        }
        Ok(task)
    }
}

/// The refusal for an unknown task id.
pub(crate) fn task_not_found(id: &str) -> ServiceError {
    ServiceError::refused(
        ErrorCode::TaskNotFound,
        format!("no task {id:?}; list tasks with GET /api/v1/tasks (starling tasks)"),
    )
}

/// Checks a submission's input, arguments, work and demand, and its limits:
/// the bounds every task is held to, whoever submits or forwards it.
pub(crate) fn check_submission(submission: &SubmitTask) -> Result<(Vec<u8>, f64), ServiceError> {
    let input = match (&submission.input_base64, &submission.input_text) {
        (Some(_), Some(_)) => {
            return Err(ServiceError::refused(
                ErrorCode::InvalidInput,
                "give input_base64 or input_text, not both",
            ))
        }
        (Some(encoded), None) => base64::engine::general_purpose::STANDARD
            .decode(encoded.trim())
            .map_err(|error| {
                ServiceError::refused(
                    ErrorCode::InvalidInput,
                    format!("input_base64 is not valid base64: {error}"),
                )
            })?,
        (None, Some(text)) => text.as_bytes().to_vec(),
        (None, None) => Vec::new(),
    };
    if input.len() > MAX_INLINE_INPUT_BYTES {
        return Err(ServiceError::refused(ErrorCode::InputTooLarge,
            format!(
                "the input is {} bytes; tasks take at most {MAX_INLINE_INPUT_BYTES} bytes of inline input",
                input.len()
            ),
        ));
    }
    if submission.args.len() > MAX_ARGS {
        return Err(ServiceError::refused(
            ErrorCode::InvalidArgs,
            format!("at most {MAX_ARGS} arguments are allowed"),
        ));
    }
    if let Some(arg) = submission.args.iter().find(|arg| arg.len() > ARG_LEN) {
        return Err(ServiceError::refused(
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
        return Err(ServiceError::refused(
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
        return Err(ServiceError::refused(
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
pub(crate) fn check_limits(limits: &TaskLimits) -> Result<(), ServiceError> {
    if limits.wall_ms == 0 || limits.memory_bytes == 0 {
        return Err(ServiceError::refused(
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
        Some((field, value, maximum, flag)) => Err(ServiceError::refused(
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
) -> Result<KernelLaunch, ServiceError> {
    // The package was validated on upload; failing here means the stored bytes
    // changed under us.
    let package = Package::from_bytes(package).map_err(ServiceError::internal)?;
    let launch = package
        .spec
        .bind(&submission.args, input_len as u64)
        .map_err(|error| {
            let code = match error {
                starling_opencl::SpecError::InputSize { .. } => ErrorCode::InvalidInput,
                _ => ErrorCode::InvalidArgs,
            };
            ServiceError::refused(code, error.to_string())
        })?;
    let output_limit = submission
        .limits
        .output_bytes
        .min(MAX_INLINE_OUTPUT_BYTES as u64);
    if launch.output_bytes > output_limit {
        return Err(ServiceError::refused(ErrorCode::InvalidLimits,
            format!(
                "the kernel's output buffers take {} bytes, over the task's output limit of {output_limit} bytes (tasks return at most {MAX_INLINE_OUTPUT_BYTES} bytes inline); raise limits.output_bytes (--max-output) or shrink the output",
                launch.output_bytes
            ),
        ));
    }
    if launch.device_bytes > submission.limits.memory_bytes {
        return Err(ServiceError::refused(ErrorCode::InvalidLimits,
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

/// What submitting needs of each artifact a submission names, looked up
/// once per request however many tasks name it: its runtime and, for an
/// OpenCL package, its bytes (the kernel's spec).
#[derive(Default)]
pub(crate) struct KnownArtifacts {
    artifacts: HashMap<Digest, (Runtime, Option<Vec<u8>>)>,
    /// The site's nodes, read at the first submission that needs them.
    nodes: Option<ClusterView>,
}
