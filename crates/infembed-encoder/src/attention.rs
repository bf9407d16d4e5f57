//! Scaled dot-product attention shared by all backbones, with padding masks, optional causal
//! masking and grouped-query attention.

use burn::nn::Dropout;
use burn::prelude::*;
use burn::tensor::activation::softmax;
use burn::tensor::module::attention;
use burn::tensor::ops::AttentionModuleOptions;

/// A key-padding mask for attention: `[B, 1, L, L]`, `true` where the KEY is padding.
///
/// `pad` is `[B, L]` with `true` on padding positions.
pub(crate) fn key_padding_mask(pad: Tensor<2, Bool>) -> Tensor<4, Bool> {
    let [b, l] = pad.dims();
    pad.reshape([b, 1, 1, l]).expand([b, 1, l, l])
}

/// `softmax(q k^T / sqrt(d_head) masked) v`.
///
/// Shapes: `q: [B, H, L, Dh]`, `k, v: [B, Hkv, L, Dh]` with `H % Hkv == 0` (grouped-query
/// attention shares each key/value head among `H / Hkv` query heads), `mask: [B, 1, L, L]`
/// (`true` = masked out). Returns `[B, H, L, Dh]`. A query row whose keys are all masked
/// yields zeros (never NaN).
pub(crate) fn attend(
    q: Tensor<4>,
    k: Tensor<4>,
    v: Tensor<4>,
    mask: Tensor<4, Bool>,
    causal: bool,
) -> Tensor<4> {
    let [b, h, lq, dh] = q.dims();
    let [_, kv_heads, lk, _] = k.dims();
    assert!(
        h % kv_heads == 0,
        "attention: {h} query heads not divisible by {kv_heads} key/value heads"
    );
    // The native CPU kernel handles grouped heads and broadcast masks itself; the
    // decomposed (autodiff) path needs them spelled out.
    let decomposed = q.device().is_autodiff();
    let (k, v, mask) = if decomposed {
        let rep = h / kv_heads;
        let repeat = |t: Tensor<4>| {
            if rep == 1 {
                t
            } else {
                t.unsqueeze_dim::<5>(2)
                    .expand([b, kv_heads, rep, lk, dh])
                    .reshape([b, h, lk, dh])
            }
        };
        (repeat(k), repeat(v), mask.expand([b, h, lq, lk]))
    } else {
        (k, v, mask)
    };
    attention(
        q,
        k,
        v,
        Some(mask),
        None,
        AttentionModuleOptions {
            scale: None,
            softcap: None,
            is_causal: causal,
        },
    )
}

/// [`attend`] (no causal mask, `H == Hkv`) with dropout on the attention probabilities, as
/// Hugging Face's BERT trains. When `dropout` is active (training mode on an autodiff device,
/// `prob > 0`) the product is spelled out (`softmax(q k^T / sqrt(d_head))`, masked keys
/// pushed down by 1e9, dropout, times `v`); otherwise this is [`attend`].
///
/// (On the `flex` backend BERT runs [`crate::fused`]'s packed attention instead, which draws
/// the same dropout masks.)
pub(crate) fn attend_with_dropout(
    q: Tensor<4>,
    k: Tensor<4>,
    v: Tensor<4>,
    mask: Tensor<4, Bool>,
    dropout: &Dropout,
) -> Tensor<4> {
    let active = dropout.prob > 0.0 && dropout.training.is_enabled() && q.device().is_autodiff();
    if active {
        attend_decomposed(q, k, v, mask, dropout)
    } else {
        attend(q, k, v, mask, false)
    }
}

/// The spelled-out attention of [`attend_with_dropout`]. Shapes as [`attend`] with `H == Hkv`.
fn attend_decomposed(
    q: Tensor<4>,
    k: Tensor<4>,
    v: Tensor<4>,
    mask: Tensor<4, Bool>,
    dropout: &Dropout,
) -> Tensor<4> {
    let dh = q.dims()[3];
    let scores = q
        .matmul(k.swap_dims(2, 3))
        .mul_scalar(1.0 / (dh as f64).sqrt());
    // An additive constant (-1e9 on masked keys, broadcast over heads) rather than `mask_fill`:
    // the same softmax (masked terms underflow to 0 either way), but no `[B, H, L, L]` mask is
    // materialized and the backward pass has no masking step.
    let scores = scores + mask.float().mul_scalar(-1e9);
    let probs = crate::kernels::dropout(dropout, softmax(scores, 3));
    probs.matmul(v)
}

