//! Attention's masked softmax as one kernel on the cubecl devices (`wgpu`, `vulkan`, `cuda`;
//! not a `fusion` build), with a backward step of one kernel on an autodiff graph.
//!
//! burn 0.22 spells the attention probabilities out on these backends: the scores' scaling,
//! the mask (a `mask_fill`, or in f32 training an additive constant, three launches), and
//! `softmax` (a max, a subtraction, `exp`, a sum, a division), whose backward steps take about
//! as many launches again. [`try_masked_softmax`] computes
//! `softmax(scale s, masked keys set to fill)` with one cube per row of scores: the units take
//! the row's maximum and the sum of its exponentials through a tree in shared memory (f32,
//! whatever the tensors' float type), then write the probabilities. Its backward step is one
//! launch of the same shape: `ds = scale p (dp - Σ p dp)` on the keys that are not masked,
//! zero on the masked ones (whose scores the fill replaced).

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::NoCheckpointing;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops};
use burn::backend::{Autodiff, Cube};
use burn::prelude::*;
use burn::tensor::DType;
use cubecl::CubeDim;
use cubecl::ir::ElemType;

use super::cube_dropout::{DropoutMask, DropoutMaskParts};
use super::cube_kit::{cube, cube_count, finish, primitive};
use super::routed::{CubeTensor, float_kind};

/// Units of a cube (a power of two: the tree halves it).
const UNITS: usize = 64;

mod kernel {
    use cubecl::prelude::*;

    use crate::ops::cube_dropout::kernel::kept;
    use crate::ops::cube_kit::kernel::cube_fold;

    /// Where row `row` (of `heads` × `queries` a batch entry) of a `[B, H, Lq, Lk]` tensor
    /// with strides `strides` starts (its element `j` `j stride(3)` further).
    #[cube]
    fn row_base(row: usize, heads: usize, queries: usize, strides: (usize, usize, usize)) -> usize {
        let i = row % queries;
        let h = (row / queries) % heads;
        let b = row / (queries * heads);
        b * strides.0 + h * strides.1 + i * strides.2
    }

    /// Where row `row` of the scores reads its mask `[B, 1 or H, Lq, Lk]` (any strides, a
    /// broadcast dimension with stride 0 or length 1).
    #[cube]
    fn mask_base(mask: &Tensor<f32>, row: usize, heads: usize, queries: usize) -> usize {
        let i = row % queries;
        let h = (row / queries) % heads;
        let b = row / (queries * heads);
        let h = select(mask.shape(1) == 1, 0, h);
        let i = select(mask.shape(2) == 1, 0, i);
        let b = select(mask.shape(0) == 1, 0, b);
        b * mask.stride(0) + h * mask.stride(1) + i * mask.stride(2)
    }

    /// The probabilities' gradient at `at`; with `dropped` the dropped probabilities' gradient
    /// through the dropout's mask (element `i`), rounded to the tensors' type as the dropout's
    /// own backward launch stores it.
    #[allow(clippy::too_many_arguments)]
    #[cube]
    fn grad_of<F: Float>(
        grad: &Tensor<F>,
        keys: &Tensor<f32>,
        at: usize,
        i: usize,
        key_base: usize,
        threshold: u32,
        keep_scale: f32,
        #[comptime] dropped: bool,
    ) -> f32 {
        let mut g = f32::cast_from(grad[at]);
        if dropped {
            let keep = kept(keys, key_base, i, threshold);
            g = f32::cast_from(F::cast_from(select(keep, g * keep_scale, 0.0f32)));
        }
        g
    }

    /// `fill` where the mask at `m_at` is not zero, else `scale` times the score at `at`.
    #[cube]
    fn masked_score<F: Float>(
        scores: &Tensor<F>,
        mask: &Tensor<f32>,
        at: usize,
        m_at: usize,
        scale: f32,
        fill: f32,
    ) -> f32 {
        select(mask[m_at] != 0.0, fill, f32::cast_from(scores[at]) * scale)
    }

