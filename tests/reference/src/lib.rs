//! CPU references for the example kernels in `tasks/`: the answers the
//! OpenCL tests check a kernel's output against, and the baseline the
//! OpenCL benchmark measures kernels with.
//!
//! A crate of its own so that it alone is optimised in test builds
//! (`[profile.dev.package.starling-reference]`): unoptimised, the baseline
//! would flatter every kernel, and optimising the whole of starling-tests
//! for it cost CI a minute of compiling (docs/ci.md).

/// `y = a·x + y`.
pub fn saxpy(a: f32, x: &[f32], y: &[f32]) -> Vec<f32> {
    x.iter().zip(y).map(|(x, y)| a * x + y).collect()
}

/// `C = A·B` for row-major A (m×k) and B (k×n): a plain loop in i-k-j
/// order, so the inner loop streams through B and C.
pub fn matmul(m: usize, n: usize, k: usize, a: &[f32], b: &[f32]) -> Vec<f32> {
    let mut c = vec![0.0f32; m * n];
    for i in 0..m {
        for p in 0..k {
            let a_ip = a[i * k + p];
            let b_row = &b[p * n..(p + 1) * n];
            let c_row = &mut c[i * n..(i + 1) * n];
            for (c, b) in c_row.iter_mut().zip(b_row) {
                *c += a_ip * b;
            }
        }
    }
    c
}

/// Deterministic test data in [-1, 1): a small linear congruential sequence.
pub fn data(len: usize, seed: u32) -> Vec<f32> {
    let mut state = seed.wrapping_mul(2_654_435_761).wrapping_add(1);
    (0..len)
        .map(|_| {
            state = state.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            (state >> 8) as f32 / (1u32 << 23) as f32 - 1.0
        })
        .collect()
}

/// The largest difference between two vectors, relative to the larger magnitude (≥ 1).
pub fn max_relative_error(got: &[f32], want: &[f32]) -> f32 {
    assert_eq!(got.len(), want.len(), "lengths differ");
    got.iter()
        .zip(want)
        .map(|(g, w)| (g - w).abs() / w.abs().max(1.0))
        .fold(0.0, f32::max)
}
