//! Failure-penalised prioritised experience replay.
//!
//! Prioritised replay (Schaul et al., 2016) samples a transition with
//! probability proportional to `(|TD error| + ε)^α`, and corrects the bias with
//! importance weights `(N · P(i))^-β / max`. HiRL adds failure penalisation:
//! experience that ended in a missed deadline or a failure has its priority
//! multiplied by [`ReplayConfig::failure_boost`], so the rare, costly mistakes are
//! replayed more than their share. A sum tree keeps sampling and updates at
//! O(log N).

use rand::Rng;
use rand_chacha::ChaCha8Rng;

/// The replay's knobs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ReplayConfig {
    /// Transitions kept (the oldest are overwritten).
    pub capacity: usize,
    /// How strongly priorities shape sampling (0: uniform).
    pub alpha: f64,
    /// Importance-sampling correction (1: full).
    pub beta: f64,
    /// Priority multiplier of experience that ended in a miss or a failure.
    pub failure_boost: f64,
}

impl Default for ReplayConfig {
    fn default() -> Self {
        Self {
            capacity: 50_000,
            alpha: 0.6,
            beta: 0.4,
            failure_boost: 3.0,
        }
    }
}

const EPSILON: f64 = 1e-3;

/// A binary tree whose every node holds the sum of its children's priorities.
#[derive(Debug, Clone)]
struct SumTree {
    capacity: usize,
    nodes: Vec<f64>,
}

impl SumTree {
    fn new(capacity: usize) -> Self {
        Self {
            capacity,
            nodes: vec![0.0; 2 * capacity],
        }
    }

    fn total(&self) -> f64 {
        self.nodes.get(1).copied().unwrap_or(0.0)
    }

    fn get(&self, index: usize) -> f64 {
        self.nodes
            .get(self.capacity + index)
            .copied()
            .unwrap_or(0.0)
    }

    fn set(&mut self, index: usize, priority: f64) {
        let mut node = self.capacity + index;
        if let Some(leaf) = self.nodes.get_mut(node) {
            *leaf = priority;
        }
        while node > 1 {
            node /= 2;
            let sum = self.nodes.get(2 * node).copied().unwrap_or(0.0)
                + self.nodes.get(2 * node + 1).copied().unwrap_or(0.0);
            if let Some(parent) = self.nodes.get_mut(node) {
                *parent = sum;
            }
        }
    }

    /// The leaf where the running sum passes `mass`.
    fn find(&self, mut mass: f64) -> usize {
        let mut node = 1;
        while node < self.capacity {
            let left = self.nodes.get(2 * node).copied().unwrap_or(0.0);
            if mass < left {
                node *= 2;
            } else {
                mass -= left;
                node = 2 * node + 1;
            }
        }
        node - self.capacity
    }
}

/// One sampled transition: where it is and how much its error counts.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sampled {
    /// Its slot, for [`Replay::update`].
    pub slot: usize,
    /// Its importance weight, 0..=1.
    pub weight: f32,
}

/// The replay buffer.
#[derive(Debug, Clone)]
pub struct Replay<T> {
    config: ReplayConfig,
    items: Vec<T>,
    failures: Vec<bool>,
    tree: SumTree,
    next: usize,
    max_priority: f64,
}

impl<T> Replay<T> {
    /// An empty buffer (capacity at least 1, rounded up to a power of two for the tree).
    pub fn new(config: ReplayConfig) -> Self {
        let capacity = config.capacity.max(1).next_power_of_two();
        Self {
            config: ReplayConfig { capacity, ..config },
            items: Vec::new(),
            failures: Vec::new(),
            tree: SumTree::new(capacity),
            next: 0,
            max_priority: 1.0,
        }
    }

    /// Transitions held.
    pub fn len(&self) -> usize {
        self.items.len()
    }

    /// Whether it holds nothing.
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// The transition in a slot.
    pub fn get(&self, slot: usize) -> Option<&T> {
        self.items.get(slot)
    }

    fn priority(&self, base: f64, failure: bool) -> f64 {
        let boost = if failure {
            self.config.failure_boost
        } else {
            1.0
        };
        base * boost
    }

