//! Lifeguard (Dadgar, Phillips and Currey, 2017; what memberlist and Serf
//! run) around foca's SWIM, which has none of it. foca does no I/O, so every
//! message it sends or reads, every failed probe and every timer passes
//! through the gossip loop; this state machine watches them and decides:
//!
//! - **Local health awareness.** A score from 0 to [`MAX_SCORE`] rises when
//!   this member's own probes fail without the relays' nacks that would show
//!   the network is fine, and when it has to refute a suspicion of itself; it
//!   falls with each probe answered. Probe intervals and timeouts are scaled
//!   by `score + 1`: a member starved of CPU probes more slowly instead of
//!   accusing healthy peers it was too slow to hear.
//! - **Nacks.** A relay asked to probe a member on another's behalf answers
//!   the requester with a nack when the member stays silent, so the
//!   requester can tell a dead member from its own deafness.
//! - **Suspicion timeouts that shrink with confirmations.** A suspicion this
//!   member raised starts at [`MAX_TIMEOUT_FACTOR`] × foca's timeout and
//!   falls towards it, logarithmically, as other members report their own
//!   failed probes of the suspect ([`wire::Suspect`]), each counted once.
//!   In foca only the member that raised a suspicion declares the suspect
//!   down; it announces that it holds it (`wire::Kind::Holding`, once per
//!   suspicion) so that confirmations go to it and to the suspect alone.
//!   Members raise suspicions of one member at nearly the same moment, so
//!   no confirmation is lost to that race: a holder's announcement counts
//!   as its confirmation (its own probe failed), and a member whose probe
//!   failed before a holder announced itself confirms to it on hearing it.
//!   Together this does what memberlist's gossiped suspicions do, where
//!   every member hears every other's failed probe.
//!
//! No I/O and no clock: instants are handed in, and what to do comes back.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::time::Duration;

use foca::{Header, Incarnation, Message, ProbeNumber, Timer};

use super::wire::{Nack, Suspect};
use super::MemberId;

/// Highest local health score (memberlist's `AwarenessMaxMultiplier`).
pub const MAX_SCORE: u32 = 8;
/// A suspicion lasts at most this many times foca's timeout (memberlist's
/// `SuspicionMaxTimeoutMult`).
pub const MAX_TIMEOUT_FACTOR: u32 = 6;
/// Independent confirmations that bring a suspicion to its shortest
/// timeout (memberlist's `SuspicionMult - 2`).
const CONFIRMATIONS: u32 = 2;
/// A relay nacks once the probed member has been silent this long, a share
/// of the probe timeout, so the nack reaches the requester well inside its
/// round (which ends a probe timeout after the relay was asked).
const NACK_SHARE: f64 = 0.5;
/// Most holders remembered for one suspicion: enough to confirm to, and a
/// bound on what a flood of announcements can make a member keep.
const MAX_HOLDERS: usize = 8;

/// What the loop must do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Hand this timer to foca now.
    Deliver(Timer<MemberId>),
    /// Send `nack` to `to`.
    SendNack {
        /// The requester.
        to: SocketAddr,
        /// What to tell it.
        nack: Nack,
    },
}

/// A probe of ours under way.
#[derive(Debug)]
struct Probe {
    /// Relays asked to probe indirectly.
    relays: HashSet<SocketAddr>,
    /// Relays that nacked.
    nacks: HashSet<SocketAddr>,
}

/// An indirect probe we relay for another member.
#[derive(Debug)]
struct Relay {
    requester: SocketAddr,
    target: SocketAddr,
    probe_number: ProbeNumber,
    nack_at_ms: u64,
}

/// A suspicion of ours, with foca's timer held back until it is due.
#[derive(Debug)]
struct Suspicion {
    started_ms: u64,
    min: Duration,
    max: Duration,
    /// Confirmations wanted to reach `min` (fewer in a small cluster).
    wanted: u32,
    confirmed_by: HashSet<SocketAddr>,
    timer: Timer<MemberId>,
}

impl Suspicion {
    /// memberlist's `remainingSuspicionTime`: from `max` down to `min` as
    /// `log(confirmations + 1) / log(wanted + 1)`.
    fn timeout(&self) -> Duration {
        if self.wanted == 0 {
            return self.min;
        }
        let confirmations = self.confirmed_by.len().min(self.wanted as usize) as f64;
        let fraction = (confirmations + 1.0).ln() / (f64::from(self.wanted) + 1.0).ln();
        let span = self.max.saturating_sub(self.min).as_secs_f64();
        let timeout = self.max.as_secs_f64() - fraction * span;
        Duration::from_secs_f64(timeout.max(self.min.as_secs_f64()))
    }

