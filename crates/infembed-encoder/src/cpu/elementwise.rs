//! Fused element-wise kernels for the CPU `flex` backend: exact GELU and dropout.
//!
//! burn 0.22's `flex` backend runs these two ops as single-threaded scalar loops (GELU calls
//! libm's `erff` per element and its backward `erff` and `expf` again; dropout draws every
//! Bernoulli sample from one ChaCha generator and then multiplies twice), a large share of an
//! inference pass and of a training step on all-MiniLM-L6-v2 (docs/benchmarks.md). The
//! kernels here compute the same functions with
//! branch-free code (eight AVX2 lanes at a time where the processor has them, through `pulp`'s
//! safe wrappers), split over rayon's threads, and register their
//! own backward step with burn's autodiff graph (burn's documented extension path:
//! [`Tensor::try_into_primitive`] / [`Tensor::from_primitive`]).
//!
//! Every function hands its input back whenever the tensor is not an `f32` tensor of the
//! `flex` backend (plain, or autodiff without gradient checkpointing), and [`crate::ops`] runs
//! burn's own op instead, so the CUDA and libtorch backends behave exactly as before.
//!
//! # Accuracy
//!
//! GELU uses `erfc` from a Chebyshev fit with relative error below 1.2e-7 (Numerical Recipes'
//! `erfcc` coefficients) and an exponential with Cody-Waite reduction and a degree-7
//! polynomial (relative error below 2e-7): against libm-based GELU the absolute difference
//! stays below 1e-6 * max(1, |x|) (tested on a dense grid and with proptest), far inside the
//! 1e-5 parity tolerance of the encoder tests.
//!
//! # Dropout and seeds
//!
//! [`try_dropout`] keeps burn's seeding contract: each call draws one 64-bit seed from burn's
//! device generator (so `device.seed(s)` still makes a pass reproducible, and call order
//! decides the masks exactly as with `burn::nn::Dropout`), then derives every element's keep
//! decision from a counter-based hash of `(seed, index)`, so the mask does not depend on how
//! the work is split across threads.

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::NoCheckpointing;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind, unary};
use burn::backend::flex::FlexTensor;
use burn::backend::{Autodiff, Flex};
use burn::nn::Dropout;
use burn::prelude::*;
use burn::tensor::{DType, Distribution, TensorData};
use rayon::prelude::*;

/// Elements per parallel task (small tensors run on the calling thread).
const CHUNK: usize = 1 << 14;

/// `e^x` for `f32`, branch-free (Cody-Waite range reduction, degree-7 Taylor polynomial on
/// `|r| <= ln2 / 2`, exponent assembled from bits). Inputs are clamped to `[-87, 88]`, so
/// the result never overflows and underflows to about 1.6e-38, not 0.
#[inline(always)]
#[allow(clippy::excessive_precision)]
fn exp_f32(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    // 1.5 * 2^23: adding and subtracting it rounds to the nearest integer in f32.
    const ROUND: f32 = 12_582_912.0;
    let x = x.clamp(-87.0, 88.0);
    let n = (x * LOG2E + ROUND) - ROUND;
    let r = x - n * LN2_HI - n * LN2_LO;
    let p = 1.0 / 5040.0;
    let p = p * r + 1.0 / 720.0;
    let p = p * r + 1.0 / 120.0;
    let p = p * r + 1.0 / 24.0;
    let p = p * r + 1.0 / 6.0;
    let p = p * r + 0.5;
    let p = p * r + 1.0;
    let p = p * r + 1.0;
    let scale = f32::from_bits(((n as i32 + 127) as u32) << 23);
    p * scale
}

/// `erfc(z)` for `z >= 0` (relative error below 1.2e-7; Chebyshev fit of Numerical Recipes).
/// The published coefficients are kept digit for digit, hence more digits than f32 holds.
#[inline(always)]
#[allow(clippy::excessive_precision)]
fn erfc_nonneg(z: f32) -> f32 {
    let t = 1.0 / (1.0 + 0.5 * z);
    let poly = 0.170_872_77;
    let poly = poly * t - 0.822_152_23;
    let poly = poly * t + 1.488_515_87;
    let poly = poly * t - 1.135_203_98;
    let poly = poly * t + 0.278_868_07;
    let poly = poly * t - 0.186_288_06;
    let poly = poly * t + 0.096_784_18;
    let poly = poly * t + 0.374_091_96;
    let poly = poly * t + 1.000_023_68;
    let poly = poly * t - 1.265_512_23;
    t * exp_f32(poly - z * z)
}

/// The standard normal CDF `Phi(x) = 0.5 * erfc(-x / sqrt 2)`.
#[inline(always)]
fn normal_cdf(x: f32) -> f32 {
    let half_tail = 0.5 * erfc_nonneg(x.abs() * std::f32::consts::FRAC_1_SQRT_2);
    if x >= 0.0 { 1.0 - half_tail } else { half_tail }
}

