//! Trains Starling's learned placement policies in the simulator.
//!
//! - **HiRL** (`hirl`): a DDQN placement network (online + target, double
//!   Q-learning targets) and a TD3 power actor (twin critics, target policy
//!   smoothing, delayed actor updates), trained together on the same
//!   experience.
//! - **Single DDQN** (`ddqn`): one DDQN over (node, power level) pairs, the
//!   paper's main comparison.
//!
//! Both learn from failure-penalised prioritised replay ([`replay`]) of
//! simulated episodes: each episode is a fresh world (devices, arrivals,
//! failures, mobility) from the simulator, played by the policy under
//! training with exploration on; every decision becomes a transition whose
//! reward is what became of its task ([`starling_placement::learned::reward`]),
//! and whose next state is the next decision's candidates.
//!
//! The autodiff and the optimiser are candle's (`candle-core`, `candle-nn`): a
//! small, CPU-first library whose tensors and `Var`s are all this needs, which
//! builds in a fraction of burn's time on a 2-core machine. The trained
//! networks are exported to the engine's plain forward pass
//! ([`starling_placement::learned::Mlp`]).

mod agents;
mod net;
pub mod replay;
mod train;

pub use train::{evaluate, train, EpisodeStats, TrainConfig, Trained};

/// Why training failed.
#[derive(Debug, thiserror::Error)]
pub enum LearnError {
    /// candle refused an operation (a shape bug, or out of memory).
    #[error("tensor operation failed: {0}")]
    Candle(#[from] candle_core::Error),
    /// The simulator refused its settings.
    #[error(transparent)]
    Sim(#[from] starling_placement::sim::SimError),
    /// A training setting is out of range.
    #[error("invalid training setting: {0}")]
    Config(String),
}
