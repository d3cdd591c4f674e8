//! Trainable multi-layer perceptrons on candle, and their export to the plain
//! networks the placement engine runs.
//!
//! Weights are [`Var`]s laid out as candle's `Linear` lays them (`out × in`,
//! row-major) and initialised from the trainer's seeded stream, so a training
//! run is reproducible from its seed.

use candle_core::{DType, Device, Tensor, Var};
use rand::Rng;
use rand_chacha::ChaCha8Rng;
use starling_placement::learned::{Activation, Dense, Mlp};

use crate::LearnError;

struct Layer {
    weight: Var,
    bias: Var,
    activation: Activation,
}

/// A trainable network: hidden layers with ReLU, then a head.
pub(crate) struct Net {
    layers: Vec<Layer>,
}

impl Net {
    /// A network of the given layer sizes (`sizes[0]` inputs, the last outputs),
    /// ReLU between layers and `head` on the output, initialised uniformly in
    /// ±1/√inputs (PyTorch's `Linear` default).
    pub fn new(
        sizes: &[usize],
        head: Activation,
        rng: &mut ChaCha8Rng,
    ) -> Result<Self, LearnError> {
        let mut layers = Vec::new();
        for (index, pair) in sizes.windows(2).enumerate() {
            let (inputs, outputs) = (pair[0], pair[1]);
            let bound = 1.0 / (inputs.max(1) as f32).sqrt();
            let weights: Vec<f32> = (0..inputs * outputs)
                .map(|_| rng.random_range(-bound..bound))
                .collect();
            let bias: Vec<f32> = (0..outputs)
                .map(|_| rng.random_range(-bound..bound))
                .collect();
            let last = index + 2 == sizes.len();
            layers.push(Layer {
                weight: Var::from_tensor(&Tensor::from_vec(
                    weights,
                    (outputs, inputs),
                    &Device::Cpu,
                )?)?,
                bias: Var::from_tensor(&Tensor::from_vec(bias, outputs, &Device::Cpu)?)?,
                activation: if last { head } else { Activation::Relu },
            });
        }
        if layers.is_empty() {
            return Err(LearnError::Config(
                "a network needs at least one layer".into(),
            ));
        }
        Ok(Self { layers })
    }

    /// An independent copy (a target network).
    pub fn duplicate(&self) -> Result<Self, LearnError> {
        let layers = self
            .layers
            .iter()
            .map(|layer| {
                Ok(Layer {
                    weight: Var::from_tensor(&layer.weight.as_tensor().copy()?)?,
                    bias: Var::from_tensor(&layer.bias.as_tensor().copy()?)?,
                    activation: layer.activation,
                })
            })
            .collect::<Result<Vec<_>, LearnError>>()?;
        Ok(Self { layers })
    }

    /// The output for a batch: `(n, inputs)` in, `(n, outputs)` out.
    pub fn forward(&self, input: &Tensor) -> Result<Tensor, LearnError> {
        let mut x = input.clone();
        for layer in &self.layers {
            x = x
                .matmul(&layer.weight.as_tensor().t()?)?
                .broadcast_add(layer.bias.as_tensor())?;
            x = match layer.activation {
                Activation::Linear => x,
                Activation::Relu => x.relu()?,
                Activation::Sigmoid => candle_nn::ops::sigmoid(&x)?,
            };
        }
        Ok(x)
    }

    /// The first output for each row of a plain `(n × inputs)` matrix, as numbers
    /// (no gradient is kept).
    pub fn values(&self, rows: &[f32], inputs: usize) -> Result<Vec<f32>, LearnError> {
        if rows.is_empty() {
            return Ok(Vec::new());
        }
        let batch = Tensor::from_slice(rows, (rows.len() / inputs, inputs), &Device::Cpu)?;
        let out = self.forward(&batch)?.detach();
        Ok(out.narrow(1, 0, 1)?.flatten_all()?.to_vec1::<f32>()?)
    }

    /// Every trainable variable, for an optimiser.
    pub fn vars(&self) -> Vec<Var> {
        self.layers
            .iter()
            .flat_map(|layer| [layer.weight.clone(), layer.bias.clone()])
            .collect()
    }

    /// Moves every weight `tau` of the way toward `online`'s (Polyak averaging;
    /// `tau = 1` copies).
    pub fn follow(&self, online: &Net, tau: f64) -> Result<(), LearnError> {
        for (target, source) in self.vars().iter().zip(online.vars()) {
            let mixed = ((target.as_tensor() * (1.0 - tau))? + (source.as_tensor() * tau)?)?;
            target.set(&mixed)?;
        }
        Ok(())
    }

    /// The network as the placement engine runs it.
    pub fn export(&self) -> Result<Mlp, LearnError> {
        let layers = self
            .layers
            .iter()
            .map(|layer| {
                let (outputs, inputs) = layer.weight.as_tensor().dims2()?;
                Ok(Dense {
                    inputs,
                    outputs,
                    weights: layer
                        .weight
                        .as_tensor()
                        .to_dtype(DType::F32)?
                        .flatten_all()?
                        .to_vec1::<f32>()?,
                    bias: layer.bias.as_tensor().to_vec1::<f32>()?,
                    activation: layer.activation,
                })
            })
            .collect::<Result<Vec<_>, LearnError>>()?;
        Ok(Mlp { layers })
    }
}

/// A `(rows, columns)` tensor from a plain row-major matrix.
pub(crate) fn matrix(data: Vec<f32>, columns: usize) -> Result<Tensor, LearnError> {
    let rows = data.len() / columns.max(1);
    Ok(Tensor::from_vec(data, (rows, columns), &Device::Cpu)?)
}

/// A `(rows, 1)` column.
pub(crate) fn column(data: Vec<f32>) -> Result<Tensor, LearnError> {
    let rows = data.len();
    Ok(Tensor::from_vec(data, (rows, 1), &Device::Cpu)?)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use starling_placement::learned::Scratch;

    #[test]
    fn exported_network_computes_what_candle_computes() {
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        for head in [Activation::Linear, Activation::Sigmoid] {
            let net = Net::new(&[5, 8, 8, 1], head, &mut rng).unwrap();
            let rows: Vec<f32> = (0..5 * 6).map(|_| rng.random_range(-2.0..2.0)).collect();
            let ours = net.values(&rows, 5).unwrap();
            let exported = net.export().unwrap();
            exported.validate().unwrap();
            let mut scratch = Scratch::default();
            for (row, expected) in rows.chunks_exact(5).zip(&ours) {
                let got = exported.forward1(row, &mut scratch);
                assert!((got - expected).abs() < 1e-5, "{got} vs {expected}");
            }
        }
    }

    #[test]
    fn follow_moves_toward_the_online_network() {
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        let online = Net::new(&[2, 3, 1], Activation::Linear, &mut rng).unwrap();
        let target = Net::new(&[2, 3, 1], Activation::Linear, &mut rng).unwrap();
        let before = target.export().unwrap().layers[0].weights[0];
        let goal = online.export().unwrap().layers[0].weights[0];
        target.follow(&online, 0.5).unwrap();
        let after = target.export().unwrap().layers[0].weights[0];
        assert!((after - (before + goal) / 2.0).abs() < 1e-6);
        target.follow(&online, 1.0).unwrap();
        assert_eq!(target.export().unwrap(), online.export().unwrap());
        let copy = online.duplicate().unwrap();
        assert_eq!(copy.export().unwrap(), online.export().unwrap());
    }
}
