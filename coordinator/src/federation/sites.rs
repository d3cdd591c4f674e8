//! The federation as this coordinator sees it: every site it has heard of,
//! whether the failure detector holds it alive, its newest digest and the
//! measured round trip to its REST API. No I/O: the gossip loop and the
//! forwarder feed it, the REST API and the scheduler read it.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Instant;

use starling_api::{SiteEntry, SiteState};
use starling_proto::SiteDigest;

#[derive(Debug, Clone)]
struct Site {
    state: SiteState,
    since: Instant,
    addr: Option<SocketAddr>,
    digest: Option<SiteDigest>,
    received: Option<Instant>,
    rtt_ms: Option<f64>,
}

/// Every site heard of, by name.
#[derive(Debug, Clone)]
pub struct SiteTable {
    own: String,
    sites: BTreeMap<String, Site>,
    /// Told of every change of a site's state (the live event stream).
    watchers: Option<crate::live::Feed>,
}

/// A peer the scheduler may send work to.
#[derive(Debug, Clone)]
pub struct Peer {
    /// Its newest digest.
    pub digest: SiteDigest,
    /// Measured round trip to its REST API, when measured.
    pub rtt_ms: Option<f64>,
}

impl SiteTable {
    /// A table holding only this coordinator's site.
    pub fn new(own: &str, addr: SocketAddr, now: Instant) -> Self {
        let mut sites = BTreeMap::new();
        sites.insert(
            own.to_string(),
            Site {
                state: SiteState::Myself,
                since: now,
                addr: Some(addr),
                digest: None,
                received: None,
                rtt_ms: None,
            },
        );
        Self {
            own: own.to_string(),
            sites,
            watchers: None,
        }
    }

    /// Announces every later change of a site's state on `feed`.
    pub(crate) fn announce_to(&mut self, feed: crate::live::Feed) {
        self.watchers = Some(feed);
    }

    /// This coordinator's site name.
    pub fn own(&self) -> &str {
        &self.own
    }

    fn site(&mut self, name: &str, now: Instant) -> &mut Site {
        self.sites.entry(name.to_string()).or_insert(Site {
            state: SiteState::Down,
            since: now,
            addr: None,
            digest: None,
            received: None,
            rtt_ms: None,
        })
    }

    fn set_state(&mut self, name: &str, state: SiteState, now: Instant) -> bool {
        if name == self.own {
            return false;
        }
        let site = self.site(name, now);
        let changed = site.state != state;
        if changed {
            site.state = state;
            site.since = now;
            if let Some(feed) = &self.watchers {
                feed.site(name, state);
            }
        }
        changed
    }

    /// The failure detector holds `name` alive at `addr`; true when that is news.
    pub fn up(&mut self, name: &str, addr: SocketAddr, now: Instant) -> bool {
        if name != self.own {
            self.site(name, now).addr = Some(addr);
        }
        let suspect = self.sites.get(name).map(|site| site.state) == Some(SiteState::Suspect);
        self.set_state(name, SiteState::Alive, now) && !suspect
    }

    /// The failure detector declared `name` down; true when that is news.
    pub fn down(&mut self, name: &str, now: Instant) -> bool {
        self.set_state(name, SiteState::Down, now)
    }

    /// Marks which active sites are suspected now (the rest of the active
    /// ones are alive); the sites suspected that were not before.
    pub fn suspects(&mut self, suspected: &[String], now: Instant) -> Vec<String> {
        let names: Vec<String> = self
            .sites
            .iter()
            .filter(|(_, site)| matches!(site.state, SiteState::Alive | SiteState::Suspect))
            .map(|(name, _)| name.clone())
            .collect();
        let mut newly = Vec::new();
        for name in names {
            let suspect = suspected.contains(&name);
            let state = if suspect {
                SiteState::Suspect
            } else {
                SiteState::Alive
            };
            if self.set_state(&name, state, now) && suspect {
                newly.push(name);
            }
        }
        newly
    }

    /// Keeps `digest` if it is newer than what the table holds for its site;
    /// true when kept. This site's own digest is kept too, for display.
    pub fn offer(&mut self, digest: SiteDigest, now: Instant) -> bool {
        let site = self.site(digest.site.as_str(), now);
        if site
            .digest
            .as_ref()
            .is_some_and(|held| held.version >= digest.version)
        {
            return false;
        }
        site.digest = Some(digest);
        site.received = Some(now);
        true
    }

