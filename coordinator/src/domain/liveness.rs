//! Failure detection without I/O: whether a node is silent ([`Silence`],
//! the one rule, read by the registry's suspicion and by the cluster view
//! that decides which nodes a round offers work), and which nodes' work goes
//! back to the queue after one check ([`Detector`]). The loop
//! (`loops::liveness`) reads the registry and the store, calls
//! [`Detector::check`], and requeues what it answers.

use std::collections::HashMap;

/// How silence is judged at one moment, on the coordinator's receive clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Silence {
    /// Now, Unix ms.
    pub now_ms: u64,
    /// Silence after which a node is suspected, ms.
    pub timeout_ms: u64,
    /// How far ingest is behind, ms: a node's latest report may be waiting
    /// in the queue, so that time is not its silence.
    pub ingest_lag_ms: u64,
    /// Since when the coordinator's own broker connection is up, Unix ms (0:
    /// counting from any time): silence before it is not the node's.
    pub listening_since_ms: u64,
}

impl Silence {
    /// Whether a node last heard at `last_heard_ms` is silent: nothing from
    /// it for the timeout, not counting the time ingest is behind nor the
    /// time before the coordinator listened.
    pub fn is_silent(&self, last_heard_ms: u64) -> bool {
        let heard = last_heard_ms.max(self.listening_since_ms);
        self.now_ms
            .saturating_sub(self.ingest_lag_ms)
            .saturating_sub(heard)
            >= self.timeout_ms
    }
}

/// What one check sees.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Observation {
    /// Now, Unix ms.
    pub now_ms: u64,
    /// Silence after which a node is suspected, ms.
    pub timeout_ms: u64,
    /// Since when the coordinator's own broker connection is up; `None`
    /// while it is down (then every node looks silent, through no fault of
    /// theirs).
    pub listening_since_ms: Option<u64>,
    /// Nodes the registry just marked offline for silence.
    pub newly_silent: Vec<String>,
    /// Nodes with work in flight, and whether the registry shows each online.
    pub in_flight: Vec<(String, bool)>,
}

/// What the detector remembers between checks.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Detector {
    /// Nodes with work in flight that the registry does not show online, and
    /// since when (Unix ms) the detector has seen them so.
    absent_since: HashMap<String, u64>,
}

impl Detector {
    /// One check: the nodes whose in-flight work must be requeued now, each
    /// once: every node just found silent, and every node with work in
    /// flight that stayed away (not online) for the node timeout, counted
    /// from when it was first noticed or from the broker reconnection,
    /// whichever is later.
    pub fn check(&mut self, observation: Observation) -> Vec<String> {
        let Some(listening_since) = observation.listening_since_ms else {
            // Cut off from the broker ourselves: start counting again once back.
            self.absent_since.clear();
            return Vec::new();
        };
        let mut requeue = observation.newly_silent;
        self.absent_since
            .retain(|node, _| observation.in_flight.iter().any(|(id, _)| id == node));
        for (node, online) in observation.in_flight {
            if online {
                self.absent_since.remove(&node);
                continue;
            }
            let noticed = *self
                .absent_since
                .entry(node.clone())
                .or_insert(observation.now_ms);
            let since = noticed.max(listening_since);
            if observation.now_ms.saturating_sub(since) >= observation.timeout_ms
                && !requeue.contains(&node)
            {
                requeue.push(node);
            }
        }
        for node in &requeue {
            self.absent_since.remove(node);
        }
        requeue
    }

