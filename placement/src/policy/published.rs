//! The default placement policies of two published edge simulators, so that
//! their own setups (`placement/scenarios/pureedgesim-default.toml`,
//! `edgecloudsim-sample-app1.toml`) can be run with their own baselines.
//! Written from the upstream code's behaviour, not its text:
//!
//! - PureEdgeSim's `DefaultOrchestrator` (github.com/CharafeddineMechalikh/
//!   PureEdgeSim, `taskorchestrator/DefaultOrchestrator.java` at commit
//!   03bfc2e4): ROUND_ROBIN sends a task to the compatible node that has been
//!   sent the fewest tasks so far; TRADE_OFF to the one with the least
//!   (tasks sent + 1) × weight × length / MIPS per core, the weight 1.8 for
//!   the cloud, 1.3 for an edge device and 1.2 for an edge data centre.
//! - EdgeCloudSim's `BasicEdgeOrchestrator` as sample_app1 runs it
//!   (github.com/CagataySonmez/EdgeCloudSim, `edge_orchestrator/
//!   BasicEdgeOrchestrator.java` at commit 0c82e35b; NEXT_FIT, TWO_TIER_WITH_EO):
//!   a task goes to the cloud with its application's probability, there to the
//!   VM with the most free capacity; otherwise the edge hosts are tried in
//!   turn from the one after the last chosen, and the first with room for the
//!   task takes it.
//!
//! A node's tier comes from its `tier` label (`cloud`, `edge`, `device`); a
//! node without one counts as an edge device. All three run every task at the
//! node's highest power level: neither simulator's orchestrator chooses one.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::estimate::FilterTally;
use crate::model::{ClusterView, NodeView, PendingTask};
use crate::policy::{conclude, Candidate, Decision, Policy, Round, TopCandidates};

/// Where a node sits, from its `tier` label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Tier {
    Cloud,
    Edge,
    Device,
}

fn tier(node: &NodeView) -> Tier {
    let label = node
        .labels
        .iter()
        .find(|label| label.key.as_str() == "tier")
        .map(|label| label.value.as_str());
    match label {
        Some("cloud") => Tier::Cloud,
        Some("edge") => Tier::Edge,
        _ => Tier::Device,
    }
}

/// Every compatible node at full power, each counted once in the tally.
fn candidates(
    round: &Round<'_>,
    view: &ClusterView,
    task: &PendingTask,
    tally: &mut FilterTally,
) -> Vec<Candidate> {
    view.nodes
        .iter()
        .enumerate()
        .filter_map(|(index, node)| round.evaluate(index, task, node.top_power_level(), tally))
        .collect()
}

/// The tasks each node has been sent so far, grown to the view's size.
fn history_of(history: &mut Vec<u64>, view: &ClusterView) {
    if history.len() < view.nodes.len() {
        history.resize(view.nodes.len(), 0);
    }
}

/// PureEdgeSim's ROUND_ROBIN: the compatible node sent the fewest tasks so
/// far (ties: the lower index), at full power.
#[derive(Debug, Clone, Default)]
pub struct PureEdgeSimRoundRobinPolicy {
    sent: Vec<u64>,
}

impl Policy for PureEdgeSimRoundRobinPolicy {
    fn name(&self) -> &'static str {
        "pureedgesim-round-robin"
    }

    fn decide(&mut self, view: &ClusterView, queue: &[PendingTask]) -> Vec<Decision> {
        let name = self.name();
        decide_by_tasks_sent(
            &mut self.sent,
            view,
            queue,
            name,
            "fewest tasks sent so far (PureEdgeSim ROUND_ROBIN)",
            |_, _, sent| -sent,
        )
    }
}

