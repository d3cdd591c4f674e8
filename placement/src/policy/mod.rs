//! The policy trait every placement strategy implements and the decisions it
//! returns (each with an explanation people can read); `catalog` builds them
//! by name.
//!
//! A policy is handed a snapshot ([`ClusterView`]) and the pending queue, and
//! returns one [`Decision`] per queued task, in the queue's order. Within one call
//! it accounts its own placements (a task placed early in the queue occupies its
//! node for the tasks after it), but it never changes the view: the caller commits
//! what it actually dispatched.

mod baselines;
mod heuristic;
mod published;

use serde::{Deserialize, Serialize};

use crate::estimate::{self, FilterTally, Incompatible};
use crate::model::correction::CorrectionSource;
use crate::model::{ClusterView, NodeLoad, NodeView, PendingTask};

pub use baselines::{
    EarliestFinishPolicy, KubernetesPolicy, LeastLoadedPolicy, RandomPolicy, RoundRobinPolicy,
    StaticOptimisationPolicy,
};
pub(crate) use heuristic::{order, Index};
pub use heuristic::{HeuristicPolicy, HeuristicTuning, SearchMode};
pub use published::{
    EdgeCloudSimDefaultPolicy, PureEdgeSimRoundRobinPolicy, PureEdgeSimTradeOffPolicy,
};

/// A placement strategy.
pub trait Policy: Send {
    /// The policy's registry name.
    fn name(&self) -> &'static str;
    /// One decision per queued task, in the queue's order.
    fn decide(&mut self, view: &ClusterView, queue: &[PendingTask]) -> Vec<Decision>;
}

/// What a policy decided for one task.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Decision {
    /// The task's key, echoed from [`PendingTask::key`].
    pub task_key: u64,
    /// Where it goes, or why it waits.
    pub outcome: Outcome,
    /// Why, for people.
    pub explanation: Explanation,
}

/// Place a task, or hold it for a later round.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "outcome")]
pub enum Outcome {
    /// Run it on `view.nodes[node]` at `power_level`.
    Place {
        /// Index into [`ClusterView::nodes`].
        node: usize,
        /// Index into the node's power levels.
        power_level: u8,
    },
    /// Keep it pending.
    Hold {
        /// Why, for people.
        reason: String,
    },
}

/// Why a policy decided as it did: a summary, how many nodes it looked at and
/// why each one it ruled out was ruled out (counts per reason, with a few
/// example nodes), and the best alternatives it scored. Bounded whatever the
/// fleet's size: one entry per filter reason with at most
/// [`FILTER_EXAMPLES`](crate::estimate::FILTER_EXAMPLES) nodes each, and at
/// most three alternatives.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Explanation {
    /// The policy's name.
    pub policy: String,
    /// One line for people.
    pub summary: String,
    /// Nodes the policy looked at for this task: filtered out, or scored.
    /// A full scan looks at every node; the indexed search (the heuristic's
    /// and the learned policies' shortlist) counts whole hardware groups that
    /// a filter rules out, the offline nodes, and the nodes it shortlisted or
    /// drew, and leaves out the compatible nodes that wait longer than the
    /// ones it shortlisted. Absent (0) in explanations stored before it existed.
    #[serde(default)]
    pub considered: u32,
    /// The nodes ruled out, by reason: most first, then by reason.
    #[serde(default)]
    pub filtered: Vec<FilterCount>,
    /// The best candidates it considered, best first (the chosen one first when placed).
    pub alternatives: Vec<Alternative>,
}

/// Nodes ruled out for one reason.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FilterCount {
    /// The hard constraint that failed or the dimension exhausted, as a
    /// stable code ([`Incompatible::code`]): `offline`, `runtime`, `arch`,
    /// `labels`, `gpu`, `gpu_kind`, `gpu_memory`, `fp64`, `memory`,
    /// `energy_budget`.
    pub reason: String,
    /// How many nodes.
    pub count: u32,
    /// The first few of them (at most
    /// [`FILTER_EXAMPLES`](crate::estimate::FILTER_EXAMPLES)), by id.
    pub nodes: Vec<String>,
}

