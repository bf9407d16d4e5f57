//! The optimizer side: burn-optim's AdamW, the learning-rate schedule, and global-norm
//! gradient clipping.

use burn::module::{Module, ModuleVisitor, Param};
use burn::optim::{
    AdamW as BurnAdamW, AdamWConfig, AdamWState, GradientsParams, LearningRate, ModuleOptimizer,
    Optimizer,
};
use burn::tensor::{Device, Tensor};

use crate::config::{OptimizerConfig, Schedule};

/// burn-optim's AdamW with the config's betas, epsilon and decoupled weight decay.
///
/// On the cubecl GPU devices (`wgpu`, `vulkan`, `cuda`; not in a `fusion` build) each
/// parameter tensor's update runs as one kernel launch with burn-optim's arithmetic instead of
/// its fourteen or so tensor operations; everywhere else (the CPU) it is burn-optim's AdamW
/// itself. Either way the state is burn-optim's `AdamWState`, so checkpoints are the same.
///
/// Clipping is not delegated to burn-optim: its `GradientClipping::Norm` clips each
/// parameter tensor on its own, while [`clip_global_norm`] scales all gradients together as
/// torch's `clip_grad_norm_` (and so sentence-transformers) does.
pub fn adamw(config: &OptimizerConfig) -> ModuleOptimizer {
    build_adamw(config, false).0
}

/// The trainer's handle on the optimizer of [`adamw_with_handle`]: the factor every gradient
/// is multiplied by in the next step (1 unless set: the trainer's clipping factor, applied as
/// each tensor is updated instead of by a pass over all gradients first; on a GPU inside the
/// update's kernel, one launch per parameter tensor saved; elsewhere by `mul_scalar`, the
/// values the pass would give), and on a GPU the updates that wait to be launched four
/// tensors at a time.
#[derive(Clone)]
pub(crate) struct StepHandle {
    grad_scale: std::sync::Arc<std::sync::atomic::AtomicU64>,
    #[cfg(all(any(feature = "wgpu", feature = "cuda"), not(feature = "fusion")))]
    updates: std::sync::Arc<std::sync::Mutex<crate::fused::AdamWUpdates>>,
    /// Clipping with the norm left on the device, for the next step (instead of the factor).
    #[cfg(all(any(feature = "wgpu", feature = "cuda"), not(feature = "fusion")))]
    clip: std::sync::Arc<std::sync::Mutex<Option<crate::fused::DeviceClip>>>,
}

impl std::fmt::Debug for StepHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StepHandle")
            .field("grad_scale", &self.grad_scale())
            .finish_non_exhaustive()
    }
}

impl StepHandle {
    fn new() -> Self {
        Self {
            grad_scale: std::sync::Arc::new(1f64.to_bits().into()),
            #[cfg(all(any(feature = "wgpu", feature = "cuda"), not(feature = "fusion")))]
            updates: Default::default(),
            #[cfg(all(any(feature = "wgpu", feature = "cuda"), not(feature = "fusion")))]
            clip: Default::default(),
        }
    }

    /// Clips the gradients of the next step by the norm `clip` holds on the device (its factor
    /// computed there: nothing is read back), instead of a factor.
    #[cfg(all(any(feature = "wgpu", feature = "cuda"), not(feature = "fusion")))]
    pub(crate) fn set_clip(&self, clip: crate::fused::DeviceClip) {
        *self
            .clip
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(clip);
    }

    #[cfg(all(any(feature = "wgpu", feature = "cuda"), not(feature = "fusion")))]
    fn clip(&self) -> Option<crate::fused::DeviceClip> {
        self.clip
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Multiplies the gradients of the next step by `factor`.
    pub(crate) fn set_grad_scale(&self, factor: f64) {
        self.grad_scale
            .store(factor.to_bits(), std::sync::atomic::Ordering::Relaxed);
    }

    fn grad_scale(&self) -> f64 {
        f64::from_bits(self.grad_scale.load(std::sync::atomic::Ordering::Relaxed))
    }

    /// Ends an optimizer step: launches the updates still waiting (the new parameters and
    /// moments are not written before) and resets the gradients' factor to 1 (and clipping on
    /// the device to none). To be called after every `step` of the handle's optimizer, before
    /// its parameters or state are used.
    pub(crate) fn finish_step(&self) {
        #[cfg(all(any(feature = "wgpu", feature = "cuda"), not(feature = "fusion")))]
        {
            self.updates
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .flush();
            *self
                .clip
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner) = None;
        }
        self.set_grad_scale(1.0);
    }
}

