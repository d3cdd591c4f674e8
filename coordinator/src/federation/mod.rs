//! Federation of sites: each coordinator serves one site and gossips a digest
//! of it (free capacity per class and per power budget, queue, slack, watts,
//! artifacts) to the others, with no central server. Work that cannot meet
//! its deadline at home goes to the best peer over REST.
//!
//! Map: `key` (the cluster key: sealed datagrams), `identity` (each site's
//! own key and root-signed certificate: signed REST calls and digests,
//! revocations; the `federation` commands), `revocations` (spreads
//! revocations to peers), `gossip`
//! (foca's SWIM over UDP: membership, failure detection, digests), `sites`
//! (the federation as seen from here, no I/O), `forward` (the home side:
//! send, follow, take back; its SQL is `store::forwards`), `member` (a
//! gossip-only process for benchmarks). The decision to forward is the
//! placement engine's (`starling_placement::federation::route`), called by the
//! scheduler with the peers' digests.

mod forward;
pub(crate) use forward::Forwarder;
pub mod gossip;
pub mod identity;
pub mod key;
pub mod member;
mod revocations;
pub mod sites;

use std::sync::Arc;
use std::time::{Duration, Instant};

use starling_placement::federation::{site_capacity, InterSiteLink, RemoteSite};
use starling_proto::site::MAX_DIGEST_ARTIFACTS;
use starling_proto::{SiteDigest, SiteId};
use tokio::sync::{watch, Notify};
use tokio::task::JoinHandle;

pub use gossip::{Gossip, GossipConfig, GossipError, GossipEvent};
pub use key::ClusterKey;
pub use starling_api::{SiteEntry, SiteState};

use crate::config::FederationConfig;

/// How often this site's capacity is looked at for a new digest.
pub(crate) const DIGEST_CHECK: Duration = Duration::from_millis(500);
/// How often peers' REST round trips are measured.
const RTT_PROBE: Duration = Duration::from_secs(5);
/// Round trip assumed for a peer not measured yet.
const DEFAULT_RTT_MS: f64 = 20.0;