/// The tally's reasons as an explanation lists them: node ids for the
/// examples, most frequent reason first, ties by code. Allocates per reason
/// present and per example, never per node.
pub(crate) fn filter_counts(view: &ClusterView, tally: &FilterTally) -> Vec<FilterCount> {
    let present = Incompatible::ALL
        .iter()
        .filter(|reason| tally.sample(**reason).count() > 0)
        .count();
    // Sized up front: this runs once per decision, and a regrown vector is
    // a second allocation.
    let mut counts = Vec::with_capacity(present);
    for reason in Incompatible::ALL {
        let sample = tally.sample(reason);
        if sample.count() == 0 {
            continue;
        }
        let mut nodes = Vec::with_capacity(sample.examples().len());
        nodes.extend(
            sample
                .examples()
                .iter()
                .filter_map(|node| view.nodes.get(*node as usize))
                .map(|node| node.id.to_string()),
        );
        counts.push(FilterCount {
            reason: reason.code().to_owned(),
            count: sample.count(),
            nodes,
        });
    }
    counts.sort_by(|a, b| b.count.cmp(&a.count).then_with(|| a.reason.cmp(&b.reason)));
    counts
}

/// One candidate (node, power level) a policy scored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Alternative {
    /// The node's id.
    pub node_id: String,
    /// The power level considered.
    pub power_level: u8,
    /// The policy's score; higher is better.
    pub score: f64,
    /// Estimated finish, ms on the view's clock.
    pub finish_ms: Option<f64>,
    /// Estimated dynamic energy, joules.
    pub energy_joules: Option<f64>,
    /// What stood out, for people.
    pub note: String,
}

/// One node and power level evaluated for a task.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Candidate {
    pub node: usize,
    pub power_level: u8,
    pub finish_ms: f64,
    pub energy_joules: f64,
    pub score: f64,
    /// Whether it meets the policy's idea of feasible (the heuristic: the deadline
    /// with margin); feasible candidates rank above all infeasible ones.
    pub feasible: bool,
}

impl Candidate {
    fn beats(&self, other: &Candidate) -> bool {
        (self.feasible, self.score) > (other.feasible, other.score)
    }
}

/// One decision round: the view, plus the loads the round's own placements add.
pub(crate) struct Round<'a> {
    pub view: &'a ClusterView,
    pub loads: Vec<NodeLoad>,
    pub now_ms: f64,
}

impl<'a> Round<'a> {
    pub fn new(view: &'a ClusterView) -> Self {
        Self {
            view,
            loads: view.loads(),
            now_ms: view.now_ms as f64,
        }
    }

    pub fn node(&self, index: usize) -> Option<(&'a NodeView, &NodeLoad)> {
        Some((self.view.nodes.get(index)?, self.loads.get(index)?))
    }

    /// Evaluates one node at one level; `None` when a hard filter fails. The
    /// node is counted in the tally, filtered or passed: call it once per
    /// node and task (further levels of the same node go through
    /// [`Round::try_level`]).
    pub fn evaluate(
        &self,
        index: usize,
        task: &PendingTask,
        power_level: u8,
        tally: &mut FilterTally,
    ) -> Option<Candidate> {
        let (node, load) = self.node(index)?;
        if let Err(reason) = estimate::check(node, load, task, power_level) {
            tally.add(reason, index);
            return None;
        }
        tally.pass();
        Some(self.candidate(node, load, index, task, power_level))
    }

    /// Evaluates one node at one level without counting it anywhere: another
    /// level of a node already counted.
    pub fn try_level(
        &self,
        index: usize,
        task: &PendingTask,
        power_level: u8,
    ) -> Option<Candidate> {
        let (node, load) = self.node(index)?;
        estimate::check(node, load, task, power_level).ok()?;
        Some(self.candidate(node, load, index, task, power_level))
    }

    /// The estimates for a node that passed the filters at `power_level`.
    // Inlined into both callers, as it was when `evaluate` built the
    // candidate itself: out of line, the estimates it calls stopped being
    // inlined too, and the full-scan baselines decided 25% slower
    // (`cargo bench -p starling-placement --bench decide`).
    #[inline(always)]
    fn candidate(
        &self,
        node: &NodeView,
        load: &NodeLoad,
        index: usize,
        task: &PendingTask,
        power_level: u8,
    ) -> Candidate {
        Candidate {
            node: index,
            power_level,
            finish_ms: estimate::finish_ms(node, load, task, power_level, self.now_ms),
            energy_joules: estimate::energy_joules(node, task, power_level),
            score: 0.0,
            feasible: true,
        }
    }

