//! The policies by name: every name the coordinator, the simulator and the
//! trainer accept, and the one function that builds each (the heuristic and
//! the baselines from `policy`, the learned ones from `learned` with their
//! models). It stands above both, so neither imports the other's builder.

use crate::learned::{shipped, LearnedKind, LearnedPolicy, ModelError, ModelFile, HIRL_FULL_POWER};
use crate::policy::{
    EarliestFinishPolicy, EdgeCloudSimDefaultPolicy, HeuristicPolicy, HeuristicTuning,
    KubernetesPolicy, LeastLoadedPolicy, Policy, PureEdgeSimRoundRobinPolicy,
    PureEdgeSimTradeOffPolicy, RandomPolicy, RoundRobinPolicy, SearchMode,
    StaticOptimisationPolicy,
};

/// Every policy's registry name: the heuristic first, then the baselines.
pub const POLICY_NAMES: &[&str] = &[
    "heuristic",
    "heuristic-exhaustive",
    "random",
    "round-robin",
    "least-loaded",
    "kubernetes",
    "earliest-finish",
    "static-optimisation",
    "hirl",
    "ddqn",
    "pureedgesim-round-robin",
    "pureedgesim-trade-off",
    "edgecloudsim-default",
];

/// Policies that take a part of another away to show that part's share (not
/// run unless named): HiRL's placement network without its power actor.
pub const ABLATION_POLICIES: &[&str] = &[HIRL_FULL_POWER];

/// A policy name that is not in [`POLICY_NAMES`] or [`ABLATION_POLICIES`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown placement policy {name:?}; valid names: {}", valid.join(", "))]
pub struct UnknownPolicy {
    /// The name asked for.
    pub name: String,
    /// The valid names.
    pub valid: Vec<String>,
}

/// Why a policy could not be built.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PolicyError {
    /// No policy has that name.
    #[error(transparent)]
    Unknown(#[from] UnknownPolicy),
    /// A learned policy's model is unusable.
    #[error("policy {policy}: {error}")]
    Model {
        /// The policy.
        policy: &'static str,
        /// What is wrong with its model.
        #[source]
        error: ModelError,
    },
}

/// Which model a policy name runs on: `hirl` and `hirl-full-power` a HiRL
/// model, `ddqn` a single-DDQN one, any other name none.
pub fn model_kind(name: &str) -> Option<LearnedKind> {
    if name == HIRL_FULL_POWER {
        Some(LearnedKind::Hirl)
    } else {
        LearnedKind::from_name(name)
    }
}

/// Builds a policy by name; `seed` feeds the policies that draw random numbers.
/// The learned policies (`hirl`, `ddqn`) run the models shipped with Starling.
pub fn policy_by_name(name: &str, seed: u64) -> Result<Box<dyn Policy>, PolicyError> {
    policy_with_tuning(name, seed, &HeuristicTuning::default(), &[])
}

/// Like [`policy_by_name`], with explicit knobs for the heuristic and models for
/// the learned policies: a model in `models` for the policy asked for replaces
/// the shipped one.
pub fn policy_with_tuning(
    name: &str,
    seed: u64,
    tuning: &HeuristicTuning,
    models: &[ModelFile],
) -> Result<Box<dyn Policy>, PolicyError> {
    let full_power = name == HIRL_FULL_POWER;
    if let Some(kind) = model_kind(name) {
        let model = match models.iter().find(|model| model.policy == kind) {
            Some(model) => model.clone(),
            None => shipped(kind).map_err(|error| PolicyError::Model {
                policy: kind.as_str(),
                error,
            })?,
        };
        let policy = LearnedPolicy::new(&model, seed);
        return Ok(Box::new(if full_power {
            policy.at_full_power()
        } else {
            policy
        }));
    }
    let policy: Box<dyn Policy> = match name.trim().to_ascii_lowercase().as_str() {
        "heuristic" => Box::new(HeuristicPolicy::with_tuning(
            SearchMode::Indexed,
            seed,
            *tuning,
        )),
        "heuristic-exhaustive" => Box::new(HeuristicPolicy::with_tuning(
            SearchMode::Exhaustive,
            seed,
            *tuning,
        )),
        "random" => Box::new(RandomPolicy::new(seed)),
        "round-robin" | "round_robin" => Box::new(RoundRobinPolicy::default()),
        "least-loaded" | "least_loaded" => Box::new(LeastLoadedPolicy),
        "kubernetes" | "k8s" => Box::new(KubernetesPolicy),
        "earliest-finish" | "eft" => Box::new(EarliestFinishPolicy),
        "static-optimisation" | "static" => Box::new(StaticOptimisationPolicy),
        "pureedgesim-round-robin" => Box::new(PureEdgeSimRoundRobinPolicy::default()),
        "pureedgesim-trade-off" => Box::new(PureEdgeSimTradeOffPolicy::default()),
        // Without a scenario no task has a cloud probability.
        "edgecloudsim-default" => Box::new(EdgeCloudSimDefaultPolicy::new(seed, 0.0)),
        _ => {
            return Err(UnknownPolicy {
                name: name.to_owned(),
                valid: POLICY_NAMES
                    .iter()
                    .chain(ABLATION_POLICIES)
                    .map(|name| (*name).to_owned())
                    .collect(),
            }
            .into())
        }
    };
    Ok(policy)
}

/// Like [`policy_with_tuning`], for a run of a scenario: EdgeCloudSim's
/// default policy takes the scenario's mean cloud probability. (The number,
/// not the scenario: the simulator uses policies, not the other way round.)
pub fn for_scenario(
    name: &str,
    seed: u64,
    tuning: &HeuristicTuning,
    models: &[ModelFile],
    cloud_probability: f64,
) -> Result<Box<dyn Policy>, PolicyError> {
    if name.trim().eq_ignore_ascii_case("edgecloudsim-default") {
        return Ok(Box::new(EdgeCloudSimDefaultPolicy::new(
            seed,
            cloud_probability,
        )));
    }
    policy_with_tuning(name, seed, tuning, models)
}
