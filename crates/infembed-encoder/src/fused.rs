//! The self-attention block of the BERT family fused for inference on the CPU `flex`
//! backend: one product for query, key and value together, then per sequence and head
//! `softmax(q kᵀ / sqrt(d_head))` over the unpadded keys and its product with `v`, written
//! straight into the merged-heads layout.
//!
//! burn's path for the same block runs three products, copies the heads apart and together
//! again (`swap_dims` + `reshape`), and evaluates the softmax in a scalar loop with libm's
//! `expf`; profiling all-MiniLM-L6-v2 put those at about a fifth of an inference pass. Here
//! the products go through [`crate::gemm`] (strided views, no copies) and the exponentials
//! through eight-lane AVX2 code when the processor has it.
//!
//! Only plain (non-autodiff) `f32` tensors of the `flex` backend take this path; everything
//! else returns `None` and the caller runs burn's ops. Its results equal burn's to
//! floating-point reassociation (tested against [`crate::attention`]).

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::NoCheckpointing;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::flex::FlexTensor;
use burn::backend::{Autodiff, Flex};
use burn::nn::{Dropout, Linear};
use burn::prelude::*;
use burn::tensor::{DType, TensorData};
use rayon::prelude::*;

use crate::gemm::{self, Epilogue, MatRef};
use crate::kernels::contiguous;

/// A tensor of the plain `flex` backend as a contiguous `f32` buffer, or `None`.
fn flex_f32<const D: usize>(t: Tensor<D>) -> Option<FlexTensor> {
    if t.dtype() != DType::F32 || t.device().is_autodiff() {
        return None;
    }
    t.try_into_primitive::<Flex>().ok().map(contiguous)
}

/// `softmax(q kᵀ / sqrt(d_head)) v` with `q, k, v` the three projections of `x`, heads merged:
/// the context that BERT's attention output layer reads.
///
/// `key_pad` holds `B * L` flags, `true` on padding positions (masked as keys). Returns `None`
/// (nothing computed) unless `x` and the three layers' parameters are plain `flex` `f32`
/// tensors.
///
/// # Shapes
/// - `x`: `[B, L, d]`, with `heads` dividing `d`
/// - output: `[B, L, d]`
///
/// # Panics
/// When `key_pad` does not hold `B * L` flags or a projection is not `d x d` (shape contracts
/// of the caller).
pub(crate) fn self_attention(
    x: &Tensor<3>,
    [query, key, value]: [&Linear; 3],
    heads: usize,
    key_pad: &[bool],
) -> Option<Tensor<3>> {
    let [b, l, d] = x.dims();
    assert_eq!(
        key_pad.len(),
        b * l,
        "self_attention: key_pad must hold B * L flags"
    );
    assert!(
        heads > 0 && d % heads == 0,
        "self_attention: {heads} heads do not divide width {d}"
    );
    let xf = flex_f32(x.clone())?;
    let mut w = Vec::with_capacity(3);
    let mut bias = Vec::with_capacity(3);
    for layer in [query, key, value] {
        let wt = flex_f32(layer.weight.val())?;
        assert_eq!(
            wt.layout().shape().to_vec(),
            vec![d, d],
            "self_attention: projections must be {d}x{d}"
        );
        w.push(wt);
        bias.push(match &layer.bias {
            Some(p) => Some(flex_f32(p.val())?),
            None => None,
        });
    }
    let rows = b * l;
    let d3 = 3 * d;
    // [d, 3d]: the three weights side by side, and their biases
    let mut w_qkv = vec![0f32; d * d3];
    for (part, wt) in w.iter().enumerate() {
        let src = &wt.storage::<f32>()[..d * d];
        for (dst, row) in w_qkv.chunks_exact_mut(d3).zip(src.chunks_exact(d)) {
            dst[part * d..(part + 1) * d].copy_from_slice(row);
        }
    }
    let mut b_qkv = vec![0f32; d3];
    for (part, bt) in bias.iter().enumerate() {
        if let Some(bt) = bt {
            b_qkv[part * d..(part + 1) * d].copy_from_slice(&bt.storage::<f32>()[..d]);
        }
    }
    let mut qkv = vec![0f32; rows * d3];
    gemm::gemm(
        MatRef::row_major(&xf.storage::<f32>()[..rows * d], rows, d),
        MatRef::row_major(&w_qkv, d, d3),
        &mut qkv,
        Epilogue {
            bias: Some(&b_qkv),
            ..Epilogue::default()
        },
    );
    let dh = d / heads;
    let scale = 1.0 / (dh as f32).sqrt();
    let mut ctx = vec![0f32; rows * d];
    ctx.par_chunks_mut(l * d)
        .zip(qkv.par_chunks(l * d3))
        .zip(key_pad.par_chunks(l))
        .for_each_init(
            || vec![0f32; l * l],
            |scores, ((out, seq), pad)| {
                for h in 0..heads {
                    let view = |offset: usize| MatRef::new(&seq[offset + h * dh..], l, dh, d3, 1);
                    gemm::gemm_serial(view(0), view(d).t(), scores, l, Epilogue::default());
                    softmax_rows(scores, l, pad, scale);
                    gemm::gemm_serial(
                        MatRef::row_major(scores, l, l),
                        view(2 * d),
                        &mut out[h * dh..],
                        d,
                        Epilogue::default(),
                    );
                }
            },
        );
    Some(Tensor::from_primitive::<Flex>(FlexTensor::from_data(
        TensorData::new(ctx, [b, l, d]),
    )))
}

