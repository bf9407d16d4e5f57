//! AdamW's updates of parameter tensors as GPU kernels, four tensors a launch, and the squares
//! of gradients summed into the global norm's total, eight a launch.
//!
//! burn-optim's AdamW spells the update out in tensor operations: about fourteen kernel launches
//! per parameter tensor (the two moments, their bias corrections, the square root, the decay,
//! the step), each reading and writing the whole tensor. all-MiniLM-L6-v2 has 101 parameter
//! tensors, so on a GPU a step's update alone was some 1,400 launches of the 6,163 the H100's
//! profile counted (docs/devices.md, "Where a GPU step goes"); PyTorch's AdamW runs fused or
//! multi-tensor kernels there. Here the same arithmetic, in the same order, runs on the cubecl
//! devices (`wgpu`, `vulkan`, `cuda`) as one kernel that reads each parameter, its gradient and
//! both moments once and writes the three results, for four tensors a launch
//! ([`AdamWUpdates`]: the trainer lets a step's updates wait until four are queued). The
//! state it returns is burn's own [`AdamWState`], so checkpoints are those of burn's AdamW,
//! and every other device (the CPU above all: the quickstart's figures are unchanged) runs
//! burn's AdamW itself.
//!
//! The global norm that clipping needs took four launches per gradient through burn's ops
//! (the squares, a zeroed sum, the sum, the running total): [`SquareTotal::add`] sums a gradient's
//! squares in one, its cubes adding their partial sums into one f32 total with atomic
//! additions (where the device has them; [`SquareTotal`] reads the total once).

use burn::backend::Cube;
use burn::optim::{AdamWState, AdaptiveMomentumState};
use burn::tensor::{DType, Device, Tensor};
use cubecl::features::AtomicUsage;
use cubecl::ir::{ElemType, FloatKind, Type};
use cubecl::prelude::BufferArg;
use cubecl::{CubeCount, CubeDim};

use kernel::{adamw_group, add_squares_group, add_squares_kernel};

/// Units of a [`SquareTotal::add`] cube (a power of two: the tree halves it).
const SQUARE_UNITS: usize = 256;
/// The most cubes of a [`SquareTotal::add`] launch (each unit sums at most eight elements
/// below about two million, more above).
const SQUARE_CUBES: usize = 1_024;
/// The gradients one [`SquareTotal::add_all`] launch sums (its kernel's slots).
const SQUARE_GROUP: usize = 8;

mod kernel {
    use cubecl::prelude::*;

    /// AdamW's update (burn-optim's order of operations) of the first `len` elements of one
    /// parameter tensor, from element `start` every `step` elements, of the gradient
    /// `g = grad · grad_scale` (clipping's factor, applied as `mul_scalar` would; `keep == 1`:
    /// no update, the parameter and moments copied as they are): the moments
    /// `m = m b1 + g (1 - b1)`, `v = v b2 + g^2 (1 - b2)` (without the old moments on the first
    /// step, `first == 1`), then `p (1 - lr wd) - lr (m / c1) / (sqrt(v / c2) + eps)`.
    #[allow(clippy::too_many_arguments)]
    #[cube]
    fn update(
        param: &[f32],
        grad: &[f32],
        moment_1: &[f32],
        moment_2: &[f32],
        param_out: &mut [f32],
        moment_1_out: &mut [f32],
        moment_2_out: &mut [f32],
        len: usize,
        first: u32,
        correction_1: f32,
        correction_2: f32,
        beta_1: f32,
        one_minus_beta_1: f32,
        beta_2: f32,
        one_minus_beta_2: f32,
        epsilon: f32,
        decay: f32,
        lr: f32,
        grad_scale: f32,
        keep: u32,
        start: usize,
        step: usize,
    ) {
        // `len`, not the buffers' lengths: cubecl sizes a buffer argument from its allocation,
        // which may be rounded up past the tensor's elements
        let mut i = start;
        while i < len {
            if keep == 1 {
                // a step not taken: the parameter as it was, the moments too (none before
                // the first step)
                param_out[i] = param[i];
                let mut m = 0.0f32;
                let mut v = 0.0f32;
                if first == 0 {
                    m = moment_1[i];
                    v = moment_2[i];
                }
                moment_1_out[i] = m;
                moment_2_out[i] = v;
            } else {
                let g = grad[i] * grad_scale;
                let mut m = g * one_minus_beta_1;
                let mut v = (g * g) * one_minus_beta_2;
                if first == 0 {
                    m += moment_1[i] * beta_1; // IEEE addition commutes: burn-optim's m b1 + g (1 - b1)
                    v += moment_2[i] * beta_2;
                }
                moment_1_out[i] = m;
                moment_2_out[i] = v;
                let delta = (m / correction_1) / (f32::sqrt(v / correction_2) + epsilon);
                param_out[i] = param[i] * decay - delta * lr;
            }
            i += step;
        }
    }

