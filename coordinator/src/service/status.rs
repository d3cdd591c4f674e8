//! The coordinator's own state, as health checks and metrics read it:
//! whether its database answers, which backend, whether it leads its site,
//! how many tasks are in each state.

use std::sync::Arc;

use starling_api::{ErrorCode, Health, TaskStatus};

use super::ServiceError;
use crate::registry::NodeRegistry;
use crate::store::Store;

/// What the status reads need (built in `app.rs`).
#[derive(Clone)]
pub(crate) struct Status {
    /// The database, its backend and the site's lease.
    pub(crate) store: Store,
    /// The nodes, to count them.
    pub(crate) registry: Arc<NodeRegistry>,
    /// The placement policy's name.
    pub(crate) policy_name: String,
}

/// Whether this coordinator leads its site, and under which term.
pub(crate) struct Leadership {
    /// It schedules for its site now.
    pub(crate) leads: bool,
    /// The lease's epoch while it leads with replicas.
    pub(crate) term: Option<u64>,
}

impl Status {
    /// `GET /api/v1/health`: refused with `database_unavailable` when the
    /// database does not answer.
    pub(crate) async fn health(&self) -> Result<Health, ServiceError> {
        self.store.ping().await.map_err(|error| {
            ServiceError::refused(
                ErrorCode::DatabaseUnavailable,
                format!("the database does not answer: {error}"),
            )
        })?;
        let (nodes, nodes_online) = {
            let registry = self.registry.read();
            (
                registry.len(),
                registry.nodes().filter(|node| node.online()).count(),
            )
        };
        let leadership = self.leadership();
        Ok(Health {
            status: "ok".to_string(),
            version: env!("CARGO_PKG_VERSION").to_string(),
            database: self.store.backend_name().to_string(),
            policy: self.policy_name.clone(),
            nodes,
            nodes_online,
            leader: leadership.leads,
            leader_term: leadership.term,
        })
    }

    /// Whether this coordinator leads its site now.
    pub(crate) fn leadership(&self) -> Leadership {
        Leadership {
            leads: self.store.leads(),
            term: self.store.leader_term(),
        }
    }

    /// How many tasks stand in each state.
    pub(crate) async fn task_counts(&self) -> Result<Vec<(TaskStatus, u64)>, ServiceError> {
        Ok(self.store.task_counts().await?)
    }
}
