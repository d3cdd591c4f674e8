//! Estimates that learn from what ran.
//!
//! Every run-time estimate starts from what a node says of itself (its
//! speed, its storage rate, its devices' GFLOP/s) and from what a task says
//! of its work; either may be wrong: an operator's override, a throttled
//! board, an artifact whose declared work is off. Each finished attempt
//! says how long the work really took next to what was estimated for it,
//! and a node keeps the smoothed ratio of the two ([`Correction`]) per class
//! of work, and per artifact once one has run there: placement multiplies
//! its estimates by the artifact's correction where there is one, else by
//! the class's.
//!
//! A node that has not run an artifact (or a class of work) yet borrows
//! what the others measured ([`share_priors`]: the median of their
//! corrections, as a prior its own first sample replaces; one node that
//! lies about itself does not move it). Without it, the
//! first node to finish an artifact whose declared work is off would look
//! faster or slower than every other node for it, and either take all of it
//! or none, never letting the others show what they do.
//!
//! The ratio is kept as a logarithm (a node twice as slow and one twice as
//! fast are the same distance from right) and moves by a running mean
//! whose weight never falls below [`MIN_WEIGHT`], so a node that changes is
//! followed; no one sample moves it by more than a factor of two
//! ([`MAX_STEP`]), so one outlier (a page-cache miss, a node that was
//! briefly suspended) cannot swing placement.

use serde::{Deserialize, Serialize};

use crate::model::{NodeView, PendingTask, TaskClass};

/// The most one sample moves a correction, as a logarithm: a factor of two.
pub const MAX_STEP: f64 = core::f64::consts::LN_2;

/// The least weight a new sample gets (the running mean's `1/(n+1)` until
/// then): a correction follows a node that changes within a few attempts.
pub const MIN_WEIGHT: f64 = 0.25;

/// Artifacts whose corrections a node keeps; past it, the one with the
/// fewest samples makes room.
pub const MAX_ARTIFACTS: usize = 64;

/// How far a node's run times stand from their estimates: observed over
/// estimated, smoothed.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct Correction {
    /// The natural logarithm of the smoothed ratio (0: estimates are right).
    pub log_ratio: f64,
    /// Samples taken.
    pub samples: u32,
}

impl Correction {
    /// The factor an estimate is multiplied by (1 with no sample).
    pub fn factor(&self) -> f64 {
        self.log_ratio.exp()
    }

    /// Takes one finished attempt: `estimated_s` seconds expected,
    /// `observed_s` taken. A sample that is not two positive, finite
    /// durations changes nothing (`false`).
    pub fn observe(&mut self, estimated_s: f64, observed_s: f64) -> bool {
        let usable = |seconds: f64| seconds.is_finite() && seconds > 0.0;
        if !usable(estimated_s) || !usable(observed_s) {
            return false;
        }
        let sample = (observed_s / estimated_s).ln();
        let weight = (1.0 / f64::from(self.samples.saturating_add(1))).max(MIN_WEIGHT);
        let step = (weight * (sample - self.log_ratio)).clamp(-MAX_STEP, MAX_STEP);
        self.log_ratio += step;
        self.samples = self.samples.saturating_add(1);
        true
    }
}

/// A node's corrections: per class of work, and per artifact run there.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct NodeCorrections {
    /// CPU, GPU and I/O work, in [`TaskClass::ALL`]'s order.
    pub by_class: [Correction; 3],
    /// Per artifact (its [`PendingTask::artifact`] key), at most
    /// [`MAX_ARTIFACTS`].
    pub by_artifact: Vec<(u64, Correction)>,
}

/// Which correction an estimate used.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CorrectionSource {
    /// None learned yet: the estimate as modelled.
    None,
    /// The node's, for the task's class of work.
    Class,
    /// The node's, for the task's artifact.
    Artifact,
    /// Other nodes', for the task's class of work (this one has run none).
    FleetClass,
    /// Other nodes', for the task's artifact (this one has not run it).
    FleetArtifact,
}

