//! Membership, failure detection and digest dissemination: foca's SWIM over
//! UDP. foca does no I/O; this loop feeds it datagrams and timers and carries
//! out what it asks for (send, schedule, notify). Every datagram is sealed
//! with the cluster key ([`super::key`]) on the way out and must open on the
//! way in, so foca only ever parses authenticated bytes. Site digests ride on
//! foca's custom broadcasts: versioned, newest wins, stale copies in flight
//! are dropped ([`DigestKey`]).

use std::net::SocketAddr;
use std::num::{NonZeroU32, NonZeroUsize};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use foca::{
    AccumulatingRuntime, BroadcastHandler, Config, Foca, Identity, Invalidates, OwnedNotification,
    PostcardCodec, State, Timer,
};
use serde::{Deserialize, Serialize};
use starling_proto::site::MAX_DIGEST_BYTES;
use starling_proto::{DecodeError, SiteDigest, SiteId};
use tokio::net::UdpSocket;
use tokio::sync::{broadcast, mpsc};

use super::key::{ClusterKey, SEAL_OVERHEAD};
use super::sites::SiteTable;

/// Largest datagram sent or accepted, sealed: under a 1500-byte MTU.
pub const MAX_DATAGRAM: usize = 1400;
/// How often a coordinator with no live peer announces itself to its seeds.
const SEED_RETRY: Duration = Duration::from_secs(1);
/// How often a site's digest is published even when nothing changed, so a
/// digest lost on the way, or a member that joined late, is caught up.
pub const DIGEST_REFRESH: Duration = Duration::from_secs(10);

/// A gossip member: the site, where it listens, and a generation that
/// grows with every start and every rejoin, so a restarted or cut-off
/// coordinator wins over the memory of its former self.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemberId {
    /// The site's name; empty for a seed not yet heard from.
    pub site: String,
    /// Where it gossips.
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
    /// Authenticated datagrams foca could not use.
    pub malformed: AtomicU64,
    /// Site digests that did not decode (oversize, malformed, foreign version).
    pub digests_dropped: AtomicU64,
}

fn add(counter: &AtomicU64, n: u64) {
    counter.fetch_add(n, Ordering::Relaxed);
}

/// How to run the gossip layer.
#[derive(Debug, Clone)]
pub struct GossipConfig {
    /// This coordinator's site.
    pub site: SiteId,
    /// The UDP address to bind.
    pub bind: SocketAddr,
    /// The address peers reach this one at, when not the bound one (bound to
    /// 0.0.0.0, or behind NAT).
    pub advertise: Option<SocketAddr>,
    /// Members to announce to at start and whenever no peer is alive.
    pub seeds: Vec<SocketAddr>,
}

/// Why the gossip layer could not start.
#[derive(Debug, thiserror::Error)]
pub enum GossipError {
    /// The UDP address could not be bound.
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

/// Why a received digest was dropped.
#[derive(Debug, thiserror::Error)]
pub enum DigestError {
    /// Longer than a digest may be.
    #[error("site digest of {0} bytes exceeds {MAX_DIGEST_BYTES}")]
    Oversize(usize),
    /// Not a digest.
    #[error(transparent)]
    Decode(#[from] DecodeError),
}

/// Identifies a digest in foca's dissemination backlog: a newer version of
/// the same site replaces an older one still being spread.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DigestKey {
    site: String,
    version: u64,
}

impl Invalidates for DigestKey {
    fn invalidates(&self, other: &Self) -> bool {
        self.site == other.site && self.version >= other.version
    }
}

/// Decodes digests off the wire into the site table.
struct DigestHandler {
    table: Arc<Mutex<SiteTable>>,
    events: broadcast::Sender<GossipEvent>,
}

impl BroadcastHandler<MemberId> for DigestHandler {
    type Key = DigestKey;
    type Error = DigestError;

    fn receive_item(
        &mut self,
        data: &[u8],
        sender: Option<&MemberId>,
    ) -> Result<Option<DigestKey>, DigestError> {
        if data.len() > MAX_DIGEST_BYTES {
            return Err(DigestError::Oversize(data.len()));
        }
        let digest: SiteDigest = starling_proto::decode(data)?;
        let key = DigestKey {
            site: digest.site.to_string(),
            version: digest.version,
        };
        let mut table = lock(&self.table);
        let own = digest.site.as_str() == table.own();
        let site = key.site.clone();
        let version = key.version;
        if !table.offer(digest, Instant::now()) {
            return Ok(None);
        }
        drop(table);
        // Our own publication (no sender) is spread; an echo of an older one
        // of ours is not news to anyone.
        if sender.is_some() && !own {
            let _ = self.events.send(GossipEvent::Digest { site, version });
        }
        Ok((sender.is_none() || !own).then_some(key))
    }
}

fn lock(table: &Mutex<SiteTable>) -> MutexGuard<'_, SiteTable> {
    // Every write is a single field update or insert: a panic mid-way leaves
    // the table consistent.
    table.lock().unwrap_or_else(PoisonError::into_inner)
}