/// [`adamw`] whose GPU updates wait to go four tensors a launch, and its [`StepHandle`]
/// (whose `finish_step` must follow each step).
pub(crate) fn adamw_with_handle(config: &OptimizerConfig) -> (ModuleOptimizer, StepHandle) {
    build_adamw(config, true)
}

/// [`adamw`], its updates waiting for [`StepHandle::finish_step`] when `grouped`.
fn build_adamw(config: &OptimizerConfig, grouped: bool) -> (ModuleOptimizer, StepHandle) {
    let handle = StepHandle::new();
    let optim = ModuleOptimizer::from(AdamW::new(config, handle.clone(), grouped));
    (optim, handle)
}

/// [`adamw`]'s optimizer: burn-optim's AdamW, its update fused into one kernel (several
/// tensors a launch when `grouped`) on the cubecl devices.
#[derive(Clone)]
struct AdamW {
    burn: BurnAdamW,
    handle: StepHandle,
    #[cfg_attr(
        not(all(any(feature = "wgpu", feature = "cuda"), not(feature = "fusion"))),
        allow(dead_code)
    )]
    grouped: bool,
    #[cfg(all(any(feature = "wgpu", feature = "cuda"), not(feature = "fusion")))]
    hyper: crate::fused::AdamWHyper,
}

impl AdamW {
    fn new(config: &OptimizerConfig, handle: StepHandle, grouped: bool) -> Self {
        Self {
            handle,
            grouped,
            burn: AdamWConfig::new()
                .with_beta_1(config.beta1)
                .with_beta_2(config.beta2)
                .with_epsilon(config.epsilon)
                .with_weight_decay(config.weight_decay)
                .build(),
            #[cfg(all(any(feature = "wgpu", feature = "cuda"), not(feature = "fusion")))]
            hyper: crate::fused::AdamWHyper {
                beta_1: config.beta1,
                beta_2: config.beta2,
                epsilon: config.epsilon,
                weight_decay: config.weight_decay,
            },
        }
    }
}

impl Optimizer for AdamW {
    type State<const D: usize> = AdamWState<D>;

    fn step<const D: usize>(
        &self,
        lr: LearningRate,
        tensor: Tensor<D>,
        grad: Tensor<D>,
        state: Option<Self::State<D>>,
    ) -> (Tensor<D>, Option<Self::State<D>>) {
        let scale = self.handle.grad_scale();
        #[cfg(all(any(feature = "wgpu", feature = "cuda"), not(feature = "fusion")))]
        let grad = {
            let clip = self.handle.clip();
            let mut updates = self
                .handle
                .updates
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let by = match &clip {
                Some(clip) => crate::fused::GradScale::Clip(clip),
                None => crate::fused::GradScale::Factor(scale),
            };
            let fused = updates.push(self.hyper, lr, by, &tensor, &grad, state.as_ref());
            if !self.grouped {
                updates.flush();
            }
            if let Some((tensor, state)) = fused {
                return (tensor, Some(state));
            }
            // burn-optim's step, of the gradient times the factor computed by burn's ops, not
            // taken where the total is not finite (as the kernel does)
            match clip {
                Some(clip) => return self.clipped_by_burn(&clip, lr, tensor, grad, state),
                None => grad,
            }
        };
        let grad = if scale == 1.0 {
            grad
        } else {
            grad.mul_scalar(scale)
        };
        self.burn.step(lr, tensor, grad, state)
    }

    fn to_device<const D: usize>(state: Self::State<D>, device: &Device) -> Self::State<D> {
        BurnAdamW::to_device(state, device)
    }
}