/// Gives every node, for each artifact and class it has no sample of, the
/// median of the corrections the nodes that have samples learned (a prior:
/// `samples` 0, which the node's first own sample replaces). Earlier priors
/// are recomputed; own corrections are never changed, and a node's list of
/// artifacts past [`MAX_ARTIFACTS`] takes no prior.
///
/// The median, not the mean: what one node learned is what it ran, and a
/// node that lies about its speed learns a factor far from the others'. Of
/// three or more nodes, one such node moves no other node's prior at all
/// (the mean would carry a share of its lie to every node that has not run
/// the work); of two, the median is their mean.
pub fn share_priors(nodes: &mut [NodeView]) {
    let mut class_ratios: [Vec<f64>; 3] = Default::default();
    let mut artifact_ratios: Vec<(u64, Vec<f64>)> = Vec::new();
    for node in nodes.iter() {
        for (ratios, correction) in class_ratios.iter_mut().zip(&node.corrections.by_class) {
            if correction.samples > 0 {
                ratios.push(correction.log_ratio);
            }
        }
        for (artifact, correction) in &node.corrections.by_artifact {
            if correction.samples == 0 {
                continue;
            }
            match artifact_ratios.iter_mut().find(|(key, _)| key == artifact) {
                Some((_, ratios)) => ratios.push(correction.log_ratio),
                None => artifact_ratios.push((*artifact, vec![correction.log_ratio])),
            }
        }
    }
    let class_priors = class_ratios.map(|mut ratios| median(&mut ratios).unwrap_or(0.0));
    let artifact_priors: Vec<(u64, f64)> = artifact_ratios
        .into_iter()
        .filter_map(|(artifact, mut ratios)| Some((artifact, median(&mut ratios)?)))
        .collect();
    for node in nodes.iter_mut() {
        let corrections = &mut node.corrections;
        for (correction, prior) in corrections.by_class.iter_mut().zip(class_priors) {
            if correction.samples == 0 {
                correction.log_ratio = prior;
            }
        }
        // Earlier priors go; own corrections stay.
        corrections
            .by_artifact
            .retain(|(_, correction)| correction.samples > 0);
        for (artifact, prior) in &artifact_priors {
            if corrections.by_artifact.len() >= MAX_ARTIFACTS {
                break;
            }
            if !corrections
                .by_artifact
                .iter()
                .any(|(key, _)| key == artifact)
            {
                corrections.by_artifact.push((
                    *artifact,
                    Correction {
                        log_ratio: *prior,
                        samples: 0,
                    },
                ));
            }
        }
    }
}

/// The median (the mean of the middle two of an even count); `None` of none.
fn median(values: &mut [f64]) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    values.sort_by(f64::total_cmp);
    let middle = values.len() / 2;
    Some(if values.len().is_multiple_of(2) {
        (values[middle - 1] + values[middle]) / 2.0
    } else {
        values[middle]
    })
}