/// memberlist's LAN profile (what Serf's `-profile=lan` runs), with the
/// suspicion timeout and retransmissions scaled to the cluster's size, and
/// down members re-announced to every 2 s so a site cut off and reconnected
/// rejoins in seconds.
fn lan_config(members: usize) -> Config {
    let size = NonZeroU32::new(u32::try_from(members.max(1)).unwrap_or(u32::MAX))
        .unwrap_or(NonZeroU32::MIN);
    let mut config = Config::new_lan(size);
    config.max_packet_size =
        NonZeroUsize::new(MAX_DATAGRAM - SEAL_OVERHEAD).unwrap_or(NonZeroUsize::MIN);
    config.periodic_announce_to_down_members = Some(foca::PeriodicParams {
        frequency: Duration::from_secs(2),
        num_members: NonZeroUsize::MIN.saturating_add(1),
    });
    config
}

enum Command {
    Publish(Vec<u8>),
    Leave(tokio::sync::oneshot::Sender<()>),
}

/// The running gossip layer.
#[derive(Debug, Clone)]
pub struct Gossip {
    commands: mpsc::Sender<Command>,
    table: Arc<Mutex<SiteTable>>,
    events: broadcast::Sender<GossipEvent>,
    counters: Arc<GossipCounters>,
    local_addr: SocketAddr,
}

impl Gossip {
    /// Binds the socket and starts the loop on the current runtime; every
    /// datagram is sealed and opened with `key`.
    pub async fn start(config: GossipConfig, key: Arc<ClusterKey>) -> Result<Self, GossipError> {
        let socket = UdpSocket::bind(config.bind)
            .await
            .map_err(|error| GossipError::Bind {
                addr: config.bind,
                reason: crate::describe_bind_error(&error),
            })?;
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
            Instant::now(),
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
        };
        let rng: rand010::rngs::StdRng = rand010::make_rng();
        let foca =
            Foca::with_custom_broadcast(identity, lan_config(1), rng, PostcardCodec, handler);
        let seeds = config
            .seeds
            .iter()
            .copied()
            .filter(|seed| *seed != local_addr && *seed != bound)
            .collect();
        let state = Loop {
            foca,
            socket: Arc::new(socket),
            key,
            table: table.clone(),
            events: events.clone(),
            counters: counters.clone(),
            seeds,
            members: 0,
        };
        tokio::spawn(state.run(commands_rx));
        Ok(Self {
            commands,
            table,
            events,
            counters,
            local_addr,
        })
    }

    /// Where peers reach this member.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Spreads this site's digest (encoded and checked here).
    pub fn publish(&self, digest: &SiteDigest) -> Result<(), String> {
        let bytes = starling_proto::encode(digest).map_err(|error| error.to_string())?;
        if bytes.len() > MAX_DIGEST_BYTES {
            return Err(format!(
                "digest of {} bytes exceeds {MAX_DIGEST_BYTES}",
                bytes.len()
            ));
        }
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

    /// Tells the others this site leaves, then stops the loop.
    pub async fn leave(&self) {
        let (done, wait) = tokio::sync::oneshot::channel();
        if self.commands.send(Command::Leave(done)).await.is_ok() {
            let _ = tokio::time::timeout(Duration::from_secs(2), wait).await;
        }
    }
}

type Swim = Foca<MemberId, PostcardCodec, rand010::rngs::StdRng, DigestHandler>;

struct Loop {
    foca: Swim,
    socket: Arc<UdpSocket>,
    key: Arc<ClusterKey>,
    table: Arc<Mutex<SiteTable>>,
    events: broadcast::Sender<GossipEvent>,
    counters: Arc<GossipCounters>,
    seeds: Vec<SocketAddr>,
    /// Active members last counted, to rescale the configuration.
    members: usize,
}