/// Exact GELU, `x * Phi(x)`.
#[inline(always)]
pub(crate) fn gelu_scalar(x: f32) -> f32 {
    x * normal_cdf(x)
}

/// `e^x` on eight lanes with AVX2 + FMA: [`exp_f32`]'s formulas.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn exp_v3(simd: pulp::x86::V3, x: pulp::f32x8) -> pulp::f32x8 {
    let mut v = [x];
    exp_v3_many(simd, &mut v);
    v[0]
}

/// [`exp_v3`] of `N` vectors in place, each step applied to all of them before the next, so
/// the `N` dependency chains overlap in the processor's pipeline.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn exp_v3_many<const N: usize>(simd: pulp::x86::V3, xs: &mut [pulp::f32x8; N]) {
    let lo = simd.splat_f32x8(-87.0);
    let hi = simd.splat_f32x8(88.0);
    let log2e = simd.splat_f32x8(std::f32::consts::LOG2_E);
    let mut n = [lo; N];
    let mut r = [lo; N];
    for i in 0..N {
        let x = simd.min_f32x8(simd.max_f32x8(xs[i], lo), hi);
        n[i] = simd.round_f32x8(simd.mul_f32x8(x, log2e));
        r[i] = simd.mul_add_f32x8(n[i], simd.splat_f32x8(-0.693_359_4), x);
    }
    for i in 0..N {
        r[i] = simd.mul_add_f32x8(n[i], simd.splat_f32x8(2.121_944_4e-4), r[i]);
    }
    let mut p = [simd.splat_f32x8(1.0 / 5040.0); N];
    for c in [
        1.0 / 720.0,
        1.0 / 120.0,
        1.0 / 24.0,
        1.0 / 6.0,
        0.5,
        1.0,
        1.0,
    ] {
        let c = simd.splat_f32x8(c);
        for i in 0..N {
            p[i] = simd.mul_add_f32x8(p[i], r[i], c);
        }
    }
    for i in 0..N {
        let e = simd.wrapping_add_i32x8(simd.convert_f32x8_to_i32x8(n[i]), simd.splat_i32x8(127));
        let scale: pulp::f32x8 = pulp::cast(simd.shl_const_i32x8::<23>(e));
        xs[i] = simd.mul_f32x8(p[i], scale);
    }
}

/// [`gelu_scalar`] on eight lanes with AVX2 + FMA: the same formulas (Chebyshev `erfc`,
/// Cody-Waite `exp`), so the two agree to a few ulps (fused multiply-adds round once where
/// the scalar code rounds twice).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) fn gelu_v3(simd: pulp::x86::V3, x: pulp::f32x8) -> pulp::f32x8 {
    let mut v = [x];
    gelu_v3_many(simd, &mut v);
    v[0]
}

/// The standard normal CDF of `N` vectors ([`normal_cdf`]'s formulas), each step applied to
/// all of them before the next, so the `N` dependency chains overlap in the pipeline.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
#[allow(clippy::excessive_precision)]
fn normal_cdf_v3_many<const N: usize>(
    simd: pulp::x86::V3,
    xs: &[pulp::f32x8; N],
) -> [pulp::f32x8; N] {
    let one = simd.splat_f32x8(1.0);
    let half = simd.splat_f32x8(0.5);
    let mut z = [one; N];
    let mut t = [one; N];
    for i in 0..N {
        z[i] = simd.mul_f32x8(
            simd.abs_f32x8(xs[i]),
            simd.splat_f32x8(std::f32::consts::FRAC_1_SQRT_2),
        );
        t[i] = simd.div_f32x8(one, simd.mul_add_f32x8(z[i], half, one));
    }
    let mut poly = [simd.splat_f32x8(0.170_872_77); N];
    for c in [
        -0.822_152_23,
        1.488_515_87,
        -1.135_203_98,
        0.278_868_07,
        -0.186_288_06,
        0.096_784_18,
        0.374_091_96,
        1.000_023_68,
        -1.265_512_23,
    ] {
        let c = simd.splat_f32x8(c);
        for i in 0..N {
            poly[i] = simd.mul_add_f32x8(poly[i], t[i], c);
        }
    }
    let mut e = [one; N];
    for i in 0..N {
        e[i] = simd.negate_mul_add_f32x8(z[i], z[i], poly[i]);
    }
    exp_v3_many(simd, &mut e);
    let mut cdf = [one; N];
    for i in 0..N {
        let half_tail = simd.mul_f32x8(half, simd.mul_f32x8(t[i], e[i]));
        cdf[i] = simd.select_f32x8(
            simd.cmp_ge_f32x8(xs[i], simd.splat_f32x8(0.0)),
            simd.sub_f32x8(one, half_tail),
            half_tail,
        );
    }
    cdf
}