/// Splits `[B, L, H*Dh]` into heads: `[B, H, L, Dh]`.
pub(crate) fn split_heads(x: Tensor<3>, heads: usize) -> Tensor<4> {
    let [b, l, d] = x.dims();
    x.reshape([b, l, heads, d / heads]).swap_dims(1, 2)
}

/// Merges heads back: `[B, H, L, Dh]` to `[B, L, H*Dh]`.
pub(crate) fn merge_heads(x: Tensor<4>) -> Tensor<3> {
    let [b, h, l, dh] = x.dims();
    x.swap_dims(1, 2).reshape([b, l, h * dh])
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::nn::DropoutConfig;
    use burn::tensor::Distribution;

    /// The spelled-out product (dropout 0) equals the fused attention op, padding included.
    #[test]
    fn decomposed_attention_equals_fused_attention() {
        let _rng = crate::rng_lock();
        let device = Device::default();
        let (b, h, l, dh) = (3, 4, 7, 8);
        device.seed(11);
        let rand = || Tensor::<4>::random([b, h, l, dh], Distribution::Normal(0.0, 1.0), &device);
        let (q, k, v) = (rand(), rand(), rand());
        // rows 1 and 2 end in 2 and 5 padding positions
        let pad: Vec<bool> = (0..b * l)
            .map(|i| (i / l == 1 && i % l >= 5) || (i / l == 2 && i % l >= 2))
            .collect();
        let pad = Tensor::<2, Bool>::from_data(TensorData::new(pad, [b, l]), &device);
        let mask = key_padding_mask(pad);
        let fused = attend(q.clone(), k.clone(), v.clone(), mask.clone(), false);
        let spelled = attend_decomposed(q, k, v, mask, &DropoutConfig::new(0.0).init());
        let diff = (fused - spelled).abs().max().into_scalar::<f32>();
        assert!(diff < 1e-5, "max difference {diff}");
    }

    /// In training mode the attention probabilities are dropped (reproducibly per seed); in
    /// evaluation mode nothing changes.
    #[test]
    fn attention_dropout_is_active_only_in_training() {
        let _rng = crate::rng_lock();
        let device = Device::default().autodiff();
        device.seed(3);
        let rand = || Tensor::<4>::random([2, 2, 6, 4], Distribution::Normal(0.0, 1.0), &device);
        let (q, k, v) = (rand(), rand(), rand());
        let pad = Tensor::<2, Bool>::from_data(TensorData::new(vec![false; 12], [2, 6]), &device);
        let mask = key_padding_mask(pad);
        let drop = DropoutConfig::new(0.5).init();
        let run = |d: &Dropout, seed: u64| {
            device.seed(seed);
            attend_with_dropout(q.clone(), k.clone(), v.clone(), mask.clone(), d)
                .into_data()
                .try_to_vec::<f32>()
                .expect("f32")
        };
        let plain = attend(q.clone(), k.clone(), v.clone(), mask.clone(), false)
            .into_data()
            .try_to_vec::<f32>()
            .expect("f32");
        let eval = run(&drop.valid(), 5);
        let max_diff = |a: &[f32], b: &[f32]| {
            a.iter()
                .zip(b)
                .map(|(x, y)| (x - y).abs())
                .fold(0.0, f32::max)
        };
        assert!(max_diff(&eval, &plain) < 1e-6);
        let (t1, t2, t3) = (run(&drop, 5), run(&drop, 5), run(&drop, 6));
        assert_eq!(t1, t2, "same seed, same masks");
        assert!(max_diff(&t1, &plain) > 1e-3, "dropout changed nothing");
        assert_ne!(t1, t3, "another seed, other masks");
    }
}