impl Loop {
    async fn run(mut self, mut commands: mpsc::Receiver<Command>) {
        let mut runtime = AccumulatingRuntime::new();
        let (timers_tx, mut timers) = mpsc::unbounded_channel::<Timer<MemberId>>();
        let mut seed_retry = tokio::time::interval(SEED_RETRY);
        seed_retry.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut buffer = vec![0u8; MAX_DATAGRAM + 1];
        loop {
            tokio::select! {
                received = self.socket.recv_from(&mut buffer) => {
                    match received {
                        Ok((len, from)) => self.receive(&mut buffer[..len], from, &mut runtime),
                        Err(error) => tracing::debug!(%error, "gossip receive failed"),
                    }
                }
                Some(timer) = timers.recv() => {
                    if let Err(error) = self.foca.handle_timer(timer, &mut runtime) {
                        tracing::debug!(%error, "gossip timer");
                    }
                    self.note_suspects();
                }
                _ = seed_retry.tick() => {
                    if self.foca.iter_members().next().is_none() {
                        for seed in self.seeds.clone() {
                            let placeholder = MemberId { site: String::new(), addr: seed, bump: 0 };
                            if let Err(error) = self.foca.announce(placeholder, &mut runtime) {
                                tracing::debug!(%error, %seed, "announce to seed");
                            }
                        }
                    }
                }
                command = commands.recv() => match command {
                    Some(Command::Publish(bytes)) => {
                        if let Err(error) = self.foca.add_broadcast(&bytes) {
                            tracing::warn!(%error, "cannot spread this site's digest");
                        }
                        // Spread it now rather than at the next periodic gossip.
                        let _ = self.foca.gossip(&mut runtime);
                    }
                    Some(Command::Leave(done)) => {
                        if let Err(error) = self.foca.leave_cluster(&mut runtime) {
                            tracing::debug!(%error, "leave");
                        }
                        self.flush(&mut runtime, &timers_tx).await;
                        let _ = done.send(());
                        return;
                    }
                    None => return,
                },
            }
            self.flush(&mut runtime, &timers_tx).await;
        }
    }

    fn receive(
        &mut self,
        datagram: &mut [u8],
        from: SocketAddr,
        runtime: &mut AccumulatingRuntime<MemberId>,
    ) {
        add(&self.counters.datagrams_in, 1);
        add(&self.counters.bytes_in, datagram.len() as u64);
        if datagram.len() > MAX_DATAGRAM {
            add(&self.counters.refused, 1);
            tracing::debug!(%from, len = datagram.len(), "gossip datagram over the size bound dropped");
            return;
        }
        let payload = match self.key.open(datagram) {
            Ok(payload) => payload,
            Err(error) => {
                add(&self.counters.refused, 1);
                tracing::debug!(%from, %error, "gossip datagram refused");
                return;
            }
        };
        if let Err(error) = self.foca.handle_data(payload, runtime) {
            if matches!(error, foca::Error::CustomBroadcast(_)) {
                add(&self.counters.digests_dropped, 1);
                tracing::warn!(%from, %error, "site digest dropped");
            } else {
                add(&self.counters.malformed, 1);
                tracing::debug!(%from, %error, "gossip datagram not used");
            }
        }
    }

    /// Suspicion is not a foca notification; read it off the member list.
    fn note_suspects(&mut self) {
        let suspected: Vec<String> = self
            .foca
            .iter_membership_state()
            .filter(|member| member.state() == State::Suspect)
            .map(|member| member.id().site.clone())
            .collect();
        lock(&self.table).suspects(&suspected, Instant::now());
    }

    /// Carries out what foca asked for.
    async fn flush(
        &mut self,
        runtime: &mut AccumulatingRuntime<MemberId>,
        timers: &mpsc::UnboundedSender<Timer<MemberId>>,
    ) {
        while let Some(notification) = runtime.to_notify() {
            self.notify(notification);
        }
        while let Some((after, timer)) = runtime.to_schedule() {
            let timers = timers.clone();
            tokio::spawn(async move {
                tokio::time::sleep(after).await;
                let _ = timers.send(timer);
            });
        }
        while let Some((to, data)) = runtime.to_send() {
            let sealed = match self.key.seal(&data) {
                Ok(sealed) => sealed,
                Err(error) => {
                    tracing::warn!(%error, "cannot seal a gossip datagram");
                    continue;
                }
            };
            match self.socket.send_to(&sealed, to.addr).await {
                Ok(sent) => {
                    add(&self.counters.datagrams_out, 1);
                    add(&self.counters.bytes_out, sent as u64);
                }
                Err(error) => tracing::debug!(%error, to = %to.addr, "gossip send failed"),
            }
        }
        let members = self.foca.iter_members().count();
        if members != self.members {
            self.members = members;
            // Suspicion timeout and retransmissions grow with log(members),
            // as memberlist's do.
            if let Err(error) = self.foca.set_config(lan_config(members + 1)) {
                tracing::debug!(%error, "gossip configuration unchanged");
            }
        }
    }