/// Each of the `scores.len() / l` rows of length `l` becomes `softmax(scale * row)` over the
/// positions where `pad` is `false`, 0 on padded positions; a row with no unpadded position
/// becomes all zeros.
fn softmax_rows(scores: &mut [f32], l: usize, pad: &[bool], scale: f32) {
    let any_pad = pad.iter().any(|&p| p);
    if pad.iter().all(|&p| p) {
        scores.fill(0.0);
        return;
    }
    for row in scores.chunks_exact_mut(l) {
        let mut max = f32::NEG_INFINITY;
        for (v, &p) in row.iter_mut().zip(pad) {
            if p {
                // far below every real score, so its exponential is negligible (then zeroed)
                *v = -1e30;
            } else {
                max = max.max(*v);
            }
        }
        let sum = crate::kernels::exp_shifted_in_place(row, scale, max * scale);
        let mut total = sum;
        if any_pad {
            for (v, &p) in row.iter_mut().zip(pad) {
                if p {
                    total -= *v;
                    *v = 0.0;
                }
            }
        }
        let inv = 1.0 / total;
        row.iter_mut().for_each(|v| *v *= inv);
    }
}

/// What the backward step of [`attention_train`] keeps.
#[derive(Debug, Clone)]
struct AttnState {
    q: FlexTensor,
    k: FlexTensor,
    v: FlexTensor,
    /// The attention probabilities before dropout, `[B, H, L, L]`.
    probs: Vec<f32>,
    /// `(seed, threshold, scale)` of the dropout, when active.
    drop: Option<(u64, u32, f32)>,
    dims: [usize; 4],
}

/// The autodiff step of [`attention_train`].
#[derive(Debug)]
struct AttnBackward;

/// Head `(b, h)` of a `[B, H, L, Dh]` flex tensor with non-negative strides, as an `L x Dh` view.
fn head(t: &FlexTensor, b: usize, h: usize, l: usize, dh: usize) -> MatRef<'_> {
    let layout = t.layout();
    let st: Vec<usize> = layout
        .strides()
        .iter()
        .map(|&s| usize::try_from(s).expect("non-negative strides"))
        .collect();
    let offset = layout.start_offset() + b * st[0] + h * st[1];
    MatRef::new(&t.storage::<f32>()[offset..], l, dh, st[2], st[3])
}

/// `t` with non-negative strides (copied to a contiguous layout when it has negative ones).
fn positive_strides(t: FlexTensor) -> FlexTensor {
    if t.layout().strides().iter().all(|&s| s >= 0) {
        t
    } else {
        t.to_contiguous()
    }
}

/// Multiplies `p` (one head's `L x L` block, starting at flat index `base` of the `[B, H, L, L]`
/// probabilities) by its dropout factors.
fn apply_drop(p: &mut [f32], base: usize, drop: Option<(u64, u32, f32)>) {
    if let Some((seed, threshold, scale)) = drop {
        for (j, v) in p.iter_mut().enumerate() {
            *v *= crate::kernels::dropout_factor(seed, base + j, threshold, scale);
        }
    }
}

