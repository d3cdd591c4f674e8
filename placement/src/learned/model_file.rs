//! The model file: a trained policy's networks with the feature layout they
//! expect, in a small versioned JSON document.
//!
//! ```json
//! { "format": "starling-model", "version": 1, "policy": "hirl",
//!   "layout": "starling-placement-features/1", "features": ["task.class.cpu", ...],
//!   "networks": { "placement": { "layers": [...] }, "power": { "layers": [...] } },
//!   "training": { "seed": 42, "devices": 20, ... } }
//! ```
//!
//! Loading checks everything a forward pass relies on, so a model that loads
//! cannot misread a vector: the format and version, the layout name *and* the
//! feature names in order (a renamed or reordered feature is a different layout),
//! each network's input size against the layout, and every weight.

use serde::{Deserialize, Serialize};

use crate::learned::features::{self, FEATURES, LAYOUT};
use crate::learned::network::{Mlp, ShapeError};
use crate::learned::reward::RewardShape;

/// The `format` every model file carries.
pub const MODEL_FORMAT: &str = "starling-model";
/// The model file version this build reads and writes.
pub const MODEL_VERSION: u32 = 1;

/// Which learned policy a model drives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LearnedKind {
    /// HiRL's hierarchy: a DDQN picks the device, a TD3 actor its power level.
    Hirl,
    /// The paper's main comparison: one DDQN picks (device, power level) jointly.
    Ddqn,
}

impl LearnedKind {
    /// Both kinds.
    pub const ALL: [LearnedKind; 2] = [LearnedKind::Hirl, LearnedKind::Ddqn];

    /// The policy's registry name.
    pub fn as_str(self) -> &'static str {
        match self {
            LearnedKind::Hirl => "hirl",
            LearnedKind::Ddqn => "ddqn",
        }
    }

    /// The kind whose registry name is `name`, if any.
    pub fn from_name(name: &str) -> Option<LearnedKind> {
        match name.trim().to_ascii_lowercase().as_str() {
            "hirl" => Some(LearnedKind::Hirl),
            "ddqn" => Some(LearnedKind::Ddqn),
            _ => None,
        }
    }
}

/// A policy's networks.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Networks {
    /// The placement Q-network: one candidate's features in, its value out. For
    /// `hirl` a candidate is a node (seen at full power); for `ddqn` a (node, power
    /// level) pair.
    pub placement: Mlp,
    /// HiRL's power actor (TD3): the chosen node's features in, an action in
    /// 0..1 out, which [`Networks::power_action`] maps to a power level.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub power: Option<Mlp>,
    /// What the power actor's output means (files without it: a speed fraction).
    #[serde(default)]
    pub power_action: PowerAction,
}

/// What HiRL's power actor answers, in 0..1.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PowerAction {
    /// A fraction of the node's top speed: the task runs at the lowest level at
    /// least that fast ([`crate::learned::level_for_speed`]). The first models'
    /// action: the same number means a safe level on one node and a late one on
    /// another, so the actor has to learn every node's speeds and the task's
    /// slack to choose anything below the top.
    #[default]
    Speed,
    /// A share of the task's slack at full power that it may spend running
    /// slower: 0 keeps all of it (the top level), 1 spends all of it (the
    /// lowest level estimated to finish by the deadline), in between the lowest
    /// level that leaves the rest.
    /// The same number means the same risk on every node, so the actor learns
    /// how much of the estimate's margin to keep.
    SlackShare,
}

impl PowerAction {
    /// The name in model files and on the command line.
    pub fn as_str(self) -> &'static str {
        match self {
            PowerAction::Speed => "speed",
            PowerAction::SlackShare => "slack-share",
        }
    }

    /// The action named `name`, if any.
    pub fn from_name(name: &str) -> Option<Self> {
        match name {
            "speed" => Some(PowerAction::Speed),
            "slack-share" => Some(PowerAction::SlackShare),
            _ => None,
        }
    }
}

/// How a model was trained: what `starling-coordinator train` was asked and
/// what it measured, so a model can be reproduced and judged.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TrainingInfo {
    /// Seed of the simulated worlds and the networks' initial weights.
    pub seed: u64,
    /// Offered loads trained at (fractions of capacity).
    pub loads: Vec<f64>,
    /// Devices in the training fleet.
    pub devices: usize,
    /// Simulated episodes.
    pub episodes: u32,
    /// Gradient steps of the placement network.
    pub steps: u64,
    /// Wall time the training took, seconds.
    pub seconds: f64,
    /// Deadline completion of the final greedy evaluation.
    pub on_time_rate: f64,
    /// The command that reproduces the model.
    pub command: String,
    /// The reward it was trained on (files without one predate the margin).
    #[serde(default = "reward_before_the_margin")]
    pub reward: RewardShape,
}

/// Model files written before the reward had a margin were trained on this.
fn reward_before_the_margin() -> RewardShape {
    RewardShape::BUDGET
}