    /// One row of `probs = softmax(x)` per cube, `x_j = fill` where `mask_j` is not zero and
    /// `scale scores_j` elsewhere, and with `dropped` `dropped_probs`, the probabilities
    /// through the dropout of the key at `key_base` of `keys` (element `row · Lk + j`, as the
    /// dropout's own launch numbers them): `scores` `[B, H, Lq, Lk]` with any strides, `probs`
    /// and `dropped_probs` of the same shape, `mask` `[B, 1 or H, Lq, Lk]` (broadcast
    /// dimensions read in place).
    #[allow(clippy::too_many_arguments)]
    #[cube(launch)]
    pub(super) fn masked_softmax_rows<F: Float>(
        scores: &Tensor<F>,
        mask: &Tensor<f32>,
        keys: &Tensor<f32>,
        probs: &mut Tensor<F>,
        dropped_probs: &mut Tensor<F>,
        rows: usize,
        scale: f32,
        fill: f32,
        key_base: usize,
        threshold: u32,
        keep_scale: f32,
        #[comptime] units: usize,
        #[comptime] dropped: bool,
        #[define(F)] _dtype: ElemType,
    ) {
        // a cube past the last row (the second axis's last cubes) computes the last row
        // again and writes nothing: its barriers stay in uniform control flow
        let cube = (CUBE_POS_Y * CUBE_COUNT_X + CUBE_POS_X) as usize;
        let row = select(cube < rows, cube, rows - 1);
        let lk = scores.shape(3);
        let (heads, queries) = (scores.shape(1), scores.shape(2));
        let base = row_base(
            row,
            heads,
            queries,
            (scores.stride(0), scores.stride(1), scores.stride(2)),
        );
        let step = scores.stride(3);
        let m_base = mask_base(mask, row, heads, queries);
        let m_step = select(mask.shape(3) == 1, 0, mask.stride(3));
        let p_base = row_base(
            row,
            heads,
            queries,
            (probs.stride(0), probs.stride(1), probs.stride(2)),
        );
        let p_step = probs.stride(3);
        let unit = UNIT_POS as usize;
        let mut partial = Shared::<[f32]>::new_slice(units);

        let mut top = f32::new(-3.0e38);
        let mut j = unit;
        while j < lk {
            let x = masked_score(
                scores,
                mask,
                base + j * step,
                m_base + j * m_step,
                scale,
                fill,
            );
            top = f32::max(top, x);
            j += units;
        }
        let top = cube_fold(&mut partial, top, unit, units, true);

        let mut sum = 0.0f32;
        j = unit;
        while j < lk {
            let x = masked_score(
                scores,
                mask,
                base + j * step,
                m_base + j * m_step,
                scale,
                fill,
            );
            sum += f32::exp(x - top);
            j += units;
        }
        let sum = cube_fold(&mut partial, sum, unit, units, false);

        if cube < rows {
            j = unit;
            while j < lk {
                let x = masked_score(
                    scores,
                    mask,
                    base + j * step,
                    m_base + j * m_step,
                    scale,
                    fill,
                );
                let p = F::cast_from(f32::exp(x - top) / sum);
                probs[p_base + j * p_step] = p;
                if dropped {
                    // as the dropout's own launch computes it from `p`
                    let keep = kept(keys, key_base, row * lk + j, threshold);
                    let at = row_base(
                        row,
                        heads,
                        queries,
                        (
                            dropped_probs.stride(0),
                            dropped_probs.stride(1),
                            dropped_probs.stride(2),
                        ),
                    ) + j * dropped_probs.stride(3);
                    dropped_probs[at] =
                        F::cast_from(select(keep, f32::cast_from(p) * keep_scale, 0.0f32));
                }
                j += units;
            }
        }
    }

