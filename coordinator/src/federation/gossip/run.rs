//! The gossip loop: the one owner of foca. It opens and checks datagrams,
//! hands foca the fresh ones, carries out what foca asks (send, schedule,
//! notify) with Lifeguard watching and stretching timers, and runs state
//! syncs: at join until one succeeds, on rejoin, and periodically.

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use foca::{AccumulatingRuntime, Foca, Member, OwnedNotification, PostcardCodec, State, Timer};
use rand010::seq::IndexedRandom;
use tokio::net::UdpSocket;
use tokio::sync::{broadcast, mpsc};
use tokio::time::Instant;

use super::digests::{lock, DigestHandler};
use super::lifeguard::{Action, Lifeguard};
use super::sync::{self, Exchange, Received, SyncError};
use super::wire::{self, Kind, ReplayGuard};
use super::{add, lan_config, Command, GossipCounters, GossipEvent, MemberId, MAX_DATAGRAM};
use crate::federation::key::ClusterKey;
use crate::task::unix_now_ms;

type Swim = Foca<MemberId, PostcardCodec, rand010::rngs::StdRng, DigestHandler>;
type Runtime = AccumulatingRuntime<MemberId>;

/// What the loop is built from.
pub(super) struct Parts {
    pub(super) foca: Swim,
    pub(super) socket: Arc<UdpSocket>,
    pub(super) key: Arc<ClusterKey>,
    /// foca's digest handler's twin, for digests that arrive by sync.
    pub(super) digests: DigestHandler,
    pub(super) events: broadcast::Sender<GossipEvent>,
    pub(super) counters: Arc<GossipCounters>,
    pub(super) seeds: Vec<SocketAddr>,
    pub(super) lifeguard: Lifeguard,
}

pub(super) struct Loop {
    parts: Parts,
    replay: ReplayGuard,
    /// Active members last counted, to rescale the configuration.
    members: usize,
    /// foca's probe timeout, unscaled.
    probe_rtt: Duration,
    /// A state sync of ours is under way.
    syncing: bool,
    /// No sync has succeeded since the start or the last rejoin.
    joining: bool,
    /// The seed the next join sync goes to.
    next_seed: usize,
    /// When a join sync may be tried again, and the wait after the next
    /// failure: doubling up to [`MAX_JOIN_BACKOFF`], so joiners whose seed
    /// is busy do not hammer it.
    next_join_try: Instant,
    join_backoff: Duration,
    /// The wait before the next periodic sync while it is shorter than the
    /// interval: 2 s after a join, doubling. Members that joined together
    /// each got their seed's view of that moment; these early syncs with
    /// random peers fill in who joined meanwhile.
    ramp: Duration,
    next_sync: Instant,
    rng: rand010::rngs::StdRng,
    /// Tests cut a member off: every datagram in or out is dropped.
    cut: bool,
}

/// The first periodic sync after a join, doubling until the interval.
const FIRST_RAMP: Duration = Duration::from_secs(2);

/// Longest wait between two join syncs that failed.
const MAX_JOIN_BACKOFF: Duration = Duration::from_secs(16);

impl Loop {
    pub(super) fn new(parts: Parts) -> Self {
        let joining = !parts.seeds.is_empty();
        Self {
            parts,
            replay: ReplayGuard::default(),
            members: 0,
            probe_rtt: lan_config(1).probe_rtt,
            syncing: false,
            joining,
            next_seed: 0,
            next_join_try: Instant::now(),
            join_backoff: super::SEED_RETRY,
            ramp: FIRST_RAMP,
            next_sync: Instant::now() + sync::INTERVAL,
            rng: rand010::make_rng(),
            cut: false,
        }
    }