/// Why federation could not start.
#[derive(Debug, thiserror::Error)]
pub enum FederationError {
    /// The cluster key is unusable.
    #[error(transparent)]
    Key(#[from] key::KeyError),
    /// The site name is not a valid id.
    #[error("--site {0:?} is not a valid site name: {1}")]
    Site(String, starling_proto::IdError),
    /// Gossip could not start.
    #[error(transparent)]
    Gossip(#[from] GossipError),
    /// The site credentials cannot be used.
    #[error("--site-credentials {0}")]
    Credentials(#[from] identity::CredentialsError),
    /// The credentials are another site's.
    #[error("--site-credentials is for site {certified}, but this coordinator is --site {site}: start it with the credentials issued for {site} (`starling-coordinator federation issue --site {site} --out FILE` on the member holding the trust root)")]
    CredentialsSite {
        /// The --site given.
        site: String,
        /// The site the credentials certify.
        certified: String,
    },
    /// The site's own certificate is expired or revoked.
    #[error("--site-credentials: {0}")]
    Certificate(#[from] identity::CertificateError),
    /// The stored revocations could not be read.
    #[error("cannot read the stored site revocations: {0}")]
    Store(#[from] crate::store::StoreError),
    /// The HTTP client for peers could not be built.
    #[error("cannot build the HTTP client for peers: {0}")]
    Http(String),
}

/// A running federation membership.
pub(crate) struct Federation {
    pub(crate) site: SiteId,
    pub(crate) gossip: Gossip,
    /// This site's key and certificate: it signs every call to a peer.
    pub(crate) identity: Arc<identity::SiteIdentity>,
    /// The trust root and the revocations known: every peer's call and
    /// digest is checked against it.
    pub(crate) trust: Arc<identity::Trust>,
    /// Wakes the loop that passes revocations on to peers.
    pub(crate) wake_revocations: Notify,
    pub(crate) link_mbps: f64,
    pub(crate) forward_timeout: Duration,
    pub(crate) http: reqwest::Client,
    pub(crate) wake_forwarder: Notify,
}

impl std::fmt::Debug for Federation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Federation")
            .field("site", &self.site)
            .finish_non_exhaustive()
    }
}

impl Federation {
    /// Joins the federation: binds gossip and starts announcing to the seeds.
    pub(crate) async fn start(
        config: &FederationConfig,
        store: &crate::store::Store,
    ) -> Result<Arc<Self>, FederationError> {
        let key = Arc::new(ClusterKey::parse(&config.cluster_key)?);
        let site = SiteId::new(&config.site)
            .map_err(|error| FederationError::Site(config.site.clone(), error))?;
        let (identity, trust) = identity_of(&site, &config.site_credentials, store).await?;
        let identity = Arc::new(identity);
        let gossip = Gossip::start(
            GossipConfig {
                site: site.clone(),
                bind: config.gossip_listen,
                advertise: config.gossip_advertise,
                seeds: config.seeds.clone(),
                lifeguard: true,
                signing: Some(gossip::Signing {
                    identity: identity.clone(),
                    trust: trust.clone(),
                }),
            },
            key.clone(),
        )
        .await?;
        let http = starling_net::tls::http_client(None)
            .map_err(|error| FederationError::Http(error.to_string()))?
            .timeout(Duration::from_secs(5))
            .connect_timeout(Duration::from_secs(2))
            .build()
            .map_err(|error| FederationError::Http(error.to_string()))?;
        tracing::info!(site = %site, gossip = %gossip.local_addr(), seeds = ?config.seeds, "federation: joining");
        Ok(Arc::new(Self {
            site,
            gossip,
            identity,
            trust,
            wake_revocations: Notify::new(),
            link_mbps: config.link_mbps,
            forward_timeout: config.forward_timeout,
            http,
            wake_forwarder: Notify::new(),
        }))
    }

    /// The peers work may go to now, as placement candidates, minus `exclude`.
    pub(crate) fn remote_sites(&self, exclude: &[String]) -> Vec<RemoteSite> {
        self.gossip
            .table()
            .peers()
            .into_iter()
            .filter(|peer| !exclude.iter().any(|site| site == peer.digest.site.as_str()))
            .filter(|peer| !self.trust.is_site_revoked(peer.digest.site.as_str()))
            .map(|peer| RemoteSite {
                digest: peer.digest,
                link: InterSiteLink {
                    rtt_ms: peer.rtt_ms.unwrap_or(DEFAULT_RTT_MS),
                    bandwidth_mbps: self.link_mbps,
                },
            })
            .collect()
    }
}

/// This site's identity from its credentials file, which must certify
/// `site` and hold now, and the trust it carries with the stored revocations.
async fn identity_of(
    site: &SiteId,
    path: &std::path::Path,
    store: &crate::store::Store,
) -> Result<(identity::SiteIdentity, Arc<identity::Trust>), FederationError> {
    let credentials = identity::SiteCredentials::load(path)?;
    if credentials.identity.site() != site {
        return Err(FederationError::CredentialsSite {
            site: site.to_string(),
            certified: credentials.identity.site().to_string(),
        });
    }
    let trust = Arc::new(identity::Trust::new(credentials.root));
    for revocation in store.site_revocations().await? {
        if let Err(error) = trust.revoke(&revocation) {
            tracing::warn!(site = %revocation.site, %error, "a stored revocation does not verify with this trust root; ignored");
        }
    }
    trust.verify_certificate(
        credentials.identity.certificate().to_bytes(),
        crate::task::unix_now_ms(),
    )?;
    Ok((credentials.identity, trust))
}

impl Federation {
    /// `request` to `target_site`'s coordinator, signed with this site's key
    /// (the path with its query and the body as they will be sent).
    pub(crate) fn signed(
        &self,
        target_site: &str,
        request: reqwest::RequestBuilder,
    ) -> Result<reqwest::Request, reqwest::Error> {
        let mut request = request.build()?;
        let url = request.url();
        let path = match url.query() {
            Some(query) => format!("{}?{query}", url.path()),
            None => url.path().to_string(),
        };
        let body = request
            .body()
            .and_then(|body| body.as_bytes())
            .unwrap_or(&[]);
        let signed = self.identity.sign_request(
            target_site,
            request.method().as_str(),
            &path,
            body,
            crate::task::unix_now_ms(),
        );
        for (name, value) in signed.headers() {
            // Base64 and digits: always valid header values.
            if let Ok(value) = reqwest::header::HeaderValue::from_str(value) {
                request.headers_mut().insert(name, value);
            }
        }
        Ok(request)
    }
}

/// What the digest publisher reads: the queue and the cluster view the
/// scheduler sees, the artifacts held, and the URL peers forward to.
#[derive(Clone)]
pub(crate) struct DigestSource {
    pub(crate) store: crate::store::Store,
    pub(crate) views: crate::cluster_view::ViewSource,
    pub(crate) public_url: String,
}

/// Starts the federation's loops: digest publishing, round-trip probes, forwarding.
pub(crate) fn spawn(
    source: DigestSource,
    forwarder: forward::Forwarder,
    federation: Arc<Federation>,
    stop: watch::Receiver<bool>,
) -> Vec<JoinHandle<()>> {
    let store = source.store.clone();
    vec![
        tokio::spawn(publish_digests(source, federation.clone(), stop.clone())),
        tokio::spawn(probe_peers(federation.clone(), stop.clone())),
        tokio::spawn(revocations::run(store, federation.clone(), stop.clone())),
        tokio::spawn(forward::run(forwarder, federation, stop)),
    ]
}

/// This site's digest from what the scheduler sees now: the same figures
/// the simulator's sites publish (`SiteCapacity::into_digest`).
async fn digest(
    source: &DigestSource,
    federation: &Federation,
    version: u64,
) -> Result<SiteDigest, String> {
    let pending = source
        .store
        .pending_tasks(crate::cluster_view::QUEUE_WINDOW)
        .await
        .map_err(|error| error.to_string())?;
    let snapshot = source
        .views
        .snapshot(pending)
        .await
        .map_err(|error| error.to_string())?;
    let artifacts: Vec<starling_proto::Digest> = source
        .store
        .recent_artifacts(MAX_DIGEST_ARTIFACTS as u32)
        .await
        .map_err(|error| error.to_string())?
        .iter()
        .filter_map(|hex| starling_proto::Digest::parse(hex).ok())
        .collect();
    site_capacity(&snapshot.view, &snapshot.queue)
        .into_digest(
            federation.site.clone(),
            version,
            &source.public_url,
            &artifacts,
        )
        .map_err(|error| format!("{error}; pass a shorter --public-url so peers can forward here"))
}

/// Publishes this site's digest when it changed and at least every
/// [`Gossip::digest_refresh`]. A site that joins gets every digest from its
/// seed by state sync, so a join is no reason to publish: when every site
/// republished on each join, 200 sites starting together flooded the
/// gossip.
async fn publish_digests(
    source: DigestSource,
    federation: Arc<Federation>,
    mut stop: watch::Receiver<bool>,
) {
    let mut last: Option<(SiteDigest, Instant)> = None;
    let mut version = 0u64;
    loop {
        // Compared without its version: only a change of figures is news.
        match digest(&source, &federation, 1).await {
            Ok(mut fresh) => {
                let due = match &last {
                    None => true,
                    Some((previous, at)) => {
                        *previous != fresh || at.elapsed() >= federation.gossip.digest_refresh()
                    }
                };
                if due {
                    version = crate::task::unix_now_ms().max(version.saturating_add(1));
                    let unversioned = fresh.clone();
                    fresh.version = version;
                    match federation.gossip.publish(&fresh) {
                        Ok(()) => last = Some((unversioned, Instant::now())),
                        Err(error) => tracing::warn!(%error, "cannot publish this site's digest"),
                    }
                }
            }
            Err(error) => tracing::warn!(%error, "cannot compute this site's digest"),
        }
        let stopping = tokio::select! {
            _ = tokio::time::sleep(DIGEST_CHECK) => false,
            _ = stop.wait_for(|stopped| *stopped) => true,
        };
        if stopping {
            // Tell the others now rather than let them detect a failure.
            federation.gossip.leave().await;
            return;
        }
    }
}

/// Measures the round trip to each live peer's REST API (its health route):
/// the network cost the placement engine charges a forward.
async fn probe_peers(federation: Arc<Federation>, mut stop: watch::Receiver<bool>) {
    loop {
        let targets: Vec<(String, String)> = federation.gossip.table().live_apis(Instant::now());
        for (site, url) in targets {
            let started = Instant::now();
            let rtt = match federation
                .http
                .get(format!("{url}/api/v1/health"))
                .send()
                .await
            {
                Ok(_) => Some(started.elapsed().as_secs_f64() * 1000.0),
                Err(error) => {
                    tracing::debug!(%site, %error, "peer health probe failed");
                    None
                }
            };
            federation.gossip.table().set_rtt(&site, rtt);
        }
        tokio::select! {
            _ = tokio::time::sleep(RTT_PROBE) => {}
            _ = stop.wait_for(|stopped| *stopped) => return,
        }
    }
}