    /// Adds a transition at the highest priority seen, so it is replayed at least
    /// once soon; `failure` marks experience that ended in a miss or a failure.
    pub fn push(&mut self, item: T, failure: bool) {
        let slot = self.next;
        if slot < self.items.len() {
            self.items[slot] = item;
            self.failures[slot] = failure;
        } else {
            self.items.push(item);
            self.failures.push(failure);
        }
        let priority = self.priority(self.max_priority, failure);
        self.tree.set(slot, priority);
        self.next = (slot + 1) % self.config.capacity;
    }

    /// Draws `count` transitions by priority, with their importance weights.
    pub fn sample(&self, count: usize, rng: &mut ChaCha8Rng) -> Vec<Sampled> {
        let total = self.tree.total();
        if self.items.is_empty() || total <= 0.0 {
            return Vec::new();
        }
        let n = self.items.len() as f64;
        let min_probability = self.smallest_priority() / total;
        let max_weight = (n * min_probability).powf(-self.config.beta);
        (0..count)
            .map(|_| {
                let slot = self
                    .tree
                    .find(rng.random_range(0.0..total))
                    .min(self.items.len() - 1);
                let probability = self.tree.get(slot) / total;
                let weight = (n * probability).powf(-self.config.beta) / max_weight;
                Sampled {
                    slot,
                    weight: weight.clamp(0.0, 1.0) as f32,
                }
            })
            .collect()
    }

    fn smallest_priority(&self) -> f64 {
        (0..self.items.len())
            .map(|slot| self.tree.get(slot))
            .filter(|p| *p > 0.0)
            .fold(f64::INFINITY, f64::min)
            .min(self.tree.total())
    }

    /// Sets a transition's priority from its latest TD error.
    pub fn update(&mut self, slot: usize, td_error: f64) {
        if slot >= self.items.len() || !td_error.is_finite() {
            return;
        }
        let base = (td_error.abs() + EPSILON).powf(self.config.alpha);
        self.max_priority = self.max_priority.max(base);
        let failure = self.failures.get(slot).copied().unwrap_or(false);
        let priority = self.priority(base, failure);
        self.tree.set(slot, priority);
    }

    /// Share of the sampling mass held by failure experience (for the logs).
    pub fn failure_share(&self) -> f64 {
        let total = self.tree.total();
        if total <= 0.0 {
            return 0.0;
        }
        let failed: f64 = (0..self.items.len())
            .filter(|slot| self.failures.get(*slot).copied().unwrap_or(false))
            .map(|slot| self.tree.get(slot))
            .sum();
        failed / total
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn failures_are_replayed_more_and_errors_reshape_sampling() {
        let mut replay = Replay::new(ReplayConfig {
            capacity: 8,
            alpha: 1.0,
            beta: 1.0,
            failure_boost: 3.0,
        });
        for item in 0..8 {
            replay.push(item, item == 0);
        }
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        let mut counts = [0usize; 8];
        for sampled in replay.sample(8_000, &mut rng) {
            counts[sampled.slot] += 1;
        }
        // Slot 0 weighs 3 of 10 units; each other slot 1 of 10.
        assert!((2_000..2_800).contains(&counts[0]), "{counts:?}");
        assert!((600..1_000).contains(&counts[5]), "{counts:?}");
        assert!((replay.failure_share() - 0.3).abs() < 1e-9);
        // A large error makes a transition dominate; its weight is the smallest.
        replay.update(5, 50.0);
        let sampled = replay.sample(1_000, &mut rng);
        let fives = sampled.iter().filter(|s| s.slot == 5).count();
        assert!(fives > 800, "{fives}");
        let five = sampled.iter().find(|s| s.slot == 5).unwrap();
        let other = sampled.iter().find(|s| s.slot != 5).unwrap();
        assert!(five.weight < other.weight && other.weight <= 1.0);
        // Overwrites the oldest once full.
        replay.push(99, false);
        assert_eq!(replay.get(0), Some(&99));
        assert_eq!(replay.len(), 8);
    }
}