    pub(super) async fn run(
        mut self,
        mut commands: mpsc::Receiver<Command>,
        mut inbound: mpsc::Receiver<Exchange>,
    ) {
        let mut runtime = Runtime::new();
        let (timers_tx, mut timers) = mpsc::unbounded_channel::<Timer<MemberId>>();
        let (pulled_tx, mut pulled) = mpsc::channel::<Result<Received, SyncError>>(4);
        let mut seed_retry = tokio::time::interval(super::SEED_RETRY);
        seed_retry.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut buffer = vec![0u8; MAX_DATAGRAM + 1];
        let socket = self.parts.socket.clone();
        loop {
            tokio::select! {
                received = socket.recv_from(&mut buffer) => {
                    match received {
                        Ok((len, from)) => self.receive(&mut buffer[..len], from, &mut runtime).await,
                        Err(error) => tracing::debug!(%error, "gossip receive failed"),
                    }
                }
                Some(timer) = timers.recv() => {
                    if let Err(error) = self.parts.foca.handle_timer(timer, &mut runtime) {
                        tracing::debug!(%error, "gossip timer");
                    }
                    self.note_suspects();
                }
                // Woken only when Lifeguard has something due: idle members
                // cost nothing between probes.
                _ = sleep_until_ms(self.parts.lifeguard.next_due_ms()) => {
                    for action in self.parts.lifeguard.poll(unix_now_ms()) {
                        match action {
                            Action::Deliver(timer) => {
                                tracing::debug!(?timer, "suspicion due");
                                if let Err(error) = self.parts.foca.handle_timer(timer, &mut runtime) {
                                    tracing::debug!(%error, "gossip timer");
                                }
                            }
                            Action::SendNack { to, nack } => {
                                if let Ok(body) = postcard::to_allocvec(&nack) {
                                    self.send(to, Kind::Nack, &body).await;
                                }
                            }
                        }
                    }
                    self.note_suspects();
                }
                _ = seed_retry.tick() => {
                    if self.parts.foca.iter_members().next().is_none() {
                        for seed in self.parts.seeds.clone() {
                            let placeholder = MemberId { site: String::new(), addr: seed, bump: 0 };
                            if let Err(error) = self.parts.foca.announce(placeholder, &mut runtime) {
                                tracing::debug!(%error, %seed, "announce to seed");
                            }
                        }
                    }
                    if self.joining && Instant::now() >= self.next_join_try {
                        self.start_sync(None, &pulled_tx);
                    }
                }
                _ = tokio::time::sleep_until(self.next_sync) => {
                    let interval = sync::interval(self.members + 1);
                    self.next_sync = Instant::now() + self.ramp.min(interval);
                    self.ramp = (self.ramp * 2).min(interval);
                    self.start_sync(None, &pulled_tx);
                }
                Some(result) = pulled.recv() => {
                    self.syncing = false;
                    match result {
                        Ok(received) => {
                            let joined = self.joining;
                            if self.apply(received, &mut runtime).is_ok() {
                                self.joining = false;
                                self.join_backoff = super::SEED_RETRY;
                                if joined {
                                    self.ramp = FIRST_RAMP;
                                    self.next_sync = Instant::now() + FIRST_RAMP;
                                }
                            }
                        }
                        Err(error) => {
                            add(&self.parts.counters.syncs_failed, 1);
                            tracing::debug!(%error, "state sync failed");
                            if self.joining {
                                // Jittered, so joiners refused together do
                                // not come back together.
                                let jitter = rand010::RngExt::random_range(&mut self.rng, 0.5..1.5);
                                self.next_join_try =
                                    Instant::now() + self.join_backoff.mul_f64(jitter);
                                self.join_backoff =
                                    (self.join_backoff * 2).min(MAX_JOIN_BACKOFF);
                            }
                        }
                    }
                }
                Some(exchange) = inbound.recv() => {
                    let state = self.state(exchange.received.state.want_digests, false);
                    let answer = self.apply(exchange.received, &mut runtime).map(|()| state);
                    let _ = exchange.reply.send(answer);
                }
                command = commands.recv() => match command {
                    Some(Command::Publish(bytes)) => {
                        if let Err(error) = self.parts.foca.add_broadcast(&bytes) {
                            tracing::warn!(%error, "cannot spread this site's digest");
                        }
                        // Spread it now rather than at the next periodic gossip.
                        let _ = self.parts.foca.gossip(&mut runtime);
                    }
                    Some(Command::Leave(done)) => {
                        if let Err(error) = self.parts.foca.leave_cluster(&mut runtime) {
                            tracing::debug!(%error, "leave");
                        }
                        self.flush(&mut runtime, &timers_tx, &pulled_tx).await;
                        let _ = done.send(());
                        return;
                    }
                    #[cfg(test)]
                    Some(Command::Cut(cut)) => self.cut = cut,
                    None => return,
                },
            }
            self.flush(&mut runtime, &timers_tx, &pulled_tx).await;
        }
    }