    /// The backward step of one row of `masked_softmax_rows` per cube, `grad` the
    /// probabilities' gradient (with `dropped` the dropped probabilities', taken through the
    /// dropout's mask first, as its own backward launch would): `d_scores_j = scale p_j
    /// (grad_j - Σ_k p_k grad_k)` where `mask_j` is zero, `0` where it is not. `probs`, `grad`
    /// and `d_scores` `[B, H, Lq, Lk]` with any strides.
    #[allow(clippy::too_many_arguments)]
    #[cube(launch)]
    pub(super) fn masked_softmax_backward_rows<F: Float>(
        probs: &Tensor<F>,
        grad: &Tensor<F>,
        mask: &Tensor<f32>,
        keys: &Tensor<f32>,
        d_scores: &mut Tensor<F>,
        rows: usize,
        scale: f32,
        key_base: usize,
        threshold: u32,
        keep_scale: f32,
        #[comptime] units: usize,
        #[comptime] dropped: bool,
        #[define(F)] _dtype: ElemType,
    ) {
        let cube = (CUBE_POS_Y * CUBE_COUNT_X + CUBE_POS_X) as usize;
        let row = select(cube < rows, cube, rows - 1);
        let lk = probs.shape(3);
        let (heads, queries) = (probs.shape(1), probs.shape(2));
        let p_base = row_base(
            row,
            heads,
            queries,
            (probs.stride(0), probs.stride(1), probs.stride(2)),
        );
        let g_base = row_base(
            row,
            heads,
            queries,
            (grad.stride(0), grad.stride(1), grad.stride(2)),
        );
        let d_base = row_base(
            row,
            heads,
            queries,
            (d_scores.stride(0), d_scores.stride(1), d_scores.stride(2)),
        );
        let (p_step, g_step, d_step) = (probs.stride(3), grad.stride(3), d_scores.stride(3));
        let m_base = mask_base(mask, row, heads, queries);
        let m_step = select(mask.shape(3) == 1, 0, mask.stride(3));
        let unit = UNIT_POS as usize;
        let mut partial = Shared::<[f32]>::new_slice(units);

        let mut dot = 0.0f32;
        let mut j = unit;
        while j < lk {
            let g = grad_of(
                grad,
                keys,
                g_base + j * g_step,
                row * lk + j,
                key_base,
                threshold,
                keep_scale,
                dropped,
            );
            dot += f32::cast_from(probs[p_base + j * p_step]) * g;
            j += units;
        }
        let dot = cube_fold(&mut partial, dot, unit, units, false);

        if cube < rows {
            j = unit;
            while j < lk {
                let p = f32::cast_from(probs[p_base + j * p_step]);
                let g = grad_of(
                    grad,
                    keys,
                    g_base + j * g_step,
                    row * lk + j,
                    key_base,
                    threshold,
                    keep_scale,
                    dropped,
                );
                let d = select(
                    mask[m_base + j * m_step] != 0.0,
                    0.0f32,
                    scale * p * (g - dot),
                );
                d_scores[d_base + j * d_step] = F::cast_from(d);
                j += units;
            }
        }
    }
}

/// The mask as f32 (`1` on masked keys): its length-1 dimensions stay length 1, an expanded
/// one is written out.
fn float_mask(mask: &Tensor<4, Bool>) -> Tensor<4> {
    mask.clone().float().cast(DType::F32)
}