    /// [`update`] of up to four parameter tensors in one launch: the cubes of row `y` update
    /// tensor `y` (`CUBE_COUNT_X · CUBE_DIM_X` units, each every so many elements from its
    /// position), with its own length, first-step flag and bias corrections and the launch's
    /// shared scalars. A slot past the launch's tensors has length 0 (and no cubes). With
    /// `clip == 1` the gradients' factor is not `grad_scale` but clipping's, from the squares'
    /// total `clip_total[0]` and `max_norm`, as the host computes it from the total read back.
    #[allow(clippy::too_many_arguments)]
    #[cube(launch)]
    pub(super) fn adamw_group(
        param_0: &[f32],
        grad_0: &[f32],
        moment_1_0: &[f32],
        moment_2_0: &[f32],
        param_out_0: &mut [f32],
        moment_1_out_0: &mut [f32],
        moment_2_out_0: &mut [f32],
        param_1: &[f32],
        grad_1: &[f32],
        moment_1_1: &[f32],
        moment_2_1: &[f32],
        param_out_1: &mut [f32],
        moment_1_out_1: &mut [f32],
        moment_2_out_1: &mut [f32],
        param_2: &[f32],
        grad_2: &[f32],
        moment_1_2: &[f32],
        moment_2_2: &[f32],
        param_out_2: &mut [f32],
        moment_1_out_2: &mut [f32],
        moment_2_out_2: &mut [f32],
        param_3: &[f32],
        grad_3: &[f32],
        moment_1_3: &[f32],
        moment_2_3: &[f32],
        param_out_3: &mut [f32],
        moment_1_out_3: &mut [f32],
        moment_2_out_3: &mut [f32],
        len_0: usize,
        first_0: u32,
        correction_1_0: f32,
        correction_2_0: f32,
        len_1: usize,
        first_1: u32,
        correction_1_1: f32,
        correction_2_1: f32,
        len_2: usize,
        first_2: u32,
        correction_1_2: f32,
        correction_2_2: f32,
        len_3: usize,
        first_3: u32,
        correction_1_3: f32,
        correction_2_3: f32,
        beta_1: f32,
        one_minus_beta_1: f32,
        beta_2: f32,
        one_minus_beta_2: f32,
        epsilon: f32,
        decay: f32,
        lr: f32,
        grad_scale: f32,
        clip_total: &[f32],
        clip: u32,
        max_norm: f32,
    ) {
        let step = CUBE_COUNT_X as usize * CUBE_DIM_X as usize;
        let start = CUBE_POS_X as usize * CUBE_DIM_X as usize + UNIT_POS_X as usize;
        let which = CUBE_POS_Y;
        // clipping on the device: the factor of torch's `clip_grad_norm_` from the squares'
        // total, `min(max_norm / (sqrt(total) + 1e-6), 1)`; a total that is NaN or infinite
        // (all exponent bits set: a test of the bits, which no compiler's assumption that
        // floats stay finite can remove) and the step is not taken
        let mut scale = grad_scale;
        let mut keep = 0u32;
        if clip == 1 {
            let total = clip_total[0];
            if (u32::reinterpret(total) & 0x7f80_0000u32) != 0x7f80_0000u32 {
                scale = max_norm / (f32::sqrt(total) + 1e-6f32);
                if scale > 1.0f32 {
                    scale = 1.0f32;
                }
            } else {
                keep = 1u32;
            }
        }
        if which == 0 {
            update(
                param_0,
                grad_0,
                moment_1_0,
                moment_2_0,
                param_out_0,
                moment_1_out_0,
                moment_2_out_0,
                len_0,
                first_0,
                correction_1_0,
                correction_2_0,
                beta_1,
                one_minus_beta_1,
                beta_2,
                one_minus_beta_2,
                epsilon,
                decay,
                lr,
                scale,
                keep,
                start,
                step,
            );
        } else if which == 1 {
            update(
                param_1,
                grad_1,
                moment_1_1,
                moment_2_1,
                param_out_1,
                moment_1_out_1,
                moment_2_out_1,
                len_1,
                first_1,
                correction_1_1,
                correction_2_1,
                beta_1,
                one_minus_beta_1,
                beta_2,
                one_minus_beta_2,
                epsilon,
                decay,
                lr,
                scale,
                keep,
                start,
                step,
            );
        } else if which == 2 {
            update(
                param_2,
                grad_2,
                moment_1_2,
                moment_2_2,
                param_out_2,
                moment_1_out_2,
                moment_2_out_2,
                len_2,
                first_2,
                correction_1_2,
                correction_2_2,
                beta_1,
                one_minus_beta_1,
                beta_2,
                one_minus_beta_2,
                epsilon,
                decay,
                lr,
                scale,
                keep,
                start,
                step,
            );
        } else if which == 3 {
            update(
                param_3,
                grad_3,
                moment_1_3,
                moment_2_3,
                param_out_3,
                moment_1_out_3,
                moment_2_out_3,
                len_3,
                first_3,
                correction_1_3,
                correction_2_3,
                beta_1,
                one_minus_beta_1,
                beta_2,
                one_minus_beta_2,
                epsilon,
                decay,
                lr,
                scale,
                keep,
                start,
                step,
            );
        }
    }

    /// `total[0] += Σ x_i²` over `len` elements: each unit sums the squares of every
    /// `CUBE_COUNT · units`-th element from its position, the cube adds its units' sums through
    /// a tree in shared memory (levels unrolled), and its first unit adds the cube's sum to
    /// the total atomically.
    #[cube(launch)]
    pub(super) fn add_squares_kernel(
        x: &[f32],
        total: &mut Tensor<Atomic<f32>>,
        len: usize,
        #[comptime] units: usize,
    ) {
        let sum = squares(x, len, ABSOLUTE_POS, CUBE_COUNT * units);
        add_cube_sum(sum, total, units);
    }

    /// The cube's units' `sum`s added through a tree in shared memory (levels unrolled), the
    /// cube's total added to `total[0]` atomically by its first unit.
    #[cube]
    fn add_cube_sum(sum: f32, total: &mut Tensor<Atomic<f32>>, #[comptime] units: usize) {
        let unit = UNIT_POS as usize;
        let mut partial = Shared::<[f32]>::new_slice(units);
        partial[unit] = sum;
        sync_cube();
        #[unroll]
        for level in 1..units.trailing_zeros() + 1 {
            let half = comptime!(units) >> level;
            if unit < half {
                partial[unit] += partial[unit + half];
            }
            sync_cube();
        }
        if unit == 0 {
            total[0].fetch_add(partial[0]);
        }
    }

    /// The squares of `x[first]`, `x[first + step]`, ... below `len`, summed.
    #[cube]
    fn squares(x: &[f32], len: usize, first: usize, step: usize) -> f32 {
        let mut sum = 0.0f32;
        let mut i = first;
        while i < len {
            let v = x[i];
            sum += v * v;
            i += step;
        }
        sum
    }

    /// [`add_squares_kernel`] over up to eight tensors in one launch: the cubes of row `y`
    /// sum the squares of the first `len_y` elements of `x_y` (`CUBE_COUNT_X · units` units a
    /// tensor, each summing every so many elements from its position), and each cube adds
    /// its sum to the total atomically. A slot past the launch's tensors has length 0 (and
    /// no cubes).
    #[allow(clippy::too_many_arguments)]
    #[cube(launch)]
    pub(super) fn add_squares_group(
        x0: &[f32],
        x1: &[f32],
        x2: &[f32],
        x3: &[f32],
        x4: &[f32],
        x5: &[f32],
        x6: &[f32],
        x7: &[f32],
        len0: usize,
        len1: usize,
        len2: usize,
        len3: usize,
        len4: usize,
        len5: usize,
        len6: usize,
        len7: usize,
        total: &mut Tensor<Atomic<f32>>,
        #[comptime] units: usize,
    ) {
        let step = CUBE_COUNT_X as usize * units;
        let first = CUBE_POS_X as usize * units + UNIT_POS as usize;
        let which = CUBE_POS_Y;
        let mut sum = 0.0f32;
        if which == 0 {
            sum = squares(x0, len0, first, step);
        } else if which == 1 {
            sum = squares(x1, len1, first, step);
        } else if which == 2 {
            sum = squares(x2, len2, first, step);
        } else if which == 3 {
            sum = squares(x3, len3, first, step);
        } else if which == 4 {
            sum = squares(x4, len4, first, step);
        } else if which == 5 {
            sum = squares(x5, len5, first, step);
        } else if which == 6 {
            sum = squares(x6, len6, first, step);
        } else if which == 7 {
            sum = squares(x7, len7, first, step);
        }
        add_cube_sum(sum, total, units);
    }
}

