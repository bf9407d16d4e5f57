//! Synthetic batches of embeddings for the loss benchmarks.
//!
//! Deterministic (ChaCha8 seeded by the caller): `p` and `iq` are `[B, d]`, `iq_instr` is
//! `[B, K, d]`, every vector is uniform in `[-1, 1]^d` then L2-normalized, as an encoder's output
//! would be. The benchmark uses K = B - 1 (every other row's instruction), the full I-marginal of
//! the paper, so the batch holds `O(B^2 d)` floats.

use burn::tensor::{Device, Tensor, TensorData};
use infembed_losses::LossBatch;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// `n` L2-normalized vectors of dimension `d`, flattened row-major.
pub fn unit_vectors(rng: &mut ChaCha8Rng, n: usize, d: usize) -> Vec<f32> {
    let mut out = Vec::with_capacity(n * d);
    for _ in 0..n {
        let v: Vec<f32> = (0..d).map(|_| rng.random_range(-1.0f32..1.0)).collect();
        let norm = v
            .iter()
            .map(|x| x * x)
            .sum::<f32>()
            .sqrt()
            .max(f32::MIN_POSITIVE);
        out.extend(v.iter().map(|x| x / norm));
    }
    out
}

/// A batch of B rows with K instruction negatives per row, embedding dimension d, on `device`,
/// without masks.
pub fn batch(b: usize, k: usize, d: usize, seed: u64, device: &Device) -> LossBatch {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let p = Tensor::<2>::from_data(
        TensorData::new(unit_vectors(&mut rng, b, d), [b, d]),
        device,
    );
    let iq = Tensor::<2>::from_data(
        TensorData::new(unit_vectors(&mut rng, b, d), [b, d]),
        device,
    );
    let batch = LossBatch::new(p, iq);
    if k == 0 {
        return batch;
    }
    let iq_instr = Tensor::<3>::from_data(
        TensorData::new(unit_vectors(&mut rng, b * k, d), [b, k, d]),
        device,
    );
    batch.with_instruction_negatives(iq_instr)
}
