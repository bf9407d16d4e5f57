//! The self-attention block of the BERT family fused for the CPU `flex` backend, on a packed
//! token layout: the real tokens of a padded batch stacked as `[T, d]` rows, sequence `s`
//! holding rows `offsets[s]..offsets[s + 1]` (see [`crate::ops::Packing`]). No work is spent on
//! padding, and per sequence and head `softmax(q kᵀ / sqrt(d_head))` and its product with `v`
//! are written straight into the merged-heads layout.
//!
//! burn's path for the same block runs on the padded batch, copies the heads apart and
//! together again (`swap_dims` + `reshape`), and evaluates the softmax in a scalar loop with
//! libm's `expf` (a sizeable share of an inference pass: docs/benchmarks.md).
//! Here the products go through [`crate::cpu::gemm`] (strided views, no copies) and the
//! exponentials through eight-lane AVX2 code when the processor has it.
//!
//! - [`self_attention`]: inference (plain `flex` tensors), one product for query, key and
//!   value together, their weights side by side in a [`QkvWeights`] prepared once per model.
//! - [`attention_train`]: training (autodiff `flex` tensors), attention plus dropout on the
//!   probabilities as one autodiff operation with a hand-written backward step.
//!
//! Everything else returns `None` and the caller runs burn's ops. Results equal burn's to
//! floating-point reassociation (tested against [`crate::ops`]' padded attention).

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

use crate::cpu::elementwise::contiguous;
use crate::cpu::gemm::{self, Epilogue, MatRef};
use crate::cpu::linear::{plain_flex, plain_params, same_params};
use crate::cpu::qgemm::{self, QuantizedMatrix};
use crate::device::Quantization;

/// A tensor of the plain `flex` backend as a contiguous `f32` buffer, or `None`.
fn flex_f32<const D: usize>(t: Tensor<D>) -> Option<FlexTensor> {
    plain_flex(t).map(contiguous)
}

/// Whether [`attention_train`] takes tensors like `x`: `f32` on an autodiff `flex` device.
pub(crate) fn trains<const D: usize>(x: &Tensor<D>) -> bool {
    x.dtype() == DType::F32
        && x.device().is_autodiff()
        && x.clone().try_into_primitive::<Autodiff<Flex>>().is_ok()
}

/// Checks that `offsets` partitions `t` rows (`0 = offsets[0] <= ... <= offsets[B] = t`).
fn check_offsets(offsets: &[usize], t: usize, what: &str) {
    assert!(
        offsets.first() == Some(&0)
            && offsets.last() == Some(&t)
            && offsets.windows(2).all(|w| w[0] <= w[1]),
        "{what}: offsets must rise from 0 to the {t} packed rows"
    );
}

/// `buf` cut into consecutive mutable pieces of the given sizes (which must sum to at most
/// `buf.len()`).
fn split_sizes<T>(buf: &mut [T], sizes: impl Iterator<Item = usize>) -> Vec<&mut [T]> {
    let mut pieces = Vec::new();
    let mut rest = buf;
    for n in sizes {
        let (piece, tail) = std::mem::take(&mut rest).split_at_mut(n);
        pieces.push(piece);
        rest = tail;
    }
    pieces
}

/// Rows `start..start + n`, columns `col..col + cols` of a 2-D flex tensor with non-negative
/// strides, as a view. `n` and `cols` must be positive.
fn block(t: &FlexTensor, start: usize, n: usize, col: usize, cols: usize) -> MatRef<'_> {
    let layout = t.layout();
    let st: Vec<usize> = layout
        .strides()
        .iter()
        .map(|&s| usize::try_from(s).expect("non-negative strides"))
        .collect();
    let offset = layout.start_offset() + start * st[0] + col * st[1];
    MatRef::new(&t.storage::<f32>()[offset..], n, cols, st[0], st[1])
}

