//! The node's link toward the broker and the coordinator, as measured: the
//! round-trip time from MQTT pings (and the first connect), the share of
//! pings never answered, and the bandwidth of the agent's own artifact
//! downloads. All three go into telemetry; a figure not yet measured is
//! absent, never a default.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use starling_proto::LinkState;

/// How many of the last pings the loss is counted over.
pub const LOSS_WINDOW: usize = 20;

/// Transfers smaller than this say more about latency than bandwidth and
/// are not counted.
pub const MIN_MEASURED_TRANSFER_BYTES: u64 = 64 * 1024;

/// How much one transfer moves the smoothed bandwidth (an exponentially
/// weighted mean: a slow download among fast ones shows, and fades).
const BANDWIDTH_WEIGHT: f32 = 0.3;

/// `u32::MAX`: no figure yet (f32 bits of a NaN no measurement gives).
const UNMEASURED: u32 = u32::MAX;

/// Smoothed throughput of transfers, in Mbit/s; shared by whoever downloads
/// (a swarm's devices share one host's link, and one of these).
#[derive(Debug)]
pub struct Throughput {
    mbps_bits: AtomicU32,
}

impl Default for Throughput {
    fn default() -> Self {
        Self {
            mbps_bits: AtomicU32::new(UNMEASURED),
        }
    }
}

impl Throughput {
    /// Counts a transfer of `bytes` that took `took`.
    pub fn record(&self, bytes: u64, took: Duration) {
        if bytes < MIN_MEASURED_TRANSFER_BYTES || took.is_zero() {
            return;
        }
        let sample = (bytes as f64 * 8.0 / 1e6 / took.as_secs_f64()) as f32;
        if !sample.is_finite() {
            return;
        }
        // Racing updates may each start from the same previous value; one
        // sample's weight lost in a race is no harm to a smoothed figure.
        let smoothed = match self.mbps() {
            Some(previous) => previous + BANDWIDTH_WEIGHT * (sample - previous),
            None => sample,
        };
        self.mbps_bits.store(smoothed.to_bits(), Ordering::Relaxed);
    }

    /// The smoothed bandwidth in Mbit/s, once a transfer was counted.
    pub fn mbps(&self) -> Option<f32> {
        let bits = self.mbps_bits.load(Ordering::Relaxed);
        (bits != UNMEASURED).then(|| f32::from_bits(bits))
    }
}

/// Pings and their answers.
#[derive(Debug, Default)]
struct Pings {
    /// When the unanswered ping was sent.
    outstanding: Option<Instant>,
    /// The last [`LOSS_WINDOW`] pings: answered or not.
    outcomes: VecDeque<bool>,
}

impl Pings {
    fn settle(&mut self, answered: bool) {
        if self.outcomes.len() == LOSS_WINDOW {
            self.outcomes.pop_front();
        }
        self.outcomes.push_back(answered);
    }
}

/// Round-trip time and loss toward the broker, from MQTT pings (and the
/// first connect).
#[derive(Debug)]
pub struct LinkTracker {
    pings: Mutex<Pings>,
    /// The last RTT in milliseconds as f32 bits; [`UNMEASURED`] until one.
    rtt_bits: AtomicU32,
}

impl LinkTracker {
    /// A tracker, with the first connect's round trip where there was one.
    pub fn new(initial: Option<Duration>) -> Self {
        let tracker = Self {
            pings: Mutex::new(Pings::default()),
            rtt_bits: AtomicU32::new(UNMEASURED),
        };
        if let Some(rtt) = initial {
            tracker.record_rtt(rtt);
        }
        tracker
    }

    fn record_rtt(&self, rtt: Duration) {
        let ms = rtt.as_secs_f32() * 1000.0;
        self.rtt_bits.store(ms.to_bits(), Ordering::Relaxed);
    }

