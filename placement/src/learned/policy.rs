//! The learned policies behind the [`Policy`] trait: HiRL's hierarchy and the
//! single-DDQN baseline, with the exploration and recording the trainer uses.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::estimate::FilterTally;
use crate::learned::features::{self, FEATURES};
use crate::learned::model_file::{LearnedKind, ModelFile, PowerAction};
use crate::learned::network::{Mlp, Scratch};
use crate::model::{ClusterView, NodeView, PendingTask};
use crate::policy::{
    filter_counts, hold, order, Alternative, Candidate, Decision, Explanation, Index, Outcome,
    Policy, Round, ALTERNATIVES_SHOWN,
};

/// Least-waiting nodes taken from each hardware group for the shortlist.
const FROM_EACH_GROUP: usize = 3;
/// Nodes drawn at random on top of the groups' best.
const RANDOM_SAMPLE: usize = 6;

/// How a policy explores while it trains (off when it serves).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Exploration {
    /// Chance of placing on a random shortlisted candidate instead of the best.
    pub epsilon: f64,
    /// Standard deviation of the Gaussian noise added to the power actor's output.
    pub power_noise: f64,
}

/// One decision as the trainer needs it: what the network saw and what it did.
#[derive(Debug, Clone, PartialEq)]
pub struct DecisionRecord {
    /// The task's key.
    pub task_key: u64,
    /// Every candidate's features, `count × FEATURES`, in shortlist order.
    pub candidates: Vec<f32>,
    /// Which candidate was taken.
    pub chosen: usize,
    /// HiRL: the power actor's action (its state is the chosen candidate's
    /// features), noise included.
    pub power_action: Option<f32>,
}

impl DecisionRecord {
    /// The chosen candidate's features.
    pub fn chosen_features(&self) -> &[f32] {
        let start = self.chosen * FEATURES;
        self.candidates.get(start..start + FEATURES).unwrap_or(&[])
    }

    /// How many candidates there were.
    pub fn candidate_count(&self) -> usize {
        self.candidates.len() / FEATURES
    }
}

/// The power level HiRL's actor asks for: the lowest level at least as fast as
/// `speed_fraction` of the node's highest (the top level when none is).
pub fn level_for_speed(node: &NodeView, speed_fraction: f32) -> u8 {
    let wanted = f64::from(speed_fraction.clamp(0.0, 1.0));
    node.power_levels
        .iter()
        .position(|level| level.speed_factor + 1e-6 >= wanted)
        .and_then(|index| u8::try_from(index).ok())
        .unwrap_or_else(|| node.top_power_level())
}

/// The power level for a slack share (see [`PowerAction::SlackShare`]): the
/// lowest level of `node` whose estimated finish leaves at least `1 − share`
/// of the task's slack at full power, `top` (the candidate at the top level)
/// when there is no slack. A task without a deadline is given
/// [`NO_DEADLINE_SLACK_MS`] past its finish at full power.
fn level_for_slack_share(
    round: &Round<'_>,
    node_index: usize,
    task: &PendingTask,
    top: &Candidate,
    share: f32,
) -> u8 {
    let share = f64::from(share.clamp(0.0, 1.0));
    let deadline = task
        .deadline_ms
        .map_or(top.finish_ms + NO_DEADLINE_SLACK_MS, |deadline| {
            deadline as f64
        });
    let slack = deadline - top.finish_ms;
    if slack <= 0.0 {
        return top.power_level;
    }
    let latest = top.finish_ms + share * slack;
    (0..top.power_level)
        .find(|level| {
            round
                .try_level(node_index, task, *level)
                .is_some_and(|candidate| candidate.finish_ms <= latest)
        })
        .unwrap_or(top.power_level)
}

/// Slack assumed for a task without a deadline, ms: what a slack share of 1
/// may spend of it.
pub const NO_DEADLINE_SLACK_MS: f64 = 60_000.0;