/// [`try_masked_softmax`]'s forward launch on plain cubecl tensors: the probabilities, and
/// with `drop` the dropped probabilities (`None` when a tensor is not a cubecl tensor or is
/// stored tiled).
fn forward(
    scores: &Tensor<4>,
    mask: &Tensor<4>,
    scale: f32,
    fill: f32,
    drop: Option<&DropoutMask>,
) -> Option<(Tensor<4>, Option<Tensor<4>>)> {
    let dims = scores.dims();
    let rows = dims[0] * dims[1] * dims[2];
    let (sp, mp) = (cube(scores)?, cube(mask)?);
    let device = scores.device();
    let empty = || Tensor::<4>::empty(dims, (&device, scores.dtype()));
    let probs = empty();
    // a one-element stand-in without a dropout (the kernel writes it only with one)
    let dropped = match drop {
        Some(_) => empty(),
        None => Tensor::<4>::empty([1, 1, 1, 1], (&device, scores.dtype())),
    };
    if rows * dims[3] == 0 {
        return Some((probs, drop.map(|_| dropped)));
    }
    let (keys, key_base, threshold, keep_scale) = DropoutMask::args(drop, &device);
    let (pp, dp, kp) = (cube(&probs)?, cube(&dropped)?, cube(&keys)?);
    let client = pp.client.clone();
    kernel::masked_softmax_rows::launch(
        &client,
        cube_count(rows)?,
        CubeDim::new_1d(UNITS as u32),
        sp.into_tensor_arg(),
        mp.into_tensor_arg(),
        kp.into_tensor_arg(),
        pp.into_tensor_arg(),
        dp.into_tensor_arg(),
        rows,
        scale,
        fill,
        key_base,
        threshold,
        keep_scale,
        UNITS,
        drop.is_some(),
        ElemType::Float(float_kind(scores.dtype())?),
    );
    Some((probs, drop.map(|_| dropped)))
}

/// The backward launch of [`try_masked_softmax`] for the probabilities' gradient `grad`
/// (with `drop`, the dropped probabilities' gradient).
fn backward(
    probs: &Tensor<4>,
    grad: &Tensor<4>,
    mask: &Tensor<4>,
    scale: f32,
    drop: Option<&DropoutMask>,
) -> Option<Tensor<4>> {
    let dims = probs.dims();
    let rows = dims[0] * dims[1] * dims[2];
    let (pp, gp, mp) = (cube(probs)?, cube(grad)?, cube(mask)?);
    let device = probs.device();
    let d_scores = Tensor::<4>::empty(dims, (&device, probs.dtype()));
    if rows * dims[3] == 0 {
        return Some(d_scores);
    }
    let (keys, key_base, threshold, keep_scale) = DropoutMask::args(drop, &device);
    let (dp, kp) = (cube(&d_scores)?, cube(&keys)?);
    let client = dp.client.clone();
    kernel::masked_softmax_backward_rows::launch(
        &client,
        cube_count(rows)?,
        CubeDim::new_1d(UNITS as u32),
        pp.into_tensor_arg(),
        gp.into_tensor_arg(),
        mp.into_tensor_arg(),
        kp.into_tensor_arg(),
        dp.into_tensor_arg(),
        rows,
        scale,
        key_base,
        threshold,
        keep_scale,
        UNITS,
        drop.is_some(),
        ElemType::Float(float_kind(probs.dtype())?),
    );
    Some(d_scores)
}

/// [`backward`] spelled out in burn's ops, for tensors its kernel does not take.
fn backward_ops(probs: &Tensor<4>, grad: &Tensor<4>, mask: &Tensor<4>, scale: f32) -> Tensor<4> {
    let dims = probs.dims();
    let dot = (probs.clone() * grad.clone()).sum_dim(3);
    let d = probs.clone() * (grad.clone() - dot) * f64::from(scale);
    let keep = mask
        .clone()
        .expand(dims)
        .cast(probs.dtype())
        .neg()
        .add_scalar(1.0);
    d * keep
}