    /// Whether a node is being watched as absent (for tests and logs).
    pub fn watches(&self, node: &str) -> bool {
        self.absent_since.contains_key(node)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn silence_counts_from_the_last_report_but_not_ingest_lag_nor_before_listening() {
        let at = |now_ms, ingest_lag_ms, listening_since_ms| Silence {
            now_ms,
            timeout_ms: 5_000,
            ingest_lag_ms,
            listening_since_ms,
        };
        assert!(!at(5_999, 0, 0).is_silent(1_000));
        assert!(at(6_000, 0, 0).is_silent(1_000), "the timeout reached");
        assert!(
            !at(6_000, 1, 0).is_silent(1_000),
            "a report may be waiting in ingest"
        );
        assert!(at(9_000, 3_000, 0).is_silent(1_000));
        assert!(
            !at(6_000, 0, 2_000).is_silent(1_000),
            "silence before listening"
        );
        assert!(at(7_000, 0, 2_000).is_silent(1_000));
        assert!(
            !at(0, 0, 0).is_silent(u64::MAX),
            "a report from the future is no silence"
        );
    }

    const TIMEOUT: u64 = 5_000;

    fn seen(
        now_ms: u64,
        listening: Option<u64>,
        silent: &[&str],
        in_flight: &[(&str, bool)],
    ) -> Observation {
        Observation {
            now_ms,
            timeout_ms: TIMEOUT,
            listening_since_ms: listening,
            newly_silent: silent.iter().map(|id| id.to_string()).collect(),
            in_flight: in_flight
                .iter()
                .map(|(id, online)| (id.to_string(), *online))
                .collect(),
        }
    }

    #[test]
    fn a_silent_node_is_requeued_at_once_and_only_once() {
        let mut detector = Detector::default();
        let requeue = detector.check(seen(10_000, Some(0), &["a"], &[("a", false)]));
        assert_eq!(requeue, ["a"]);
        assert!(!detector.watches("a"));
    }

    #[test]
    fn an_absent_node_with_work_gets_the_timeout_to_come_back() {
        let mut detector = Detector::default();
        assert!(detector
            .check(seen(1_000, Some(0), &[], &[("b", false)]))
            .is_empty());
        assert!(detector.watches("b"));
        assert!(detector
            .check(seen(5_999, Some(0), &[], &[("b", false)]))
            .is_empty());
        assert_eq!(
            detector.check(seen(6_000, Some(0), &[], &[("b", false)])),
            ["b"]
        );
    }

    #[test]
    fn coming_online_or_finishing_its_work_clears_the_watch() {
        let mut detector = Detector::default();
        detector.check(seen(1_000, Some(0), &[], &[("c", false), ("d", false)]));
        detector.check(seen(2_000, Some(0), &[], &[("c", true)]));
        assert!(!detector.watches("c"), "online again");
        assert!(!detector.watches("d"), "no work in flight any more");
        // Absent again later: the count starts anew.
        assert!(detector
            .check(seen(3_000, Some(0), &[], &[("c", false)]))
            .is_empty());
        assert!(detector
            .check(seen(7_999, Some(0), &[], &[("c", false)]))
            .is_empty());
        assert_eq!(
            detector.check(seen(8_000, Some(0), &[], &[("c", false)])),
            ["c"]
        );
    }

    #[test]
    fn nothing_is_suspected_while_the_broker_link_is_down_and_silence_counts_from_reconnection() {
        let mut detector = Detector::default();
        detector.check(seen(1_000, Some(0), &[], &[("e", false)]));
        assert!(detector
            .check(seen(9_000, None, &["e"], &[("e", false)]))
            .is_empty());
        assert!(!detector.watches("e"), "forgotten while cut off");
        // Back at 10 s: the node gets a full timeout from the reconnection.
        let e_absent = |now_ms| seen(now_ms, Some(10_000), &[], &[("e", false)]);
        assert!(detector.check(e_absent(10_000)).is_empty());
        assert!(detector.check(e_absent(14_999)).is_empty());
        assert_eq!(detector.check(e_absent(15_000)), ["e"]);
        // Noticed only later than the reconnection: counted from then.
        let mut late = Detector::default();
        let g_absent = |now_ms| seen(now_ms, Some(10_000), &[], &[("g", false)]);
        assert!(late.check(g_absent(12_000)).is_empty());
        assert!(late.check(g_absent(16_999)).is_empty());
        assert_eq!(late.check(g_absent(17_000)), ["g"]);
    }

    #[test]
    fn a_node_both_silent_and_absent_is_listed_once() {
        let mut detector = Detector::default();
        detector.check(seen(0, Some(0), &[], &[("f", false)]));
        let requeue = detector.check(seen(6_000, Some(0), &["f"], &[("f", false)]));
        assert_eq!(requeue, ["f"]);
    }
}