    /// Records a measured round trip to `name`'s REST API.
    pub fn set_rtt(&mut self, name: &str, rtt_ms: Option<f64>) {
        if let Some(site) = self.sites.get_mut(name) {
            site.rtt_ms = rtt_ms;
        }
    }

    /// Each live peer's name and REST base URL (those with a digest).
    pub fn live_apis(&self, now: Instant) -> Vec<(String, String)> {
        self.entries(now)
            .into_iter()
            .filter(|entry| entry.state == SiteState::Alive)
            .filter_map(|entry| Some((entry.site, entry.api_url?)))
            .collect()
    }

    /// Whether `name` is alive now.
    pub fn is_alive(&self, name: &str) -> bool {
        self.sites
            .get(name)
            .is_some_and(|site| site.state == SiteState::Alive)
    }

    /// Whether the failure detector declared `name` down (or never saw it).
    pub fn is_down(&self, name: &str) -> bool {
        self.sites
            .get(name)
            .is_none_or(|site| site.state == SiteState::Down)
    }

    /// Peers that work may go to: alive (not merely suspected) and with a digest.
    pub fn peers(&self) -> Vec<Peer> {
        self.sites
            .values()
            .filter(|site| site.state == SiteState::Alive)
            .filter_map(|site| {
                Some(Peer {
                    digest: site.digest.clone()?,
                    rtt_ms: site.rtt_ms,
                })
            })
            .collect()
    }

    /// Every site, this one first, then by name.
    pub fn entries(&self, now: Instant) -> Vec<SiteEntry> {
        let millis = |since: Instant| {
            u64::try_from(now.saturating_duration_since(since).as_millis()).unwrap_or(u64::MAX)
        };
        let mut entries: Vec<SiteEntry> = self
            .sites
            .iter()
            .map(|(name, site)| SiteEntry {
                site: name.clone(),
                state: site.state,
                gossip_addr: site.addr.map(|addr| addr.to_string()),
                api_url: site.digest.as_ref().map(|d| d.api_url.to_string()),
                digest_age_ms: site.received.map(millis),
                state_age_ms: millis(site.since),
                rtt_ms: site.rtt_ms,
                digest: site.digest.clone(),
            })
            .collect();
        entries.sort_by_key(|entry| entry.state != SiteState::Myself);
        entries
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use starling_proto::{SiteId, PROTOCOL_VERSION};

    fn digest(site: &str, version: u64) -> SiteDigest {
        SiteDigest {
            v: PROTOCOL_VERSION,
            site: SiteId::new(site).unwrap(),
            version,
            api_url: heapless::String::try_from("http://10.0.0.2:8080").unwrap(),
            nodes: 1,
            classes: heapless::Vec::new(),
            power: heapless::Vec::new(),
            pending: 0,
            running: 0,
            slack_ms: None,
            watts: 0.0,
            artifacts: heapless::Vec::new(),
        }
    }

    #[test]
    fn only_newer_digests_are_kept_and_only_alive_sites_are_peers() {
        let now = Instant::now();
        let addr: SocketAddr = "10.0.0.1:7946".parse().unwrap();
        let mut table = SiteTable::new("a", addr, now);
        assert!(table.offer(digest("b", 5), now));
        assert!(!table.offer(digest("b", 5), now));
        assert!(!table.offer(digest("b", 4), now));
        // Heard of through gossip but never seen alive: not a peer.
        assert!(table.peers().is_empty());
        assert!(table.up("b", "10.0.0.2:7946".parse().unwrap(), now));
        assert!(!table.up("b", "10.0.0.2:7946".parse().unwrap(), now));
        assert_eq!(table.peers().len(), 1);
        assert_eq!(table.suspects(&["b".to_string()], now), vec!["b"]);
        assert_eq!(
            table.suspects(&["b".to_string()], now),
            Vec::<String>::new()
        );
        assert!(table.peers().is_empty(), "a suspect gets no new work");
        assert_eq!(table.suspects(&[], now), Vec::<String>::new());
        assert_eq!(table.peers()[0].digest.version, 5);
        assert!(table.down("b", now));
        assert!(table.peers().is_empty());
        let entries = table.entries(now);
        assert_eq!(entries[0].state, SiteState::Myself);
        assert_eq!(entries[1].state, SiteState::Down);
        assert_eq!(entries[1].api_url.as_deref(), Some("http://10.0.0.2:8080"));
        // This site never marks itself down.
        assert!(!table.down("a", now));
    }
}