    /// Accounts a placement made in this round.
    pub fn commit(&mut self, candidate: &Candidate, task: &PendingTask) {
        let Some(node) = self.view.nodes.get(candidate.node) else {
            return;
        };
        if let Some(load) = self.loads.get_mut(candidate.node) {
            load.commit(
                node,
                task,
                candidate.power_level,
                self.now_ms,
                candidate.finish_ms,
            );
        }
    }

    /// The alternative a candidate shows in an explanation.
    pub fn alternative(&self, candidate: &Candidate, task: &PendingTask) -> Alternative {
        let (id, note) = match self.view.nodes.get(candidate.node) {
            Some(node) => {
                let deadline = match task.deadline_ms {
                    Some(deadline) if candidate.finish_ms <= deadline as f64 => {
                        format!(
                            "meets deadline with {:.0} ms slack",
                            deadline as f64 - candidate.finish_ms
                        )
                    }
                    Some(deadline) => format!(
                        "misses deadline by {:.0} ms",
                        candidate.finish_ms - deadline as f64
                    ),
                    None => "no deadline".to_owned(),
                };
                let state = self
                    .loads
                    .get(candidate.node)
                    .map(|load| load.queue_state(node))
                    .unwrap_or_else(|| node.queue_state());
                // An estimate corrected by what ran there says so, and by how
                // much: a person reading why can tell a measured number from a
                // modelled one.
                let (correction, source) = node.corrections.for_task(task);
                let learned = match source {
                    CorrectionSource::None => String::new(),
                    CorrectionSource::Class => format!(
                        "; run time ×{:.2} learned from {} attempts of its class here",
                        correction.factor(),
                        correction.samples
                    ),
                    CorrectionSource::Artifact => format!(
                        "; run time ×{:.2} learned from {} attempts of its artifact here",
                        correction.factor(),
                        correction.samples
                    ),
                    CorrectionSource::FleetClass => format!(
                        "; run time ×{:.2} as other nodes measured its class (none ran here)",
                        correction.factor()
                    ),
                    CorrectionSource::FleetArtifact => format!(
                        "; run time ×{:.2} as other nodes measured its artifact (it never ran here)",
                        correction.factor()
                    ),
                };
                (
                    node.id.to_string(),
                    format!(
                        "{deadline}; {} queued, {:.1} s backlog{learned}",
                        state.queued_tasks, state.backlog_s
                    ),
                )
            }
            None => (String::new(), String::new()),
        };
        // Rounded: these are for people, and stable text makes explanations diffable.
        let round3 = |value: f64| (value * 1000.0).round() / 1000.0;
        Alternative {
            node_id: id,
            power_level: candidate.power_level,
            score: round3(candidate.score),
            finish_ms: Some(round3(candidate.finish_ms)),
            energy_joules: Some(round3(candidate.energy_joules)),
            note,
        }
    }
}

/// The best few candidates by score, kept without sorting the whole set.
#[derive(Debug, Clone, Default)]
pub(crate) struct TopCandidates {
    best: Vec<Candidate>,
}

/// How many alternatives an explanation lists.
pub(crate) const ALTERNATIVES_SHOWN: usize = 3;

impl TopCandidates {
    /// Offers a candidate; ties keep the earlier one (lower node index first).
    /// A candidate whose score, finish or energy is not a finite number is
    /// dropped: NaN compares false with everything, so once kept it would
    /// never be displaced (and a node reporting nonsense would attract work).
    pub fn offer(&mut self, candidate: Candidate) {
        if !(candidate.score.is_finite()
            && candidate.finish_ms.is_finite()
            && candidate.energy_joules.is_finite())
        {
            return;
        }
        if self.best.len() == ALTERNATIVES_SHOWN
            && self
                .best
                .last()
                .is_some_and(|worst| !candidate.beats(worst))
        {
            return;
        }
        let position = self
            .best
            .iter()
            .position(|kept| candidate.beats(kept))
            .unwrap_or(self.best.len());
        self.best.insert(position, candidate);
        self.best.truncate(ALTERNATIVES_SHOWN);
    }