/// `softmax(x)` over the last dimension of the attention scores, `x = scale scores` with the
/// keys `mask` names (`true`) set to `fill`, when `scores` is a float tensor of a cubecl
/// device: plain tensors as one launch, an autodiff graph (without checkpointing) as the same
/// launch with [`SoftmaxBackward`]'s backward step; anything else is handed back as
/// `Err(scores)`. A row whose keys are all masked gets `1 / Lk` on each (`fill` everywhere).
/// With `drop`, an active dropout's probability (`0 < p < 1`, on an autodiff graph), the
/// output is the probabilities through that dropout, applied in the same launches forward
/// and backward with the masks the dropout's own launches would draw
/// ([`super::cube_dropout`]); `Err` then means it was not applied either.
///
/// # Shapes
/// - `scores`: `[B, H, Lq, Lk]`
/// - `mask`: `[B, 1 or H, Lq, Lk]` (`true` = masked)
/// - output: `[B, H, Lq, Lk]`
#[allow(clippy::result_large_err)]
pub(crate) fn try_masked_softmax(
    scores: Tensor<4>,
    mask: &Tensor<4, Bool>,
    scale: f32,
    fill: f32,
    drop: Option<f64>,
) -> Result<Tensor<4>, Tensor<4>> {
    let [b, h, lq, lk] = scores.dims();
    let [mb, mh, mq, mk] = mask.dims();
    let fits = |m: usize, s: usize| m == s || m == 1;
    let on_cubecl = scores.clone().try_into_primitive::<Cube>().is_ok()
        || scores
            .clone()
            .try_into_primitive::<Autodiff<Cube>>()
            .is_ok();
    if !on_cubecl
        || float_kind(scores.dtype()).is_none()
        || !(fits(mb, b) && fits(mh, h) && fits(mq, lq) && fits(mk, lk))
    {
        return Err(scores); // before the mask's conversion costs anything
    }
    try_masked_softmax_f32(scores, &float_mask(mask), scale, fill, drop)
}

/// [`try_masked_softmax`] with the mask as f32 values (`1` on masked keys, `0` elsewhere;
/// [`crate::ops::Packing::key_rows_float_mask`] makes one once per batch).
///
/// # Shapes
/// - `scores`: `[B, H, Lq, Lk]`
/// - `mask`: `[B, 1 or H, Lq or 1, Lk]`
/// - output: `[B, H, Lq, Lk]`
#[allow(clippy::result_large_err)]
pub(crate) fn try_masked_softmax_f32(
    scores: Tensor<4>,
    mask: &Tensor<4>,
    scale: f32,
    fill: f32,
    drop: Option<f64>,
) -> Result<Tensor<4>, Tensor<4>> {
    let [b, h, lq, lk] = scores.dims();
    let [mb, mh, mq, mk] = mask.dims();
    let fits = |m: usize, s: usize| m == s || m == 1;
    if float_kind(scores.dtype()).is_none()
        || mask.dtype() != DType::F32
        || !(fits(mb, b) && fits(mh, h) && fits(mq, lq) && fits(mk, lk))
        || drop.is_some_and(|p| !(p > 0.0 && p < 1.0))
    {
        return Err(scores);
    }
    if !scores.device().is_autodiff() {
        if drop.is_some() {
            return Err(scores); // no dropout off a graph
        }
        return match forward(&scores, mask, scale, fill, None) {
            Some((probs, _)) => Ok(probs),
            None => Err(scores),
        };
    }
    let Ok(sp) = scores.clone().try_into_primitive::<Autodiff<Cube>>() else {
        return Err(scores);
    };
    let inner = Tensor::<4>::from_primitive::<Cube>(sp.primitive().clone());
    // the mask has no gradient: its values, off the graph
    let Ok(mask) = mask.clone().try_into_primitive::<Autodiff<Cube>>() else {
        return Err(scores);
    };
    let mask = Tensor::<4>::from_primitive::<Cube>(mask.primitive().clone());
    // the key drawn after every check that declines (a launch that still fails, on a
    // storage-tiled tensor, leaves the caller's dropout to draw another)
    let drop = drop.map(|p| DropoutMask::draw(p, &inner.device()));
    let Some((probs, dropped)) = forward(&inner, &mask, scale, fill, drop.as_ref()) else {
        return Err(scores);
    };
    let (probs, mask) = (primitive(probs), primitive(mask));
    let out = dropped.map_or_else(|| probs.clone(), primitive);
    let (keys, drop) = drop.map(DropoutMask::into_parts).unzip();
    let keys = keys.map(primitive);
    let step = SoftmaxBackward { scale, drop };
    let kind = step
        .prepare::<NoCheckpointing>([sp.node()])
        .compute_bound()
        .stateful();
    let out = finish(kind, (probs, mask, keys), out);
    Ok(Tensor::from_primitive::<Autodiff<Cube>>(out))
}

