//! What this project's cubecl kernels share ([`super::cube_norm`], [`super::cube_sum`],
//! [`super::cube_gelu`], [`super::cube_softmax`]): the primitives of plain tensors, the cube
//! counts of row-per-cube and element-wise launches, the tree that folds a cube's values, and
//! the end of an autodiff operation.

use burn::backend::autodiff::checkpoint::strategy::NoCheckpointing;
use burn::backend::autodiff::ops::{Backward, OpsKind};
use burn::backend::{Autodiff, BackendTypes, Cube};
use burn::prelude::*;
use cubecl::CubeCount;

use super::routed::CubeTensor;

/// The most cubes along one axis of a launch (wgpu's limit); more go on a second axis.
pub(super) const MAX_CUBES_X: usize = 65_535;

/// The cubecl primitive of a plain tensor, unless it is not one or is stored tiled.
pub(super) fn cube<const D: usize>(t: &Tensor<D>) -> Option<CubeTensor> {
    t.clone()
        .try_into_primitive::<Cube>()
        .ok()
        .filter(|p| !p.meta.is_tiled())
}

/// A plain cubecl primitive as a tensor.
pub(super) fn plain<const D: usize>(t: CubeTensor) -> Tensor<D> {
    Tensor::from_primitive::<Cube>(t)
}

/// A tensor made from cubecl ones back to its primitive.
pub(super) fn primitive<const D: usize>(t: Tensor<D>) -> CubeTensor {
    t.try_into_primitive::<Cube>()
        .expect("made from cubecl tensors")
}

/// The cubes of a launch of `cubes` cubes (at least one), on two axes past wgpu's limit on
/// one: a kernel finds its cube's index as `CUBE_POS_Y * CUBE_COUNT_X + CUBE_POS_X`, and the
/// last cubes of the second axis fall past the end.
pub(super) fn cube_count(cubes: usize) -> Option<CubeCount> {
    let x = cubes.clamp(1, MAX_CUBES_X);
    Some(CubeCount::Static(
        u32::try_from(x).ok()?,
        u32::try_from(cubes.div_ceil(x).max(1)).ok()?,
        1,
    ))
}

/// The tensor of an autodiff operation `step` has prepared: `out`, with `state` kept for the
/// backward step when the graph tracks it.
pub(super) fn finish<BO, const N: usize>(
    kind: OpsKind<BO, Cube, BO::State, NoCheckpointing, N>,
    state: BO::State,
    out: CubeTensor,
) -> <Autodiff<Cube> as BackendTypes>::FloatTensorPrimitive
where
    BO: Backward<Cube, N>,
{
    match kind {
        OpsKind::Tracked(prep) => prep.finish(state, out),
        OpsKind::UnTracked(prep) => prep.finish(out),
    }
}

pub(super) mod kernel {
    use cubecl::prelude::*;

    /// The unit's index among all of a launch's units, `units` a cube, the cubes laid out by
    /// [`super::cube_count`] (on a second axis past wgpu's limit on one): for the kernels that
    /// give each unit one element or one (row, column) pair.
    #[cube]
    pub(in crate::ops) fn flat_unit(#[comptime] units: usize) -> usize {
        (CUBE_POS_Y * CUBE_COUNT_X + CUBE_POS_X) as usize * units + UNIT_POS as usize
    }

    /// The standard normal distribution function `Φ(z) = (1 + erf(z / sqrt 2)) / 2`: exact
    /// (erf) GELU is `z Φ(z)` (the bias + GELU kernel, the blocked product's epilogue).
    #[cube]
    pub(in crate::ops) fn normal_cdf(z: f32) -> f32 {
        0.5f32 * (1.0f32 + Erf::erf(z * std::f32::consts::FRAC_1_SQRT_2))
    }

    /// The sum (with `max`, the maximum) over the cube of each unit's `value`, through a tree
    /// in `partial` (`units` slots, a power of two), its levels unrolled (cubecl 0.11's IR
    /// verification refused the same tree as a runtime loop around the barrier); every unit
    /// gets it.
    #[cube]
    pub(in crate::ops) fn cube_fold(
        partial: &mut Shared<[f32]>,
        value: f32,
        unit: usize,
        #[comptime] units: usize,
        #[comptime] max: bool,
    ) -> f32 {
        partial[unit] = value;
        sync_cube();
        #[unroll]
        for level in 1..units.trailing_zeros() + 1 {
            let half = comptime!(units) >> level;
            if unit < half {
                if max {
                    partial[unit] = f32::max(partial[unit], partial[unit + half]);
                } else {
                    partial[unit] += partial[unit + half];
                }
            }
            sync_cube();
        }
        let total = partial[0];
        sync_cube();
        total
    }
}
