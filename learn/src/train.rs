//! The training loop: episodes in the simulator, replay, updates, evaluation.

use std::collections::HashMap;
use std::sync::Arc;

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};
use starling_placement::learned::{
    DecisionRecord, Exploration, LearnedKind, LearnedPolicy, ModelFile, Networks, PowerAction,
    RewardShape, TaskOutcome, TrainingInfo,
};
use starling_placement::policy::Policy;
use starling_placement::sim::{self, FakeStopwatch, LoadLevel, PolicyRow, SimConfig};

use crate::agents::{Ddqn, Td3, Transition};
use crate::replay::{Replay, ReplayConfig};
use crate::LearnError;

/// What to train and how.
#[derive(Debug, Clone, PartialEq)]
pub struct TrainConfig {
    /// Which policy.
    pub kind: LearnedKind,
    /// Seed of the worlds, the initial weights and the exploration.
    pub seed: u64,
    /// Offered loads (fractions of capacity), cycled episode by episode.
    pub loads: Vec<f64>,
    /// Simulated devices of each standard profile (4 profiles).
    pub nodes_per_profile: usize,
    /// Episodes to play.
    pub episodes: u32,
    /// Seconds of arrivals per episode.
    pub episode_s: f64,
    /// Gradient steps after each episode.
    pub updates_per_episode: u32,
    /// Transitions per gradient step.
    pub batch: usize,
    /// Discount between one decision and the next.
    pub gamma: f64,
    /// Adam's learning rate.
    pub learning_rate: f64,
    /// Width of the hidden layers.
    pub hidden: usize,
    /// The replay's knobs.
    pub replay: ReplayConfig,
    /// Where latency starts to cost in the reward.
    pub reward: RewardShape,
    /// What HiRL's power actor answers.
    pub power_action: PowerAction,
    /// The command line that asked for this, recorded in the model.
    pub command: String,
}

impl Default for TrainConfig {
    fn default() -> Self {
        Self {
            kind: LearnedKind::Hirl,
            seed: 42,
            loads: vec![0.2, 0.5, 0.85],
            nodes_per_profile: 5,
            episodes: 150,
            episode_s: 30.0,
            updates_per_episode: 150,
            batch: 128,
            gamma: 0.5,
            learning_rate: 1e-3,
            hidden: 32,
            replay: ReplayConfig::default(),
            reward: RewardShape::default(),
            power_action: PowerAction::SlackShare,
            command: String::new(),
        }
    }
}

impl TrainConfig {
    fn validate(&self) -> Result<(), LearnError> {
        let invalid = |what: &str| Err(LearnError::Config(what.to_owned()));
        if self.loads.is_empty()
            || self
                .loads
                .iter()
                .any(|l| !(l.is_finite() && *l > 0.0 && *l <= 5.0))
        {
            return invalid("loads must be one or more numbers in (0, 5]");
        }
        if self.episodes == 0 {
            return invalid("episodes must be at least 1");
        }
        if self.batch == 0 || self.hidden == 0 || self.hidden > 1024 {
            return invalid("batch must be at least 1 and hidden in 1..=1024");
        }
        if !(self.gamma.is_finite() && (0.0..1.0).contains(&self.gamma)) {
            return invalid("gamma must be in [0, 1)");
        }
        if !(self.learning_rate.is_finite() && self.learning_rate > 0.0) {
            return invalid("learning rate must be positive");
        }
        if !self.reward.is_valid() {
            return invalid("the latency margin must be in [0, 1)");
        }
        Ok(())
    }

    /// The simulated world of one episode.
    fn world(&self, seed: u64) -> SimConfig {
        SimConfig {
            seed,
            duration_s: self.episode_s,
            nodes_per_profile: self.nodes_per_profile,
            drain_s: 30.0,
            policies: vec![self.kind.as_str().to_owned()],
            ..SimConfig::default()
        }
    }

    /// Exploration at an episode: ε falls linearly from 1 to 0.05 over the first
    /// half of training, the power noise from 0.3 to 0.05.
    fn exploration(&self, episode: u32) -> Exploration {
        let progress = (f64::from(episode) / (f64::from(self.episodes) * 0.5).max(1.0)).min(1.0);
        Exploration {
            epsilon: 1.0 - 0.95 * progress,
            power_noise: 0.3 - 0.25 * progress,
        }
    }
}

