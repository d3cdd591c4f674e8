//! Membership, failure detection and digest dissemination: foca's SWIM over
//! UDP, with Lifeguard ([`lifeguard`]) and full state sync over TCP
//! ([`sync`]) around it. foca does no I/O; the loop ([`run`]) feeds it
//! datagrams and timers and carries out what it asks for (send, schedule,
//! notify). Every datagram is sealed with the cluster key ([`super::key`])
//! and carries its sender's clock ([`wire`]) on the way out, and must open,
//! be in the clock window and never seen before on the way in, so foca only
//! ever parses authenticated, fresh bytes. Site digests ride on foca's
//! custom broadcasts ([`digests`]).

pub(crate) mod digests;
pub mod lifeguard;
mod run;
pub mod sync;
pub mod wire;

use std::net::SocketAddr;
use std::num::{NonZeroU32, NonZeroUsize};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use foca::{Config, Foca, Identity, PostcardCodec};
use serde::{Deserialize, Serialize};
use starling_proto::site::MAX_DIGEST_BYTES;
use starling_proto::{SiteDigest, SiteId};
use tokio::net::{TcpListener, UdpSocket};
use tokio::sync::{broadcast, mpsc};

use super::identity::{seal_digest, SiteIdentity, Trust};
use super::key::{ClusterKey, SEAL_OVERHEAD};
use super::sites::SiteTable;
use digests::{lock, DigestHandler};

/// Largest datagram sent or accepted, sealed: under a 1500-byte MTU.
pub const MAX_DATAGRAM: usize = 1400;
/// What the envelope ([`wire`]) adds inside the seal: kind and clock.
const ENVELOPE: usize = 9;
/// How often a coordinator with no live peer announces itself to its seeds.
const SEED_RETRY: Duration = Duration::from_secs(1);
/// How often a site's digest is published even when nothing changed, so a
/// digest lost on the way, or a member that joined late, is caught up.
pub const DIGEST_REFRESH: Duration = Duration::from_secs(10);

/// A gossip member: the site, where it listens, and a generation that
/// grows with every start and every rejoin, so a restarted or cut-off
/// coordinator wins over the memory of its former self.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct MemberId {
    /// The site's name; empty for a seed not yet heard from.
    pub site: String,
    /// Where it gossips (UDP, and TCP for state sync).
    pub addr: SocketAddr,
    /// Generation.
    pub bump: u32,
}

impl Identity for MemberId {
    type Addr = SocketAddr;

    fn renew(&self) -> Option<Self> {
        Some(Self {
            bump: self.bump.wrapping_add(1),
            ..self.clone()
        })
    }

    fn addr(&self) -> SocketAddr {
        self.addr
    }

    fn win_addr_conflict(&self, adversary: &Self) -> bool {
        self.bump > adversary.bump
    }
}

/// What the gossip layer saw, for whoever listens (the `gossip-member`
/// benchmark process prints these).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "event", rename_all = "lowercase")]
pub enum GossipEvent {
    /// A site is alive (joined, rejoined, or refuted a suspicion).
    Up {
        /// The site.
        site: String,
    },
    /// A site is suspected: a probe of it failed, and it has not refuted
    /// yet (a transient state; a healthy site suspected is a near miss).
    Suspect {
        /// The site.
        site: String,
    },
    /// A site was declared down (or left).
    Down {
        /// The site.
        site: String,
    },
    /// A newer digest of another site arrived.
    Digest {
        /// The site.
        site: String,
        /// Its version.
        version: u64,
    },
}

/// Counters exported on `/metrics`.
#[derive(Debug, Default)]
pub struct GossipCounters {
    /// Datagrams sent.
    pub datagrams_out: AtomicU64,
    /// Bytes sent, sealed.
    pub bytes_out: AtomicU64,
    /// Datagrams received.
    pub datagrams_in: AtomicU64,
    /// Bytes received.
    pub bytes_in: AtomicU64,
    /// Datagrams that did not open with the cluster key (or were too short or too long).
    pub refused: AtomicU64,
    /// Authenticated datagrams played again, or sealed outside the clock window.
    pub replayed: AtomicU64,
    /// Authenticated datagrams foca could not use.
    pub malformed: AtomicU64,
    /// Site digests that did not decode (oversize, malformed, foreign version).
    pub digests_dropped: AtomicU64,
    /// State syncs completed, either side.
    pub syncs: AtomicU64,
    /// State syncs that failed (unreachable, timed out, refused).
    pub syncs_failed: AtomicU64,
    /// Lifeguard's local health score now (0 is healthy).
    pub health_score: AtomicU64,
}