/// The query, key and value projections of one attention block side by side, as the
/// inference kernel [`self_attention`] reads them: the weights `[d, 3d]` (row-major) and the
/// biases `[3d]` (zeros where a projection has none). Built once per model by [`Self::new`]
/// and reused while the parameters it was built from are the ones the model holds
/// ([`Self::built_from`]).
#[derive(Debug)]
pub(crate) struct QkvWeights {
    d: usize,
    w: Vec<f32>,
    b: Vec<f32>,
    /// `w` prepared for int8 or bf16 products, when the model computes in one of them.
    quant: Option<QuantizedMatrix>,
    /// The parameters' own tensors (weights then biases), held so their storage stays
    /// alive and cannot be reused at the same address while these weights are cached.
    sources: Vec<Option<FlexTensor>>,
}

impl QkvWeights {
    /// The three `d x d` projections `[query, key, value]` prepared for [`self_attention`]
    /// (their product quantized with `quantization`), or `None` unless their parameters are
    /// plain `flex` `f32` tensors.
    ///
    /// # Panics
    /// When a projection is not `d x d` (a shape contract of the caller).
    pub(crate) fn new(layers: [&Linear; 3], d: usize, quantization: Quantization) -> Option<Self> {
        let sources = plain_params(&layers)?;
        let d3 = 3 * d;
        // [d, 3d]: the three weights side by side, and their biases
        let mut w = vec![0f32; d * d3];
        for (part, wt) in sources[..3].iter().enumerate() {
            let wt = contiguous(wt.clone()?);
            assert_eq!(
                wt.layout().shape().to_vec(),
                vec![d, d],
                "self_attention: projections must be {d}x{d}"
            );
            let src = &wt.storage::<f32>()[..d * d];
            for (dst, row) in w.chunks_exact_mut(d3).zip(src.chunks_exact(d)) {
                dst[part * d..(part + 1) * d].copy_from_slice(row);
            }
        }
        let mut b = vec![0f32; d3];
        for (part, bt) in sources[3..].iter().enumerate() {
            if let Some(bt) = bt {
                let bt = contiguous(bt.clone());
                b[part * d..(part + 1) * d].copy_from_slice(&bt.storage::<f32>()[..d]);
            }
        }
        let quant = QuantizedMatrix::prepare(quantization, MatRef::row_major(&w, d, d3));
        Some(Self {
            d,
            w,
            b,
            quant,
            sources,
        })
    }

    /// How the projection computes.
    #[cfg(test)]
    fn quantization(&self) -> Quantization {
        match &self.quant {
            Some(q) if q.is_bf16() => Quantization::Bf16,
            Some(_) => Quantization::Int8,
            None => Quantization::None,
        }
    }

    /// Whether these weights were built from exactly the parameters `layers` holds now (same
    /// storage, same view), so that they still equal a fresh [`Self::new`].
    pub(crate) fn built_from(&self, layers: [&Linear; 3]) -> bool {
        plain_params(&layers).is_some_and(|now| same_params(&now, &self.sources))
    }
}