/// PureEdgeSim's two policies alike: each compatible node scored by
/// `score(task, node, tasks sent to it so far)`, the best at full power, and
/// the count of the chosen node raised.
fn decide_by_tasks_sent(
    sent: &mut Vec<u64>,
    view: &ClusterView,
    queue: &[PendingTask],
    name: &'static str,
    why: &str,
    score: impl Fn(&PendingTask, &NodeView, f64) -> f64,
) -> Vec<Decision> {
    history_of(sent, view);
    let mut round = Round::new(view);
    let mut decisions = Vec::with_capacity(queue.len());
    for task in queue {
        let mut tally = FilterTally::default();
        let mut top = TopCandidates::default();
        for mut candidate in candidates(&round, view, task, &mut tally) {
            let Some(node) = view.nodes.get(candidate.node) else {
                continue;
            };
            let so_far = sent.get(candidate.node).copied().unwrap_or(0) as f64;
            candidate.score = score(task, node, so_far);
            top.offer(candidate);
        }
        if let Some(chosen) = top.first() {
            if let Some(count) = sent.get_mut(chosen.node) {
                *count += 1;
            }
        }
        decisions.push(conclude(&mut round, name, task, &top, &tally, why));
    }
    decisions
}

/// PureEdgeSim's TRADE_OFF: the least (sent + 1) × tier weight × the task's
/// time on one core, at full power.
#[derive(Debug, Clone, Default)]
pub struct PureEdgeSimTradeOffPolicy {
    sent: Vec<u64>,
}

impl Policy for PureEdgeSimTradeOffPolicy {
    fn name(&self) -> &'static str {
        "pureedgesim-trade-off"
    }

    fn decide(&mut self, view: &ClusterView, queue: &[PendingTask]) -> Vec<Decision> {
        let name = self.name();
        decide_by_tasks_sent(
            &mut self.sent,
            view,
            queue,
            name,
            "least (sent + 1) × tier weight × time (PureEdgeSim TRADE_OFF)",
            |task, node, sent| {
                let weight = match tier(node) {
                    Tier::Cloud => 1.8,
                    Tier::Device => 1.3,
                    Tier::Edge => 1.2,
                };
                -((sent + 1.0) * weight * task.work / node.cpu_speed.max(1e-9))
            },
        )
    }
}

/// EdgeCloudSim's default orchestrator in sample_app1: the cloud with a
/// probability, else the next edge host with room, at full power.
#[derive(Debug, Clone)]
pub struct EdgeCloudSimDefaultPolicy {
    rng: ChaCha8Rng,
    cloud_probability: f64,
    /// The node chosen last among the edge hosts.
    last: Option<usize>,
}

impl EdgeCloudSimDefaultPolicy {
    /// The policy drawing from a ChaCha stream seeded with `seed`, sending a
    /// task to the cloud with `cloud_probability`. Upstream draws it per
    /// application; a task here carries no application, so the scenario's
    /// arrival-weighted mean is used.
    pub fn new(seed: u64, cloud_probability: f64) -> Self {
        Self {
            rng: ChaCha8Rng::seed_from_u64(seed ^ 0x6563_7364_6566),
            cloud_probability: cloud_probability.clamp(0.0, 1.0),
            last: None,
        }
    }
}

