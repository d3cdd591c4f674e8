//! Learned placement and power control: HiRL's hierarchy of a DDQN that places
//! and a TD3 actor that sets the power level, and the single-DDQN baseline the
//! paper compares it with. The networks are trained in the simulator by
//! `starling-learn` (`starling-coordinator train`); this module holds what the
//! coordinator runs: the features, the forward pass, the model file and the
//! policies, all pure like the rest of the engine.
//!
//! # State
//!
//! A decision is made per task, in the heuristic's order (priority, then least
//! deadline slack). Its state is the set of *candidates*: the nodes a shortlist
//! offers (the least-waiting nodes of each hardware group plus a seeded random
//! sample, as the indexed heuristic uses) that pass every hard filter. Each
//! candidate is one [`features::Features`] vector: the task (class, demand,
//! time left, priority), the node as it bears on the task (its run rate, the
//! five-dimensional queue state of [`crate::model`], wait, transfer time, fit)
//! and a power level (speed, watts, estimated finish, slack, energy). A network
//! scores one candidate at a time, so the same model serves any fleet size.
//!
//! # Actions and coordination
//!
//! - **`hirl`**: the placement DDQN scores each candidate node seen at full
//!   power and the best is taken; then the power actor (TD3) sees that node's
//!   features and answers a number in 0..1: the share of the task's slack at
//!   full power it may spend running slower ([`PowerAction::SlackShare`]; the
//!   first models answered a speed fraction instead, [`level_for_speed`], see
//!   [`PowerAction`]). `hirl-full-power` is the same placement without the
//!   actor, to show the actor's share. Placement decides first because the
//!   power that is right depends on the node's speed and queue, while which
//!   node is right depends little on the level (the DDQN sees the node's top
//!   level and its lower levels' existence in its features).
//! - **`ddqn`**: one DDQN scores every (node, level) pair and takes the best:
//!   the joint action space the paper's single-DDQN baseline has.
//!
//! # Reward
//!
//! Latency past a margin of the task's budget, energy and deadline misses
//! combined ([`reward`]); the trainer's replay samples experience that ended in a miss or a
//! failure more often (failure-penalised prioritised replay).

pub mod features;
pub mod model_file;
pub mod network;
mod policy;
pub mod reward;

pub use features::{Features, FEATURES, FEATURE_NAMES, LAYOUT};
pub use model_file::{
    shipped, LearnedKind, ModelError, ModelFile, Networks, PowerAction, TrainingInfo, MODEL_FORMAT,
    MODEL_VERSION,
};
pub use network::{Activation, Dense, Mlp, Scratch, ShapeError};
pub use policy::{
    level_for_speed, DecisionRecord, Exploration, LearnedPolicy, HIRL_FULL_POWER,
    NO_DEADLINE_SLACK_MS,
};
pub use reward::{Fate, RewardShape, TaskOutcome};
