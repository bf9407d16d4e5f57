//! The operations the models call for their hot paths: [`linear`], [`linear_gelu`],
//! [`gelu`], [`dropout`], [`layer_norm`] (and [`add_layer_norm`] of a residual sum), padded
//! [`attention`] and the BERT family's packed
//! [`self_attention`], with the packed layout ([`Packing`]) and head/mask glue they take.
//!
//! Each computes what the burn op of the same name computes. It first offers the work to the
//! CPU wing ([`crate::cpu`]), whose kernels take `f32` tensors of the `flex` backend, then, in
//! builds with a cubecl device (`wgpu`, `vulkan`, `cuda`) and without `fusion`, to this
//! project's cubecl kernels (`blocked` and `routed` for the products, the `cube_*` modules for
//! LayerNorm, bias + GELU, the masked softmax, dropout, the bias gradients and the packing's
//! gathers, forward and backward), each handing back what it does not take, and otherwise runs
//! burn's own op. This module is the one place that branches on the backend (`flex` or
//! another, autodiff or not): the models hold no backend checks.

mod attention;
#[cfg(all(any(feature = "wgpu", feature = "cuda"), not(feature = "fusion")))]
pub(crate) mod blocked;
#[cfg(all(any(feature = "wgpu", feature = "cuda"), not(feature = "fusion")))]
mod cube_dropout;
#[cfg(all(any(feature = "wgpu", feature = "cuda"), not(feature = "fusion")))]
mod cube_embed;
#[cfg(all(any(feature = "wgpu", feature = "cuda"), not(feature = "fusion")))]
mod cube_gelu;
#[cfg(all(any(feature = "wgpu", feature = "cuda"), not(feature = "fusion")))]
mod cube_kit;
#[cfg(all(any(feature = "wgpu", feature = "cuda"), not(feature = "fusion")))]
mod cube_norm;
#[cfg(all(any(feature = "wgpu", feature = "cuda"), not(feature = "fusion")))]
pub(crate) mod cube_rows;
#[cfg(all(any(feature = "wgpu", feature = "cuda"), not(feature = "fusion")))]
pub(crate) mod cube_softmax;
#[cfg(all(any(feature = "wgpu", feature = "cuda"), not(feature = "fusion")))]
pub(crate) mod cube_sum;
mod packing;
// `try_linear` hands the caller's tensor back as its `Err`, as the CPU wing's kernels do
#[allow(clippy::result_large_err)]
#[cfg(all(any(feature = "wgpu", feature = "cuda"), not(feature = "fusion")))]
pub(crate) mod routed;

use burn::nn::{Dropout, Embedding, LayerNorm, Linear};
use burn::prelude::*;
use burn::tensor::activation;

#[cfg(test)]
pub(crate) use attention::attention_with_dropout;
pub(crate) use attention::{
    FusedQkv, attention, key_padding_mask, merge_heads, self_attention, split_heads,
};
pub(crate) use packing::{Lookup, Packing};

use std::sync::{Arc, Mutex, PoisonError};

use crate::cpu::elementwise::{try_dropout, try_gelu};
use crate::cpu::gemm::Activation;
use crate::cpu::linear::{Float, QuantLinear, try_linear, try_linear_in, try_linear_quant};
use crate::cpu::norm::try_layer_norm;
use crate::device::Quantization;
use crate::routine::MatmulRoutine;

/// The rows of `table` that `rows` names: `table.forward(ids)`. On an autodiff graph of
/// cubecl tensors whose ids the host holds, one gather whose backward step sums the gradient
/// rows of each id in parallel ([`cube_embed`]) instead of burn's scatter, which walks every
/// row with one unit per column; the same values (and on the CPU the same operations) as
/// burn's embedding.
///
/// # Shapes
/// - `table`: `[V, d]`
/// - `rows.ids`: `[T]`
/// - output: `[T, d]`
pub(crate) fn embedding(table: &Embedding, rows: &Lookup) -> Tensor<2> {
    #[cfg(all(any(feature = "wgpu", feature = "cuda"), not(feature = "fusion")))]
    if let Some(host) = &rows.host
        && let Some(y) = cube_embed::try_lookup(&table.weight.val(), &rows.ids, host)
    {
        return y;
    }
    let [t] = rows.ids.dims();
    let d = table.weight.dims()[1];
    table
        .forward(rows.ids.clone().unsqueeze::<2>())
        .reshape([t, d])
}

