//! The learning rules: double Q-learning for the placement networks and TD3 for
//! HiRL's power actor, on batches drawn from the replay.

use std::sync::Arc;

use candle_core::Tensor;
use candle_nn::{AdamW, Optimizer, ParamsAdamW};
use rand_chacha::ChaCha8Rng;
use starling_placement::learned::{Activation, DecisionRecord, Mlp, FEATURES};

use crate::net::{column, matrix, Net};
use crate::LearnError;

/// One decision and what followed it.
#[derive(Debug, Clone)]
pub(crate) struct Transition {
    pub state: Arc<DecisionRecord>,
    /// The next decision of the episode (`None` at its end: a terminal state).
    pub next: Option<Arc<DecisionRecord>>,
    pub reward: f32,
}

/// Soft target update rate (Polyak averaging), as in TD3's paper.
const TAU: f64 = 0.005;
/// TD3: the actor and the targets move every this many critic updates.
const POLICY_DELAY: u64 = 2;
/// TD3: target policy smoothing noise and its clip.
const TARGET_NOISE: f64 = 0.2;
const TARGET_NOISE_CLIP: f64 = 0.5;
/// Targets are clipped to what the reward's bounds allow over the horizon.
const TARGET_CLIP: f32 = 50.0;

fn adam(vars: Vec<candle_core::Var>, learning_rate: f64) -> Result<AdamW, LearnError> {
    Ok(AdamW::new(
        vars,
        ParamsAdamW {
            lr: learning_rate,
            weight_decay: 0.0,
            ..ParamsAdamW::default()
        },
    )?)
}

/// Weighted mean squared error and the per-row errors.
fn weighted_mse(
    prediction: &Tensor,
    target: Vec<f32>,
    weights: &[f32],
) -> Result<(Tensor, Vec<f32>), LearnError> {
    let target = column(target)?;
    let error = (prediction - &target)?;
    let errors = error.flatten_all()?.to_vec1::<f32>()?;
    let loss = (error.sqr()? * column(weights.to_vec())?)?.mean_all()?;
    Ok((loss, errors))
}

/// The chosen candidates' features of a batch, row after row.
fn chosen_rows<'a>(records: impl Iterator<Item = &'a DecisionRecord>) -> Vec<f32> {
    records
        .flat_map(|record| record.chosen_features().iter().copied())
        .collect()
}

/// A DDQN over candidate vectors: `Q(candidate)`, the best candidate acted on.
pub(crate) struct Ddqn {
    online: Net,
    target: Net,
    optimiser: AdamW,
    gamma: f32,
}

impl Ddqn {
    pub fn new(
        hidden: usize,
        learning_rate: f64,
        gamma: f64,
        rng: &mut ChaCha8Rng,
    ) -> Result<Self, LearnError> {
        let online = Net::new(&[FEATURES, hidden, hidden, 1], Activation::Linear, rng)?;
        let target = online.duplicate()?;
        let optimiser = adam(online.vars(), learning_rate)?;
        Ok(Self {
            online,
            target,
            optimiser,
            gamma: gamma as f32,
        })
    }

    pub fn export(&self) -> Result<Mlp, LearnError> {
        self.online.export()
    }

    /// One gradient step; the loss and each transition's TD error.
    pub fn update(
        &mut self,
        batch: &[&Transition],
        weights: &[f32],
    ) -> Result<(f32, Vec<f32>), LearnError> {
        let states = matrix(
            chosen_rows(batch.iter().map(|t| t.state.as_ref())),
            FEATURES,
        )?;
        let q = self.online.forward(&states)?;
        // Double Q-learning: the online network picks the next action, the target
        // network values it.
        let mut next_rows = Vec::new();
        let mut segments = Vec::with_capacity(batch.len());
        for transition in batch {
            match &transition.next {
                Some(next) if next.candidate_count() > 0 => {
                    segments.push(Some((next_rows.len() / FEATURES, next.candidate_count())));
                    next_rows.extend_from_slice(&next.candidates);
                }
                _ => segments.push(None),
            }
        }
        let online_next = self.online.values(&next_rows, FEATURES)?;
        let target_next = self.target.values(&next_rows, FEATURES)?;
        let targets: Vec<f32> = batch
            .iter()
            .zip(&segments)
            .map(|(transition, segment)| {
                let future = segment.map_or(0.0, |(start, len)| {
                    let best = (start..start + len)
                        .max_by(|a, b| online_next[*a].total_cmp(&online_next[*b]))
                        .unwrap_or(start);
                    target_next.get(best).copied().unwrap_or(0.0)
                });
                (transition.reward + self.gamma * future).clamp(-TARGET_CLIP, TARGET_CLIP)
            })
            .collect();
        let (loss, errors) = weighted_mse(&q, targets, weights)?;
        self.optimiser.backward_step(&loss)?;
        self.target.follow(&self.online, TAU * 2.0)?;
        Ok((loss.to_scalar::<f32>()?, errors))
    }
}