/// The backward step of [`try_masked_softmax`]: the scores' gradient from the probabilities
/// and their gradient (with a dropout, the dropped probabilities' gradient through its mask),
/// in one launch ([`backward`]; burn's ops where that does not run).
#[derive(Debug)]
struct SoftmaxBackward {
    scale: f32,
    /// A dropout of the probabilities: its key's index in the state's keys, its threshold and
    /// scale.
    drop: Option<DropoutMaskParts>,
}

impl Backward<Cube, 1> for SoftmaxBackward {
    /// The probabilities, the f32 mask, and with a dropout the keys its key is among.
    type State = (CubeTensor, CubeTensor, Option<CubeTensor>);

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let grad = Tensor::<4>::from_primitive::<Cube>(grads.consume::<Cube>(&ops.node));
        let [parent] = ops.parents;
        let Some(node) = parent else {
            return;
        };
        let probs = Tensor::<4>::from_primitive::<Cube>(ops.state.0);
        let mask = Tensor::<4>::from_primitive::<Cube>(ops.state.1);
        let drop = self.drop.zip(ops.state.2).map(|(parts, keys)| {
            DropoutMask::from_parts(Tensor::<1>::from_primitive::<Cube>(keys), parts)
        });
        let d = backward(&probs, &grad, &mask, self.scale, drop.as_ref()).unwrap_or_else(|| {
            // the dropout's backward launch, then the softmax's in burn's ops
            let grad = match &drop {
                Some(drop) => drop.apply_to(grad.clone()),
                None => grad.clone(),
            };
            backward_ops(&probs, &grad, &mask, self.scale)
        });
        grads.register::<Cube>(node.id, primitive(d));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::tensor::{Distribution, TensorData, activation::softmax};
    use infembed_testkit::max_rel_diff;

    fn values(t: Tensor<4>) -> Vec<f32> {
        t.into_data().convert::<f32>().try_to_vec::<f32>().unwrap()
    }

    /// A key-padding mask `[B, 1, Lq, Lk]` (a view of `[B, 1, 1, Lk]`) whose row `b` masks
    /// its last `masked[b]` keys.
    fn key_mask(masked: &[usize], lq: usize, lk: usize, device: &Device) -> Tensor<4, Bool> {
        let flags: Vec<bool> = masked
            .iter()
            .flat_map(|&n| (0..lk).map(move |j| j + n >= lk))
            .collect();
        let b = masked.len();
        Tensor::<2, Bool>::from_data(TensorData::new(flags, [b, lk]), device)
            .reshape([b, 1, 1, lk])
            .expand([b, 1, lq, lk])
    }

