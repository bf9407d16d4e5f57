//! Linear layers through the crate's own matrix product ([`crate::cpu::gemm`]) on the CPU `flex`
//! backend, with the bias and (optionally) GELU fused into the product's epilogue.
//!
//! [`try_linear`] computes what [`Linear::forward`] computes, or `gelu(layer.forward(x))` with
//! [`Activation::Gelu`]; on an autodiff device it registers its own backward step (`dx = g Wᵀ`,
//! `dW = xᵀ g`, `db = Σ g`, each again through [`crate::cpu::gemm`]), so training uses the
//! faster product too. Every other case (another backend, another dtype, a checkpointing
//! autodiff) is handed back to [`crate::ops`], which runs burn's own ops.
//!
//! The results equal burn's to floating-point reassociation (the two products sum in a
//! different order); the tests compare values and gradients against burn's `Linear`.
//!
//! [`try_linear_in`] with [`Float::Bf16`] (mixed-precision training on a processor with
//! AVX512-BF16) runs the same three products through [`crate::cpu::qgemm`]'s bf16 kernel: each
//! operand rounded to bf16 as the product runs, sums in `f32`; the parameters, their
//! gradients, the bias sum and GELU stay `f32`.

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::NoCheckpointing;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::flex::FlexTensor;
use burn::backend::{Autodiff, Flex};
use burn::nn::Linear;
use burn::prelude::*;
use burn::tensor::{DType, TensorData};
use rayon::prelude::*;

use crate::cpu::elementwise::{self, contiguous};
use crate::cpu::gemm::{self, Activation, Epilogue, MatRef};
use crate::cpu::qgemm::{self, QuantizedMatrix};
use crate::device::Quantization;

/// The float type of a linear layer's products on the CPU (the operands; sums are `f32`
/// either way).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Float {
    /// `f32` operands ([`crate::cpu::gemm`]).
    F32,
    /// Operands rounded to bf16 ([`crate::cpu::qgemm`]'s AVX512-BF16 kernel; `f32` where the
    /// processor lacks it, which the dual encoder refuses before).
    Bf16,
}

/// `act(layer.forward(x))` through [`gemm`](crate::cpu::gemm) with the bias and activation in
/// the product's epilogue (and, on an autodiff device, this module's backward step), when `x`
/// and the layer's parameters are `f32` tensors of the `flex` backend (plain, or autodiff
/// without checkpointing). Anything else is handed back untouched as `Err(x)`, for
/// [`crate::ops`] to run burn's op.
///
/// # Shapes
/// - `x`: `[..., d_input]`
/// - output: `[..., d_output]`
pub(crate) fn try_linear<const D: usize>(
    layer: &Linear,
    x: Tensor<D>,
    act: Activation,
) -> Result<Tensor<D>, Tensor<D>> {
    try_linear_in(layer, x, act, Float::F32)
}

