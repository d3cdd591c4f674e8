//! Federation inside the simulator: the digests sites publish every gossip
//! interval, each site's own copy of its peers' digests (stale between
//! rounds of gossip, as in reality, and debited with its own forwards by
//! [`federation::commit`]), and the routing of tasks through
//! [`federation::route`], the very code the coordinator runs.

use starling_proto::SiteId;

use crate::federation::{self, InterSiteLink, RemoteSite, Route, SiteCapacity};
use crate::model::PendingTask;
use crate::policy::Decision;

/// The federation state of one multi-site run.
#[derive(Debug, Clone)]
pub(crate) struct Gossip {
    /// The link between any two sites.
    pub link: InterSiteLink,
    /// Milliseconds between two digests of a site.
    pub interval_ms: f64,
    /// `copies[site]`: what `site` knows of its peers.
    copies: Vec<Vec<RemoteSite>>,
    /// `peers[site][k]`: the site `copies[site][k]` describes.
    peers: Vec<Vec<usize>>,
    /// Whether each task has been forwarded once (it never is twice).
    forwarded: Vec<bool>,
    /// The digests' version: one per publication.
    version: u64,
}

/// A site's name in digests and explanations.
pub(crate) fn site_name(site: usize) -> String {
    format!("site-{site}")
}

impl Gossip {
    /// No digests yet; `tasks` tasks in the run.
    pub fn new(link: InterSiteLink, interval_ms: f64, tasks: usize) -> Gossip {
        Gossip {
            link,
            interval_ms,
            copies: Vec::new(),
            peers: Vec::new(),
            forwarded: vec![false; tasks],
            version: 0,
        }
    }

    /// Every site's new digest, by site index, replaces what every peer held
    /// (and the forwards it had accounted in it).
    pub fn publish(&mut self, capacities: Vec<SiteCapacity>) {
        self.version += 1;
        let digests: Vec<_> = capacities
            .into_iter()
            .enumerate()
            .filter_map(|(site, capacity)| {
                let name = SiteId::new(&site_name(site)).ok()?;
                let url = format!("sim://{}", site_name(site));
                let digest = capacity.into_digest(name, self.version, &url, &[]).ok()?;
                Some((site, digest))
            })
            .collect();
        let sites = digests.len();
        self.copies = Vec::with_capacity(sites);
        self.peers = Vec::with_capacity(sites);
        for site in 0..sites {
            let (peers, copies) = digests
                .iter()
                .filter(|(peer, _)| *peer != site)
                .map(|(peer, digest)| {
                    (
                        *peer,
                        RemoteSite {
                            digest: digest.clone(),
                            link: self.link,
                        },
                    )
                })
                .unzip();
            self.peers.push(peers);
            self.copies.push(copies);
        }
    }

    /// Where `task` (index `index`), decided on by `site`'s policy, goes: the
    /// peer site to forward it to, or `None` to keep it. A forward is
    /// accounted in `site`'s copy of the peer's digest.
    pub fn route(
        &mut self,
        site: usize,
        index: usize,
        task: &PendingTask,
        now_ms: u64,
        decision: &Decision,
    ) -> Option<usize> {
        if self.forwarded.get(index).copied().unwrap_or(true) {
            return None;
        }
        let copies = self.copies.get_mut(site)?;
        let Route::Forward { site: peer, .. } = federation::route(task, now_ms, decision, copies)
        else {
            return None;
        };
        federation::commit(copies.get_mut(peer)?, task);
        let to = self.peers.get(site)?.get(peer).copied()?;
        if let Some(flag) = self.forwarded.get_mut(index) {
            *flag = true;
        }
        Some(to)
    }

    /// Seconds from the decision to forward until the task is in the peer's
    /// queue: one way across the link, then its input.
    pub fn handover_s(&self, task: &PendingTask) -> f64 {
        self.link.one_way_s() + self.link.transfer_s(task.input_bytes)
    }

    /// Seconds a forwarded task's output takes from the peer back home.
    pub fn return_s(&self, task: &PendingTask) -> f64 {
        self.link.transfer_s(task.output_bytes) + self.link.one_way_s()
    }
}