    /// On wgpu (Mesa's software driver in CI) the one-kernel masked softmax gives what burn's
    /// ops give (the scaling, `mask_fill`, `softmax`): plain tensors, f16, a row whose keys
    /// are all masked, more keys than a cube's units, transposed scores; on an autodiff graph
    /// the same values and, for `sum(p r)` with a fixed random `r`, the scores' gradient of
    /// burn's ops. The backward step in burn's ops gives the kernel's values.
    #[test]
    fn masked_softmax_equals_burns_ops() {
        let Some(gpu) = crate::test_wgpu("masked_softmax_equals_burns_ops") else {
            return;
        };
        let _rng = crate::rng_lock();
        gpu.seed(41);
        let (scale, fill) = (0.25f32, -6.0e4f32);
        let reference = |scores: Tensor<4>, mask: &Tensor<4, Bool>| {
            let [b, h, lq, lk] = scores.dims();
            let x = scores
                .mul_scalar(scale)
                .mask_fill(mask.clone().expand([b, h, lq, lk]), fill);
            softmax(x, 3)
        };
        // lengths below, at and above the cube's 64 units; the last row all masked
        for (b, h, l, masked) in [
            (3, 2, 7, vec![0, 3, 7]),
            (2, 3, 64, vec![10, 64]),
            (2, 2, 150, vec![0, 149]),
        ] {
            let mask = key_mask(&masked, l, l, &gpu);
            let scores = Tensor::<4>::random([b, h, l, l], Distribution::Normal(0.0, 3.0), &gpu);
            let expected = values(reference(scores.clone(), &mask));
            let got =
                try_masked_softmax(scores.clone(), &mask, scale, fill, None).expect("plain wgpu");
            let diff = max_rel_diff(&expected, &values(got));
            assert!(diff < 1e-5, "[{b}, {h}, {l}]: {diff}");
            // the same scores stored transposed (keys before queries)
            let stored = Tensor::<4>::from_data(scores.clone().swap_dims(2, 3).into_data(), &gpu);
            let got = try_masked_softmax(stored.swap_dims(2, 3), &mask, scale, fill, None)
                .expect("strided");
            let diff = max_rel_diff(&expected, &values(got));
            assert!(diff < 1e-5, "[{b}, {h}, {l}] transposed: {diff}");
            let half = scores.clone().cast(DType::F16);
            let expected16 = values(reference(half.clone().cast(DType::F32), &mask));
            let got = try_masked_softmax(half, &mask, scale, fill, None).expect("f16");
            let diff = max_rel_diff(&expected16, &values(got));
            assert!(diff < 2e-3, "[{b}, {h}, {l}] f16: {diff}");

            let ad = gpu.clone().autodiff();
            let r = Tensor::<4>::random([b, h, l, l], Distribution::Normal(0.0, 1.0), &ad);
            let mask_ad = key_mask(&masked, l, l, &ad);
            let run = |ours: bool| {
                let s = Tensor::<4>::from_data(scores.to_data(), &ad).require_grad();
                let s2 = s.clone() * 1.0;
                let p = if ours {
                    try_masked_softmax(s2, &mask_ad, scale, fill, None).expect("an autodiff graph")
                } else {
                    reference(s2, &mask_ad)
                };
                let grads = (p.clone() * r.clone()).sum().backward();
                (values(p), values(s.grad(&grads).unwrap()))
            };
            let (burn, ours) = (run(false), run(true));
            assert!(
                max_rel_diff(&burn.0, &ours.0) < 1e-5,
                "[{b}, {h}, {l}] autodiff values"
            );
            let diff = max_rel_diff(&burn.1, &ours.1);
            assert!(diff < 1e-5, "[{b}, {h}, {l}] gradient: {diff}");
        }

        // more rows than one axis of cubes holds (65,535), a mask of its own per head and
        // query (not broadcast); a single query per head, its mask broadcast over heads
        for (dims, mask_dims) in [
            ([2, 2, 17_000, 2], [2, 2, 17_000, 2]),
            ([3, 2, 1, 9], [3, 1, 1, 9]),
        ] {
            let scores = Tensor::<4>::random(dims, Distribution::Normal(0.0, 3.0), &gpu);
            let mask = Tensor::<4>::random(mask_dims, Distribution::Bernoulli(0.3), &gpu).bool();
            let expected = values(reference(scores.clone(), &mask));
            let got =
                try_masked_softmax(scores.clone(), &mask, scale, fill, None).expect("plain wgpu");
            let diff = max_rel_diff(&expected, &values(got));
            assert!(diff < 1e-5, "{dims:?}: {diff}");
            let ad = gpu.clone().autodiff();
            let r = Tensor::<4>::random(dims, Distribution::Normal(0.0, 1.0), &ad);
            let mask_ad = Tensor::<4, Bool>::from_data(mask.to_data(), &ad);
            let run = |ours: bool| {
                let s = Tensor::<4>::from_data(scores.to_data(), &ad).require_grad();
                let p = if ours {
                    try_masked_softmax(s.clone(), &mask_ad, scale, fill, None).expect("autodiff")
                } else {
                    reference(s.clone(), &mask_ad)
                };
                let grads = (p * r.clone()).sum().backward();
                values(s.grad(&grads).unwrap())
            };
            let diff = max_rel_diff(&run(false), &run(true));
            assert!(diff < 1e-5, "{dims:?} gradient: {diff}");
        }

        let (b, h, l) = (2, 3, 40);
        let mask = float_mask(&key_mask(&[5, 0], l, l, &gpu));
        let probs = Tensor::<4>::random([b, h, l, l], Distribution::Uniform(0.0, 0.1), &gpu);
        let grad = Tensor::<4>::random([b, h, l, l], Distribution::Normal(0.0, 1.0), &gpu);
        let kernel = backward(&probs, &grad, &mask, scale, None).expect("plain wgpu tensors");
        let ops = backward_ops(&probs, &grad, &mask, scale);
        assert!(
            max_rel_diff(&values(ops), &values(kernel)) < 1e-5,
            "backward in burn's ops"
        );

        let scores = Tensor::<4>::zeros([2, 1, 3, 4], &gpu);
        let other = key_mask(&[0, 0], 3, 5, &gpu);
        assert!(
            try_masked_softmax(scores, &other, 1.0, fill, None).is_err(),
            "a mask of other keys"
        );
    }