/// [`gelu_v3`] of `N` vectors in place (interleaved like [`normal_cdf_v3_many`]).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) fn gelu_v3_many<const N: usize>(simd: pulp::x86::V3, xs: &mut [pulp::f32x8; N]) {
    let cdf = normal_cdf_v3_many(simd, xs);
    for i in 0..N {
        xs[i] = simd.mul_f32x8(xs[i], cdf[i]);
    }
}

/// [`gelu_grad_scalar`] of `N` vectors: `Phi(x) + x phi(x)`.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn gelu_grad_v3_many<const N: usize>(
    simd: pulp::x86::V3,
    xs: &[pulp::f32x8; N],
) -> [pulp::f32x8; N] {
    let cdf = normal_cdf_v3_many(simd, xs);
    let mut e = [simd.splat_f32x8(0.0); N];
    for i in 0..N {
        e[i] = simd.mul_f32x8(simd.mul_f32x8(xs[i], xs[i]), simd.splat_f32x8(-0.5));
    }
    exp_v3_many(simd, &mut e);
    let mut out = cdf;
    for i in 0..N {
        let density = simd.mul_f32x8(e[i], simd.splat_f32x8(0.398_942_3));
        out[i] = simd.mul_add_f32x8(xs[i], density, cdf[i]);
    }
    out
}

/// An element-wise function with a scalar form and an eight-lane AVX2 form of four vectors.
trait LaneOp: Sync {
    /// `f(x, y)` for one element (`y` is 0 when the map has no second input).
    fn scalar(&self, x: f32, y: f32) -> f32;
    /// `f` on 32 elements.
    #[cfg(target_arch = "x86_64")]
    fn v3(&self, simd: pulp::x86::V3, x: [pulp::f32x8; 4], y: [pulp::f32x8; 4])
    -> [pulp::f32x8; 4];
}

/// Exact GELU of `x`.
struct GeluOp;

impl LaneOp for GeluOp {
    #[inline(always)]
    fn scalar(&self, x: f32, _: f32) -> f32 {
        gelu_scalar(x)
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    fn v3(
        &self,
        simd: pulp::x86::V3,
        mut x: [pulp::f32x8; 4],
        _: [pulp::f32x8; 4],
    ) -> [pulp::f32x8; 4] {
        gelu_v3_many(simd, &mut x);
        x
    }
}

/// `g * gelu'(z)` for the upstream gradient `g` (first input) at the input `z` (second).
struct GeluGradOp;

impl LaneOp for GeluGradOp {
    #[inline(always)]
    fn scalar(&self, g: f32, z: f32) -> f32 {
        g * gelu_grad_scalar(z)
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    fn v3(
        &self,
        simd: pulp::x86::V3,
        g: [pulp::f32x8; 4],
        z: [pulp::f32x8; 4],
    ) -> [pulp::f32x8; 4] {
        let mut d = gelu_grad_v3_many(simd, &z);
        for i in 0..4 {
            d[i] = simd.mul_f32x8(g[i], d[i]);
        }
        d
    }
}

/// One piece of a [`lane_map`] under AVX2 (a named type so `vectorize` inlines it).
#[cfg(target_arch = "x86_64")]
struct LanePiece<'a, O> {
    simd: pulp::x86::V3,
    op: &'a O,
    out: &'a mut [f32],
    x: Option<&'a [f32]>,
    y: Option<&'a [f32]>,
}

#[cfg(target_arch = "x86_64")]
impl<O: LaneOp> pulp::NullaryFnOnce for LanePiece<'_, O> {
    type Output = ();

    #[inline(always)]
    fn call(self) {
        let Self {
            simd,
            op,
            out,
            x,
            y,
        } = self;
        let zeros = [0f32; 32];
        let (head, tail) = pulp::as_arrays_mut::<32, f32>(out);
        let full = head.len() * 32;
        let block = |src: Option<&[f32]>, i: usize| -> Option<[f32; 32]> {
            src.map(|s| s[i * 32..i * 32 + 32].try_into().expect("32 elements"))
        };
        for (i, chunk) in head.iter_mut().enumerate() {
            let xv = block(x, i).unwrap_or(*chunk);
            let yv = block(y, i).unwrap_or(zeros);
            *chunk = pulp::cast(op.v3(simd, pulp::cast(xv), pulp::cast(yv)));
        }
        for (j, v) in tail.iter_mut().enumerate() {
            let xv = x.map_or(*v, |x| x[full + j]);
            *v = op.scalar(xv, y.map_or(0.0, |y| y[full + j]));
        }
    }
}