/// A learned placement policy: `hirl` (DDQN placement, then TD3 power) or `ddqn`
/// (one DDQN over (node, level) pairs).
///
/// Hard constraints are never learned: only candidates that pass every filter
/// are scored, so a learned policy can place badly but never illegally.
#[derive(Debug, Clone)]
pub struct LearnedPolicy {
    kind: LearnedKind,
    placement: Mlp,
    power: Option<Mlp>,
    rng: ChaCha8Rng,
    scratch: Scratch,
    exploration: Option<Exploration>,
    recording: bool,
    records: Vec<DecisionRecord>,
    /// HiRL's placement alone: the power actor is not asked, every task runs
    /// at its node's top level (the ablation that shows the actor's share).
    full_power: bool,
    power_action: PowerAction,
}

/// The registry name of HiRL's placement network run without its power actor.
pub const HIRL_FULL_POWER: &str = "hirl-full-power";

impl LearnedPolicy {
    /// A policy driven by a checked model; `seed` feeds the shortlist's sample.
    pub fn new(model: &ModelFile, seed: u64) -> Self {
        Self::from_networks(
            model.policy,
            model.networks.placement.clone(),
            model.networks.power.clone(),
            seed,
        )
        .with_power_action(model.networks.power_action)
    }

    /// A policy from bare networks (the trainer's, between updates). The networks
    /// must take [`FEATURES`] inputs; HiRL without a power network runs at full power.
    pub fn from_networks(kind: LearnedKind, placement: Mlp, power: Option<Mlp>, seed: u64) -> Self {
        Self {
            kind,
            placement,
            power,
            rng: ChaCha8Rng::seed_from_u64(seed ^ 0x006c_6561_726e),
            scratch: Scratch::default(),
            exploration: None,
            recording: false,
            records: Vec::new(),
            full_power: false,
            power_action: PowerAction::Speed,
        }
    }

    /// Sets what the power actor's output means (a model file says; see
    /// [`PowerAction`]).
    pub fn with_power_action(mut self, action: PowerAction) -> Self {
        self.power_action = action;
        self
    }

    /// HiRL's placement alone ([`HIRL_FULL_POWER`]): the power actor is never
    /// asked and every task runs at full power. No effect on `ddqn`, whose
    /// levels are part of its placement.
    pub fn at_full_power(mut self) -> Self {
        self.full_power = self.kind == LearnedKind::Hirl;
        self
    }

    /// Replaces the networks (the trainer, after an update).
    pub fn set_networks(&mut self, placement: Mlp, power: Option<Mlp>) {
        self.placement = placement;
        self.power = power;
    }

    /// Turns exploration on (`Some`) or off.
    pub fn set_exploration(&mut self, exploration: Option<Exploration>) {
        self.exploration = exploration;
    }

    /// Turns recording of decisions on or off.
    pub fn set_recording(&mut self, recording: bool) {
        self.recording = recording;
    }

    /// The decisions recorded since the last call, in decision order.
    pub fn take_records(&mut self) -> Vec<DecisionRecord> {
        std::mem::take(&mut self.records)
    }

    /// Which policy this is.
    pub fn kind(&self) -> LearnedKind {
        self.kind
    }

    fn levels(&self, node: &NodeView) -> core::ops::RangeInclusive<u8> {
        let top = node.top_power_level();
        match self.kind {
            LearnedKind::Hirl => top..=top,
            LearnedKind::Ddqn => 0..=top,
        }
    }