    /// On a wgpu autodiff graph (Mesa's software driver in CI), the dropout of the attention
    /// probabilities inside the softmax's launches equals the softmax then the dropout's own
    /// launch under the same seed: the dropped probabilities and the scores' gradient, to the
    /// bit, for scores plain and transposed, more keys than a cube's units, masked keys. The
    /// dropout did drop, and another seed gives other values.
    #[test]
    fn a_dropout_inside_the_softmax_equals_its_own_launch_after() {
        let Some(gpu) =
            crate::test_wgpu("a_dropout_inside_the_softmax_equals_its_own_launch_after")
        else {
            return;
        };
        let _rng = crate::rng_lock();
        let ad = gpu.clone().autodiff();
        let p = 0.1;
        let module = burn::nn::DropoutConfig::new(p).init();
        for (b, h, l, masked) in [(2, 3, 7, vec![0, 3]), (1, 2, 90, vec![20])] {
            let mask = key_mask(&masked, l, l, &ad);
            let s0 = Tensor::<4>::random([b, h, l, l], Distribution::Normal(0.0, 2.0), &gpu);
            let r = Tensor::<4>::random([b, h, l, l], Distribution::Normal(0.0, 1.0), &ad);
            for transposed in [false, true] {
                let run = |inside: bool, seed: u64| {
                    let s = Tensor::<4>::from_data(s0.to_data(), &ad).require_grad();
                    let scores = if transposed {
                        s.clone().swap_dims(2, 3)
                    } else {
                        s.clone()
                    };
                    ad.seed(seed);
                    let y = if inside {
                        try_masked_softmax(scores, &mask, 0.5, -6e4, Some(p)).expect("a graph")
                    } else {
                        let probs = try_masked_softmax(scores, &mask, 0.5, -6e4, None).unwrap();
                        super::super::dropout(&module, probs)
                    };
                    let grads = (y.clone() * r.clone()).sum().backward();
                    (values(y), values(s.grad(&grads).unwrap()))
                };
                let what = format!("[{b}, {h}, {l}, {l}] transposed {transposed}");
                let (own, inside) = (run(false, 3), run(true, 3));
                assert_eq!(own.0, inside.0, "{what}: the dropped probabilities");
                assert_eq!(own.1, inside.1, "{what}: the scores' gradient");
                assert!(
                    own.0.iter().filter(|&&v| v == 0.0).count() > masked.iter().sum::<usize>(),
                    "{what}: the dropout dropped"
                );
                assert_ne!(
                    run(true, 4).0,
                    inside.0,
                    "{what}: another seed, another mask"
                );
            }
        }
        let plain = Tensor::<4>::zeros([1, 1, 2, 2], &gpu);
        let mask = key_mask(&[0], 2, 2, &gpu);
        assert!(
            try_masked_softmax(plain, &mask, 1.0, -6e4, Some(p)).is_err(),
            "no dropout off a graph"
        );
    }
}
