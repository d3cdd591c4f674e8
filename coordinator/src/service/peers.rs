//! What the other sites of a federation ask of this one: take a task they
//! forward (checked as a submission is, its artifact fetched from them),
//! say where it stands, cancel it; and a revocation from the trust root.
//! The caller's identity is checked before these run (`http::peer`).

use std::sync::Arc;
use std::time::Instant;

use sha2::{Digest as _, Sha256};
use starling_api::{
    ErrorCode, ForwardAccepted, ForwardRequest, RevocationAccepted, SiteRevocation, SubmitTask,
};
use starling_proto::{Digest, Runtime};

use super::artifacts::{verified_publisher, Artifacts};
use super::tasks::{check_submission, KnownArtifacts, Tasks};
use super::ServiceError;
use crate::federation::identity::verify_revocation;
use crate::federation::Federation;
use crate::store::forwards::OpenForward;
use crate::store::{CancelOutcome, Store, TaskRecord};
use crate::task::unix_now_ms;

/// What the peer use cases need (built in `app.rs`, only where this site
/// federates).
#[derive(Clone)]
pub(crate) struct Peers {
    /// The federation: its gossip table (where a peer's REST API is), its
    /// HTTP client, its trust.
    pub(crate) federation: Arc<Federation>,
    /// Forwarded tasks, revocations.
    pub(crate) store: Store,
    /// A forwarded task is prepared as a submission is; its cancel is sent
    /// as one's is.
    pub(crate) tasks: Tasks,
    /// A forwarded task's artifact and signature are kept as an upload's.
    pub(crate) artifacts: Artifacts,
    /// The most bytes an artifact may have.
    pub(crate) max_artifact_bytes: usize,
}

/// The refusal where this coordinator does not federate.
pub(crate) fn not_federated() -> ServiceError {
    ServiceError::refused(
        ErrorCode::NotFederated,
        "this coordinator does not federate; start it with --site and --cluster-key",
    )
}

impl Peers {
    /// Takes a task `request.origin_site` forwards (the caller has been
    /// checked to be that site); idempotent on (origin site, origin task).
    pub(crate) async fn accept(
        &self,
        request: ForwardRequest,
    ) -> Result<ForwardAccepted, ServiceError> {
        if let Some(existing) = self
            .store
            .task_by_origin(&request.origin_site, &request.origin_task)
            .await?
        {
            return Ok(ForwardAccepted {
                task_id: existing.spec.id,
                created: false,
            });
        }
        let bad = |message: String| ServiceError::refused(ErrorCode::InvalidForward, message);
        let artifact = Digest::parse(&request.artifact).map_err(|e| bad(e.to_string()))?;
        let runtime = match request.runtime.as_str() {
            "wasm" => Runtime::Wasm,
            "opencl" => Runtime::Opencl,
            other => return Err(bad(format!("unknown runtime {other:?}"))),
        };
        // A peer is trusted to forward, not to lift this site's bounds: the
        // task is checked as `POST /api/v1/tasks` checks a submission, by
        // the same function, first without the artifact, so that a forward
        // this site would refuse costs it no download.
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
        if !self.artifacts.holds(&artifact).await? {
            self.fetch_artifact(&request.origin_site, &artifact).await?;
        }
        let mut task = self
            .tasks
            .prepare(submission, &mut KnownArtifacts::default())
            .await?;
        if task.runtime != runtime {
            return Err(bad(format!(
                "the forward says runtime {}, but artifact {artifact} is a {} artifact",
                runtime.as_str(),
                task.runtime.as_str()
            )));
        }
        // The task keeps its home's clock: the deadline it must meet there,
        // and when it was submitted.
        task.deadline_unix_ms = request.deadline_unix_ms;
        task.created_ms = request.created_ms;
        if let Some(publisher) = &publisher {
            // Kept with the artifact, so assignments here carry it as they
            // do at home.
            self.artifacts.add_signature(&artifact, publisher).await?;
        }
        let (task_id, created) = self
            .store
            .insert_forwarded_task(&task, &request.origin_site, &request.origin_task)
            .await?;
        if created {
            tracing::info!(task = %task_id, origin = %request.origin_site, origin_task = %request.origin_task, "took a task forwarded by another site");
            self.tasks.wake_scheduler.notify_one();
        }
        Ok(ForwardAccepted { task_id, created })
    }

