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
//!
//! Drawing a key is a launch of burn's generator, one per dropout (19 a pass of MiniLM).
//! Inside [`scope`] (a backbone's forward pass) the first dropout draws the keys of
//! [`POOL`] dropouts at once and the next ones take the following keys of that draw: one
//! launch a pass. The draws still come from the device's generator in the pass's order, so a
//! pass seeded alike draws the same masks again (GradCache's second pass relies on it).

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
/// The dropouts whose keys one draw of a [`scope`] holds.
const POOL: usize = 64;

pub(super) mod kernel {
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

    /// 32 bits of a key (the four uniform numbers in `[0, 1)` from `keys[base]`, 16 bits
    /// each) and an index.
    #[cube]
    fn hash(keys: &Tensor<f32>, base: usize, i: u32) -> u32 {
        let k0 = (bits(keys[base]) << 16) | bits(keys[base + 1]);
        let k1 = (bits(keys[base + 2]) << 16) | bits(keys[base + 3]);
        mix(mix(i ^ k0) + k1)
    }

    /// Whether the dropout of the key at `base` of `keys` keeps element `i` (its hash below
    /// `threshold`, `keep · 2³²`): the mask of [`dropout_apply`], for kernels that apply it
    /// to what they read or write.
    #[cube]
    pub(in crate::ops) fn kept(keys: &Tensor<f32>, base: usize, i: usize, threshold: u32) -> bool {
        hash(keys, base, u32::cast_from(i)) < threshold
    }

    /// `out_i = x_i / keep` where element `i`'s hash falls below `threshold` (`keep · 2³²`),
    /// else 0: `x` and `out` `[n]` with any stride, the key the four uniform numbers of `keys`
    /// from `base` (contiguous).
    #[allow(clippy::too_many_arguments)]
    #[cube(launch)]
    pub(super) fn dropout_apply<F: Float>(
        x: &Tensor<F>,
        keys: &Tensor<f32>,
        out: &mut Tensor<F>,
        base: usize,
        n: usize,
        threshold: u32,
        scale: f32,
        #[comptime] units: usize,
        #[define(F)] _dtype: ElemType,
    ) {
        let i = flat_unit(units);
        if i < n {
            let v = f32::cast_from(x[i * x.stride(0)]);
            let at = i * out.stride(0);
            out[at] = F::cast_from(select(kept(keys, base, i, threshold), v * scale, 0.0f32));
        }
    }
}

/// `x` with the mask of the key at `key.1` of `key.0` applied (`[n]`), as one launch (`None`
/// when a tensor is not a cubecl one or is stored tiled).
fn apply(x: &Tensor<1>, key: &Key, threshold: u32, scale: f32) -> Option<Tensor<1>> {
    let [n] = x.dims();
    let (xp, kp) = (cube(x)?, cube(&key.0)?);
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
        key.1,
        n,
        threshold,
        scale,
        UNITS,
        ElemType::Float(float_kind(x.dtype())?),
    );
    Some(out)
}

/// A dropout's key: four uniform numbers of a device's generator, at an index of a drawn tensor.
type Key = (Tensor<1>, usize);

/// The keys of a [`scope`]'s dropouts: the last draw (`None` before the first dropout) and
/// how many of its keys were taken.
struct Pool {
    keys: Option<Tensor<1>>,
    taken: usize,
}

std::thread_local! {
    /// The innermost [`scope`] of this thread (`None` outside any).
    static POOL_OF_SCOPE: std::cell::RefCell<Option<Pool>> = const { std::cell::RefCell::new(None) };
}

/// Runs `f` with its dropouts' keys drawn [`POOL`] at a time (one launch of the device's
/// generator where each dropout took one), restoring the enclosing scope's keys after.
pub(crate) fn scope<T>(f: impl FnOnce() -> T) -> T {
    /// Puts the enclosing scope's pool back, even when `f` unwinds.
    struct Restore(Option<Pool>);
    impl Drop for Restore {
        fn drop(&mut self) {
            let outer = self.0.take();
            POOL_OF_SCOPE.with(|p| *p.borrow_mut() = outer);
        }
    }
    let fresh = Pool {
        keys: None,
        taken: 0,
    };
    let _restore = Restore(POOL_OF_SCOPE.with(|p| p.borrow_mut().replace(fresh)));
    f()
}