/// `out[i] = op(x[i], y[i])` in parallel pieces, with AVX2 where the processor has it; `x`
/// is `out` itself (in place) when `None`, `y` is 0 when `None`.
fn lane_map<O: LaneOp>(op: &O, out: &mut [f32], x: Option<&[f32]>, y: Option<&[f32]>) {
    #[cfg(target_arch = "x86_64")]
    let simd = pulp::x86::V3::try_new();
    let piece = |o: &mut [f32], c: usize| {
        let range = c * CHUNK..c * CHUNK + o.len();
        let x = x.map(|x| &x[range.clone()]);
        let y = y.map(|y| &y[range]);
        #[cfg(target_arch = "x86_64")]
        if let Some(simd) = simd {
            simd.vectorize(LanePiece {
                simd,
                op,
                out: o,
                x,
                y,
            });
            return;
        }
        for (j, v) in o.iter_mut().enumerate() {
            let xv = x.map_or(*v, |x| x[j]);
            *v = op.scalar(xv, y.map_or(0.0, |y| y[j]));
        }
    };
    if out.len() <= CHUNK {
        piece(out, 0);
    } else {
        out.par_chunks_mut(CHUNK)
            .enumerate()
            .for_each(|(c, s)| piece(s, c));
    }
}

/// [`lane_map`] on a flex `f32` tensor (in place when its storage is not shared, else into a
/// new tensor) with an optional second input of the same shape.
fn flex_lane_map<O: LaneOp>(op: &O, t: FlexTensor, other: Option<&FlexTensor>) -> FlexTensor {
    let other = other.map(|o| contiguous(o.clone()));
    let mut t = contiguous(t);
    let n = t.layout().num_elements();
    let ys = other.as_ref().map(|o| &o.storage::<f32>()[..n]);
    if let Some(s) = t.try_storage_mut::<f32>() {
        lane_map(op, &mut s[..n], None, ys);
        return t;
    }
    let mut out = vec![0f32; n];
    lane_map(op, &mut out, Some(&t.storage::<f32>()[..n]), ys);
    FlexTensor::from_data(TensorData::new(out, t.layout().shape().to_vec()))
}

/// GELU of every element of a flex `f32` tensor.
pub(crate) fn gelu_flex(t: FlexTensor) -> FlexTensor {
    flex_lane_map(&GeluOp, t, None)
}

/// `g * gelu'(z)` element-wise for flex `f32` tensors of one shape.
pub(crate) fn gelu_backward_flex(g: FlexTensor, z: &FlexTensor) -> FlexTensor {
    flex_lane_map(&GeluGradOp, g, Some(z))
}

/// `row[j] = exp(scale * row[j] - shift)` for every element (eight lanes at a time with AVX2
/// where the processor has it); returns the sum of the new values.
pub(crate) fn exp_shifted_in_place(row: &mut [f32], scale: f32, shift: f32) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if let Some(simd) = pulp::x86::V3::try_new() {
        return simd.vectorize(ExpShifted {
            simd,
            row,
            scale,
            shift,
        });
    }
    row.iter_mut()
        .map(|v| {
            *v = exp_f32(scale * *v - shift);
            *v
        })
        .sum()
}

/// [`exp_shifted_in_place`] under AVX2 (a named type so `vectorize` inlines it).
#[cfg(target_arch = "x86_64")]
struct ExpShifted<'a> {
    simd: pulp::x86::V3,
    row: &'a mut [f32],
    scale: f32,
    shift: f32,
}

#[cfg(target_arch = "x86_64")]
impl pulp::NullaryFnOnce for ExpShifted<'_> {
    type Output = f32;

    #[inline(always)]
    fn call(self) -> f32 {
        let Self {
            simd,
            row,
            scale,
            shift,
        } = self;
        let (head, tail) = pulp::as_arrays_mut::<8, f32>(row);
        let (vs, vsh) = (simd.splat_f32x8(scale), simd.splat_f32x8(-shift));
        let mut acc = simd.splat_f32x8(0.0);
        for chunk in head {
            let x: pulp::f32x8 = pulp::cast(*chunk);
            let e = exp_v3(simd, simd.mul_add_f32x8(x, vs, vsh));
            acc = simd.add_f32x8(acc, e);
            *chunk = pulp::cast(e);
        }
        let lanes: [f32; 8] = pulp::cast(acc);
        let mut sum: f32 = lanes.iter().sum();
        for v in tail {
            *v = exp_f32(scale * *v - shift);
            sum += *v;
        }
        sum
    }
}

/// Derivative of exact GELU, `Phi(x) + x * phi(x)`.
#[inline(always)]
pub(crate) fn gelu_grad_scalar(x: f32) -> f32 {
    // 1 / sqrt(2 pi)
    const INV_SQRT_2PI: f32 = 0.398_942_3;
    normal_cdf(x) + x * INV_SQRT_2PI * exp_f32(-0.5 * x * x)
}

