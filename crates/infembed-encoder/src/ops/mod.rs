//! The operations the models call for their hot paths: [`linear`], [`linear_gelu`],
//! [`gelu`], [`dropout`], [`layer_norm`], padded [`attention`] and the BERT family's packed
//! [`self_attention`], with the packed layout ([`Packing`]) and head/mask glue they take.
//!
//! Each computes what the burn op of the same name computes. It first offers the work to the
//! CPU wing ([`crate::cpu`]), whose kernels take `f32` tensors of the `flex` backend and hand
//! anything else back, and otherwise runs burn's own op. This module is the one place that
//! branches on the backend (`flex` or another, autodiff or not): the models hold no backend
//! checks.

mod attention;
mod packing;

use burn::nn::{Dropout, LayerNorm, Linear};
use burn::prelude::*;
use burn::tensor::activation;

#[cfg(test)]
pub(crate) use attention::attention_with_dropout;
pub(crate) use attention::{
    FusedQkv, attention, key_padding_mask, merge_heads, self_attention, split_heads,
};
pub(crate) use packing::Packing;

use crate::cpu::elementwise::{try_dropout, try_gelu};
use crate::cpu::gemm::Activation;
use crate::cpu::linear::try_linear;
use crate::cpu::norm::try_layer_norm;

/// `layer.forward(x)`: `x W + b` over the last dimension of `x`.
///
/// # Shapes
/// - `x`: `[..., d_input]`
/// - output: `[..., d_output]`
pub(crate) fn linear<const D: usize>(layer: &Linear, x: Tensor<D>) -> Tensor<D> {
    try_linear(layer, x, Activation::Identity).unwrap_or_else(|x| layer.forward(x))
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
    if !module.training.is_enabled() || !x.device().is_autodiff() || module.prob == 0.0 {
        return x;
    }
    try_dropout(module, x).unwrap_or_else(|x| module.forward(x))
}

/// `module.forward(x)`, with `eps` the module's epsilon (burn keeps it private, so the caller
/// passes the value it configured the module with).
///
/// # Shapes
/// - `x`: `[..., d]`, `d` the module's width
/// - output: like `x`
pub(crate) fn layer_norm<const D: usize>(module: &LayerNorm, eps: f64, x: Tensor<D>) -> Tensor<D> {
    try_layer_norm(module, eps, x).unwrap_or_else(|x| module.forward(x))
}
