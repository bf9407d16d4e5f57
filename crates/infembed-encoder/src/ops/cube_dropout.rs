//! Dropout in training as one kernel on the cubecl devices (`wgpu`, `vulkan`, `cuda`; not a
//! `fusion` build), its backward step one launch of the same kernel.
//!
//! burn 0.22's dropout draws a Bernoulli mask as large as the input, multiplies, scales, and
//! keeps the mask for its backward step, which multiplies and scales again: five launches and
//! a stored mask per dropout (a BERT layer has three). [`try_dropout`] draws only four uniform
//! numbers from burn's generator of the device (so `device.seed` governs the masks, as it
//! governs burn's), left on the device as the kernel's key: element `i` is kept when a 32-bit
//! hash of `i` and the key falls below `keep · 2³²`, and scaled by `1 / keep`. The backward
//! step applies the same mask to the gradient from the same key, so no mask is stored. A
//! dropped element is 0 even where it is NaN or infinite (burn's product would give NaN
//! there), as in the CPU's dropout kernel.

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::NoCheckpointing;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops};
use burn::backend::{Autodiff, Cube};
use burn::prelude::*;
use burn::tensor::{DType, Distribution};
use cubecl::CubeDim;
use cubecl::ir::ElemType;

use super::cube_kit::{cube, cube_count, finish, plain, primitive};
use super::routed::{CubeTensor, float_kind};
use crate::cpu::elementwise::dropout_threshold_and_scale;

/// Units of a cube.
const UNITS: usize = 256;

mod kernel {
    use cubecl::prelude::*;

    use crate::ops::cube_kit::kernel::flat_unit;

    /// A bijective mix of 32 bits (two multiply-xorshift rounds).
    #[cube]
    fn mix(h: u32) -> u32 {
        let h = (h ^ (h >> 16)) * 0x7feb_352d_u32;
        let h = (h ^ (h >> 15)) * 0x846c_a68b_u32;
        h ^ (h >> 16)
    }

    /// 16 bits of a uniform number in `[0, 1)`.
    #[cube]
    fn bits(v: f32) -> u32 {
        u32::cast_from(v * 65_536.0f32) & 0xffff_u32
    }

    /// 32 bits of a key (four uniform numbers in `[0, 1)`, 16 bits each) and an index.
    #[cube]
    pub(super) fn hash(key: &Tensor<f32>, i: u32) -> u32 {
        let k0 = (bits(key[0]) << 16) | bits(key[1]);
        let k1 = (bits(key[2]) << 16) | bits(key[3]);
        mix(mix(i ^ k0) + k1)
    }

    /// `out_i = x_i / keep` where element `i`'s hash falls below `threshold` (`keep · 2³²`),
    /// else 0: `x` and `out` `[n]` with any stride, `key` four uniform numbers.
    #[allow(clippy::too_many_arguments)]
    #[cube(launch)]
    pub(super) fn dropout_apply<F: Float>(
        x: &Tensor<F>,
        key: &Tensor<f32>,
        out: &mut Tensor<F>,
        n: usize,
        threshold: u32,
        scale: f32,
        #[comptime] units: usize,
        #[define(F)] _dtype: ElemType,
    ) {
        let i = flat_unit(units);
        if i < n {
            let kept = hash(key, u32::cast_from(i)) < threshold;
            let v = f32::cast_from(x[i * x.stride(0)]);
            let at = i * out.stride(0);
            out[at] = F::cast_from(select(kept, v * scale, 0.0f32));
        }
    }
}

/// `x` with the mask of `key` applied (`[n]`), as one launch (`None` when a tensor is not a
/// cubecl one or is stored tiled).
fn apply(x: &Tensor<1>, key: &Tensor<1>, threshold: u32, scale: f32) -> Option<Tensor<1>> {
    let [n] = x.dims();
    let (xp, kp) = (cube(x)?, cube(key)?);
    let out = Tensor::<1>::empty([n], (&x.device(), x.dtype()));
    if n == 0 {
        return Some(out);
    }
    let op = cube(&out)?;
    let client = op.client.clone();
    kernel::dropout_apply::launch(
        &client,
        cube_count(n.div_ceil(UNITS))?,
        CubeDim::new_1d(UNITS as u32),
        xp.into_tensor_arg(),
        kp.into_tensor_arg(),
        op.into_tensor_arg(),
        n,
        threshold,
        scale,
        UNITS,
        ElemType::Float(float_kind(x.dtype())?),
    );
    Some(out)
}