/// The key an artifact's corrections are kept under: a 64-bit FNV-1a hash
/// of its digest (or, in the simulator, of its task type's name), stable
/// across runs and builds; never 0, which means none known.
pub fn artifact_key(bytes: &[u8]) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in bytes {
        hash ^= u64::from(*byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    hash.max(1)
}

fn class_index(class: TaskClass) -> usize {
    match class {
        TaskClass::Cpu => 0,
        TaskClass::Gpu => 1,
        TaskClass::Io => 2,
    }
}

impl NodeCorrections {
    /// The correction for `task` and where it came from: its artifact's
    /// where that has run here, else its class's.
    pub fn for_task(&self, task: &PendingTask) -> (Correction, CorrectionSource) {
        self.for_work(task.class, task.artifact)
    }

    /// The correction for work of `class` from `artifact` (0: none known):
    /// the node's own for the artifact, else the fleet's for it, else the
    /// node's for the class, else the fleet's for the class.
    pub fn for_work(&self, class: TaskClass, artifact: u64) -> (Correction, CorrectionSource) {
        if artifact != 0 {
            if let Some((_, correction)) = self.by_artifact.iter().find(|(key, _)| *key == artifact)
            {
                let source = if correction.samples > 0 {
                    CorrectionSource::Artifact
                } else {
                    CorrectionSource::FleetArtifact
                };
                return (*correction, source);
            }
        }
        let class = self.by_class[class_index(class)];
        if class.samples > 0 {
            (class, CorrectionSource::Class)
        } else if class.log_ratio != 0.0 {
            (class, CorrectionSource::FleetClass)
        } else {
            (Correction::default(), CorrectionSource::None)
        }
    }

    /// The factor `task`'s estimates are multiplied by here.
    pub fn factor(&self, task: &PendingTask) -> f64 {
        self.for_task(task).0.factor()
    }

    /// Takes one finished attempt of `task`, `estimated_s` seconds as
    /// modelled (before any correction) and `observed_s` taken: into its
    /// class's correction, and its artifact's.
    pub fn observe(&mut self, task: &PendingTask, estimated_s: f64, observed_s: f64) {
        self.observe_work(task.class, task.artifact, estimated_s, observed_s);
    }

    /// [`NodeCorrections::observe`] for work of `class` from `artifact`
    /// (0: none known); `false` when the sample was not usable.
    pub fn observe_work(
        &mut self,
        class: TaskClass,
        artifact: u64,
        estimated_s: f64,
        observed_s: f64,
    ) -> bool {
        if !self.by_class[class_index(class)].observe(estimated_s, observed_s) {
            return false;
        }
        if artifact == 0 {
            return true;
        }
        if let Some((_, correction)) = self
            .by_artifact
            .iter_mut()
            .find(|(key, _)| *key == artifact)
        {
            correction.observe(estimated_s, observed_s);
            return true;
        }
        if self.by_artifact.len() >= MAX_ARTIFACTS {
            if let Some(fewest) = self
                .by_artifact
                .iter()
                .enumerate()
                .min_by_key(|(_, (_, correction))| correction.samples)
                .map(|(index, _)| index)
            {
                self.by_artifact.swap_remove(fewest);
            }
        }
        let mut correction = Correction::default();
        correction.observe(estimated_s, observed_s);
        self.by_artifact.push((artifact, correction));
        true
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::testing::task;

    #[test]
    fn a_node_four_times_slower_than_it_says_is_learned_within_a_few_attempts() {
        let mut correction = Correction::default();
        let mut attempts = 0;
        while (correction.factor() / 4.0 - 1.0).abs() > 0.25 {
            assert!(correction.observe(10.0, 40.0));
            attempts += 1;
            assert!(attempts <= 20, "not learned in 20 attempts: {correction:?}");
        }
        assert!(attempts <= 5, "{attempts} attempts");
        // It keeps converging, from below: never past the truth.
        for _ in 0..20 {
            correction.observe(10.0, 40.0);
            assert!(correction.factor() <= 4.0 + 1e-9);
        }
        assert!((correction.factor() - 4.0).abs() < 0.01, "{correction:?}");
    }

    #[test]
    fn one_sample_moves_a_correction_by_at_most_a_factor_of_two() {
        let mut correction = Correction::default();
        correction.observe(1.0, 1000.0);
        assert!((correction.factor() - 2.0).abs() < 1e-9);
        let mut settled = Correction {
            log_ratio: 0.0,
            samples: 100,
        };
        settled.observe(1.0, 1e-6);
        assert!(settled.factor() >= 0.5 - 1e-9);
    }

    #[test]
    fn a_node_that_changes_is_followed() {
        let mut correction = Correction::default();
        for _ in 0..200 {
            correction.observe(1.0, 1.0);
        }
        for _ in 0..12 {
            correction.observe(1.0, 3.0);
        }
        assert!(
            (correction.factor() / 3.0 - 1.0).abs() < 0.1,
            "{correction:?}"
        );
    }

    #[test]
    fn samples_that_are_not_two_positive_durations_change_nothing() {
        let mut correction = Correction::default();
        for (estimated, observed) in [
            (0.0, 1.0),
            (1.0, 0.0),
            (-1.0, 1.0),
            (f64::NAN, 1.0),
            (1.0, f64::INFINITY),
        ] {
            assert!(!correction.observe(estimated, observed));
        }
        assert_eq!(correction, Correction::default());
    }

    #[test]
    fn an_artifact_run_here_uses_its_own_correction_and_others_the_class() {
        let mut node = NodeCorrections::default();
        let mut slow = task(1, TaskClass::Cpu);
        slow.artifact = 7;
        let mut other = task(2, TaskClass::Cpu);
        other.artifact = 8;
        let gpu = task(3, TaskClass::Gpu);
        assert_eq!(node.for_task(&slow).1, CorrectionSource::None);
        node.observe(&slow, 1.0, 2.0);
        assert_eq!(node.for_task(&slow).1, CorrectionSource::Artifact);
        assert_eq!(node.for_task(&other).1, CorrectionSource::Class);
        assert_eq!(node.for_task(&gpu).1, CorrectionSource::None);
        assert!((node.factor(&other) - 2.0).abs() < 1e-9);
        assert!((node.factor(&gpu) - 1.0).abs() < 1e-9);
    }

    #[test]
    fn a_node_that_has_not_run_an_artifact_borrows_what_the_others_measured() {
        let mut nodes = vec![
            crate::testing::node("a", 4.0, 1.0),
            crate::testing::node("b", 4.0, 1.0),
            crate::testing::node("c", 4.0, 1.0),
        ];
        let mut echo = task(1, TaskClass::Cpu);
        echo.artifact = 7;
        // "a" measured it at a quarter of the model, "b" at half.
        for _ in 0..10 {
            nodes[0].corrections.observe(&echo, 1.0, 0.25);
            nodes[1].corrections.observe(&echo, 1.0, 0.5);
        }
        share_priors(&mut nodes);
        let (prior, source) = nodes[2].corrections.for_task(&echo);
        assert_eq!(source, CorrectionSource::FleetArtifact);
        assert!(
            (prior.factor() - (0.25_f64 * 0.5).sqrt()).abs() < 0.01,
            "{prior:?}"
        );
        // The class too, and own corrections are untouched.
        let (class, source) = nodes[2].corrections.for_work(TaskClass::Cpu, 0);
        assert_eq!(source, CorrectionSource::FleetClass);
        assert!(class.factor() < 1.0);
        assert_eq!(
            nodes[0].corrections.for_task(&echo).1,
            CorrectionSource::Artifact
        );
        assert!((nodes[0].corrections.factor(&echo) - 0.25).abs() < 0.01);
        // Its own first sample replaces the prior (within one step).
        nodes[2].corrections.observe(&echo, 1.0, 0.35);
        let (own, source) = nodes[2].corrections.for_task(&echo);
        assert_eq!(source, CorrectionSource::Artifact);
        assert!((own.factor() - 0.35).abs() < 1e-9, "{own:?}");
        // Shared again, the priors follow and own ones stay.
        share_priors(&mut nodes);
        assert_eq!(
            nodes[2].corrections.for_task(&echo).1,
            CorrectionSource::Artifact
        );
        assert_eq!(
            nodes[2].corrections.by_artifact.len(),
            1,
            "no duplicate entry: {:?}",
            nodes[2].corrections.by_artifact
        );
    }

    #[test]
    fn one_lying_node_does_not_move_the_priors_of_the_others() {
        let mut nodes: Vec<NodeView> = ["honest-1", "honest-2", "liar", "new"]
            .iter()
            .map(|id| crate::testing::node(id, 4.0, 1.0))
            .collect();
        let mut work = task(1, TaskClass::Cpu);
        work.artifact = 9;
        // Two honest nodes run it as modelled; the liar declared 100× its
        // speed and runs it a hundred times slower than estimated (learning
        // is capped at ×2 a sample, so twenty samples take it all the way).
        for _ in 0..20 {
            nodes[0].corrections.observe(&work, 1.0, 1.0);
            nodes[1].corrections.observe(&work, 1.0, 1.1);
            nodes[2].corrections.observe(&work, 1.0, 100.0);
        }
        assert!(nodes[2].corrections.factor(&work) > 50.0);
        share_priors(&mut nodes);
        // The newcomer's prior is the honest nodes' (the median of three),
        // where a mean would have put it at about 4.8 (log-mean of 1, 1.1, 100).
        for (prior, source) in [
            nodes[3].corrections.for_task(&work),
            nodes[3].corrections.for_work(TaskClass::Cpu, 0),
        ] {
            assert!(
                source == CorrectionSource::FleetArtifact || source == CorrectionSource::FleetClass
            );
            assert!((prior.factor() - 1.1).abs() < 0.01, "{prior:?}");
        }
    }

    #[test]
    fn artifact_keys_tell_names_with_a_common_start_apart_and_are_never_zero() {
        assert_ne!(
            artifact_key(b"video-transcode-a"),
            artifact_key(b"video-transcode-b")
        );
        assert_eq!(artifact_key(b"x"), artifact_key(b"x"));
        assert_ne!(artifact_key(b""), 0);
    }

    #[test]
    fn a_node_keeps_a_bounded_number_of_artifacts() {
        let mut node = NodeCorrections::default();
        let mut kept = task(1, TaskClass::Cpu);
        kept.artifact = 1;
        for _ in 0..3 {
            node.observe(&kept, 1.0, 2.0);
        }
        for artifact in 2..(MAX_ARTIFACTS as u64 * 3) {
            let mut once = task(artifact, TaskClass::Cpu);
            once.artifact = artifact;
            node.observe(&once, 1.0, 1.0);
        }
        assert_eq!(node.by_artifact.len(), MAX_ARTIFACTS);
        assert!(node.by_artifact.iter().any(|(artifact, _)| *artifact == 1));
    }
}