/// A trained policy as stored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelFile {
    /// Always [`MODEL_FORMAT`].
    pub format: String,
    /// The file format's version ([`MODEL_VERSION`]).
    pub version: u32,
    /// Which policy it drives.
    pub policy: LearnedKind,
    /// The feature layout's name and version ([`LAYOUT`]).
    pub layout: String,
    /// The features, in the order the networks read them.
    pub features: Vec<String>,
    /// The networks.
    pub networks: Networks,
    /// How it was trained.
    #[serde(default)]
    pub training: TrainingInfo,
}

/// Why a model file cannot be used.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ModelError {
    /// Not JSON, or not the model file's shape.
    #[error("not a readable model file: {0}")]
    Parse(String),
    /// Some other kind of document.
    #[error("not a Starling model file (format {found:?}, expected {MODEL_FORMAT:?})")]
    Format {
        /// The `format` found.
        found: String,
    },
    /// A file version this build does not read.
    #[error("model file version {found} is not supported (this build reads version {MODEL_VERSION}); retrain it with this build's `starling-coordinator train`")]
    Version {
        /// The version found.
        found: u32,
    },
    /// Trained on another feature layout.
    #[error("model expects feature layout {found:?} ({found_count} features{difference}), but this build computes {LAYOUT:?} ({FEATURES} features); retrain it with this build's `starling-coordinator train`")]
    Layout {
        /// The layout the model names.
        found: String,
        /// How many features the model lists.
        found_count: usize,
        /// The first feature that differs, as a phrase (may be empty).
        difference: String,
    },
    /// A network is missing or malformed.
    #[error("network {network:?}: {what}")]
    Network {
        /// Which network.
        network: &'static str,
        /// What is wrong.
        what: String,
    },
    /// The model drives another policy than the one asked for.
    #[error("the model drives policy {found:?}, not {wanted:?}")]
    Kind {
        /// The policy asked for.
        wanted: &'static str,
        /// The policy the model drives.
        found: &'static str,
    },
}

impl ModelFile {
    /// A model of `kind` on this build's layout.
    pub fn new(kind: LearnedKind, networks: Networks, training: TrainingInfo) -> Self {
        Self {
            format: MODEL_FORMAT.to_owned(),
            version: MODEL_VERSION,
            policy: kind,
            layout: LAYOUT.to_owned(),
            features: features::names(),
            networks,
            training,
        }
    }

    /// Reads and checks a model file's text.
    pub fn from_json(text: &str) -> Result<Self, ModelError> {
        // The header first, so that a file of another version or layout is named
        // as such rather than as a parse error in a field that moved.
        #[derive(Deserialize)]
        struct Header {
            format: Option<String>,
            version: Option<u32>,
        }
        let header: Header =
            serde_json::from_str(text).map_err(|error| ModelError::Parse(error.to_string()))?;
        let format = header.format.unwrap_or_default();
        if format != MODEL_FORMAT {
            return Err(ModelError::Format { found: format });
        }
        match header.version {
            Some(MODEL_VERSION) => {}
            found => {
                return Err(ModelError::Version {
                    found: found.unwrap_or(0),
                })
            }
        }
        let model: ModelFile =
            serde_json::from_str(text).map_err(|error| ModelError::Parse(error.to_string()))?;
        model.validate()?;
        Ok(model)
    }

    /// The file's text (pretty JSON: small, and diffs stay readable). Weights
    /// read back bit for bit (serde_json's `float_roundtrip`).
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_default()
    }

    /// Checks the layout and the networks (see the module docs).
    pub fn validate(&self) -> Result<(), ModelError> {
        let expected = features::names();
        if self.layout != LAYOUT || self.features != expected {
            let difference = self
                .features
                .iter()
                .zip(&expected)
                .position(|(found, wanted)| found != wanted)
                .map(|index| {
                    format!(
                        "; feature {index} is {:?} where this build has {:?}",
                        self.features[index], expected[index]
                    )
                })
                .unwrap_or_default();
            return Err(ModelError::Layout {
                found: self.layout.clone(),
                found_count: self.features.len(),
                difference,
            });
        }
        let check = |network: &'static str, mlp: &Mlp| -> Result<(), ModelError> {
            mlp.validate()
                .map_err(|error: ShapeError| ModelError::Network {
                    network,
                    what: error.to_string(),
                })?;
            if mlp.inputs() != FEATURES || mlp.outputs() != 1 {
                return Err(ModelError::Network {
                    network,
                    what: format!(
                        "takes {} inputs and gives {} outputs; the layout needs {FEATURES} in and 1 out",
                        mlp.inputs(),
                        mlp.outputs()
                    ),
                });
            }
            Ok(())
        };
        check("placement", &self.networks.placement)?;
        match (self.policy, &self.networks.power) {
            (LearnedKind::Hirl, Some(power)) => check("power", power)?,
            (LearnedKind::Hirl, None) => {
                return Err(ModelError::Network {
                    network: "power",
                    what: "missing: a hirl model needs its power actor".to_owned(),
                })
            }
            (LearnedKind::Ddqn, _) => {}
        }
        Ok(())
    }

    /// Checks that the model drives `kind`.
    pub fn expect_kind(&self, kind: LearnedKind) -> Result<(), ModelError> {
        if self.policy == kind {
            Ok(())
        } else {
            Err(ModelError::Kind {
                wanted: kind.as_str(),
                found: self.policy.as_str(),
            })
        }
    }
}

