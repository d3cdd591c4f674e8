//! A training run of seconds: the loss falls and the trained policy beats
//! random placement on worlds it never trained on.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use starling_learn::{evaluate, train, TrainConfig};
use starling_placement::learned::{LearnedKind, LearnedPolicy, ModelFile};
use starling_placement::policy::RandomPolicy;

fn tiny(kind: LearnedKind) -> TrainConfig {
    TrainConfig {
        kind,
        seed: 5,
        loads: vec![0.6],
        nodes_per_profile: 1,
        episodes: 14,
        episode_s: 12.0,
        updates_per_episode: 40,
        batch: 32,
        ..TrainConfig::default()
    }
}

fn check(kind: LearnedKind) {
    let config = tiny(kind);
    let mut seen = 0;
    let trained = train(&config, &mut |_| seen += 1).unwrap();
    assert_eq!(seen, config.episodes);
    let losses: Vec<f64> = trained
        .curve
        .iter()
        .map(|point| point.loss)
        .filter(|loss| loss.is_finite())
        .collect();
    assert!(losses.len() >= 8, "{losses:?}");
    let early = losses[..3].iter().sum::<f64>() / 3.0;
    let late = losses[losses.len() - 3..].iter().sum::<f64>() / 3.0;
    assert!(late < early, "{kind:?}: loss did not fall: {losses:?}");

    // The model round-trips through its file and drives the policy.
    let model = ModelFile::from_json(&trained.model.to_json()).unwrap();
    assert_eq!(model, trained.model);
    assert_eq!(model.policy, kind);

    let (mut learned_on_time, mut random_on_time, mut tasks) = (0, 0, 0);
    for seed in [101, 202, 303] {
        let mut learned = LearnedPolicy::new(&model, seed);
        let mut random = RandomPolicy::new(seed);
        let a = evaluate(&config, &mut learned, 0.6, seed).unwrap();
        let b = evaluate(&config, &mut random, 0.6, seed).unwrap();
        assert_eq!(a.tasks, b.tasks, "the same world for both");
        assert_eq!(a.constraint_violations, 0);
        learned_on_time += a.on_time;
        random_on_time += b.on_time;
        tasks += a.tasks;
    }
    eprintln!("{kind:?}: on time {learned_on_time} of {tasks}; random {random_on_time}; losses {losses:?}");
    assert!(
        learned_on_time > random_on_time,
        "{kind:?}: trained {learned_on_time} on time, random {random_on_time}, of {tasks}"
    );
}

#[test]
fn hirl_learns_in_seconds() {
    check(LearnedKind::Hirl);
}

#[test]
fn ddqn_learns_in_seconds() {
    check(LearnedKind::Ddqn);
}