    pub fn first(&self) -> Option<&Candidate> {
        self.best.first()
    }

    pub fn iter(&self) -> impl Iterator<Item = &Candidate> {
        self.best.iter()
    }
}

/// Finishes a decision: places the best candidate (committing it to the round), or
/// holds the task with the filters' tally as the reason.
pub(crate) fn conclude(
    round: &mut Round<'_>,
    policy: &str,
    task: &PendingTask,
    top: &TopCandidates,
    tally: &FilterTally,
    why: &str,
) -> Decision {
    let alternatives: Vec<Alternative> = top
        .iter()
        .map(|candidate| round.alternative(candidate, task))
        .collect();
    match top.first().copied() {
        Some(best) => {
            round.commit(&best, task);
            let node_id = alternatives
                .first()
                .map(|alternative| alternative.node_id.clone())
                .unwrap_or_default();
            Decision {
                task_key: task.key,
                outcome: Outcome::Place {
                    node: best.node,
                    power_level: best.power_level,
                },
                explanation: Explanation {
                    policy: policy.to_owned(),
                    summary: format!(
                        "{node_id} at power level {}: {why}; finish in {:.0} ms, {:.2} J",
                        best.power_level,
                        (best.finish_ms - round.now_ms).max(0.0),
                        best.energy_joules
                    ),
                    considered: tally.considered(),
                    filtered: filter_counts(round.view, tally),
                    alternatives,
                },
            }
        }
        None => hold(round.view, task, policy, tally),
    }
}