    fn due_ms(&self) -> u64 {
        self.started_ms
            .saturating_add(u64::try_from(self.timeout().as_millis()).unwrap_or(u64::MAX))
    }
}

/// Lifeguard's state for one member.
#[derive(Debug)]
pub struct Lifeguard {
    enabled: bool,
    own: SocketAddr,
    score: u32,
    probes: HashMap<ProbeNumber, Probe>,
    relays: Vec<Relay>,
    suspicions: HashMap<(SocketAddr, Incarnation), Suspicion>,
    /// Who announced holding each suspicion (their own probes failed).
    holders: HashMap<(SocketAddr, Incarnation), Vec<SocketAddr>>,
    /// Suspects whose probe of ours failed, so a holder announced later
    /// still gets our confirmation.
    failed: HashSet<(SocketAddr, Incarnation)>,
    incarnation: Option<Incarnation>,
    /// Suspicions that ran to their end (the member declared down).
    pub expired: u64,
}

impl Lifeguard {
    /// For the member gossiping at `own`; `enabled: false` passes every timer
    /// through unchanged and sends nothing (SWIM as foca runs it).
    pub fn new(own: SocketAddr, enabled: bool) -> Self {
        Self {
            enabled,
            own,
            score: 0,
            probes: HashMap::new(),
            relays: Vec::new(),
            suspicions: HashMap::new(),
            holders: HashMap::new(),
            failed: HashSet::new(),
            incarnation: None,
            expired: 0,
        }
    }

    /// Whether it is on.
    pub fn enabled(&self) -> bool {
        self.enabled
    }

    /// The local health score (0 is healthy).
    pub fn score(&self) -> u32 {
        self.score
    }

    fn change_score(&mut self, delta: i64) {
        let score = (i64::from(self.score) + delta).clamp(0, i64::from(MAX_SCORE));
        self.score = u32::try_from(score).unwrap_or(MAX_SCORE);
    }

    /// foca sent `header`.
    pub fn sent(&mut self, header: &Header<MemberId>) {
        if !self.enabled {
            return;
        }
        // Our incarnation only grows to refute a suspicion of ourselves:
        // the others found us slow, which is a sign of our own ill health.
        if let Some(previous) = self.incarnation {
            if header.src_incarnation > previous {
                self.change_score(1);
            }
        }
        self.incarnation = Some(header.src_incarnation);
        match &header.message {
            Message::Ping(probe_number) => {
                self.probes.insert(
                    *probe_number,
                    Probe {
                        relays: HashSet::new(),
                        nacks: HashSet::new(),
                    },
                );
            }
            Message::PingReq { probe_number, .. } => {
                if let Some(probe) = self.probes.get_mut(probe_number) {
                    probe.relays.insert(header.dst.addr);
                }
            }
            _ => {}
        }
    }

    /// foca read `header`, at `now_ms`; `probe_timeout` is foca's, unscaled.
    pub fn received(&mut self, header: &Header<MemberId>, now_ms: u64, probe_timeout: Duration) {
        if !self.enabled {
            return;
        }
        match &header.message {
            Message::Ack(probe_number) | Message::ForwardedAck { probe_number, .. }
                if self.probes.remove(probe_number).is_some() =>
            {
                self.change_score(-1);
            }
            Message::PingReq {
                target,
                probe_number,
            } => {
                let after = probe_timeout.mul_f64(NACK_SHARE);
                self.relays.push(Relay {
                    requester: header.src.addr,
                    target: target.addr,
                    probe_number: *probe_number,
                    nack_at_ms: now_ms
                        .saturating_add(u64::try_from(after.as_millis()).unwrap_or(u64::MAX)),
                });
            }
            // The member we probe for `target` answered: no nack owed.
            Message::IndirectAck {
                target,
                probe_number,
            } => self.relays.retain(|relay| {
                !(relay.requester == target.addr
                    && relay.target == header.src.addr
                    && relay.probe_number == *probe_number)
            }),
            _ => {}
        }
    }