    fn pings(&self) -> std::sync::MutexGuard<'_, Pings> {
        self.pings.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A ping went out at `now`; one still unanswered is lost.
    pub fn ping(&self, now: Instant) {
        let mut pings = self.pings();
        if pings.outstanding.replace(now).is_some() {
            pings.settle(false);
        }
    }

    /// The broker answered the ping at `now`.
    pub fn pong(&self, now: Instant) {
        let sent = self.pings().outstanding.take();
        if let Some(sent) = sent {
            self.pings().settle(true);
            self.record_rtt(now.saturating_duration_since(sent));
        }
    }

    /// The connection was lost: a ping it never answered is lost.
    pub fn connection_lost(&self) {
        let mut pings = self.pings();
        if pings.outstanding.take().is_some() {
            pings.settle(false);
        }
    }

    /// The share of the last pings never answered, once one was settled.
    pub fn loss(&self) -> Option<f32> {
        let pings = self.pings();
        let total = pings.outcomes.len();
        (total > 0).then(|| {
            let lost = pings.outcomes.iter().filter(|answered| !**answered).count();
            lost as f32 / total as f32
        })
    }

    /// What telemetry reports: each figure where it was measured.
    pub fn state(&self, throughput: &Throughput) -> LinkState {
        let bits = self.rtt_bits.load(Ordering::Relaxed);
        LinkState {
            rtt_ms: (bits != UNMEASURED).then(|| f32::from_bits(bits)),
            bandwidth_mbps: throughput.mbps(),
            loss: self.loss(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nothing_measured_is_nothing_reported() {
        let link = LinkTracker::new(None);
        assert_eq!(
            link.state(&Throughput::default()),
            LinkState {
                rtt_ms: None,
                bandwidth_mbps: None,
                loss: None
            }
        );
    }

    #[test]
    fn pings_give_the_round_trip_and_the_unanswered_ones_the_loss() {
        let link = LinkTracker::new(Some(Duration::from_millis(3)));
        let start = Instant::now();
        link.ping(start);
        link.pong(start + Duration::from_millis(12));
        let state = link.state(&Throughput::default());
        assert_eq!(state.rtt_ms, Some(12.0));
        assert_eq!(state.loss, Some(0.0));
        // Two pings never answered: one overtaken by the next, one by the
        // connection's loss; then two answered.
        link.ping(start + Duration::from_secs(1));
        link.ping(start + Duration::from_secs(2));
        link.connection_lost();
        for second in 3..5 {
            let sent = start + Duration::from_secs(second);
            link.ping(sent);
            link.pong(sent + Duration::from_millis(20));
        }
        assert_eq!(link.loss(), Some(2.0 / 5.0));
        // A pong nobody asked for changes nothing.
        link.pong(start + Duration::from_secs(9));
        assert_eq!(link.loss(), Some(2.0 / 5.0));
        // The window forgets: twenty answered pings later, no loss.
        for second in 10..10 + LOSS_WINDOW as u64 {
            let sent = start + Duration::from_secs(second);
            link.ping(sent);
            link.pong(sent + Duration::from_millis(20));
        }
        assert_eq!(link.loss(), Some(0.0));
    }

    #[test]
    fn bandwidth_is_smoothed_over_large_transfers_only() {
        let throughput = Throughput::default();
        throughput.record(1_000, Duration::from_millis(1));
        assert_eq!(throughput.mbps(), None, "a small transfer says nothing");
        // 1 MB in 0.1 s: 80 Mbit/s.
        throughput.record(1_000_000, Duration::from_millis(100));
        assert!((throughput.mbps().unwrap() - 80.0).abs() < 1e-3);
        // One at 8 Mbit/s moves it by its weight, not all the way.
        throughput.record(1_000_000, Duration::from_secs(1));
        let after = throughput.mbps().unwrap();
        assert!((after - (80.0 - 0.3 * 72.0)).abs() < 1e-3, "{after}");
        throughput.record(1_000_000, Duration::ZERO);
        assert_eq!(throughput.mbps(), Some(after));
    }
}