/// The trained models shipped with Starling for the standard device profiles
/// (`placement/models/`), reproducible with the command each records.
pub fn shipped(kind: LearnedKind) -> Result<ModelFile, ModelError> {
    let text = match kind {
        LearnedKind::Hirl => include_str!("../../models/hirl.json"),
        LearnedKind::Ddqn => include_str!("../../models/ddqn.json"),
    };
    ModelFile::from_json(text)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn shipped_models_load_and_name_their_kind() {
        for kind in LearnedKind::ALL {
            let model = shipped(kind).unwrap();
            assert_eq!(model.policy, kind);
            assert_eq!(model.layout, LAYOUT);
            model.expect_kind(kind).unwrap();
            assert_eq!(ModelFile::from_json(&model.to_json()).unwrap(), model);
        }
        let hirl = shipped(LearnedKind::Hirl).unwrap();
        assert!(hirl.networks.power.is_some());
        assert_eq!(hirl.networks.power_action, PowerAction::SlackShare);
        assert_eq!(hirl.training.reward, RewardShape::DEADLINE_MARGIN);
    }

    #[test]
    fn files_from_before_the_margin_read_as_what_they_were_trained_on() {
        // The first models' files have neither field: their actor answered a
        // speed fraction and their reward charged every millisecond.
        let mut json: serde_json::Value =
            serde_json::from_str(&shipped(LearnedKind::Hirl).unwrap().to_json()).unwrap();
        json["networks"]
            .as_object_mut()
            .unwrap()
            .remove("power_action");
        json["training"].as_object_mut().unwrap().remove("reward");
        let old = ModelFile::from_json(&json.to_string()).unwrap();
        assert_eq!(old.networks.power_action, PowerAction::Speed);
        assert_eq!(old.training.reward, RewardShape::BUDGET);
        json["networks"]["power_action"] = "fastest".into();
        let message = ModelFile::from_json(&json.to_string())
            .unwrap_err()
            .to_string();
        assert!(message.contains("fastest"), "{message}");
        for action in [PowerAction::Speed, PowerAction::SlackShare] {
            assert_eq!(PowerAction::from_name(action.as_str()), Some(action));
        }
    }

    #[test]
    fn a_model_of_another_layout_is_refused_with_a_clear_message() {
        let model = shipped(LearnedKind::Ddqn).unwrap();
        let mut renamed = model.clone();
        renamed.features[3] = "task.work_log".into();
        let text = renamed.to_json();
        let error = ModelFile::from_json(&text).unwrap_err();
        let message = error.to_string();
        assert!(matches!(error, ModelError::Layout { .. }), "{message}");
        assert!(
            message.contains("feature 3 is \"task.work_log\" where this build has \"task.work\"")
                && message.contains("retrain"),
            "{message}"
        );
        let mut older = model.clone();
        older.layout = "starling-placement-features/0".into();
        older.features.pop();
        let message = ModelFile::from_json(&older.to_json())
            .unwrap_err()
            .to_string();
        assert!(
            message.contains("\"starling-placement-features/0\" (23 features)"),
            "{message}"
        );

        let mut wide = model.clone();
        wide.networks.placement.layers[0].inputs = 25;
        let message = ModelFile::from_json(&wide.to_json())
            .unwrap_err()
            .to_string();
        assert!(message.contains("network \"placement\""), "{message}");

        let mut hirl = shipped(LearnedKind::Hirl).unwrap();
        hirl.networks.power = None;
        let message = ModelFile::from_json(&hirl.to_json())
            .unwrap_err()
            .to_string();
        assert!(message.contains("power actor"), "{message}");
        assert!(model.expect_kind(LearnedKind::Hirl).is_err());
    }

    #[test]
    fn other_documents_and_versions_are_named() {
        assert!(matches!(
            ModelFile::from_json("{\"format\":\"onnx\"}"),
            Err(ModelError::Format { .. })
        ));
        let error =
            ModelFile::from_json("{\"format\":\"starling-model\",\"version\":2}").unwrap_err();
        assert!(
            error.to_string().contains("version 2 is not supported"),
            "{error}"
        );
        assert!(matches!(
            ModelFile::from_json("not json"),
            Err(ModelError::Parse(_))
        ));
    }
}
