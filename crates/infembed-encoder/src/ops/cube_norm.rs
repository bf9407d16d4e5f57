//! LayerNorm as one kernel on the cubecl devices (`wgpu`, `vulkan`, `cuda`; not a `fusion`
//! build), and on autodiff graphs its backward step as one kernel and two column sums.
//!
//! burn 0.22 spells LayerNorm out on these backends (`float_mean_dim`, a subtraction, a
//! product, a second `float_mean_dim`, a scalar addition, a square root, a division, the
//! scale and the shift): nine kernel launches, each reading and writing the whole `[T, d]`
//! tensor, and in training as many backward steps again, the scale's and shift's gradients
//! among them burn's one-unit-per-column reductions. [`try_layer_norm`] computes the same
//! function with one launch, one cube per row: the units sum the row (the mean), then the
//! squares of its deviations (the variance, two passes as burn's), in f32 whatever the
//! tensor's float type, through a tree in shared memory, and write
//! `(x - mean) / sqrt(var + eps) γ + β`. On an autodiff graph its backward step
//! ([`NormBackward`]) is one launch of the same shape for `x`'s gradient (and `g x̂`), and
//! the column sums of [`super::cube_sum`] for γ's and β's. Other backends keep burn's ops.
//!
//! [`try_add_layer_norm`] computes `LayerNorm(x + r)` (BERT's residual connections) the same
//! way, reading `x + r` in each pass instead of a sum written out first; on an autodiff graph
//! the launch also writes the sum, which the backward step normalizes again, and the input's
//! gradient goes to `x` and `r` alike.

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::NoCheckpointing;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops};
use burn::backend::{Autodiff, Cube};
use burn::nn::LayerNorm;
use burn::prelude::*;
use cubecl::CubeDim;
use cubecl::ir::ElemType;

use super::cube_dropout::{DropoutMask, DropoutMaskParts};
use super::cube_kit::{cube, cube_count, finish, plain, primitive};
use super::cube_sum::column_sums;
use super::routed::{CubeTensor, float_kind};

/// Units of a cube (a power of two: the tree halves it).
const UNITS: usize = 128;

mod kernel {
    use cubecl::prelude::*;

    use crate::ops::cube_dropout::kernel::kept;
    use crate::ops::cube_kit::kernel::cube_fold;

    /// Where a row's values sit: element `i` of the row at `base + i * step`.
    #[derive(CubeType)]
    pub(super) struct Row {
        base: usize,
        step: usize,
    }

    /// A dropout applied to `x` as it is read: the key at `base` of the kernel's keys, the
    /// element index of the row's first value (`row · d`: the index the dropout's own launch
    /// gives it), the keep threshold and the scale of kept values.
    #[derive(CubeType)]
    pub(super) struct Dropped {
        base: usize,
        first: usize,
        threshold: u32,
        scale: f32,
    }

    /// The dropout of row `row` (`d` values a row).
    #[cube]
    fn dropped_row(base: usize, row: usize, d: usize, threshold: u32, scale: f32) -> Dropped {
        Dropped {
            base,
            first: row * d,
            threshold,
            scale,
        }
    }

    /// Row `row` of a `[rows, d]` tensor, by its strides.
    #[cube]
    fn row_of<F: Float>(t: &Tensor<F>, row: usize) -> Row {
        Row {
            base: row * t.stride(0),
            step: t.stride(1),
        }
    }

    /// Element `i` of a row of `x` (with `dropped`, through the dropout `drop` of `keys`, rounded
    /// to the tensors' type as the dropout's own launch would store it), plus the same element
    /// of `r`'s row with `residual` (the sum rounded to their type).
    #[allow(clippy::too_many_arguments)]
    #[cube]
    fn value<F: Float>(
        x: &Tensor<F>,
        at: &Row,
        r: &Tensor<F>,
        r_at: &Row,
        keys: &Tensor<f32>,
        drop: &Dropped,
        i: usize,
        #[comptime] residual: bool,
        #[comptime] dropped: bool,
    ) -> f32 {
        let mut v = f32::cast_from(x[at.base + i * at.step]);
        if dropped {
            let keep = kept(keys, drop.base, drop.first + i, drop.threshold);
            v = f32::cast_from(F::cast_from(select(keep, v * drop.scale, 0.0f32)));
        }
        if residual {
            // rounded to the tensors' type, as burn's addition would store it
            v = f32::cast_from(F::cast_from(
                v + f32::cast_from(r[r_at.base + i * r_at.step]),
            ));
        }
        v
    }

    /// The mean of a row of `x` (`d` values; `+ r`'s row with `residual`), every unit getting
    /// it.
    #[allow(clippy::too_many_arguments)]
    #[cube]
    fn row_mean<F: Float>(
        x: &Tensor<F>,
        at: &Row,
        r: &Tensor<F>,
        r_at: &Row,
        keys: &Tensor<f32>,
        drop: &Dropped,
        partial: &mut Shared<[f32]>,
        unit: usize,
        #[comptime] units: usize,
        #[comptime] residual: bool,
        #[comptime] dropped: bool,
    ) -> f32 {
        let d = x.shape(1);
        let mut sum = 0.0f32;
        let mut i = unit;
        while i < d {
            sum += value(x, at, r, r_at, keys, drop, i, residual, dropped);
            i += units;
        }
        cube_fold(partial, sum, unit, units, false) / f32::cast_from(d)
    }

    /// `1 / sqrt(var + epsilon)` of the row of `row_mean`, its variance a second pass
    /// over the deviations from `mean` (as burn computes it).
    #[allow(clippy::too_many_arguments)]
    #[cube]
    fn row_rstd<F: Float>(
        x: &Tensor<F>,
        at: &Row,
        r: &Tensor<F>,
        r_at: &Row,
        keys: &Tensor<f32>,
        drop: &Dropped,
        mean: f32,
        epsilon: f32,
        partial: &mut Shared<[f32]>,
        unit: usize,
        #[comptime] units: usize,
        #[comptime] residual: bool,
        #[comptime] dropped: bool,
    ) -> f32 {
        let d = x.shape(1);
        let mut squares = 0.0f32;
        let mut i = unit;
        while i < d {
            let centered = value(x, at, r, r_at, keys, drop, i, residual, dropped) - mean;
            squares += centered * centered;
            i += units;
        }
        let variance = cube_fold(partial, squares, unit, units, false) / f32::cast_from(d);
        1.0f32 / f32::sqrt(variance + epsilon)
    }

