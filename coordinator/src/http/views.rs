//! The store's rows as the REST API shows them: each row type has its
//! `starling_api` twin, and these conversions are the only place the two
//! meet, so a column can change without changing the API (and the reverse).

use base64::Engine as _;
use starling_api::{ForwardStatus, TaskDetail, TaskStatus, TaskSummary};

use crate::service::tasks::TaskHistory;
use crate::store::access::ApiTokenRecord;
use crate::store::{AttemptRecord, EventRecord, NewTask, TaskRecord};

impl From<EventRecord> for starling_api::EventRecord {
    fn from(row: EventRecord) -> Self {
        Self {
            attempt: row.attempt,
            state: row.state,
            node_id: row.node_id,
            site: row.site,
            received_ms: row.received_ms,
            reason: row.reason,
            message: row.message,
            exit_code: row.exit_code,
            output_bytes: row.output_bytes,
            metrics: row.metrics,
            power: row.power,
        }
    }
}

impl From<AttemptRecord> for starling_api::AttemptRecord {
    fn from(row: AttemptRecord) -> Self {
        Self {
            attempt: row.attempt,
            node_id: row.node_id,
            site: row.site,
            power_level: row.power_level,
            assigned_ms: row.assigned_ms,
            state: row.state,
            finished_ms: row.finished_ms,
        }
    }
}

impl From<ApiTokenRecord> for starling_api::ApiTokenRecord {
    fn from(row: ApiTokenRecord) -> Self {
        Self {
            id: row.id,
            name: row.name,
            role: row.role,
            created_ms: row.created_ms,
            revoked_ms: row.revoked_ms,
        }
    }
}

/// A task as the task list shows it.
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

/// A task just stored, as the task list shows it.
pub(crate) fn created_summary(task: &NewTask) -> TaskSummary {
    TaskSummary {
        id: task.id.clone(),
        state: TaskStatus::Pending,
        artifact: task.artifact.to_hex(),
        node_id: None,
        attempt: 0,
        priority: task.priority,
        created_ms: task.created_ms,
        updated_ms: task.created_ms,
        reason: None,
        site: None,
    }
}

impl From<TaskHistory> for TaskDetail {
    fn from(history: TaskHistory) -> Self {
        let TaskHistory {
            record,
            events,
            attempts,
        } = history;
        let spec = record.spec;
        TaskDetail {
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
        }
    }
}

/// A task forwarded here as its home site reads it.
pub(crate) fn forward_status_view(record: TaskRecord) -> ForwardStatus {
    ForwardStatus {
        task_id: record.spec.id,
        state: record.status,
        node_id: record.node_id,
        output_base64: record
            .output
            .map(|bytes| base64::engine::general_purpose::STANDARD.encode(bytes)),
        exit_code: record.exit_code,
        reason: record.failure_reason,
        message: record.failure_message,
    }
}