fn add(counter: &AtomicU64, n: u64) {
    counter.fetch_add(n, Ordering::Relaxed);
}

/// How to run the gossip layer.
#[derive(Debug, Clone)]
pub struct GossipConfig {
    /// This coordinator's site.
    pub site: SiteId,
    /// The UDP address to bind, and the TCP address for state sync.
    pub bind: SocketAddr,
    /// The address peers reach this one at, when not the bound one (bound to
    /// 0.0.0.0, or behind NAT).
    pub advertise: Option<SocketAddr>,
    /// Members to announce to at start and whenever no peer is alive.
    pub seeds: Vec<SocketAddr>,
    /// Lifeguard on (the default); off runs SWIM as foca does, for comparison.
    pub lifeguard: bool,
    /// How digests are signed and checked; `None` spreads them unsigned
    /// (the `gossip-member` benchmark process, which has no credentials).
    pub signing: Option<Signing>,
}

/// This site's identity, which signs its digests, and the trust that
/// checks everyone else's ([`crate::federation::identity`]).
#[derive(Debug, Clone)]
pub struct Signing {
    /// Signs this site's digests.
    pub identity: Arc<SiteIdentity>,
    /// Checks the others': root, expiry, revocations.
    pub trust: Arc<Trust>,
}

/// Why the gossip layer could not start.
#[derive(Debug, thiserror::Error)]
pub enum GossipError {
    /// The UDP or TCP address could not be bound.
    #[error("cannot bind gossip on {addr}: {reason}; pass --gossip-listen with a free address")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The OS's words.
        reason: String,
    },
    /// Bound to every interface without an address to advertise.
    #[error("gossip is bound to {0}, which peers cannot reach; pass --gossip-advertise with this host's address")]
    Unspecified(SocketAddr),
}

/// memberlist's LAN profile (what Serf's `-profile=lan` runs), with the
/// suspicion timeout and retransmissions scaled to the cluster's size, and
/// down members re-announced to every 2 s so a site cut off and reconnected
/// rejoins in seconds. Lifeguard stretches probe intervals and suspicion
/// timeouts from these.
fn lan_config(members: usize) -> Config {
    let size = NonZeroU32::new(u32::try_from(members.max(1)).unwrap_or(u32::MAX))
        .unwrap_or(NonZeroU32::MIN);
    let mut config = Config::new_lan(size);
    config.max_transmissions = retransmissions(members);
    config.max_packet_size =
        NonZeroUsize::new(MAX_DATAGRAM - SEAL_OVERHEAD - ENVELOPE).unwrap_or(NonZeroUsize::MIN);
    config.periodic_announce_to_down_members = Some(foca::PeriodicParams {
        frequency: Duration::from_secs(2),
        num_members: NonZeroUsize::MIN.saturating_add(1),
    });
    config
}

/// How many times each membership update is passed on: memberlist's
/// `RetransmitMult × ⌈log10(n + 1)⌉` (4, then 8 from 9 members). foca's own
/// `4 × log10(n + 1)`, rounded down, gives a third to a half of that (1 for a
/// seed alone, 4 at 10 members), and members that joined together then went
/// on unseen by some until a state sync: at 10 members the last one was seen
/// by all after 2 s instead of 0.5 s.
fn retransmissions(members: usize) -> std::num::NonZeroU8 {
    let digits = (members as f64 + 1.0).log10().ceil().max(1.0);
    let times = (4.0 * digits).min(f64::from(u8::MAX));
    // At least 4 and at most 255 by the two bounds above.
    std::num::NonZeroU8::new(times as u8).unwrap_or(std::num::NonZeroU8::MAX)
}

/// What the handle asks of the loop.
enum Command {
    Publish(Vec<u8>),
    Leave(tokio::sync::oneshot::Sender<()>),
    /// Drops every datagram in and out (a cut link), or stops doing so.
    #[cfg(test)]
    Cut(bool),
}

