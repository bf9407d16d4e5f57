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
        }
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
    /// moments are not written before) and resets the gradients' factor to 1. To be called
    /// after every `step` of the handle's optimizer, before its parameters or state are used.
    pub(crate) fn finish_step(&self) {
        #[cfg(all(any(feature = "wgpu", feature = "cuda"), not(feature = "fusion")))]
        self.updates
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .flush();
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
    let optim = ModuleOptimizer::from(AdamW {
        handle: handle.clone(),
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
    });
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
        {
            let mut updates = self
                .handle
                .updates
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let fused = updates.push(self.hyper, lr, scale, &tensor, &grad, state.as_ref());
            if !self.grouped {
                updates.flush();
            }
            if let Some((tensor, state)) = fused {
                return (tensor, Some(state));
            }
        }
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
    if let Some(Some(total)) = &v.device_total {
        // eight gradients a launch; the ones the kernel does not take go to burn's ops
        for g in total.add_all(std::mem::take(&mut v.pending)) {
            v.add_with_burn(g);
        }
    }
    let sum = v.sum.map_or(0.0, |s| f64::from(s.into_scalar::<f32>()));
    #[cfg(all(any(feature = "wgpu", feature = "cuda"), not(feature = "fusion")))]
    let sum = sum + v.device_total.flatten().map_or(0.0, |t| t.read());
    sum.max(0.0).sqrt()
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

    /// On wgpu (Mesa's software driver in CI) the trainer's optimizer, whose updates wait to
    /// go four tensors a launch until `finish_step`, moves a linear layer's weights bit for bit
    /// as [`adamw`], which launches each tensor's update at once, over three steps with and
    /// without clipping's factor.
    #[cfg(all(any(feature = "wgpu", feature = "cuda"), not(feature = "fusion")))]
    #[test]
    fn the_trainers_grouped_updates_equal_adamws_own_on_a_gpu() {
        let gpu = match infembed_encoder::DeviceSpec::Wgpu(None).device() {
            Ok(d) => d.autodiff(),
            Err(e) => {
                return infembed_testkit::wgpu_missing(
                    "the_trainers_grouped_updates_equal_adamws_own_on_a_gpu",
                    &e,
                )
                .unwrap_or(());
            }
        };
        // three layers: seven parameter tensors, a group of four and one of three a step
        let layers: Vec<Linear> = [(5, 3), (3, 7), (7, 2)]
            .iter()
            .map(|&(i, o)| LinearConfig::new(i, o).init(&gpu))
            .collect();
        let x = Tensor::<2>::random([4, 5], burn::tensor::Distribution::Default, &gpu);
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