    /// One row of `out = LayerNorm(x)` per cube (module docs), or with `residual` of
    /// `LayerNorm(x + r)`, the sum `x + r` also written to `sum` with `keep_sum` (for the
    /// backward step), with `dropped` of `LayerNorm(dropout(x) + r)`, the dropout's key at
    /// `key_base` of `keys`: `x`, `r`, `out` and `sum` `[rows, d]` with any strides (`r` read
    /// only with `residual`, `sum` written only with `keep_sum`, `keys` read only with
    /// `dropped`), `gamma` and `beta` `[d]`, at least one row.
    #[allow(clippy::too_many_arguments)]
    #[cube(launch)]
    pub(super) fn layer_norm_rows<F: Float>(
        x: &Tensor<F>,
        r: &Tensor<F>,
        gamma: &Tensor<F>,
        beta: &Tensor<F>,
        keys: &Tensor<f32>,
        out: &mut Tensor<F>,
        sum: &mut Tensor<F>,
        rows: usize,
        epsilon: f32,
        key_base: usize,
        threshold: u32,
        scale: f32,
        #[comptime] units: usize,
        #[comptime] shift: bool,
        #[comptime] residual: bool,
        #[comptime] keep_sum: bool,
        #[comptime] dropped: bool,
        #[define(F)] _dtype: ElemType,
    ) {
        // a cube past the last row (the second axis's last cubes) computes the last row
        // again and writes nothing: its barriers stay in uniform control flow
        let cube = (CUBE_POS_Y * CUBE_COUNT_X + CUBE_POS_X) as usize;
        let row = select(cube < rows, cube, rows - 1);
        let d = x.shape(1);
        let (at, r_at) = (row_of(x, row), row_of(r, row));
        let (out_base, out_step) = (row * out.stride(0), out.stride(1));
        let (sum_base, sum_step) = (row * sum.stride(0), sum.stride(1));
        let (gamma_step, beta_step) = (gamma.stride(0), beta.stride(0));
        let unit = UNIT_POS as usize;
        let mut partial = Shared::<[f32]>::new_slice(units);
        let drop = dropped_row(key_base, row, d, threshold, scale);

        let mean = row_mean(
            x,
            &at,
            r,
            &r_at,
            keys,
            &drop,
            &mut partial,
            unit,
            units,
            residual,
            dropped,
        );
        let rstd = row_rstd(
            x,
            &at,
            r,
            &r_at,
            keys,
            &drop,
            mean,
            epsilon,
            &mut partial,
            unit,
            units,
            residual,
            dropped,
        );

        if cube < rows {
            let mut i = unit;
            while i < d {
                let v = value(x, &at, r, &r_at, keys, &drop, i, residual, dropped);
                if keep_sum {
                    sum[sum_base + i * sum_step] = F::cast_from(v);
                }
                let mut y = (v - mean) * rstd * f32::cast_from(gamma[i * gamma_step]);
                if shift {
                    y += f32::cast_from(beta[i * beta_step]);
                }
                out[out_base + i * out_step] = F::cast_from(y);
                i += units;
            }
        }
    }

    /// The backward step of one row of `LayerNorm(x)` per cube, `g` the row's gradient:
    /// with `x̂ = (x - mean) rstd`, `dx = rstd (g γ - mean(g γ) - x̂ mean(g γ x̂))`, and
    /// `g_xhat = [g x̂ | g]` (`g x̂` alone without `shift`), whose column sums are γ's and
    /// β's gradients, and with `dropped`
    /// `dx_dropped`, `dx` through the dropout of the key at `key_base` of `keys` (the gradient
    /// of the dropout's input). `x`, `g`, `dx` and `dx_dropped` `[rows, d]`, `g_xhat`
    /// `[rows, 2 d]` (`[rows, d]` without `shift`), with any strides, `gamma` `[d]`, at least
    /// one row.
    #[allow(clippy::too_many_arguments)]
    #[cube(launch)]
    pub(super) fn layer_norm_backward_rows<F: Float>(
        x: &Tensor<F>,
        gamma: &Tensor<F>,
        g: &Tensor<F>,
        keys: &Tensor<f32>,
        dx: &mut Tensor<F>,
        g_xhat: &mut Tensor<F>,
        dx_dropped: &mut Tensor<F>,
        rows: usize,
        epsilon: f32,
        key_base: usize,
        threshold: u32,
        scale: f32,
        #[comptime] units: usize,
        #[comptime] shift: bool,
        #[comptime] dropped: bool,
        #[define(F)] _dtype: ElemType,
    ) {
        let cube = (CUBE_POS_Y * CUBE_COUNT_X + CUBE_POS_X) as usize;
        let row = select(cube < rows, cube, rows - 1);
        let d = x.shape(1);
        let (x_base, g_base) = (row * x.stride(0), row * g.stride(0));
        let (dx_base, gx_base) = (row * dx.stride(0), row * g_xhat.stride(0));
        let (x_step, g_step) = (x.stride(1), g.stride(1));
        let (dx_step, gx_step) = (dx.stride(1), g_xhat.stride(1));
        let gamma_step = gamma.stride(0);
        let unit = UNIT_POS as usize;
        let mut partial = Shared::<[f32]>::new_slice(units);
        let width = f32::cast_from(d);

        // no residual or dropout here: `x` is the sum the forward step kept
        let at = row_of(x, row);
        let drop = dropped_row(key_base, row, d, threshold, scale);
        let mean = row_mean(
            x,
            &at,
            x,
            &at,
            keys,
            &drop,
            &mut partial,
            unit,
            units,
            false,
            false,
        );
        let rstd = row_rstd(
            x,
            &at,
            x,
            &at,
            keys,
            &drop,
            mean,
            epsilon,
            &mut partial,
            unit,
            units,
            false,
            false,
        );

        let mut sum_g = 0.0f32;
        let mut sum_gx = 0.0f32;
        let mut i = unit;
        while i < d {
            let xhat = (f32::cast_from(x[x_base + i * x_step]) - mean) * rstd;
            let gg = f32::cast_from(g[g_base + i * g_step]) * f32::cast_from(gamma[i * gamma_step]);
            sum_g += gg;
            sum_gx += gg * xhat;
            i += units;
        }
        let mean_g = cube_fold(&mut partial, sum_g, unit, units, false) / width;
        let mean_gx = cube_fold(&mut partial, sum_gx, unit, units, false) / width;

        if cube < rows {
            i = unit;
            while i < d {
                let xhat = (f32::cast_from(x[x_base + i * x_step]) - mean) * rstd;
                let gi = f32::cast_from(g[g_base + i * g_step]);
                let gg = gi * f32::cast_from(gamma[i * gamma_step]);
                let dxi = F::cast_from(rstd * (gg - mean_g - xhat * mean_gx));
                dx[dx_base + i * dx_step] = dxi;
                g_xhat[gx_base + i * gx_step] = F::cast_from(gi * xhat);
                if shift {
                    g_xhat[gx_base + (d + i) * gx_step] = g[g_base + i * g_step];
                }
                if dropped {
                    // as the dropout's own backward launch computes it from `dx`
                    let keep = kept(keys, drop.base, drop.first + i, drop.threshold);
                    let at = row * dx_dropped.stride(0) + i * dx_dropped.stride(1);
                    dx_dropped[at] =
                        F::cast_from(select(keep, f32::cast_from(dxi) * drop.scale, 0.0f32));
                }
                i += units;
            }
        }
    }
}

/// `module.forward(x)`, with `eps` the module's epsilon, when `x` and the parameters (`[d]`
/// each) are float tensors of one type on one cubecl device: plain tensors as one kernel
/// launch, an autodiff graph (without checkpointing) as the same launch with the backward step
/// of [`NormBackward`]; anything else is handed back as `Err(x)`.
///
/// # Shapes
/// - `x`: `[..., d]`, `d` the module's width
/// - output: like `x`
#[allow(clippy::result_large_err)]
pub(crate) fn try_layer_norm<const D: usize>(
    module: &LayerNorm,
    eps: f64,
    x: Tensor<D>,
) -> Result<Tensor<D>, Tensor<D>> {
    norm(module, eps, x, None, None).map_err(|(x, _)| x)
}