/// [`try_linear`] with the products, forward and backward, in `float`.
///
/// # Shapes
/// - `x`: `[..., d_input]`
/// - output: `[..., d_output]`
pub(crate) fn try_linear_in<const D: usize>(
    layer: &Linear,
    x: Tensor<D>,
    act: Activation,
    float: Float,
) -> Result<Tensor<D>, Tensor<D>> {
    let weight = layer.weight.val();
    let bias = layer.bias.as_ref().map(|b| b.val());
    let f32s = x.dtype() == DType::F32
        && weight.dtype() == DType::F32
        && bias.as_ref().is_none_or(|b| b.dtype() == DType::F32);
    if !f32s {
        return Err(x);
    }
    if x.device().is_autodiff() {
        let (Ok(xp), Ok(wp)) = (
            x.clone().try_into_primitive::<Autodiff<Flex>>(),
            weight.try_into_primitive::<Autodiff<Flex>>(),
        ) else {
            return Err(x);
        };
        let bp = match bias.map(|b| b.try_into_primitive::<Autodiff<Flex>>()) {
            None => None,
            Some(Ok(b)) => Some(b),
            Some(Err(_)) => return Err(x),
        };
        drop(x);
        let xf = xp.primitive().clone();
        let wf = wp.primitive().clone();
        let bf = bp.as_ref().map(|b| b.primitive().clone());
        let op = LinearBackward;
        let out = match &bp {
            Some(b) => match op
                .prepare::<NoCheckpointing>([xp.node(), wp.node(), b.node()])
                .compute_bound()
                .stateful()
            {
                OpsKind::Tracked(prep) => {
                    let (y, z) = forward_tracked(&xf, &wf, bf.as_ref(), act, float);
                    prep.finish(LinearState::new(xf, wf, z, float), y)
                }
                OpsKind::UnTracked(prep) => prep.finish(forward(&xf, &wf, bf.as_ref(), act, float)),
            },
            None => match op
                .prepare::<NoCheckpointing>([xp.node(), wp.node()])
                .compute_bound()
                .stateful()
            {
                OpsKind::Tracked(prep) => {
                    let (y, z) = forward_tracked(&xf, &wf, None, act, float);
                    prep.finish(LinearState::new(xf, wf, z, float), y)
                }
                OpsKind::UnTracked(prep) => prep.finish(forward(&xf, &wf, None, act, float)),
            },
        };
        return Ok(Tensor::from_primitive::<Autodiff<Flex>>(out));
    }
    let (Ok(xf), Ok(wf)) = (
        x.clone().try_into_primitive::<Flex>(),
        weight.try_into_primitive::<Flex>(),
    ) else {
        return Err(x);
    };
    let bf = match bias.map(|b| b.try_into_primitive::<Flex>()) {
        None => None,
        Some(Ok(b)) => Some(b),
        Some(Err(_)) => return Err(x),
    };
    drop(x);
    Ok(Tensor::from_primitive::<Flex>(forward(
        &xf,
        &wf,
        bf.as_ref(),
        act,
        float,
    )))
}

/// The plain `flex` tensors of `layers`' parameters (all weights, then all biases), or `None`
/// unless every parameter is an `f32` tensor off any autodiff graph.
pub(crate) fn plain_params(layers: &[&Linear]) -> Option<Vec<Option<FlexTensor>>> {
    let mut out = Vec::with_capacity(2 * layers.len());
    for layer in layers {
        out.push(Some(plain_flex(layer.weight.val())?));
    }
    for layer in layers {
        out.push(match &layer.bias {
            Some(p) => Some(plain_flex(p.val())?),
            None => None,
        });
    }
    Some(out)
}

/// Whether two lists from [`plain_params`] hold the same views of the same storage, so that
/// weights prepared from one still equal weights prepared from the other.
pub(crate) fn same_params(a: &[Option<FlexTensor>], b: &[Option<FlexTensor>]) -> bool {
    let same = |a: &FlexTensor, b: &FlexTensor| {
        std::ptr::eq(a.bytes().as_ptr(), b.bytes().as_ptr())
            && a.bytes().len() == b.bytes().len()
            && a.layout() == b.layout()
            && a.dtype() == b.dtype()
    };
    a.len() == b.len()
        && a.iter().zip(b).all(|(a, b)| match (a, b) {
            (Some(a), Some(b)) => same(a, b),
            (None, None) => true,
            _ => false,
        })
}

/// A linear layer prepared for int8 or bf16 products ([`crate::cpu::qgemm`]): its weight
/// quantized per output channel or rounded to bf16, its bias kept in `f32`.
pub(crate) struct QuantLinear {
    weight: QuantizedMatrix,
    bias: Option<Vec<f32>>,
    /// The parameters' own tensors, held so their storage stays alive and cannot be reused
    /// at the same address while this is cached ([`QuantLinear::built_from`]).
    sources: Vec<Option<FlexTensor>>,
}

impl std::fmt::Debug for QuantLinear {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QuantLinear")
            .field("weight", &self.weight)
            .field("bias", &self.bias.is_some())
            .finish()
    }
}

impl QuantLinear {
    /// `layer` prepared for `quantization`, or `None` for `f32` or unless its parameters are
    /// plain `flex` `f32` tensors.
    pub(crate) fn new(layer: &Linear, quantization: Quantization) -> Option<Self> {
        let sources = plain_params(&[layer])?;
        let weight = sources[0]
            .as_ref()
            .and_then(|w| with_matrix(w, |m| QuantizedMatrix::prepare(quantization, m)))?;
        let bias = sources[1]
            .as_ref()
            .map(|b| contiguous(b.clone()).storage::<f32>()[..weight.cols()].to_vec());
        Some(Self {
            weight,
            bias,
            sources,
        })
    }

