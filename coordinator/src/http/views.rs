//! The store's rows as the REST API shows them: each row type has its
//! `starling_api` twin, and these conversions are the only place the two
//! meet, so a column can change without changing the API (and the reverse).

use crate::store::access::ApiTokenRecord;
use crate::store::{AttemptRecord, EventRecord};

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