/// `layer.forward(x)`: `x W + b` over the last dimension of `x`.
///
/// # Shapes
/// - `x`: `[..., d_input]`
/// - output: `[..., d_output]`
pub(crate) fn linear<const D: usize>(layer: &Linear, x: Tensor<D>) -> Tensor<D> {
    try_linear(layer, x, Activation::Identity).unwrap_or_else(|x| layer.forward(x))
}

/// [`linear`] with its product through `routine` on a cubecl device ([`MatmulRoutine`]; burn's
/// `matmul` with [`MatmulRoutine::BURN`], and on every other device).
///
/// # Shapes
/// - `x`: `[..., d_input]`
/// - output: `[..., d_output]`
fn linear_routed<const D: usize>(
    layer: &Linear,
    x: Tensor<D>,
    routine: MatmulRoutine,
) -> Tensor<D> {
    try_routed(layer, x, routine, Activation::Identity).unwrap_or_else(|x| linear(layer, x))
}

/// Whether [`MatmulRoutine`]s other than `burn` route products on `device`: a cubecl device
/// (plain or autodiff) in a build without `fusion`.
pub(crate) fn routes_on(device: &burn::tensor::Device) -> bool {
    #[cfg(all(any(feature = "wgpu", feature = "cuda"), not(feature = "fusion")))]
    // an empty tensor: its backend answers without a kernel launch (zeros would fill it)
    return Tensor::<1>::empty([1], &device.clone().inner())
        .try_into_primitive::<burn::backend::Cube>()
        .is_ok();
    #[cfg(not(all(any(feature = "wgpu", feature = "cuda"), not(feature = "fusion"))))]
    {
        let _ = device;
        false
    }
}

/// `act(x W + b)` with the product through `routine` when it is one of cubek's and `x` is on
/// a cubecl device (`Err(x)` otherwise, and in builds without one).
#[allow(clippy::result_large_err)]
fn try_routed<const D: usize>(
    layer: &Linear,
    x: Tensor<D>,
    routine: MatmulRoutine,
    act: Activation,
) -> Result<Tensor<D>, Tensor<D>> {
    #[cfg(all(any(feature = "wgpu", feature = "cuda"), not(feature = "fusion")))]
    return routed::try_linear(layer, x, routine, act);
    #[cfg(not(all(any(feature = "wgpu", feature = "cuda"), not(feature = "fusion"))))]
    {
        let _ = (layer, routine, act);
        Err(x)
    }
}

/// `lhs · rhs` with the product (and, on an autodiff graph, its backward products) through
/// `routine` on a cubecl device ([`MatmulRoutine`]); burn's `matmul` with
/// [`MatmulRoutine::BURN`], on every other device, and in builds without a cubecl device.
///
/// # Shapes
/// - `lhs`: `[..., M, K]`
/// - `rhs`: `[..., K, N]`
/// - output: `[..., M, N]`
pub(crate) fn matmul_routed<const D: usize>(
    lhs: Tensor<D>,
    rhs: Tensor<D>,
    routine: MatmulRoutine,
) -> Tensor<D> {
    #[cfg(all(any(feature = "wgpu", feature = "cuda"), not(feature = "fusion")))]
    let (lhs, rhs) = match routed::try_matmul(lhs, rhs, routine) {
        Ok(y) => return y,
        Err(operands) => operands,
    };
    #[cfg(not(all(any(feature = "wgpu", feature = "cuda"), not(feature = "fusion"))))]
    let _ = routine;
    lhs.matmul(rhs)
}

/// Whether [`matmul_routed`] sends products of tensors like `t` through `routine` (a routine
/// other than `burn`, and a float tensor on a cubecl device).
pub(crate) fn routes_products<const D: usize>(routine: MatmulRoutine, t: &Tensor<D>) -> bool {
    #[cfg(all(any(feature = "wgpu", feature = "cuda"), not(feature = "fusion")))]
    return routed::routes(routine, t);
    #[cfg(not(all(any(feature = "wgpu", feature = "cuda"), not(feature = "fusion"))))]
    {
        let _ = (routine, t);
        false
    }
}

