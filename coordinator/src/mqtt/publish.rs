//! Everything the coordinator publishes to nodes that is not a reply to a
//! message it handles (those are in `ingest`): assignments, signed at each
//! send and claimed in the outbox first, and cancels.

use std::sync::Arc;
use std::time::Duration;

use rumqttc::{AsyncClient, QoS};
use starling_proto::{
    encode, Assignment, Cancel, Channel, FailureReason, NodeId, TaskEvent, TaskId, Topics,
    PROTOCOL_VERSION,
};

use crate::counters::Counters;
use crate::domain::delivery::backoff;
use crate::precompile::{Precompile, PrecompileFailure};
use crate::signing::Signer;
use crate::store::{OutboxEntry, Store, StoreError, TaskRecord};

/// The one sender of assignments and cancels: what the scheduler, the outbox
/// and the REST API's cancel use to reach a node, and nothing more.
#[derive(Clone)]
pub(crate) struct Publisher {
    /// The coordinator's MQTT client (publishing only; ingest polls it).
    pub(crate) mqtt: AsyncClient,
    /// The topic names under this coordinator's prefix.
    pub(crate) topics: Topics,
    /// Signs every assignment sent.
    pub(crate) signer: Signer,
    /// Where sends are claimed and publisher signatures read.
    pub(crate) store: Store,
    /// Where agents fetch artifacts.
    pub(crate) public_url: String,
    /// The first wait before an unacknowledged assignment is sent again.
    pub(crate) resend_interval: Duration,
    /// `starling_assignments_published_total`.
    pub(crate) counters: Arc<Counters>,
    /// Compiles modules for nodes without a compiler.
    pub(crate) precompile: Precompile,
    /// Attempts a task gets before it fails for good (an attempt this
    /// coordinator cannot compile for ends as failed, like any other).
    pub(crate) max_attempts: u32,
}