    /// A relay's nack arrived.
    pub fn nack(&mut self, nack: &Nack) {
        if let Some(probe) = self.probes.get_mut(&nack.probe_number) {
            if probe.relays.contains(&nack.relay) {
                probe.nacks.insert(nack.relay);
            }
        }
    }

    /// foca gave up on our probe `probe_number`. Every relay that failed to
    /// nack counts against our own health (we may be the deaf one); with no
    /// relay to ask, the failure itself does.
    pub fn probe_failed(&mut self, probe_number: ProbeNumber) {
        if !self.enabled {
            return;
        }
        let probe = self.probes.remove(&probe_number);
        let missed = match probe {
            Some(probe) if !probe.relays.is_empty() => {
                probe.relays.len().saturating_sub(probe.nacks.len())
            }
            _ => 1,
        };
        self.change_score(i64::try_from(missed).unwrap_or(i64::MAX));
    }

    /// Another member's independent suspicion of a member, from the
    /// datagram's source `by` (counted once per source, whatever the message
    /// names as its sender).
    pub fn confirm(&mut self, suspect: &Suspect, by: SocketAddr) {
        let key = (suspect.member.addr, suspect.incarnation);
        if let Some(suspicion) = self.suspicions.get_mut(&key) {
            if by != suspect.member.addr && by != self.own {
                suspicion.confirmed_by.insert(by);
            }
        }
    }

    /// `holding` says its sender (at `by`) holds a suspicion: its own probe
    /// failed, which confirms ours if we hold one too. Whether our own probe
    /// of that member failed already, so the loop tells this new holder.
    pub fn holding(&mut self, holding: &Suspect, by: SocketAddr) -> bool {
        if !self.enabled || by == self.own {
            return false;
        }
        self.confirm(holding, by);
        let key = (holding.member.addr, holding.incarnation);
        let holders = self.holders.entry(key).or_default();
        if holders.len() >= MAX_HOLDERS || holders.contains(&holding.from) {
            return false;
        }
        holders.push(holding.from);
        self.failed.contains(&key)
    }

    /// Our own probe of `member` at `incarnation` failed: where to say so
    /// (the holders known now; later ones are told by [`Lifeguard::holding`]).
    pub fn own_probe_failed_of(
        &mut self,
        member: SocketAddr,
        incarnation: Incarnation,
    ) -> Vec<SocketAddr> {
        if !self.enabled {
            return Vec::new();
        }
        let key = (member, incarnation);
        self.failed.insert(key);
        let own = self.own;
        self.holders
            .get(&key)
            .map(|holders| holders.iter().copied().filter(|h| *h != own).collect())
            .unwrap_or_default()
    }

    /// foca asks for `timer` after `after`, at `now_ms`, in a cluster of
    /// `members` others: the delay to wait, or `None` when Lifeguard holds
    /// the timer (a suspicion; [`Lifeguard::poll`] hands it back when due).
    pub fn schedule(
        &mut self,
        timer: Timer<MemberId>,
        after: Duration,
        now_ms: u64,
        members: usize,
    ) -> Option<(Timer<MemberId>, Duration)> {
        if !self.enabled {
            return Some((timer, after));
        }
        match &timer {
            Timer::ProbeRandomMember(_) | Timer::SendIndirectProbe { .. } => {
                Some((timer, after.saturating_mul(self.score + 1)))
            }
            Timer::ChangeSuspectToDown {
                member_id,
                incarnation,
                ..
            } => {
                // With too few others to confirm, waiting for them only
                // delays detection (memberlist does the same).
                let wanted = if members.saturating_sub(1) < CONFIRMATIONS as usize {
                    0
                } else {
                    CONFIRMATIONS
                };
                // foca asks again at each failed probe of a member it
                // already suspects: the suspicion's clock runs from the first.
                let key = (member_id.addr, *incarnation);
                // Holders announced before we raised ours each probed and
                // failed on their own.
                let own = self.own;
                let confirmed_by = self
                    .holders
                    .get(&key)
                    .map(|holders| {
                        holders
                            .iter()
                            .copied()
                            .filter(|h| *h != own && *h != key.0)
                            .collect()
                    })
                    .unwrap_or_default();
                self.suspicions.entry(key).or_insert(Suspicion {
                    started_ms: now_ms,
                    min: after,
                    max: after.saturating_mul(MAX_TIMEOUT_FACTOR),
                    wanted,
                    confirmed_by,
                    timer,
                });
                None
            }
            _ => Some((timer, after)),
        }
    }