/// The next dropout's key on `device`: the next of the [`scope`]'s drawn keys (a new draw of
/// [`POOL`] when none is left or they live on another device), outside a scope a draw of
/// its own.
fn next_key(device: &Device) -> Key {
    let draw =
        |keys: usize| Tensor::<1>::random([4 * keys], Distribution::Default, (device, DType::F32));
    POOL_OF_SCOPE.with(|p| {
        let mut pool = p.borrow_mut();
        let Some(pool) = pool.as_mut() else {
            return (draw(1), 0);
        };
        let keys = match &pool.keys {
            Some(k) if pool.taken < POOL && k.device() == *device => k.clone(),
            _ => {
                let k = draw(POOL);
                pool.keys = Some(k.clone());
                pool.taken = 0;
                k
            }
        };
        pool.taken += 1;
        (keys, 4 * (pool.taken - 1))
    })
}

/// One dropout's mask: its key, the keep threshold and the scale of kept values. The
/// dropout's own launch ([`try_dropout`]) applies it, and so do the kernels that apply it
/// inside their launches (LayerNorm's input, attention's probabilities): the same masks.
pub(super) struct DropoutMask {
    pub(super) key: Key,
    pub(super) threshold: u32,
    pub(super) scale: f32,
}

/// What a backward step keeps of a [`DropoutMask`] beside its keys (its state): the key's
/// index in them, the threshold and the scale.
pub(super) type DropoutMaskParts = (usize, u32, f32);

impl DropoutMask {
    /// An active dropout of probability `prob` (`0 < prob < 1`) on `device`, its key drawn
    /// now ([`next_key`]).
    pub(super) fn draw(prob: f64, device: &Device) -> Self {
        let (threshold, scale) = dropout_threshold_and_scale(prob);
        Self {
            key: next_key(device),
            threshold,
            scale,
        }
    }

    /// The dropout split into its keys (for a backward step's state) and the rest.
    pub(super) fn into_parts(self) -> (Tensor<1>, DropoutMaskParts) {
        (self.key.0, (self.key.1, self.threshold, self.scale))
    }

    /// The dropout from [`into_parts`](Self::into_parts)' pieces.
    pub(super) fn from_parts(keys: Tensor<1>, (base, threshold, scale): DropoutMaskParts) -> Self {
        Self {
            key: (keys, base),
            threshold,
            scale,
        }
    }

    /// The kernels' dropout arguments: the keys, the key's index in them, the threshold and
    /// the scale (without a dropout a one-key stand-in and zeros, which the kernels then do
    /// not read).
    pub(super) fn args(drop: Option<&Self>, device: &Device) -> (Tensor<1>, usize, u32, f32) {
        match drop {
            Some(d) => (d.key.0.clone(), d.key.1, d.threshold, d.scale),
            None => (Tensor::<1>::empty([4], (device, DType::F32)), 0, 0, 0.0),
        }
    }

    /// `t` through the mask (any shape; flattening a float cubecl tensor untiles it, so the
    /// kernel takes it) by the dropout's own launch: a dropout's backward step, and the
    /// fallback of a kernel that did not run.
    pub(super) fn apply_to<const D: usize>(&self, t: Tensor<D>) -> Tensor<D> {
        let dims = t.dims();
        let flat = t.reshape([dims.iter().product::<usize>()]);
        apply(&flat, &self.key, self.threshold, self.scale)
            .expect("the gradient of a cubecl float tensor is a cubecl float tensor")
            .reshape(dims)
    }
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
    let mask = DropoutMask::draw(prob, &inner.device());
    let Some(y) = apply(&inner, &mask.key, mask.threshold, mask.scale) else {
        return Err(x);
    };
    let (keys, mask) = mask.into_parts();
    let step = DropoutBackward::<D> { mask };
    let kind = step
        .prepare::<NoCheckpointing>([xp.node()])
        .compute_bound()
        .stateful();
    let out = finish(kind, primitive(keys), primitive(y.reshape(dims)));
    Ok(Tensor::from_primitive::<Autodiff<Cube>>(out))
}

/// The backward step of [`try_dropout`]: the gradient through the same mask, from the same
/// key (the state), in one launch (burn's ops where that does not run).
#[derive(Debug)]
struct DropoutBackward<const D: usize> {
    mask: DropoutMaskParts,
}

