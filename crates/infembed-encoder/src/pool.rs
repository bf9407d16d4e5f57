//! Masked pooling of token states into one vector per text, and L2 normalization.

use burn::prelude::*;
use serde::{Deserialize, Serialize};

/// How token states become one embedding.
///
/// All modes respect the attention mask, whichever side the padding is on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Pooling {
    /// The state of the first real token (BERT's `[CLS]`).
    Cls,
    /// The mean of the states of the real tokens (sentence-transformers' mean pooling:
    /// `sum(h * m) / max(sum(m), 1e-9)`).
    #[default]
    Mean,
    /// The state of the last real token (decoders; with left padding this is position `L-1`).
    Last,
}

/// Pools `hidden: [B, L, d]` with `mask: [B, L]` (1.0 = real token, 0.0 = padding) into
/// `[B, d]`.
///
/// A row with no real token gives zeros for `mean` and the state at position 0 for `cls`
/// and `last` (such a row never comes out of the tokenizer: special tokens count as real).
pub fn pool(hidden: Tensor<3>, mask: Tensor<2>, pooling: Pooling) -> Tensor<2> {
    let [b, l, d] = hidden.dims();
    match pooling {
        Pooling::Mean => {
            let m = mask.unsqueeze_dim::<3>(2);
            let sum = (hidden * m.clone()).sum_dim(1).reshape([b, d]);
            let count = m.sum_dim(1).reshape([b, 1]).clamp_min(1e-9);
            sum / count
        }
        Pooling::Cls | Pooling::Last => {
            let device = hidden.device();
            // Score each real position so that argmax picks the first (cls) or the last
            // (last) real token; padding scores 0.
            let ramp = Tensor::<1, Int>::arange(1..(l as i64 + 1), &device).float();
            let ramp = if pooling == Pooling::Cls {
                ramp.neg().add_scalar(l as f64 + 1.0)
            } else {
                ramp
            };
            let score = mask * ramp.unsqueeze::<2>();
            let idx = score.argmax(1); // [B, 1]
            let idx = idx.reshape([b, 1, 1]).expand([b, 1, d]);
            hidden.gather(1, idx).reshape([b, d])
        }
    }
}

/// Divides each row of `x: [B, d]` by its L2 norm (clamped below at 1e-12, as
/// `torch.nn.functional.normalize`).
pub fn l2_normalize(x: Tensor<2>) -> Tensor<2> {
    let norm = x.clone().square().sum_dim(1).sqrt().clamp_min(1e-12);
    x / norm
}

/// L2-normalizes the last dimension of a rank-3 tensor `[N, K, d]`.
pub fn l2_normalize3(x: Tensor<3>) -> Tensor<3> {
    let norm = x.clone().square().sum_dim(2).sqrt().clamp_min(1e-12);
    x / norm
}
