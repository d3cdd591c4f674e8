//! Spreads the trust root's revocations to every member. A revocation
//! reaches one member (`POST /api/v1/federation/revocations`, from the
//! operator); that member passes it to each live peer over the same route,
//! and each peer that did not know it passes it on in turn, so it floods
//! the federation along the gossip membership. A peer that was down or cut
//! off gets it once it is alive again: what a peer has not acknowledged is
//! sent again every [`RESEND`]. Over REST rather than gossip because a
//! revocation must arrive whole and be acknowledged, and the root's
//! signature makes it safe to accept from anyone.
//!
//! The loop also re-reads the store, so replicas of one site on one
//! PostgreSQL learn what another replica received.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::watch;

use super::Federation;
use crate::store::Store;

/// How often revocations not yet acknowledged by a live peer are sent again,
/// and the store is read for revocations other replicas received.
const RESEND: Duration = Duration::from_secs(15);

/// Runs until told to stop.
pub(super) async fn run(
    store: Store,
    federation: Arc<Federation>,
    mut stop: watch::Receiver<bool>,
) {
    // (peer, revoked site, revoked_ms) that the peer acknowledged.
    let mut delivered: HashSet<(String, String, u64)> = HashSet::new();
    loop {
        match store.site_revocations().await {
            Ok(stored) => {
                for revocation in stored {
                    if let Err(error) = federation.trust.revoke(&revocation) {
                        tracing::warn!(site = %revocation.site, %error, "a stored revocation does not verify; ignored");
                    }
                }
            }
            Err(error) => tracing::warn!(%error, "cannot read the stored revocations"),
        }
        let revocations = federation.trust.revocations();
        if !revocations.is_empty() {
            let peers: Vec<(String, String)> = federation.gossip.table().live_apis(Instant::now());
            for (peer, api_url) in peers {
                for revocation in &revocations {
                    let key = (peer.clone(), revocation.site.clone(), revocation.revoked_ms);
                    if delivered.contains(&key) {
                        continue;
                    }
                    let sent = federation
                        .http
                        .post(format!("{api_url}/api/v1/federation/revocations"))
                        .json(revocation)
                        .send()
                        .await;
                    match sent {
                        Ok(response) if response.status().is_success() => {
                            tracing::debug!(%peer, site = %revocation.site, "revocation passed on");
                            delivered.insert(key);
                        }
                        Ok(response) => {
                            tracing::warn!(%peer, site = %revocation.site, status = %response.status(), "a peer refused a revocation; will send it again");
                        }
                        Err(error) => {
                            tracing::debug!(%peer, site = %revocation.site, %error, "cannot pass a revocation on; will send it again");
                        }
                    }
                }
            }
        }
        tokio::select! {
            _ = federation.wake_revocations.notified() => {}
            _ = tokio::time::sleep(RESEND) => {}
            _ = stop.wait_for(|stopped| *stopped) => return,
        }
    }
}