/// Runs `f(chunk, chunk_index)` over `CHUNK`-sized pieces of `data`, in parallel when there
/// is more than one piece.
/// Each piece runs under `pulp`'s runtime CPU dispatch, so the loops are vectorized for the
/// best instruction set the processor has (AVX2 where present), not only for the baseline.
fn for_chunks(data: &mut [f32], f: impl Fn(&mut [f32], usize) + Sync) {
    let arch = pulp::Arch::new();
    if data.len() <= CHUNK {
        arch.dispatch(|| f(data, 0));
    } else {
        data.par_chunks_mut(CHUNK)
            .enumerate()
            .for_each(|(c, s)| arch.dispatch(|| f(s, c)));
    }
}

/// A flex tensor with contiguous storage starting at offset 0.
pub(crate) fn contiguous(t: FlexTensor) -> FlexTensor {
    if t.layout().is_contiguous() && t.layout().start_offset() == 0 {
        t
    } else {
        t.to_contiguous()
    }
}

/// `f(x_i, y_i, i)` for every element `x_i` (logical order) of the flex `f32` tensor `t`,
/// with `y_i` the same element of `other` (same shape; 0 when `None`): computed in place
/// when `t`'s storage is not shared, else into a new tensor.
pub(crate) fn flex_map(
    t: FlexTensor,
    other: Option<&FlexTensor>,
    f: impl Fn(f32, f32, usize) -> f32 + Sync,
) -> FlexTensor {
    let other = other.map(|o| contiguous(o.clone()));
    let ys = other.as_ref().map(|o| o.storage::<f32>());
    let mut t = contiguous(t);
    let n = t.layout().num_elements();
    // `src = None`: update `out` in place; else read `src`, write `out`.
    let run = |out: &mut [f32], src: Option<&[f32]>| {
        for_chunks(out, |o, c| {
            let (start, len) = (c * CHUNK, o.len());
            let src = src.map(|s| &s[start..start + len]);
            match (src, ys.map(|y| &y[start..start + len])) {
                (None, None) => o
                    .iter_mut()
                    .enumerate()
                    .for_each(|(j, v)| *v = f(*v, 0.0, start + j)),
                (None, Some(y)) => o
                    .iter_mut()
                    .zip(y)
                    .enumerate()
                    .for_each(|(j, (v, &y))| *v = f(*v, y, start + j)),
                (Some(x), None) => o
                    .iter_mut()
                    .zip(x)
                    .enumerate()
                    .for_each(|(j, (v, &x))| *v = f(x, 0.0, start + j)),
                (Some(x), Some(y)) => o
                    .iter_mut()
                    .zip(x.iter().zip(y))
                    .enumerate()
                    .for_each(|(j, (v, (&x, &y)))| *v = f(x, y, start + j)),
            }
        })
    };
    if let Some(s) = t.try_storage_mut::<f32>() {
        run(&mut s[..n], None);
        return t;
    }
    let mut out = vec![0f32; n];
    run(&mut out, Some(&t.storage::<f32>()[..n]));
    FlexTensor::from_data(TensorData::new(out, t.layout().shape().to_vec()))
}

/// The autodiff step of [`try_gelu`]: `grad * gelu'(x)`, with `x` kept as the state.
#[derive(Debug)]
struct GeluBackward;

impl Backward<Flex, 1> for GeluBackward {
    type State = FlexTensor;

    fn backward(self, ops: Ops<FlexTensor, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let x = ops.state;
        unary::<Flex, _>(ops.parents, ops.node, grads, |g| gelu_backward_flex(g, &x));
    }
}

/// Exact (erf) GELU, `x * Phi(x)`, as [`burn::tensor::activation::gelu`], computed in
/// parallel with vectorized code (see the [module docs](self)), when `x` is an `f32` tensor of
/// the `flex` backend (plain, or autodiff without checkpointing); anything else is handed back
/// as `Err(x)`.
pub(crate) fn try_gelu<const D: usize>(x: Tensor<D>) -> Result<Tensor<D>, Tensor<D>> {
    if x.dtype() != DType::F32 {
        return Err(x);
    }
    if x.device().is_autodiff() {
        let Ok(t) = x.clone().try_into_primitive::<Autodiff<Flex>>() else {
            return Err(x);
        };
        drop(x);
        let input = t.primitive().clone();
        let out = match GeluBackward
            .prepare::<NoCheckpointing>([t.node()])
            .compute_bound()
            .stateful()
        {
            OpsKind::Tracked(prep) => {
                let y = gelu_flex(input.clone());
                prep.finish(input, y)
            }
            OpsKind::UnTracked(prep) => prep.finish(gelu_flex(input)),
        };
        return Ok(Tensor::from_primitive::<Autodiff<Flex>>(out));
    }
    match x.clone().try_into_primitive::<Flex>() {
        Ok(t) => {
            drop(x);
            Ok(Tensor::from_primitive::<Flex>(gelu_flex(t)))
        }
        Err(_) => Err(x),
    }
}