    /// Whether this was built from exactly the parameters `layer` holds now.
    pub(crate) fn built_from(&self, layer: &Linear) -> bool {
        plain_params(&[layer]).is_some_and(|now| same_params(&now, &self.sources))
    }
}

/// `act(layer.forward(x))` through the int8 product of `layer`'s prepared weights, when `x`
/// is a plain `flex` `f32` tensor (not on an autodiff graph); anything else is handed back
/// as `Err(x)`.
///
/// # Shapes
/// - `x`: `[..., d_input]`
/// - output: `[..., d_output]`
pub(crate) fn try_linear_quant<const D: usize>(
    layer: &QuantLinear,
    x: Tensor<D>,
    act: Activation,
) -> Result<Tensor<D>, Tensor<D>> {
    let Some(xf) = plain_flex(x.clone()) else {
        return Err(x);
    };
    drop(x);
    let w = &layer.weight;
    let epilogue = Epilogue {
        bias: layer.bias.as_deref(),
        accumulate: false,
        activation: act,
    };
    let y = rows_times(&xf, w.rows(), w.cols(), |xm, out| {
        qgemm::qgemm(xm, w, out, epilogue)
    });
    Ok(Tensor::from_primitive::<Flex>(y))
}

/// `t` as a `flex` primitive when it is an `f32` tensor off any autodiff graph (another
/// backend, dtype or an autodiff tensor gives `None`).
pub(crate) fn plain_flex<const D: usize>(t: Tensor<D>) -> Option<FlexTensor> {
    if t.dtype() != DType::F32 || t.device().is_autodiff() {
        return None;
    }
    t.try_into_primitive::<Flex>().ok()
}

