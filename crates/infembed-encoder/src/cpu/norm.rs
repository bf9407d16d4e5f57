//! LayerNorm as one autodiff operation on the CPU `flex` backend.
//!
//! burn 0.22's `flex` backend has a fused LayerNorm for inference, but on an autodiff device
//! `LayerNorm::forward` is spelled out (mean, variance, subtraction, division, scale, shift), each
//! a graph node that allocates its output and has its own backward step. [`try_layer_norm`] computes
//! the same function in one pass per row and registers one backward step
//! (`dx = rstd (g γ - mean(g γ) - x̂ mean(g γ x̂))`, `dγ = Σ g x̂`, `dβ = Σ g`), keeping only the
//! normalized input and the reciprocal standard deviations. Plain devices, other backends and
//! other dtypes are handed back to [`crate::ops`], which runs `LayerNorm::forward`.

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::NoCheckpointing;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::flex::FlexTensor;
use burn::backend::{Autodiff, Flex};
use burn::nn::LayerNorm;
use burn::prelude::*;
use burn::tensor::{DType, TensorData};
use rayon::prelude::*;

use crate::cpu::elementwise::contiguous;

/// Rows per parallel task (and per partial sum of the parameter gradients, added in order so
/// the result does not depend on thread scheduling).
const ROWS: usize = 64;

/// `module.forward(x)` as one autodiff operation, with `eps` the module's epsilon (burn keeps it
/// private, so the caller passes the value it configured the module with), when `x` and the
/// parameters are `f32` tensors of the autodiff `flex` backend; anything else (plain devices
/// included, where burn's own LayerNorm is fused) is handed back as `Err(x)`.
///
/// # Shapes
/// - `x`: `[..., d]`, `d` the module's width
/// - output: like `x`
pub(crate) fn try_layer_norm<const D: usize>(
    module: &LayerNorm,
    eps: f64,
    x: Tensor<D>,
) -> Result<Tensor<D>, Tensor<D>> {
    if !x.device().is_autodiff() || x.dtype() != DType::F32 {
        return Err(x);
    }
    let gamma = module.gamma.val();
    let beta = module.beta.as_ref().map(|b| b.val());
    if gamma.dtype() != DType::F32 || beta.as_ref().is_some_and(|b| b.dtype() != DType::F32) {
        return Err(x);
    }
    let (Ok(xa), Ok(ga)) = (
        x.clone().try_into_primitive::<Autodiff<Flex>>(),
        gamma.try_into_primitive::<Autodiff<Flex>>(),
    ) else {
        return Err(x);
    };
    let ba = match beta.map(|b| b.try_into_primitive::<Autodiff<Flex>>()) {
        None => None,
        Some(Ok(b)) => Some(b),
        Some(Err(_)) => return Err(x),
    };
    drop(x);
    let xf = contiguous(xa.primitive().clone());
    let gf = contiguous(ga.primitive().clone());
    let bf = ba.as_ref().map(|b| contiguous(b.primitive().clone()));
    let (out, state) = forward(&xf, &gf, bf.as_ref(), eps as f32);
    let result = match &ba {
        Some(b) => match NormBackward
            .prepare::<NoCheckpointing>([xa.node(), ga.node(), b.node()])
            .compute_bound()
            .stateful()
        {
            OpsKind::Tracked(prep) => prep.finish(state, out),
            OpsKind::UnTracked(prep) => prep.finish(out),
        },
        None => match NormBackward
            .prepare::<NoCheckpointing>([xa.node(), ga.node()])
            .compute_bound()
            .stateful()
        {
            OpsKind::Tracked(prep) => prep.finish(state, out),
            OpsKind::UnTracked(prep) => prep.finish(out),
        },
    };
    Ok(Tensor::from_primitive::<Autodiff<Flex>>(result))
}