    fn notify(&mut self, notification: OwnedNotification<MemberId>) {
        let now = Instant::now();
        let event = match notification {
            OwnedNotification::MemberUp(id) | OwnedNotification::Rename(_, id) => {
                if id.site.is_empty() {
                    return;
                }
                let news = lock(&self.table).up(&id.site, id.addr, now);
                if !news {
                    return;
                }
                tracing::info!(site = %id.site, addr = %id.addr, "site joined the federation");
                GossipEvent::Up { site: id.site }
            }
            OwnedNotification::MemberDown(id) => {
                if id.site.is_empty() || !lock(&self.table).down(&id.site, now) {
                    return;
                }
                tracing::warn!(site = %id.site, addr = %id.addr, "site declared down");
                GossipEvent::Down { site: id.site }
            }
            OwnedNotification::Rejoin(id) => {
                tracing::info!(
                    bump = id.bump,
                    "declared down by the others; rejoined under a new generation"
                );
                return;
            }
            OwnedNotification::Idle => {
                tracing::info!("no other site is reachable; announcing to the seeds");
                return;
            }
            _ => return,
        };
        let _ = self.events.send(event);
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn key() -> Arc<ClusterKey> {
        Arc::new(ClusterKey::parse(&ClusterKey::generate().unwrap()).unwrap())
    }

    fn config(site: &str, seeds: Vec<SocketAddr>) -> GossipConfig {
        GossipConfig {
            site: SiteId::new(site).unwrap(),
            bind: "127.0.0.1:0".parse().unwrap(),
            advertise: None,
            seeds,
        }
    }

    fn digest(site: &str, version: u64) -> SiteDigest {
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
        let a = Gossip::start(config("a", vec![]), key.clone())
            .await
            .unwrap();
        let b = Gossip::start(config("b", vec![a.local_addr()]), key.clone())
            .await
            .unwrap();
        wait_until("a and b see each other", || {
            a.table().is_alive("b") && b.table().is_alive("a")
        })
        .await;
        b.publish(&digest("b", 7)).unwrap();
        wait_until("a has b's digest", || {
            a.table().peers().iter().any(|p| p.digest.version == 7)
        })
        .await;

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

    #[test]
    fn digests_that_do_not_decode_are_refused_and_stale_ones_not_spread() {
        let table = Arc::new(Mutex::new(SiteTable::new(
            "a",
            "127.0.0.1:1".parse().unwrap(),
            Instant::now(),
        )));
        let (events, _) = broadcast::channel(8);
        let mut handler = DigestHandler {
            table: table.clone(),
            events,
        };
        let sender = MemberId {
            site: "b".into(),
            addr: "127.0.0.1:2".parse().unwrap(),
            bump: 1,
        };
        assert!(matches!(
            handler.receive_item(&[0u8; MAX_DIGEST_BYTES + 1], Some(&sender)),
            Err(DigestError::Oversize(_))
        ));
        assert!(matches!(
            handler.receive_item(b"\xa1\x61v\x01", Some(&sender)),
            Err(DigestError::Decode(_))
        ));
        let fresh = starling_proto::encode(&digest("b", 5)).unwrap();
        assert!(handler
            .receive_item(&fresh, Some(&sender))
            .unwrap()
            .is_some());
        // The same again, or older: not news, not spread further.
        assert!(handler
            .receive_item(&fresh, Some(&sender))
            .unwrap()
            .is_none());
        let stale = starling_proto::encode(&digest("b", 4)).unwrap();
        assert!(handler
            .receive_item(&stale, Some(&sender))
            .unwrap()
            .is_none());
        assert_eq!(lock(&table).entries(Instant::now()).len(), 2);
        let newer = DigestKey {
            site: "b".into(),
            version: 6,
        };
        let older = DigestKey {
            site: "b".into(),
            version: 5,
        };
        assert!(newer.invalidates(&older) && !older.invalidates(&newer));
    }
}
