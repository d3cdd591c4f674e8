//! The lease loop of a coordinator replica (several on one PostgreSQL): it
//! takes the site's lease when it is free or has run out, renews it while
//! it leads, steps down the moment a renewal fails or comes too late, and
//! hands the lease back on a clean stop so another replica takes over at
//! once. While it leads, `Leadership` says so to the scheduler, the outbox,
//! failure detection, attempt review and the forwarder; the store fences
//! their writes with the term (`Store::fence`), so a replica that stopped
//! leading without knowing it (paused, cut off) cannot place, send or
//! requeue anything.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{watch, Notify};
use tokio::time::Instant;

use crate::leader::Leadership;
use crate::store::Store;
use crate::task::unix_now_ms;

/// What the lease loop uses.
pub(crate) struct Lease {
    /// Where the lease is.
    pub(crate) store: Store,
    /// This replica's standing, shared with the loops that only a leader runs.
    pub(crate) leadership: Leadership,
    /// This replica's name in the lease (unique per process).
    pub(crate) holder: String,
    /// How long a lease runs without renewal: how long the site goes without
    /// a leader when the leader dies without handing it back.
    pub(crate) ttl: Duration,
    /// Woken when this replica starts leading.
    pub(crate) wake_scheduler: Arc<Notify>,
}

/// Takes, renews and hands back the lease until told to stop.
pub(crate) async fn run(lease: Lease, mut stop: watch::Receiver<bool>) {
    // Four tries per lease: a renewal may fail or be slow three times in a
    // row before the term can run out.
    let period = lease.ttl / 4;
    let ttl_ms = u64::try_from(lease.ttl.as_millis()).unwrap_or(u64::MAX);
    let mut renewed_at: Option<Instant> = None;
    loop {
        let asked = Instant::now();
        let now_ms = unix_now_ms();
        match lease.leadership.term() {
            None => match lease
                .store
                .acquire_lease(&lease.holder, now_ms, ttl_ms)
                .await
            {
                Ok(Some(term)) => {
                    renewed_at = Some(asked);
                    lease.leadership.lead(term);
                    tracing::info!(term, holder = %lease.holder, "this replica leads the site");
                    // The previous leader's unacknowledged assignments go out
                    // again now, signed under this term.
                    if let Err(error) = lease.store.outbox_due_by(now_ms).await {
                        tracing::warn!(%error, "cannot reschedule the outbox after taking the lease");
                    }
                    lease.wake_scheduler.notify_one();
                }
                Ok(None) => {}
                Err(error) => tracing::warn!(%error, "cannot try the site's lease; retrying"),
            },
            Some(term) => {
                match lease
                    .store
                    .renew_lease(&lease.holder, term, now_ms, ttl_ms)
                    .await
                {
                    Ok(true) => renewed_at = Some(asked),
                    Ok(false) => {
                        lease.leadership.step_down();
                        tracing::warn!(
                            term,
                            "another replica took the site's lease: this one no longer leads"
                        );
                    }
                    Err(error) => tracing::warn!(%error, term, "cannot renew the site's lease"),
                }
                // By the other replicas' clocks the lease runs out `ttl`
                // after the last renewal that went through: stop a period
                // before that, whatever the database says later.
                let late = renewed_at.is_none_or(|at| at.elapsed() + period >= lease.ttl);
                if late && lease.leadership.term() == Some(term) {
                    lease.leadership.step_down();
                    tracing::warn!(
                        term,
                        "the site's lease could not be renewed in time: this replica stops leading"
                    );
                }
            }
        }
        tokio::select! {
            _ = tokio::time::sleep_until(asked + period) => {}
            _ = stop.wait_for(|stopped| *stopped) => break,
        }
    }
    if let Some(term) = lease.leadership.term() {
        lease.leadership.step_down();
        match lease.store.release_lease(&lease.holder, term).await {
            Ok(()) => tracing::info!(term, "handed the site's lease back"),
            Err(error) => {
                tracing::warn!(%error, "cannot hand the site's lease back; it runs out by itself")
            }
        }
    }
}
