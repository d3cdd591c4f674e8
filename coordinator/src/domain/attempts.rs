//! Every attempt ends: the rules, without I/O, that end an attempt its node
//! will not end by itself. The loop (`loops::attempts`) reads the in-flight
//! attempts from the store and the nodes' latest telemetry from the registry,
//! calls [`Reviewer::review`] with the coordinator's clock, and carries out
//! the answer.
//!
//! Three rules, each with a grace period:
//! - **unanswered:** an attempt its node has not answered at all (no
//!   `accepted`, `running`, or final event) while reporting telemetry for
//!   the grace period (from its first report after the assignment to one a
//!   grace later) is ended. An agent answers within milliseconds, and the
//!   outbox sends the assignment again every few seconds, so a node that
//!   talks to the coordinator all that while and stays silent about it is
//!   broken or lies (a "black hole" that advertises fast hardware,
//!   reports telemetry and keeps whatever it is given: issue 33, item 4).
//!   The loop also stops placing work on that node until it answers again.
//! - **wall time:** an attempt still in flight its wall-time limit plus the
//!   grace after its `running` event arrived is overdue. The agent kills an
//!   attempt at its limit, so one that outlives it sits on a node that lost
//!   it, hung, or does not keep the limit.
//! - **reconcile:** an online node lists the attempts it holds in its
//!   telemetry. An attempt the coordinator has in flight on that node and
//!   that every complete list received for the grace period lacks is
//!   unknown to the node (its journal lost it, or the assignment never
//!   arrived): it is ended. The grace covers an assignment still in flight
//!   and a final event on its way. An attempt a node lists that the
//!   coordinator does not have in flight there (ended, re-placed, or never
//!   made) is cancelled on the node, again at most once per grace period.
//!
//! Offline nodes are not this module's business: `liveness` requeues their
//! work.

use std::collections::{HashMap, HashSet};

/// Why the coordinator ended an attempt. Stored as the task's failure
/// reason when the task fails with it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AttemptEnd {
    /// In flight past its wall-time limit plus the grace.
    WallTimeExceeded,
    /// Its node, online and listing its attempts, does not hold it.
    UnknownToNode,
    /// Its node never answered the assignment.
    Unanswered,
}

impl AttemptEnd {
    /// The failure reason stored when the task fails with it.
    pub fn as_str(self) -> &'static str {
        match self {
            AttemptEnd::WallTimeExceeded => "wall_time_exceeded",
            AttemptEnd::UnknownToNode => "unknown_to_node",
            AttemptEnd::Unanswered => "unanswered",
        }
    }

    /// A sentence for logs.
    pub fn describe(self) -> &'static str {
        match self {
            AttemptEnd::WallTimeExceeded => {
                "the attempt ran past its wall-time limit plus the grace period"
            }
            AttemptEnd::UnknownToNode => {
                "the node, online, did not list the attempt among those it holds"
            }
            AttemptEnd::Unanswered => {
                "the node did not answer the assignment within the grace period"
            }
        }
    }
}

/// An attempt the store has in flight (task `assigned` or `running`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InFlight {
    /// The task.
    pub task_id: String,
    /// Its current attempt.
    pub attempt: u32,
    /// The node it was given to.
    pub node: String,
    /// When it was assigned, Unix ms (coordinator clock).
    pub assigned_ms: u64,
    /// When its `running` event arrived, Unix ms (coordinator clock).
    pub running_since_ms: Option<u64>,
    /// Its wall-time limit, ms.
    pub wall_ms: u64,
    /// Whether its node has sent any event for it (`accepted` and on).
    pub answered: bool,
}

/// A node's latest telemetry, as far as the rules care.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeReport {
    /// The node.
    pub node: String,
    /// Whether the registry shows it online.
    pub online: bool,
    /// When the report arrived, Unix ms (coordinator clock).
    pub received_ms: u64,
    /// The attempts it lists: (task, attempt).
    pub attempts: Vec<(String, u32)>,
    /// Whether the list is complete (an older agent lists nothing, a node
    /// with more than fit lists some).
    pub complete: bool,
}