#[cfg(all(any(feature = "wgpu", feature = "cuda"), not(feature = "fusion")))]
impl AdamW {
    /// burn-optim's step of the gradient times `clip`'s factor (burn's ops), for a tensor the
    /// kernel declines; where the total is NaN or infinite, the tensor and its moments as
    /// they were (zero moments before the first step), as the kernel leaves them.
    fn clipped_by_burn<const D: usize>(
        &self,
        clip: &crate::fused::DeviceClip,
        lr: LearningRate,
        tensor: Tensor<D>,
        grad: Tensor<D>,
        state: Option<AdamWState<D>>,
    ) -> (Tensor<D>, Option<AdamWState<D>>) {
        let device = grad.device();
        let shape = tensor.shape();
        let skip = clip.not_finite::<D>().to_device(&device).expand(shape);
        let factor = clip.factor::<D>().to_device(&device);
        let before = state
            .as_ref()
            .map(|s| (s.momentum.moment_1.clone(), s.momentum.moment_2.clone()));
        let (stepped, new) = self.burn.step(lr, tensor.clone(), grad * factor, state);
        let new = new.map(|s| {
            let (m, v) = before.unwrap_or_else(|| {
                let zeros = s.momentum.moment_1.zeros_like();
                (zeros.clone(), zeros)
            });
            let m = s.momentum.moment_1.mask_where(skip.clone(), m);
            let v = s.momentum.moment_2.mask_where(skip.clone(), v);
            AdamWState::new(burn::optim::AdaptiveMomentumState::new(
                s.momentum.time,
                m,
                v,
            ))
        });
        (stepped.mask_where(skip, tensor), new)
    }
}

/// Warm-up steps for `total` optimizer steps: `warmup_steps`, else `ceil(ratio * total)`.
pub fn warmup_steps(config: &OptimizerConfig, total: usize) -> usize {
    config
        .warmup_steps
        .unwrap_or_else(|| (config.warmup_ratio * total as f64).ceil() as usize)
}

/// The learning rate of optimizer step `step` (0-based) out of `total`, as Hugging Face's
/// `get_linear_schedule_with_warmup` / `get_constant_schedule_with_warmup` give it:
/// `lr * step / W` during the `W` warm-up steps, then `lr * (T - step) / (T - W)` (linear)
/// or `lr` (constant).
pub fn learning_rate(config: &OptimizerConfig, step: usize, total: usize) -> f64 {
    let w = warmup_steps(config, total);
    if step < w {
        return config.lr * step as f64 / w.max(1) as f64;
    }
    match config.schedule {
        Schedule::Constant => config.lr,
        Schedule::Linear => {
            let left = total.saturating_sub(step) as f64;
            let span = total.saturating_sub(w).max(1) as f64;
            config.lr * (left / span).max(0.0)
        }
    }
}

struct SquaredNorm<'a> {
    grads: &'a GradientsParams,
    sum: Option<Tensor<1>>,
    /// On a cubecl device, the squares summed by one kernel a gradient (None elsewhere, and
    /// until the first gradient says which device).
    #[cfg(all(any(feature = "wgpu", feature = "cuda"), not(feature = "fusion")))]
    device_total: Option<Option<crate::fused::SquareTotal>>,
    /// The gradients (flattened) whose squares the device total will sum, several a launch.
    #[cfg(all(any(feature = "wgpu", feature = "cuda"), not(feature = "fusion")))]
    pending: Vec<Tensor<1>>,
}

impl SquaredNorm<'_> {
    /// Adds the squares of `g` to the sum through burn's ops.
    fn add_with_burn<const D: usize>(&mut self, g: Tensor<D>) {
        let s = g.square().sum();
        self.sum = Some(match self.sum.take() {
            Some(acc) => acc + s,
            None => s,
        });
    }

    /// The device's total once the visit is over, the gradients waiting for it summed into it
    /// eight a launch, the ones its kernel does not take through burn's ops (into `sum`);
    /// `None` without a device total.
    #[cfg(all(any(feature = "wgpu", feature = "cuda"), not(feature = "fusion")))]
    fn device_total(&mut self) -> Option<crate::fused::SquareTotal> {
        let total = self.device_total.take().flatten()?;
        for g in total.add_all(std::mem::take(&mut self.pending)) {
            self.add_with_burn(g);
        }
        Some(total)
    }
}