/// `softmax(q kᵀ / sqrt(d_head)) v` with `q, k, v` the three projections `qkv` of the packed
/// rows `x`, each sequence attending to its own rows only, heads merged: the context that
/// BERT's attention output layer reads. Returns `None` (nothing computed) unless `x` is a
/// plain `flex` `f32` tensor.
///
/// # Shapes
/// - `x`: `[T, d]`, with `heads` dividing `d` and `d` the width `qkv` was built for
/// - `offsets`: `B + 1` row offsets from 0 to `T`
/// - output: `[T, d]`
///
/// # Panics
/// When `offsets` does not partition the `T` rows or `qkv` is of another width (shape
/// contracts of the caller).
pub(crate) fn self_attention(
    x: &Tensor<2>,
    qkv_weights: &QkvWeights,
    heads: usize,
    offsets: &[usize],
) -> Option<Tensor<2>> {
    let [t, d] = x.dims();
    check_offsets(offsets, t, "self_attention");
    assert!(
        heads > 0 && d % heads == 0,
        "self_attention: {heads} heads do not divide width {d}"
    );
    assert_eq!(
        qkv_weights.d, d,
        "self_attention: projections must be {d}x{d}"
    );
    let xf = flex_f32(x.clone())?;
    let d3 = 3 * d;
    let (w_qkv, b_qkv) = (&qkv_weights.w, &qkv_weights.b);
    let mut qkv = vec![0f32; t * d3];
    let x_rows = MatRef::row_major(&xf.storage::<f32>()[..t * d], t, d);
    let epilogue = Epilogue {
        bias: Some(b_qkv),
        ..Epilogue::default()
    };
    match &qkv_weights.quant {
        Some(q) => qgemm::qgemm(x_rows, q, &mut qkv, epilogue),
        None => gemm::gemm(x_rows, MatRef::row_major(w_qkv, d, d3), &mut qkv, epilogue),
    }
    let dh = d / heads;
    let scale = 1.0 / (dh as f32).sqrt();
    let mut ctx = vec![0f32; t * d];
    let outs = split_sizes(&mut ctx, offsets.windows(2).map(|w| (w[1] - w[0]) * d));
    outs.into_par_iter()
        .zip(offsets.par_windows(2))
        .for_each_init(Vec::new, |scores, (out, w)| {
            let (start, n) = (w[0], w[1] - w[0]);
            if n == 0 {
                return;
            }
            let seq = &qkv[start * d3..(start + n) * d3];
            scores.resize(n * n, 0.0);
            for h in 0..heads {
                let view = |offset: usize| MatRef::new(&seq[offset + h * dh..], n, dh, d3, 1);
                gemm::gemm_serial(view(0), view(d).t(), scores, n, Epilogue::default());
                softmax_rows(scores, n, scale);
                gemm::gemm_serial(
                    MatRef::row_major(scores, n, n),
                    view(2 * d),
                    &mut out[h * dh..],
                    d,
                    Epilogue::default(),
                );
            }
        });
    Some(Tensor::from_primitive::<Flex>(FlexTensor::from_data(
        TensorData::new(ctx, [t, d]),
    )))
}

/// Each of the `scores.len() / n` rows of length `n` becomes `softmax(scale * row)`.
fn softmax_rows(scores: &mut [f32], n: usize, scale: f32) {
    for row in scores.chunks_exact_mut(n) {
        let max = row_max(row);
        let sum = crate::cpu::elementwise::exp_shifted_in_place(row, scale, max * scale);
        let inv = 1.0 / sum;
        row.iter_mut().for_each(|v| *v *= inv);
    }
}

/// The largest element of `row` (`-inf` when empty), eight lanes side by side so the compiler
/// vectorizes it (the maximum does not depend on the order).
fn row_max(row: &[f32]) -> f32 {
    let (chunks, rest) = row.as_chunks::<8>();
    let mut lanes = [f32::NEG_INFINITY; 8];
    for chunk in chunks {
        for (m, &v) in lanes.iter_mut().zip(chunk) {
            *m = m.max(v);
        }
    }
    lanes
        .into_iter()
        .chain(rest.iter().copied())
        .fold(f32::NEG_INFINITY, f32::max)
}

/// Dropout on the attention probabilities: `(seed, threshold, scale)` and the padded length
/// `L` that numbers the elements (element `(i, j)` of head `h` of sequence `s` is number
/// `((s H + h) L + i) L + j`, its index in the `[B, H, L, L]` probabilities of the padded
/// batch, so the masks equal those of [`crate::cpu::elementwise::dropout`] on the padded layout).
#[derive(Debug, Clone, Copy)]
struct AttnDrop {
    state: (u64, u32, f32),
    len: usize,
}

impl AttnDrop {
    /// Index of element `(i, 0)` of head `h` of sequence `s`.
    fn base(self, s: usize, heads: usize, h: usize, i: usize) -> usize {
        ((s * heads + h) * self.len + i) * self.len
    }

