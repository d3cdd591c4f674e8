//! The trained networks at inference time: small multi-layer perceptrons held as
//! plain weights.
//!
//! Training (autodiff, optimisers, replay) happens in `starling-learn` with
//! candle; what the coordinator runs is only the forward pass, a few hundred
//! multiply-adds per candidate. Keeping it here as plain loops keeps the engine
//! pure and free of an ML runtime, and makes a decision over 1 000 nodes cost
//! microseconds rather than a tensor library's per-call overhead. The learner's
//! tests check that this forward pass and candle's agree.

use serde::{Deserialize, Serialize};

/// What a layer applies to its output.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Activation {
    /// Nothing (a Q-value head).
    Linear,
    /// `max(0, x)` (hidden layers).
    Relu,
    /// `1 / (1 + e^-x)` (the power actor's head: a speed fraction in 0..1).
    Sigmoid,
}

/// One fully connected layer: `activation(weights · x + bias)`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Dense {
    /// Inputs it takes.
    pub inputs: usize,
    /// Outputs it gives.
    pub outputs: usize,
    /// `outputs × inputs` weights, row-major (one row per output), as candle's
    /// `Linear` holds them.
    pub weights: Vec<f32>,
    /// One bias per output.
    pub bias: Vec<f32>,
    /// Applied to each output.
    pub activation: Activation,
}

/// A feed-forward network: layers applied in order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Mlp {
    /// The layers, input side first.
    pub layers: Vec<Dense>,
}

/// Why a network's shape is unusable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ShapeError {
    /// The network has no layers.
    #[error("the network has no layers")]
    Empty,
    /// A layer's weights or bias do not match its declared size.
    #[error("layer {layer}: {what}")]
    Layer {
        /// Which layer (0 = input side).
        layer: usize,
        /// What is wrong.
        what: String,
    },
}

impl Mlp {
    /// Inputs the first layer takes (0 without layers).
    pub fn inputs(&self) -> usize {
        self.layers.first().map_or(0, |layer| layer.inputs)
    }

    /// Outputs the last layer gives (0 without layers).
    pub fn outputs(&self) -> usize {
        self.layers.last().map_or(0, |layer| layer.outputs)
    }

    /// Checks that every layer's arrays match its sizes, that consecutive layers
    /// chain, and that every weight is finite.
    pub fn validate(&self) -> Result<(), ShapeError> {
        if self.layers.is_empty() {
            return Err(ShapeError::Empty);
        }
        let mut expected_inputs = self.inputs();
        for (index, layer) in self.layers.iter().enumerate() {
            let fail = |what: String| ShapeError::Layer { layer: index, what };
            if layer.inputs != expected_inputs {
                return Err(fail(format!(
                    "takes {} inputs but the layer before gives {expected_inputs}",
                    layer.inputs
                )));
            }
            if layer.inputs == 0
                || layer.outputs == 0
                || layer.inputs > 4096
                || layer.outputs > 4096
            {
                return Err(fail(format!(
                    "{} × {} is not a size this engine runs (1..=4096 each)",
                    layer.outputs, layer.inputs
                )));
            }
            if layer.weights.len() != layer.inputs * layer.outputs {
                return Err(fail(format!(
                    "{} weights for {} × {}",
                    layer.weights.len(),
                    layer.outputs,
                    layer.inputs
                )));
            }
            if layer.bias.len() != layer.outputs {
                return Err(fail(format!(
                    "{} biases for {} outputs",
                    layer.bias.len(),
                    layer.outputs
                )));
            }
            if !layer
                .weights
                .iter()
                .chain(&layer.bias)
                .all(|value| value.is_finite())
            {
                return Err(fail("a weight is not a finite number".to_owned()));
            }
            expected_inputs = layer.outputs;
        }
        Ok(())
    }

    /// The network's output for one input vector. `scratch` is reused between
    /// calls to avoid allocating per candidate. An input of the wrong length is
    /// cut or padded with zeros (callers check lengths once, on load).
    pub fn forward(&self, input: &[f32], scratch: &mut Scratch) -> Vec<f32> {
        let Scratch { a, b } = scratch;
        a.clear();
        a.extend_from_slice(input);
        for layer in &self.layers {
            a.resize(layer.inputs, 0.0);
            b.clear();
            for (row, bias) in layer.weights.chunks_exact(layer.inputs).zip(&layer.bias) {
                let dot: f32 = row.iter().zip(a.iter()).map(|(w, x)| w * x).sum();
                let value = dot + bias;
                b.push(match layer.activation {
                    Activation::Linear => value,
                    Activation::Relu => value.max(0.0),
                    Activation::Sigmoid => 1.0 / (1.0 + (-value).exp()),
                });
            }
            core::mem::swap(a, b);
        }
        a.clone()
    }

    /// The first output for one input (a Q-value or an action).
    pub fn forward1(&self, input: &[f32], scratch: &mut Scratch) -> f32 {
        self.forward(input, scratch).first().copied().unwrap_or(0.0)
    }
}

/// Reusable buffers for [`Mlp::forward`].
#[derive(Debug, Clone, Default)]
pub struct Scratch {
    a: Vec<f32>,
    b: Vec<f32>,
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    fn tiny() -> Mlp {
        Mlp {
            layers: vec![
                Dense {
                    inputs: 2,
                    outputs: 2,
                    weights: vec![1.0, -1.0, 0.5, 0.5],
                    bias: vec![0.0, 1.0],
                    activation: Activation::Relu,
                },
                Dense {
                    inputs: 2,
                    outputs: 1,
                    weights: vec![2.0, 1.0],
                    bias: vec![-1.0],
                    activation: Activation::Linear,
                },
            ],
        }
    }

    #[test]
    fn forward_computes_by_hand() {
        let net = tiny();
        net.validate().unwrap();
        let mut scratch = Scratch::default();
        // Hidden: relu(1 - 3) = 0, relu(0.5 + 1.5 + 1) = 3; out: 0 + 3 - 1 = 2.
        assert_eq!(net.forward1(&[1.0, 3.0], &mut scratch), 2.0);
        // Hidden: relu(3 - 1) = 2, relu(2 + 1) = 3; out: 4 + 3 - 1 = 6.
        assert_eq!(net.forward1(&[3.0, 1.0], &mut scratch), 6.0);
        let mut sigmoid = net.clone();
        sigmoid.layers[1].activation = Activation::Sigmoid;
        let p = sigmoid.forward1(&[3.0, 1.0], &mut scratch);
        assert!((p - 1.0 / (1.0 + (-6.0f32).exp())).abs() < 1e-6);
    }

    #[test]
    fn bad_shapes_are_named() {
        let mut net = tiny();
        net.layers[1].inputs = 3;
        assert!(net.validate().unwrap_err().to_string().contains("layer 1"));
        let mut net = tiny();
        net.layers[0].weights.pop();
        assert!(net
            .validate()
            .unwrap_err()
            .to_string()
            .contains("3 weights"));
        let mut net = tiny();
        net.layers[0].bias[0] = f32::NAN;
        assert!(net.validate().is_err());
        assert_eq!(Mlp { layers: vec![] }.validate(), Err(ShapeError::Empty));
    }
}