impl ModuleVisitor for SquaredNorm<'_> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        if let Some(g) = self.grads.get::<D>(param.id) {
            #[cfg(all(any(feature = "wgpu", feature = "cuda"), not(feature = "fusion")))]
            {
                let total = self
                    .device_total
                    .get_or_insert_with(|| crate::fused::SquareTotal::on(&g.device()));
                if total.is_some() {
                    let n = g.shape().num_elements();
                    self.pending.push(g.reshape([n]));
                    return;
                }
            }
            self.add_with_burn(g);
        }
    }
}

struct Scale<'a> {
    grads: &'a mut GradientsParams,
    factor: f64,
}

impl ModuleVisitor for Scale<'_> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        if let Some(g) = self.grads.remove::<D>(param.id) {
            self.grads.register(param.id, g.mul_scalar(self.factor));
        }
    }
}

/// The global L2 norm of the gradients of `module`'s parameters.
pub fn global_norm<M: Module>(module: &M, grads: &GradientsParams) -> f64 {
    let mut v = SquaredNorm {
        grads,
        sum: None,
        #[cfg(all(any(feature = "wgpu", feature = "cuda"), not(feature = "fusion")))]
        device_total: None,
        #[cfg(all(any(feature = "wgpu", feature = "cuda"), not(feature = "fusion")))]
        pending: Vec::new(),
    };
    module.visit(&mut v);
    #[cfg(all(any(feature = "wgpu", feature = "cuda"), not(feature = "fusion")))]
    let device = v.device_total();
    let sum = v.sum.map_or(0.0, |s| f64::from(s.into_scalar::<f32>()));
    #[cfg(all(any(feature = "wgpu", feature = "cuda"), not(feature = "fusion")))]
    let sum = sum + device.map_or(0.0, |t| t.read());
    // NaN stays NaN (`max` would make it 0)
    if sum.is_nan() {
        sum
    } else {
        sum.max(0.0).sqrt()
    }
}

/// Multiplies every gradient of `module`'s parameters by `factor`.
pub fn scale_grads<M: Module>(module: &M, grads: &mut GradientsParams, factor: f64) {
    let mut v = Scale { grads, factor };
    module.visit(&mut v);
}

/// Scales the gradients so that their global L2 norm is at most `max_norm` (torch's
/// `clip_grad_norm_`, with its `1e-6` guard). Returns the norm before clipping.
pub fn clip_global_norm<M: Module>(module: &M, grads: &mut GradientsParams, max_norm: f32) -> f64 {
    let (norm, coef) = clip_factor(module, grads, max_norm);
    if coef < 1.0 {
        scale_grads(module, grads, coef);
    }
    norm
}

/// The gradients' global L2 norm and the factor [`clip_global_norm`] scales them by (1 when
/// the norm is within `max_norm`).
pub(crate) fn clip_factor<M: Module>(
    module: &M,
    grads: &GradientsParams,
    max_norm: f32,
) -> (f64, f64) {
    let norm = global_norm(module, grads);
    let coef = f64::from(max_norm) / (norm + 1e-6);
    (norm, coef.min(1.0))
}