/// `dst = src` times the dropout factors of [`apply_drop`], in one pass.
fn copy_dropped(dst: &mut [f32], src: &[f32], base: usize, drop: Option<(u64, u32, f32)>) {
    match drop {
        Some((seed, threshold, scale)) => {
            for (j, (d, &v)) in dst.iter_mut().zip(src).enumerate() {
                *d = v * crate::kernels::dropout_factor(seed, base + j, threshold, scale);
            }
        }
        None => dst.copy_from_slice(src),
    }
}

/// `softmax(q kᵀ / sqrt(d_head))` over the unpadded keys, dropout on the probabilities (when
/// `dropout` is active: training mode, `prob > 0`), times `v`: [`crate::attention`]'s
/// spelled-out training attention as one autodiff operation with a hand-written backward
/// step, on the `flex` backend. The dropout masks are those of [`crate::kernels::dropout`]
/// (one seed drawn from the device's generator, a counter-based hash per element of the
/// `[B, H, L, L]` probabilities), so with the same device seed the two paths drop the same
/// elements. A query row whose keys are all padding yields zeros.
///
/// Returns `None` (nothing computed) unless the inputs are `f32` tensors of an autodiff
/// `flex` device with `H == Hkv`.
///
/// # Shapes
/// - `q, k, v`: `[B, H, L, Dh]`
/// - `key_pad`: `B * L` flags, `true` on padding
/// - output: `[B, H, L, Dh]`
pub(crate) fn attention_train(
    q: &Tensor<4>,
    k: &Tensor<4>,
    v: &Tensor<4>,
    key_pad: &[bool],
    dropout: &Dropout,
) -> Option<Tensor<4>> {
    let dims = q.dims();
    let [b, h, l, dh] = dims;
    if !q.device().is_autodiff()
        || k.dims() != dims
        || v.dims() != dims
        || key_pad.len() != b * l
        || [q, k, v].iter().any(|t| t.dtype() != DType::F32)
    {
        return None;
    }
    let qa = q.clone().try_into_primitive::<Autodiff<Flex>>().ok()?;
    let ka = k.clone().try_into_primitive::<Autodiff<Flex>>().ok()?;
    let va = v.clone().try_into_primitive::<Autodiff<Flex>>().ok()?;
    let drop = (dropout.training.is_enabled() && dropout.prob > 0.0)
        .then(|| crate::kernels::dropout_state(dropout.prob, &q.device()));
    let qf = positive_strides(qa.primitive().clone());
    let kf = positive_strides(ka.primitive().clone());
    let vf = positive_strides(va.primitive().clone());
    let scale = 1.0 / (dh as f32).sqrt();
    let mut probs = vec![0f32; b * h * l * l];
    let mut out = vec![0f32; b * h * l * dh];
    out.par_chunks_mut(l * dh)
        .zip(probs.par_chunks_mut(l * l))
        .enumerate()
        .for_each_init(
            || vec![0f32; l * l],
            |dropped, (bh, (o, p))| {
                let (bi, hi) = (bh / h, bh % h);
                let (qh, kh, vh) = (
                    head(&qf, bi, hi, l, dh),
                    head(&kf, bi, hi, l, dh),
                    head(&vf, bi, hi, l, dh),
                );
                gemm::gemm_serial(qh, kh.t(), p, l, Epilogue::default());
                softmax_rows(p, l, &key_pad[bi * l..(bi + 1) * l], scale);
                let pd: &[f32] = if drop.is_some() {
                    copy_dropped(dropped, p, bh * l * l, drop);
                    dropped
                } else {
                    p
                };
                gemm::gemm_serial(MatRef::row_major(pd, l, l), vh, o, dh, Epilogue::default());
            },
        );
    let out = FlexTensor::from_data(TensorData::new(out, dims.to_vec()));
    let result = match AttnBackward
        .prepare::<NoCheckpointing>([qa.node(), ka.node(), va.node()])
        .compute_bound()
        .stateful()
    {
        OpsKind::Tracked(prep) => prep.finish(
            AttnState {
                q: qf,
                k: kf,
                v: vf,
                probs,
                drop,
                dims,
            },
            out,
        ),
        OpsKind::UnTracked(prep) => prep.finish(out),
    };
    Some(Tensor::from_primitive::<Autodiff<Flex>>(result))
}