/// Why a cancel could not be published.
#[derive(Debug, thiserror::Error)]
pub enum PublishError {
    /// A stored id is not a valid wire id (the store was edited by hand).
    #[error("invalid id in a cancel: {0}")]
    Id(#[from] starling_proto::IdError),
    /// The message did not encode.
    #[error("cannot encode the cancel: {0}")]
    Encode(#[from] starling_proto::EncodeError),
    /// The MQTT client's request queue is closed.
    #[error("cannot publish the cancel: {0}")]
    Client(#[from] rumqttc::ClientError),
}

/// Why a stored task's assignment cannot be built. Nothing a resend or
/// another node could change: the attempt fails with it (and the task with
/// the attempt) rather than waiting in the outbox for ever.
#[derive(Debug, thiserror::Error)]
pub enum BuildAssignmentError {
    /// The stored task id is not a wire id (a hand-edited store).
    #[error("task id {id:?} is not a valid wire id: {source}")]
    TaskId {
        /// The stored id.
        id: String,
        /// Why it is not one.
        #[source]
        source: starling_proto::IdError,
    },
    /// `--public-url` makes artifact URLs longer than an assignment carries.
    #[error("the artifact URL {url} is longer than {max} bytes; use a shorter --public-url")]
    ArtifactUrl {
        /// The URL.
        url: String,
        /// The most an assignment carries.
        max: usize,
    },
    /// More arguments than an assignment carries.
    #[error("the task has {count} arguments; an assignment carries at most {max}")]
    TooManyArgs {
        /// How many the task has.
        count: usize,
        /// The most an assignment carries.
        max: usize,
    },
    /// An argument longer than an assignment carries.
    #[error("argument {start:?}… is longer than the {max} bytes an assignment carries")]
    ArgTooLong {
        /// Its first characters.
        start: String,
        /// The most an assignment carries.
        max: usize,
    },
    /// The assignment breaks a wire bound when signed.
    #[error("cannot sign the assignment: {0}")]
    Sign(#[from] crate::signing::SignError),
    /// The signed assignment breaks a wire bound.
    #[error("cannot encode the assignment: {0}")]
    Encode(#[from] starling_proto::EncodeError),
}

impl BuildAssignmentError {
    /// The failure reason the task ends with: the task's own content when
    /// it does not fit, this coordinator's otherwise.
    pub fn failure_reason(&self) -> FailureReason {
        match self {
            Self::TooManyArgs { .. }
            | Self::ArgTooLong { .. }
            | Self::Sign(_)
            | Self::Encode(_) => FailureReason::InvalidInput,
            Self::TaskId { .. } | Self::ArtifactUrl { .. } => FailureReason::Internal,
        }
    }
}

fn to_ms(duration: std::time::Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

/// Artifacts' publisher signatures, each read once per batch of
/// assignments (a round's tasks mostly share a few artifacts). A batch's
/// cache is dropped with it, so a signature added later is read by the next.
#[derive(Debug, Default)]
pub(crate) struct ArtifactPublishers(
    std::collections::HashMap<starling_proto::Digest, Option<starling_proto::PublisherSignature>>,
);

impl ArtifactPublishers {
    /// The publisher signature of `artifact`, if it has one.
    async fn get(
        &mut self,
        store: &Store,
        artifact: &starling_proto::Digest,
    ) -> Result<Option<starling_proto::PublisherSignature>, StoreError> {
        if let Some(known) = self.0.get(artifact) {
            return Ok(known.clone());
        }
        let publisher = store.artifact_publisher(artifact).await?;
        self.0.insert(*artifact, publisher.clone());
        Ok(publisher)
    }
}

impl Publisher {
    /// Claims the send of `entry` (as read) and publishes the assignment of
    /// `task`'s attempt, freshly signed. Returns whether this call sent it.
    pub(crate) async fn send_assignment(
        &self,
        entry: &OutboxEntry,
        task: &TaskRecord,
        publishers: &mut ArtifactPublishers,
        now_ms: u64,
    ) -> Result<bool, StoreError> {
        let Ok(node) = NodeId::new(&entry.node_id) else {
            // Node ids are checked when nodes register, so the store cannot hold
            // a bad one unless it was edited by hand; drop the row, keep going.
            tracing::error!(node = %entry.node_id, "outbox row for an invalid node id dropped");
            self.store
                .drop_outbox(&entry.task_id, entry.attempt)
                .await?;
            return Ok(false);
        };
        let next_ms = now_ms.saturating_add(to_ms(backoff(self.resend_interval, entry.sends)));
        // Only a leader sends; the term it claims under goes to the agent.
        let term = self.store.fence()?;
        if !self.store.claim_outbox_send(entry, next_ms, term).await? {
            return Ok(false);
        }
        self.publish_claimed(entry, &node, task, term, publishers, now_ms)
            .await
    }

    /// When the first send of a placement is due again if it is never
    /// acknowledged: what [`crate::store::Store::assign_tasks`] writes for a
    /// placement whose first send the scheduler makes itself.
    pub(crate) fn first_resend_ms(&self, now_ms: u64) -> u64 {
        now_ms.saturating_add(to_ms(backoff(self.resend_interval, 0)))
    }

    /// Publishes the assignment of `task`'s attempt in `entry`, whose send is
    /// already claimed (by [`Publisher::send_assignment`], or in the
    /// transaction that placed it), freshly signed under `term`. Returns
    /// whether it went out.
    pub(crate) async fn publish_claimed(
        &self,
        entry: &OutboxEntry,
        node: &NodeId,
        task: &TaskRecord,
        term: Option<u64>,
        publishers: &mut ArtifactPublishers,
        now_ms: u64,
    ) -> Result<bool, StoreError> {
        let node = node.clone();
        let precompiled = match self
            .precompile
            .for_assignment(task, &node, &self.public_url)
            .await
        {
            Ok(precompiled) => precompiled,
            Err(PrecompileFailure::Store(error)) => return Err(error),
            Err(failure) => {
                // Sending the plain module would only fail on the node; the
                // attempt fails here instead, and the task is retried (on
                // another node) or fails as any failed attempt does.
                tracing::warn!(task = %entry.task_id, node = %node, %failure, "cannot compile the module for the node");
                let event = TaskEvent::failed(
                    task_id_of(&entry.task_id)?,
                    entry.attempt,
                    node.clone(),
                    FailureReason::InvalidModule,
                    &format!("the coordinator cannot give node {node} code it can run: {failure}"),
                );
                self.store
                    .record_event(&event, now_ms, self.max_attempts)
                    .await?;
                return Ok(false);
            }
        };
        let power_level = task.power_level.unwrap_or(0);
        // Read at each send, so a signature added after submission reaches
        // the next (re)send.
        let publisher = publishers.get(&self.store, &task.spec.artifact).await?;
        let bytes = match assignment(task, &node, entry.attempt, power_level, &self.public_url)
            .and_then(|mut assignment| {
                assignment.publisher = publisher;
                assignment.precompiled = precompiled;
                assignment.leader_epoch = term;
                self.signer.sign(&mut assignment, &node, now_ms)?;
                Ok(encode(&assignment)?)
            }) {
            Ok(bytes) => bytes,
            Err(error) => {
                // Submissions and forwards are checked against these bounds,
                // so this takes a misconfigured public URL or a task stored
                // by an older version. A resend would build the same bytes:
                // the attempt fails for good, with the reason, and leaves
                // the outbox.
                tracing::error!(task = %entry.task_id, node = %node, %error, "cannot build the assignment; the task fails");
                let event = TaskEvent::failed(
                    task_id_of(&entry.task_id)?,
                    entry.attempt,
                    node.clone(),
                    error.failure_reason(),
                    &format!("the coordinator cannot build the task's assignment: {error}"),
                );
                self.store
                    .record_event(&event, now_ms, self.max_attempts)
                    .await?;
                return Ok(false);
            }
        };
        let topic = self.topics.node(&node, Channel::Assign);
        // Not the task that polls the MQTT event loop, so waiting for room in the
        // request queue cannot deadlock.
        if let Err(error) = self
            .mqtt
            .publish(topic, QoS::AtLeastOnce, false, bytes)
            .await
        {
            // The row stays; the next due time sends it again.
            tracing::warn!(task = %entry.task_id, %error, "cannot publish the assignment");
            return Ok(false);
        }
        Counters::increment(&self.counters.assignments_published);
        Ok(true)
    }

    /// Asks `node_id` to stop `attempt` of `task_id`.
    pub(crate) async fn send_cancel(
        &self,
        task_id: &str,
        node_id: &str,
        attempt: u32,
    ) -> Result<(), PublishError> {
        let node = NodeId::new(node_id).map_err(PublishError::from)?;
        let cancel = Cancel {
            v: PROTOCOL_VERSION,
            task_id: TaskId::new(task_id).map_err(PublishError::from)?,
            attempt,
        };
        let bytes = encode(&cancel).map_err(PublishError::from)?;
        self.mqtt
            .publish(
                self.topics.node(&node, Channel::Cancel),
                QoS::AtLeastOnce,
                false,
                bytes,
            )
            .await
            .map_err(PublishError::from)
    }
}

/// The assignment for one attempt of a stored task to `node`, unsigned
/// (`Signer::sign` fills the validity window and the signature).
pub fn assignment(
    record: &TaskRecord,
    node: &NodeId,
    attempt: u32,
    power_level: u8,
    public_url: &str,
) -> Result<Assignment, BuildAssignmentError> {
    use starling_proto::limits::{ARG_LEN, MAX_ARGS, URL_LEN};
    let spec = &record.spec;
    let task_id = TaskId::new(&spec.id).map_err(|source| BuildAssignmentError::TaskId {
        id: spec.id.clone(),
        source,
    })?;
    let url = format!("{public_url}/api/v1/artifacts/{}", spec.artifact.to_hex());
    let Some(artifact_url) = heapless_string(&url) else {
        return Err(BuildAssignmentError::ArtifactUrl { url, max: URL_LEN });
    };
    if spec.args.len() > MAX_ARGS {
        return Err(BuildAssignmentError::TooManyArgs {
            count: spec.args.len(),
            max: MAX_ARGS,
        });
    }
    let mut args = heapless::Vec::new();
    for arg in &spec.args {
        let too_long = || BuildAssignmentError::ArgTooLong {
            start: arg.chars().take(20).collect(),
            max: ARG_LEN,
        };
        let arg = heapless_string(arg).ok_or_else(too_long)?;
        args.push(arg)
            .map_err(|_| BuildAssignmentError::TooManyArgs {
                count: spec.args.len(),
                max: MAX_ARGS,
            })?;
    }
    Ok(Assignment {
        v: PROTOCOL_VERSION,
        task_id,
        attempt,
        runtime: spec.runtime,
        artifact: spec.artifact,
        artifact_url,
        args,
        input: spec.input.clone(),
        limits: spec.limits.into(),
        power_level,
        deadline_unix_ms: spec.deadline_unix_ms,
        // What the manifest granted; the node's policy may still refuse it.
        grants: spec.limits.grants.into(),
        // The outbox adds the artifact's publisher signature when it sends.
        publisher: None,
        precompiled: None,
        leader_epoch: None,
        node_id: node.clone(),
        issued_unix_ms: 0,
        expires_unix_ms: 0,
        signature: Vec::new(),
    })
}

/// A stored task id as a wire id; ids are checked at submission, so a bad
/// one means a hand-edited store.
fn task_id_of(id: &str) -> Result<TaskId, StoreError> {
    TaskId::new(id).map_err(|e| crate::store::corrupt("tasks.id", e))
}

fn heapless_string<const N: usize>(text: &str) -> Option<heapless::String<N>> {
    heapless::String::try_from(text).ok()
}