impl Policy for EdgeCloudSimDefaultPolicy {
    fn name(&self) -> &'static str {
        "edgecloudsim-default"
    }

    fn decide(&mut self, view: &ClusterView, queue: &[PendingTask]) -> Vec<Decision> {
        let mut round = Round::new(view);
        let mut decisions = Vec::with_capacity(queue.len());
        let count = view.nodes.len();
        for task in queue {
            let mut tally = FilterTally::default();
            let found = candidates(&round, view, task, &mut tally);
            let to_cloud = self.rng.random_bool(self.cloud_probability);
            let has_room = |candidate: &Candidate| {
                round.node(candidate.node).is_some_and(|(_, load)| {
                    load.free_cpu_cores >= f64::from(task.demand.cpu_cores)
                })
            };
            let in_tier = |candidate: &Candidate, cloud: bool| {
                view.nodes
                    .get(candidate.node)
                    .is_some_and(|node| (tier(node) == Tier::Cloud) == cloud)
            };
            let chosen = if to_cloud {
                // The cloud VM with the most free capacity.
                found
                    .iter()
                    .filter(|candidate| in_tier(candidate, true) && has_room(candidate))
                    .max_by(|a, b| {
                        let free = |c: &Candidate| {
                            round
                                .node(c.node)
                                .map_or(0.0, |(_, load)| load.free_cpu_cores)
                        };
                        free(a).total_cmp(&free(b)).then(b.node.cmp(&a.node))
                    })
                    .copied()
            } else {
                // Next fit: the first host with room after the last chosen.
                let start = self.last.map_or(0, |last| last + 1);
                found
                    .iter()
                    .filter(|candidate| in_tier(candidate, false) && has_room(candidate))
                    .min_by_key(|candidate| {
                        let modulus = count.max(1);
                        (candidate.node + modulus - start % modulus) % modulus
                    })
                    .copied()
            };
            let mut top = TopCandidates::default();
            if let Some(candidate) = chosen {
                if !to_cloud {
                    self.last = Some(candidate.node);
                }
                top.offer(candidate);
            }
            decisions.push(conclude(
                &mut round,
                self.name(),
                task,
                &top,
                &tally,
                if to_cloud {
                    "cloud drawn; its VM with the most room (EdgeCloudSim)"
                } else {
                    "next edge host with room (EdgeCloudSim NEXT_FIT)"
                },
            ));
        }
        decisions
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use crate::model::TaskClass;
    use crate::policy::Outcome;
    use crate::testing::{node, task};
    use starling_proto::Label;

    fn with_tier(mut view: NodeView, tier: &str) -> NodeView {
        view.labels.push(Label::new("tier", tier).unwrap());
        view
    }

    fn placed(decision: &Decision) -> usize {
        match decision.outcome {
            Outcome::Place { node, .. } => node,
            Outcome::Hold { .. } => panic!("held: {:?}", decision.explanation),
        }
    }

    fn fleet() -> ClusterView {
        ClusterView {
            now_ms: 0,
            nodes: vec![
                with_tier(node("phone", 8.0, 2.5), "device"),
                with_tier(node("edge", 10.0, 4.0), "edge"),
                with_tier(node("cloud", 200.0, 4.0), "cloud"),
            ],
        }
    }

    #[test]
    fn round_robin_sends_to_the_node_sent_the_fewest_so_far() {
        let view = fleet();
        let mut policy = PureEdgeSimRoundRobinPolicy::default();
        let queue: Vec<_> = (0..5).map(|key| task(key, TaskClass::Cpu)).collect();
        let first: Vec<usize> = policy.decide(&view, &queue).iter().map(placed).collect();
        assert_eq!(first, vec![0, 1, 2, 0, 1]);
        // The history outlives the round: the cloud is behind by one.
        let next = policy.decide(&view, &queue[..1]);
        assert_eq!(placed(&next[0]), 2);
    }

    #[test]
    fn trade_off_weighs_tier_speed_and_history() {
        let view = fleet();
        let mut policy = PureEdgeSimTradeOffPolicy::default();
        let queue: Vec<_> = (0..4).map(|key| task(key, TaskClass::Cpu)).collect();
        let chosen: Vec<usize> = policy.decide(&view, &queue).iter().map(placed).collect();
        // Weights: edge 1.2/4 = 0.3, cloud 1.8/4 = 0.45, phone 1.3/2.5 = 0.52
        // per unit of work; each task sent multiplies a node's cost by
        // (sent + 1): edge 0.3, cloud 0.45, phone 0.52, edge 0.6.
        assert_eq!(chosen, vec![1, 2, 0, 1]);
    }

    #[test]
    fn edgecloudsim_default_tries_edge_hosts_in_turn_and_draws_the_cloud() {
        let mut view = fleet();
        view.nodes[0] = with_tier(node("edge-2", 4.0, 0.1), "edge");
        let queue: Vec<_> = (0..4).map(|key| task(key, TaskClass::Cpu)).collect();
        let mut never = EdgeCloudSimDefaultPolicy::new(1, 0.0);
        let chosen: Vec<usize> = never.decide(&view, &queue).iter().map(placed).collect();
        assert_eq!(chosen, vec![0, 1, 0, 1], "next fit over the edge hosts");
        let mut always = EdgeCloudSimDefaultPolicy::new(1, 1.0);
        let chosen: Vec<usize> = always.decide(&view, &queue).iter().map(placed).collect();
        assert_eq!(chosen, vec![2, 2, 2, 2], "the cloud when drawn");
        // A host with no free core is passed over.
        view.nodes[0].load.free_cpu_cores = 0.0;
        let chosen: Vec<usize> = never
            .decide(&view, &queue[..2])
            .iter()
            .map(placed)
            .collect();
        assert_eq!(chosen, vec![1, 1]);
    }
}