    /// The earliest instant something is due (a held suspicion, an owed
    /// nack), if anything is pending.
    pub fn next_due_ms(&self) -> Option<u64> {
        let suspicions = self.suspicions.values().map(Suspicion::due_ms);
        let nacks = self.relays.iter().map(|relay| relay.nack_at_ms);
        suspicions.chain(nacks).min()
    }

    /// What is due at `now_ms`.
    pub fn poll(&mut self, now_ms: u64) -> Vec<Action> {
        let mut actions = Vec::new();
        let due: Vec<(SocketAddr, Incarnation)> = self
            .suspicions
            .iter()
            .filter(|(_, suspicion)| suspicion.due_ms() <= now_ms)
            .map(|(key, _)| *key)
            .collect();
        for key in due {
            if let Some(suspicion) = self.suspicions.remove(&key) {
                self.expired += 1;
                actions.push(Action::Deliver(suspicion.timer));
            }
        }
        let own = self.own;
        self.relays.retain(|relay| {
            if relay.nack_at_ms > now_ms {
                return true;
            }
            actions.push(Action::SendNack {
                to: relay.requester,
                nack: Nack {
                    relay: own,
                    probe_number: relay.probe_number,
                },
            });
            false
        });
        actions
    }

    /// Keeps only suspicions foca still has (`suspected`), and the holders
    /// and failed probes of members still active at that incarnation
    /// (`active`): a holder's announcement often arrives before the
    /// suspicion itself reaches this member by gossip, and must outlive that
    /// wait; a refutation (a newer incarnation) or a death ends it.
    pub fn retain(
        &mut self,
        suspected: &[(SocketAddr, Incarnation)],
        active: &[(SocketAddr, Incarnation)],
    ) {
        self.suspicions.retain(|key, _| suspected.contains(key));
        self.holders.retain(|key, _| active.contains(key));
        self.failed.retain(|key| active.contains(key));
    }