/// `module.forward(x + residual)` as [`try_layer_norm`], the addition in the same launch (in
/// training the sum kept for the backward step, whose gradient goes to both); anything else
/// is handed back as `Err((x, residual))`.
///
/// # Shapes
/// - `x`, `residual`: `[..., d]`, `d` the module's width
/// - output: like `x`
#[allow(clippy::result_large_err)]
pub(crate) fn try_add_layer_norm<const D: usize>(
    module: &LayerNorm,
    eps: f64,
    x: Tensor<D>,
    residual: Tensor<D>,
) -> Result<Tensor<D>, (Tensor<D>, Tensor<D>)> {
    if residual.dims() != x.dims()
        || residual.dtype() != x.dtype()
        || residual.device() != x.device()
    {
        return Err((x, residual)); // burn's addition names the mismatch
    }
    norm(module, eps, x, Some(residual), None).map_err(|(x, r)| (x, r.expect("given")))
}

/// `module.forward(dropout(x) + residual)` on an autodiff graph of cubecl tensors, the dropout
/// (probability `prob`, `0 < prob < 1`: an active one, which the caller decides) applied in
/// [`try_add_layer_norm`]'s launch as `x` is read and to `x`'s gradient in the backward step's
/// launch: the masks of the dropout's own launches ([`super::cube_dropout`], the key drawn
/// alike), two launches fewer each way. Anything else is handed back as `Err((x, residual))`,
/// no key drawn.
///
/// # Shapes
/// - `x`, `residual`: `[..., d]`, `d` the module's width
/// - output: like `x`
#[allow(clippy::result_large_err)]
pub(crate) fn try_dropout_add_layer_norm<const D: usize>(
    module: &LayerNorm,
    eps: f64,
    x: Tensor<D>,
    residual: Tensor<D>,
    prob: f64,
) -> Result<Tensor<D>, (Tensor<D>, Tensor<D>)> {
    if residual.dims() != x.dims()
        || residual.dtype() != x.dtype()
        || residual.device() != x.device()
        || !x.device().is_autodiff()
        || !(prob > 0.0 && prob < 1.0)
    {
        return Err((x, residual));
    }
    norm(module, eps, x, Some(residual), Some(prob)).map_err(|(x, r)| (x, r.expect("given")))
}

/// [`try_layer_norm`], [`try_add_layer_norm`] and [`try_dropout_add_layer_norm`] (`residual`
/// the same shape, type and device as `x`; `drop`, the dropout's probability, only with a
/// residual on an autodiff graph).
#[allow(clippy::result_large_err, clippy::type_complexity)]
fn norm<const D: usize>(
    module: &LayerNorm,
    eps: f64,
    x: Tensor<D>,
    residual: Option<Tensor<D>>,
    drop: Option<f64>,
) -> Result<Tensor<D>, (Tensor<D>, Option<Tensor<D>>)> {
    let gamma = module.gamma.val();
    let beta = module.beta.as_ref().map(|b| b.val());
    let dims = x.dims();
    let d = dims[D - 1];
    let rows: usize = dims[..D - 1].iter().product();
    let device = x.device();
    let unlike = |p: &Tensor<1>| p.dims() != [d] || p.dtype() != x.dtype() || p.device() != device;
    if float_kind(x.dtype()).is_none() || unlike(&gamma) || beta.as_ref().is_some_and(unlike) {
        return Err((x, residual)); // burn's ops compute it, or name the mismatch
    }
    if device.is_autodiff() {
        return tracked(x, residual, gamma, beta, eps, drop);
    }
    if cube(&x).is_none() || drop.is_some() {
        return Err((x, residual)); // the CPU's, before any reshape copies it
    }
    // the rows as `[rows, d]` (free for the contiguous tensors LayerNorm gets; burn copies
    // others)
    let x2 = x.clone().reshape([rows, d]);
    let r2 = residual.as_ref().map(|r| r.clone().reshape([rows, d]));
    match forward_rows(&x2, r2.as_ref(), &gamma, beta.as_ref(), eps, false, None) {
        Some((y, _)) => Ok(y.reshape(dims)),
        None => Err((x, residual)),
    }
}

/// `LayerNorm(x)`, or `LayerNorm(x + residual)` (`LayerNorm(dropout(x) + residual)` with
/// `drop`), of plain cubecl tensors as one launch of `kernel::layer_norm_rows`, and with
/// `keep_sum` the sum it normalized (`None` when one of them is not a cubecl tensor, or is
/// stored tiled).
///
/// # Shapes
/// - `x`, `residual`: `[rows, d]`
/// - `gamma`, `beta`: `[d]`
/// - outputs: `[rows, d]` each
fn forward_rows(
    x: &Tensor<2>,
    residual: Option<&Tensor<2>>,
    gamma: &Tensor<1>,
    beta: Option<&Tensor<1>>,
    eps: f64,
    keep_sum: bool,
    drop: Option<&DropoutMask>,
) -> Option<(Tensor<2>, Option<Tensor<2>>)> {
    let xp = cube(x)?;
    let [rows, d] = x.dims();
    let (device, dtype) = (x.device(), x.dtype());
    let keep_sum = keep_sum && residual.is_some();
    if rows == 0 || d == 0 {
        return Some((x.clone(), None)); // nothing to normalize ([`tracked`] declines these)
    }
    // one-element stand-ins for what the kernel does not read or write
    let stand_in = || Tensor::<2>::empty([1, 1], (&device, dtype));
    let (r, sum) = (
        residual.cloned().unwrap_or_else(stand_in),
        if keep_sum {
            Tensor::<2>::empty([rows, d], (&device, dtype))
        } else {
            stand_in()
        },
    );
    let b = beta
        .cloned()
        .unwrap_or_else(|| Tensor::<1>::empty([1], (&device, dtype)));
    let (rp, gp, bp) = (cube(&r)?, cube(gamma)?, cube(&b)?);
    let (keys, key_base, threshold, scale) = DropoutMask::args(drop, &device);
    let kp = cube(&keys)?;
    let out = Tensor::<2>::empty([rows, d], (&device, dtype));
    let (op, sp) = (cube(&out)?, cube(&sum)?);
    let client = op.client.clone();
    kernel::layer_norm_rows::launch(
        &client,
        cube_count(rows)?,
        CubeDim::new_1d(UNITS as u32),
        xp.into_tensor_arg(),
        rp.into_tensor_arg(),
        gp.into_tensor_arg(),
        bp.into_tensor_arg(),
        kp.into_tensor_arg(),
        op.into_tensor_arg(),
        sp.into_tensor_arg(),
        rows,
        eps as f32,
        key_base,
        threshold,
        scale,
        UNITS,
        beta.is_some(),
        residual.is_some(),
        keep_sum,
        drop.is_some(),
        ElemType::Float(float_kind(dtype)?),
    );
    Some((out, keep_sum.then_some(sum)))
}