/// AdamW's hyper-parameters, as burn-optim's `AdamWConfig` holds them.
#[derive(Debug, Clone, Copy)]
pub(crate) struct AdamWHyper {
    pub(crate) beta_1: f32,
    pub(crate) beta_2: f32,
    pub(crate) epsilon: f32,
    pub(crate) weight_decay: f32,
}

/// A contiguous f32 cubecl tensor's buffer as a kernel argument, or `None`.
#[allow(unsafe_code)]
fn buffer(t: &Tensor<1>) -> Option<BufferArg> {
    let p = t.clone().try_into_primitive::<Cube>().ok()?;
    let len = p.meta.shape().num_elements();
    // the binding starts at the tensor's first element; a contiguous tensor's elements follow
    // it (the buffer may be longer: allocations are rounded up)
    if p.dtype != DType::F32
        || p.meta.is_tiled()
        || !p.is_contiguous()
        || (p.handle.size_in_used() as usize) < 4 * len
    {
        return None;
    }
    // SAFETY: the length is the tensor's element count, which its buffer holds in order from
    // the binding's start (contiguous, checked above).
    Some(unsafe { BufferArg::from_raw_parts(p.handle, len) })
}

/// The parameter tensors one [`AdamWUpdates`] launch updates (its kernel's slots).
const ADAMW_GROUP: usize = 4;
/// Units of an [`AdamWUpdates`] cube.
const ADAMW_UNITS: usize = 256;
/// The most cubes a tensor of an [`AdamWUpdates`] launch gets (each unit then updates every so
/// many elements: above about half a million).
const ADAMW_CUBES: usize = 2_048;

/// One parameter tensor's update waiting for its launch: the flattened parameter, gradient and
/// moments, the three outputs (allocated, written by the launch), and the tensor's scalars.
struct Update {
    tensors: [Tensor<1>; 7],
    len: usize,
    first: bool,
    correction_1: f32,
    correction_2: f32,
}

/// The scalars the updates of one launch share.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Shared {
    beta_1: f32,
    beta_2: f32,
    epsilon: f32,
    decay: f32,
    lr: f32,
    grad_scale: f32,
    /// The [`DeviceClip`] (its number and bound) whose factor replaces `grad_scale`.
    clip: Option<(u64, f32)>,
}

/// What the gradients of an [`AdamWUpdates`] update are multiplied by.
#[derive(Clone, Copy)]
pub(crate) enum GradScale<'a> {
    /// A factor (1: none).
    Factor(f64),
    /// Clipping's factor, computed in the kernel from the norm on the device.
    Clip(&'a DeviceClip),
}

/// Clipping by the global norm with the norm left on the device: the kernel of
/// [`AdamWUpdates`] computes torch's factor `min(max_norm / (norm + 1e-6), 1)` from the
/// squares' total itself, so that no step waits for the norm to be read back. A step whose
/// total is NaN or infinite (or whose losses are, once [`guard`](Self::guard)ed by them) is
/// not taken: parameters and moments stay as they were (zero moments for a first step; the
/// state's step count still advances, the host not knowing: the trainer stops there).
#[derive(Clone)]
pub(crate) struct DeviceClip {
    /// The gradients' squares summed, `[1]`.
    total: Tensor<1>,
    max_norm: f32,
    /// Tells one step's clipping from another's (updates of different ones go apart).
    id: u64,
}

impl DeviceClip {
    /// Makes the step's losses (`[1]` each, on the total's device) part of the test of the
    /// total: `total + Σ loss · 0` is the total itself while they are finite, and NaN when one
    /// is not (two launches).
    pub(crate) fn guard(mut self, losses: &[Tensor<1>]) -> Self {
        let device = self.total.device();
        let sum = losses
            .iter()
            .map(|l| l.clone().to_device(&device))
            .reduce(|a, b| a + b);
        if let Some(sum) = sum {
            self.total = self.total + sum.mul_scalar(0.0);
        }
        self
    }

    /// The squares' total (`[1]`, on the device).
    pub(crate) fn total(&self) -> &Tensor<1> {
        &self.total
    }

    /// Whether the total is NaN or infinite, as a `[1, ..., 1]` tensor of rank `D`.
    pub(crate) fn not_finite<const D: usize>(&self) -> Tensor<D, burn::tensor::Bool> {
        self.total.clone().is_finite().bool_not().reshape([1; D])
    }

    /// The factor as a `[1, ..., 1]` tensor of rank `D` (burn's ops, for the gradients the
    /// kernel does not take).
    pub(crate) fn factor<const D: usize>(&self) -> Tensor<D> {
        self.total
            .clone()
            .sqrt()
            .add_scalar(1e-6)
            .recip()
            .mul_scalar(self.max_norm)
            .clamp_max(1.0)
            .reshape([1; D])
    }
}

/// burn-optim's AdamW updates of parameter tensors on a cubecl device as kernels that update
/// [`ADAMW_GROUP`] tensors a launch.
///
/// [`push`](Self::push) returns the tensor's new parameter and state at once: tensors whose
/// launch is still to come, as any tensor of a GPU stream is until its kernel runs. The launch
/// goes when the group is full, when an update's device or scalars differ from the waiting
/// ones', or at [`flush`](Self::flush), which must come before anything reads them (the
/// trainer flushes after each optimizer step).
#[derive(Default)]
pub(crate) struct AdamWUpdates {
    waiting: Vec<Update>,
    shared: Option<(Device, Shared)>,
    /// The waiting updates' clipping total ([`DeviceClip`]), if they clip on the device.
    clip_total: Option<Tensor<1>>,
}