/// An active dropout (training mode, `0 < prob < 1`: [`super::dropout`] decides that) of `x`
/// on an autodiff graph of cubecl tensors (without checkpointing), as one launch with a
/// backward step of one launch ([`DropoutBackward`]); anything else is handed back as
/// `Err(x)`.
///
/// # Shapes
/// - `x`: any
/// - output: like `x`
#[allow(clippy::result_large_err)]
pub(crate) fn try_dropout<const D: usize>(x: Tensor<D>, prob: f64) -> Result<Tensor<D>, Tensor<D>> {
    if float_kind(x.dtype()).is_none() || !(prob > 0.0 && prob < 1.0) {
        return Err(x);
    }
    let Ok(xp) = x.clone().try_into_primitive::<Autodiff<Cube>>() else {
        return Err(x);
    };
    let dims = x.dims();
    let n: usize = dims.iter().product();
    let inner = plain::<D>(xp.primitive().clone()).reshape([n]);
    let key = Tensor::<1>::random([4], Distribution::Default, (&inner.device(), DType::F32));
    let (threshold, scale) = dropout_threshold_and_scale(prob);
    let Some(y) = apply(&inner, &key, threshold, scale) else {
        return Err(x);
    };
    let step = DropoutBackward {
        dims,
        threshold,
        scale,
    };
    let kind = step
        .prepare::<NoCheckpointing>([xp.node()])
        .compute_bound()
        .stateful();
    let out = finish(kind, primitive(key), primitive(y.reshape(dims)));
    Ok(Tensor::from_primitive::<Autodiff<Cube>>(out))
}

/// The backward step of [`try_dropout`]: the gradient through the same mask, from the same
/// key (the state), in one launch (burn's ops where that does not run).
#[derive(Debug)]
struct DropoutBackward<const D: usize> {
    dims: [usize; D],
    threshold: u32,
    scale: f32,
}

impl<const D: usize> Backward<Cube, 1> for DropoutBackward<D> {
    /// The key.
    type State = CubeTensor;

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let g = plain::<D>(grads.consume::<Cube>(&ops.node));
        let [parent] = ops.parents;
        let Some(node) = parent else {
            return;
        };
        let key = plain::<1>(ops.state);
        let n: usize = self.dims.iter().product();
        let g = g.reshape([n]);
        // a float gradient of a cubecl tensor, flattened (which untiles it): the kernel takes it
        let dx = apply(&g, &key, self.threshold, self.scale)
            .expect("the gradient of a cubecl float tensor is a cubecl float tensor");
        grads.register::<Cube>(node.id, primitive(dx.reshape(self.dims)));
    }
}

