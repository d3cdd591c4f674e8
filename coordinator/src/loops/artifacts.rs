//! Collection of artifacts no task references (issue 33: uploads had no
//! bound and nothing was ever deleted). The leading replica deletes, once
//! an hour and shortly after start, every artifact stored longer ago than
//! the grace period that no task references, with the code compiled from
//! it. A task keeps its artifact for as long as the task is kept.

use std::time::Duration;

use tokio::sync::watch;

use crate::store::Store;
use crate::task::unix_now_ms;

/// How often the loop looks.
const EVERY: Duration = Duration::from_secs(3600);

/// The first look after start: soon, but after the start's own work.
const FIRST: Duration = Duration::from_secs(60);

/// What the collection loop uses.
pub(crate) struct Collector {
    /// Where the artifacts are.
    pub(crate) store: Store,
    /// How long an unreferenced artifact is kept after its upload.
    pub(crate) grace: Duration,
}

/// Collects unreferenced artifacts until told to stop.
pub(crate) async fn run(collector: Collector, mut stop: watch::Receiver<bool>) {
    let mut wait = FIRST;
    loop {
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = stop.wait_for(|stopped| *stopped) => break,
        }
        wait = EVERY;
        if let Err(error) = collector.collect_once(unix_now_ms()).await {
            tracing::warn!(%error, "cannot collect unreferenced artifacts; trying again in an hour");
        }
    }
}

impl Collector {
    /// One pass at `now_ms`: returns how many artifacts were deleted and
    /// their bytes (none on a replica that does not lead).
    pub(crate) async fn collect_once(
        &self,
        now_ms: u64,
    ) -> Result<(u64, u64), crate::store::StoreError> {
        if !self.store.leads() {
            return Ok((0, 0));
        }
        let grace_ms = u64::try_from(self.grace.as_millis()).unwrap_or(u64::MAX);
        let collected = self
            .store
            .collect_artifacts(now_ms.saturating_sub(grace_ms))
            .await?;
        if collected.0 > 0 {
            tracing::info!(
                artifacts = collected.0,
                bytes = collected.1,
                "collected artifacts no task references"
            );
        }
        Ok(collected)
    }
}