/// What the backward step keeps.
#[derive(Debug, Clone)]
struct NormState {
    /// The normalized input `x̂`, row-major `[rows, d]`.
    xhat: Vec<f32>,
    /// `1 / sqrt(var + eps)` per row.
    rstd: Vec<f32>,
    gamma: Vec<f32>,
    shape: Vec<usize>,
}

/// The autodiff step of [`try_layer_norm`].
#[derive(Debug)]
struct NormBackward;

fn forward(
    x: &FlexTensor,
    gamma: &FlexTensor,
    beta: Option<&FlexTensor>,
    eps: f32,
) -> (FlexTensor, NormState) {
    let shape = x.layout().shape().to_vec();
    let d = *shape
        .last()
        .expect("layer_norm: the input has at least one dimension");
    let n = x.layout().num_elements();
    let rows = n / d.max(1);
    let xs = &x.storage::<f32>()[..n];
    let g = &gamma.storage::<f32>()[..d];
    let b = beta.map(|b| &b.storage::<f32>()[..d]);
    let mut out = vec![0f32; n];
    let mut xhat = vec![0f32; n];
    let mut rstd = vec![0f32; rows];
    out.par_chunks_mut(ROWS * d)
        .zip(xhat.par_chunks_mut(ROWS * d))
        .zip(rstd.par_chunks_mut(ROWS))
        .zip(xs.par_chunks(ROWS * d))
        .for_each(|(((o, h), r), x)| {
            for (((orow, hrow), rs), xrow) in o
                .chunks_exact_mut(d)
                .zip(h.chunks_exact_mut(d))
                .zip(r.iter_mut())
                .zip(x.chunks_exact(d))
            {
                let mean = xrow.iter().sum::<f32>() / d as f32;
                let var = xrow.iter().map(|v| (v - mean) * (v - mean)).sum::<f32>() / d as f32;
                *rs = 1.0 / (var + eps).sqrt();
                for (j, ((ov, hv), &xv)) in
                    orow.iter_mut().zip(hrow.iter_mut()).zip(xrow).enumerate()
                {
                    *hv = (xv - mean) * *rs;
                    *ov = *hv * g[j] + b.map_or(0.0, |b| b[j]);
                }
            }
        });
    let state = NormState {
        xhat,
        rstd,
        gamma: g.to_vec(),
        shape: shape.clone(),
    };
    (FlexTensor::from_data(TensorData::new(out, shape)), state)
}

/// `(dx, dγ, dβ)` for the output gradient `grad`.
fn gradients(grad: FlexTensor, st: &NormState) -> (FlexTensor, FlexTensor, FlexTensor) {
    let grad = contiguous(grad);
    let d = st.gamma.len();
    let n = st.xhat.len();
    let gs = &grad.storage::<f32>()[..n];
    let mut dx = vec![0f32; n];
    // per block of rows: (dγ partial, dβ partial)
    let partials: Vec<(Vec<f32>, Vec<f32>)> = dx
        .par_chunks_mut(ROWS * d)
        .zip(gs.par_chunks(ROWS * d))
        .zip(st.xhat.par_chunks(ROWS * d))
        .zip(st.rstd.par_chunks(ROWS))
        .map(|(((dxb, gb), hb), rb)| {
            let (mut dg, mut db) = (vec![0f32; d], vec![0f32; d]);
            for (((dxrow, grow), hrow), &rs) in dxb
                .chunks_exact_mut(d)
                .zip(gb.chunks_exact(d))
                .zip(hb.chunks_exact(d))
                .zip(rb)
            {
                let (mut m1, mut m2) = (0f32, 0f32);
                for j in 0..d {
                    let gh = grow[j] * st.gamma[j];
                    m1 += gh;
                    m2 += gh * hrow[j];
                    dg[j] += grow[j] * hrow[j];
                    db[j] += grow[j];
                }
                let (m1, m2) = (m1 / d as f32, m2 / d as f32);
                for j in 0..d {
                    dxrow[j] = rs * (grow[j] * st.gamma[j] - m1 - hrow[j] * m2);
                }
            }
            (dg, db)
        })
        .collect();
    let (mut dgamma, mut dbeta) = (vec![0f32; d], vec![0f32; d]);
    for (pg, pb) in &partials {
        dgamma.iter_mut().zip(pg).for_each(|(a, b)| *a += b);
        dbeta.iter_mut().zip(pb).for_each(|(a, b)| *a += b);
    }
    (
        FlexTensor::from_data(TensorData::new(dx, st.shape.clone())),
        FlexTensor::from_data(TensorData::new(dgamma, vec![d])),
        FlexTensor::from_data(TensorData::new(dbeta, vec![d])),
    )
}