/// Clipping of the gradients to the global norm `max_norm` with the norm left on `device`
/// (the factor computed by the optimizer's kernel, [`crate::fused::DeviceClip`]), where
/// `device` is a cubecl device whose f32 atomics add; `None` elsewhere (the CPU above all:
/// [`clip_factor`] reads the norm back).
#[cfg(all(any(feature = "wgpu", feature = "cuda"), not(feature = "fusion")))]
pub(crate) fn device_clip<M: Module>(
    module: &M,
    grads: &GradientsParams,
    max_norm: f32,
    device: &Device,
) -> Option<crate::fused::DeviceClip> {
    let total = crate::fused::SquareTotal::on(device)?;
    let mut v = SquaredNorm {
        grads,
        sum: None,
        device_total: Some(Some(total)),
        pending: Vec::new(),
    };
    module.visit(&mut v);
    let total = v.device_total()?;
    Some(total.into_clip(v.sum, max_norm))
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::nn::{Linear, LinearConfig};
    use burn::optim::GradientsParams;

    fn weights(m: &Linear) -> Vec<f32> {
        let mut v = m.weight.val().into_data().try_to_vec::<f32>().unwrap();
        v.extend(
            m.bias
                .as_ref()
                .unwrap()
                .val()
                .into_data()
                .try_to_vec::<f32>()
                .unwrap(),
        );
        v
    }

    /// Clipping's factor handed to the optimizer ([`StepHandle`]) moves the weights bit for
    /// bit as [`clip_global_norm`]'s pass over the gradients then the step did, over two
    /// steps (the moments carry the scaled gradients), and is 1 (no clipping) below the
    /// bound.
    #[test]
    fn the_optimizers_clipping_factor_equals_scaling_the_gradients_first() {
        let device = Device::flex().autodiff();
        let start = LinearConfig::new(5, 3).init(&device);
        let x = Tensor::<2>::random([4, 5], burn::tensor::Distribution::Default, &device);
        let grads_of = |m: &Linear| {
            let g = m
                .forward(x.clone())
                .powf_scalar(2.0)
                .sum()
                .mul_scalar(40.0)
                .backward();
            GradientsParams::from_grads(g, m)
        };
        let config = OptimizerConfig::default();
        let (mut plain, mut fused) = (adamw(&config), adamw_with_handle(&config));
        let (mut a, mut b) = (start.clone(), start);
        let mut clipped = 0;
        for max in [1.0f32, 0.5, 1e6] {
            let mut ga = grads_of(&a);
            let norm = clip_global_norm(&a, &mut ga, max);
            let gb = grads_of(&b);
            let (norm_b, factor) = clip_factor(&b, &gb, max);
            assert_eq!(norm.to_bits(), norm_b.to_bits());
            clipped += usize::from(factor < 1.0);
            fused.1.set_grad_scale(factor);
            a = plain.step(1e-2, a, ga);
            b = fused.0.step(1e-2, b, gb);
            fused.1.finish_step();
            assert_eq!(weights(&a), weights(&b), "bound {max}");
        }
        assert_eq!(clipped, 2, "the first two bounds clip");
    }

    /// The autodiff wgpu device (Mesa's software driver in CI), three linear layers on it
    /// (seven parameter tensors: a group of four and one of three a step) and an input
    /// `[4, 5]`; `None` (a skip, a failure under CI) without the device.
    #[cfg(all(any(feature = "wgpu", feature = "cuda"), not(feature = "fusion")))]
    fn three_layers_on_wgpu(test: &str) -> Option<(Device, Vec<Linear>, Tensor<2>)> {
        let gpu = match infembed_encoder::DeviceSpec::Wgpu(None).device() {
            Ok(d) => d.autodiff(),
            Err(e) => return infembed_testkit::wgpu_missing(test, &e),
        };
        let layers = [(5, 3), (3, 7), (7, 2)]
            .iter()
            .map(|&(i, o)| LinearConfig::new(i, o).init(&gpu))
            .collect();
        let x = Tensor::<2>::random([4, 5], burn::tensor::Distribution::Default, &gpu);
        Some((gpu, layers, x))
    }

    /// On wgpu (Mesa's software driver in CI) the trainer's optimizer, whose updates wait to
    /// go four tensors a launch until `finish_step`, moves a linear layer's weights bit for bit
    /// as [`adamw`], which launches each tensor's update at once, over three steps with and
    /// without clipping's factor.
    #[cfg(all(any(feature = "wgpu", feature = "cuda"), not(feature = "fusion")))]
    #[test]
    fn the_trainers_grouped_updates_equal_adamws_own_on_a_gpu() {
        let Some((_, layers, x)) =
            three_layers_on_wgpu("the_trainers_grouped_updates_equal_adamws_own_on_a_gpu")
        else {
            return;
        };
        let forward = |m: &[Linear]| {
            m.iter()
                .fold(x.clone(), |h, l| l.forward(h))
                .powf_scalar(2.0)
                .sum()
                .mul_scalar(40.0)
        };
        let grads_of = |m: &Vec<Linear>| GradientsParams::from_grads(forward(m).backward(), m);
        let config = OptimizerConfig::default();
        let (mut plain, (mut grouped, handle)) = (adamw(&config), adamw_with_handle(&config));
        let (mut a, mut b) = (layers.clone(), layers);
        for factor in [1.0, 0.25, 1.0] {
            let mut ga = grads_of(&a);
            scale_grads(&a, &mut ga, factor);
            let gb = grads_of(&b);
            handle.set_grad_scale(factor);
            a = plain.step(1e-2, a, ga);
            b = grouped.step(1e-2, b, gb);
            handle.finish_step();
            for (la, lb) in a.iter().zip(&b) {
                assert_eq!(weights(la), weights(lb), "factor {factor}");
            }
        }
    }

    /// On wgpu (Mesa's software driver in CI) the trainer's optimizer clipping with the norm
    /// left on the device ([`device_clip`], the factor computed by the update's kernel) moves
    /// the weights as the factor read back and handed over does ([`clip_factor`]), to float
    /// rounding (the kernel computes the factor in f32, the host in f64), over three bounds of
    /// which the first two clip; the CPU has no such clipping.
    #[cfg(all(any(feature = "wgpu", feature = "cuda"), not(feature = "fusion")))]
    #[test]
    fn clipping_on_the_device_moves_the_weights_as_the_factor_read_back() {
        let Some((gpu, layers, x)) = three_layers_on_wgpu(
            "clipping_on_the_device_moves_the_weights_as_the_factor_read_back",
        ) else {
            return;
        };
        let grads_of = |m: &Vec<Linear>| {
            let y = m.iter().fold(x.clone(), |h, l| l.forward(h));
            GradientsParams::from_grads(y.powf_scalar(2.0).sum().backward(), m)
        };
        let config = OptimizerConfig::default();
        let (mut read, read_handle) = adamw_with_handle(&config);
        let (mut kept, kept_handle) = adamw_with_handle(&config);
        let (mut a, mut b) = (layers.clone(), layers);
        let mut clipped = 0;
        // bounds far under the norm: the clipped gradients near AdamW's epsilon, where the
        // factor shows in the step
        for max in [1e-6f32, 1e-5, 1e6] {
            let (ga, gb) = (grads_of(&a), grads_of(&b));
            let (_, factor) = clip_factor(&a, &ga, max);
            clipped += usize::from(factor < 1.0);
            read_handle.set_grad_scale(factor);
            let clip = device_clip(&b, &gb, max, &gpu.clone().inner()).expect("wgpu clips there");
            kept_handle.set_clip(clip);
            a = read.step(1e-2, a, ga);
            b = kept.step(1e-2, b, gb);
            read_handle.finish_step();
            kept_handle.finish_step();
            for (la, lb) in a.iter().zip(&b) {
                assert!(weights(lb).iter().all(|w| w.is_finite()), "bound {max}");
                let diff = infembed_testkit::max_rel_diff(&weights(la), &weights(lb));
                assert!(diff < 1e-5, "bound {max}: relative difference {diff}");
            }
        }
        assert_eq!(clipped, 2, "the first two bounds clip");
        let cpu = Device::flex().autodiff();
        let layer = LinearConfig::new(2, 2).init(&cpu);
        let g = GradientsParams::from_grads(
            layer
                .forward(Tensor::<2>::ones([1, 2], &cpu))
                .sum()
                .backward(),
            &layer,
        );
        assert!(device_clip(&layer, &g, 1.0, &Device::flex()).is_none());
    }

    /// On wgpu (Mesa's software driver in CI), burn's ops clipping a tensor the kernel would
    /// decline (`clipped_by_burn`) give the kernel's parameters and moments over two steps
    /// (the first without moments), to float rounding; with a NaN total both leave the
    /// parameters as they were, and the moments (zeros before the first step).
    #[cfg(all(any(feature = "wgpu", feature = "cuda"), not(feature = "fusion")))]
    #[test]
    fn burns_ops_clip_a_declined_tensor_as_the_kernel_does_on_a_gpu() {
        use crate::fused::{AdamWUpdates, GradScale, SquareTotal};
        let name = "burns_ops_clip_a_declined_tensor_as_the_kernel_does_on_a_gpu";
        let gpu = match infembed_encoder::DeviceSpec::Wgpu(None).device() {
            Ok(d) => d,
            Err(e) => return infembed_testkit::wgpu_missing(name, &e).unwrap_or(()),
        };
        if SquareTotal::on(&gpu).is_none() {
            return infembed_testkit::wgpu_missing(name, &"an adapter whose f32 atomics add")
                .unwrap_or(());
        }
        let adamw = AdamW::new(&OptimizerConfig::default(), StepHandle::new(), false);
        let random = |scale: f32| {
            Tensor::<2>::random(
                [7, 33],
                burn::tensor::Distribution::Uniform(-f64::from(scale), f64::from(scale)),
                &gpu,
            )
        };
        let values = |t: &Tensor<2>| {
            t.clone()
                .into_data()
                .convert::<f32>()
                .try_to_vec::<f32>()
                .unwrap()
        };
        let clip_of = |g: &Tensor<2>, poison: bool| {
            let total = SquareTotal::on(&gpu).unwrap();
            let g = if poison {
                g.clone().mul_scalar(f32::NAN)
            } else {
                g.clone()
            };
            assert!(total.add(&g));
            total.into_clip(None, 1e-4)
        };
        let p0 = random(0.1);
        let (mut p_kernel, mut p_burn) = (p0.clone(), p0.clone());
        let (mut s_kernel, mut s_burn) = (None, None);
        for step in 0..2 {
            let g = random(1e-2);
            let clip = clip_of(&g, false);
            let mut updates = AdamWUpdates::default();
            let (q, t) = updates
                .push(
                    adamw.hyper,
                    1e-2,
                    GradScale::Clip(&clip),
                    &p_kernel,
                    &g,
                    s_kernel.as_ref(),
                )
                .expect("the kernel takes a wgpu f32 tensor");
            updates.flush();
            let (r, u) = adamw.clipped_by_burn(&clip, 1e-2, p_burn.clone(), g.clone(), s_burn);
            let u = u.expect("a state");
            for (what, a, b) in [
                ("parameters", &q, &r),
                ("first moment", &t.momentum.moment_1, &u.momentum.moment_1),
                ("second moment", &t.momentum.moment_2, &u.momentum.moment_2),
            ] {
                let diff = infembed_testkit::max_rel_diff(&values(a), &values(b));
                assert!(
                    diff < 1e-5,
                    "step {step}, {what}: relative difference {diff}"
                );
            }
            (p_kernel, s_kernel, p_burn, s_burn) = (q, Some(t), r, Some(u));
        }
        assert!(infembed_testkit::max_rel_diff(&values(&p0), &values(&p_burn)) > 1e-4);
        // a NaN total: nothing moves
        let g = random(1e-2);
        let clip = clip_of(&g, true);
        let (r, u) = adamw.clipped_by_burn(&clip, 1e-2, p_burn.clone(), g.clone(), s_burn.clone());
        let (u, s) = (u.unwrap(), s_burn.unwrap());
        assert_eq!(values(&r), values(&p_burn));
        assert_eq!(values(&u.momentum.moment_1), values(&s.momentum.moment_1));
        assert_eq!(values(&u.momentum.moment_2), values(&s.momentum.moment_2));
        let (r, u) = adamw.clipped_by_burn(&clip, 1e-2, p0.clone(), g, None);
        let u = u.unwrap();
        assert_eq!(values(&r), values(&p0));
        assert!(values(&u.momentum.moment_1).iter().all(|&m| m == 0.0));
        assert!(values(&u.momentum.moment_2).iter().all(|&v| v == 0.0));
    }

    #[test]
    fn schedule_matches_the_hugging_face_formula() {
        let mut cfg = OptimizerConfig {
            warmup_steps: Some(10),
            ..OptimizerConfig::default()
        };
        let lr = cfg.lr;
        assert_eq!(learning_rate(&cfg, 0, 110), 0.0);
        assert!((learning_rate(&cfg, 5, 110) - lr * 0.5).abs() < 1e-15);
        assert!((learning_rate(&cfg, 10, 110) - lr).abs() < 1e-15);
        assert!((learning_rate(&cfg, 60, 110) - lr * 0.5).abs() < 1e-15);
        assert_eq!(learning_rate(&cfg, 110, 110), 0.0);
        cfg.warmup_steps = None;
        assert_eq!(learning_rate(&cfg, 0, 4), lr);
        assert!((learning_rate(&cfg, 3, 4) - lr / 4.0).abs() < 1e-15);
        cfg.schedule = Schedule::Constant;
        assert_eq!(learning_rate(&cfg, 3, 4), lr);
        cfg.warmup_ratio = 0.1;
        assert_eq!(warmup_steps(&cfg, 25), 3);
    }
}