    /// `dst = src * factor` (one head's `n x n` block; `dst` may be `src`'s copy in place when
    /// `src` is `None`).
    fn apply(
        self,
        dst: &mut [f32],
        src: Option<&[f32]>,
        n: usize,
        s: usize,
        heads: usize,
        h: usize,
    ) {
        let (seed, threshold, scale) = self.state;
        for i in 0..n {
            let base = self.base(s, heads, h, i);
            let row = &mut dst[i * n..(i + 1) * n];
            match src {
                Some(src) => {
                    for (j, (d, &v)) in row.iter_mut().zip(&src[i * n..(i + 1) * n]).enumerate() {
                        *d = v * crate::cpu::elementwise::dropout_factor(
                            seed,
                            base + j,
                            threshold,
                            scale,
                        );
                    }
                }
                None => {
                    for (j, d) in row.iter_mut().enumerate() {
                        *d *= crate::cpu::elementwise::dropout_factor(
                            seed,
                            base + j,
                            threshold,
                            scale,
                        );
                    }
                }
            }
        }
    }
}

/// What the backward step of [`attention_train`] keeps.
#[derive(Debug, Clone)]
struct AttnState {
    q: FlexTensor,
    k: FlexTensor,
    v: FlexTensor,
    /// Per sequence, its `H n²` attention probabilities before dropout, heads in order.
    probs: Vec<f32>,
    offsets: Vec<usize>,
    heads: usize,
    drop: Option<AttnDrop>,
}

/// Sizes of the per-sequence probability blocks of [`AttnState::probs`] (`H n²` each).
fn prob_sizes(offsets: &[usize], heads: usize) -> impl Iterator<Item = usize> + '_ {
    offsets
        .windows(2)
        .map(move |w| heads * (w[1] - w[0]) * (w[1] - w[0]))
}

/// The autodiff step of [`attention_train`].
#[derive(Debug)]
struct AttnBackward;

/// `t` with non-negative strides (copied to a contiguous layout when it has negative ones).
fn positive_strides(t: FlexTensor) -> FlexTensor {
    if t.layout().strides().iter().all(|&s| s >= 0) {
        t
    } else {
        t.to_contiguous()
    }
}