/// The mask times the scale of [`kernel::hash`]'s key for `n` elements, computed on the host
/// (the tests' reference).
#[cfg(test)]
fn mask_ops(key: &Tensor<1>, n: usize, threshold: u32, scale: f32) -> Tensor<1> {
    let k: Vec<f32> = key
        .to_data()
        .convert::<f32>()
        .try_to_vec()
        .unwrap_or_default();
    let bits = |v: f32| ((v * 65_536.0) as u32) & 0xffff;
    let (k0, k1) = (bits(k[0]) << 16 | bits(k[1]), bits(k[2]) << 16 | bits(k[3]));
    let mix = |h: u32| {
        let h = (h ^ (h >> 16)).wrapping_mul(0x7feb_352d);
        let h = (h ^ (h >> 15)).wrapping_mul(0x846c_a68b);
        h ^ (h >> 16)
    };
    let factors: Vec<f32> = (0..n as u32)
        .map(|i| {
            if mix(mix(i ^ k0).wrapping_add(k1)) < threshold {
                scale
            } else {
                0.0
            }
        })
        .collect();
    Tensor::from_data(TensorData::new(factors, [n]), (&key.device(), DType::F32))
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::nn::DropoutConfig;
    use infembed_testkit::max_rel_diff;

    fn values<const D: usize>(t: Tensor<D>) -> Vec<f32> {
        t.into_data().convert::<f32>().try_to_vec::<f32>().unwrap()
    }

    /// On a wgpu autodiff graph (Mesa's software driver in CI) the one-kernel dropout keeps
    /// elements with probability `1 - p` (within five standard deviations over 400,000),
    /// scales the kept ones by `1 / (1 - p)` and zeroes the others, as the mask that the host
    /// computes from the same key says; its gradient is the same mask times the scale; the
    /// device seed governs the masks (one seed, one mask; another seed, another mask), and two
    /// dropouts under one seed draw different masks. `ops::dropout` takes this path.
    #[test]
    fn one_kernel_dropout_keeps_the_expected_share_and_masks_its_gradient() {
        let Some(gpu) =
            crate::test_wgpu("one_kernel_dropout_keeps_the_expected_share_and_masks_its_gradient")
        else {
            return;
        };
        let _rng = crate::rng_lock();
        let ad = gpu.clone().autodiff();
        let (rows, d, p) = (1_000, 400, 0.1);
        let x0 = Tensor::<2>::random([rows, d], Distribution::Uniform(1.0, 2.0), &gpu);
        let r = Tensor::<2>::random([rows, d], Distribution::Normal(0.0, 1.0), &ad);
        let run = |seed: u64| {
            ad.seed(seed);
            let x = Tensor::<2>::from_data(x0.to_data(), &ad).require_grad();
            let y = try_dropout(x.clone(), p).expect("a wgpu autodiff graph");
            let grads = (y.clone() * r.clone()).sum().backward();
            (values(y), values(x.grad(&grads).unwrap()))
        };
        let (y, gx) = run(7);
        let (x, rv) = (values(x0.clone()), values(r.clone().inner()));
        let scale = (1.0 / (1.0 - p)) as f32;
        let mut kept = 0usize;
        for i in 0..y.len() {
            if y[i] != 0.0 {
                kept += 1;
                assert!(
                    (y[i] - x[i] * scale).abs() <= 1e-6 * y[i].abs(),
                    "element {i}"
                );
                assert!((gx[i] - rv[i] * scale).abs() <= 1e-5, "gradient {i}");
            } else {
                assert_eq!(gx[i], 0.0, "the gradient of dropped element {i}");
            }
        }
        let n = (rows * d) as f64;
        let sd = (n * p * (1.0 - p)).sqrt();
        let expected = n * (1.0 - p);
        assert!(
            (kept as f64 - expected).abs() < 5.0 * sd,
            "{kept} kept of {n} (expected {expected} ± {sd})"
        );
        // the same key on the host gives the same mask
        ad.seed(7);
        let key = Tensor::<1>::random([4], Distribution::Default, (&gpu, DType::F32));
        let (threshold, scale) = dropout_threshold_and_scale(p);
        let host = values(mask_ops(&key, rows * d, threshold, scale));
        let expected: Vec<f32> = x.iter().zip(&host).map(|(a, m)| a * m).collect();
        assert!(max_rel_diff(&expected, &y) < 1e-6, "the host's mask");

        assert_eq!(run(7).0, y, "one seed, one mask");
        assert_ne!(run(8).0, y, "another seed, another mask");
        ad.seed(9);
        let x = Tensor::<2>::from_data(x0.to_data(), &ad);
        let (a, b) = (
            try_dropout(x.clone(), p).unwrap(),
            try_dropout(x.clone(), p).unwrap(),
        );
        assert_ne!(values(a), values(b), "two calls, two masks");
        // `ops::dropout` runs it (in training mode) and equals it under one seed
        let module = DropoutConfig::new(p).init();
        ad.seed(11);
        let via_ops = values(super::super::dropout(&module, x.clone()));
        ad.seed(11);
        assert_eq!(via_ops, values(try_dropout(x.clone(), p).unwrap()));
        assert!(try_dropout(x.clone(), 0.0).is_err() && try_dropout(x, 1.0).is_err());
        let plain = Tensor::<2>::zeros([2, 2], &gpu);
        assert!(
            try_dropout(plain, p).is_err(),
            "a plain tensor: no dropout at inference"
        );
    }
}