/// The running gossip layer.
#[derive(Debug, Clone)]
pub struct Gossip {
    commands: mpsc::Sender<Command>,
    table: Arc<Mutex<SiteTable>>,
    events: broadcast::Sender<GossipEvent>,
    counters: Arc<GossipCounters>,
    local_addr: SocketAddr,
    signing: Option<Signing>,
}

/// Binds UDP on `addr` and TCP on the same address and port: peers reach
/// both at one advertised address. With port 0, the port UDP got may be
/// taken for TCP; then another is tried.
async fn bind(addr: SocketAddr) -> Result<(UdpSocket, TcpListener), GossipError> {
    let failed = |error: std::io::Error| GossipError::Bind {
        addr,
        reason: crate::bind_error::describe_bind_error(&error),
    };
    let mut tries = 0;
    loop {
        let socket = UdpSocket::bind(addr).await.map_err(failed)?;
        let bound = socket.local_addr().map_err(failed)?;
        match TcpListener::bind(bound).await {
            Ok(listener) => return Ok((socket, listener)),
            Err(error) if addr.port() == 0 && tries < 16 => {
                tries += 1;
                tracing::debug!(%error, %bound, "gossip port taken for TCP; trying another");
            }
            Err(error) => return Err(failed(error)),
        }
    }
}

impl Gossip {
    /// Binds the sockets and starts the loop on the current runtime; every
    /// datagram and sync frame is sealed and opened with `key`.
    pub async fn start(config: GossipConfig, key: Arc<ClusterKey>) -> Result<Self, GossipError> {
        let (socket, listener) = bind(config.bind).await?;
        let bound = socket.local_addr().map_err(|error| GossipError::Bind {
            addr: config.bind,
            reason: error.to_string(),
        })?;
        let local_addr = match config.advertise {
            Some(addr) => addr,
            None if bound.ip().is_unspecified() => return Err(GossipError::Unspecified(bound)),
            None => bound,
        };
        let table = Arc::new(Mutex::new(SiteTable::new(
            config.site.as_str(),
            local_addr,
            std::time::Instant::now(),
        )));
        let (events, _) = broadcast::channel(1024);
        let (commands, commands_rx) = mpsc::channel(64);
        let counters = Arc::new(GossipCounters::default());
        // A generation from the wall clock: greater than any this site had
        // before a restart.
        let bump = u32::try_from(crate::task::unix_now_ms() / 1000).unwrap_or(u32::MAX);
        let identity = MemberId {
            site: config.site.to_string(),
            addr: local_addr,
            bump,
        };
        let handler = DigestHandler {
            table: table.clone(),
            events: events.clone(),
            latest: digests::Latest::default(),
            trust: config.signing.as_ref().map(|signing| signing.trust.clone()),
        };
        let rng: rand010::rngs::StdRng = rand010::make_rng();
        let foca = Foca::with_custom_broadcast(
            identity,
            lan_config(1),
            rng,
            PostcardCodec,
            handler.clone(),
        );
        let seeds = config
            .seeds
            .iter()
            .copied()
            .filter(|seed| *seed != local_addr && *seed != bound)
            .collect();
        let (syncs_tx, syncs_rx) = mpsc::channel(16);
        tokio::spawn(sync::serve(listener, key.clone(), syncs_tx));
        let state = run::Loop::new(run::Parts {
            foca,
            socket: Arc::new(socket),
            key,
            digests: handler,
            events: events.clone(),
            counters: counters.clone(),
            seeds,
            lifeguard: lifeguard::Lifeguard::new(local_addr, config.lifeguard),
        });
        tokio::spawn(state.run(commands_rx, syncs_rx));
        Ok(Self {
            commands,
            table,
            events,
            counters,
            local_addr,
            signing: config.signing,
        })
    }

    /// How often this site's digest is published though nothing changed:
    /// [`DIGEST_REFRESH`] up to 10 sites, then in proportion to their
    /// number. Each refresh is spread to every site, epidemically, so the
    /// refreshes a site relays grow with the square of the federation: in
    /// proportion, each site's share stays about the same (at 200 sites
    /// refreshed every 40 s, 200 debug-build gossip members on two cores
    /// never converged). A changed digest is published at once whatever
    /// this says.
    pub fn digest_refresh(&self) -> Duration {
        let sites = self.table().entries(std::time::Instant::now()).len();
        DIGEST_REFRESH.mul_f64((sites as f64 / 10.0).max(1.0))
    }