/// SplitMix64's finalizer: a bijective 64-bit mix with good avalanche.
#[inline(always)]
fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The dropout multiplier of element `i`: `1 / keep` when kept, 0 when dropped. Each 64-bit
/// hash of `(seed, i / 2)` decides two elements (its two 32-bit halves).
#[inline(always)]
pub(crate) fn dropout_factor(seed: u64, i: usize, threshold: u32, scale: f32) -> f32 {
    let h = mix64(seed ^ ((i as u64 >> 1).wrapping_mul(0x9e37_79b9_7f4a_7c15)));
    let bits = if i & 1 == 0 {
        h as u32
    } else {
        (h >> 32) as u32
    };
    if bits < threshold { scale } else { 0.0 }
}

/// The autodiff step of [`try_dropout`]: the same mask applied to the gradient.
#[derive(Debug)]
struct DropoutBackward;

/// `(seed, threshold, scale)` of one dropout call.
type DropoutState = (u64, u32, f32);

/// Multiplies every element of a flex `f32` tensor by its dropout factor under `state`.
fn apply_dropout(t: FlexTensor, (seed, threshold, scale): DropoutState) -> FlexTensor {
    flex_map(t, None, |v, _, i| {
        v * dropout_factor(seed, i, threshold, scale)
    })
}

impl Backward<Flex, 1> for DropoutBackward {
    type State = DropoutState;

    fn backward(self, ops: Ops<DropoutState, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let state = ops.state;
        unary::<Flex, _>(ops.parents, ops.node, grads, |g| apply_dropout(g, state));
    }
}

/// The `(seed, threshold, scale)` of one dropout call with drop probability `prob`: one seed
/// drawn from `device`'s generator, the keep probability as a threshold on 32 uniform bits,
/// and the `1 / keep` scale of kept elements.
pub(crate) fn dropout_state(prob: f64, device: &Device) -> DropoutState {
    let seed = draw_seed(device);
    let (threshold, scale) = dropout_threshold_and_scale(prob);
    (seed, threshold, scale)
}

/// The threshold on 32 uniform bits that keeps an element with probability `1 - prob`, and
/// the `1 / (1 - prob)` scale of kept elements (the CPU's and the cubecl devices' dropout).
pub(crate) fn dropout_threshold_and_scale(prob: f64) -> (u32, f32) {
    let keep = 1.0 - prob;
    let threshold = (keep * 4_294_967_296.0).min(4_294_967_295.0) as u32;
    (threshold, (1.0 / keep) as f32)
}

/// One 64-bit seed drawn from burn's generator of `device` (so `device.seed` governs it):
/// four uniform draws contribute 16 bits each.
fn draw_seed(device: &Device) -> u64 {
    let draws = Tensor::<1>::random([4], Distribution::Default, &device.clone().inner())
        .into_data()
        .try_to_vec::<f32>()
        .unwrap_or_default();
    draws.iter().fold(0u64, |acc, &u| {
        (acc << 16) | ((u * 65_536.0) as u64 & 0xffff)
    })
}