/// The backward step of `LayerNorm(x)` for a gradient `g` of plain cubecl tensors as one
/// launch of `kernel::layer_norm_backward_rows`: `x`'s gradient, and `g x̂` beside a copy of
/// `g` with `shift` (whose column sums are γ's and β's gradients: one pass of column sums
/// for both), and with `drop` `x`'s gradient through the dropout's mask.
/// `None` when a tensor is not a cubecl one or is stored tiled.
///
/// # Shapes
/// - `x`, `g`: `[rows, d]`, at least one row and one column
/// - `gamma`: `[d]`
/// - outputs: `[rows, d]` (`x`'s gradient), `[rows, 2 d]` (`g x̂` in columns `0..d`, `g` in
///   `d..2 d`; `[rows, d]` without `shift`), `[rows, d]` with `drop`
fn backward_rows(
    x: &Tensor<2>,
    gamma: &Tensor<1>,
    g: &Tensor<2>,
    eps: f64,
    shift: bool,
    drop: Option<&DropoutMask>,
) -> Option<(Tensor<2>, Tensor<2>, Option<Tensor<2>>)> {
    let (xp, gp, gradp) = (cube(x)?, cube(gamma)?, cube(g)?);
    let [rows, d] = x.dims();
    let device = x.device();
    let empty = |r: usize, cols: usize| Tensor::<2>::empty([r, cols], (&device, x.dtype()));
    let (dx, g_xhat) = (empty(rows, d), empty(rows, if shift { 2 * d } else { d }));
    // one-element stand-in without a dropout (the kernel writes it only with one)
    let dx_dropped = if drop.is_some() {
        empty(rows, d)
    } else {
        empty(1, 1)
    };
    let (keys, key_base, threshold, scale) = DropoutMask::args(drop, &device);
    let (dxp, gxp, ddp, kp) = (cube(&dx)?, cube(&g_xhat)?, cube(&dx_dropped)?, cube(&keys)?);
    let client = dxp.client.clone();
    kernel::layer_norm_backward_rows::launch(
        &client,
        cube_count(rows)?,
        CubeDim::new_1d(UNITS as u32),
        xp.into_tensor_arg(),
        gp.into_tensor_arg(),
        gradp.into_tensor_arg(),
        kp.into_tensor_arg(),
        dxp.into_tensor_arg(),
        gxp.into_tensor_arg(),
        ddp.into_tensor_arg(),
        rows,
        eps as f32,
        key_base,
        threshold,
        scale,
        UNITS,
        shift,
        drop.is_some(),
        ElemType::Float(float_kind(x.dtype())?),
    );
    Some((dx, g_xhat, drop.is_some().then_some(dx_dropped)))
}

/// [`backward_rows`] spelled out in burn's ops, for tensors its kernel does not take.
fn backward_ops(
    x: &Tensor<2>,
    gamma: &Tensor<1>,
    g: &Tensor<2>,
    eps: f64,
) -> (Tensor<2>, Tensor<2>) {
    let centered = x.clone() - x.clone().mean_dim(1);
    let rstd = (centered.clone().square().mean_dim(1) + eps).sqrt().recip();
    let xhat = centered * rstd.clone();
    let gg = g.clone() * gamma.clone().unsqueeze::<2>();
    let mean_g = gg.clone().mean_dim(1);
    let mean_gx = (gg.clone() * xhat.clone()).mean_dim(1);
    let dx = (gg - mean_g - xhat.clone() * mean_gx) * rstd;
    (dx, g.clone() * xhat)
}

/// [`norm`] on an autodiff graph of cubecl tensors: the forward launch, and [`NormBackward`]
/// as its backward step.
#[allow(clippy::result_large_err, clippy::type_complexity)]
fn tracked<const D: usize>(
    x: Tensor<D>,
    residual: Option<Tensor<D>>,
    gamma: Tensor<1>,
    beta: Option<Tensor<1>>,
    eps: f64,
    drop: Option<f64>,
) -> Result<Tensor<D>, (Tensor<D>, Option<Tensor<D>>)> {
    let dims = x.dims();
    let d = dims[D - 1];
    let rows: usize = dims[..D - 1].iter().product();
    let on_graph = |t: &Tensor<1>| t.clone().try_into_primitive::<Autodiff<Cube>>().ok();
    let (Ok(xp), Some(gp)) = (
        x.clone().try_into_primitive::<Autodiff<Cube>>(),
        on_graph(&gamma),
    ) else {
        return Err((x, residual));
    };
    let bp = match beta.as_ref().map(on_graph) {
        Some(None) => return Err((x, residual)),
        bp => bp.flatten(),
    };
    let rp = match residual
        .as_ref()
        .map(|r| r.clone().try_into_primitive::<Autodiff<Cube>>())
    {
        Some(Err(_)) => return Err((x, residual)),
        rp => rp.and_then(Result::ok),
    };
    // a dropout only before a residual's addition: the backward step normalizes the kept sum
    if rows == 0 || d == 0 || (drop.is_some() && rp.is_none()) {
        return Err((x, residual));
    }
    let x2 = plain::<D>(xp.primitive().clone()).reshape([rows, d]);
    let r2 = rp
        .as_ref()
        .map(|p| plain::<D>(p.primitive().clone()).reshape([rows, d]));
    let g1 = plain::<1>(gp.primitive().clone());
    let b1 = bp.as_ref().map(|p| plain::<1>(p.primitive().clone()));
    // the key drawn after every check that declines (a launch that still fails, on a
    // storage-tiled tensor, leaves the caller's dropout to draw another)
    let drop = drop.map(|prob| DropoutMask::draw(prob, &x2.device()));
    let Some((y, sum)) = forward_rows(&x2, r2.as_ref(), &g1, b1.as_ref(), eps, true, drop.as_ref())
    else {
        return Err((x, residual));
    };
    let y = primitive(y.reshape(dims));
    // the backward step normalizes again what the forward step did: `x`, or the kept sum
    let (keys, drop) = drop.map(DropoutMask::into_parts).unzip();
    let state = (
        primitive(sum.unwrap_or(x2)),
        primitive(g1),
        keys.map(primitive),
    );
    let step = NormBackward::<D> {
        eps,
        dims,
        residual: rp.is_some(),
        shift: bp.is_some(),
        drop,
    };
    let mut nodes = vec![xp.node()];
    nodes.extend(rp.as_ref().map(|p| p.node()));
    nodes.push(gp.node());
    nodes.extend(bp.as_ref().map(|p| p.node()));
    let out = match <[_; 2]>::try_from(nodes) {
        Ok(two) => finish(
            step.prepare::<NoCheckpointing>(two)
                .compute_bound()
                .stateful(),
            state,
            y,
        ),
        Err(nodes) => match <[_; 3]>::try_from(nodes) {
            Ok(three) => finish(
                step.prepare::<NoCheckpointing>(three)
                    .compute_bound()
                    .stateful(),
                state,
                y,
            ),
            Err(nodes) => finish(
                step.prepare::<NoCheckpointing>(
                    <[_; 4]>::try_from(nodes).expect("x, the residual, gamma and beta"),
                )
                .compute_bound()
                .stateful(),
                state,
                y,
            ),
        },
    };
    Ok(Tensor::from_primitive::<Autodiff<Cube>>(out))
}