impl AdamWUpdates {
    /// burn-optim's AdamW step of one parameter tensor, of the gradient `grad` times `scale`'s
    /// factor (exactly as `grad.mul_scalar(factor)` then the step; a [`DeviceClip`] on the
    /// tensor's device computes it in the kernel), when `tensor`,
    /// `grad` and the state are contiguous f32 tensors of a cubecl device that binds the
    /// kernel's buffers (else `None`, and nothing was queued; flattening a non-contiguous input
    /// may have copied it). Not for AMSGrad or cautious weight decay, which [`AdamWHyper`]
    /// cannot express.
    pub(crate) fn push<const D: usize>(
        &mut self,
        hyper: AdamWHyper,
        lr: f64,
        scale: GradScale<'_>,
        tensor: &Tensor<D>,
        grad: &Tensor<D>,
        state: Option<&AdamWState<D>>,
    ) -> Option<(Tensor<D>, AdamWState<D>)> {
        if state.is_some_and(|s| s.momentum.max_moment_2.is_some()) {
            return None; // AMSGrad: not this kernel's arithmetic
        }
        let client = tensor.clone().try_into_primitive::<Cube>().ok()?.client;
        // the slots' buffers, the clipping total and the kernel's metadata
        if (client.properties().hardware.max_bindings as usize) < 7 * ADAMW_GROUP + 2 {
            return None;
        }
        let (grad_scale, clip) = match scale {
            GradScale::Factor(f) => (f, None),
            GradScale::Clip(c) => (1.0, Some(c)),
        };
        if clip.is_some_and(|c| c.total.device() != tensor.device() || buffer(&c.total).is_none()) {
            return None;
        }
        let shape = tensor.shape();
        let n = shape.num_elements();
        let device = tensor.device();
        let flat = |t: &Tensor<D>| t.clone().reshape([n]);
        let (p, g) = (flat(tensor), flat(grad));
        let (m, v, time) = match state {
            Some(s) => (
                flat(&s.momentum.moment_1),
                flat(&s.momentum.moment_2),
                s.momentum.time + 1,
            ),
            None => (g.clone(), g.clone(), 1),
        };
        if [&p, &g, &m, &v]
            .iter()
            .any(|t| t.device() != device || buffer(t).is_none())
        {
            return None;
        }
        let outputs: [Tensor<1>; 3] =
            std::array::from_fn(|_| Tensor::<1>::empty([n], (&device, DType::F32)));
        if outputs.iter().any(|t| buffer(t).is_none()) {
            return None;
        }
        // the scalars as burn-optim computes them (f32 bias corrections; lr and decay in f64,
        // converted to the tensors' f32 by `mul_scalar`)
        let t = time as i32;
        let shared = Shared {
            beta_1: hyper.beta_1,
            beta_2: hyper.beta_2,
            epsilon: hyper.epsilon,
            decay: (1.0 - lr * f64::from(hyper.weight_decay)) as f32,
            lr: lr as f32,
            grad_scale: grad_scale as f32,
            clip: clip.map(|c| (c.id, c.max_norm)),
        };
        if self
            .shared
            .as_ref()
            .is_some_and(|(d, s)| *d != device || *s != shared)
        {
            self.flush();
        }
        self.shared = Some((device, shared));
        self.clip_total = clip.map(|c| c.total.clone());
        let [p_out, m_out, v_out] = outputs;
        self.waiting.push(Update {
            tensors: [p, g, m, v, p_out.clone(), m_out.clone(), v_out.clone()],
            len: n,
            first: state.is_none(),
            correction_1: 1f32 - hyper.beta_1.powi(t),
            correction_2: 1f32 - hyper.beta_2.powi(t),
        });
        if self.waiting.len() == ADAMW_GROUP {
            self.flush();
        }
        let [p_new, m_new, v_new] = [p_out, m_out, v_out].map(|t| t.reshape::<D, _>(shape.clone()));
        Some((
            p_new,
            AdamWState::new(AdaptiveMomentumState::new(time, m_new, v_new)),
        ))
    }

    /// Launches the waiting updates (none: nothing).
    pub(crate) fn flush(&mut self) {
        let waiting = std::mem::take(&mut self.waiting);
        let clip_total = self.clip_total.take();
        let Some((_, h)) = self.shared.take() else {
            return;
        };
        if waiting.is_empty() {
            return;
        }
        let Ok(client) = waiting[0].tensors[0]
            .clone()
            .try_into_primitive::<Cube>()
            .map(|p| p.client)
        else {
            return; // checked when pushed: cubecl tensors
        };
        let cubes = waiting
            .iter()
            .map(|u| u.len.div_ceil(ADAMW_UNITS).clamp(1, ADAMW_CUBES))
            .max()
            .unwrap_or(1);
        // the empty slots: the first tensor's buffers again, with no elements to touch
        let at = |k: usize| waiting.get(k).unwrap_or(&waiting[0]);
        let slot = |k: usize, i: usize| buffer(&at(k).tensors[i]).expect("checked when pushed");
        let len = |k: usize| waiting.get(k).map_or(0, |u| u.len);
        adamw_group::launch(
            &client,
            CubeCount::Static(cubes as u32, waiting.len() as u32, 1),
            CubeDim::new_1d(ADAMW_UNITS as u32),
            slot(0, 0),
            slot(0, 1),
            slot(0, 2),
            slot(0, 3),
            slot(0, 4),
            slot(0, 5),
            slot(0, 6),
            slot(1, 0),
            slot(1, 1),
            slot(1, 2),
            slot(1, 3),
            slot(1, 4),
            slot(1, 5),
            slot(1, 6),
            slot(2, 0),
            slot(2, 1),
            slot(2, 2),
            slot(2, 3),
            slot(2, 4),
            slot(2, 5),
            slot(2, 6),
            slot(3, 0),
            slot(3, 1),
            slot(3, 2),
            slot(3, 3),
            slot(3, 4),
            slot(3, 5),
            slot(3, 6),
            len(0),
            u32::from(at(0).first),
            at(0).correction_1,
            at(0).correction_2,
            len(1),
            u32::from(at(1).first),
            at(1).correction_1,
            at(1).correction_2,
            len(2),
            u32::from(at(2).first),
            at(2).correction_1,
            at(2).correction_2,
            len(3),
            u32::from(at(3).first),
            at(3).correction_1,
            at(3).correction_2,
            h.beta_1,
            1.0 - h.beta_1,
            h.beta_2,
            1.0 - h.beta_2,
            h.epsilon,
            h.decay,
            h.lr,
            h.grad_scale,
            // without clipping on the device, a buffer the kernel does not read
            buffer(clip_total.as_ref().unwrap_or(&waiting[0].tensors[0]))
                .expect("checked when pushed"),
            u32::from(h.clip.is_some()),
            h.clip.map_or(0.0, |(_, max)| max),
        );
    }
}