/// [`linear`] with its products (on the `flex` backend, forward and backward) in `float`.
fn linear_in<const D: usize>(layer: &Linear, x: Tensor<D>, float: Float) -> Tensor<D> {
    try_linear_in(layer, x, Activation::Identity, float).unwrap_or_else(|x| layer.forward(x))
}

/// `gelu(layer.forward(x))` with the exact (erf) GELU of [`gelu`] (fused into the product on
/// the `flex` backend).
///
/// # Shapes
/// - `x`: `[..., d_input]`
/// - output: `[..., d_output]`
pub(crate) fn linear_gelu<const D: usize>(layer: &Linear, x: Tensor<D>) -> Tensor<D> {
    try_linear(layer, x, Activation::Gelu).unwrap_or_else(|x| gelu(layer.forward(x)))
}

/// How a module's linear products compute: on the CPU (`flex`) at inference (plain tensors)
/// in `f32` or through int8 / bf16 products ([`Quantization`]), and in training (autodiff
/// tensors) in `f32` or, with `train_bf16`, through bf16 products with `f32` sums (forward
/// and both backward products; the parameters stay `f32`); on a cubecl device (`wgpu`,
/// `vulkan`, `cuda`) through the matrix-product routine `gpu_matmul`, at inference and in
/// training.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Products {
    /// The inference products.
    pub(crate) inference: Quantization,
    /// Whether training computes the products in bf16.
    pub(crate) train_bf16: bool,
    /// The routine of the products on a cubecl device.
    pub(crate) gpu_matmul: MatmulRoutine,
}

/// Weights a kernel prepares from a module's parameters (the attention's fused projections,
/// a layer's int8 weights), with the [`Products`] they are prepared for: kept by the module
/// that owns the parameters (a `#[module(skip)]` field, shared by the module's clones), built
/// once and rebuilt only when the parameters are no longer those they were built from (a new
/// model after an optimizer step, a load, a move to another device) or the mode changes.
/// Neither trained nor saved.
pub(crate) struct Prepared<T>(Arc<Mutex<(Products, Option<Arc<T>>)>>);

impl<T> Clone for Prepared<T> {
    fn clone(&self) -> Self {
        Self(Arc::clone(&self.0))
    }
}

impl<T> Default for Prepared<T> {
    fn default() -> Self {
        Self(Arc::new(Mutex::new((Products::default(), None))))
    }
}

impl<T> std::fmt::Debug for Prepared<T> {
    // prepared weights are as large as the parameters: say only whether they are there
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let slot = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        f.debug_struct("Prepared")
            .field("products", &slot.0)
            .field("prepared", &slot.1.is_some())
            .finish()
    }
}

impl<T> Prepared<T> {
    /// Prepares for `products` from now on, in a slot of its own: clones of the module made
    /// before keep computing as they did (what was prepared before is dropped here).
    pub(crate) fn set_mode(&mut self, products: Products) {
        self.0 = Arc::new(Mutex::new((products, None)));
    }

    /// How the products compute now.
    pub(crate) fn products(&self) -> Products {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).0
    }

    /// The float type of the products on an autodiff graph.
    fn train_float(&self) -> Float {
        if self.products().train_bf16 {
            Float::Bf16
        } else {
            Float::F32
        }
    }

    /// The prepared value when `fresh` says it still holds, else `build(inference products)`
    /// (kept; `None` when it cannot be built).
    pub(crate) fn get_or_build(
        &self,
        fresh: impl FnOnce(&T) -> bool,
        build: impl FnOnce(Quantization) -> Option<T>,
    ) -> Option<Arc<T>> {
        let mut slot = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(w) = slot.1.as_ref().filter(|w| fresh(w)) {
            return Some(Arc::clone(w));
        }
        let w = Arc::new(build(slot.0.inference)?);
        slot.1 = Some(Arc::clone(&w));
        Some(w)
    }
}

/// How one linear layer computes ([`Products`]), with its int8 or bf16 weights when it
/// computes in one of them at inference ([`Prepared`]).
pub(crate) type QuantSlot = Prepared<QuantLinear>;

impl QuantSlot {
    /// Computes `layer` with `products` from now on, its reduced-precision inference weights
    /// prepared now (when its parameters are plain `flex` `f32` tensors).
    pub(crate) fn set(&mut self, products: Products, layer: &Linear) {
        self.set_mode(products);
        self.weights(layer);
    }

