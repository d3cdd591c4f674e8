//! The home side of forwarding: sends each forwarded attempt to its peer
//! (`POST /api/v1/federation/tasks`, idempotent on the origin task), then
//! asks the peer how it stands until it ends, and records the result once.
//!
//! A forward is never lost: until the peer confirms it stored the task, the
//! send is repeated; once a peer is declared down by the failure detector, or
//! has not answered for `--forward-timeout`, the attempt is taken back
//! (`take_back_forward`) and the task returns to this site's queue, where the
//! scheduler places it at home or at another site (never the same one again).
//! A forward is never counted twice: the peer keys the task on its origin, and
//! only the open forward of the task's current attempt may record a result;
//! the answer of a peer whose forward was taken back is ignored.

use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use reqwest::StatusCode;
use tokio::sync::watch;

use super::Federation;
use crate::store::forwards::{OpenForward, RemoteResult, TakenBack};
use crate::store::Store;
use crate::store::{StoreError, TaskRecord};
use crate::task::unix_now_ms;
use starling_api::{ArtifactSignature, ForwardAccepted, ForwardRequest, ForwardStatus};

/// What the forwarder uses of the coordinator: the store it records
/// forwards and results in, the attempt budget of a task taken back, and the
/// scheduler it wakes when a task returns to the queue or ends.
#[derive(Clone)]
pub(crate) struct Forwarder {
    pub(crate) store: Store,
    pub(crate) max_attempts: u32,
    pub(crate) wake_scheduler: Arc<tokio::sync::Notify>,
}

/// How often open forwards are looked at when nothing wakes the loop.
const POLL_INTERVAL: Duration = Duration::from_millis(500);
/// Most forwards handled per pass.
const BATCH: u32 = 256;

/// What a call to a peer came to.
#[derive(Debug)]
enum PeerAnswer<T> {
    /// It answered as hoped.
    Ok(T),
    /// It refused for good (4xx): retrying the same call cannot help.
    Refused(String),
    /// No usable answer (unreachable, timeout, 5xx): try again, or give up on the peer.
    Silent(String),
}

/// Runs until told to stop.
pub(crate) async fn run(
    forwarder: Forwarder,
    federation: Arc<Federation>,
    mut stop: watch::Receiver<bool>,
) {
    loop {
        if let Err(error) = pass(&forwarder, &federation).await {
            tracing::warn!(%error, "forwarding pass failed; retrying");
        }
        tokio::select! {
            _ = federation.wake_forwarder.notified() => {}
            _ = tokio::time::sleep(POLL_INTERVAL) => {}
            _ = stop.wait_for(|stopped| *stopped) => return,
        }
    }
}

async fn pass(forwarder: &Forwarder, federation: &Federation) -> Result<(), StoreError> {
    if !forwarder.store.leads() {
        // The leading replica follows this site's forwards.
        return Ok(());
    }
    for forward in forwarder.store.open_forwards(BATCH).await? {
        let Some(record) = forwarder.store.task(&forward.task_id).await? else {
            continue;
        };
        if federation.trust.is_site_revoked(&forward.site) {
            // A revoked site gets no more of this site's work, and what it
            // answers is not taken: the attempt comes back.
            take_back(forwarder, &forward, "was revoked by the trust root").await?;
        } else if !federation.gossip.table().is_alive(&forward.site) {
            // No call to a peer the failure detector declared down: it
            // would only wait for a timeout.
            give_up_if_due(forwarder, federation, &forward, "no answer").await?;
        } else if forward.accepted {
            follow(forwarder, federation, &forward).await?;
        } else {
            send(forwarder, federation, &forward, &record).await?;
        }
    }
    Ok(())
}

/// Sends (or sends again) a forward the peer has not confirmed.
async fn send(
    forwarder: &Forwarder,
    federation: &Federation,
    forward: &OpenForward,
    record: &TaskRecord,
) -> Result<(), StoreError> {
    let spec = &record.spec;
    // Read at each send, like an assignment's: a signature recorded after
    // submission goes with the next send.
    let publisher = forwarder
        .store
        .artifact_publisher(&spec.artifact)
        .await?
        .map(|publisher| ArtifactSignature {
            key: hex::encode(&publisher.key),
            signature: hex::encode(&publisher.signature),
        });
    let request = ForwardRequest {
        origin_site: federation.site.to_string(),
        origin_task: spec.id.clone(),
        artifact: spec.artifact.to_hex(),
        runtime: spec.runtime.as_str().to_string(),
        input_base64: base64::engine::general_purpose::STANDARD.encode(&spec.input),
        args: spec.args.clone(),
        class: spec.class,
        demand: spec.demand,
        limits: spec.limits,
        work_seconds: spec.work_seconds,
        priority: spec.priority,
        deadline_unix_ms: spec.deadline_unix_ms,
        created_ms: spec.created_ms,
        publisher,
    };
    let url = format!("{}/api/v1/federation/tasks", forward.api_url);
    let answer = call::<ForwardAccepted>(
        federation,
        &forward.site,
        federation.http.post(&url).json(&request),
    )
    .await;
    match answer {
        PeerAnswer::Ok(accepted) => {
            tracing::info!(task = %spec.id, site = %forward.site, remote = %accepted.task_id, created = accepted.created, "task forwarded");
            forwarder
                .store
                .forward_answered(&forward.task_id, forward.attempt, None, unix_now_ms())
                .await
        }
        PeerAnswer::Refused(why) => {
            take_back(forwarder, forward, &format!("refused it: {why}")).await
        }
        PeerAnswer::Silent(why) => give_up_if_due(forwarder, federation, forward, &why).await,
    }
}