    /// Opens, checks and dispatches one datagram.
    async fn receive(&mut self, datagram: &mut [u8], from: SocketAddr, runtime: &mut Runtime) {
        let counters = self.parts.counters.clone();
        if self.cut {
            return;
        }
        add(&counters.datagrams_in, 1);
        add(&counters.bytes_in, datagram.len() as u64);
        if datagram.len() > MAX_DATAGRAM {
            add(&counters.refused, 1);
            tracing::debug!(%from, len = datagram.len(), "gossip datagram over the size bound dropped");
            return;
        }
        let nonce = wire::nonce(datagram);
        let payload = match self.parts.key.open(datagram) {
            Ok(payload) => payload,
            Err(error) => {
                add(&counters.refused, 1);
                tracing::debug!(%from, %error, "gossip datagram refused");
                return;
            }
        };
        let opened = match wire::parse(payload) {
            Ok(opened) => opened,
            Err(error) => {
                add(&counters.malformed, 1);
                tracing::debug!(%from, %error, "gossip datagram not used");
                return;
            }
        };
        // `open` succeeded, so the datagram is longer than a nonce.
        let Some(nonce) = nonce else { return };
        if let Err(error) = self.replay.check(nonce, opened.sent_ms, unix_now_ms()) {
            add(&counters.replayed, 1);
            tracing::debug!(%from, %error, "gossip datagram refused");
            return;
        }
        match opened.kind {
            Kind::Swim => {
                if let Err(error) = self.parts.foca.handle_data(opened.body, &mut *runtime) {
                    if matches!(error, foca::Error::CustomBroadcast(_)) {
                        add(&counters.digests_dropped, 1);
                        tracing::warn!(%from, %error, "site digest dropped");
                    } else {
                        add(&counters.malformed, 1);
                        tracing::debug!(%from, %error, "gossip datagram not used");
                    }
                }
            }
            Kind::Nack => match postcard::from_bytes::<wire::Nack>(opened.body) {
                Ok(nack) => self.parts.lifeguard.nack(&nack),
                Err(_) => add(&counters.malformed, 1),
            },
            Kind::Suspect | Kind::Holding => {
                match postcard::from_bytes::<wire::Suspect>(opened.body) {
                    Ok(suspect) if suspect.member == *self.parts.foca.identity() => {
                        // Someone's probe of us failed: refute now rather
                        // than when the suspicion reaches us by gossip.
                        let update =
                            Member::new(suspect.member, suspect.incarnation, State::Suspect);
                        if let Err(error) =
                            self.parts
                                .foca
                                .apply_many(std::iter::once(update), true, &mut *runtime)
                        {
                            tracing::debug!(%error, "refuting a suspicion");
                        }
                    }
                    Ok(holding) if opened.kind == Kind::Holding => {
                        if self.parts.lifeguard.holding(&holding, from) {
                            // Our probe of it failed before this holder
                            // raised its suspicion: confirm to it now.
                            let own = self.parts.foca.identity().addr;
                            self.send_suspect(
                                own,
                                holding.member,
                                holding.incarnation,
                                &[holding.from],
                            )
                            .await;
                        }
                    }
                    Ok(suspect) => self.parts.lifeguard.confirm(&suspect, from),
                    Err(_) => add(&counters.malformed, 1),
                }
            }
            // State syncs travel over TCP only.
            Kind::Sync => add(&counters.malformed, 1),
        }
    }

