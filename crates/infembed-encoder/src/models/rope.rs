//! Rotary position embeddings (the non-interleaved "rotate half" form used by Hugging Face
//! Llama, Qwen2 and ModernBERT), with Llama 3's frequency scaling.

use burn::prelude::*;

/// Llama 3's rotary scaling (`rope_type: "llama3"`): long wavelengths are divided by
/// `factor`, short ones kept, and the band between interpolated, as `transformers` does.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Llama3RopeScaling {
    /// How much longer the extended context is.
    pub factor: f32,
    /// Wavelengths above `original_max_position_embeddings / low_freq_factor` are scaled.
    pub low_freq_factor: f32,
    /// Wavelengths below `original_max_position_embeddings / high_freq_factor` are kept.
    pub high_freq_factor: f32,
    /// The context length the model was pretrained with.
    pub original_max_position_embeddings: f32,
}

/// The inverse frequencies `1 / theta^(2k / Dh)`, `k < Dh / 2`, in f32 as the reference
/// computes them, with Llama 3's scaling when given.
pub(crate) fn inverse_frequencies(
    head_dim: usize,
    theta: f64,
    scaling: Option<&Llama3RopeScaling>,
) -> Vec<f32> {
    let half = head_dim / 2;
    // As `transformers`: the exponent, the power and the inverse each in f32.
    let base: Vec<f32> = (0..half)
        .map(|k| 1.0 / (theta as f32).powf((2 * k) as f32 / head_dim as f32))
        .collect();
    let Some(s) = scaling else {
        return base;
    };
    let low_wavelen = s.original_max_position_embeddings / s.low_freq_factor;
    let high_wavelen = s.original_max_position_embeddings / s.high_freq_factor;
    base.into_iter()
        .map(|f| {
            let wavelen = 2.0 * std::f32::consts::PI / f;
            if wavelen > low_wavelen {
                f / s.factor
            } else if wavelen < high_wavelen {
                f
            } else {
                let smooth = (s.original_max_position_embeddings / wavelen - s.low_freq_factor)
                    / (s.high_freq_factor - s.low_freq_factor);
                (1.0 - smooth) * f / s.factor + smooth * f
            }
        })
        .collect()
}

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
        Self::from_frequencies(len, &inverse_frequencies(head_dim, theta, None), device)
    }

    /// Tables for `len` positions from the inverse frequencies of one half of a head.
    pub(crate) fn from_frequencies(len: usize, inv: &[f32], device: &Device) -> Self {
        let head_dim = 2 * inv.len();
        let mut cos = Vec::with_capacity(len * head_dim);
        let mut sin = Vec::with_capacity(len * head_dim);
        // Angles as f32 products, as the reference computes them.
        for p in 0..len {
            for _ in 0..2 {
                for &f in inv {
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Llama 3's rule written out as its three regimes on one frequency each.
    #[test]
    fn llama3_scaling_regimes() {
        let s = Llama3RopeScaling {
            factor: 8.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position_embeddings: 64.0,
        };
        let base = inverse_frequencies(64, 10_000.0, None);
        let scaled = inverse_frequencies(64, 10_000.0, Some(&s));
        let mut seen = [false; 3];
        for (f, g) in base.iter().zip(&scaled) {
            let wavelen = 2.0 * std::f32::consts::PI / f;
            if wavelen < 16.0 {
                assert_eq!(f, g, "short wavelengths are kept");
                seen[0] = true;
            } else if wavelen > 64.0 {
                assert!(
                    (g - f / 8.0).abs() <= 1e-7 * f,
                    "long wavelengths are divided"
                );
                seen[1] = true;
            } else {
                assert!(
                    *g < *f && *g > f / 8.0,
                    "the band in between is interpolated"
                );
                seen[2] = true;
            }
        }
        assert_eq!(seen, [true; 3], "the test covers all three regimes");
    }
}