impl<const D: usize> Backward<Cube, 1> for DropoutBackward<D> {
    /// The keys the forward step's key is among.
    type State = CubeTensor;

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let g = plain::<D>(grads.consume::<Cube>(&ops.node));
        let [parent] = ops.parents;
        let Some(node) = parent else {
            return;
        };
        let dx = DropoutMask::from_parts(plain::<1>(ops.state), self.mask).apply_to(g);
        grads.register::<Cube>(node.id, primitive(dx));
    }
}

/// The mask times the scale of [`kernel::hash`]'s key at `base` of `key` for `n` elements,
/// computed on the host (the tests' reference).
#[cfg(test)]
fn mask_ops(key: &Tensor<1>, base: usize, n: usize, threshold: u32, scale: f32) -> Tensor<1> {
    let k: Vec<f32> = key
        .to_data()
        .convert::<f32>()
        .try_to_vec()
        .unwrap_or_default();
    let bits = |v: f32| ((v * 65_536.0) as u32) & 0xffff;
    let k = &k[base..base + 4];
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
        let host = values(mask_ops(&key, 0, rows * d, threshold, scale));
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

    /// Inside a [`scope`] the dropouts take the keys of one draw of [`POOL`] in turn: after
    /// seeding, the first two dropouts' masks are those the host computes from keys 0 and 1
    /// of that draw (the second's gradient too), the same seed and a new scope draw the same
    /// masks again (a pass replayed),
    /// more dropouts than a draw holds go on with a new draw, and the scope's keys end with it
    /// (the next dropout draws its own).
    #[test]
    fn a_scopes_dropouts_take_the_keys_of_one_draw_in_turn() {
        let Some(gpu) = crate::test_wgpu("a_scopes_dropouts_take_the_keys_of_one_draw_in_turn")
        else {
            return;
        };
        let _rng = crate::rng_lock();
        let ad = gpu.clone().autodiff();
        let (n, p) = (5_000, 0.25);
        let (threshold, scale) = dropout_threshold_and_scale(p);
        let x = Tensor::<1>::ones([n], &ad);
        let masks = |calls: usize| {
            scope(|| {
                (0..calls)
                    .map(|_| values(try_dropout(x.clone(), p).expect("a wgpu autodiff graph")))
                    .collect::<Vec<_>>()
            })
        };
        ad.seed(21);
        let got = masks(POOL + 2);
        ad.seed(21);
        let pool = Tensor::<1>::random([4 * POOL], Distribution::Default, (&gpu, DType::F32));
        for (k, mask) in got.iter().take(2).enumerate() {
            assert_eq!(
                *mask,
                values(mask_ops(&pool, 4 * k, n, threshold, scale)),
                "dropout {k}: key {k} of the scope's draw"
            );
        }
        assert_ne!(got[0], got[1], "two dropouts, two masks");
        ad.seed(21);
        assert_eq!(masks(POOL + 2), got, "the same seed, the same masks");
        // the backward step of the scope's second dropout applies key 1's mask
        ad.seed(21);
        let xg = Tensor::<1>::ones([n], &ad).require_grad();
        let grads = scope(|| {
            let _first = try_dropout(x.clone(), p).unwrap();
            try_dropout(xg.clone(), p).unwrap().sum().backward()
        });
        assert_eq!(
            values(xg.grad(&grads).unwrap()),
            values(mask_ops(&pool, 4, n, threshold, scale)),
            "the second dropout's gradient"
        );
        // the draw after the first: its keys 0 and 1
        ad.seed(21);
        let _ = Tensor::<1>::random([4 * POOL], Distribution::Default, (&gpu, DType::F32));
        let next = Tensor::<1>::random([4 * POOL], Distribution::Default, (&gpu, DType::F32));
        assert_eq!(got[POOL], values(mask_ops(&next, 0, n, threshold, scale)));
        assert_eq!(
            got[POOL + 1],
            values(mask_ops(&next, 4, n, threshold, scale))
        );
        // after the scope, a dropout draws a key of its own
        ad.seed(22);
        let own = values(try_dropout(x.clone(), p).unwrap());
        ad.seed(22);
        let key = Tensor::<1>::random([4], Distribution::Default, (&gpu, DType::F32));
        assert_eq!(own, values(mask_ops(&key, 0, n, threshold, scale)));
    }
}