    /// Seals and sends one datagram.
    async fn send(&mut self, to: SocketAddr, kind: Kind, body: &[u8]) {
        if self.cut {
            return;
        }
        let sealed = match self.parts.key.seal(&wire::frame(kind, unix_now_ms(), body)) {
            Ok(sealed) => sealed,
            Err(error) => {
                tracing::warn!(%error, "cannot seal a gossip datagram");
                return;
            }
        };
        match self.parts.socket.send_to(&sealed, to).await {
            Ok(sent) => {
                add(&self.parts.counters.datagrams_out, 1);
                add(&self.parts.counters.bytes_out, sent as u64);
            }
            Err(error) => tracing::debug!(%error, %to, "gossip send failed"),
        }
    }

    /// This member's whole state, for a sync: with every digest when
    /// `digests`; asking for the peer's when `want_digests`.
    fn state(&self, digests: bool, want_digests: bool) -> sync::State {
        let mut members: Vec<Member<MemberId>> =
            self.parts.foca.iter_membership_state().cloned().collect();
        members.push(Member::alive(self.parts.foca.identity().clone()));
        sync::State {
            members,
            digests: if digests {
                self.parts.digests.latest()
            } else {
                Vec::new()
            },
            want_digests,
        }
    }

    /// Starts a sync with `peer`, or with the next seed while joining, or a
    /// random live member; one at a time.
    fn start_sync(
        &mut self,
        peer: Option<SocketAddr>,
        results: &mpsc::Sender<Result<Received, SyncError>>,
    ) {
        if self.syncing {
            return;
        }
        let live: Vec<SocketAddr> = self
            .parts
            .foca
            .iter_members()
            .map(|member| member.id().addr)
            .collect();
        // A joiner asks its seeds in turn (they know the most), backing off
        // when they are busy.
        let peer = peer.or_else(|| {
            if self.joining && !self.parts.seeds.is_empty() {
                let seed = self.parts.seeds[self.next_seed % self.parts.seeds.len()];
                self.next_seed += 1;
                Some(seed)
            } else {
                live.choose(&mut self.rng).copied()
            }
        });
        let Some(peer) = peer else { return };
        // A joiner has little to give but wants every digest; a periodic
        // sync mends membership only (digests are republished anyway).
        let state = self.state(self.joining, self.joining);
        let sealed = match sync::seal(&self.parts.key, &state, unix_now_ms()) {
            Ok(sealed) => sealed,
            Err(error) => {
                tracing::warn!(%error, "cannot seal this member's state");
                return;
            }
        };
        self.syncing = true;
        let key = self.parts.key.clone();
        let results = results.clone();
        tokio::spawn(async move {
            let _ = results.send(sync::exchange(&key, peer, sealed).await).await;
        });
    }

    /// Checks a state read off the wire (clock, replay) and merges it.
    fn apply(&mut self, received: Received, runtime: &mut Runtime) -> Result<(), String> {
        let counters = self.parts.counters.clone();
        if let Err(error) = self
            .replay
            .check(received.nonce, received.sent_ms, unix_now_ms())
        {
            add(&counters.replayed, 1);
            add(&counters.syncs_failed, 1);
            tracing::debug!(peer = %received.peer, %error, "state sync refused");
            return Err(error.to_string());
        }
        let updates = received
            .state
            .members
            .into_iter()
            .filter(|member| !member.id().site.is_empty());
        if let Err(error) = self.parts.foca.apply_many(updates, true, &mut *runtime) {
            tracing::debug!(peer = %received.peer, %error, "state sync: membership not applied");
        }
        let sender = MemberId {
            site: String::new(),
            addr: received.peer,
            bump: 0,
        };
        for digest in received.state.digests {
            use foca::BroadcastHandler as _;
            if let Err(error) = self.parts.digests.receive_item(&digest, Some(&sender)) {
                add(&counters.digests_dropped, 1);
                tracing::warn!(peer = %received.peer, %error, "site digest dropped");
            }
        }
        add(&counters.syncs, 1);
        Ok(())
    }