/// What one review sees.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Review {
    /// Now, Unix ms (coordinator clock).
    pub now_ms: u64,
    /// The grace period, ms.
    pub grace_ms: u64,
    /// Every attempt in flight on a node of this site.
    pub in_flight: Vec<InFlight>,
    /// The latest report of every node that has one.
    pub reports: Vec<NodeReport>,
}

/// What to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// End this attempt (the store places the task again while attempts
    /// remain, else fails it with the reason) and cancel it on its node.
    End {
        /// The task.
        task_id: String,
        /// The attempt.
        attempt: u32,
        /// Its node.
        node: String,
        /// Why.
        reason: AttemptEnd,
    },
    /// Tell `node` to stop an attempt the coordinator does not have in
    /// flight there.
    Cancel {
        /// The node.
        node: String,
        /// The task.
        task_id: String,
        /// The attempt.
        attempt: u32,
    },
}

type Key = (String, u32);

/// What the reviewer remembers between reviews.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Reviewer {
    /// In-flight attempts missing from their node's complete lists, and the
    /// receive time of the first list that lacked them.
    missing_since: HashMap<Key, u64>,
    /// In-flight attempts their node has not answered, and the receive time
    /// of its first report after the assignment.
    unanswered_since: HashMap<Key, u64>,
    /// Cancels sent for attempts nodes list, and when.
    cancelled_at: HashMap<(String, Key), u64>,
}

impl Reviewer {
    /// One review: the attempts to end and the cancels to send, each rule
    /// applied once per attempt per grace period.
    pub fn review(&mut self, review: Review) -> Vec<Verdict> {
        let Review {
            now_ms,
            grace_ms,
            in_flight,
            reports,
        } = review;
        let reports: HashMap<&str, &NodeReport> =
            reports.iter().map(|r| (r.node.as_str(), r)).collect();
        let mut verdicts = Vec::new();
        let mut ended: HashSet<Key> = HashSet::new();
        let mut in_flight_here: HashSet<(String, Key)> = HashSet::new();

        for attempt in &in_flight {
            let key = (attempt.task_id.clone(), attempt.attempt);
            in_flight_here.insert((attempt.node.clone(), key.clone()));
            let overdue = attempt.running_since_ms.is_some_and(|since| {
                now_ms
                    >= since
                        .saturating_add(attempt.wall_ms)
                        .saturating_add(grace_ms)
            });
            if overdue {
                ended.insert(key.clone());
                verdicts.push(end(attempt, AttemptEnd::WallTimeExceeded));
                continue;
            }
            let Some(report) = reports.get(attempt.node.as_str()) else {
                continue;
            };
            // Only reports that arrived after the assignment count: a node
            // or a link that was down does not send them, so an outage on
            // either side never ends an attempt here. A complete list that
            // lacks the attempt is the reconcile rule's below (the
            // assignment may never have arrived: not the node's doing).
            let listed = report.attempts.contains(&key);
            let lacks = report.complete && !listed;
            if attempt.answered
                || lacks
                || !report.online
                || report.received_ms < attempt.assigned_ms
            {
                self.unanswered_since.remove(&key);
            } else {
                let since = *self
                    .unanswered_since
                    .entry(key.clone())
                    .or_insert(report.received_ms);
                if report.received_ms.saturating_sub(since) >= grace_ms {
                    ended.insert(key.clone());
                    verdicts.push(end(attempt, AttemptEnd::Unanswered));
                    continue;
                }
            }
            // Only a complete list from an online node, received after the
            // assignment was made, can say the node does not hold it.
            if listed || !report.online || !report.complete {
                self.missing_since.remove(&key);
                continue;
            }
            if report.received_ms < attempt.assigned_ms {
                continue;
            }
            let since = *self
                .missing_since
                .entry(key.clone())
                .or_insert(report.received_ms);
            if report.received_ms.saturating_sub(since) >= grace_ms {
                ended.insert(key.clone());
                verdicts.push(end(attempt, AttemptEnd::UnknownToNode));
            }
        }
        // Forget what is no longer in flight, or ended now.
        let in_flight_keys: HashSet<&Key> = in_flight_here.iter().map(|(_, key)| key).collect();
        self.missing_since
            .retain(|key, _| !ended.contains(key) && in_flight_keys.contains(key));
        self.unanswered_since
            .retain(|key, _| !ended.contains(key) && in_flight_keys.contains(key));

        for report in reports.values() {
            if !report.online {
                continue;
            }
            for key in &report.attempts {
                let here = (report.node.clone(), key.clone());
                if in_flight_here.contains(&here) && !ended.contains(key) {
                    continue;
                }
                if ended.contains(key) {
                    // Its `End` verdict cancels it already.
                    self.cancelled_at.insert(here, now_ms);
                    continue;
                }
                let due = self
                    .cancelled_at
                    .get(&here)
                    .is_none_or(|sent| now_ms.saturating_sub(*sent) >= grace_ms);
                if due {
                    self.cancelled_at.insert(here, now_ms);
                    verdicts.push(Verdict::Cancel {
                        node: report.node.clone(),
                        task_id: key.0.clone(),
                        attempt: key.1,
                    });
                }
            }
        }
        // A cancel is remembered while the node still lists the attempt.
        self.cancelled_at.retain(|(node, key), _| {
            reports
                .get(node.as_str())
                .is_some_and(|report| report.attempts.contains(key))
        });
        verdicts
    }