/// One episode's figures, a point of the learning curve.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EpisodeStats {
    /// Episode number, from 0.
    pub episode: u32,
    /// Offered load.
    pub load: f64,
    /// Exploration rate in force.
    pub epsilon: f64,
    /// Tasks in the episode.
    pub tasks: u64,
    /// Share of tasks completed by their deadline.
    pub on_time_rate: f64,
    /// Mean reward per decision.
    pub mean_reward: f64,
    /// Mean placement loss over the episode's updates (NaN before the first).
    pub loss: f64,
    /// Mean power-critic loss (HiRL; NaN otherwise).
    pub power_loss: f64,
    /// Share of the replay's sampling mass on failure experience.
    pub failure_share: f64,
}

/// A trained model and its learning curve.
#[derive(Debug, Clone)]
pub struct Trained {
    /// The model, ready to write.
    pub model: ModelFile,
    /// One point per episode.
    pub curve: Vec<EpisodeStats>,
    /// Each load's greedy evaluation after training.
    pub evaluation: Vec<(f64, PolicyRow)>,
}

/// Pairs each decision with what became of its task: outcomes are matched to a
/// task's decisions in order (an attempt lost rewards the decision that made it;
/// the task's final fate rewards the last). A decision with no outcome (the run
/// ended first) counts as a lost task.
fn transitions(
    records: Vec<DecisionRecord>,
    outcomes: &[TaskOutcome],
    shape: RewardShape,
) -> Vec<(Transition, bool)> {
    let mut by_task: HashMap<u64, Vec<usize>> = HashMap::new();
    for (index, record) in records.iter().enumerate() {
        by_task.entry(record.task_key).or_default().push(index);
    }
    let mut fates: Vec<Option<TaskOutcome>> = vec![None; records.len()];
    let mut cursor: HashMap<u64, usize> = HashMap::new();
    for outcome in outcomes {
        let Some(indices) = by_task.get(&outcome.task_key) else {
            continue;
        };
        let next = cursor.entry(outcome.task_key).or_insert(0);
        if let Some(index) = indices.get(*next) {
            fates[*index] = Some(*outcome);
            *next += 1;
        }
    }
    let records: Vec<Arc<DecisionRecord>> = records.into_iter().map(Arc::new).collect();
    records
        .iter()
        .enumerate()
        .map(|(index, record)| {
            let (reward, failure) = match &fates[index] {
                Some(outcome) => (outcome.reward(shape), outcome.is_failure()),
                None => (starling_placement::learned::reward::LOST_TASK_REWARD, true),
            };
            (
                Transition {
                    state: Arc::clone(record),
                    next: records.get(index + 1).cloned(),
                    reward: reward as f32,
                },
                failure,
            )
        })
        .collect()
}

fn mean(values: &[f32]) -> f64 {
    if values.is_empty() {
        f64::NAN
    } else {
        values.iter().map(|v| f64::from(*v)).sum::<f64>() / values.len() as f64
    }
}