    /// Suspicion is not a foca notification; read it off the member list.
    /// Suspicions Lifeguard holds that foca no longer has are forgotten.
    fn note_suspects(&mut self) {
        let suspected: Vec<&Member<MemberId>> = self
            .parts
            .foca
            .iter_membership_state()
            .filter(|member| member.state() == State::Suspect)
            .collect();
        let names: Vec<String> = suspected.iter().map(|m| m.id().site.clone()).collect();
        let held: Vec<(SocketAddr, u16)> = suspected
            .iter()
            .map(|m| (m.id().addr, m.incarnation()))
            .collect();
        let active: Vec<(SocketAddr, u16)> = self
            .parts
            .foca
            .iter_membership_state()
            .filter(|member| member.state() != State::Down)
            .map(|m| (m.id().addr, m.incarnation()))
            .collect();
        self.parts.lifeguard.retain(&held, &active);
        let newly = lock(&self.parts.digests.table).suspects(&names, std::time::Instant::now());
        for site in newly {
            tracing::info!(%site, "site suspected");
            let _ = self.parts.events.send(GossipEvent::Suspect { site });
        }
    }

    /// Carries out what foca asked for.
    async fn flush(
        &mut self,
        runtime: &mut Runtime,
        timers: &mpsc::UnboundedSender<Timer<MemberId>>,
        pulled: &mpsc::Sender<Result<Received, SyncError>>,
    ) {
        let mut failed = Vec::new();
        while let Some(notification) = runtime.to_notify() {
            match notification {
                OwnedNotification::DataSent(header) => self.parts.lifeguard.sent(&header),
                OwnedNotification::DataReceived(header) => {
                    self.parts
                        .lifeguard
                        .received(&header, unix_now_ms(), self.probe_rtt)
                }
                OwnedNotification::ProbeFailed(probe_number, member) => {
                    self.parts.lifeguard.probe_failed(probe_number);
                    tracing::debug!(site = %member.site, score = self.parts.lifeguard.score(), "probe failed");
                    failed.push(member);
                }
                OwnedNotification::Rejoin(_) | OwnedNotification::Idle => {
                    self.joining = !self.parts.seeds.is_empty();
                    self.join_backoff = super::SEED_RETRY;
                    self.next_join_try = Instant::now();
                    self.notify(notification);
                    self.start_sync(None, pulled);
                }
                other => self.notify(other),
            }
        }
        add_gauge(&self.parts.counters, self.parts.lifeguard.score());
        let now_ms = unix_now_ms();
        let members = self.parts.foca.num_members();
        let mut holding = Vec::new();
        while let Some((after, timer)) = runtime.to_schedule() {
            let new_suspicion = match &timer {
                Timer::ChangeSuspectToDown {
                    member_id,
                    incarnation,
                    ..
                } if !self.parts.lifeguard.holds(member_id.addr, *incarnation) => {
                    Some((member_id.clone(), *incarnation))
                }
                _ => None,
            };
            let Some((timer, after)) = self.parts.lifeguard.schedule(timer, after, now_ms, members)
            else {
                tracing::debug!(?after, "suspicion raised, held by Lifeguard");
                holding.extend(new_suspicion);
                continue;
            };
            let timers = timers.clone();
            tokio::spawn(async move {
                tokio::time::sleep(after).await;
                let _ = timers.send(timer);
            });
        }
        while let Some((to, data)) = runtime.to_send() {
            self.send(to.addr, Kind::Swim, &data).await;
        }
        for (member, incarnation) in holding {
            self.announce_holding(member, incarnation).await;
        }
        for member in failed {
            self.tell_suspicion(member).await;
        }
        if members != self.members {
            self.members = members;
            // Suspicion timeout and retransmissions grow with log(members),
            // as memberlist's do.
            if let Err(error) = self.parts.foca.set_config(lan_config(members + 1)) {
                tracing::debug!(%error, "gossip configuration unchanged");
            }
        }
    }