/// A hold for want of any compatible node.
pub(crate) fn hold(
    view: &ClusterView,
    task: &PendingTask,
    policy: &str,
    tally: &FilterTally,
) -> Decision {
    let reason = format!("no compatible node: {}", tally.describe());
    Decision {
        task_key: task.key,
        outcome: Outcome::Hold {
            reason: reason.clone(),
        },
        explanation: Explanation {
            policy: policy.to_owned(),
            summary: format!("held: {reason}"),
            considered: tally.considered(),
            filtered: filter_counts(view, tally),
            alternatives: Vec::new(),
        },
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use crate::catalog::{policy_by_name, ABLATION_POLICIES, POLICY_NAMES};
    use crate::learned::HIRL_FULL_POWER;
    use crate::model::TaskClass;
    use crate::testing::{node, task};

    fn two_nodes() -> ClusterView {
        let fast = node("fast", 4.0, 1.0);
        let mut slow = node("slow", 4.0, 0.5);
        slow.load.backlog_cpu_s = 8.0;
        slow.load.queued_tasks = 2;
        ClusterView {
            now_ms: 10_000,
            nodes: vec![fast, slow],
        }
    }

    #[test]
    fn unknown_policy_names_the_valid_ones() {
        let error = policy_by_name("fastest", 0).err().unwrap();
        let text = error.to_string();
        assert!(text.contains("\"fastest\""), "{text}");
        for name in POLICY_NAMES.iter().chain(ABLATION_POLICIES) {
            assert!(text.contains(name), "{text}");
            assert_eq!(policy_by_name(name, 0).unwrap().name(), *name);
        }
        assert_eq!(POLICY_NAMES[0], "heuristic");
        assert!(
            !POLICY_NAMES.contains(&HIRL_FULL_POWER),
            "ablations run only when named"
        );
    }

    #[test]
    fn least_loaded_picks_the_smallest_backlog_at_full_power() {
        let mut view = two_nodes();
        view.nodes[0].load.backlog_cpu_s = 20.0;
        let decisions = LeastLoadedPolicy.decide(&view, &[task(1, TaskClass::Cpu)]);
        assert_eq!(
            decisions[0].outcome,
            Outcome::Place {
                node: 1,
                power_level: 1
            }
        );
    }

    #[test]
    fn heuristic_lowers_the_power_level_when_the_deadline_allows() {
        let view = two_nodes();
        let mut loose = task(1, TaskClass::Cpu);
        loose.deadline_ms = Some(view.now_ms + 30_000);
        let mut tight = task(2, TaskClass::Cpu);
        tight.deadline_ms = Some(view.now_ms + 1_600);
        let mut policy = policy_by_name("heuristic", 3).unwrap();
        let decisions = policy.decide(&view, &[loose, tight]);
        assert_eq!(
            decisions[0].outcome,
            Outcome::Place {
                node: 0,
                power_level: 0
            },
            "{:?}",
            decisions[0].explanation
        );
        assert_eq!(
            decisions[1].outcome,
            Outcome::Place {
                node: 0,
                power_level: 1
            },
            "{:?}",
            decisions[1].explanation
        );
    }

    fn scored(node: usize, score: f64) -> Candidate {
        Candidate {
            node,
            power_level: 0,
            finish_ms: 1_000.0,
            energy_joules: 1.0,
            score,
            feasible: true,
        }
    }

    #[test]
    fn top_candidates_never_keep_a_non_finite_score() {
        for bad in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
            let mut top = TopCandidates::default();
            top.offer(scored(0, bad));
            top.offer(scored(1, -5.0));
            top.offer(scored(2, -1.0));
            let kept: Vec<usize> = top.iter().map(|candidate| candidate.node).collect();
            assert_eq!(kept, vec![2, 1], "score {bad}");
            let mut late = TopCandidates::default();
            late.offer(scored(1, -5.0));
            late.offer(scored(0, bad));
            assert_eq!(late.first().map(|candidate| candidate.node), Some(1));
        }
        let mut top = TopCandidates::default();
        top.offer(Candidate {
            finish_ms: f64::NAN,
            ..scored(0, -1.0)
        });
        assert!(top.first().is_none(), "a NaN finish is not a candidate");
    }

    /// A node whose figures make its score NaN (listed first, where a NaN
    /// kept among the top candidates would win) is never chosen.
    #[test]
    fn no_policy_places_on_a_node_whose_score_is_nan() {
        // Otherwise the better node: 16 times the cores, 4 times the speed.
        for field in 0..2 {
            let mut broken = node("broken", 64.0, 4.0);
            // The estimates absorb most NaN inputs (`max` with a floor); these
            // two reach the score: a NaN loss makes the transfer time NaN, a
            // NaN backlog the crowding charge.
            match field {
                0 => broken.network.loss = f64::NAN,
                _ => broken.load.backlog_cpu_s = f64::NAN,
            }
            let view = ClusterView {
                now_ms: 10_000,
                nodes: vec![broken, node("sound", 4.0, 1.0)],
            };
            let mut due = task(1, TaskClass::Cpu);
            due.deadline_ms = Some(view.now_ms + 30_000);
            let queue = [task(2, TaskClass::Cpu), due];
            for name in ["heuristic", "heuristic-exhaustive"] {
                let decisions = policy_by_name(name, 0).unwrap().decide(&view, &queue);
                for decision in decisions {
                    assert!(
                        matches!(decision.outcome, Outcome::Place { node: 1, .. }),
                        "{name}, field {field}: {:?}",
                        decision.explanation
                    );
                    assert!(
                        decision
                            .explanation
                            .alternatives
                            .iter()
                            .all(|alternative| alternative.node_id == "sound"),
                        "{name}, field {field}: {:?}",
                        decision.explanation
                    );
                }
            }
        }
    }

    #[test]
    fn holds_say_which_filters_failed() {
        let view = two_nodes();
        let mut t = task(9, TaskClass::Gpu);
        t.demand.gpu = true;
        for name in POLICY_NAMES.iter().chain(ABLATION_POLICIES) {
            let decisions = policy_by_name(name, 0).unwrap().decide(&view, &[t.clone()]);
            assert_eq!(
                decisions[0].outcome,
                Outcome::Hold {
                    reason: "no compatible node: 2 × no OpenCL device".to_owned()
                },
                "{name}"
            );
        }
    }

    #[test]
    fn explanation_text_snapshot() {
        let mut view = two_nodes();
        // Offline nodes: filtered, and (being offline) no part of the load
        // figures that set the heuristic's knobs, so the scores stay put.
        for id in ["gone-1", "gone-2"] {
            let mut gone = node(id, 4.0, 1.0);
            gone.online = false;
            view.nodes.push(gone);
        }
        let mut t = task(5, TaskClass::Cpu);
        t.deadline_ms = Some(view.now_ms + 30_000);
        let decision = policy_by_name("heuristic-exhaustive", 0)
            .unwrap()
            .decide(&view, &[t])
            .remove(0);
        let text = serde_json::to_string_pretty(&decision.explanation).unwrap();
        let expected = r#"{
  "policy": "heuristic-exhaustive",
  "summary": "fast at power level 0: least energy meeting the deadline; finish in 2091 ms, 2.50 J",
  "considered": 4,
  "filtered": [
    {
      "reason": "offline",
      "count": 2,
      "nodes": [
        "gone-1",
        "gone-2"
      ]
    }
  ],
  "alternatives": [
    {
      "node_id": "fast",
      "power_level": 0,
      "score": -24.826,
      "finish_ms": 12090.8,
      "energy_joules": 2.5,
      "note": "meets deadline with 27909 ms slack; 0 queued, 0.0 s backlog"
    },
    {
      "node_id": "slow",
      "power_level": 1,
      "score": -55.859,
      "finish_ms": 14005.8,
      "energy_joules": 10.0,
      "note": "meets deadline with 25994 ms slack; 2 queued, 2.0 s backlog"
    }
  ]
}"#;
        assert_eq!(text, expected);
    }

    /// Twelve nodes ruled out for three reasons, then two that fit (last,
    /// so that round robin walks past every other node first): seven with
    /// 32 MiB of memory, three of another architecture, two offline.
    fn mixed_fleet() -> ClusterView {
        let mut nodes = Vec::new();
        for number in 1..=7 {
            let mut small = node(&format!("small-{number}"), 4.0, 1.0);
            small.memory_bytes = 32 << 20;
            small.load.free_memory_bytes = 32 << 20;
            nodes.push(small);
        }
        for number in 1..=3 {
            let mut arm = node(&format!("arm-{number}"), 4.0, 1.0);
            arm.arch = "aarch64".to_owned();
            nodes.push(arm);
        }
        for number in 1..=2 {
            let mut gone = node(&format!("off-{number}"), 4.0, 1.0);
            gone.online = false;
            nodes.push(gone);
        }
        nodes.push(node("ok-1", 4.0, 1.0));
        nodes.push(node("ok-2", 4.0, 1.0));
        ClusterView {
            now_ms: 10_000,
            nodes,
        }
    }

    /// An x86_64 task needing 64 MiB.
    fn x86_task(key: u64) -> PendingTask {
        let mut t = task(key, TaskClass::Cpu);
        t.constraints.arch = Some("x86_64".to_owned());
        t
    }

    fn count(reason: &str, count: u32, nodes: &[&str]) -> FilterCount {
        FilterCount {
            reason: reason.to_owned(),
            count,
            nodes: nodes.iter().map(|node| (*node).to_owned()).collect(),
        }
    }

    #[test]
    fn a_placed_task_says_how_many_nodes_were_ruled_out_and_why() {
        let view = mixed_fleet();
        let expected = vec![
            count(
                "memory",
                7,
                &["small-1", "small-2", "small-3", "small-4", "small-5"],
            ),
            count("arch", 3, &["arm-1", "arm-2", "arm-3"]),
            count("offline", 2, &["off-1", "off-2"]),
        ];
        for name in POLICY_NAMES.iter().chain(ABLATION_POLICIES) {
            let decision = policy_by_name(name, 7)
                .unwrap()
                .decide(&view, &[x86_task(1)])
                .remove(0);
            let explanation = &decision.explanation;
            assert!(
                matches!(decision.outcome, Outcome::Place { node: 12 | 13, .. }),
                "{name}: {explanation:?}"
            );
            match *name {
                // A random draw looks at some nodes, each once, until one fits.
                "random" => {
                    let filtered: u32 = explanation.filtered.iter().map(|f| f.count).sum();
                    assert_eq!(explanation.considered, filtered + 1, "{explanation:?}");
                    for found in &explanation.filtered {
                        let full = expected.iter().find(|e| e.reason == found.reason).unwrap();
                        assert!(found.count <= full.count, "{explanation:?}");
                        let prefix = full.nodes[0].split('-').next().unwrap();
                        assert!(
                            found.nodes.iter().all(|node| node.starts_with(prefix)),
                            "{explanation:?}"
                        );
                    }
                }
                // Round robin stops at the first node that fits.
                "round-robin" => {
                    assert_eq!(explanation.considered, 13, "{explanation:?}");
                    assert_eq!(explanation.filtered, expected, "{name}");
                }
                // Every other policy accounts for every node: the indexed ones
                // count the ruled-out hardware groups and the offline nodes in
                // bulk, and shortlist both fitting nodes.
                _ => {
                    assert_eq!(explanation.considered, 14, "{name}: {explanation:?}");
                    assert_eq!(explanation.filtered, expected, "{name}");
                }
            }
        }
    }

    #[test]
    fn a_held_task_names_the_nodes_of_each_reason() {
        let mut view = mixed_fleet();
        // The two fitting nodes have 8 GiB but only 16 MiB free: the task's
        // 64 MiB are more than they have left, and more than the small nodes
        // have at all, so both count under memory.
        for fitting in &mut view.nodes[12..] {
            fitting.load.free_memory_bytes = 16 << 20;
        }
        let expected = vec![
            count(
                "memory",
                9,
                &["small-1", "small-2", "small-3", "small-4", "small-5"],
            ),
            count("arch", 3, &["arm-1", "arm-2", "arm-3"]),
            count("offline", 2, &["off-1", "off-2"]),
        ];
        for name in POLICY_NAMES.iter().chain(ABLATION_POLICIES) {
            let decision = policy_by_name(name, 7)
                .unwrap()
                .decide(&view, &[x86_task(1)])
                .remove(0);
            assert_eq!(
                decision.outcome,
                Outcome::Hold {
                    reason: "no compatible node: 9 × not enough free memory, 3 × architecture differs, 2 × node offline".to_owned()
                },
                "{name}"
            );
            assert_eq!(decision.explanation.considered, 14, "{name}");
            assert_eq!(decision.explanation.filtered, expected, "{name}");
            assert!(decision.explanation.alternatives.is_empty(), "{name}");
        }
    }

    #[test]
    fn filter_counts_sort_by_count_then_reason() {
        let view = mixed_fleet();
        let mut tally = FilterTally::default();
        tally.add(Incompatible::Runtime, 0);
        tally.add(Incompatible::Arch, 1);
        tally.add(Incompatible::Memory, 2);
        tally.add(Incompatible::Memory, 3);
        let reasons: Vec<(String, u32)> = filter_counts(&view, &tally)
            .into_iter()
            .map(|found| (found.reason, found.count))
            .collect();
        assert_eq!(
            reasons,
            vec![
                ("memory".to_owned(), 2),
                ("arch".to_owned(), 1),
                ("runtime".to_owned(), 1)
            ]
        );
    }

    #[test]
    fn a_ten_thousand_node_fleet_gives_a_small_explanation() {
        let mut nodes: Vec<NodeView> = (0..10_000)
            .map(|number| {
                let mut small = node(&format!("node-{number:05}"), 4.0, 1.0);
                small.load.free_memory_bytes = 1 << 20;
                small
            })
            .collect();
        nodes[9_999].load.free_memory_bytes = 8 << 30;
        let view = ClusterView {
            now_ms: 10_000,
            nodes,
        };
        for name in ["heuristic", "least-loaded"] {
            let decision = policy_by_name(name, 0)
                .unwrap()
                .decide(&view, &[task(1, TaskClass::Cpu)])
                .remove(0);
            assert!(
                matches!(decision.outcome, Outcome::Place { node: 9_999, .. }),
                "{name}"
            );
            let explanation = &decision.explanation;
            let memory = &explanation.filtered[0];
            assert_eq!(memory.reason, "memory");
            assert_eq!(memory.nodes.len(), crate::estimate::FILTER_EXAMPLES);
            if name == "least-loaded" {
                assert_eq!((explanation.considered, memory.count), (10_000, 9_999));
            }
            let json = serde_json::to_string(explanation).unwrap();
            assert!(json.len() < 2_000, "{name}: {} bytes", json.len());
        }
    }

    #[test]
    fn explanations_stored_before_the_counts_still_decode() {
        let old = r#"{"policy":"heuristic","summary":"held: no compatible node: 2 × no OpenCL device","alternatives":[]}"#;
        let explanation: Explanation = serde_json::from_str(old).unwrap();
        assert_eq!(explanation.considered, 0);
        assert!(explanation.filtered.is_empty());
        assert_eq!(explanation.policy, "heuristic");
    }
}
