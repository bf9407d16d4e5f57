//! Attention: scaled dot-product attention on padded batches (every backbone: padding masks,
//! optional causal masking, grouped-query attention, BERT's attention dropout), the packed
//! self-attention of the BERT family (the `flex` kernels of [`crate::cpu::attention`], else
//! burn's ops on the padded batch), and the head/mask glue around them.

use std::sync::Arc;

use burn::nn::{Dropout, Linear};
use burn::prelude::*;
use burn::tensor::activation::softmax;
use burn::tensor::ops::AttentionModuleOptions;

use super::{
    Packing, Prepared, Products, dropout, linear_in, linear_routed, matmul_routed, routes_products,
};
use crate::cpu::attention::{self as kernel, QkvWeights};
use crate::routine::MatmulRoutine;

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
pub(crate) fn attention(
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
    // burn's CPU (`flex`) attention handles grouped heads and broadcast masks itself; the
    // autodiff path and the GPU backends (cubecl's attention wants as many key/value heads as
    // query heads) need them spelled out.
    let decomposed = !crate::cpu::is_plain_flex(&q.device());
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
    burn::tensor::module::attention(
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

/// [`attention`] (no causal mask, `H == Hkv`; the mask `[B, 1, L, L]`, or `[B, 1, 1, L]` for
/// a key mask off the CPU) with dropout on the attention probabilities, as Hugging Face's BERT
/// trains. When `dropout` is active (training mode on an autodiff device,
/// `prob > 0`) the product is spelled out (`softmax(q k^T / sqrt(d_head))`, masked keys
/// pushed down by 1e9, dropout, times `v`); otherwise this is [`attention`].
///
/// (On the `flex` backend BERT runs [`self_attention`]'s packed kernels instead, which draw
/// the same dropout masks.)
///
/// On a cubecl GPU device whose products go through a routine other than `burn` (the default,
/// [`MatmulRoutine`]), the product is spelled out too, so that its two matrix products (the
/// scores and the context, and in training their backward products) run that routine rather
/// than burn's `matmul`. There `float_mask`, the mask as f32 values (`1` on masked keys;
/// [`Packing::key_rows_float_mask`]), spares the fused softmax converting `mask` in every
/// layer; `None` converts it.
pub(crate) fn attention_with_dropout(
    q: Tensor<4>,
    k: Tensor<4>,
    v: Tensor<4>,
    mask: Tensor<4, Bool>,
    float_mask: Option<Tensor<4>>,
    dropout: &Dropout,
    routine: MatmulRoutine,
) -> Tensor<4> {
    if super::dropout_active(dropout, &q.device()) || routes_products(routine, &q) {
        attend_decomposed(q, k, v, mask, float_mask, dropout, routine)
    } else {
        attention(q, k, v, mask, false)
    }
}

/// The spelled-out attention of [`attention_with_dropout`], its products through `routine`
/// ([`matmul_routed`]). Shapes as [`attention`] with `H == Hkv`.
fn attend_decomposed(
    q: Tensor<4>,
    k: Tensor<4>,
    v: Tensor<4>,
    mask: Tensor<4, Bool>,
    float_mask: Option<Tensor<4>>,
    dropout_module: &Dropout,
    routine: MatmulRoutine,
) -> Tensor<4> {
    let dh = q.dims()[3];
    let scores = matmul_routed(q, k.swap_dims(2, 3), routine);
    #[cfg(not(all(any(feature = "wgpu", feature = "cuda"), not(feature = "fusion"))))]
    let _ = float_mask; // only the cubecl devices' fused softmax reads it
    // one kernel on a cubecl device (the scaling, the mask and the softmax), forward and
    // backward, training included with inference's fill below (the same probabilities as the
    // additive -1e9 of f32 training: masked terms underflow to 0 either way; a row whose keys
    // are all masked, a padding row that is dropped, gets 1 / L on each and no gradient)
    // an active dropout of the probabilities (as [`dropout`] decides it) goes into the same
    // launches, forward and backward, with the masks its own launches would draw
    #[cfg(all(any(feature = "wgpu", feature = "cuda"), not(feature = "fusion")))]
    let drop = super::fused_dropout_prob(dropout_module, &scores.device());
    #[cfg(all(any(feature = "wgpu", feature = "cuda"), not(feature = "fusion")))]
    #[allow(clippy::result_large_err)]
    let fused = |scores: Tensor<4>, drop: Option<f64>| match &float_mask {
        // the mask as f32 values made once per batch, not converted in every layer
        Some(float_mask) => super::cube_softmax::try_masked_softmax_f32(
            scores,
            float_mask,
            1.0 / (dh as f32).sqrt(),
            -6.0e4,
            drop,
        ),
        None => super::cube_softmax::try_masked_softmax(
            scores,
            &mask,
            1.0 / (dh as f32).sqrt(),
            -6.0e4,
            drop,
        ),
    };
    #[cfg(all(any(feature = "wgpu", feature = "cuda"), not(feature = "fusion")))]
    let scores = match fused(scores, drop) {
        Ok(probs) if drop.is_some() => return matmul_routed(probs, v, routine),
        Ok(probs) => return matmul_routed(dropout(dropout_module, probs), v, routine),
        // declined with the dropout: without it, the dropout's own launch after
        Err(scores) if drop.is_some() => match fused(scores, None) {
            Ok(probs) => return matmul_routed(dropout(dropout_module, probs), v, routine),
            Err(scores) => scores,
        },
        Err(scores) => scores,
    };
    let scores = scores.mul_scalar(1.0 / (dh as f64).sqrt());
    let scores = if scores.device().is_autodiff() && scores.dtype() == burn::tensor::DType::F32 {
        // Training in f32: an additive constant (-1e9 on masked keys, broadcast over heads)
        // rather than `mask_fill`: the same softmax (masked terms underflow to 0 either way),
        // but no `[B, H, L, L]` mask is materialized and the backward pass has no masking step.
        scores + mask.float().mul_scalar(-1e9)
    } else {
        // Inference, and any other float type: masked keys set to -60,000, within f16's range
        // (whose -1e9 is -inf, and 0 x -inf is NaN), far enough down for their terms to
        // underflow to 0, and finite, so that a row whose keys are all masked gets no NaN (its
        // mean of the values, where `attention` gives zeros: such rows are padding, dropped).
        let [b, h, lq, lk] = scores.dims();
        scores.mask_fill(mask.expand([b, h, lq, lk]), -6.0e4)
    };
    let probs = dropout(dropout_module, softmax(scores, 3));
    matmul_routed(probs, v, routine)
}

/// The query, key and value projections prepared once per model for the `flex` inference
/// kernel (their weights side by side, see [`QkvWeights`]; see [`Prepared`] for when they are
/// rebuilt).
pub(crate) type FusedQkv = Prepared<QkvWeights>;

impl FusedQkv {
    /// The prepared weights of `layers` (`d x d` each), built now when missing or stale;
    /// `None` unless the parameters are plain `flex` `f32` tensors.
    fn get(&self, layers: [&Linear; 3], d: usize) -> Option<Arc<QkvWeights>> {
        self.get_or_build(
            |w| w.built_from(layers),
            |quantization| QkvWeights::new(layers, d, quantization),
        )
    }

    /// Computes the projections with `products` from now on, their inference weights
    /// prepared now (when they are plain `flex` `f32` tensors).
    pub(crate) fn set_products(&mut self, products: Products, layers: [&Linear; 3]) {
        self.set_mode(products);
        let d = layers[0].weight.dims()[0];
        if layers.iter().all(|l| l.weight.dims() == [d, d]) {
            self.get(layers, d);
        }
    }
}

/// BERT's self-attention context of the packed rows `x` (`[T, d]`, laid out by `packing`):
/// per sequence and head `softmax(q kᵀ / sqrt(d_head))`, dropped out by `dropout` when it is
/// active, times `v`, heads merged, with `q, k, v` the projections `[query, key, value]` of
/// `x`. On the `flex` backend this runs the packed kernels of [`crate::cpu::attention`]
/// (inference through the weights `fused` prepares once per model, training as one autodiff
/// operation); elsewhere burn's ops on the padded batch ([`padded_self_attention`]), which
/// give the same values and, with the same device seed, drop the same elements.
///
/// # Shapes
/// - `x`: `[T, d]`, `heads` dividing `d`, each projection `d x d`
/// - output: `[T, d]`
pub(crate) fn self_attention(
    layers: [&Linear; 3],
    heads: usize,
    dropout: &Dropout,
    fused: &FusedQkv,
    x: &Tensor<2>,
    packing: &Packing,
) -> Tensor<2> {
    let d = x.dims()[1];
    if !x.device().is_autodiff() {
        let ctx = fused
            .get(layers, d)
            .and_then(|w| kernel::self_attention(x, &w, heads, packing.offsets()));
        if let Some(ctx) = ctx {
            return ctx;
        }
    } else if kernel::trains(x) {
        let float = fused.train_float();
        let [q, k, v] = layers.map(|layer| linear_in(layer, x.clone(), float));
        let ctx = kernel::attention_train(
            [&q, &k, &v],
            heads,
            packing.offsets(),
            packing.padded_len(),
            dropout,
        );
        if let Some(ctx) = ctx {
            return ctx;
        }
    }
    let routine = fused.products().gpu_matmul;
    padded_self_attention(layers, heads, dropout, x, packing, routine)
}

/// [`self_attention`] through burn's ops: the rows unpacked to the padded batch, whose key
/// mask ([`Packing::key_mask`]) hides the padding; the projections' products through
/// `routine` on a cubecl device.
pub(crate) fn padded_self_attention(
    [query, key, value]: [&Linear; 3],
    heads: usize,
    dropout: &Dropout,
    x: &Tensor<2>,
    packing: &Packing,
    routine: MatmulRoutine,
) -> Tensor<2> {
    let xp = packing.unpack(x.clone());
    let project = |layer, x| split_heads(linear_routed(layer, x, routine), heads);
    let q = project(query, xp.clone());
    let k = project(key, xp.clone());
    let v = project(value, xp);
    // on a cubecl device the mask stays `[B, 1, 1, L]`: the fused softmax reads it broadcast
    // over the queries (and burn's ops expand it), where the `[B, 1, L, L]` view would be
    // written out whole as floats
    let (mask, float_mask) = if super::routes_on(&q.device()) {
        (packing.key_rows_mask(), Some(packing.key_rows_float_mask()))
    } else {
        (packing.key_mask(), None)
    };
    packing.pack(merge_heads(attention_with_dropout(
        q, k, v, mask, float_mask, dropout, routine,
    )))
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
    use burn::nn::{DropoutConfig, LinearConfig};
    use burn::tensor::Distribution;

    /// The packed self-attention (the `flex` kernels) equals the fallback that other backends
    /// run (burn's ops on the batch unpacked around them), for inference and for training with
    /// attention dropout (same device seed, same masks); in inference, twice through the same
    /// prepared weights.
    #[test]
    fn packed_self_attention_equals_the_padded_fallback() {
        let _rng = crate::rng_lock();
        let (d, heads) = (16, 4);
        // lengths 6, 2, 4: rows 1 and 2 end in padding
        let lengths = [6usize, 2, 4];
        let l = 6;
        let pad: Vec<bool> = lengths
            .iter()
            .flat_map(|&n| (0..l).map(move |j| j >= n))
            .collect();
        for device in [Device::flex(), Device::flex().autodiff()] {
            let packing = Packing::new(&pad, lengths.len(), l, &device);
            device.seed(3);
            let lin = || LinearConfig::new(d, d).init(&device);
            let (q, k, v) = (lin(), lin(), lin());
            let layers = [&q, &k, &v];
            let dropout = DropoutConfig::new(0.2).init();
            let fused = FusedQkv::default();
            let x =
                Tensor::<2>::random([packing.len(), d], Distribution::Normal(0.0, 1.0), &device);
            // burn initializes parameters lazily, drawing from the generator on first use:
            // do it now so that both paths below draw only their dropout seed
            for layer in layers {
                let _ = (layer.weight.val(), layer.bias.as_ref().map(|b| b.val()));
            }
            device.seed(9);
            let ours = self_attention(layers, heads, &dropout, &fused, &x, &packing);
            device.seed(9);
            let padded =
                padded_self_attention(layers, heads, &dropout, &x, &packing, MatmulRoutine::BURN);
            let diff = (ours.clone() - padded).abs().max().into_scalar::<f32>();
            assert!(
                diff < 1e-5,
                "autodiff {}: differs by {diff}",
                device.is_autodiff()
            );
            let prepared = fused.0.lock().expect("lock").1.is_some();
            assert_eq!(
                prepared,
                !device.is_autodiff(),
                "prepared for inference only"
            );
            if !device.is_autodiff() {
                let again = self_attention(layers, heads, &dropout, &fused, &x, &packing);
                assert_eq!(
                    again.into_data().try_to_vec::<f32>().expect("f32"),
                    ours.into_data().try_to_vec::<f32>().expect("f32"),
                    "the prepared weights give the same bits"
                );
            }
        }
    }

    /// The spelled-out product (dropout 0) equals the fused attention op, padding included.
    #[test]
    fn decomposed_attention_equals_fused_attention() {
        let _rng = crate::rng_lock();
        let device = Device::flex();
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
        let fused = attention(q.clone(), k.clone(), v.clone(), mask.clone(), false);
        let spelled = attend_decomposed(
            q,
            k,
            v,
            mask,
            None,
            &DropoutConfig::new(0.0).init(),
            MatmulRoutine::BURN,
        );
        let diff = (fused - spelled).abs().max().into_scalar::<f32>();
        assert!(diff < 1e-5, "max difference {diff}");
    }

    /// In training mode the attention probabilities are dropped (reproducibly per seed); in
    /// evaluation mode nothing changes.
    #[test]
    fn attention_dropout_is_active_only_in_training() {
        let _rng = crate::rng_lock();
        let device = Device::flex().autodiff();
        device.seed(3);
        let rand = || Tensor::<4>::random([2, 2, 6, 4], Distribution::Normal(0.0, 1.0), &device);
        let (q, k, v) = (rand(), rand(), rand());
        let pad = Tensor::<2, Bool>::from_data(TensorData::new(vec![false; 12], [2, 6]), &device);
        let mask = key_padding_mask(pad);
        let drop = DropoutConfig::new(0.5).init();
        let run = |d: &Dropout, seed: u64| {
            device.seed(seed);
            attention_with_dropout(
                q.clone(),
                k.clone(),
                v.clone(),
                mask.clone(),
                None,
                d,
                MatmulRoutine::BURN,
            )
            .into_data()
            .try_to_vec::<f32>()
            .expect("f32")
        };
        let plain = attention(q.clone(), k.clone(), v.clone(), mask.clone(), false)
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

    /// On wgpu (Mesa's software driver in CI), the padded self-attention through the
    /// `blocked` routine, whose score and context products are spelled out and routed, equals
    /// burn's attention op (`burn`): in inference (masked keys filled), and in training (masked
    /// keys pushed down) in the gradients of the input and of the three projections' weights;
    /// with sequences that end in padding, and no product falling back to burn's `matmul`.
    #[cfg(all(any(feature = "wgpu", feature = "cuda"), not(feature = "fusion")))]
    #[test]
    fn routed_self_attention_equals_burns_attention() {
        use infembed_testkit::max_rel_diff;
        let Some(gpu) = crate::test_wgpu("routed_self_attention_equals_burns_attention") else {
            return;
        };
        let values = |t: Tensor<2>| t.into_data().convert::<f32>().try_to_vec::<f32>().unwrap();
        let (d, heads, l) = (32, 4, 7);
        let lengths = [7usize, 3, 5];
        let pad: Vec<bool> = lengths
            .iter()
            .flat_map(|&n| (0..l).map(move |j| j >= n))
            .collect();
        let cpu = Device::flex();
        let cpu_layers: Vec<Linear> = (0..3).map(|_| LinearConfig::new(d, d).init(&cpu)).collect();
        let x = Tensor::<2>::random(
            [lengths.iter().sum::<usize>(), d],
            Distribution::Normal(0.0, 1.0),
            &cpu,
        );
        let on = |device: &Device| {
            let layers: Vec<Linear> = cpu_layers
                .iter()
                .map(|layer| {
                    let mut layer = layer.clone();
                    let moved = |t: Tensor<2>| Tensor::<2>::from_data(t.into_data(), device);
                    layer.weight = burn::module::Param::from_tensor(moved(layer.weight.val()));
                    layer.bias = layer.bias.map(|b| {
                        burn::module::Param::from_tensor(Tensor::<1>::from_data(
                            b.val().into_data(),
                            device,
                        ))
                    });
                    layer
                })
                .collect();
            let x = Tensor::<2>::from_data(x.clone().into_data(), device);
            (layers, x, Packing::new(&pad, lengths.len(), l, device))
        };
        let no_dropout = DropoutConfig::new(0.0).init();
        let run = |device: &Device, routine: MatmulRoutine| {
            let (layers, x, packing) = on(device);
            let x = if device.is_autodiff() {
                x.require_grad()
            } else {
                x
            };
            let [q, k, v] = [&layers[0], &layers[1], &layers[2]];
            let y = padded_self_attention([q, k, v], heads, &no_dropout, &x, &packing, routine);
            if !device.is_autodiff() {
                return vec![values(y)];
            }
            let r = Tensor::<2>::from_data(
                Tensor::<2>::random(y.dims(), Distribution::Normal(0.0, 1.0), &cpu).into_data(),
                device,
            );
            let grads = (y * r).sum().backward();
            let mut out = vec![values(x.grad(&grads).expect("the input's gradient"))];
            for layer in &layers {
                out.push(values(
                    layer.weight.grad(&grads).expect("a weight's gradient"),
                ));
            }
            out
        };
        for device in [gpu.clone(), gpu.autodiff()] {
            let _rng = crate::rng_lock();
            cpu.seed(5);
            let launches = || super::super::blocked::LAUNCHES.get();
            let burn = run(&device, MatmulRoutine::BURN);
            let before = (super::super::routed::fallbacks(), launches());
            cpu.seed(5);
            let blocked = run(&device, MatmulRoutine::BLOCKED);
            assert_eq!(
                super::super::routed::fallbacks(),
                before.0,
                "a product fell back to burn's matmul"
            );
            // 3 projections and the 2 attention products, each with 2 more in training (the
            // counters are this thread's)
            let expected = if device.is_autodiff() { 15 } else { 5 };
            assert!(
                launches() - before.1 == expected,
                "autodiff {}: {} blocked launches, not the attention's products",
                device.is_autodiff(),
                launches() - before.1
            );
            for (i, (a, b)) in burn.iter().zip(&blocked).enumerate() {
                let diff = max_rel_diff(a, b);
                assert!(
                    diff < 1e-4,
                    "autodiff {}: output {i} differs by {diff}",
                    device.is_autodiff()
                );
            }
        }
    }

    /// On a wgpu autodiff graph (Mesa's software driver in CI), the attention's probabilities
    /// are dropped once, inside the softmax's launches: the attention through the blocked
    /// routine with dropout equals the same products, the fused softmax without its dropout,
    /// then the dropout's own launch, under one seed (values and the queries' gradient to the
    /// bit), and differs from the attention without dropout.
    #[cfg(all(feature = "wgpu", not(feature = "fusion")))]
    #[test]
    fn the_probabilities_are_dropped_once_inside_the_softmax() {
        let Some(gpu) = crate::test_wgpu("the_probabilities_are_dropped_once_inside_the_softmax")
        else {
            return;
        };
        let _rng = crate::rng_lock();
        let ad = gpu.autodiff();
        let values = |t: Tensor<4>| t.into_data().convert::<f32>().try_to_vec::<f32>().unwrap();
        let (b, h, l, dh) = (2, 2, 6, 8);
        let random = || Tensor::<4>::random([b, h, l, dh], Distribution::Normal(0.0, 1.0), &ad);
        let (q0, k, v) = (random(), random(), random());
        let flags: Vec<bool> = (0..b * l).map(|i| i % l >= l - 2 * (i / l)).collect();
        let mask = Tensor::<2, Bool>::from_data(TensorData::new(flags, [b, l]), &ad)
            .reshape([b, 1, 1, l])
            .expand([b, 1, l, l]);
        let dropout = DropoutConfig::new(0.3).init();
        let routine = MatmulRoutine::BLOCKED;
        let run = |spelled_out: bool, drop: &Dropout| {
            let q = Tensor::<4>::from_data(q0.to_data(), &ad).require_grad();
            ad.seed(17);
            let y = if spelled_out {
                let scores = matmul_routed(q.clone(), k.clone().swap_dims(2, 3), routine);
                let scale = 1.0 / (dh as f32).sqrt();
                let probs = super::super::cube_softmax::try_masked_softmax(
                    scores, &mask, scale, -6e4, None,
                )
                .expect("the fused softmax");
                matmul_routed(super::super::dropout(drop, probs), v.clone(), routine)
            } else {
                attention_with_dropout(
                    q.clone(),
                    k.clone(),
                    v.clone(),
                    mask.clone(),
                    None,
                    drop,
                    routine,
                )
            };
            let grads = y.clone().sum().backward();
            (values(y), values(q.grad(&grads).unwrap()))
        };
        let (inside, own) = (run(false, &dropout), run(true, &dropout));
        assert_eq!(inside.0, own.0, "the attention's values");
        assert_eq!(inside.1, own.1, "the queries' gradient");
        let kept = run(false, &DropoutConfig::new(0.0).init());
        assert_ne!(inside.0, kept.0, "the dropout dropped");
    }
}
