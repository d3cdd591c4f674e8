//! Draws from the seeded stream the simulator and the learned policies share
//! (below both: the learned policies' exploration noise must not reach into
//! the simulator for it).

use rand::Rng;
use rand_chacha::ChaCha8Rng;

/// A standard normal draw (Box–Muller), for the simulator and the learners'
/// exploration noise.
pub fn normal(rng: &mut ChaCha8Rng) -> f64 {
    let u1: f64 = rng.random_range(f64::EPSILON..1.0);
    let u2: f64 = rng.random_range(0.0..1.0);
    (-2.0 * u1.ln()).sqrt() * (2.0 * core::f64::consts::PI * u2).cos()
}
