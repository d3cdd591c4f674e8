//! Nodes and tokens: enrolling a node with a join token, minting a node's
//! credentials directly (`starling up`), revoking a node, and the join and
//! API tokens operators and admins make, list and revoke.

use std::sync::{Arc, Mutex};

use starling_api::{
    ApiTokenCreated, EnrollRequest, ErrorCode, JoinTokenCreated, NodeCredentials, NodeRevoked, Role,
};
use starling_proto::{NodeId, PROTOCOL_VERSION};
use tokio::sync::Notify;

use super::ServiceError;
use crate::access::{self, AccessError, MosquittoWriter, MqttAccess};
use crate::domain::reports::ReportMarks;
use crate::live::Feed;
use crate::registry::NodeRegistry;
use crate::store::access::{ApiTokenRecord, EnrollOutcome, NodeCredentialRow};
use crate::store::{Store, StoreError};
use crate::task::unix_now_ms;

/// Longest join token life.
pub(crate) const MAX_JOIN_TOKEN_TTL_SECONDS: u64 = 30 * 24 * 3600;

/// Default join token life.
pub(crate) const DEFAULT_JOIN_TOKEN_TTL_SECONDS: u64 = 3600;

/// Most nodes one join token may enroll.
pub(crate) const MAX_JOIN_TOKEN_USES: u32 = 10_000;

/// Longest API token name.
pub(crate) const MAX_TOKEN_NAME_LEN: usize = 128;

/// What the node and token use cases need, and nothing else (built in `app.rs`).
#[derive(Clone)]
pub(crate) struct Access {
    /// Credentials, tokens, tasks to requeue.
    pub(crate) store: Store,
    /// Which nodes are revoked; the coordinator's own MQTT user.
    pub(crate) mqtt_access: Arc<MqttAccess>,
    /// Rewrites Mosquitto's files, when the coordinator writes them.
    pub(crate) mosquitto: Option<Arc<MosquittoWriter>>,
    /// A revoked node goes offline here at once.
    pub(crate) registry: Arc<NodeRegistry>,
    /// Watchers hear of a revocation.
    pub(crate) feed: Feed,
    /// A node's new key counts its reports afresh.
    pub(crate) report_marks: Arc<Mutex<ReportMarks>>,
    /// Attempts a task may have (a revoked node's tasks are placed again).
    pub(crate) max_attempts: u32,
    /// Woken when a revocation puts tasks back in the queue.
    pub(crate) wake_scheduler: Arc<Notify>,
    /// The coordinator's public key (ed25519, hex), for nodes to pin.
    pub(crate) coordinator_key: String,
    /// The MQTT topic prefix nodes use.
    pub(crate) topic_prefix: String,
}

impl Access {
    /// How often Mosquitto's files were rewritten and reread (0 when the
    /// coordinator writes none).
    pub(crate) fn mosquitto_reloads(&self) -> u64 {
        self.mosquitto
            .as_deref()
            .map_or(0, MosquittoWriter::rewrites)
    }

    /// The credentials stored for `node`: when it enrolled, its report
    /// key, whether and when it was revoked.
    pub(crate) async fn credentials_of(
        &self,
        node: &str,
    ) -> Result<Option<NodeCredentialRow>, ServiceError> {
        Ok(self
            .store
            .node_credentials()
            .await?
            .into_iter()
            .find(|row| row.node_id == node))
    }

    /// The role of the API token whose sha256 (hex) is `hash`, if it is a
    /// live token; compared in constant time.
    pub(crate) async fn role_of_token_hash(
        &self,
        hash: &str,
    ) -> Result<Option<Role>, ServiceError> {
        Ok(self
            .store
            .api_token_by_hash(hash)
            .await?
            .filter(|(_, stored)| access::constant_time_eq(stored.as_bytes(), hash.as_bytes()))
            .map(|(record, _)| record.role))
    }

