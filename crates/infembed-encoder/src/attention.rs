//! Scaled dot-product attention shared by all backbones, with padding masks, optional causal
//! masking and grouped-query attention.

use burn::prelude::*;
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