/// burn-optim's AdamW step of one parameter tensor as one launch ([`AdamWUpdates::push`] then
/// [`AdamWUpdates::flush`]).
#[cfg(test)]
fn adamw_step<const D: usize>(
    hyper: AdamWHyper,
    lr: f64,
    grad_scale: f64,
    tensor: &Tensor<D>,
    grad: &Tensor<D>,
    state: Option<&AdamWState<D>>,
) -> Option<(Tensor<D>, AdamWState<D>)> {
    let mut updates = AdamWUpdates::default();
    let out = updates.push(
        hyper,
        lr,
        GradScale::Factor(grad_scale),
        tensor,
        grad,
        state,
    );
    updates.flush();
    out
}

/// The sum of the squares of gradients' elements, accumulated on a cubecl device by
/// [`SquareTotal::add`] into one f32 total.
pub(crate) struct SquareTotal(Tensor<1>);

impl SquareTotal {
    /// A zero total on `device`, when it is a cubecl device whose f32 atomics add (else
    /// `None`: burn's ops sum the squares).
    pub(crate) fn on(device: &Device) -> Option<Self> {
        let total = Tensor::<1>::zeros([1], (device, DType::F32));
        let p = total.clone().try_into_primitive::<Cube>().ok()?;
        let f32_atomic = Type::atomic(ElemType::Float(FloatKind::F32));
        p.client
            .properties()
            .atomic_type_usage(f32_atomic)
            .contains(AtomicUsage::Add)
            .then_some(Self(total))
    }

    /// Adds the squares of `grad`'s elements to the total as one launch, when `grad` is a
    /// contiguous f32 tensor on the total's device (else `false`, and nothing was added).
    pub(crate) fn add<const D: usize>(&self, grad: &Tensor<D>) -> bool {
        let n = grad.shape().num_elements();
        if grad.device() != self.0.device() {
            return false;
        }
        let Some(x) = buffer(&grad.clone().reshape([n])) else {
            return false;
        };
        if n == 0 {
            return true;
        }
        let Ok(total) = self.0.clone().try_into_primitive::<Cube>() else {
            return false;
        };
        let client = total.client.clone();
        let cubes = n.div_ceil(SQUARE_UNITS * 8).clamp(1, SQUARE_CUBES);
        add_squares_kernel::launch(
            &client,
            CubeCount::new_1d(cubes as u32),
            CubeDim::new_1d(SQUARE_UNITS as u32),
            x,
            total.into_tensor_arg(),
            n,
            SQUARE_UNITS,
        );
        true
    }

    /// Adds the squares of the elements of every gradient in `grads` that is a contiguous f32
    /// tensor on the total's device, [`SQUARE_GROUP`] gradients a launch (sorted by size, so
    /// that a launch's tensors need similar numbers of cubes) where the device binds enough
    /// buffers to a kernel, else one a launch ([`add`](Self::add)); returns the others, whose
    /// squares were not added.
    pub(crate) fn add_all(&self, grads: Vec<Tensor<1>>) -> Vec<Tensor<1>> {
        let Ok(total) = self.0.clone().try_into_primitive::<Cube>() else {
            return grads;
        };
        let client = total.client.clone();
        // the slots, the total and the kernel's metadata
        if (client.properties().hardware.max_bindings as usize) < SQUARE_GROUP + 2 {
            return grads.into_iter().filter(|g| !self.add(g)).collect();
        }
        let (mut taken, mut rest) = (Vec::with_capacity(grads.len()), Vec::new());
        for g in grads {
            let n = g.dims()[0];
            if g.device() != self.0.device() || buffer(&g).is_none() {
                rest.push(g);
            } else if n > 0 {
                taken.push((n, g));
            }
        }
        taken.sort_by_key(|(n, _)| std::cmp::Reverse(*n));
        for chunk in taken.chunks(SQUARE_GROUP) {
            let cubes = chunk
                .iter()
                .map(|(n, _)| n.div_ceil(SQUARE_UNITS * 8).clamp(1, SQUARE_CUBES))
                .max()
                .unwrap_or(1);
            // the empty slots: the first tensor again, with no elements to read
            let slot = |i: usize| {
                buffer(&chunk.get(i).unwrap_or(&chunk[0]).1).expect("checked when taken")
            };
            let len = |i: usize| chunk.get(i).map_or(0, |(n, _)| *n);
            add_squares_group::launch(
                &client,
                CubeCount::Static(cubes as u32, chunk.len() as u32, 1),
                CubeDim::new_1d(SQUARE_UNITS as u32),
                slot(0),
                slot(1),
                slot(2),
                slot(3),
                slot(4),
                slot(5),
                slot(6),
                slot(7),
                len(0),
                len(1),
                len(2),
                len(3),
                len(4),
                len(5),
                len(6),
                len(7),
                total.clone().into_tensor_arg(),
                SQUARE_UNITS,
            );
        }
        rest
    }

    /// The total (read back from the device).
    pub(crate) fn read(self) -> f64 {
        f64::from(self.0.into_scalar::<f32>())
    }

