//! LayerNorm as one kernel on the cubecl devices (`wgpu`, `vulkan`, `cuda`; not a `fusion`
//! build), at inference.
//!
//! burn 0.22 spells LayerNorm out on these backends (`float_mean_dim`, a subtraction, a
//! product, a second `float_mean_dim`, a scalar addition, a square root, a division, the
//! scale and the shift): nine kernel launches, each reading and writing the whole `[T, d]`
//! tensor. [`try_layer_norm`] computes the same function with one launch, one cube per row:
//! the units sum the row (the mean), then the squares of its deviations (the variance, two
//! passes as burn's), in f32 whatever the tensor's float type, through a tree in shared memory,
//! and write `(x - mean) / sqrt(var + eps) γ + β`. An autodiff graph keeps burn's ops (their
//! backward steps), as do other backends.

use burn::nn::LayerNorm;
use burn::prelude::*;
use cubecl::ir::ElemType;
use cubecl::{CubeCount, CubeDim};

use super::routed::{CubeTensor, float_kind};

/// Units of a cube (a power of two: the tree halves it).
const UNITS: usize = 128;

/// The most cubes along one axis of a launch (wgpu's limit); more rows go on a second axis.
const MAX_CUBES_X: usize = 65_535;

mod kernel {
    use cubecl::prelude::*;

    /// The sum over the cube of each unit's `value`, through a tree in `partial` (`units`
    /// slots, a power of two), its levels unrolled (cubecl 0.11's IR verification refused the
    /// same tree as a runtime loop around the barrier); every unit gets it.
    #[cube]
    fn cube_sum(
        partial: &mut Shared<[f32]>,
        value: f32,
        unit: usize,
        #[comptime] units: usize,
    ) -> f32 {
        partial[unit] = value;
        sync_cube();
        #[unroll]
        for level in 1..units.trailing_zeros() + 1 {
            let half = comptime!(units) >> level;
            if unit < half {
                partial[unit] += partial[unit + half];
            }
            sync_cube();
        }
        let total = partial[0];
        sync_cube();
        total
    }

    /// One row of `out = LayerNorm(x)` per cube (module docs): `x` and `out` `[rows, d]` with
    /// any strides, `gamma` and `beta` `[d]`, at least one row.
    #[allow(clippy::too_many_arguments)]
    #[cube(launch)]
    pub(super) fn layer_norm_rows<F: Float>(
        x: &Tensor<F>,
        gamma: &Tensor<F>,
        beta: &Tensor<F>,
        out: &mut Tensor<F>,
        rows: usize,
        epsilon: f32,
        #[comptime] units: usize,
        #[comptime] shift: bool,
        #[define(F)] _dtype: ElemType,
    ) {
        // a cube past the last row (the second axis's last cubes) computes the last row
        // again and writes nothing: its barriers stay in uniform control flow
        let cube = (CUBE_POS_Y * CUBE_COUNT_X + CUBE_POS_X) as usize;
        let row = select(cube < rows, cube, rows - 1);
        let d = x.shape(1);
        let (x_base, out_base) = (row * x.stride(0), row * out.stride(0));
        let (x_step, out_step) = (x.stride(1), out.stride(1));
        let (gamma_step, beta_step) = (gamma.stride(0), beta.stride(0));
        let unit = UNIT_POS as usize;
        let mut partial = Shared::<[f32]>::new_slice(units);
        let width = f32::cast_from(d);

        let mut sum = 0.0f32;
        let mut i = unit;
        while i < d {
            sum += f32::cast_from(x[x_base + i * x_step]);
            i += units;
        }
        let mean = cube_sum(&mut partial, sum, unit, units) / width;

        let mut squares = 0.0f32;
        i = unit;
        while i < d {
            let centered = f32::cast_from(x[x_base + i * x_step]) - mean;
            squares += centered * centered;
            i += units;
        }
        let variance = cube_sum(&mut partial, squares, unit, units) / width;
        let rstd = 1.0f32 / f32::sqrt(variance + epsilon);

        if cube < rows {
            i = unit;
            while i < d {
                let centered = f32::cast_from(x[x_base + i * x_step]) - mean;
                let mut y = centered * rstd * f32::cast_from(gamma[i * gamma_step]);
                if shift {
                    y += f32::cast_from(beta[i * beta_step]);
                }
                out[out_base + i * out_step] = F::cast_from(y);
                i += units;
            }
        }
    }
}

/// `module.forward(x)` as one kernel launch, with `eps` the module's epsilon, when `x` and the
/// parameters (`[d]` each) are plain (not autodiff) float tensors of one type on one cubecl
/// device; anything else is handed back as `Err(x)`.
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
    let Some(kind) = float_kind(x.dtype()) else {
        return Err(x);
    };
    let gamma = module.gamma.val();
    let beta = module.beta.as_ref().map(|b| b.val());
    let dims = x.dims();
    let d = dims[D - 1];
    let device = x.device();
    let unlike = |p: &Tensor<1>| p.dims() != [d] || p.dtype() != x.dtype() || p.device() != device;
    if device.is_autodiff() || unlike(&gamma) || beta.as_ref().is_some_and(unlike) {
        return Err(x); // burn's ops compute it, or name the mismatch
    }
    let cube2 = |t: &Tensor<2>| t.clone().try_into_primitive::<burn::backend::Cube>().ok();
    let cube1 = |t: &Tensor<1>| t.clone().try_into_primitive::<burn::backend::Cube>().ok();
    if x.clone()
        .try_into_primitive::<burn::backend::Cube>()
        .is_err()
    {
        return Err(x);
    }
    let rows: usize = dims[..D - 1].iter().product();
    if rows == 0 || d == 0 {
        return Ok(x);
    }
    // the rows as `[rows, d]` (free for the contiguous tensors LayerNorm gets; burn copies
    // others)
    let x2 = x.clone().reshape([rows, d]);
    let out = Tensor::<2>::empty([rows, d], (&x.device(), x.dtype()));
    let (Some(xp), Some(op), Some(gp), Some(bp)) = (
        cube2(&x2),
        cube2(&out),
        cube1(&gamma),
        // without a shift, gamma stands in for beta (the kernel does not read it)
        cube1(beta.as_ref().unwrap_or(&gamma)),
    ) else {
        return Err(x);
    };
    let tiled = |t: &CubeTensor| t.meta.is_tiled();
    if tiled(&xp) || tiled(&gp) || tiled(&bp) {
        return Err(x);
    }
    let count_x = rows.min(MAX_CUBES_X);
    let count_y = rows.div_ceil(count_x);
    let (Ok(cx), Ok(cy)) = (u32::try_from(count_x), u32::try_from(count_y)) else {
        return Err(x);
    };
    let client = op.client.clone();
    kernel::layer_norm_rows::launch(
        &client,
        CubeCount::Static(cx, cy, 1),
        CubeDim::new_1d(UNITS as u32),
        xp.into_tensor_arg(),
        gp.into_tensor_arg(),
        bp.into_tensor_arg(),
        op.into_tensor_arg(),
        rows,
        eps as f32,
        UNITS,
        beta.is_some(),
        ElemType::Float(kind),
    );
    Ok(out.reshape(dims))
}

#[cfg(test)]
mod tests {
    use super::*;
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

        let module = LayerNormConfig::new(8).init(&gpu.clone().autodiff());
        let x = Tensor::<2>::random([2, 8], Distribution::Normal(0.0, 1.0), &gpu.autodiff());
        assert!(
            try_layer_norm(&module, 1e-5, x).is_err(),
            "autodiff keeps burn's ops"
        );
    }
}