    /// The int8 or bf16 weights of `layer` when it computes in one of them and its
    /// parameters are plain `flex` `f32` tensors (built now when missing or stale).
    fn weights(&self, layer: &Linear) -> Option<Arc<QuantLinear>> {
        self.get_or_build(
            |q| q.built_from(layer),
            |mode| QuantLinear::new(layer, mode),
        )
    }
}

/// [`linear`], through int8 or bf16 products when `slot` says so ([`Products`]): at inference
/// when `x` is a plain `flex` tensor, in bf16 training when it is on a `flex` autodiff graph.
///
/// # Shapes
/// - `x`: `[..., d_input]`
/// - output: `[..., d_output]`
pub(crate) fn linear_q<const D: usize>(
    layer: &Linear,
    slot: &QuantSlot,
    x: Tensor<D>,
) -> Tensor<D> {
    linear_act(layer, slot, x, Activation::Identity)
}

/// [`linear_gelu`], through int8 or bf16 products as [`linear_q`].
///
/// # Shapes
/// - `x`: `[..., d_input]`
/// - output: `[..., d_output]`
pub(crate) fn linear_gelu_q<const D: usize>(
    layer: &Linear,
    slot: &QuantSlot,
    x: Tensor<D>,
) -> Tensor<D> {
    linear_act(layer, slot, x, Activation::Gelu)
}

fn linear_act<const D: usize>(
    layer: &Linear,
    slot: &QuantSlot,
    x: Tensor<D>,
    act: Activation,
) -> Tensor<D> {
    let x = match try_routed(layer, x, slot.products().gpu_matmul, act) {
        Ok(y) => return y,
        Err(x) => x,
    };
    let x = if x.device().is_autodiff() {
        match slot.train_float() {
            Float::F32 => x,
            bf16 => match try_linear_in(layer, x, act, bf16) {
                Ok(y) => return y,
                Err(x) => x,
            },
        }
    } else {
        match slot.weights(layer) {
            Some(q) => match try_linear_quant(&q, x, act) {
                Ok(y) => return y,
                Err(x) => x,
            },
            None => x,
        }
    };
    match act {
        Activation::Identity => linear(layer, x),
        Activation::Gelu => linear_gelu(layer, x),
    }
}

/// Exact (erf) GELU, `x * Phi(x)`, as [`activation::gelu`], with its exact derivative.
///
/// burn 0.22's own GELU backward (`gelu_backward`, used by every backend without a kernel of
/// its own, the GPU ones included) differentiates the tanh approximation instead of the erf
/// forward it computes: about 1e-3 relative error in a BERT's gradients against PyTorch's.
/// With a graph, the fallback therefore composes `x (1 + erf(x / sqrt 2)) / 2` from
/// operations whose backward is exact (erf's is `2 / sqrt(pi) exp(-x^2)`).
pub(crate) fn gelu<const D: usize>(x: Tensor<D>) -> Tensor<D> {
    try_gelu(x).unwrap_or_else(|x| {
        if x.device().is_autodiff() {
            let phi = x
                .clone()
                .div_scalar(std::f64::consts::SQRT_2)
                .erf()
                .add_scalar(1.0);
            (x * phi).div_scalar(2.0)
        } else {
            activation::gelu(x)
        }
    })
}

/// `burn::nn::Dropout::forward` with the same contract: the identity unless the module is in
/// training mode on an autodiff device with `prob > 0`; otherwise each call draws one seed
/// from the device's generator and scales kept elements by `1 / (1 - prob)`.
pub(crate) fn dropout<const D: usize>(module: &Dropout, x: Tensor<D>) -> Tensor<D> {
    if !dropout_active(module, &x.device()) {
        return x;
    }
    // one kernel on a cubecl device, forward and backward, where burn's takes five launches
    #[cfg(all(any(feature = "wgpu", feature = "cuda"), not(feature = "fusion")))]
    let x = match cube_dropout::try_dropout(x, module.prob) {
        Ok(y) => return y,
        Err(x) => x,
    };
    try_dropout(module, x).unwrap_or_else(|x| module.forward(x))
}