    /// Whether an attempt is being watched as missing from its node's list.
    pub fn watches_missing(&self, task_id: &str, attempt: u32) -> bool {
        self.missing_since
            .contains_key(&(task_id.to_owned(), attempt))
    }
}

fn end(attempt: &InFlight, reason: AttemptEnd) -> Verdict {
    Verdict::End {
        task_id: attempt.task_id.clone(),
        attempt: attempt.attempt,
        node: attempt.node.clone(),
        reason,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    const GRACE: u64 = 1_000;

    fn flight(task: &str, node: &str, assigned: u64, running: Option<u64>, wall: u64) -> InFlight {
        InFlight {
            task_id: task.into(),
            attempt: 1,
            node: node.into(),
            assigned_ms: assigned,
            running_since_ms: running,
            wall_ms: wall,
            answered: true,
        }
    }

    fn report(node: &str, received: u64, attempts: &[(&str, u32)], complete: bool) -> NodeReport {
        NodeReport {
            node: node.into(),
            online: true,
            received_ms: received,
            attempts: attempts.iter().map(|(t, a)| ((*t).into(), *a)).collect(),
            complete,
        }
    }

    fn review(now: u64, in_flight: Vec<InFlight>, reports: Vec<NodeReport>) -> Review {
        Review {
            now_ms: now,
            grace_ms: GRACE,
            in_flight,
            reports,
        }
    }

    fn ended(task: &str, node: &str, reason: AttemptEnd) -> Verdict {
        Verdict::End {
            task_id: task.into(),
            attempt: 1,
            node: node.into(),
            reason,
        }
    }

    #[test]
    fn an_assignment_never_answered_ends_after_the_grace_whatever_the_node_reports() {
        let silent = |assigned| InFlight {
            answered: false,
            ..flight("t", "hole", assigned, None, 60_000)
        };
        let mut reviewer = Reviewer::default();
        // Telemetry with an incomplete list (what a black hole sends): the
        // grace counts from its first report after the assignment.
        let at = |received| vec![report("hole", received, &[], false)];
        // A report from before the assignment says nothing.
        assert_eq!(
            reviewer.review(review(9_000, vec![silent(1_000)], at(900))),
            vec![]
        );
        assert_eq!(
            reviewer.review(review(9_000, vec![silent(1_000)], at(1_500))),
            vec![]
        );
        assert_eq!(
            reviewer.review(review(9_000, vec![silent(1_000)], at(2_499))),
            vec![]
        );
        assert_eq!(
            reviewer.review(review(9_000, vec![silent(1_000)], at(2_500))),
            vec![ended("t", "hole", AttemptEnd::Unanswered)]
        );
        // A node that went quiet (offline, or its link down) is not
        // counted against: no report, no verdict, however long.
        let mut reviewer = Reviewer::default();
        let mut offline = report("hole", 1_500, &[], false);
        offline.online = false;
        assert_eq!(
            reviewer.review(review(1_000_000, vec![silent(1_000)], vec![offline])),
            vec![]
        );
        assert_eq!(
            reviewer.review(review(1_000_000, vec![silent(1_000)], vec![])),
            vec![]
        );
        // Listed in a complete list but never answered: the node keeps it
        // and says nothing; ended too.
        let mut reviewer = Reviewer::default();
        let keeps = |received| vec![report("hole", received, &[("t", 1)], true)];
        assert_eq!(
            reviewer.review(review(9_000, vec![silent(1_000)], keeps(1_000))),
            vec![]
        );
        assert_eq!(
            reviewer.review(review(9_000, vec![silent(1_000)], keeps(2_000))),
            vec![ended("t", "hole", AttemptEnd::Unanswered)]
        );
        // Missing from a complete list: the reconcile rule's (unknown to
        // the node), not this one's.
        let mut reviewer = Reviewer::default();
        let lacks = |received| vec![report("hole", received, &[], true)];
        assert_eq!(
            reviewer.review(review(9_000, vec![silent(1_000)], lacks(1_000))),
            vec![]
        );
        assert_eq!(
            reviewer.review(review(9_000, vec![silent(1_000)], lacks(2_000))),
            vec![ended("t", "hole", AttemptEnd::UnknownToNode)]
        );
        // Answered (accepted, queued on the node): not this rule's.
        let mut reviewer = Reviewer::default();
        assert_eq!(
            reviewer.review(review(
                100_000,
                vec![flight("t", "n", 1_000, None, 600_000)],
                vec![report("n", 99_000, &[("t", 1)], true)]
            )),
            vec![]
        );
    }

    #[test]
    fn wall_time_expiry_table() {
        // (running since, wall, now, overdue?)
        let table: &[(Option<u64>, u64, u64, bool)] = &[
            (None, 1_000, 1_000_000, false), // never started: not this rule's
            (Some(0), 1_000, 1_999, false),  // inside wall + grace
            (Some(0), 1_000, 2_000, true),   // at wall + grace
            (Some(500), 1_000, 2_499, false),
            (Some(500), 1_000, 9_000, true),
            (Some(u64::MAX - 5), u64::MAX, u64::MAX - 1, false), // no overflow
        ];
        for (running, wall, now, overdue) in table {
            let mut reviewer = Reviewer::default();
            // The node lists the attempt: only the wall-time rule can end it.
            let verdicts = reviewer.review(review(
                *now,
                vec![flight("t", "n", 0, *running, *wall)],
                vec![report("n", *now, &[("t", 1)], true)],
            ));
            let want = if *overdue {
                vec![ended("t", "n", AttemptEnd::WallTimeExceeded)]
            } else {
                vec![]
            };
            assert_eq!(verdicts, want, "running {running:?} wall {wall} now {now}");
        }
    }

    #[test]
    fn an_attempt_the_node_does_not_list_is_ended_after_the_grace() {
        let mut reviewer = Reviewer::default();
        let attempt = || vec![flight("t", "n", 1_000, None, 60_000)];
        // A report from before the assignment says nothing about it.
        assert!(reviewer
            .review(review(1_200, attempt(), vec![report("n", 900, &[], true)]))
            .is_empty());
        assert!(!reviewer.watches_missing("t", 1));
        // Missing from a complete list: watched, not ended yet (an
        // assignment in flight must not be raced).
        assert!(reviewer
            .review(review(
                1_600,
                attempt(),
                vec![report("n", 1_500, &[], true)]
            ))
            .is_empty());
        assert!(reviewer.watches_missing("t", 1));
        assert!(reviewer
            .review(review(
                2_400,
                attempt(),
                vec![report("n", 2_499, &[], true)]
            ))
            .is_empty());
        assert_eq!(
            reviewer.review(review(
                2_600,
                attempt(),
                vec![report("n", 2_500, &[], true)]
            )),
            vec![ended("t", "n", AttemptEnd::UnknownToNode)]
        );
        assert!(!reviewer.watches_missing("t", 1));
    }

    #[test]
    fn listing_again_incomplete_lists_and_offline_nodes_clear_the_watch() {
        let table: &[(&str, NodeReport)] = &[
            ("listed again", report("n", 1_700, &[("t", 1)], true)),
            ("incomplete list", report("n", 1_700, &[], false)),
            (
                "offline node",
                NodeReport {
                    online: false,
                    ..report("n", 1_700, &[], true)
                },
            ),
        ];
        for (why, next) in table {
            let mut reviewer = Reviewer::default();
            let attempt = || vec![flight("t", "n", 1_000, None, 60_000)];
            reviewer.review(review(
                1_500,
                attempt(),
                vec![report("n", 1_500, &[], true)],
            ));
            assert!(reviewer.watches_missing("t", 1), "{why}");
            assert!(reviewer
                .review(review(1_700, attempt(), vec![next.clone()]))
                .is_empty());
            assert!(!reviewer.watches_missing("t", 1), "{why}");
            // Missing again later: the grace starts anew.
            assert!(
                reviewer
                    .review(review(
                        2_600,
                        attempt(),
                        vec![report("n", 2_600, &[], true)]
                    ))
                    .is_empty(),
                "{why}"
            );
        }
    }

    #[test]
    fn a_node_without_a_report_or_listing_nothing_old_style_keeps_its_work() {
        let mut reviewer = Reviewer::default();
        let attempt = || vec![flight("t", "n", 0, None, 60_000)];
        for now in [1_000, 5_000, 50_000] {
            assert!(reviewer.review(review(now, attempt(), vec![])).is_empty());
            assert!(reviewer
                .review(review(now, attempt(), vec![report("n", now, &[], false)]))
                .is_empty());
        }
    }

    #[test]
    fn attempts_the_coordinator_does_not_have_there_are_cancelled_once_per_grace() {
        let mut reviewer = Reviewer::default();
        // The node lists: its current attempt, an old attempt, an unknown task,
        // and the current attempt of a task that runs on another node.
        let in_flight = || {
            vec![
                flight("mine", "n", 0, Some(0), 60_000),
                flight("theirs", "m", 0, Some(0), 60_000),
            ]
        };
        let lists = |now| {
            vec![
                report("n", now, &[("mine", 1), ("old", 3), ("theirs", 1)], true),
                report("m", now, &[("theirs", 1)], true),
            ]
        };
        let cancel = |task: &str, attempt| Verdict::Cancel {
            node: "n".into(),
            task_id: task.into(),
            attempt,
        };
        let mut first = reviewer.review(review(100, in_flight(), lists(100)));
        first.sort_by_key(|v| format!("{v:?}"));
        assert_eq!(first, vec![cancel("old", 3), cancel("theirs", 1)]);
        assert!(reviewer
            .review(review(1_099, in_flight(), lists(1_099)))
            .is_empty());
        assert_eq!(
            reviewer
                .review(review(1_100, in_flight(), lists(1_100)))
                .len(),
            2,
            "sent again after the grace while still listed"
        );
        // Once the node stops listing them, nothing more.
        let quiet = vec![
            report("n", 1_200, &[("mine", 1)], true),
            report("m", 1_200, &[("theirs", 1)], true),
        ];
        assert!(reviewer
            .review(review(5_000, in_flight(), quiet))
            .is_empty());
    }

    #[test]
    fn an_ended_attempt_is_not_cancelled_twice_in_one_review() {
        let mut reviewer = Reviewer::default();
        let verdicts = reviewer.review(review(
            10_000,
            vec![flight("t", "n", 0, Some(0), 1_000)],
            vec![report("n", 10_000, &[("t", 1)], true)],
        ));
        assert_eq!(
            verdicts,
            vec![ended("t", "n", AttemptEnd::WallTimeExceeded)]
        );
        // Next review: the store has ended it; the node still lists it.
        let verdicts = reviewer.review(review(
            10_500,
            vec![],
            vec![report("n", 10_500, &[("t", 1)], true)],
        ));
        assert!(verdicts.is_empty(), "{verdicts:?}");
        let verdicts = reviewer.review(review(
            11_000,
            vec![],
            vec![report("n", 11_000, &[("t", 1)], true)],
        ));
        assert_eq!(
            verdicts,
            vec![Verdict::Cancel {
                node: "n".into(),
                task_id: "t".into(),
                attempt: 1
            }]
        );
    }
}