    /// Evaluates the candidates on `nodes`, appending them and their
    /// features, and counts each node in `tally` unless the shortlist's
    /// `index` already counted it.
    #[allow(clippy::too_many_arguments)] // one call's scratch buffers, reused across tasks
    fn gather(
        &self,
        round: &Round<'_>,
        task: &PendingTask,
        nodes: &[usize],
        index: Option<&Index>,
        tally: &mut FilterTally,
        candidates: &mut Vec<Candidate>,
        feats: &mut Vec<f32>,
    ) {
        for &position in nodes {
            let Some((node, load)) = round.node(position) else {
                continue;
            };
            let counted = index.is_some_and(|index| index.counted(position));
            // One count per node in the tally, however many levels it has.
            let mut any = false;
            for level in self.levels(node) {
                if let Some(candidate) = round.try_level(position, task, level) {
                    any = true;
                    candidates.push(candidate);
                    feats.extend_from_slice(&features::candidate(
                        node,
                        load,
                        task,
                        level,
                        round.now_ms,
                    ));
                }
            }
            if counted {
                continue;
            }
            if any {
                tally.pass();
            } else {
                // Fails again, and says why.
                let _ = round.evaluate(position, task, node.top_power_level(), tally);
            }
        }
    }
}

impl Policy for LearnedPolicy {
    fn name(&self) -> &'static str {
        if self.full_power {
            HIRL_FULL_POWER
        } else {
            self.kind.as_str()
        }
    }

    fn decide(&mut self, view: &ClusterView, queue: &[PendingTask]) -> Vec<Decision> {
        let name = self.name();
        let mut round = Round::new(view);
        let mut index = Index::build(&round);
        let mut decisions: Vec<Option<Decision>> = vec![None; queue.len()];
        let count = view.nodes.len();
        let mut shortlist = Vec::new();
        let mut candidates = Vec::new();
        let mut feats = Vec::new();
        for position in order(view, queue) {
            let task = &queue[position];
            let mut tally = FilterTally::default();
            shortlist.clear();
            candidates.clear();
            feats.clear();
            index.candidates(&round, task, FROM_EACH_GROUP, &mut shortlist, &mut tally);
            if count > 0 {
                for _ in 0..RANDOM_SAMPLE {
                    shortlist.push(self.rng.random_range(0..count));
                }
            }
            shortlist.sort_unstable();
            shortlist.dedup();
            self.gather(
                &round,
                task,
                &shortlist,
                Some(&index),
                &mut tally,
                &mut candidates,
                &mut feats,
            );
            if candidates.is_empty() {
                // The shortlist can miss the only nodes that fit; look at all.
                tally = FilterTally::default();
                let all: Vec<usize> = (0..count).collect();
                self.gather(
                    &round,
                    task,
                    &all,
                    None,
                    &mut tally,
                    &mut candidates,
                    &mut feats,
                );
            }
            if candidates.is_empty() {
                decisions[position] = Some(hold(view, task, name, &tally));
                continue;
            }
            for (candidate, row) in candidates.iter_mut().zip(feats.chunks_exact(FEATURES)) {
                candidate.score = f64::from(self.placement.forward1(row, &mut self.scratch));
            }
            let best = candidates
                .iter()
                .enumerate()
                .max_by(|(a_index, a), (b_index, b)| {
                    a.score.total_cmp(&b.score).then(b_index.cmp(a_index))
                })
                .map_or(0, |(position, _)| position);
            let mut chosen = best;
            let mut explored = false;
            if let Some(exploration) = self.exploration {
                if self.rng.random_bool(exploration.epsilon.clamp(0.0, 1.0)) {
                    chosen = self.rng.random_range(0..candidates.len());
                    explored = chosen != best;
                }
            }
            let Some(mut picked) = candidates.get(chosen).copied() else {
                decisions[position] = Some(hold(view, task, name, &tally));
                continue;
            };
            let chosen_features = feats
                .get(chosen * FEATURES..(chosen + 1) * FEATURES)
                .unwrap_or(&[]);
            let mut power_action = None;
            let actor = self.power.as_ref().filter(|_| !self.full_power);
            if let (LearnedKind::Hirl, Some(power)) = (self.kind, actor) {
                let mut action = power.forward1(chosen_features, &mut self.scratch);
                if let Some(exploration) = self.exploration {
                    action +=
                        (crate::sample::normal(&mut self.rng) * exploration.power_noise) as f32;
                    action = action.clamp(0.0, 1.0);
                }
                power_action = Some(action);
                let level = match self.power_action {
                    PowerAction::Speed => round
                        .node(picked.node)
                        .map(|(node, _)| level_for_speed(node, action)),
                    PowerAction::SlackShare => Some(level_for_slack_share(
                        &round,
                        picked.node,
                        task,
                        &picked,
                        action,
                    )),
                };
                if let Some(level) = level.filter(|level| *level != picked.power_level) {
                    if let Some(mut at_level) = round.try_level(picked.node, task, level) {
                        at_level.score = picked.score;
                        picked = at_level;
                    }
                }
            }
            if self.recording {
                self.records.push(DecisionRecord {
                    task_key: task.key,
                    candidates: feats.clone(),
                    chosen,
                    power_action,
                });
            }
            let mut ranked: Vec<usize> = (0..candidates.len()).filter(|i| *i != chosen).collect();
            ranked.sort_by(|a, b| candidates[*b].score.total_cmp(&candidates[*a].score));
            let mut alternatives: Vec<Alternative> = vec![round.alternative(&picked, task)];
            alternatives.extend(
                ranked
                    .iter()
                    .take(ALTERNATIVES_SHOWN - 1)
                    .map(|i| round.alternative(&candidates[*i], task)),
            );
            round.commit(&picked, task);
            index.update(&round, picked.node);
            let node_id = alternatives
                .first()
                .map(|alternative| alternative.node_id.clone())
                .unwrap_or_default();
            let how = match (self.kind, power_action) {
                (LearnedKind::Hirl, Some(action)) => format!(
                    "DDQN value {:.3}, the best of {} nodes; TD3 power actor asked for {:.0}% {}",
                    picked.score,
                    candidates.len(),
                    action * 100.0,
                    match self.power_action {
                        PowerAction::Speed => "speed",
                        PowerAction::SlackShare => "of the slack",
                    }
                ),
                _ => format!(
                    "DDQN value {:.3}, the best of {} (node, level) pairs",
                    picked.score,
                    candidates.len()
                ),
            };
            let how = if explored {
                format!("exploring (trainer): {how}")
            } else {
                how
            };
            decisions[position] = Some(Decision {
                task_key: task.key,
                outcome: Outcome::Place {
                    node: picked.node,
                    power_level: picked.power_level,
                },
                explanation: Explanation {
                    policy: name.to_owned(),
                    summary: format!(
                        "{node_id} at power level {}: {how}; finish in {:.0} ms, {:.2} J",
                        picked.power_level,
                        (picked.finish_ms - round.now_ms).max(0.0),
                        picked.energy_joules
                    ),
                    considered: tally.considered(),
                    filtered: filter_counts(view, &tally),
                    alternatives,
                },
            });
        }
        decisions
            .into_iter()
            .zip(queue)
            .map(|(decision, task)| {
                decision.unwrap_or_else(|| hold(view, task, name, &FilterTally::default()))
            })
            .collect()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use crate::learned::shipped;
    use crate::model::TaskClass;
    use crate::testing::{node, task};

    #[test]
    fn learned_policies_place_only_where_the_filters_allow_and_record() {
        let mut small = node("small", 2.0, 1.0);
        small.memory_bytes = 1 << 20;
        small.load.free_memory_bytes = 1 << 20;
        let big = node("big", 4.0, 1.0);
        let view = ClusterView {
            now_ms: 0,
            nodes: vec![small, big],
        };
        let queue: Vec<PendingTask> = (0..4).map(|key| task(key, TaskClass::Cpu)).collect();
        for kind in LearnedKind::ALL {
            let mut policy = LearnedPolicy::new(&shipped(kind).unwrap(), 1);
            policy.set_recording(true);
            policy.set_exploration(Some(Exploration {
                epsilon: 1.0,
                power_noise: 0.5,
            }));
            let decisions = policy.decide(&view, &queue);
            assert_eq!(decisions.len(), 4);
            for decision in &decisions {
                assert!(
                    matches!(decision.outcome, Outcome::Place { node: 1, .. }),
                    "{kind:?}: 64 MiB tasks never go to the 1 MiB node: {decision:?}"
                );
                assert_eq!(decision.explanation.policy, kind.as_str());
            }
            let records = policy.take_records();
            assert_eq!(records.len(), 4);
            let pairs = match kind {
                LearnedKind::Hirl => 1,
                LearnedKind::Ddqn => 2,
            };
            assert_eq!(records[0].candidate_count(), pairs, "{kind:?}");
            assert_eq!(records[0].power_action.is_some(), kind == LearnedKind::Hirl);
            assert!(policy.take_records().is_empty());
        }
    }

    #[test]
    fn a_slack_share_spends_that_share_of_the_slack_and_never_the_deadline() {
        // 1 s of work on a reference core: ~1.09 s to finish at full power
        // (transfers included), ~2.09 s at the half-speed level.
        let view = ClusterView {
            now_ms: 0,
            nodes: vec![node("n", 4.0, 1.0)],
        };
        let round = Round::new(&view);
        let level = |deadline_ms: Option<u64>, share: f32| {
            let mut t = task(1, TaskClass::Cpu);
            t.deadline_ms = deadline_ms;
            let top = round.try_level(0, &t, 1).unwrap();
            level_for_slack_share(&round, 0, &t, &top, share)
        };
        // Plenty of slack (about 8.9 s): a fifth of it covers the slow level,
        // a twentieth does not, and none keeps the top.
        assert_eq!(level(Some(10_000), 0.2), 0);
        assert_eq!(level(Some(10_000), 0.05), 1);
        assert_eq!(level(Some(10_000), 0.0), 1);
        // The slow level would miss a 1.5 s deadline even with all the slack.
        assert_eq!(level(Some(1_500), 1.0), 1);
        // Already late at full power: full power.
        assert_eq!(level(Some(500), 1.0), 1);
        // No deadline: a minute of slack is assumed.
        assert_eq!(level(None, 0.1), 0);
        // Out-of-range actions are clamped.
        assert_eq!(level(Some(10_000), 7.0), 0);
        assert_eq!(level(Some(10_000), -1.0), 1);
    }

    #[test]
    fn hirl_full_power_never_asks_the_actor() {
        let view = ClusterView {
            now_ms: 0,
            nodes: vec![node("n", 4.0, 1.0)],
        };
        let mut t = task(1, TaskClass::Cpu);
        t.deadline_ms = Some(60_000);
        let model = shipped(LearnedKind::Hirl).unwrap();
        let mut with_actor = LearnedPolicy::new(&model, 1);
        let mut alone = LearnedPolicy::new(&model, 1).at_full_power();
        assert_eq!(alone.name(), HIRL_FULL_POWER);
        let placed = |decisions: Vec<Decision>| match decisions[0].outcome {
            Outcome::Place { power_level, .. } => power_level,
            Outcome::Hold { .. } => panic!("held: {decisions:?}"),
        };
        assert_eq!(placed(alone.decide(&view, &[t.clone()])), 1);
        // A minute of slack for one second of work: the shipped actor slows down.
        assert_eq!(placed(with_actor.decide(&view, &[t])), 0);
        // The ablation means nothing for the single DDQN, whose levels are its placement.
        let ddqn = LearnedPolicy::new(&shipped(LearnedKind::Ddqn).unwrap(), 1).at_full_power();
        assert_eq!(ddqn.name(), "ddqn");
    }

    #[test]
    fn the_power_actor_maps_speed_to_the_lowest_level_fast_enough() {
        let n = node("n", 4.0, 1.0);
        assert_eq!(level_for_speed(&n, 0.1), 0);
        assert_eq!(level_for_speed(&n, 0.5), 0);
        assert_eq!(level_for_speed(&n, 0.51), 1);
        assert_eq!(level_for_speed(&n, 1.0), 1);
    }
}