/// What LayerNorm's backward step keeps: its input as `[rows, d]` (with a residual, the sum
/// it normalized), γ, and with a dropout of `x` the keys its key is among.
type NormState = (CubeTensor, CubeTensor, Option<CubeTensor>);

/// The backward step of `LayerNorm(x)` or `LayerNorm(x + residual)` on an autodiff graph
/// ([`tracked`]), its parents `x`, the residual (with `residual`), γ and, with a shift, β:
/// the input's gradient and `[g x̂ | g]` from one launch ([`backward_rows`]), the input's
/// gradient going to `x` (through the dropout's mask with one) and the residual, γ's and β's
/// gradients that wide tensor's column sums ([`column_sums`], one pass for both).
#[derive(Debug)]
struct NormBackward<const D: usize> {
    eps: f64,
    dims: [usize; D],
    residual: bool,
    /// Whether β is a parent.
    shift: bool,
    /// A dropout of `x`: its key's index in the state's keys, its threshold and scale.
    drop: Option<DropoutMaskParts>,
}

impl<const D: usize, const N: usize> Backward<Cube, N> for NormBackward<D> {
    type State = NormState;

    fn backward(self, ops: Ops<Self::State, N>, grads: &mut Gradients, _: &mut Checkpointer) {
        let g = plain::<D>(grads.consume::<Cube>(&ops.node));
        let (x2, gamma) = (plain::<2>(ops.state.0), plain::<1>(ops.state.1));
        let drop = self
            .drop
            .zip(ops.state.2)
            .map(|(parts, keys)| DropoutMask::from_parts(plain::<1>(keys), parts));
        let [rows, d] = x2.dims();
        let g2 = g.reshape([rows, d]);
        let sums = |t: &Tensor<2>| {
            let cols = t.dims()[1];
            column_sums(t, t.dtype()).unwrap_or_else(|| t.clone().sum_dim(0).reshape([cols]))
        };
        // γ's and β's gradients from one pass of column sums over `[g x̂ | g]` (from the
        // kernel), or two (burn's ops); `x`'s gradient through the dropout's mask in the same
        // launch, or the dropout's own
        let (dx, dx_dropped, dgamma, dbeta) =
            match backward_rows(&x2, &gamma, &g2, self.eps, self.shift, drop.as_ref()) {
                Some((dx, wide, dx_dropped)) if self.shift => {
                    let both = sums(&wide);
                    let (dgamma, dbeta) = (both.clone().narrow(0, 0, d), both.narrow(0, d, d));
                    (dx, dx_dropped, dgamma, Some(dbeta))
                }
                Some((dx, g_xhat, dx_dropped)) => (dx, dx_dropped, sums(&g_xhat), None),
                None => {
                    let (dx, g_xhat) = backward_ops(&x2, &gamma, &g2, self.eps);
                    let dx_dropped = drop.as_ref().map(|drop| drop.apply_to(dx.clone()));
                    (dx, dx_dropped, sums(&g_xhat), self.shift.then(|| sums(&g2)))
                }
            };
        let dx = dx.reshape(self.dims);
        let mut parents = ops.parents.into_iter();
        if let Some(Some(node)) = parents.next() {
            let dx_x = dx_dropped.map_or_else(|| dx.clone(), |t| t.reshape(self.dims));
            grads.register::<Cube>(node.id, primitive(dx_x));
        }
        if self.residual
            && let Some(Some(node)) = parents.next()
        {
            grads.register::<Cube>(node.id, primitive(dx));
        }
        if let Some(Some(node)) = parents.next() {
            grads.register::<Cube>(node.id, primitive(dgamma));
        }
        if let (Some(Some(node)), Some(dbeta)) = (parents.next(), dbeta) {
            grads.register::<Cube>(node.id, primitive(dbeta));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::module::Param;
    use burn::nn::LayerNormConfig;
    use burn::tensor::{DType, Distribution, TensorData};
    use infembed_testkit::max_rel_diff;

    /// On wgpu (Mesa's software driver in CI) the one-kernel LayerNorm equals a naive f64
    /// LayerNorm on the host: widths below, at and above the cube's 128 units and not a
    /// multiple of them, rank 2 and 3, a transposed input (copied to rows first), with and
    /// without the shift, more rows than one axis of cubes holds; in f16 within f16's
    /// rounding. An autodiff tensor is handed back.
    #[test]
    fn one_kernel_layer_norm_equals_a_naive_one() {
        let Some(gpu) = crate::test_wgpu("one_kernel_layer_norm_equals_a_naive_one") else {
            return;
        };
        let _rng = crate::rng_lock();
        gpu.seed(17);
        let values = |t: Tensor<3>| t.into_data().convert::<f32>().try_to_vec::<f32>().unwrap();
        let values1 = |t: Tensor<1>| t.into_data().convert::<f32>().try_to_vec::<f32>().unwrap();
        let eps = 1e-12;
        let naive = |x: &[f32], g: &[f32], b: Option<&[f32]>, d: usize| -> Vec<f32> {
            x.chunks(d)
                .flat_map(|row| {
                    let n = d as f64;
                    let mean = row.iter().map(|&v| f64::from(v)).sum::<f64>() / n;
                    let var = row
                        .iter()
                        .map(|&v| (f64::from(v) - mean).powi(2))
                        .sum::<f64>()
                        / n;
                    let rstd = 1.0 / (var + eps).sqrt();
                    row.iter()
                        .enumerate()
                        .map(|(i, &v)| {
                            let y = (f64::from(v) - mean) * rstd * f64::from(g[i]);
                            (y + b.map_or(0.0, |b| f64::from(b[i]))) as f32
                        })
                        .collect::<Vec<f32>>()
                })
                .collect()
        };
        for (rows_a, rows_b, d) in [(3, 5, 384), (2, 7, 100), (1, 4, 300), (2, 3, 1)] {
            for shift in [true, false] {
                let mut module = LayerNormConfig::new(d)
                    .with_epsilon(eps)
                    .with_bias(shift)
                    .init(&gpu);
                module.gamma = module
                    .gamma
                    .map(|g| g + Tensor::<1>::random([d], Distribution::Normal(0.0, 0.5), &gpu));
                module.beta = module.beta.map(|b| {
                    b.map(|b| b + Tensor::<1>::random([d], Distribution::Normal(0.0, 0.5), &gpu))
                });
                let g = values1(module.gamma.val());
                let b = module.beta.as_ref().map(|b| values1(b.val()));
                let x =
                    Tensor::<3>::random([rows_a, rows_b, d], Distribution::Normal(1.5, 2.0), &gpu);
                // the same values stored `[rows_b, rows_a, d]`, read through swapped dims
                let host = values(x.clone());
                let mut stored = vec![0f32; host.len()];
                for (r, row) in host.chunks(d).enumerate() {
                    let (i, j) = (r / rows_b, r % rows_b);
                    let at = (j * rows_a + i) * d;
                    stored[at..at + d].copy_from_slice(row);
                }
                let strided =
                    Tensor::<3>::from_data(TensorData::new(stored, [rows_b, rows_a, d]), &gpu)
                        .swap_dims(0, 1);
                let expected = naive(&host, &g, b.as_deref(), d);
                for (what, input) in [("contiguous", x.clone()), ("strided", strided)] {
                    let got = try_layer_norm(&module, eps, input).expect("a plain wgpu tensor");
                    let diff = max_rel_diff(&expected, &values(got));
                    assert!(
                        diff < 1e-5,
                        "[{rows_a}, {rows_b}, {d}] {what} shift {shift}: {diff}"
                    );
                }
                let flat = x.clone().reshape([rows_a * rows_b, d]);
                let got = try_layer_norm(&module, eps, flat).expect("rank 2");
                let got = got.reshape([rows_a, rows_b, d]);
                assert!(max_rel_diff(&expected, &values(got)) < 1e-5, "rank 2");

                let half = |t: Tensor<1>| t.cast(DType::F16);
                let mut module16 = module.clone();
                module16.gamma = module16.gamma.map(half);
                module16.beta = module16.beta.map(|b| b.map(half));
                let x16 = x.clone().cast(DType::F16);
                let exact = naive(
                    &values(x16.clone()),
                    &values1(module16.gamma.val()),
                    module16.beta.as_ref().map(|b| values1(b.val())).as_deref(),
                    d,
                );
                let got = try_layer_norm(&module16, eps, x16).expect("an f16 tensor");
                let diff = max_rel_diff(&exact, &values(got));
                assert!(diff < 1e-2, "f16 [{rows_a}, {rows_b}, {d}]: {diff}");
            }
        }
        // more rows than one axis of cubes takes (65,535): the second axis, whose last cubes
        // fall past the last row (16 wide: among 70,001 rows of 3 random values some are
        // nearly constant, and normalizing those magnifies f32's rounding past 1e-5)
        let (rows, d) = (70_001, 16);
        let module = LayerNormConfig::new(d).with_epsilon(eps).init(&gpu);
        let x = Tensor::<3>::random([1, rows, d], Distribution::Normal(0.0, 1.0), &gpu);
        let expected = naive(&values(x.clone()), &[1.0; 16], Some(&[0.0; 16]), d);
        let got = try_layer_norm(&module, eps, x).expect("a plain wgpu tensor");
        let diff = max_rel_diff(&expected, &values(got));
        assert!(diff < 1e-5, "{rows} rows: {diff}");
    }

    /// LayerNorm of a sum, the addition in the LayerNorm's launch, on wgpu: at inference
    /// burn's LayerNorm of burn's sum (a strided residual too); on an autodiff graph also
    /// burn's gradients for the input, the residual, γ and β, and the input's when the
    /// residual takes none; with and without the shift, widths below, at and above the cube's
    /// units. A residual of another shape is handed back.
    #[test]
    fn add_layer_norm_equals_burns_forward_and_backward() {
        let Some(gpu) = crate::test_wgpu("add_layer_norm_equals_burns_forward_and_backward") else {
            return;
        };
        let _rng = crate::rng_lock();
        gpu.seed(43);
        let ad = gpu.clone().autodiff();
        let values = |t: Tensor<3>| t.into_data().convert::<f32>().try_to_vec::<f32>().unwrap();
        let values1 = |t: Tensor<1>| t.into_data().convert::<f32>().try_to_vec::<f32>().unwrap();
        let eps = 1e-12;
        for (a, b, d) in [(3, 70, 48), (2, 5, 384), (1, 3, 300)] {
            for shift in [true, false] {
                let what = format!("[{a}, {b}, {d}] shift {shift}");
                let random = |mean: f64, device: &Device| {
                    Tensor::<1>::random([d], Distribution::Normal(mean, 0.5), device)
                };
                let mut plain_module = LayerNormConfig::new(d)
                    .with_epsilon(eps)
                    .with_bias(shift)
                    .init(&gpu);
                plain_module.gamma = Param::from_tensor(random(1.0, &gpu));
                plain_module.beta = plain_module
                    .beta
                    .map(|_| Param::from_tensor(random(0.0, &gpu)));
                let x = Tensor::<3>::random([a, b, d], Distribution::Normal(1.5, 2.0), &gpu);
                let r = Tensor::<3>::random([b, a, d], Distribution::Normal(-0.5, 1.0), &gpu);
                // at inference, contiguous and strided residuals
                let r_strided = r.clone().swap_dims(0, 1);
                let r_rows = Tensor::<3>::from_data(r_strided.to_data(), &gpu);
                for (how, res) in [("contiguous", r_rows), ("strided", r_strided)] {
                    let expected = plain_module.forward(x.clone() + res.clone());
                    let got = try_add_layer_norm(&plain_module, eps, x.clone(), res)
                        .expect("plain wgpu tensors");
                    let diff = max_rel_diff(&values(expected), &values(got));
                    assert!(diff < 1e-5, "{what} {how} residual: {diff}");
                }
                // on an autodiff graph
                let mut module = LayerNormConfig::new(d)
                    .with_epsilon(eps)
                    .with_bias(shift)
                    .init(&ad);
                module.gamma = Param::from_tensor(random(1.0, &ad));
                module.beta = module.beta.map(|_| Param::from_tensor(random(0.0, &ad)));
                let w = Tensor::<3>::random([a, b, d], Distribution::Normal(0.0, 1.0), &ad);
                for residual_grad in [true, false] {
                    let run = |ours: bool| {
                        let x = Tensor::<3>::from_data(x.to_data(), &ad).require_grad();
                        let r = Tensor::<3>::from_data(r.to_data(), &ad);
                        let r = if residual_grad { r.require_grad() } else { r };
                        let res = r.clone().swap_dims(0, 1);
                        let y = if ours {
                            try_add_layer_norm(&module, eps, x.clone(), res)
                                .expect("a wgpu autodiff graph")
                        } else {
                            module.forward(x.clone() + res)
                        };
                        let grads = (y.clone() * w.clone()).sum().backward();
                        (
                            values(y),
                            values(x.grad(&grads).unwrap()),
                            r.grad(&grads).map(values),
                            values1(module.gamma.grad(&grads).unwrap()),
                            module
                                .beta
                                .as_ref()
                                .map(|p| values1(p.grad(&grads).unwrap())),
                        )
                    };
                    let (burn, ours) = (run(false), run(true));
                    let what = format!("{what} residual grad {residual_grad}");
                    assert!(max_rel_diff(&burn.0, &ours.0) < 1e-5, "{what}: values");
                    assert!(max_rel_diff(&burn.1, &ours.1) < 1e-4, "{what}: dx");
                    assert_eq!(burn.2.is_some(), residual_grad, "{what}");
                    assert_eq!(ours.2.is_some(), residual_grad, "{what}: dr");
                    if let (Some(br), Some(or)) = (&burn.2, &ours.2) {
                        assert!(max_rel_diff(br, or) < 1e-4, "{what}: dr");
                    }
                    assert!(max_rel_diff(&burn.3, &ours.3) < 1e-4, "{what}: dgamma");
                    if let (Some(bb), Some(ob)) = (&burn.4, &ours.4) {
                        assert!(max_rel_diff(bb, ob) < 1e-5, "{what}: dbeta");
                    }
                }
            }
        }
        // rank 2, where the kernel reads each operand by its own strides (no copy first): a
        // transposed residual beside a contiguous input, and the other way round, plain and
        // on an autodiff graph
        let (rows, d) = (37, 200);
        let gamma = Tensor::<1>::random([d], Distribution::Normal(1.0, 0.5), &gpu);
        let on = |device: &Device| {
            let mut m = LayerNormConfig::new(d).with_epsilon(eps).init(device);
            m.gamma = Param::from_tensor(Tensor::from_data(gamma.to_data(), device));
            m
        };
        let (plain_module, module) = (on(&gpu), on(&ad));
        let rows_of = |t: Tensor<2>| t.into_data().convert::<f32>().try_to_vec::<f32>().unwrap();
        let contiguous = Tensor::<2>::random([rows, d], Distribution::Normal(1.0, 1.0), &gpu);
        let stored = Tensor::<2>::random([d, rows], Distribution::Normal(0.0, 2.0), &gpu);
        let w = Tensor::<2>::random([rows, d], Distribution::Normal(0.0, 1.0), &ad);
        for transposed_residual in [true, false] {
            let what = format!("rank 2, transposed residual {transposed_residual}");
            let operands = |c: Tensor<2>, t: Tensor<2>| {
                if transposed_residual {
                    (c, t.transpose())
                } else {
                    (t.transpose(), c)
                }
            };
            let (x, r) = operands(contiguous.clone(), stored.clone());
            let expected = rows_of(plain_module.forward(x.clone() + r.clone()));
            let got = try_add_layer_norm(&plain_module, eps, x, r).expect("plain wgpu tensors");
            assert!(
                max_rel_diff(&expected, &rows_of(got)) < 1e-5,
                "{what}: plain"
            );
            let run = |ours: bool| {
                let c = Tensor::<2>::from_data(contiguous.to_data(), &ad).require_grad();
                let t = Tensor::<2>::from_data(stored.to_data(), &ad).require_grad();
                let (x, r) = operands(c.clone(), t.clone());
                let y = if ours {
                    try_add_layer_norm(&module, eps, x, r).expect("a wgpu autodiff graph")
                } else {
                    module.forward(x + r)
                };
                let grads = (y.clone() * w.clone()).sum().backward();
                let (gc, gt) = (c.grad(&grads).unwrap(), t.grad(&grads).unwrap());
                (rows_of(y), rows_of(gc), rows_of(gt))
            };
            let (burn, ours) = (run(false), run(true));
            assert!(max_rel_diff(&burn.0, &ours.0) < 1e-5, "{what}: values");
            assert!(
                max_rel_diff(&burn.1, &ours.1) < 1e-4,
                "{what}: contiguous's grad"
            );
            assert!(
                max_rel_diff(&burn.2, &ours.2) < 1e-4,
                "{what}: transposed's grad"
            );
        }
        let module = LayerNormConfig::new(8).init(&gpu);
        let x = Tensor::<2>::zeros([3, 8], &gpu);
        let wide = Tensor::<2>::zeros([3, 9], &gpu);
        assert!(
            try_add_layer_norm(&module, 1e-5, x, wide).is_err(),
            "a wider residual"
        );
    }

    /// On a wgpu autodiff graph, LayerNorm through its kernels (the forward launch, the
    /// backward launch, the column sums) gives burn's LayerNorm and burn's gradients for the
    /// input, γ and β: widths below, at and above the cube's 128 units, with and without the
    /// shift, a transposed input, ranks 2 and 3, an input without a gradient of its own. The
    /// backward step spelled out in burn's ops (for tensors the kernel does not take) gives
    /// the kernel's values.
    #[test]
    fn tracked_layer_norm_equals_burns_forward_and_backward() {
        let Some(gpu) = crate::test_wgpu("tracked_layer_norm_equals_burns_forward_and_backward")
        else {
            return;
        };
        let _rng = crate::rng_lock();
        gpu.seed(31);
        let ad = gpu.clone().autodiff();
        let values = |t: Tensor<3>| t.into_data().convert::<f32>().try_to_vec::<f32>().unwrap();
        let values1 = |t: Tensor<1>| t.into_data().convert::<f32>().try_to_vec::<f32>().unwrap();
        let eps = 1e-12;
        for (a, b, d) in [(3, 70, 48), (2, 5, 384), (1, 3, 300), (2, 2, 1)] {
            for shift in [true, false] {
                let mut module = LayerNormConfig::new(d)
                    .with_epsilon(eps)
                    .with_bias(shift)
                    .init(&ad);
                // parameters of their own (leaves of the graph), not ones and zeros
                let leaf = |mean: f64| {
                    Param::from_tensor(Tensor::<1>::random(
                        [d],
                        Distribution::Normal(mean, 0.5),
                        &ad,
                    ))
                };
                module.gamma = leaf(1.0);
                module.beta = module.beta.map(|_| leaf(0.0));
                let x0 = Tensor::<3>::random([b, a, d], Distribution::Normal(1.5, 2.0), &gpu);
                let w = Tensor::<3>::random([a, b, d], Distribution::Normal(0.0, 1.0), &ad);
                for transposed in [false, true] {
                    let run = |ours: bool| {
                        let x = Tensor::<3>::from_data(x0.to_data(), &ad).require_grad();
                        let input = if transposed {
                            x.clone().swap_dims(0, 1)
                        } else {
                            x.clone().swap_dims(0, 1).reshape([a, b, d])
                        };
                        let y = if ours {
                            try_layer_norm(&module, eps, input).expect("a wgpu autodiff graph")
                        } else {
                            module.forward(input)
                        };
                        let grads = (y.clone() * w.clone()).sum().backward();
                        let gx = x.grad(&grads).unwrap();
                        let gg = module.gamma.grad(&grads).unwrap();
                        let gb = module
                            .beta
                            .as_ref()
                            .map(|p| values1(p.grad(&grads).unwrap()));
                        (values(y), values(gx), values1(gg), gb)
                    };
                    let (burn, ours) = (run(false), run(true));
                    let what = format!("[{a}, {b}, {d}] shift {shift} transposed {transposed}");
                    assert!(max_rel_diff(&burn.0, &ours.0) < 1e-5, "{what}: values");
                    // a width of one normalizes to zero: burn's x gradient is rounding there
                    if d > 1 {
                        let diff = max_rel_diff(&burn.1, &ours.1);
                        assert!(diff < 1e-4, "{what}: dx {diff}");
                    }
                    let diff = max_rel_diff(&burn.2, &ours.2);
                    assert!(diff < 1e-4, "{what}: dgamma {diff}");
                    assert_eq!(burn.3.is_some(), ours.3.is_some(), "{what}: beta");
                    if let (Some(bb), Some(ob)) = (&burn.3, &ours.3) {
                        assert!(max_rel_diff(bb, ob) < 1e-5, "{what}: dbeta");
                    }
                }
                // a rank-2 input with no gradient of its own: the parameters still get theirs
                let x = Tensor::<3>::from_data(x0.to_data(), &ad).reshape([a * b, d]);
                let y = try_layer_norm(&module, eps, x.clone()).expect("rank 2");
                let expected = module.forward(x);
                let (ours, burn) = (y.sum().backward(), expected.sum().backward());
                let (og, bg) = (
                    values1(module.gamma.grad(&ours).unwrap()),
                    values1(module.gamma.grad(&burn).unwrap()),
                );
                assert!(max_rel_diff(&bg, &og) < 1e-4, "rank 2 dgamma");
            }
        }
        // more rows than one axis of cubes holds (65,535), forward and backward
        let (rows, d) = (70_001, 16);
        let module = LayerNormConfig::new(d).with_epsilon(eps).init(&ad);
        let x0 = Tensor::<2>::random([rows, d], Distribution::Normal(0.0, 1.0), &gpu);
        let w = Tensor::<2>::random([rows, d], Distribution::Normal(0.0, 1.0), &ad);
        let flat = |t: Tensor<2>| t.into_data().convert::<f32>().try_to_vec::<f32>().unwrap();
        let run = |ours: bool| {
            let x = Tensor::<2>::from_data(x0.to_data(), &ad).require_grad();
            let y = if ours {
                try_layer_norm(&module, eps, x.clone()).expect("autodiff")
            } else {
                module.forward(x.clone())
            };
            let grads = (y * w.clone()).sum().backward();
            (
                flat(x.grad(&grads).unwrap()),
                values1(module.gamma.grad(&grads).unwrap()),
            )
        };
        let (burn, ours) = (run(false), run(true));
        assert!(max_rel_diff(&burn.0, &ours.0) < 1e-4, "{rows} rows: dx");
        assert!(max_rel_diff(&burn.1, &ours.1) < 1e-4, "{rows} rows: dgamma");

        // the backward step in burn's ops equals the backward kernel
        let (rows, d) = (37, 200);
        let x = Tensor::<2>::random([rows, d], Distribution::Normal(0.5, 1.5), &gpu);
        let gamma = Tensor::<1>::random([d], Distribution::Normal(1.0, 0.5), &gpu);
        let g = Tensor::<2>::random([rows, d], Distribution::Normal(0.0, 1.0), &gpu);
        let (dx, wide, none) =
            backward_rows(&x, &gamma, &g, 1e-5, true, None).expect("plain wgpu tensors");
        assert!(none.is_none(), "no dropout, no masked gradient");
        assert_eq!(wide.dims(), [rows, 2 * d]);
        let (gx, g_copy) = (
            wide.clone().slice([0..rows, 0..d]),
            wide.slice([0..rows, d..2 * d]),
        );
        assert_eq!(flat(g_copy), flat(g.clone()), "the copy of g beside g x̂");
        let (dx_ops, gx_ops) = backward_ops(&x, &gamma, &g, 1e-5);
        assert!(
            max_rel_diff(&flat(dx_ops), &flat(dx)) < 1e-4,
            "dx in burn's ops"
        );
        assert!(
            max_rel_diff(&flat(gx_ops), &flat(gx)) < 1e-5,
            "g x̂ in burn's ops"
        );
    }

    /// On a wgpu autodiff graph (Mesa's software driver in CI), LayerNorm(dropout(x) + r) with
    /// the dropout inside the LayerNorm's launches ([`try_dropout_add_layer_norm`], which
    /// [`super::super::dropout_add_layer_norm`] takes in training mode) equals the dropout's own launch then the LayerNorm under the same seed:
    /// values and the gradients of `x`, the residual (contiguous and strided), γ and β, to the
    /// bit. The dropout did drop (zeros in `x`'s gradient, none in the residual's), and
    /// another seed gives other values.
    #[test]
    fn a_dropout_inside_the_layer_norm_equals_its_own_launch_first() {
        let Some(gpu) =
            crate::test_wgpu("a_dropout_inside_the_layer_norm_equals_its_own_launch_first")
        else {
            return;
        };
        let _rng = crate::rng_lock();
        let ad = gpu.clone().autodiff();
        let values = |t: Tensor<3>| t.into_data().convert::<f32>().try_to_vec::<f32>().unwrap();
        let values1 = |t: Tensor<1>| t.into_data().convert::<f32>().try_to_vec::<f32>().unwrap();
        let (eps, p) = (1e-12, 0.1);
        let dropout_module = burn::nn::DropoutConfig::new(p).init();
        for (a, b, d) in [(3, 70, 48), (2, 5, 384)] {
            ad.seed(5);
            let mut module = LayerNormConfig::new(d).with_epsilon(eps).init(&ad);
            let random = |mean: f64| Tensor::<1>::random([d], Distribution::Normal(mean, 0.5), &ad);
            module.gamma = Param::from_tensor(random(1.0));
            module.beta = module.beta.map(|_| Param::from_tensor(random(0.0)));
            let x0 = Tensor::<3>::random([a, b, d], Distribution::Normal(1.5, 2.0), &gpu);
            let r0 = Tensor::<3>::random([b, a, d], Distribution::Normal(-0.5, 1.0), &gpu);
            let w = Tensor::<3>::random([a, b, d], Distribution::Normal(0.0, 1.0), &ad);
            for strided in [false, true] {
                let run = |fused: bool, seed: u64| {
                    let x = Tensor::<3>::from_data(x0.to_data(), &ad).require_grad();
                    let r = Tensor::<3>::from_data(r0.to_data(), &ad).require_grad();
                    let res = if strided {
                        r.clone().swap_dims(0, 1)
                    } else {
                        r.clone().reshape([a, b, d])
                    };
                    ad.seed(seed);
                    let y = if fused {
                        assert_eq!(
                            super::super::fused_dropout_prob(&dropout_module, &ad),
                            Some(p),
                            "ops::dropout_add_layer_norm takes this path"
                        );
                        try_dropout_add_layer_norm(&module, eps, x.clone(), res, p)
                            .expect("a wgpu autodiff graph")
                    } else {
                        let dropped = super::super::dropout(&dropout_module, x.clone());
                        try_add_layer_norm(&module, eps, dropped, res).expect("a wgpu graph")
                    };
                    let grads = (y.clone() * w.clone()).sum().backward();
                    (
                        values(y),
                        values(x.grad(&grads).unwrap()),
                        values(r.grad(&grads).unwrap().reshape([a, b, d])),
                        values1(module.gamma.grad(&grads).unwrap()),
                        values1(module.beta.as_ref().unwrap().grad(&grads).unwrap()),
                    )
                };
                let what = format!("[{a}, {b}, {d}] strided residual {strided}");
                let (own, inside) = (run(false, 9), run(true, 9));
                assert_eq!(own.0, inside.0, "{what}: values");
                assert_eq!(own.1, inside.1, "{what}: x's gradient");
                assert_eq!(own.2, inside.2, "{what}: the residual's gradient");
                assert_eq!(own.3, inside.3, "{what}: γ's gradient");
                assert_eq!(own.4, inside.4, "{what}: β's gradient");
                let zeros = |v: &[f32]| v.iter().filter(|&&g| g == 0.0).count();
                assert!(zeros(&inside.1) > 0, "{what}: the dropout dropped");
                assert_eq!(zeros(&inside.2), 0, "{what}: the residual is not dropped");
                assert_ne!(
                    run(true, 10).0,
                    inside.0,
                    "{what}: another seed, another mask"
                );
            }
        }
    }
}