    /// Enrolls a node with a join token: its MQTT credentials (the password
    /// shown once) and the coordinator's key to pin.
    pub(crate) async fn enroll(
        &self,
        request: EnrollRequest,
    ) -> Result<NodeCredentials, ServiceError> {
        let node = NodeId::new(&request.node_id).map_err(|error| {
            ServiceError::refused(
                ErrorCode::InvalidNodeId,
                format!("node id {:?}: {error}", request.node_id),
            )
        })?;
        if self.mqtt_access.is_internal_user(node.as_str()) {
            return Err(ServiceError::refused(
                ErrorCode::NodeIdReserved,
                format!("{node} is the coordinator's own MQTT user; pick another node id"),
            ));
        }
        access::parse_report_key(&request.report_key).map_err(|error| {
            ServiceError::refused(
                ErrorCode::InvalidReportKey,
                format!("{error}; the agent makes it at enrollment"),
            )
        })?;
        let (password, hashes) = access::new_node_password().map_err(ServiceError::internal)?;
        let outcome = self
            .store
            .enroll_node(
                &access::sha256_hex(request.join_token.trim()),
                node.as_str(),
                hashes.for_node(&request.report_key),
                unix_now_ms(),
            )
            .await?;
        match outcome {
            EnrollOutcome::Enrolled => {}
            EnrollOutcome::BadToken => {
                return Err(ServiceError::refused(ErrorCode::InvalidJoinToken,
                    "the join token is invalid, expired or used up; create one with `starling token create`",
                ))
            }
            EnrollOutcome::AlreadyEnrolled => {
                return Err(ServiceError::refused(ErrorCode::NodeEnrolled,
                    format!("node {node} is enrolled already; its credentials stay valid (an operator can `starling node revoke {node}` first to enroll it again)"),
                ))
            }
        }
        self.forget_marks(&node);
        self.refresh_access(node.as_str()).await;
        tracing::info!(node = %node, "node enrolled");
        Ok(self.credentials(node.as_str(), password))
    }

    /// Stores fresh credentials for `node_id` (replacing any) and returns
    /// them: for an agent this process runs itself (`starling up`), which
    /// needs no join token.
    pub(crate) async fn mint(
        &self,
        node_id: &str,
        report_key: &str,
    ) -> Result<NodeCredentials, AccessError> {
        access::parse_report_key(report_key).map_err(AccessError::ReportKey)?;
        let (password, hashes) = access::new_node_password()?;
        self.store
            .set_node_credentials(node_id, hashes.for_node(report_key), unix_now_ms())
            .await?;
        if let Ok(node) = NodeId::new(node_id) {
            self.forget_marks(&node);
        }
        access::node_changed(
            &self.store,
            &self.mqtt_access,
            self.mosquitto.as_deref(),
            node_id,
        )
        .await?;
        Ok(self.credentials(node_id, password))
    }

    /// Revokes a node's credentials: the broker refuses its next connection,
    /// its messages are ignored, it is offline at once, and its in-flight
    /// tasks are placed again.
    pub(crate) async fn revoke_node(&self, id: &str) -> Result<NodeRevoked, ServiceError> {
        let now_ms = unix_now_ms();
        if !self.store.revoke_node_credentials(id, now_ms).await? {
            return Err(ServiceError::refused(
                ErrorCode::NodeNotEnrolled,
                format!("node {id:?} has no live credentials (never enrolled, or revoked already)"),
            ));
        }
        self.refresh_access(id).await;
        if let Ok(node) = NodeId::new(id) {
            // Offline now rather than after the silence timeout: the scheduler
            // must not hand it more work while its connection lingers.
            let offline = starling_proto::Status {
                v: PROTOCOL_VERSION,
                node_id: node.clone(),
                state: starling_proto::NodeState::Offline,
            };
            let _ = self.registry.write().apply_status(&node, offline, now_ms);
        }
        self.feed
            .node(id, starling_api::NodeChangeKind::Revoked, now_ms);
        let lost = match self
            .store
            .requeue_node_tasks(id, self.max_attempts, now_ms)
            .await
        {
            Ok(lost) => lost,
            // A replica that does not lead leaves it to the leader, which hears
            // the node's last will when the broker drops its revoked session.
            Err(StoreError::Deposed) => Vec::new(),
            Err(error) => return Err(error.into()),
        };
        self.wake_scheduler.notify_one();
        tracing::warn!(node = %id, requeued = lost.len(), "node revoked");
        Ok(NodeRevoked {
            node_id: id.to_string(),
            requeued_tasks: lost.into_iter().map(|task| task.task_id).collect(),
        })
    }