/// Trains a policy; `progress` is told each episode's figures as it ends.
pub fn train(
    config: &TrainConfig,
    progress: &mut dyn FnMut(&EpisodeStats),
) -> Result<Trained, LearnError> {
    config.validate()?;
    let mut rng = ChaCha8Rng::seed_from_u64(config.seed ^ 0x0074_7261_696e);
    let mut ddqn = Ddqn::new(config.hidden, config.learning_rate, config.gamma, &mut rng)?;
    let mut td3 = match config.kind {
        LearnedKind::Hirl => Some(Td3::new(
            config.hidden,
            config.learning_rate,
            config.gamma,
            &mut rng,
        )?),
        LearnedKind::Ddqn => None,
    };
    let mut replay: Replay<Transition> = Replay::new(config.replay);
    let mut curve = Vec::with_capacity(config.episodes as usize);
    let mut steps = 0u64;
    let mut stopwatch = FakeStopwatch {
        now_ns: 0,
        step_ns: 1,
    };
    for episode in 0..config.episodes {
        let load = config.loads[episode as usize % config.loads.len()];
        let power = td3.as_ref().map(Td3::export).transpose()?;
        let mut policy = LearnedPolicy::from_networks(
            config.kind,
            ddqn.export()?,
            power,
            config.seed.wrapping_add(u64::from(episode)),
        )
        .with_power_action(config.power_action);
        let exploration = config.exploration(episode);
        policy.set_exploration(Some(exploration));
        policy.set_recording(true);
        let mut outcomes = Vec::new();
        let world = config.world(
            config
                .seed
                .wrapping_mul(1_000)
                .wrapping_add(u64::from(episode)),
        );
        let row = sim::episode(
            &world,
            &LoadLevel {
                name: "train".into(),
                utilisation: load,
            },
            &mut policy,
            &mut stopwatch,
            &mut |outcome| outcomes.push(outcome),
        )?;
        let experience = transitions(policy.take_records(), &outcomes, config.reward);
        let rewards: Vec<f32> = experience.iter().map(|(t, _)| t.reward).collect();
        for (transition, failure) in experience {
            replay.push(transition, failure);
        }
        let mut losses = Vec::new();
        let mut power_losses = Vec::new();
        if replay.len() >= config.batch {
            for _ in 0..config.updates_per_episode {
                let sampled = replay.sample(config.batch, &mut rng);
                let batch: Vec<&Transition> =
                    sampled.iter().filter_map(|s| replay.get(s.slot)).collect();
                let weights: Vec<f32> = sampled.iter().map(|s| s.weight).collect();
                let (loss, mut errors) = ddqn.update(&batch, &weights)?;
                losses.push(loss);
                if let Some(td3) = td3.as_mut() {
                    let (power_loss, power_errors) = td3.update(&batch, &weights, &mut rng)?;
                    power_losses.push(power_loss);
                    for (error, power_error) in errors.iter_mut().zip(power_errors) {
                        *error = error.abs().max(power_error.abs());
                    }
                }
                for (sample, error) in sampled.iter().zip(errors) {
                    replay.update(sample.slot, f64::from(error));
                }
                steps += 1;
            }
        }
        let stats = EpisodeStats {
            episode,
            load,
            epsilon: exploration.epsilon,
            tasks: row.tasks,
            on_time_rate: row.deadline_completion_rate,
            mean_reward: mean(&rewards),
            loss: mean(&losses),
            power_loss: mean(&power_losses),
            failure_share: replay.failure_share(),
        };
        progress(&stats);
        curve.push(stats);
    }
    let networks = Networks {
        placement: ddqn.export()?,
        power: td3.as_ref().map(Td3::export).transpose()?,
        power_action: config.power_action,
    };
    let mut evaluation = Vec::new();
    for (index, load) in config.loads.iter().enumerate() {
        let mut policy = LearnedPolicy::from_networks(
            config.kind,
            networks.placement.clone(),
            networks.power.clone(),
            config.seed,
        )
        .with_power_action(networks.power_action);
        // Held-out worlds: seeds the training episodes never used.
        let world = config.world(
            config
                .seed
                .wrapping_mul(1_000)
                .wrapping_add(900 + index as u64),
        );
        let row = sim::episode(
            &world,
            &LoadLevel {
                name: "eval".into(),
                utilisation: *load,
            },
            &mut policy,
            &mut stopwatch,
            &mut |_| {},
        )?;
        evaluation.push((*load, row));
    }
    let on_time_rate = if evaluation.is_empty() {
        0.0
    } else {
        evaluation
            .iter()
            .map(|(_, row)| row.deadline_completion_rate)
            .sum::<f64>()
            / evaluation.len() as f64
    };
    let model = ModelFile::new(
        config.kind,
        networks,
        TrainingInfo {
            seed: config.seed,
            loads: config.loads.clone(),
            devices: config.nodes_per_profile
                * starling_placement::sim::profiles::standard_profiles().len(),
            episodes: config.episodes,
            steps,
            // Set by the caller, who owns the clock: the trainer is deterministic.
            seconds: 0.0,
            on_time_rate,
            command: config.command.clone(),
            reward: config.reward,
        },
    );
    Ok(Trained {
        model,
        curve,
        evaluation,
    })
}

/// Plays one greedy episode of `policy` in the world `config` describes at
/// `load`, for comparisons (the trained policy against random, say).
pub fn evaluate(
    config: &TrainConfig,
    policy: &mut dyn Policy,
    load: f64,
    seed: u64,
) -> Result<PolicyRow, LearnError> {
    let mut stopwatch = FakeStopwatch {
        now_ns: 0,
        step_ns: 1,
    };
    Ok(sim::episode(
        &config.world(seed),
        &LoadLevel {
            name: "eval".into(),
            utilisation: load,
        },
        policy,
        &mut stopwatch,
        &mut |_| {},
    )?)
}