impl Backward<Flex, 3> for NormBackward {
    type State = NormState;

    fn backward(self, ops: Ops<NormState, 3>, grads: &mut Gradients, _: &mut Checkpointer) {
        let g = grads.consume::<Flex>(&ops.node);
        let (dx, dg, db) = gradients(g, &ops.state);
        let [px, pg, pb] = ops.parents;
        for (parent, grad) in [(px, dx), (pg, dg), (pb, db)] {
            if let Some(node) = parent {
                grads.register::<Flex>(node.id, grad);
            }
        }
    }
}

impl Backward<Flex, 2> for NormBackward {
    type State = NormState;

    fn backward(self, ops: Ops<NormState, 2>, grads: &mut Gradients, _: &mut Checkpointer) {
        let g = grads.consume::<Flex>(&ops.node);
        let (dx, dg, _) = gradients(g, &ops.state);
        let [px, pg] = ops.parents;
        for (parent, grad) in [(px, dx), (pg, dg)] {
            if let Some(node) = parent {
                grads.register::<Flex>(node.id, grad);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::layer_norm;
    use burn::nn::LayerNormConfig;
    use burn::tensor::Distribution;

    fn values<const D: usize>(t: Tensor<D>) -> Vec<f32> {
        t.into_data().try_to_vec::<f32>().expect("f32 tensor")
    }

    /// Values and the gradients of the input, γ and β equal burn's spelled-out LayerNorm.
    #[test]
    fn matches_burn_layer_norm_values_and_gradients() {
        let _rng = crate::rng_lock();
        let device = Device::flex().autodiff();
        device.seed(4);
        for bias in [true, false] {
            let eps = 1e-12;
            let mut module = LayerNormConfig::new(24)
                .with_epsilon(eps)
                .with_bias(bias)
                .init(&device);
            // a non-trivial γ
            module.gamma = module
                .gamma
                .map(|g| g.random_like(Distribution::Normal(1.0, 0.3)).require_grad());
            let x0 = Tensor::<3>::random([3, 70, 24], Distribution::Normal(0.5, 2.0), &device);
            let w = Tensor::<3>::random([3, 70, 24], Distribution::Normal(0.0, 1.0), &device);
            let run = |ours: bool| {
                let x = x0.clone().detach().require_grad();
                let y = if ours {
                    layer_norm(&module, eps, x.clone())
                } else {
                    module.forward(x.clone())
                };
                let grads = (y.clone() * w.clone()).sum().backward();
                let mut out = vec![
                    values(y),
                    values(x.grad(&grads).expect("dx")),
                    values(module.gamma.grad(&grads).expect("dgamma")),
                ];
                if let Some(b) = &module.beta {
                    out.push(values(b.grad(&grads).expect("dbeta")));
                }
                out
            };
            let (ours, want) = (run(true), run(false));
            assert_eq!(ours.len(), want.len());
            for (what, (a, e)) in ["y", "dx", "dgamma", "dbeta"]
                .iter()
                .zip(ours.iter().zip(&want))
            {
                let diff = a
                    .iter()
                    .zip(e)
                    .map(|(x, y)| (x - y).abs() / y.abs().max(1.0))
                    .fold(0.0, f32::max);
                assert!(diff < 2e-5, "bias {bias}: {what} differs by {diff}");
            }
        }
    }
}
