//! The reward every learned policy is trained on, and what the simulator tells
//! the trainer about each task's fate.
//!
//! HiRL's reward combines latency, energy and deadline misses. Concretely, for a
//! task that completed:
//!
//! ```text
//! r = − latency / budget − ENERGY_WEIGHT · energy / ENERGY_SCALE_J − MISS_PENALTY · [late]
//! ```
//!
//! where `budget` is the time the task was given (deadline − submission; ten
//! seconds for a task without a deadline), so a task that used its whole budget
//! costs 1 whatever its size, and `energy` is the dynamic energy its run drew.
//! A task that was dropped or failed for good costs as much as the worst late
//! completion ([`LOST_TASK_REWARD`]); an attempt lost to a node failure costs
//! [`LOST_ATTEMPT_REWARD`] (the task itself is placed again and rewarded then).

use serde::{Deserialize, Serialize};

/// Joules that count as one unit of energy cost.
pub const ENERGY_SCALE_J: f64 = 10.0;
/// Weight of energy against latency.
pub const ENERGY_WEIGHT: f64 = 0.5;
/// Extra cost of finishing after the deadline.
pub const MISS_PENALTY: f64 = 2.0;
/// Latency over budget is not charged beyond this ratio (keeps targets bounded).
pub const MAX_LATENCY_RATIO: f64 = 3.0;
/// Budget assumed for a task without a deadline, ms.
pub const NO_DEADLINE_BUDGET_MS: f64 = 10_000.0;
/// Reward of a task dropped or failed for good.
pub const LOST_TASK_REWARD: f64 = -(MAX_LATENCY_RATIO + MISS_PENALTY);
/// Reward of an attempt lost when its node failed.
pub const LOST_ATTEMPT_REWARD: f64 = -1.0;

/// What became of one task (or one attempt), as the simulator reports it.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct TaskOutcome {
    /// The task's key.
    pub task_key: u64,
    /// What happened.
    pub fate: Fate,
    /// Submission to result, ms (0 unless completed).
    pub latency_ms: f64,
    /// Deadline − submission, ms (`None` without a deadline).
    pub budget_ms: Option<f64>,
    /// Dynamic energy the attempt drew, joules.
    pub energy_joules: f64,
}

/// A task's fate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Fate {
    /// Its result arrived by the deadline (or it had none).
    OnTime,
    /// Its result arrived after the deadline.
    Late,
    /// The attempt was lost with its node; the task goes back to the queue.
    AttemptLost,
    /// Dropped (deadline passed while pending, or the run ended) or failed for good.
    Lost,
}

impl TaskOutcome {
    /// The reward (see the module docs).
    pub fn reward(&self) -> f64 {
        match self.fate {
            Fate::OnTime | Fate::Late => {
                let budget = self.budget_ms.unwrap_or(NO_DEADLINE_BUDGET_MS).max(1.0);
                let latency = (self.latency_ms.max(0.0) / budget).min(MAX_LATENCY_RATIO);
                let energy = ENERGY_WEIGHT * self.energy_joules.max(0.0) / ENERGY_SCALE_J;
                let miss = if self.fate == Fate::Late {
                    MISS_PENALTY
                } else {
                    0.0
                };
                -latency - energy - miss
            }
            Fate::AttemptLost => LOST_ATTEMPT_REWARD,
            Fate::Lost => LOST_TASK_REWARD,
        }
    }

    /// Whether the experience ended in a missed deadline or a failure: the
    /// trainer's failure-penalised replay samples these more often.
    pub fn is_failure(&self) -> bool {
        !matches!(self.fate, Fate::OnTime)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    fn outcome(fate: Fate, latency_ms: f64, energy: f64) -> TaskOutcome {
        TaskOutcome {
            task_key: 1,
            fate,
            latency_ms,
            budget_ms: Some(2_000.0),
            energy_joules: energy,
        }
    }

    #[test]
    fn faster_cheaper_and_on_time_is_better() {
        let quick = outcome(Fate::OnTime, 500.0, 2.0).reward();
        let slow = outcome(Fate::OnTime, 1_500.0, 2.0).reward();
        let costly = outcome(Fate::OnTime, 500.0, 20.0).reward();
        let late = outcome(Fate::Late, 2_500.0, 2.0).reward();
        assert!((quick - (-0.25 - 0.1)).abs() < 1e-9, "{quick}");
        assert!(quick > slow && quick > costly && slow > late);
        assert!(late > LOST_TASK_REWARD);
        assert!(!outcome(Fate::OnTime, 1.0, 0.0).is_failure());
        assert!(outcome(Fate::Late, 1.0, 0.0).is_failure());
        assert!(outcome(Fate::AttemptLost, 0.0, 0.0).is_failure());
        let huge = outcome(Fate::Late, 1e9, 0.0).reward();
        assert_eq!(huge, -(MAX_LATENCY_RATIO + MISS_PENALTY));
    }
}