/// Asks the peer how a forwarded task stands; records its end.
async fn follow(
    forwarder: &Forwarder,
    federation: &Federation,
    forward: &OpenForward,
) -> Result<(), StoreError> {
    let base = format!(
        "{}/api/v1/federation/tasks/{}/{}",
        forward.api_url, federation.site, forward.task_id
    );
    if forward.cancel_requested {
        // Best effort each pass until the peer reports the task ended.
        let cancel = federation.http.post(format!("{base}/cancel"));
        let _ = call::<ForwardStatus>(federation, &forward.site, cancel).await;
    }
    let asked = call::<ForwardStatus>(federation, &forward.site, federation.http.get(&base)).await;
    let status = match asked {
        PeerAnswer::Ok(status) => status,
        PeerAnswer::Refused(why) => {
            return take_back(forwarder, forward, &format!("no longer knows it: {why}")).await
        }
        PeerAnswer::Silent(why) => {
            return give_up_if_due(forwarder, federation, forward, &why).await
        }
    };
    let now = unix_now_ms();
    if !status.state.is_terminal() {
        let running_on = status
            .node_id
            .as_deref()
            .filter(|_| status.state.is_in_flight());
        return forwarder
            .store
            .forward_answered(&forward.task_id, forward.attempt, running_on, now)
            .await;
    }
    let output = match status
        .output_base64
        .as_deref()
        .map(|text| base64::engine::general_purpose::STANDARD.decode(text))
    {
        Some(Ok(bytes)) => Some(bytes),
        Some(Err(error)) => {
            return take_back(
                forwarder,
                forward,
                &format!("sent output that is not base64 ({error})"),
            )
            .await
        }
        None => None,
    };
    let result = RemoteResult {
        status: status.state,
        node: status.node_id.clone(),
        output,
        exit_code: status.exit_code,
        failure_reason: status.reason.clone(),
        failure_message: status.message.clone(),
    };
    if forwarder
        .store
        .finish_forward(&forward.task_id, forward.attempt, &result, now)
        .await?
    {
        tracing::info!(task = %forward.task_id, site = %forward.site, node = ?status.node_id, state = %status.state, "forwarded task ended");
        forwarder.wake_scheduler.notify_one();
    }
    Ok(())
}

/// Takes the attempt back once the peer is declared down or silent too long.
async fn give_up_if_due(
    forwarder: &Forwarder,
    federation: &Federation,
    forward: &OpenForward,
    why: &str,
) -> Result<(), StoreError> {
    // A suspect may still refute the suspicion: only a declared death, or
    // silence past the timeout, takes the work back.
    let down = federation.gossip.table().is_down(&forward.site);
    let silent_ms = unix_now_ms().saturating_sub(forward.answered_ms);
    let timeout_ms = u64::try_from(federation.forward_timeout.as_millis()).unwrap_or(u64::MAX);
    if down {
        take_back(forwarder, forward, &format!("was declared down ({why})")).await
    } else if silent_ms > timeout_ms {
        take_back(
            forwarder,
            forward,
            &format!("did not answer for {} s ({why})", silent_ms / 1000),
        )
        .await
    } else {
        tracing::debug!(task = %forward.task_id, site = %forward.site, %why, "peer did not answer; will ask again");
        Ok(())
    }
}

async fn take_back(
    forwarder: &Forwarder,
    forward: &OpenForward,
    reason: &str,
) -> Result<(), StoreError> {
    let outcome = forwarder
        .store
        .take_back_forward(
            &forward.task_id,
            forward.attempt,
            &format!("site {} {reason}", forward.site),
            forwarder.max_attempts,
            unix_now_ms(),
        )
        .await?;
    if outcome != TakenBack::AlreadyEnded {
        tracing::warn!(task = %forward.task_id, site = %forward.site, %reason, ?outcome, "forward taken back");
        forwarder.wake_scheduler.notify_one();
    }
    Ok(())
}

/// One call to `site`, signed with this site's key, its JSON answer decoded.
async fn call<T: serde::de::DeserializeOwned>(
    federation: &Federation,
    site: &str,
    request: reqwest::RequestBuilder,
) -> PeerAnswer<T> {
    let request = match federation.signed(site, request) {
        Ok(request) => request,
        Err(error) => return PeerAnswer::Silent(error.to_string()),
    };
    let response = match federation.http.execute(request).await {
        Ok(response) => response,
        Err(error) => return PeerAnswer::Silent(error.to_string()),
    };
    let status = response.status();
    if status.is_server_error() || status == StatusCode::TOO_MANY_REQUESTS {
        return PeerAnswer::Silent(format!("HTTP {status}"));
    }
    if !status.is_success() {
        let body = response.text().await.unwrap_or_default();
        return PeerAnswer::Refused(format!(
            "HTTP {status}: {}",
            body.chars().take(300).collect::<String>()
        ));
    }
    match response.json::<T>().await {
        Ok(value) => PeerAnswer::Ok(value),
        Err(error) => PeerAnswer::Silent(format!("unreadable answer: {error}")),
    }
}