    /// Where peers reach this member.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Spreads this site's digest: encoded, checked and signed here.
    pub fn publish(&self, digest: &SiteDigest) -> Result<(), String> {
        let bytes = match &self.signing {
            Some(signing) => {
                seal_digest(&signing.identity, digest).map_err(|error| error.to_string())?
            }
            None => {
                let bytes = starling_proto::encode(digest).map_err(|error| error.to_string())?;
                if bytes.len() > MAX_DIGEST_BYTES {
                    return Err(format!(
                        "digest of {} bytes exceeds {MAX_DIGEST_BYTES}",
                        bytes.len()
                    ));
                }
                bytes
            }
        };
        self.commands
            .try_send(Command::Publish(bytes))
            .map_err(|_| "the gossip loop is not running or is overloaded".to_string())
    }

    /// The site table.
    pub fn table(&self) -> MutexGuard<'_, SiteTable> {
        lock(&self.table)
    }

    /// Membership and digest events from now on.
    pub fn subscribe(&self) -> broadcast::Receiver<GossipEvent> {
        self.events.subscribe()
    }

    /// Traffic and refusal counters.
    pub fn counters(&self) -> &GossipCounters {
        &self.counters
    }

    /// Cuts this member off (every datagram in or out dropped), or restores it.
    #[cfg(test)]
    pub(crate) async fn cut(&self, cut: bool) {
        let _ = self.commands.send(Command::Cut(cut)).await;
    }

    /// Tells the others this site leaves, then stops the loop.
    pub async fn leave(&self) {
        let (done, wait) = tokio::sync::oneshot::channel();
        if self.commands.send(Command::Leave(done)).await.is_ok() {
            let _ = tokio::time::timeout(Duration::from_secs(2), wait).await;
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use std::time::Instant;

    fn key() -> Arc<ClusterKey> {
        Arc::new(ClusterKey::parse(&ClusterKey::generate().unwrap()).unwrap())
    }

    fn config(site: &str, seeds: Vec<SocketAddr>) -> GossipConfig {
        GossipConfig {
            site: SiteId::new(site).unwrap(),
            bind: "127.0.0.1:0".parse().unwrap(),
            advertise: None,
            seeds,
            lifeguard: true,
            signing: None,
        }
    }

    fn signed(
        root: &crate::federation::identity::TrustRoot,
        site: &str,
        seeds: Vec<SocketAddr>,
    ) -> GossipConfig {
        let credentials = root
            .issue(
                &SiteId::new(site).unwrap(),
                crate::task::unix_now_ms(),
                None,
            )
            .unwrap();
        GossipConfig {
            signing: Some(Signing {
                identity: Arc::new(credentials.identity),
                trust: Arc::new(Trust::new(root.public_key())),
            }),
            ..config(site, seeds)
        }
    }

    pub(super) fn digest(site: &str, version: u64) -> SiteDigest {
        SiteDigest {
            v: starling_proto::PROTOCOL_VERSION,
            site: SiteId::new(site).unwrap(),
            version,
            api_url: heapless::String::try_from("http://127.0.0.1:1").unwrap(),
            nodes: 0,
            classes: heapless::Vec::new(),
            power: heapless::Vec::new(),
            pending: 0,
            running: 0,
            slack_ms: None,
            watts: 0.0,
            artifacts: heapless::Vec::new(),
        }
    }

    /// Starts a, then b seeded by a; once they see each other, b publishes
    /// its digest (version 7) and a has it.
    async fn pair_with_b_published(
        key: &Arc<ClusterKey>,
        a: GossipConfig,
        b: impl FnOnce(SocketAddr) -> GossipConfig,
    ) -> (Gossip, Gossip) {
        let a = Gossip::start(a, key.clone()).await.unwrap();
        let b = Gossip::start(b(a.local_addr()), key.clone()).await.unwrap();
        wait_until("a and b see each other", || {
            a.table().is_alive("b") && b.table().is_alive("a")
        })
        .await;
        b.publish(&digest("b", 7)).unwrap();
        wait_until("a has b's digest", || {
            a.table().peers().iter().any(|p| p.digest.version == 7)
        })
        .await;
        (a, b)
    }

    async fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
        let start = Instant::now();
        while !done() {
            assert!(start.elapsed() < Duration::from_secs(10), "{what}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    #[tokio::test]
    async fn members_find_each_other_spread_digests_and_drop_what_does_not_authenticate() {
        let key = key();
        let (a, b) =
            pair_with_b_published(&key, config("a", vec![]), |seed| config("b", vec![seed])).await;

        // Noise, a datagram sealed with another key, one over the size bound,
        // and a sealed one that is not gossip: none reaches foca's state.
        let before = a.table().entries(Instant::now()).len();
        let raw = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        raw.send_to(b"hello", a.local_addr()).await.unwrap();
        raw.send_to(&self::key().seal(b"forged").unwrap(), a.local_addr())
            .await
            .unwrap();
        raw.send_to(&vec![0u8; MAX_DATAGRAM + 1], a.local_addr())
            .await
            .unwrap();
        raw.send_to(&key.seal(&[0xff; 64]).unwrap(), a.local_addr())
            .await
            .unwrap();
        wait_until("refusals counted", || {
            a.counters().refused.load(Ordering::Relaxed) >= 3
                && a.counters().malformed.load(Ordering::Relaxed) >= 1
        })
        .await;
        assert_eq!(a.table().entries(Instant::now()).len(), before);
        assert!(a.table().is_alive("b"));

        // A member that leaves is marked down at once.
        b.leave().await;
        wait_until("a marks b down", || !a.table().is_alive("b")).await;
    }

    /// A member holding the cluster key, even with credentials of its own
    /// site, cannot spread a digest in another site's name.
    #[tokio::test]
    async fn digests_are_signed_by_their_site_and_a_digest_in_another_sites_name_is_dropped() {
        use crate::federation::identity::TrustRoot;
        let key = key();
        let root = TrustRoot::generate().unwrap();
        let (a, _b) = pair_with_b_published(&key, signed(&root, "a", vec![]), |seed| {
            signed(&root, "b", vec![seed])
        })
        .await;
        // Site c publishes unsigned, and through its handle a digest it
        // signs as itself but that names b: both refused before spreading.
        let c = Gossip::start(config("c", vec![a.local_addr()]), key.clone())
            .await
            .unwrap();
        wait_until("c joins", || a.table().is_alive("c")).await;
        c.publish(&digest("b", 99)).unwrap();
        c.publish(&digest("c", 99)).unwrap();
        let c_signed = Gossip::start(signed(&root, "c", vec![]), key.clone())
            .await
            .unwrap();
        assert!(c_signed.publish(&digest("b", 100)).is_err());
        wait_until("the unsigned digests are counted as dropped", || {
            a.counters().digests_dropped.load(Ordering::Relaxed) >= 2
        })
        .await;
        let versions: Vec<(String, u64)> = a
            .table()
            .peers()
            .iter()
            .map(|p| (p.digest.site.to_string(), p.digest.version))
            .collect();
        assert_eq!(versions, vec![("b".to_string(), 7)]);
    }

    /// Whatever the names and addresses, the largest signed digest fits one
    /// datagram beside foca's header: one that did not would never spread.
    #[test]
    fn the_largest_signed_digest_fits_one_datagram_beside_the_largest_header() {
        let member = MemberId {
            site: "s".repeat(starling_proto::limits::NODE_ID_LEN),
            addr: "[ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff]:65535"
                .parse()
                .unwrap(),
            bump: u32::MAX,
        };
        let header = foca::Header {
            src: member.clone(),
            src_incarnation: u16::MAX,
            dst: member,
            message: foca::Message::<MemberId>::Gossip,
        };
        let header = postcard::to_allocvec(&header).unwrap().len();
        // The count of membership updates (none), then the broadcast's length.
        let framing = 2 + 2;
        let room = lan_config(1).max_packet_size.get();
        let needed =
            header + framing + crate::federation::identity::digest::MAX_SIGNED_DIGEST_BYTES;
        assert!(
            needed <= room,
            "{needed} bytes needed, {room} in a datagram"
        );
    }

    #[tokio::test]
    async fn a_recorded_datagram_played_again_or_sealed_outside_the_clock_window_is_refused() {
        let key = key();
        let a = Gossip::start(config("a", vec![]), key.clone())
            .await
            .unwrap();
        let raw = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let nack = postcard::to_allocvec(&wire::Nack {
            relay: raw.local_addr().unwrap(),
            probe_number: 1,
        })
        .unwrap();
        let recorded = key
            .seal(&wire::frame(
                wire::Kind::Nack,
                crate::task::unix_now_ms(),
                &nack,
            ))
            .unwrap();
        raw.send_to(&recorded, a.local_addr()).await.unwrap();
        wait_until("the first copy is read", || {
            a.counters().datagrams_in.load(Ordering::Relaxed) >= 1
        })
        .await;
        assert_eq!(a.counters().replayed.load(Ordering::Relaxed), 0);
        raw.send_to(&recorded, a.local_addr()).await.unwrap();
        let old = crate::task::unix_now_ms() - wire::REPLAY_WINDOW_MS - 1_000;
        let stale = key
            .seal(&wire::frame(wire::Kind::Nack, old, &nack))
            .unwrap();
        raw.send_to(&stale, a.local_addr()).await.unwrap();
        wait_until("the replay and the stale one are refused", || {
            a.counters().replayed.load(Ordering::Relaxed) == 2
        })
        .await;
        assert_eq!(a.counters().malformed.load(Ordering::Relaxed), 0);
    }

    #[tokio::test]
    async fn a_member_that_dies_silently_is_declared_down_by_the_others() {
        let _ = tracing_subscriber::fmt()
            .with_env_filter("starling_coordinator=debug")
            .with_test_writer()
            .try_init();
        let key = key();
        let a = Gossip::start(config("a", vec![]), key.clone())
            .await
            .unwrap();
        let b = Gossip::start(config("b", vec![a.local_addr()]), key.clone())
            .await
            .unwrap();
        let c = Gossip::start(config("c", vec![a.local_addr()]), key.clone())
            .await
            .unwrap();
        wait_until("all see all", || {
            a.table().is_alive("b") && a.table().is_alive("c") && b.table().is_alive("c")
        })
        .await;
        c.cut(true).await;
        let died = Instant::now();
        let start = Instant::now();
        while !(a.table().is_down("c") && b.table().is_down("c")) {
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "c is not down for a or b"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        // foca's timeout at 3 members is 4 s after the first failed probe
        // (Lifeguard waits for no confirmation below 4 members), however
        // often the member is probed and found silent meanwhile.
        assert!(
            died.elapsed() < Duration::from_secs(9),
            "{:?}",
            died.elapsed()
        );
    }

    /// Before state sync, members started together and seeded by one member
    /// never converged: foca hands a joiner the few members one datagram
    /// holds, and the rest depended on updates already spent.
    #[tokio::test]
    async fn members_started_together_all_see_all_and_a_late_joiner_gets_every_digest_at_once() {
        let key = key();
        let seed = Gossip::start(config("m0", vec![]), key.clone())
            .await
            .unwrap();
        let mut members = vec![seed.clone()];
        for i in 1..16 {
            members.push(
                Gossip::start(
                    config(&format!("m{i}"), vec![seed.local_addr()]),
                    key.clone(),
                )
                .await
                .unwrap(),
            );
        }
        let names: Vec<String> = (0..16).map(|i| format!("m{i}")).collect();
        wait_until("all 16 see all", || {
            members.iter().enumerate().all(|(i, member)| {
                let table = member.table();
                names
                    .iter()
                    .enumerate()
                    .all(|(j, name)| i == j || table.is_alive(name))
            })
        })
        .await;
        for (i, member) in members.iter().enumerate() {
            member
                .publish(&digest(&format!("m{i}"), 100 + i as u64))
                .unwrap();
        }
        wait_until("the seed has every digest", || {
            seed.table().peers().len() == 15
        })
        .await;
        // Nobody publishes again: the newcomer's digests come by sync.
        let late = Gossip::start(config("late", vec![seed.local_addr()]), key.clone())
            .await
            .unwrap();
        let joined = Instant::now();
        wait_until("the newcomer has all 16 digests", || {
            late.table().peers().len() == 16
        })
        .await;
        assert!(
            joined.elapsed() < Duration::from_secs(3),
            "took {:?}",
            joined.elapsed()
        );
        assert!(late.counters().syncs.load(Ordering::Relaxed) >= 1);
    }
}