/// A 2-D flex tensor as a strided view (copying it first when its strides are negative).
fn with_matrix<R>(t: &FlexTensor, f: impl FnOnce(MatRef<'_>) -> R) -> R {
    let layout = t.layout();
    let shape = layout.shape();
    assert_eq!(shape.num_dims(), 2, "linear: the weight must be 2-D");
    let (rows, cols) = (shape[0], shape[1]);
    let strides = layout.strides();
    match (usize::try_from(strides[0]), usize::try_from(strides[1])) {
        (Ok(rs), Ok(cs)) => {
            let data = &t.storage::<f32>()[layout.start_offset()..];
            f(MatRef::new(data, rows, cols, rs, cs))
        }
        _ => {
            let c = t.to_contiguous();
            f(MatRef::row_major(
                &c.storage::<f32>()[..rows * cols],
                rows,
                cols,
            ))
        }
    }
}

/// The leading dimensions of `x` flattened: `(rows, d_input, output shape for d_output)`.
fn rows_of(x: &FlexTensor, d_out: usize) -> (usize, usize, Vec<usize>) {
    let dims = x.layout().shape().to_vec();
    let d_in = *dims
        .last()
        .expect("linear: the input has at least one dimension");
    let rows = dims[..dims.len() - 1].iter().product();
    let mut out = dims;
    *out.last_mut().expect("non-empty") = d_out;
    (rows, d_in, out)
}

/// `c = act(a b + bias)` (as [`gemm::gemm`]) with the operands in `float`.
fn product(a: MatRef<'_>, b: MatRef<'_>, c: &mut [f32], epilogue: Epilogue<'_>, float: Float) {
    if float == Float::Bf16 && qgemm::Isa::bf16().is_some() {
        qgemm::qgemm(a, &QuantizedMatrix::bf16(b), c, epilogue);
    } else {
        gemm::gemm(a, b, c, epilogue);
    }
}

/// `act(x W + b)` as a new flex tensor, the product's operands in `float`.
fn forward(
    x: &FlexTensor,
    w: &FlexTensor,
    b: Option<&FlexTensor>,
    act: Activation,
    float: Float,
) -> FlexTensor {
    let [d_in, d_out] = dims2(w);
    let b = b.map(|b| contiguous(b.clone()));
    let bias = b.as_ref().map(|b| &b.storage::<f32>()[..d_out]);
    let epilogue = Epilogue {
        bias,
        accumulate: false,
        activation: act,
    };
    rows_times(x, d_in, d_out, |xm, out| {
        with_matrix(w, |wm| product(xm, wm, out, epilogue, float))
    })
}

/// `product(x as [rows, d_in], out as [rows, d_out])` over the leading dimensions of `x`, as a
/// new flex tensor of `x`'s shape with `d_out` last: the linear layers' shape handling for the
/// f32 and the int8 products.
fn rows_times(
    x: &FlexTensor,
    d_in: usize,
    d_out: usize,
    product: impl FnOnce(MatRef<'_>, &mut [f32]),
) -> FlexTensor {
    let x = contiguous(x.clone());
    let (rows, x_in, out_shape) = rows_of(&x, d_out);
    assert_eq!(
        x_in, d_in,
        "linear: the input's last dimension is {x_in}, the weight expects {d_in}"
    );
    let mut out = vec![0f32; rows * d_out];
    product(
        MatRef::row_major(&x.storage::<f32>()[..rows * d_in], rows, d_in),
        &mut out,
    );
    FlexTensor::from_data(TensorData::new(out, out_shape))
}

/// The forward pass of a tracked call: the output and, for GELU, the pre-activation the
/// backward step needs.
fn forward_tracked(
    x: &FlexTensor,
    w: &FlexTensor,
    b: Option<&FlexTensor>,
    act: Activation,
    float: Float,
) -> (FlexTensor, Option<FlexTensor>) {
    match act {
        Activation::Identity => (forward(x, w, b, act, float), None),
        Activation::Gelu => {
            let z = forward(x, w, b, Activation::Identity, float);
            let y = elementwise::gelu_flex(z.clone());
            (y, Some(z))
        }
    }
}

fn dims2(t: &FlexTensor) -> [usize; 2] {
    let s = t.layout().shape();
    [s[0], s[1]]
}

/// What the backward step keeps from the forward pass.
#[derive(Debug, Clone)]
struct LinearState {
    x: FlexTensor,
    w: FlexTensor,
    /// The pre-activation, for GELU.
    z: Option<FlexTensor>,
    /// The float type of the backward products (that of the forward one).
    float: Float,
}

impl LinearState {
    fn new(x: FlexTensor, w: FlexTensor, z: Option<FlexTensor>, float: Float) -> Self {
        Self { x, w, z, float }
    }
}

/// The autodiff step of [`try_linear`] (the activation, if any, is known from
/// the state's pre-activation).
#[derive(Debug)]
struct LinearBackward;

/// `(dx, dW, db)` for the output gradient `g`, each computed only when wanted.
fn gradients(
    g: FlexTensor,
    state: &LinearState,
    want: [bool; 3],
) -> (Option<FlexTensor>, Option<FlexTensor>, Option<FlexTensor>) {
    let [d_in, d_out] = dims2(&state.w);
    // gradient with respect to the pre-activation
    let gz = match &state.z {
        Some(z) => elementwise::gelu_backward_flex(g, z),
        None => contiguous(g),
    };
    let x = contiguous(state.x.clone());
    let x_shape = x.layout().shape().to_vec();
    let rows = x.layout().num_elements() / d_in.max(1);
    let gz_data = &gz.storage::<f32>()[..rows * d_out];
    let gz_mat = MatRef::row_major(gz_data, rows, d_out);
    let dx = want[0].then(|| {
        let mut out = vec![0f32; rows * d_in];
        with_matrix(&state.w, |wm| {
            product(gz_mat, wm.t(), &mut out, Epilogue::default(), state.float)
        });
        FlexTensor::from_data(TensorData::new(out, x_shape))
    });
    let dw = want[1].then(|| {
        let mut out = vec![0f32; d_in * d_out];
        let xm = MatRef::row_major(&x.storage::<f32>()[..rows * d_in], rows, d_in);
        product(xm.t(), gz_mat, &mut out, Epilogue::default(), state.float);
        FlexTensor::from_data(TensorData::new(out, vec![d_in, d_out]))
    });
    let db = want[2].then(|| {
        // Partial sums over fixed blocks of rows, added in order: the same result on every
        // run whatever the thread scheduling (a rayon `reduce` would not guarantee that).
        let partials: Vec<Vec<f32>> = gz_data
            .par_chunks(d_out.max(1) * 64)
            .map(|block| {
                let mut acc = vec![0f32; d_out];
                for row in block.chunks_exact(d_out.max(1)) {
                    for (a, &v) in acc.iter_mut().zip(row) {
                        *a += v;
                    }
                }
                acc
            })
            .collect();
        let mut sums = vec![0f32; d_out];
        for part in &partials {
            for (s, &p) in sums.iter_mut().zip(part) {
                *s += p;
            }
        }
        FlexTensor::from_data(TensorData::new(sums, vec![d_out]))
    });
    (dx, dw, db)
}

impl Backward<Flex, 3> for LinearBackward {
    type State = LinearState;

    fn backward(self, ops: Ops<LinearState, 3>, grads: &mut Gradients, _: &mut Checkpointer) {
        let g = grads.consume::<Flex>(&ops.node);
        let [px, pw, pb] = ops.parents;
        let want = [px.is_some(), pw.is_some(), pb.is_some()];
        let (dx, dw, db) = gradients(g, &ops.state, want);
        for (parent, grad) in [(px, dx), (pw, dw), (pb, db)] {
            if let (Some(node), Some(grad)) = (parent, grad) {
                grads.register::<Flex>(node.id, grad);
            }
        }
    }
}

impl Backward<Flex, 2> for LinearBackward {
    type State = LinearState;

    fn backward(self, ops: Ops<LinearState, 2>, grads: &mut Gradients, _: &mut Checkpointer) {
        let g = grads.consume::<Flex>(&ops.node);
        let [px, pw] = ops.parents;
        let want = [px.is_some(), pw.is_some(), false];
        let (dx, dw, _) = gradients(g, &ops.state, want);
        for (parent, grad) in [(px, dx), (pw, dw)] {
            if let (Some(node), Some(grad)) = (parent, grad) {
                grads.register::<Flex>(node.id, grad);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::{linear, linear_gelu};
    use burn::nn::LinearConfig;
    use burn::tensor::Distribution;

    fn values<const D: usize>(t: Tensor<D>) -> Vec<f32> {
        t.into_data().try_to_vec::<f32>().expect("f32 tensor")
    }

    fn close(a: &[f32], b: &[f32], tol: f32, what: &str) {
        assert_eq!(a.len(), b.len(), "{what}: lengths");
        for (i, (x, y)) in a.iter().zip(b).enumerate() {
            assert!(
                (x - y).abs() <= tol * y.abs().max(1.0),
                "{what}: element {i}: {x} vs {y}"
            );
        }
    }

    #[test]
    fn forward_matches_burn_linear_with_and_without_bias() {
        let _rng = crate::rng_lock();
        let device = Device::flex();
        for bias in [true, false] {
            let layer = LinearConfig::new(37, 53).with_bias(bias).init(&device);
            let x = Tensor::<3>::random([3, 11, 37], Distribution::Default, &device);
            close(
                &values(linear(&layer, x.clone())),
                &values(layer.forward(x.clone())),
                1e-5,
                "linear",
            );
            close(
                &values(linear_gelu(&layer, x.clone())),
                &values(burn::tensor::activation::gelu(layer.forward(x))),
                2e-5,
                "linear_gelu",
            );
        }
    }

    #[test]
    fn gradients_match_burn_linear() {
        let _rng = crate::rng_lock();
        let device = Device::flex().autodiff();
        for (bias, act) in [
            (true, Activation::Identity),
            (true, Activation::Gelu),
            (false, Activation::Gelu),
        ] {
            let layer = LinearConfig::new(29, 41).with_bias(bias).init(&device);
            let x0 = Tensor::<3>::random([2, 9, 29], Distribution::Default, &device);
            let w = Tensor::<3>::random([2, 9, 41], Distribution::Default, &device);
            let run = |ours: bool| {
                let x = x0.clone().detach().require_grad();
                let y = match (ours, act) {
                    (true, _) => try_linear(&layer, x.clone(), act).expect("flex f32"),
                    (false, Activation::Identity) => layer.forward(x.clone()),
                    (false, Activation::Gelu) => {
                        burn::tensor::activation::gelu(layer.forward(x.clone()))
                    }
                };
                let grads = (y.clone() * w.clone()).sum().backward();
                let gx = values(x.grad(&grads).expect("dx"));
                let gw = values(layer.weight.grad(&grads).expect("dW"));
                let gb = layer
                    .bias
                    .as_ref()
                    .map(|b| values(b.grad(&grads).expect("db")));
                (values(y), gx, gw, gb)
            };
            let (y1, gx1, gw1, gb1) = run(true);
            let (y2, gx2, gw2, gb2) = run(false);
            close(&y1, &y2, 2e-5, "output");
            close(&gx1, &gx2, 2e-5, "dx");
            close(&gw1, &gw2, 2e-5, "dW");
            assert_eq!(gb1.is_some(), bias);
            if let (Some(a), Some(b)) = (gb1, gb2) {
                close(&a, &b, 2e-5, "db");
            }
        }
    }

    /// bf16 training: the output and the gradients `dx = g Wᵀ` and `dW = xᵀ g` against `f64`
    /// sums of the same bf16-rounded operands (rounded by the `half` crate), within the `f32`
    /// accumulation's bound `k · 2^-23 · Σ |terms|`; the bias and its gradient in `f32`. On a
    /// processor without AVX512-BF16 the products fall back to `f32`, which the test checks
    /// instead (saying so).
    #[test]
    fn bf16_training_products_are_f32_sums_of_bf16_values() {
        let _rng = crate::rng_lock();
        let device = Device::flex().autodiff();
        let (d_in, d_out) = (70, 45);
        let layer = LinearConfig::new(d_in, d_out).init(&device);
        let x0 = Tensor::<3>::random([2, 40, d_in], Distribution::Normal(0.0, 1.5), &device);
        let g0 = Tensor::<3>::random([2, 40, d_out], Distribution::Normal(0.0, 1.0), &device);
        let run = |float: Float| {
            let x = x0.clone().detach().require_grad();
            let y = try_linear_in(&layer, x.clone(), Activation::Identity, float).expect("flex");
            let grads = (y.clone() * g0.clone()).sum().backward();
            (
                values(y),
                values(x.grad(&grads).expect("dx")),
                values(layer.weight.grad(&grads).expect("dW")),
                values(layer.bias.as_ref().expect("bias").grad(&grads).expect("db")),
            )
        };
        let (y, dx, dw, db) = run(Float::Bf16);
        if qgemm::Isa::bf16().is_none() {
            eprintln!("this processor has no AVX512-BF16: checking the f32 fallback instead");
            let (y32, dx32, dw32, db32) = run(Float::F32);
            assert_eq!((y, dx, dw, db), (y32, dx32, dw32, db32));
            return;
        }
        let (x, g) = (values(x0.clone()), values(g0.clone()));
        let w = values(layer.weight.val());
        let b = values(layer.bias.as_ref().expect("bias").val());
        let rows = x.len() / d_in;
        let r = |v: f32| f64::from(half::bf16::from_f32(v).to_f32());
        // `got` against Σ_t terms(t) over `k` terms (plus `extra`, added in f32)
        let check = |what: &str, got: f32, k: usize, terms: &dyn Fn(usize) -> f64, extra: f32| {
            let exact: f64 = (0..k).map(terms).sum::<f64>() + f64::from(extra);
            let magnitude: f64 = (0..k).map(|t| terms(t).abs()).sum();
            let eps = f64::from(f32::EPSILON);
            let bound = k as f64 * eps * magnitude + exact.abs() * eps + 1e-6;
            assert!(
                (f64::from(got) - exact).abs() <= bound,
                "{what}: {got} vs {exact}, bound {bound}"
            );
        };
        for i in 0..rows {
            for j in 0..d_out {
                let t = |p: usize| r(x[i * d_in + p]) * r(w[p * d_out + j]);
                check("y", y[i * d_out + j], d_in, &t, b[j]);
            }
            for p in 0..d_in {
                let t = |j: usize| r(g[i * d_out + j]) * r(w[p * d_out + j]);
                check("dx", dx[i * d_in + p], d_out, &t, 0.0);
            }
        }
        for p in 0..d_in {
            for j in 0..d_out {
                let t = |i: usize| r(x[i * d_in + p]) * r(g[i * d_out + j]);
                check("dW", dw[p * d_out + j], rows, &t, 0.0);
            }
        }
        for j in 0..d_out {
            let t = |i: usize| f64::from(g[i * d_out + j]);
            check("db", db[j], rows, &t, 0.0);
        }
        // and the rounding mattered: the bf16 gradients are not the f32 ones
        assert_ne!(
            dw,
            run(Float::F32).2,
            "the weight gradient was not computed in bf16"
        );
    }
}