/// Runs `f` (a forward pass) with its dropouts' keys drawn several at a time on a cubecl
/// device (one launch of the device's generator a pass where each dropout took one; the
/// draws in the same order, so a pass seeded alike draws the same masks); elsewhere `f`.
pub(crate) fn dropout_scope<T>(f: impl FnOnce() -> T) -> T {
    #[cfg(all(any(feature = "wgpu", feature = "cuda"), not(feature = "fusion")))]
    return cube_dropout::scope(f);
    #[cfg(not(all(any(feature = "wgpu", feature = "cuda"), not(feature = "fusion"))))]
    f()
}

/// `module.forward(x + residual)` ([`layer_norm`]): on a cubecl device (not in `fusion`
/// builds) the addition in the LayerNorm's own launch (forward and backward), elsewhere
/// burn's addition first.
///
/// # Shapes
/// - `x`, `residual`: `[..., d]`, `d` the module's width
/// - output: like `x`
pub(crate) fn add_layer_norm<const D: usize>(
    module: &LayerNorm,
    eps: f64,
    x: Tensor<D>,
    residual: Tensor<D>,
) -> Tensor<D> {
    #[cfg(all(any(feature = "wgpu", feature = "cuda"), not(feature = "fusion")))]
    let (x, residual) = match cube_norm::try_add_layer_norm(module, eps, x, residual) {
        Ok(y) => return y,
        Err(operands) => operands,
    };
    layer_norm(module, eps, x + residual)
}

/// The probability of `module`'s dropout on `device` when it is active (training mode on an
/// autodiff device, as [`dropout`] decides it) and one a kernel applies inside its own
/// launches (`0 < prob < 1`), else `None`.
#[cfg(all(any(feature = "wgpu", feature = "cuda"), not(feature = "fusion")))]
pub(crate) fn fused_dropout_prob(module: &Dropout, device: &Device) -> Option<f64> {
    (dropout_active(module, device) && module.prob < 1.0).then_some(module.prob)
}

/// Whether `module` drops anything on `device`: training mode on an autodiff device and
/// `prob > 0` ([`dropout`] is the identity otherwise).
pub(crate) fn dropout_active(module: &Dropout, device: &Device) -> bool {
    module.training.is_enabled() && device.is_autodiff() && module.prob > 0.0
}

/// `module.forward(dropout(x) + residual)` ([`dropout`], then [`add_layer_norm`]): on a cubecl
/// device in training (not in `fusion` builds) the dropout inside the LayerNorm's launches,
/// forward and backward, with the masks its own launches would draw; elsewhere the two
/// calls.
///
/// # Shapes
/// - `x`, `residual`: `[..., d]`, `d` the module's width
/// - output: like `x`
pub(crate) fn dropout_add_layer_norm<const D: usize>(
    drop: &Dropout,
    module: &LayerNorm,
    eps: f64,
    x: Tensor<D>,
    residual: Tensor<D>,
) -> Tensor<D> {
    #[cfg(all(any(feature = "wgpu", feature = "cuda"), not(feature = "fusion")))]
    let (x, residual) = match fused_dropout_prob(drop, &x.device()) {
        Some(prob) => match cube_norm::try_dropout_add_layer_norm(module, eps, x, residual, prob) {
            Ok(y) => return y,
            Err(operands) => operands,
        },
        None => (x, residual),
    };
    add_layer_norm(module, eps, dropout(drop, x), residual)
}

/// `module.forward(x)`, with `eps` the module's epsilon (burn keeps it private, so the caller
/// passes the value it configured the module with).
///
/// # Shapes
/// - `x`: `[..., d]`, `d` the module's width
/// - output: like `x`
pub(crate) fn layer_norm<const D: usize>(module: &LayerNorm, eps: f64, x: Tensor<D>) -> Tensor<D> {
    let x = match try_layer_norm(module, eps, x) {
        Ok(y) => return y,
        Err(x) => x,
    };
    // one kernel on a cubecl device, where burn spells it out in nine (in training with a
    // backward step of one kernel and two column sums)
    #[cfg(all(any(feature = "wgpu", feature = "cuda"), not(feature = "fusion")))]
    let x = match cube_norm::try_layer_norm(module, eps, x) {
        Ok(y) => return y,
        Err(x) => x,
    };
    module.forward(x)
}