impl Backward<Flex, 3> for AttnBackward {
    type State = AttnState;

    fn backward(self, ops: Ops<AttnState, 3>, grads: &mut Gradients, _: &mut Checkpointer) {
        let grad = positive_strides(grads.consume::<Flex>(&ops.node));
        let st = &ops.state;
        let [b, h, l, dh] = st.dims;
        let scale = 1.0 / (dh as f32).sqrt();
        let n = b * h * l * dh;
        let (mut dq, mut dk, mut dv) = (vec![0f32; n], vec![0f32; n], vec![0f32; n]);
        dq.par_chunks_mut(l * dh)
            .zip(dk.par_chunks_mut(l * dh))
            .zip(dv.par_chunks_mut(l * dh))
            .zip(st.probs.par_chunks(l * l))
            .enumerate()
            .for_each_init(
                || (vec![0f32; l * l], vec![0f32; l * l]),
                |(pd, ds), (bh, (((dq, dk), dv), p))| {
                    let (bi, hi) = (bh / h, bh % h);
                    let qh = head(&st.q, bi, hi, l, dh);
                    let kh = head(&st.k, bi, hi, l, dh);
                    let vh = head(&st.v, bi, hi, l, dh);
                    let go = head(&grad, bi, hi, l, dh);
                    let pd: &[f32] = if st.drop.is_some() {
                        copy_dropped(pd, p, bh * l * l, st.drop);
                        pd
                    } else {
                        p
                    };
                    // dV = Pdᵀ dO
                    let pd_mat = MatRef::row_major(pd, l, l);
                    gemm::gemm_serial(pd_mat.t(), go, dv, dh, Epilogue::default());
                    // dPd = dO Vᵀ, then through the dropout: dP = dPd * factor
                    gemm::gemm_serial(go, vh.t(), ds, l, Epilogue::default());
                    apply_drop(ds, bh * l * l, st.drop);
                    // dS = P * (dP - rowsum(dP * P)) * scale
                    for (drow, prow) in ds.chunks_exact_mut(l).zip(p.chunks_exact(l)) {
                        let r: f32 = drow.iter().zip(prow).map(|(d, p)| d * p).sum();
                        for (d, &pv) in drow.iter_mut().zip(prow) {
                            *d = pv * (*d - r) * scale;
                        }
                    }
                    let ds_mat = MatRef::row_major(ds, l, l);
                    gemm::gemm_serial(ds_mat, kh, dq, dh, Epilogue::default());
                    gemm::gemm_serial(ds_mat.t(), qh, dk, dh, Epilogue::default());
                },
            );
        let [pq, pk, pv] = ops.parents;
        for (parent, g) in [(pq, dq), (pk, dk), (pv, dv)] {
            if let Some(node) = parent {
                let t = FlexTensor::from_data(TensorData::new(g, st.dims.to_vec()));
                grads.register::<Flex>(node.id, t);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attention::{attend, key_padding_mask, merge_heads, split_heads};
    use burn::nn::LinearConfig;
    use burn::tensor::Distribution;

    #[test]
    fn equals_burn_attention_with_padding() {
        let device = Device::default();
        device.seed(5);
        let (b, l, d, heads) = (3, 9, 24, 4);
        let layers: Vec<Linear> = (0..3)
            .map(|_| LinearConfig::new(d, d).init(&device))
            .collect();
        let x = Tensor::<3>::random([b, l, d], Distribution::Normal(0.0, 1.0), &device);
        // sequence 0 unpadded, 1 ends in 4 padding positions, 2 is all padding but one
        let pad: Vec<bool> = (0..b * l)
            .map(|i| (i / l == 1 && i % l >= 5) || (i / l == 2 && i % l >= 1))
            .collect();
        let ours = self_attention(&x, [&layers[0], &layers[1], &layers[2]], heads, &pad)
            .expect("flex f32");
        let q = split_heads(layers[0].forward(x.clone()), heads);
        let k = split_heads(layers[1].forward(x.clone()), heads);
        let v = split_heads(layers[2].forward(x.clone()), heads);
        let pad_t = Tensor::<2, Bool>::from_data(TensorData::new(pad, [b, l]), &device);
        let want = merge_heads(attend(q, k, v, key_padding_mask(pad_t), false));
        let diff = (ours - want).abs().max().into_scalar::<f32>();
        assert!(diff < 2e-5, "max difference {diff}");
    }

    /// Values and gradients of q, k, v equal those of the spelled-out attention, with and
    /// without dropout (same device seed, so the same dropped elements).
    #[test]
    fn training_attention_equals_spelled_out_attention() {
        use crate::attention::attend_with_dropout;
        let device = Device::default().autodiff();
        let (b, h, l, dh) = (2, 3, 7, 8);
        let pad: Vec<bool> = (0..b * l).map(|i| i / l == 1 && i % l >= 4).collect();
        let pad_t = Tensor::<2, Bool>::from_data(TensorData::new(pad.clone(), [b, l]), &device);
        let mask = key_padding_mask(pad_t);
        device.seed(21);
        let rand = || Tensor::<4>::random([b, h, l, dh], Distribution::Normal(0.0, 1.0), &device);
        let (q0, k0, v0, w) = (rand(), rand(), rand(), rand());
        for prob in [0.0, 0.3] {
            let drop = burn::nn::DropoutConfig::new(prob).init();
            let run = |fused: bool| {
                let (q, k, v) = (
                    q0.clone().detach().require_grad(),
                    k0.clone().detach().require_grad(),
                    v0.clone().detach().require_grad(),
                );
                device.seed(99);
                let y = if fused {
                    attention_train(&q, &k, &v, &pad, &drop).expect("autodiff flex")
                } else {
                    attend_with_dropout(q.clone(), k.clone(), v.clone(), mask.clone(), &drop, None)
                };
                let grads = (y.clone() * w.clone()).sum().backward();
                let vals = |t: Tensor<4>| t.into_data().try_to_vec::<f32>().expect("f32");
                [
                    vals(y),
                    vals(q.grad(&grads).expect("dq")),
                    vals(k.grad(&grads).expect("dk")),
                    vals(v.grad(&grads).expect("dv")),
                ]
            };
            let ours = run(true);
            let want = run(false);
            for (what, (a, e)) in ["out", "dq", "dk", "dv"].iter().zip(ours.iter().zip(&want)) {
                let diff = a
                    .iter()
                    .zip(e)
                    .map(|(x, y)| (x - y).abs())
                    .fold(0.0, f32::max);
                assert!(diff < 1e-4, "p = {prob}: {what} differs by {diff}");
            }
        }
    }

    #[test]
    fn declines_autodiff_tensors() {
        let device = Device::default().autodiff();
        let layer = LinearConfig::new(8, 8).init(&device);
        let x = Tensor::<3>::zeros([1, 2, 8], &device);
        assert!(self_attention(&x, [&layer, &layer, &layer], 2, &[false, false]).is_none());
    }

    #[test]
    fn softmax_rows_match_a_naive_softmax() {
        let l = 11;
        let mut scores: Vec<f32> = (0..l * 3)
            .map(|i| ((i * 7 % 13) as f32 - 6.0) * 0.9)
            .collect();
        let pad: Vec<bool> = (0..l).map(|j| j % 4 == 3).collect();
        let want: Vec<f32> = scores
            .chunks(l)
            .flat_map(|row| {
                let m = row
                    .iter()
                    .zip(&pad)
                    .filter(|(_, p)| !**p)
                    .map(|(v, _)| f64::from(*v) * 0.5)
                    .fold(f64::NEG_INFINITY, f64::max);
                let e: Vec<f64> = row
                    .iter()
                    .zip(&pad)
                    .map(|(v, p)| {
                        if *p {
                            0.0
                        } else {
                            (f64::from(*v) * 0.5 - m).exp()
                        }
                    })
                    .collect();
                let s: f64 = e.iter().sum();
                e.into_iter().map(move |v| (v / s) as f32)
            })
            .collect();
        softmax_rows(&mut scores, l, &pad, 0.5);
        for (g, w) in scores.iter().zip(&want) {
            assert!((g - w).abs() < 1e-6, "{g} vs {w}");
        }
    }
}