/// `burn::nn::Dropout::forward` of an ACTIVE dropout (training mode on an autodiff device,
/// `prob > 0`: [`crate::ops::dropout`] decides that), kept elements scaled by
/// `1 / (1 - prob)`, computed by a fused parallel kernel when `x` is an `f32` tensor of the
/// autodiff `flex` backend; anything else is handed back as `Err(x)`.
pub(crate) fn try_dropout<const D: usize>(
    module: &Dropout,
    x: Tensor<D>,
) -> Result<Tensor<D>, Tensor<D>> {
    if x.dtype() != DType::F32 {
        return Err(x);
    }
    let Ok(t) = x.clone().try_into_primitive::<Autodiff<Flex>>() else {
        return Err(x);
    };
    let state = dropout_state(module.prob, &x.device());
    drop(x);
    let y = apply_dropout(t.primitive().clone(), state);
    let out = match DropoutBackward
        .prepare::<NoCheckpointing>([t.node()])
        .compute_bound()
        .stateful()
    {
        OpsKind::Tracked(prep) => prep.finish(state, y),
        OpsKind::UnTracked(prep) => prep.finish(y),
    };
    Ok(Tensor::from_primitive::<Autodiff<Flex>>(out))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::{dropout, gelu};
    use burn::nn::DropoutConfig;
    use burn::tensor::activation;
    use proptest::prelude::*;

    fn plain() -> Device {
        Device::flex()
    }

    fn values(t: Tensor<2>) -> Vec<f32> {
        t.into_data().try_to_vec::<f32>().expect("f32 tensor")
    }

    /// Largest `|a - b| / max(1, |x|)` over paired values.
    fn worst(xs: &[f32], a: &[f32], b: &[f32]) -> f32 {
        xs.iter()
            .zip(a.iter().zip(b))
            .map(|(x, (a, b))| (a - b).abs() / x.abs().max(1.0))
            .fold(0.0, f32::max)
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn vector_gelu_matches_scalar_gelu() {
        let Some(simd) = pulp::x86::V3::try_new() else {
            eprintln!("SKIPPED: this processor has no AVX2/FMA");
            return;
        };
        let xs: Vec<f32> = (0..80_000).map(|i| -20.0 + i as f32 * 5e-4).collect();
        for chunk in xs.chunks_exact(8) {
            let v: [f32; 8] = chunk.try_into().expect("eight");
            let got: [f32; 8] = pulp::cast(simd.vectorize(|| gelu_v3(simd, pulp::cast(v))));
            for (x, g) in v.iter().zip(got) {
                let want = gelu_scalar(*x);
                assert!(
                    (g - want).abs() <= 3e-7 * x.abs().max(1.0),
                    "x = {x}: {g} vs {want}"
                );
            }
        }
    }

    #[test]
    fn gelu_matches_burn_libm_gelu_on_a_dense_grid() {
        // 40,001 points on [-20, 20] plus values where erf's approximations switch regime
        let mut xs: Vec<f32> = (0..=40_000).map(|i| -20.0 + i as f32 * 1e-3).collect();
        xs.extend([
            0.0, -0.0, 1e-8, -1e-8, 0.84375, -0.84375, 1.25, -1.25, 6.0, -6.0, 87.0,
        ]);
        let n = xs.len();
        let x = Tensor::<2>::from_data(TensorData::new(xs.clone(), [1, n]), &plain());
        let ours = values(gelu(x.clone()));
        let reference = values(activation::gelu(x));
        let err = worst(&xs, &ours, &reference);
        assert!(err <= 1e-6, "worst scaled difference {err:e}");
        // GELU of large negative inputs is a tiny negative number, never NaN
        assert!(ours.iter().all(|v| v.is_finite()));
    }

    #[test]
    fn gelu_gradient_matches_burn_and_finite_differences() {
        let ad = plain().autodiff();
        let xs: Vec<f32> = (0..240)
            .map(|i| ((i * 37 % 240) as f32 - 120.0) / 17.0)
            .collect();
        let ws: Vec<f32> = (0..240)
            .map(|i| ((i * 11 % 13) as f32 - 6.0) / 5.0)
            .collect();
        let grad_of = |f: &dyn Fn(Tensor<2>) -> Tensor<2>| {
            let x =
                Tensor::<2>::from_data(TensorData::new(xs.clone(), [12, 20]), &ad).require_grad();
            let w = Tensor::<2>::from_data(TensorData::new(ws.clone(), [12, 20]), &ad);
            let grads = (f(x.clone()) * w).sum().backward();
            values(x.grad(&grads).expect("x has a gradient"))
        };
        let ours = grad_of(&gelu::<2>);
        let reference = grad_of(&activation::gelu::<2>);
        let err = worst(&xs, &ours, &reference);
        assert!(err <= 2e-6, "gradient differs from burn's by {err:e}");
        // central differences of the f64 GELU, independent of both implementations
        let gelu64 = |x: f64| 0.5 * x * (1.0 + erf64(x / std::f64::consts::SQRT_2));
        for (i, (&x, &w)) in xs.iter().zip(&ws).enumerate() {
            let h = 1e-4;
            let fd = (gelu64(x as f64 + h) - gelu64(x as f64 - h)) / (2.0 * h) * w as f64;
            assert!(
                (fd - ours[i] as f64).abs() < 2e-5,
                "x = {x}: {fd} vs {}",
                ours[i]
            );
        }
    }

    /// `erf` in f64 by its Maclaurin series (|x| < 3) or continued fraction (|x| >= 3).
    fn erf64(x: f64) -> f64 {
        let a = x.abs();
        let v = if a < 3.0 {
            let (mut term, mut sum, mut k) = (a, a, 0.0);
            while term.abs() > 1e-17 * sum.abs() {
                k += 1.0;
                term *= -a * a / k;
                sum += term / (2.0 * k + 1.0);
            }
            sum * 2.0 / std::f64::consts::PI.sqrt()
        } else {
            // erfc(a) = exp(-a^2)/sqrt(pi) * 1/(a + 1/2/(a + 1/(a + 3/2/(a + ...))))
            let mut f = a;
            for k in (1..60).rev() {
                f = a + (k as f64 / 2.0) / f;
            }
            1.0 - (-a * a).exp() / std::f64::consts::PI.sqrt() / f
        };
        v.copysign(x)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// Any shape, any finite values, contiguous or transposed: burn's GELU within 1e-6.
        #[test]
        fn gelu_equals_burn_for_any_tensor(
            rows in 1usize..40,
            cols in 1usize..70,
            seed in any::<u64>(),
            transpose in any::<bool>(),
        ) {
            let n = rows * cols;
            let xs: Vec<f32> = (0..n)
                .map(|i| ((mix64(seed ^ i as u64) >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 24.0)
                .collect();
            let mut x = Tensor::<2>::from_data(TensorData::new(xs, [rows, cols]), &plain());
            if transpose {
                x = x.transpose();
            }
            let flat = values(x.clone());
            let ours = values(gelu(x.clone()));
            let reference = values(activation::gelu(x));
            prop_assert!(worst(&flat, &ours, &reference) <= 1e-6);
        }
    }

    fn dropout_module(prob: f64) -> Dropout {
        DropoutConfig::new(prob).init()
    }

    #[test]
    fn dropout_is_the_identity_without_autodiff_or_in_eval_mode() {
        let x = Tensor::<2>::ones([4, 5], &plain());
        let y = dropout(&dropout_module(0.5), x.clone());
        assert_eq!(values(y), values(x));
        let ad = plain().autodiff();
        let m = dropout_module(0.5).valid();
        let x = Tensor::<2>::ones([4, 5], &ad);
        assert_eq!(values(dropout(&m, x.clone())), values(x));
    }

    #[test]
    fn dropout_drops_the_right_fraction_and_scales_the_rest() {
        let _rng = crate::rng_lock();
        let ad = plain().autodiff();
        for prob in [0.1, 0.5] {
            let n = 200_000usize;
            let x = Tensor::<2>::ones([n / 100, 100], &ad);
            let y = values(dropout(&dropout_module(prob), x));
            let zeros = y.iter().filter(|v| **v == 0.0).count() as f64;
            let expected = prob * n as f64;
            let sigma = (n as f64 * prob * (1.0 - prob)).sqrt();
            assert!(
                (zeros - expected).abs() < 5.0 * sigma,
                "p = {prob}: {zeros} zeros, expected {expected}"
            );
            let scale = (1.0 / (1.0 - prob)) as f32;
            assert!(y.iter().all(|v| *v == 0.0 || *v == scale));
            // neighbours (the two halves of one hash) are not correlated
            let both = y.chunks(2).filter(|p| p[0] == 0.0 && p[1] == 0.0).count() as f64;
            let pairs = (n / 2) as f64;
            let sigma2 = (pairs * prob * prob * (1.0 - prob * prob)).sqrt();
            assert!((both - pairs * prob * prob).abs() < 5.0 * sigma2);
        }
    }

    #[test]
    fn dropout_backward_applies_the_forward_mask() {
        let _rng = crate::rng_lock();
        let ad = plain().autodiff();
        let xs: Vec<f32> = (0..600).map(|i| 0.5 + (i % 7) as f32).collect();
        let x = Tensor::<2>::from_data(TensorData::new(xs.clone(), [20, 30]), &ad).require_grad();
        let y = dropout(&dropout_module(0.3), x.clone());
        let kept = values(y.clone().inner());
        let grads = y.sum().backward();
        let g = values(x.grad(&grads).expect("gradient"));
        let scale = (1.0f64 / 0.7) as f32;
        for ((&x, &y), &g) in xs.iter().zip(&kept).zip(&g) {
            // d(sum(y))/dx is the element's factor: 0 where dropped, 1 / 0.7 where kept
            if y == 0.0 {
                assert_eq!(g, 0.0, "x = {x} dropped, gradient {g}");
            } else {
                assert_eq!(y, x * scale);
                assert_eq!(g, scale, "x = {x} kept, gradient {g}");
            }
        }
        assert!(kept.contains(&0.0) && kept.iter().any(|v| *v != 0.0));
    }

    #[test]
    fn dropout_masks_follow_the_device_seed() {
        let _rng = crate::rng_lock();
        let ad = plain().autodiff();
        let m = dropout_module(0.5);
        let draw = |seed: u64| {
            ad.seed(seed);
            let first = values(dropout(&m, Tensor::<2>::ones([8, 64], &ad)));
            let second = values(dropout(&m, Tensor::<2>::ones([8, 64], &ad)));
            (first, second)
        };
        let (a1, a2) = draw(7);
        let (b1, b2) = draw(7);
        let (c1, _) = draw(8);
        assert_eq!(a1, b1);
        assert_eq!(a2, b2);
        assert_ne!(a1, a2, "two calls draw two masks");
        assert_ne!(a1, c1, "another seed, another mask");
    }
}