    /// Fetches an artifact from the site that forwards a task using it, from
    /// the REST URL that site gossips (never one the request names), and
    /// keeps it only if its bytes hash to the digest and validate like an
    /// upload.
    async fn fetch_artifact(&self, origin: &str, artifact: &Digest) -> Result<(), ServiceError> {
        let conflict =
            |message: String| ServiceError::refused(ErrorCode::ArtifactUnavailable, message);
        let api_url = self
            .federation
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
        let mut response = self.federation.http.get(&url).send().await.map_err(|e| {
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
        let max = self.max_artifact_bytes;
        if response
            .content_length()
            .is_some_and(|len| len > max as u64)
        {
            return Err(conflict(format!(
                "artifact {artifact} is larger than this site accepts"
            )));
        }
        // Read chunk by chunk and given up past the maximum: a peer may send
        // no Content-Length (chunked) or a false one.
        let mut bytes = Vec::new();
        while let Some(chunk) = response.chunk().await.map_err(|e| {
            conflict(format!(
                "cannot fetch artifact {artifact} from {origin}: {e}"
            ))
        })? {
            if bytes.len() + chunk.len() > max {
                return Err(conflict(format!(
                    "site {origin} sent more than the {max} bytes this site accepts for artifact {artifact}"
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
        self.artifacts.keep_fetched(artifact, &bytes, origin).await
    }

    /// The task `site` forwarded here as `task`.
    pub(crate) async fn forwarded(
        &self,
        site: &str,
        task: &str,
    ) -> Result<TaskRecord, ServiceError> {
        self.store.task_by_origin(site, task).await?.ok_or_else(|| {
            ServiceError::refused(
                ErrorCode::ForwardNotFound,
                format!("no task forwarded by site {site} as {task}"),
            )
        })
    }

    /// Cancels a task forwarded here, at its home site's request; the task
    /// as it stands afterwards.
    pub(crate) async fn cancel(&self, site: &str, task: &str) -> Result<TaskRecord, ServiceError> {
        let record = self.forwarded(site, task).await?;
        if let CancelOutcome::SendCancel { node_id, attempt } = self
            .store
            .request_cancel(&record.spec.id, unix_now_ms())
            .await?
        {
            self.tasks
                .publisher
                .send_cancel(&record.spec.id, &node_id, attempt)
                .await?;
        }
        self.forwarded(site, task).await
    }

    /// Forwards this site has made that have not ended, newest first.
    pub(crate) async fn open_forwards(&self, limit: u32) -> Result<Vec<OpenForward>, ServiceError> {
        Ok(self.store.open_forwards(limit).await?)
    }

    /// A site revoked by the trust root: stored, then in effect here, and
    /// passed on to peers when it is new here.
    pub(crate) async fn revoke_site(
        &self,
        revocation: SiteRevocation,
    ) -> Result<RevocationAccepted, ServiceError> {
        let refused = |error: &dyn std::fmt::Display| {
            ServiceError::refused(ErrorCode::InvalidRevocation, error.to_string())
        };
        verify_revocation(&revocation, self.federation.trust.root()).map_err(|e| refused(&e))?;
        // Stored before it takes effect in memory: an answer of success
        // means a restart keeps it.
        self.store
            .put_site_revocation(&revocation, unix_now_ms())
            .await?;
        let new = self
            .federation
            .trust
            .revoke(&revocation)
            .map_err(|e| refused(&e))?;
        if new {
            tracing::warn!(site = %revocation.site, revoked_ms = revocation.revoked_ms, "site revoked by the trust root; passing it on to peers");
            self.federation.wake_revocations.notify_one();
        }
        Ok(RevocationAccepted {
            site: revocation.site,
            new,
        })
    }
}