/// Training attention on packed rows: per sequence and head, `softmax(q kᵀ / sqrt(d_head))`
/// over the sequence's own rows, dropout on the probabilities (when `dropout` is active:
/// training mode, `prob > 0`), times `v`, heads merged. It is [`crate::ops`]'
/// spelled-out training attention as one autodiff operation with a hand-written backward
/// step on the `flex` backend. Dropout draws one seed from the device's generator and
/// numbers the elements as in the padded batch of length `padded_len` (see [`AttnDrop`]), so
/// with the same device seed it drops the same elements as [`crate::cpu::elementwise::dropout`] does
/// on the padded probabilities.
///
/// Returns `None` (nothing computed) unless the inputs are `f32` tensors of an autodiff
/// `flex` device.
///
/// # Shapes
/// - `q, k, v`: `[T, d]`, `heads` dividing `d`, head `h` in columns `h d/H..(h + 1) d/H`
/// - `offsets`: `B + 1` row offsets from 0 to `T`, no sequence longer than `padded_len`
/// - output: `[T, d]`
///
/// # Panics
/// When `offsets` does not partition the `T` rows (a shape contract of the caller).
pub(crate) fn attention_train(
    [q, k, v]: [&Tensor<2>; 3],
    heads: usize,
    offsets: &[usize],
    padded_len: usize,
    dropout: &Dropout,
) -> Option<Tensor<2>> {
    let dims = q.dims();
    let [t, d] = dims;
    check_offsets(offsets, t, "attention_train");
    if !q.device().is_autodiff()
        || k.dims() != dims
        || v.dims() != dims
        || heads == 0
        || d % heads != 0
        || [q, k, v].iter().any(|t| t.dtype() != DType::F32)
    {
        return None;
    }
    let qa = q.clone().try_into_primitive::<Autodiff<Flex>>().ok()?;
    let ka = k.clone().try_into_primitive::<Autodiff<Flex>>().ok()?;
    let va = v.clone().try_into_primitive::<Autodiff<Flex>>().ok()?;
    let drop = (dropout.training.is_enabled() && dropout.prob > 0.0).then(|| AttnDrop {
        state: crate::cpu::elementwise::dropout_state(dropout.prob, &q.device()),
        len: padded_len,
    });
    let qf = positive_strides(qa.primitive().clone());
    let kf = positive_strides(ka.primitive().clone());
    let vf = positive_strides(va.primitive().clone());
    let dh = d / heads;
    let scale = 1.0 / (dh as f32).sqrt();
    let mut out = vec![0f32; t * d];
    let outs = split_sizes(&mut out, offsets.windows(2).map(|w| (w[1] - w[0]) * d));
    let mut probs = vec![0f32; prob_sizes(offsets, heads).sum()];
    let prob_blocks = split_sizes(&mut probs, prob_sizes(offsets, heads));
    outs.into_par_iter()
        .zip(prob_blocks)
        .zip(offsets.par_windows(2))
        .enumerate()
        .for_each_init(Vec::new, |dropped, (s, ((o, p), w))| {
            let (start, n) = (w[0], w[1] - w[0]);
            if n == 0 {
                return;
            }
            dropped.resize(n * n, 0.0);
            for (h, p) in p.chunks_exact_mut(n * n).enumerate() {
                let col = h * dh;
                let (qh, kh, vh) = (
                    block(&qf, start, n, col, dh),
                    block(&kf, start, n, col, dh),
                    block(&vf, start, n, col, dh),
                );
                gemm::gemm_serial(qh, kh.t(), p, n, Epilogue::default());
                softmax_rows(p, n, scale);
                let pd: &[f32] = match drop {
                    Some(drop) => {
                        drop.apply(dropped, Some(p), n, s, heads, h);
                        dropped
                    }
                    None => p,
                };
                gemm::gemm_serial(
                    MatRef::row_major(pd, n, n),
                    vh,
                    &mut o[col..],
                    d,
                    Epilogue::default(),
                );
            }
        });
    let st = AttnState {
        q: qf,
        k: kf,
        v: vf,
        probs,
        offsets: offsets.to_vec(),
        heads,
        drop,
    };
    let out = FlexTensor::from_data(TensorData::new(out, dims.to_vec()));
    let result = match AttnBackward
        .prepare::<NoCheckpointing>([qa.node(), ka.node(), va.node()])
        .compute_bound()
        .stateful()
    {
        OpsKind::Tracked(prep) => prep.finish(st, out),
        OpsKind::UnTracked(prep) => prep.finish(out),
    };
    Some(Tensor::from_primitive::<Autodiff<Flex>>(result))
}

impl Backward<Flex, 3> for AttnBackward {
    type State = AttnState;

