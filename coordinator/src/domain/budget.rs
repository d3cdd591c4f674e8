//! Per-node budgets at ingest: how many messages a node may send on each
//! channel, a token bucket per (node, channel). One node's flood of
//! telemetry or events (6,300 a second in issue 33) is dropped as it
//! arrives, before it can fill the queue every other node's reports and
//! the coordinator's own sends wait behind; what an honest agent sends
//! stays far inside its budget.
//!
//! Dropping loses nothing that matters: telemetry comes again every
//! second, an agent sends each task event again until the coordinator
//! acknowledges it, and capability and status reports are re-published at
//! each connection and kept by the broker. Keyed by the node segment of the
//! topic, which the broker's ACL lets only that node publish under.

use std::collections::HashMap;

use starling_proto::Channel;

/// A budget: `per_second` on average, `burst` at once.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rate {
    /// Messages a second, sustained.
    pub per_second: f64,
    /// Messages at once (the bucket's size).
    pub burst: f64,
}

/// Each consumed channel's budget per node. An agent sends telemetry once
/// a second, a status at connect and at its will, its capability at
/// connect and on a change, and a few events per task (re-sent every few
/// seconds until acknowledged): the budgets are ten times and more above.
pub fn rate_of(channel: Channel) -> Rate {
    match channel {
        Channel::Telemetry => Rate {
            per_second: 10.0,
            burst: 30.0,
        },
        Channel::Events => Rate {
            per_second: 400.0,
            burst: 2_000.0,
        },
        _ => Rate {
            per_second: 2.0,
            burst: 20.0,
        },
    }
}

/// Most (node, channel) buckets kept: past it, the full ones (nodes that
/// have been quiet long enough to earn their whole burst back) are dropped,
/// as they would read the same when created anew.
const MAX_BUCKETS: usize = 100_000;

#[derive(Debug, Clone, Copy)]
struct Bucket {
    tokens: f64,
    at_ms: u64,
}

/// The buckets of every node that sent something.
#[derive(Debug, Default)]
pub struct NodeBudgets {
    buckets: HashMap<(String, Channel), Bucket>,
}

impl NodeBudgets {
    /// Whether `node` may send one more message on `channel` at `now_ms`
    /// (and takes it from its budget if so).
    pub fn admit(&mut self, node: &str, channel: Channel, now_ms: u64) -> bool {
        let rate = rate_of(channel);
        if self.buckets.len() >= MAX_BUCKETS {
            self.buckets.retain(|(_, channel), bucket| {
                refill(*bucket, rate_of(*channel), now_ms) < rate_of(*channel).burst
            });
            // Still full (that many distinct senders within a burst's
            // refill, only possible on a broker without an ACL): start over,
            // each with a whole burst again, rather than grow.
            if self.buckets.len() >= MAX_BUCKETS {
                self.buckets.clear();
            }
        }
        let bucket = self
            .buckets
            .entry((node.to_owned(), channel))
            .or_insert(Bucket {
                tokens: rate.burst,
                at_ms: now_ms,
            });
        let tokens = refill(*bucket, rate, now_ms);
        let admitted = tokens >= 1.0;
        *bucket = Bucket {
            tokens: if admitted { tokens - 1.0 } else { tokens },
            at_ms: now_ms.max(bucket.at_ms),
        };
        admitted
    }

    /// How many buckets are kept.
    pub fn len(&self) -> usize {
        self.buckets.len()
    }

    /// Whether none is kept.
    pub fn is_empty(&self) -> bool {
        self.buckets.is_empty()
    }
}

/// The bucket's tokens at `now_ms`: what it had plus what the time since
/// earned, up to the burst (a clock that went back earns nothing).
fn refill(bucket: Bucket, rate: Rate, now_ms: u64) -> f64 {
    let elapsed_s = now_ms.saturating_sub(bucket.at_ms) as f64 / 1000.0;
    (bucket.tokens + elapsed_s * rate.per_second).min(rate.burst)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flood_gets_its_burst_then_its_rate_and_other_nodes_are_untouched() {
        let mut budgets = NodeBudgets::default();
        let rate = rate_of(Channel::Telemetry);
        // 5,000 in the same millisecond: the burst passes, nothing more.
        let admitted = (0..5_000)
            .filter(|_| budgets.admit("flood", Channel::Telemetry, 1_000))
            .count();
        assert_eq!(admitted, rate.burst as usize);
        // Another node, and another channel of the same node, have their own.
        assert!(budgets.admit("honest", Channel::Telemetry, 1_000));
        assert!(budgets.admit("flood", Channel::Events, 1_000));
        // One second later: one second's worth again.
        let admitted = (0..5_000)
            .filter(|_| budgets.admit("flood", Channel::Telemetry, 2_000))
            .count();
        assert_eq!(admitted, rate.per_second as usize);
    }

    #[test]
    fn an_agent_sending_as_agents_do_is_never_refused() {
        let mut budgets = NodeBudgets::default();
        // Telemetry every second and a task's three events every 10 ms
        // for ten minutes.
        for second in 0..600_u64 {
            let now = second * 1_000;
            assert!(budgets.admit("pi", Channel::Telemetry, now));
            for tick in 0..100 {
                for _ in 0..3 {
                    assert!(budgets.admit("pi", Channel::Events, now + tick * 10));
                }
            }
        }
    }

    #[test]
    fn a_clock_that_goes_back_earns_nothing_and_refuses_nothing_owed() {
        let mut budgets = NodeBudgets::default();
        for _ in 0..20 {
            assert!(budgets.admit("n", Channel::Status, 10_000));
        }
        assert!(!budgets.admit("n", Channel::Status, 10_000));
        assert!(
            !budgets.admit("n", Channel::Status, 5_000),
            "no tokens from going back"
        );
        assert!(
            budgets.admit("n", Channel::Status, 10_500),
            "half a second at 2/s"
        );
    }

    #[test]
    fn the_buckets_stay_bounded_whatever_the_node_ids() {
        let mut budgets = NodeBudgets::default();
        for i in 0..(MAX_BUCKETS * 2) {
            budgets.admit(&format!("node-{i}"), Channel::Telemetry, 0);
            assert!(budgets.len() <= MAX_BUCKETS);
        }
        // Quiet long enough to have their whole burst back, the old ones
        // are swept when room is needed; the busy one stays.
        let mut budgets = NodeBudgets::default();
        for i in 0..(MAX_BUCKETS - 1) {
            budgets.admit(&format!("node-{i}"), Channel::Telemetry, 0);
        }
        budgets.admit("busy", Channel::Telemetry, 600_000);
        budgets.admit("late", Channel::Telemetry, 600_000);
        assert_eq!(budgets.len(), 2, "only the busy and the late one");
    }
}