    /// Clipping to `max_norm` by the norm of this total plus `rest` (squares summed elsewhere,
    /// `[1]`), left on the device ([`DeviceClip`]).
    pub(crate) fn into_clip(self, rest: Option<Tensor<1>>, max_norm: f32) -> DeviceClip {
        static CLIPS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let device = self.0.device();
        let total = match rest {
            Some(r) => self.0 + r.to_device(&device),
            None => self.0,
        };
        DeviceClip {
            total,
            max_norm,
            id: CLIPS.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::optim::{AdamWConfig, Optimizer};
    use burn::tensor::{Device, TensorData};
    use infembed_encoder::DeviceSpec;
    use infembed_testkit::max_rel_diff;
    use rand::{Rng, SeedableRng};

    fn values<const D: usize>(t: &Tensor<D>) -> Vec<f32> {
        t.clone().into_data().convert::<f32>().try_to_vec().unwrap()
    }

    /// The wgpu device (Mesa's software driver in CI), `None` (a skip, a failure under CI)
    /// where there is none.
    fn wgpu(test: &str) -> Option<Device> {
        match DeviceSpec::Wgpu(None).device() {
            Ok(d) => Some(d),
            Err(e) => infembed_testkit::wgpu_missing(test, &e),
        }
    }

    /// The hyper-parameters of the tests' AdamW, and burn-optim's AdamW with them.
    fn adamw_pair() -> (AdamWHyper, burn::optim::AdamW) {
        let hyper = AdamWHyper {
            beta_1: 0.9,
            beta_2: 0.999,
            epsilon: 1e-6,
            weight_decay: 0.01,
        };
        let burn = AdamWConfig::new()
            .with_beta_1(hyper.beta_1)
            .with_beta_2(hyper.beta_2)
            .with_epsilon(hyper.epsilon)
            .with_weight_decay(hyper.weight_decay)
            .build();
        (hyper, burn)
    }

    /// Four steps of the fused update on wgpu (Mesa's software driver in CI) against
    /// burn-optim's AdamW on the CPU, from the same parameters and gradients, two of them
    /// scaled (clipping's factor: `mul_scalar` then burn-optim's step on the CPU): parameters
    /// and both moments agree to float rounding, the step count too; the CPU's tensors are
    /// left to burn-optim (no kernel for them).
    #[test]
    fn fused_adamw_steps_equal_burn_optims_adamw_on_the_cpu() {
        let Some(gpu) = wgpu("fused_adamw_steps_equal_burn_optims_adamw_on_the_cpu") else {
            return;
        };
        let cpu = Device::flex();
        let (hyper, burn) = adamw_pair();
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(3);
        let shape = [7, 33];
        let mut random = |scale: f32| -> Vec<f32> {
            (0..7 * 33)
                .map(|_| rng.random_range(-scale..scale))
                .collect()
        };
        let on =
            |v: &[f32], d: &Device| Tensor::<2>::from_data(TensorData::new(v.to_vec(), shape), d);
        let start = random(0.1);
        let (mut p_cpu, mut p_gpu) = (on(&start, &cpu), on(&start, &gpu));
        let (mut s_cpu, mut s_gpu) = (None, None);
        assert!(
            adamw_step(hyper, 1e-3, 1.0, &p_cpu, &p_cpu, None).is_none(),
            "the CPU runs burn-optim's AdamW"
        );
        for step in 0..4 {
            // gradients of mixed scales, one of them tiny (Adam divides by their root mean square)
            let scale = [1.0, 1e-3, 0.3, 1e-6][step];
            let g = random(scale);
            let lr = 1e-3 * (step + 1) as f64;
            let clip = [1.0, 0.37, 1.0, 2.5e-2][step];
            let (p, s) = burn.step(lr, p_cpu, on(&g, &cpu).mul_scalar(clip), s_cpu);
            let (q, t) = adamw_step(hyper, lr, clip, &p_gpu, &on(&g, &gpu), s_gpu.as_ref())
                .expect("a wgpu f32 tensor takes the fused kernel");
            let s = s.unwrap();
            assert_eq!(s.momentum.time, t.momentum.time);
            for (what, a, b) in [
                ("parameters", &p, &q),
                ("first moment", &s.momentum.moment_1, &t.momentum.moment_1),
                ("second moment", &s.momentum.moment_2, &t.momentum.moment_2),
            ] {
                let diff = max_rel_diff(&values(a), &values(b));
                assert!(
                    diff < 1e-5,
                    "step {step}, {what}: relative difference {diff}"
                );
            }
            (p_cpu, s_cpu, p_gpu, s_gpu) = (p, Some(s), q, Some(t));
        }
        // the parameters moved: the comparison above was not of two unchanged tensors
        assert!(max_rel_diff(&start, &values(&p_cpu)) > 1e-3);
    }

    /// Grouped updates on wgpu (Mesa's software driver in CI) against burn-optim's AdamW on
    /// the CPU, two steps of six tensors from one element to more than the kernel's units
    /// (each unit then updates several elements): groups cut short by a change of clipping's
    /// factor and by the final flush, and in the second step a full group of four in which a
    /// tensor's first update goes beside the others' second ones. Parameters and moments agree
    /// to float rounding.
    #[test]
    fn grouped_adamw_updates_equal_burn_optims_adamw_on_the_cpu() {
        let Some(gpu) = wgpu("grouped_adamw_updates_equal_burn_optims_adamw_on_the_cpu") else {
            return;
        };
        let cpu = Device::flex();
        let (hyper, burn) = adamw_pair();
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(11);
        let sizes = [1, 7 * 33, ADAMW_UNITS * ADAMW_CUBES + 1_000, 384, 5, 1_536];
        let mut random = |n: usize, scale: f32| -> Vec<f32> {
            (0..n).map(|_| rng.random_range(-scale..scale)).collect()
        };
        let on = |v: &[f32], d: &Device| {
            Tensor::<1>::from_data(TensorData::new(v.to_vec(), [v.len()]), d)
        };
        let starts: Vec<Vec<f32>> = sizes.iter().map(|&n| random(n, 0.1)).collect();
        let mut cpu_params: Vec<_> = starts.iter().map(|v| on(v, &cpu)).collect();
        let mut gpu_params: Vec<_> = starts.iter().map(|v| on(v, &gpu)).collect();
        let (mut cpu_states, mut gpu_states) = (vec![None; 6], vec![None; 6]);
        let mut updates = AdamWUpdates::default();
        for step in 0..2 {
            let lr = 1e-3 * (step + 1) as f64;
            let mut next_cpu = Vec::new();
            let mut next_gpu = Vec::new();
            for (k, &n) in sizes.iter().enumerate() {
                let g = random(n, [1.0, 1e-3][step]);
                let clip = if k < 4 { 1.0 } else { 0.37 };
                // the fourth tensor's first update comes in the second step
                if step == 0 && k == 3 {
                    next_cpu.push((cpu_params[k].clone(), None));
                    next_gpu.push((gpu_params[k].clone(), None));
                    continue;
                }
                let (p, s) = burn.step(
                    lr,
                    cpu_params[k].clone(),
                    on(&g, &cpu).mul_scalar(clip),
                    cpu_states[k].take(),
                );
                let (q, t) = updates
                    .push(
                        hyper,
                        lr,
                        GradScale::Factor(clip),
                        &gpu_params[k],
                        &on(&g, &gpu),
                        gpu_states[k].as_ref(),
                    )
                    .expect("a wgpu f32 tensor takes the grouped kernel");
                next_cpu.push((p, s));
                next_gpu.push((q, Some(t)));
            }
            updates.flush();
            for (k, ((p, s), (q, t))) in next_cpu.into_iter().zip(next_gpu).enumerate() {
                if let (Some(s), Some(t)) = (&s, &t) {
                    assert_eq!(s.momentum.time, t.momentum.time);
                    for (what, a, b) in [
                        ("parameters", &p, &q),
                        ("first moment", &s.momentum.moment_1, &t.momentum.moment_1),
                        ("second moment", &s.momentum.moment_2, &t.momentum.moment_2),
                    ] {
                        let diff = max_rel_diff(&values(a), &values(b));
                        assert!(
                            diff < 1e-5,
                            "step {step}, tensor {k}, {what}: relative difference {diff}"
                        );
                    }
                }
                cpu_params[k] = p;
                gpu_params[k] = q;
                cpu_states[k] = s;
                gpu_states[k] = t;
            }
        }
        // every tensor moved: the comparisons above were not of unchanged tensors
        for (k, start) in starts.iter().enumerate() {
            assert!(
                max_rel_diff(start, &values(&cpu_params[k])) > 1e-4,
                "tensor {k}"
            );
        }
        assert_eq!(gpu_states[3].as_ref().unwrap().momentum.time, 1);
    }

    /// Clipping with the norm left on the device ([`DeviceClip`]) on wgpu (Mesa's software
    /// driver in CI) against burn-optim's AdamW on the CPU of the gradients scaled by the
    /// factor computed on the host from a naive f64 norm: five tensors (one element to several
    /// cubes' worth), two steps, one gradient's squares summed by burn's ops and handed over
    /// as the rest; bounds below the norm (gradients near AdamW's epsilon, where the factor
    /// shows) and above it (factor 1). burn's ops' factor, for the gradients the kernel does
    /// not take, is the host's too. A total that is NaN or infinite leaves parameters and
    /// moments as they were.
    #[test]
    fn clipping_on_the_device_equals_burn_optims_adamw_of_the_clipped_gradients() {
        let name = "clipping_on_the_device_equals_burn_optims_adamw_of_the_clipped_gradients";
        let Some(gpu) = wgpu(name) else {
            return;
        };
        if SquareTotal::on(&gpu).is_none() {
            return infembed_testkit::wgpu_missing(name, &"an adapter whose f32 atomics add")
                .unwrap_or(());
        }
        let cpu = Device::flex();
        let (hyper, burn) = adamw_pair();
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(17);
        let sizes = [1, 231, 1_536, 5, 70_001];
        let mut random = |n: usize, scale: f32| -> Vec<f32> {
            (0..n).map(|_| rng.random_range(-scale..scale)).collect()
        };
        let on = |v: &[f32], d: &Device| {
            Tensor::<1>::from_data(TensorData::new(v.to_vec(), [v.len()]), d)
        };
        let starts: Vec<Vec<f32>> = sizes.iter().map(|&n| random(n, 0.1)).collect();
        for (bound, clips) in [(1e-4f32, true), (1e4, false)] {
            let mut cpu_params: Vec<_> = starts.iter().map(|v| on(v, &cpu)).collect();
            let mut gpu_params: Vec<_> = starts.iter().map(|v| on(v, &gpu)).collect();
            let (mut cpu_states, mut gpu_states) = (vec![None; 5], vec![None; 5]);
            for step in 0..2 {
                let lr = 1e-3 * (step + 1) as f64;
                let grads: Vec<Vec<f32>> = sizes.iter().map(|&n| random(n, 1e-2)).collect();
                let naive: f64 = grads
                    .iter()
                    .flatten()
                    .map(|&x| f64::from(x) * f64::from(x))
                    .sum();
                let factor = (f64::from(bound) / (naive.sqrt() + 1e-6)).min(1.0);
                assert_eq!(factor < 1.0, clips, "bound {bound}: factor {factor}");
                let total = SquareTotal::on(&gpu).unwrap();
                let on_gpu: Vec<_> = grads.iter().map(|g| on(g, &gpu)).collect();
                // the last gradient's squares summed elsewhere (burn's ops), handed over
                assert!(total.add_all(on_gpu[..4].to_vec()).is_empty());
                let rest = on_gpu[4].clone().square().sum();
                let clip = total.into_clip(Some(rest), bound);
                let by_burn = f64::from(clip.factor::<1>().into_scalar::<f32>());
                assert!(
                    ((by_burn - factor) / factor).abs() < 1e-5,
                    "burn's ops' factor {by_burn} against the host's {factor}"
                );
                let mut updates = AdamWUpdates::default();
                for k in 0..sizes.len() {
                    let (p, s) = burn.step(
                        lr,
                        cpu_params[k].clone(),
                        on(&grads[k], &cpu).mul_scalar(factor),
                        cpu_states[k].take(),
                    );
                    let (q, t) = updates
                        .push(
                            hyper,
                            lr,
                            GradScale::Clip(&clip),
                            &gpu_params[k],
                            &on_gpu[k],
                            gpu_states[k].as_ref(),
                        )
                        .expect("a wgpu f32 tensor takes the grouped kernel");
                    cpu_params[k] = p;
                    cpu_states[k] = s;
                    gpu_params[k] = q;
                    gpu_states[k] = Some(t);
                }
                updates.flush();
                for k in 0..sizes.len() {
                    let (s, t) = (
                        cpu_states[k].as_ref().unwrap(),
                        gpu_states[k].as_ref().unwrap(),
                    );
                    for (what, a, b) in [
                        ("parameters", &cpu_params[k], &gpu_params[k]),
                        ("first moment", &s.momentum.moment_1, &t.momentum.moment_1),
                        ("second moment", &s.momentum.moment_2, &t.momentum.moment_2),
                    ] {
                        let diff = max_rel_diff(&values(a), &values(b));
                        assert!(
                            diff < 1e-5,
                            "bound {bound}, step {step}, tensor {k}, {what}: relative \
                             difference {diff}"
                        );
                    }
                }
            }
            // the parameters moved, and are finite
            assert!(max_rel_diff(&starts[2], &values(&cpu_params[2])) > 1e-4);
            for q in &gpu_params {
                assert!(values(q).iter().all(|x| x.is_finite()), "bound {bound}");
            }
        }

        // guarded by finite losses, the total is unchanged, to the bit
        let clip = SquareTotal(on(&[3.25], &gpu)).into_clip(None, 1.0);
        let guarded = clip.guard(&[on(&[2.5], &gpu), on(&[-1.0], &gpu)]);
        assert_eq!(values(guarded.total())[0].to_bits(), 3.25f32.to_bits());
        // a total that is not finite, or a loss that is not: no step
        for bad in [f32::NAN, f32::INFINITY, -f32::INFINITY] {
            let p = on(&starts[1], &gpu);
            let g = on(&random(231, 1.0), &gpu);
            let clip = if bad == -f32::INFINITY {
                let finite = SquareTotal(on(&[3.25], &gpu)).into_clip(None, 1.0);
                finite.guard(&[on(&[1.0], &gpu), on(&[bad], &gpu)])
            } else {
                SquareTotal(on(&[bad], &gpu)).into_clip(None, 1.0)
            };
            let mut updates = AdamWUpdates::default();
            let (p1, s1) = updates
                .push(hyper, 1e-3, GradScale::Factor(1.0), &p, &g, None)
                .expect("taken");
            updates.flush();
            let (p2, s2) = updates
                .push(hyper, 1e-3, GradScale::Clip(&clip), &p1, &g, Some(&s1))
                .expect("taken");
            let (p3, s3) = updates
                .push(hyper, 1e-3, GradScale::Clip(&clip), &p, &g, None)
                .expect("taken");
            updates.flush();
            assert_eq!(
                values(&p2),
                values(&p1),
                "total {bad}: the parameters moved"
            );
            assert_eq!(values(&s2.momentum.moment_1), values(&s1.momentum.moment_1));
            assert_eq!(values(&s2.momentum.moment_2), values(&s1.momentum.moment_2));
            assert_eq!(values(&p3), starts[1], "total {bad}, a first step");
            assert!(values(&s3.momentum.moment_1).iter().all(|&m| m == 0.0));
            assert!(values(&s3.momentum.moment_2).iter().all(|&v| v == 0.0));
        }
    }

    /// On wgpu (Mesa's software driver in CI) the squares of tensors of several shapes
    /// (one element, one cube's worth, more than the cubes' units in all, a transposed view
    /// flattened by a copy) summed into one total equal a naive f64 sum on the host; an f16
    /// tensor and a CPU tensor are declined.
    #[test]
    fn squares_summed_on_the_device_equal_a_naive_sum() {
        let Some(gpu) = wgpu("squares_summed_on_the_device_equal_a_naive_sum") else {
            return;
        };
        // lavapipe (CI's adapter) adds f32 atomically; another adapter may not (the norm then
        // takes burn's ops): skipped there, a failure under CI
        let Some(total) = SquareTotal::on(&gpu) else {
            return infembed_testkit::wgpu_missing(
                "squares_summed_on_the_device_equal_a_naive_sum",
                &"an adapter whose f32 atomics add",
            )
            .unwrap_or(());
        };
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(5);
        let mut expected = 0f64;
        for (rows, cols) in [(1, 1), (16, 16), (300, 1_000), (1_500, 384)] {
            let v: Vec<f32> = (0..rows * cols)
                .map(|_| rng.random_range(-1.0..1.0))
                .collect();
            expected += v.iter().map(|&x| f64::from(x) * f64::from(x)).sum::<f64>();
            let t = Tensor::<2>::from_data(TensorData::new(v, [rows, cols]), &gpu);
            let t = if rows == 16 { t.swap_dims(0, 1) } else { t };
            assert!(total.add(&t), "[{rows}, {cols}] is summed on the device");
        }
        let half = Tensor::<2>::zeros([2, 2], &gpu).cast(DType::F16);
        assert!(!total.add(&half), "an f16 tensor is declined");
        assert!(
            !total.add(&Tensor::<2>::ones([2, 2], &Device::flex())),
            "a CPU tensor"
        );
        let got = total.read();
        assert!(
            ((got - expected) / expected).abs() < 1e-5,
            "{got} against {expected}"
        );
        assert!(
            SquareTotal::on(&Device::flex()).is_none(),
            "the CPU sums with burn's ops"
        );
    }

    /// On wgpu, the squares of 19 gradients summed eight a launch ([`SquareTotal::add_all`]:
    /// a last launch with empty slots, sizes from none to several cubes' worth, in no order)
    /// equal a naive f64 sum on the host; an f16 gradient and a CPU one come back unsummed.
    #[test]
    fn squares_of_many_gradients_summed_eight_a_launch_equal_a_naive_sum() {
        let name = "squares_of_many_gradients_summed_eight_a_launch_equal_a_naive_sum";
        let gpu = match DeviceSpec::Wgpu(None).device() {
            Ok(d) => d,
            Err(e) => return infembed_testkit::wgpu_missing(name, &e).unwrap_or(()),
        };
        let Some(total) = SquareTotal::on(&gpu) else {
            return infembed_testkit::wgpu_missing(name, &"an adapter whose f32 atomics add")
                .unwrap_or(());
        };
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(9);
        let mut expected = 0f64;
        let mut grads = Vec::new();
        for i in 0..19usize {
            let n = [0, 1, 384, 5_000, 70_001][i % 5] + i;
            let v: Vec<f32> = (0..n).map(|_| rng.random_range(-1.0..1.0)).collect();
            expected += v.iter().map(|&x| f64::from(x) * f64::from(x)).sum::<f64>();
            grads.push(Tensor::<1>::from_data(TensorData::new(v, [n]), &gpu));
        }
        grads.insert(4, Tensor::<1>::ones([3], &gpu).cast(DType::F16));
        grads.insert(9, Tensor::<1>::ones([3], &Device::flex()));
        let rest = total.add_all(grads);
        assert_eq!(rest.len(), 2, "the f16 and the CPU gradients");
        assert!(rest.iter().all(|g| g.dims() == [3]));
        let got = total.read();
        assert!(
            ((got - expected) / expected).abs() < 1e-5,
            "{got} against {expected}"
        );
    }
}