    /// Lifeguard: tells every live member that this member holds the
    /// suspicion of `member`, so their own failed probes of it come here
    /// (and the suspect, so it refutes at once). Once per suspicion.
    async fn announce_holding(&mut self, member: MemberId, incarnation: foca::Incarnation) {
        let holding = wire::Suspect {
            from: self.parts.foca.identity().addr,
            member,
            incarnation,
        };
        let Ok(body) = postcard::to_allocvec(&holding) else {
            return;
        };
        let targets: Vec<SocketAddr> = self
            .parts
            .foca
            .iter_members()
            .map(|known| known.id().addr)
            .collect();
        for to in targets {
            self.send(to, Kind::Holding, &body).await;
        }
    }

    /// Lifeguard: tells the members holding the suspicion of `member` (and
    /// the suspect, so it can refute) that our own probe of it failed.
    async fn tell_suspicion(&mut self, member: MemberId) {
        if !self.parts.lifeguard.enabled() || member.site.is_empty() {
            return;
        }
        let Some(incarnation) = self
            .parts
            .foca
            .iter_membership_state()
            .find(|known| known.id() == &member)
            .map(Member::incarnation)
        else {
            return;
        };
        let own = self.parts.foca.identity().addr;
        let mut targets = vec![member.addr];
        targets.extend(
            self.parts
                .lifeguard
                .own_probe_failed_of(member.addr, incarnation),
        );
        self.send_suspect(own, member, incarnation, &targets).await;
    }

    /// Sends our independent suspicion of `member` to `targets`.
    async fn send_suspect(
        &mut self,
        own: SocketAddr,
        member: MemberId,
        incarnation: foca::Incarnation,
        targets: &[SocketAddr],
    ) {
        let suspect = wire::Suspect {
            from: own,
            member,
            incarnation,
        };
        let Ok(body) = postcard::to_allocvec(&suspect) else {
            return;
        };
        for to in targets {
            self.send(*to, Kind::Suspect, &body).await;
        }
    }

    fn notify(&mut self, notification: OwnedNotification<MemberId>) {
        let now = std::time::Instant::now();
        let table = &self.parts.digests.table;
        let event = match notification {
            OwnedNotification::MemberUp(id) | OwnedNotification::Rename(_, id) => {
                if id.site.is_empty() {
                    return;
                }
                if !lock(table).up(&id.site, id.addr, now) {
                    return;
                }
                tracing::info!(site = %id.site, addr = %id.addr, "site joined the federation");
                GossipEvent::Up { site: id.site }
            }
            OwnedNotification::MemberDown(id) => {
                if id.site.is_empty() || !lock(table).down(&id.site, now) {
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
        let _ = self.parts.events.send(event);
    }
}

/// Sleeps until the Unix instant `due_ms`; for ever when there is none.
async fn sleep_until_ms(due_ms: Option<u64>) {
    match due_ms {
        Some(due_ms) => {
            let wait = due_ms.saturating_sub(unix_now_ms());
            tokio::time::sleep(Duration::from_millis(wait)).await;
        }
        None => std::future::pending().await,
    }
}

fn add_gauge(counters: &GossipCounters, score: u32) {
    counters
        .health_score
        .store(u64::from(score), Ordering::Relaxed);
}
