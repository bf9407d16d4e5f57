//! Rotary position embeddings (the non-interleaved "rotate half" form used by Hugging Face
//! Llama, Qwen2 and ModernBERT).

use burn::prelude::*;

/// Cosine and sine tables for positions `0..L`, each `[L, Dh]` (frequencies repeated for the
/// two halves of the head).
#[derive(Debug, Clone)]
pub(crate) struct RopeTables {
    cos: Tensor<2>,
    sin: Tensor<2>,
}

impl RopeTables {
    /// Tables for `len` positions, head width `head_dim` (even), base `theta`.
    pub(crate) fn new(len: usize, head_dim: usize, theta: f64, device: &Device) -> Self {
        let half = head_dim / 2;
        let mut cos = Vec::with_capacity(len * head_dim);
        let mut sin = Vec::with_capacity(len * head_dim);
        // inv_freq in f32 as the reference computes it, angles in f32 products.
        let inv: Vec<f32> = (0..half)
            .map(|k| (1.0 / theta.powf((2 * k) as f64 / head_dim as f64)) as f32)
            .collect();
        for p in 0..len {
            for _ in 0..2 {
                for &f in &inv {
                    let a = p as f32 * f;
                    cos.push(a.cos());
                    sin.push(a.sin());
                }
            }
        }
        Self {
            cos: Tensor::from_data(TensorData::new(cos, [len, head_dim]), device),
            sin: Tensor::from_data(TensorData::new(sin, [len, head_dim]), device),
        }
    }

    /// Rotates `x: [B, H, L, Dh]` (positions `0..L`).
    pub(crate) fn apply(&self, x: Tensor<4>) -> Tensor<4> {
        let [b, h, l, dh] = x.dims();
        let half = dh / 2;
        let cos = self.cos.clone().reshape([1, 1, l, dh]);
        let sin = self.sin.clone().reshape([1, 1, l, dh]);
        let x1 = x.clone().slice([0..b, 0..h, 0..l, 0..half]);
        let x2 = x.clone().slice([0..b, 0..h, 0..l, half..dh]);
        let rotated = Tensor::cat(vec![x2.neg(), x1], 3);
        x * cos + rotated * sin
    }
}