    /// Whether a suspicion of `member` at `incarnation` is held here.
    pub fn holds(&self, member: SocketAddr, incarnation: Incarnation) -> bool {
        self.suspicions.contains_key(&(member, incarnation))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn id(port: u16) -> MemberId {
        MemberId {
            site: format!("m{port}"),
            addr: SocketAddr::from(([127, 0, 0, 1], port)),
            bump: 1,
        }
    }

    fn header(
        src: u16,
        dst: u16,
        incarnation: Incarnation,
        message: Message<MemberId>,
    ) -> Header<MemberId> {
        Header {
            src: id(src),
            src_incarnation: incarnation,
            dst: id(dst),
            message,
        }
    }

    const RTT: Duration = Duration::from_millis(500);

    #[test]
    fn failed_probes_without_nacks_and_refutations_raise_the_score_which_slows_probing() {
        let mut guard = Lifeguard::new(id(1).addr, true);
        let probe = Timer::ProbeRandomMember(0);
        assert_eq!(
            guard.schedule(probe.clone(), Duration::from_secs(1), 0, 5),
            Some((probe.clone(), Duration::from_secs(1)))
        );
        // A probe with no relay fails: +1.
        guard.sent(&header(1, 2, 0, Message::Ping(7)));
        guard.probe_failed(7);
        assert_eq!(guard.score(), 1);
        // Three relays asked, one nacked: the two silent ones count.
        guard.sent(&header(1, 2, 0, Message::Ping(8)));
        for relay in [3, 4, 5] {
            guard.sent(&header(
                1,
                relay,
                0,
                Message::PingReq {
                    target: id(2),
                    probe_number: 8,
                },
            ));
        }
        guard.nack(&Nack {
            relay: id(3).addr,
            probe_number: 8,
        });
        // A nack from a member that was not asked does not count.
        guard.nack(&Nack {
            relay: id(9).addr,
            probe_number: 8,
        });
        guard.probe_failed(8);
        assert_eq!(guard.score(), 3);
        // Every relay nacked: the target is gone, our network is fine.
        guard.sent(&header(1, 2, 0, Message::Ping(9)));
        guard.sent(&header(
            1,
            3,
            0,
            Message::PingReq {
                target: id(2),
                probe_number: 9,
            },
        ));
        guard.nack(&Nack {
            relay: id(3).addr,
            probe_number: 9,
        });
        guard.probe_failed(9);
        assert_eq!(guard.score(), 3);
        // Refuting a suspicion of ourselves (our incarnation grows): +1.
        guard.sent(&header(1, 2, 1, Message::Gossip));
        assert_eq!(guard.score(), 4);
        assert_eq!(
            guard.schedule(probe.clone(), Duration::from_secs(1), 0, 5),
            Some((probe.clone(), Duration::from_secs(5)))
        );
        // Answered probes bring it back down, to 0 at the least.
        for n in 10..20 {
            guard.sent(&header(1, 2, 1, Message::Ping(n)));
            guard.received(&header(2, 1, 0, Message::Ack(n)), 0, RTT);
        }
        assert_eq!(guard.score(), 0);
        // An ack for a probe we never sent changes nothing.
        guard.change_score(2);
        guard.received(&header(2, 1, 0, Message::Ack(99)), 0, RTT);
        assert_eq!(guard.score(), 2);
        for _ in 0..20 {
            guard.probe_failed(1);
        }
        assert_eq!(guard.score(), MAX_SCORE);
    }

    #[test]
    fn a_relay_nacks_when_the_target_stays_silent_and_not_when_it_answers() {
        let mut guard = Lifeguard::new(id(3).addr, true);
        guard.received(
            &header(
                1,
                3,
                0,
                Message::PingReq {
                    target: id(2),
                    probe_number: 4,
                },
            ),
            1_000,
            RTT,
        );
        guard.received(
            &header(
                5,
                3,
                0,
                Message::PingReq {
                    target: id(2),
                    probe_number: 6,
                },
            ),
            1_000,
            RTT,
        );
        // The target answers the probe relayed for member 5 only.
        guard.received(
            &header(
                2,
                3,
                0,
                Message::IndirectAck {
                    target: id(5),
                    probe_number: 6,
                },
            ),
            1_100,
            RTT,
        );
        assert_eq!(guard.next_due_ms(), Some(1_250));
        assert_eq!(guard.poll(1_249), vec![]);
        assert_eq!(
            guard.poll(1_250),
            vec![Action::SendNack {
                to: id(1).addr,
                nack: Nack {
                    relay: id(3).addr,
                    probe_number: 4
                }
            }]
        );
        assert_eq!(guard.poll(5_000), vec![]);
    }

    #[test]
    fn a_suspicion_starts_long_and_shrinks_with_each_independent_confirmation() {
        let mut guard = Lifeguard::new(id(1).addr, true);
        let down = Timer::ChangeSuspectToDown {
            member_id: id(2),
            incarnation: 3,
            token: 0,
        };
        let min = Duration::from_secs(4);
        assert_eq!(guard.schedule(down.clone(), min, 10_000, 10), None);
        assert_eq!(guard.next_due_ms(), Some(10_000 + 24_000));
        // Alone, it waits 6 × 4 s.
        assert_eq!(guard.poll(10_000 + 23_999), vec![]);
        let suspect = |from: u16, incarnation| Suspect {
            from: id(from).addr,
            member: id(2),
            incarnation,
        };
        // One confirmation: 24 − 20 × ln 2 / ln 3 = 11.38 s.
        guard.confirm(&suspect(3, 3), id(3).addr);
        // The same member again (whatever it names as the sender), the
        // suspect itself, ourselves, or another incarnation: not independent
        // confirmations.
        guard.confirm(&suspect(3, 3), id(3).addr);
        guard.confirm(&suspect(5, 3), id(3).addr);
        guard.confirm(&suspect(2, 3), id(2).addr);
        guard.confirm(&suspect(1, 3), id(1).addr);
        guard.confirm(&suspect(4, 2), id(4).addr);
        assert_eq!(guard.poll(10_000 + 11_380), vec![]);
        guard.confirm(&suspect(4, 3), id(4).addr);
        // Two: down to foca's own 4 s, which has passed.
        assert_eq!(
            guard.poll(10_000 + 11_380),
            vec![Action::Deliver(down.clone())]
        );
        assert_eq!(guard.expired, 1);
        assert_eq!(guard.next_due_ms(), None);

        // Asked again while held (another failed probe): the clock runs on
        // from the first time.
        assert_eq!(guard.schedule(down.clone(), min, 100_000, 2), None);
        assert_eq!(guard.schedule(down.clone(), min, 102_000, 2), None);
        assert_eq!(guard.poll(104_000), vec![Action::Deliver(down.clone())]);

        // Refuted before it is due: forgotten, never delivered.
        assert_eq!(guard.schedule(down.clone(), min, 0, 10), None);
        guard.retain(&[], &[]);
        assert_eq!(guard.poll(60_000), vec![]);

        // In a cluster too small to confirm, foca's timeout stands.
        assert_eq!(guard.schedule(down.clone(), min, 0, 2), None);
        assert_eq!(guard.poll(3_999), vec![]);
        assert_eq!(guard.poll(4_000), vec![Action::Deliver(down)]);
    }

    #[test]
    fn suspicions_raised_together_confirm_each_other_and_a_late_holder_is_told() {
        let down = |member: u16| Timer::ChangeSuspectToDown {
            member_id: id(member),
            incarnation: 0,
            token: 0,
        };
        let min = Duration::from_secs(4);
        let holding = |from: u16| Suspect {
            from: id(from).addr,
            member: id(2),
            incarnation: 0,
        };

        // Member 3 announced it holds a suspicion of 2 before ours was
        // raised: its failed probe counts towards ours from the start.
        let mut guard = Lifeguard::new(id(1).addr, true);
        assert!(!guard.holding(&holding(3), id(3).addr));
        assert_eq!(guard.schedule(down(2), min, 0, 10), None);
        assert_eq!(guard.next_due_ms(), Some(11_381));
        // Member 4 raises its own afterwards: the second confirmation.
        assert!(!guard.holding(&holding(4), id(4).addr));
        assert_eq!(guard.poll(4_000), vec![Action::Deliver(down(2))]);

        // Our probe of 2 failed while nobody was known to hold it: nobody to
        // tell but the suspect. A holder announced later is told, once.
        let mut guard = Lifeguard::new(id(1).addr, true);
        assert_eq!(guard.own_probe_failed_of(id(2).addr, 0), vec![]);
        assert!(guard.holding(&holding(3), id(3).addr));
        assert!(!guard.holding(&holding(3), id(3).addr));
        assert_eq!(guard.own_probe_failed_of(id(2).addr, 0), vec![id(3).addr]);
        // Another incarnation is another suspicion: no failed probe of ours.
        let newer = Suspect {
            incarnation: 1,
            ..holding(4)
        };
        assert!(!guard.holding(&newer, id(4).addr));
        // While 2 is active at incarnation 0 (the suspicion not yet heard
        // of by gossip), what was learnt is kept.
        guard.retain(&[], &[(id(2).addr, 0)]);
        assert_eq!(guard.own_probe_failed_of(id(2).addr, 0), vec![id(3).addr]);
        // Refuted (a newer incarnation) or down: all of it is forgotten.
        guard.retain(&[], &[(id(2).addr, 1)]);
        assert!(!guard.holding(&holding(5), id(5).addr));

        // An announcement claiming to come from ourselves is ignored; and
        // holders are bounded.
        let mut guard = Lifeguard::new(id(1).addr, true);
        assert_eq!(guard.own_probe_failed_of(id(2).addr, 0), vec![]);
        assert!(!guard.holding(&holding(1), id(1).addr));
        for member in 10..10 + MAX_HOLDERS as u16 {
            assert!(guard.holding(&holding(member), id(member).addr));
        }
        assert!(!guard.holding(&holding(99), id(99).addr));
        assert_eq!(guard.own_probe_failed_of(id(2).addr, 0).len(), MAX_HOLDERS);
    }

    #[test]
    fn switched_off_it_passes_timers_through_and_keeps_no_score() {
        let mut guard = Lifeguard::new(id(1).addr, false);
        let down = Timer::ChangeSuspectToDown {
            member_id: id(2),
            incarnation: 3,
            token: 0,
        };
        let min = Duration::from_secs(4);
        assert_eq!(guard.schedule(down.clone(), min, 0, 10), Some((down, min)));
        guard.sent(&header(1, 2, 0, Message::Ping(1)));
        guard.probe_failed(1);
        guard.received(
            &header(
                1,
                3,
                0,
                Message::PingReq {
                    target: id(2),
                    probe_number: 4,
                },
            ),
            0,
            RTT,
        );
        assert_eq!(guard.score(), 0);
        assert_eq!(guard.poll(60_000), vec![]);
    }
}