    fn backward(self, ops: Ops<AttnState, 3>, grads: &mut Gradients, _: &mut Checkpointer) {
        let grad = positive_strides(grads.consume::<Flex>(&ops.node));
        let st = &ops.state;
        let dims: Vec<usize> = st.q.layout().shape().to_vec();
        let (t, d) = (dims[0], dims[1]);
        let heads = st.heads;
        let dh = d / heads;
        let scale = 1.0 / (dh as f32).sqrt();
        let (mut dq, mut dk, mut dv) = (vec![0f32; t * d], vec![0f32; t * d], vec![0f32; t * d]);
        let rows = || st.offsets.windows(2).map(|w| (w[1] - w[0]) * d);
        let (dqs, dks, dvs) = (
            split_sizes(&mut dq, rows()),
            split_sizes(&mut dk, rows()),
            split_sizes(&mut dv, rows()),
        );
        let mut probs_at = Vec::with_capacity(st.offsets.len());
        let mut at = 0;
        for size in prob_sizes(&st.offsets, heads) {
            probs_at.push(at);
            at += size;
        }
        dqs.into_par_iter()
            .zip(dks)
            .zip(dvs)
            .zip(st.offsets.par_windows(2))
            .zip(probs_at)
            .enumerate()
            .for_each_init(
                || (Vec::new(), Vec::new()),
                |(pd, ds), (s, ((((dq, dk), dv), w), p_at))| {
                    let (start, n) = (w[0], w[1] - w[0]);
                    if n == 0 {
                        return;
                    }
                    pd.resize(n * n, 0.0);
                    ds.resize(n * n, 0.0);
                    for h in 0..heads {
                        let col = h * dh;
                        let p = &st.probs[p_at + h * n * n..p_at + (h + 1) * n * n];
                        let qh = block(&st.q, start, n, col, dh);
                        let kh = block(&st.k, start, n, col, dh);
                        let vh = block(&st.v, start, n, col, dh);
                        let go = block(&grad, start, n, col, dh);
                        let pdv: &[f32] = match st.drop {
                            Some(drop) => {
                                drop.apply(pd, Some(p), n, s, heads, h);
                                pd
                            }
                            None => p,
                        };
                        // dV = Pdᵀ dO
                        let pd_mat = MatRef::row_major(pdv, n, n);
                        gemm::gemm_serial(pd_mat.t(), go, &mut dv[col..], d, Epilogue::default());
                        // dPd = dO Vᵀ, then through the dropout: dP = dPd * factor
                        gemm::gemm_serial(go, vh.t(), ds, n, Epilogue::default());
                        if let Some(drop) = st.drop {
                            drop.apply(ds, None, n, s, heads, h);
                        }
                        // dS = P * (dP - rowsum(dP * P)) * scale
                        for (drow, prow) in ds.chunks_exact_mut(n).zip(p.chunks_exact(n)) {
                            let r: f32 = drow.iter().zip(prow).map(|(d, p)| d * p).sum();
                            for (d, &pv) in drow.iter_mut().zip(prow) {
                                *d = pv * (*d - r) * scale;
                            }
                        }
                        let ds_mat = MatRef::row_major(ds, n, n);
                        gemm::gemm_serial(ds_mat, kh, &mut dq[col..], d, Epilogue::default());
                        gemm::gemm_serial(ds_mat.t(), qh, &mut dk[col..], d, Epilogue::default());
                    }
                },
            );
        let [pq, pk, pv] = ops.parents;
        for (parent, g) in [(pq, dq), (pk, dk), (pv, dv)] {
            if let Some(node) = parent {
                let t = FlexTensor::from_data(TensorData::new(g, dims.clone()));
                grads.register::<Flex>(node.id, t);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::{
        Packing, attention as attend, attention_with_dropout as attend_with_dropout,
        key_padding_mask, merge_heads, split_heads,
    };
    use burn::nn::LinearConfig;
    use burn::tensor::Distribution;

    fn values<const D: usize>(t: Tensor<D>) -> Vec<f32> {
        t.into_data().try_to_vec::<f32>().expect("f32")
    }

    fn max_diff(a: &[f32], b: &[f32]) -> f32 {
        assert_eq!(a.len(), b.len());
        a.iter()
            .zip(b)
            .map(|(x, y)| (x - y).abs())
            .fold(0.0, f32::max)
    }

    /// The packed inference attention equals burn's attention on the padded batch, at every
    /// real token.
    #[test]
    fn equals_burn_attention_with_padding() {
        let _rng = crate::rng_lock();
        let device = Device::flex();
        device.seed(5);
        let (b, l, d, heads) = (4, 9, 24, 4);
        let layers: Vec<Linear> = (0..3)
            .map(|_| LinearConfig::new(d, d).init(&device))
            .collect();
        let x = Tensor::<3>::random([b, l, d], Distribution::Normal(0.0, 1.0), &device);
        // sequence 0 unpadded, 1 ends in 4 padding positions, 2 is all padding but one,
        // 3 is all padding
        let pad: Vec<bool> = (0..b * l)
            .map(|i| (i / l == 1 && i % l >= 5) || (i / l == 2 && i % l >= 1) || i / l == 3)
            .collect();
        let packing = Packing::new(&pad, b, l, &device);
        let q = split_heads(layers[0].forward(x.clone()), heads);
        let k = split_heads(layers[1].forward(x.clone()), heads);
        let v = split_heads(layers[2].forward(x.clone()), heads);
        let pad_t = Tensor::<2, Bool>::from_data(TensorData::new(pad, [b, l]), &device);
        let want =
            values(packing.pack(merge_heads(attend(q, k, v, key_padding_mask(pad_t), false))));
        // f32 to rounding; int8 projections within their quantization error (the context
        // values are about 0.3 in magnitude; 8-bit activations and weights move them by
        // about 1%)
        for (quantization, tolerance) in [(Quantization::None, 2e-5), (Quantization::Int8, 0.03)] {
            let layers = [&layers[0], &layers[1], &layers[2]];
            let qkv = QkvWeights::new(layers, d, quantization).expect("flex f32");
            assert_eq!(qkv.quantization(), quantization);
            let ours = self_attention(&packing.pack(x.clone()), &qkv, heads, packing.offsets())
                .expect("flex f32");
            let diff = max_diff(&values(ours), &want);
            assert!(diff < tolerance, "{quantization}: max difference {diff}");
        }
    }

    /// Values and gradients of q, k, v equal those of the spelled-out attention on the padded
    /// batch, with and without dropout (same device seed, so the same dropped elements).
    #[test]
    fn training_attention_equals_spelled_out_attention() {
        let _rng = crate::rng_lock();
        let device = Device::flex().autodiff();
        let (b, heads, l, dh) = (3, 3, 7, 8);
        let d = heads * dh;
        let pad: Vec<bool> = (0..b * l)
            .map(|i| (i / l == 1 && i % l >= 4) || (i / l == 2 && i % l >= 6))
            .collect();
        let packing = Packing::new(&pad, b, l, &device);
        let pad_t = Tensor::<2, Bool>::from_data(TensorData::new(pad.clone(), [b, l]), &device);
        let mask = key_padding_mask(pad_t);
        // 1 on real tokens: padded query rows do not count in the padded reference's loss
        let real = Tensor::<3>::from_data(
            TensorData::new(
                pad.iter()
                    .flat_map(|&p| std::iter::repeat_n(if p { 0.0f32 } else { 1.0 }, d))
                    .collect::<Vec<_>>(),
                [b, l, d],
            ),
            &device,
        );
        device.seed(21);
        let rand = || Tensor::<3>::random([b, l, d], Distribution::Normal(0.0, 1.0), &device);
        let (q0, k0, v0, w) = (rand(), rand(), rand(), rand());
        for prob in [0.0, 0.3] {
            let drop = burn::nn::DropoutConfig::new(prob).init();
            let run = |packed: bool| {
                let (q, k, v) = (
                    q0.clone().detach().require_grad(),
                    k0.clone().detach().require_grad(),
                    v0.clone().detach().require_grad(),
                );
                device.seed(99);
                let loss = if packed {
                    let y = attention_train(
                        [
                            &packing.pack(q.clone()),
                            &packing.pack(k.clone()),
                            &packing.pack(v.clone()),
                        ],
                        heads,
                        packing.offsets(),
                        l,
                        &drop,
                    )
                    .expect("autodiff flex");
                    (packing.unpack(y) * w.clone()).sum()
                } else {
                    let y = merge_heads(attend_with_dropout(
                        split_heads(q.clone(), heads),
                        split_heads(k.clone(), heads),
                        split_heads(v.clone(), heads),
                        mask.clone(),
                        None,
                        &drop,
                        crate::MatmulRoutine::BURN,
                    ));
                    (y * w.clone() * real.clone()).sum()
                };
                let grads = loss.clone().backward();
                [
                    values(loss),
                    values(q.grad(&grads).expect("dq")),
                    values(k.grad(&grads).expect("dk")),
                    values(v.grad(&grads).expect("dv")),
                ]
            };
            let ours = run(true);
            let want = run(false);
            for (what, (a, e)) in ["loss", "dq", "dk", "dv"]
                .iter()
                .zip(ours.iter().zip(&want))
            {
                let diff = max_diff(a, e);
                assert!(diff < 1e-4, "p = {prob}: {what} differs by {diff}");
            }
        }
    }

    #[test]
    fn declines_autodiff_tensors() {
        let device = Device::flex().autodiff();
        let layer = LinearConfig::new(8, 8).init(&device);
        assert!(QkvWeights::new([&layer, &layer, &layer], 8, Quantization::None).is_none());
        let plain = LinearConfig::new(8, 8).init(&Device::flex());
        let qkv =
            QkvWeights::new([&plain, &plain, &plain], 8, Quantization::None).expect("flex f32");
        let x = Tensor::<2>::zeros([2, 8], &device);
        assert!(self_attention(&x, &qkv, 2, &[0, 2]).is_none());
    }

    /// Prepared weights stay valid for the parameters they were built from (clones of the
    /// module included) and not for changed ones, however equal in shape.
    #[test]
    fn prepared_weights_know_their_parameters() {
        let _rng = crate::rng_lock();
        let device = Device::flex();
        device.seed(8);
        let lin = || LinearConfig::new(8, 8).init(&device);
        let (q, k, v) = (lin(), lin(), lin());
        let qkv = QkvWeights::new([&q, &k, &v], 8, Quantization::None).expect("flex f32");
        assert!(qkv.built_from([&q, &k, &v]));
        let (q2, k2, v2) = (q.clone(), k.clone(), v.clone());
        assert!(
            qkv.built_from([&q2, &k2, &v2]),
            "a clone shares the parameters"
        );
        assert!(!qkv.built_from([&k, &q, &v]), "other order");
        let stepped = q.clone().map(&mut Scale(0.5));
        assert!(!qkv.built_from([&stepped, &k, &v]), "updated weights");
        let rebuilt = QkvWeights::new([&stepped, &k, &v], 8, Quantization::None).expect("flex f32");
        assert!(rebuilt.built_from([&stepped, &k, &v]));
        assert_ne!(rebuilt.w, qkv.w);
    }

    /// Multiplies every parameter by a constant, as an optimizer step replaces them.
    struct Scale(f64);

    impl burn::module::ModuleMapper for Scale {
        fn map_float<const D: usize>(
            &mut self,
            param: burn::module::Param<Tensor<D>>,
        ) -> burn::module::Param<Tensor<D>> {
            let factor = self.0;
            param.map(|t| t.mul_scalar(factor))
        }
    }

    #[test]
    fn softmax_rows_match_a_naive_softmax() {
        let n = 11;
        let mut scores: Vec<f32> = (0..n * 3)
            .map(|i| ((i * 7 % 13) as f32 - 6.0) * 0.9)
            .collect();
        let want: Vec<f32> = scores
            .chunks(n)
            .flat_map(|row| {
                let m = row
                    .iter()
                    .map(|v| f64::from(*v) * 0.5)
                    .fold(f64::NEG_INFINITY, f64::max);
                let e: Vec<f64> = row
                    .iter()
                    .map(|v| (f64::from(*v) * 0.5 - m).exp())
                    .collect();
                let s: f64 = e.iter().sum();
                e.into_iter().map(move |v| (v / s) as f32)
            })
            .collect();
        softmax_rows(&mut scores, n, 0.5);
        for (g, w) in scores.iter().zip(&want) {
            assert!((g - w).abs() < 1e-6, "{g} vs {w}");
        }
    }
}