/// TD3 for the power actor: state = the chosen node's features, action = the
/// speed fraction.
pub(crate) struct Td3 {
    actor: Net,
    actor_target: Net,
    critics: [Net; 2],
    critic_targets: [Net; 2],
    actor_optimiser: AdamW,
    critic_optimiser: AdamW,
    gamma: f32,
    updates: u64,
}

fn with_action(states: &[f32], actions: &[f32]) -> Vec<f32> {
    states
        .chunks_exact(FEATURES)
        .zip(actions)
        .flat_map(|(state, action)| state.iter().copied().chain(core::iter::once(*action)))
        .collect()
}

impl Td3 {
    pub fn new(
        hidden: usize,
        learning_rate: f64,
        gamma: f64,
        rng: &mut ChaCha8Rng,
    ) -> Result<Self, LearnError> {
        let actor = Net::new(&[FEATURES, hidden, hidden, 1], Activation::Sigmoid, rng)?;
        let critic = |rng: &mut ChaCha8Rng| {
            Net::new(&[FEATURES + 1, hidden, hidden, 1], Activation::Linear, rng)
        };
        let critics = [critic(rng)?, critic(rng)?];
        let critic_targets = [critics[0].duplicate()?, critics[1].duplicate()?];
        let actor_target = actor.duplicate()?;
        let actor_optimiser = adam(actor.vars(), learning_rate)?;
        let mut critic_vars = critics[0].vars();
        critic_vars.extend(critics[1].vars());
        let critic_optimiser = adam(critic_vars, learning_rate)?;
        Ok(Self {
            actor,
            actor_target,
            critics,
            critic_targets,
            actor_optimiser,
            critic_optimiser,
            gamma: gamma as f32,
            updates: 0,
        })
    }

    pub fn export(&self) -> Result<Mlp, LearnError> {
        self.actor.export()
    }

    /// One critic step (and, every [`POLICY_DELAY`], an actor step); the critic
    /// loss and each transition's TD error.
    pub fn update(
        &mut self,
        batch: &[&Transition],
        weights: &[f32],
        rng: &mut ChaCha8Rng,
    ) -> Result<(f32, Vec<f32>), LearnError> {
        let states = chosen_rows(batch.iter().map(|t| t.state.as_ref()));
        let actions: Vec<f32> = batch
            .iter()
            .map(|t| t.state.power_action.unwrap_or(1.0))
            .collect();
        // Targets: y = r + γ · min(Q1', Q2')(s', clip(μ'(s') + clipped noise)).
        let mut next_states = Vec::new();
        let mut has_next = Vec::with_capacity(batch.len());
        for transition in batch {
            match &transition.next {
                Some(next) if next.chosen_features().len() == FEATURES => {
                    next_states.extend_from_slice(next.chosen_features());
                    has_next.push(true);
                }
                _ => has_next.push(false),
            }
        }
        let mut next_actions = self.actor_target.values(&next_states, FEATURES)?;
        for action in &mut next_actions {
            let noise = (starling_placement::sim::normal(rng) * TARGET_NOISE)
                .clamp(-TARGET_NOISE_CLIP, TARGET_NOISE_CLIP);
            *action = (*action + noise as f32).clamp(0.0, 1.0);
        }
        let next_inputs = with_action(&next_states, &next_actions);
        let q1_next = self.critic_targets[0].values(&next_inputs, FEATURES + 1)?;
        let q2_next = self.critic_targets[1].values(&next_inputs, FEATURES + 1)?;
        let mut next_index = 0;
        let targets: Vec<f32> = batch
            .iter()
            .zip(&has_next)
            .map(|(transition, has)| {
                let future = if *has {
                    let value = q1_next[next_index].min(q2_next[next_index]);
                    next_index += 1;
                    value
                } else {
                    0.0
                };
                (transition.reward + self.gamma * future).clamp(-TARGET_CLIP, TARGET_CLIP)
            })
            .collect();
        let inputs = matrix(with_action(&states, &actions), FEATURES + 1)?;
        let (loss1, errors) =
            weighted_mse(&self.critics[0].forward(&inputs)?, targets.clone(), weights)?;
        let (loss2, _) = weighted_mse(&self.critics[1].forward(&inputs)?, targets, weights)?;
        let loss = (&loss1 + &loss2)?;
        self.critic_optimiser.backward_step(&loss)?;
        self.updates += 1;
        if self.updates.is_multiple_of(POLICY_DELAY) {
            // Deterministic policy gradient through the first critic; only the
            // actor's optimiser steps.
            let state_tensor = matrix(states, FEATURES)?;
            let proposed = self.actor.forward(&state_tensor)?;
            let critic_input = Tensor::cat(&[&state_tensor, &proposed], 1)?;
            let actor_loss = self.critics[0].forward(&critic_input)?.mean_all()?.neg()?;
            self.actor_optimiser.backward_step(&actor_loss)?;
            self.actor_target.follow(&self.actor, TAU)?;
            for (target, online) in self.critic_targets.iter().zip(&self.critics) {
                target.follow(online, TAU)?;
            }
        }
        Ok((loss.to_scalar::<f32>()? / 2.0, errors))
    }
}