    /// Makes a join token valid for `ttl_seconds` (an hour by default) and
    /// `uses` enrollments (one by default); the secret is shown only here.
    pub(crate) async fn create_join_token(
        &self,
        ttl_seconds: Option<u64>,
        uses: Option<u32>,
    ) -> Result<JoinTokenCreated, ServiceError> {
        let ttl = ttl_seconds.unwrap_or(DEFAULT_JOIN_TOKEN_TTL_SECONDS);
        if ttl == 0 || ttl > MAX_JOIN_TOKEN_TTL_SECONDS {
            return Err(ServiceError::refused(
                ErrorCode::InvalidTtl,
                format!("ttl_seconds must be 1..={MAX_JOIN_TOKEN_TTL_SECONDS} (30 days)"),
            ));
        }
        let uses = uses.unwrap_or(1);
        if uses == 0 || uses > MAX_JOIN_TOKEN_USES {
            return Err(ServiceError::refused(
                ErrorCode::InvalidUses,
                format!("uses must be 1..={MAX_JOIN_TOKEN_USES}"),
            ));
        }
        let token =
            access::new_secret(access::JOIN_TOKEN_PREFIX).map_err(ServiceError::internal)?;
        let id = uuid::Uuid::now_v7().to_string();
        let now_ms = unix_now_ms();
        let expires_ms = now_ms.saturating_add(ttl.saturating_mul(1000));
        self.store
            .insert_join_token(&id, &access::sha256_hex(&token), uses, expires_ms, now_ms)
            .await?;
        Ok(JoinTokenCreated {
            id,
            token,
            expires_ms,
            uses,
            coordinator_key: self.coordinator_key.clone(),
        })
    }

    /// Makes an API token for `name` with `role`; the secret is shown only here.
    pub(crate) async fn create_api_token(
        &self,
        name: &str,
        role: Role,
    ) -> Result<ApiTokenCreated, ServiceError> {
        let name = name.trim();
        if name.is_empty() || name.len() > MAX_TOKEN_NAME_LEN {
            return Err(ServiceError::refused(
                ErrorCode::InvalidName,
                format!(
                    "a token needs a name of 1..={MAX_TOKEN_NAME_LEN} bytes saying who it is for"
                ),
            ));
        }
        let token = access::new_secret(access::API_TOKEN_PREFIX).map_err(ServiceError::internal)?;
        let id = uuid::Uuid::now_v7().to_string();
        let now_ms = unix_now_ms();
        self.store
            .insert_api_token(&id, name, role, &access::sha256_hex(&token), now_ms)
            .await?;
        tracing::info!(%id, name, role = %role, "API token created");
        Ok(ApiTokenCreated {
            id,
            name: name.to_string(),
            role,
            token,
            created_ms: now_ms,
        })
    }

    /// The API tokens, without their secrets.
    pub(crate) async fn api_tokens(&self) -> Result<Vec<ApiTokenRecord>, ServiceError> {
        Ok(self.store.api_tokens().await?)
    }

    /// Revokes an API token: it is refused from then on.
    pub(crate) async fn revoke_api_token(&self, id: &str) -> Result<(), ServiceError> {
        if !self.store.revoke_api_token(id, unix_now_ms()).await? {
            return Err(ServiceError::refused(
                ErrorCode::TokenNotFound,
                format!("no live API token {id:?}; list them with `starling api-token list`"),
            ));
        }
        tracing::info!(%id, "API token revoked");
        Ok(())
    }

    /// After `node`'s credentials changed in the store: updates the cache of
    /// them and returns once Mosquitto's files hold the change and Mosquitto
    /// has reread them (`access::node_changed`).
    async fn refresh_access(&self, node: &str) {
        if let Err(error) = access::node_changed(
            &self.store,
            &self.mqtt_access,
            self.mosquitto.as_deref(),
            node,
        )
        .await
        {
            // The store holds the truth; the next change or restart rewrites the
            // files, so the operator can fix the directory meanwhile.
            tracing::error!(%error, %node, "cannot refresh MQTT credentials");
        }
    }

    /// A node's new key counts its reports afresh (the store forgot its marks).
    fn forget_marks(&self, node: &NodeId) {
        self.report_marks
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .forget(node);
    }

    fn credentials(&self, node_id: &str, password: String) -> NodeCredentials {
        NodeCredentials {
            node_id: node_id.to_string(),
            mqtt_username: node_id.to_string(),
            mqtt_password: password,
            coordinator_key: self.coordinator_key.clone(),
            topic_prefix: self.topic_prefix.clone(),
        }
    }
}
