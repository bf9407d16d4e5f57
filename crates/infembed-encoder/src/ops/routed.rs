//! Linear layers whose products run a chosen routine ([`MatmulRoutine`]: this project's
//! blocked kernel or one of cubek's) on the cubecl devices (`wgpu`, `vulkan`, `cuda`; not a
//! `fusion` build, whose tensors are fusion handles).
//!
//! [`try_linear`] computes `act(x W + b)` with the product `x W` launched through the routine
//! instead of burn's `matmul`; on an autodiff device it registers its own backward step, whose
//! two products (`dx = g Wᵀ`, `dW = xᵀ g`, the transposes read as strided views) run the same
//! routine. The blocked kernel adds the bias (and, at inference, GELU) in the product's own
//! launch; in training a layer without activation is one node whose backward step adds the
//! bias's column sums ([`super::cube_sum`]), and the feed-forward layer's bias and GELU are
//! one kernel after the product ([`super::cube_gelu`]), as they are after cubek's routines. A
//! product that cubek declines for the routine (a tensor-core routine without tensor cores for
//! the operands' type, a layout it does not take), or fails to set up, is computed by burn's
//! `matmul` instead, and said once in the log: every routine gives burn's results to float
//! rounding.

use std::collections::HashSet;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Mutex, PoisonError};

use burn::backend::autodiff::NodeId;
use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::NoCheckpointing;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops};
use burn::backend::{Autodiff, Cube};
use burn::nn::Linear;
use burn::prelude::*;
use burn::tensor::DType;
use cubecl::ir::{ElemType, FloatKind};
use cubek::matmul::definition::{MatmulElems, MatmulGlobalElems, MatmulSetupError};
use cubek::matmul::strategy::Strategy;
use cubek::std::InputBinding;

use super::cube_kit::finish;
use crate::cpu::gemm::Activation;
use crate::device::panic_message;
use crate::routine::{Launcher, MatmulRoutine};

/// A float tensor of the cubecl backend.
pub(crate) type CubeTensor = <Cube as burn::backend::BackendTypes>::FloatTensorPrimitive;

/// Why a routine's launch did not happen.
#[derive(Debug)]
pub(crate) enum LaunchError {
    /// cubek declined the routine or failed to set it up (its reason).
    Setup(MatmulSetupError),
    /// The operands are not cubecl tensors of a float type cubek multiplies.
    Operands(String),
}

/// The float type of a product of `dtype` operands (and output), or `None` for a type no
/// routine multiplies.
pub(crate) fn float_kind(dtype: DType) -> Option<FloatKind> {
    match dtype {
        DType::F32 => Some(FloatKind::F32),
        DType::F16 => Some(FloatKind::F16),
        DType::BF16 => Some(FloatKind::BF16),
        _ => None,
    }
}

/// The element types cubek computes a product of `kind` operands in (the operands' and the
/// output's type; cubek chooses the rest, f32 sums).
fn elems(kind: FloatKind) -> MatmulElems {
    let t = ElemType::Float(kind);
    MatmulElems::from_globals(&MatmulGlobalElems {
        lhs: t,
        rhs: t,
        out: t,
    })
}

/// A launch's operands and its new output, as cubecl tensors of one float type, with what
/// the blocked kernel adds to the output in its launch.
pub(crate) struct Operands {
    pub(crate) lhs: CubeTensor,
    pub(crate) rhs: CubeTensor,
    pub(crate) out: CubeTensor,
    /// The float type of all three (and of the bias).
    pub(crate) kind: FloatKind,
    /// A bias `[N]` added to each output row (the blocked kernel only).
    pub(crate) bias: Option<CubeTensor>,
    /// GELU after the bias (the blocked kernel only).
    pub(crate) gelu: bool,
    /// The output has one more row, `M`, for the column sums of `rhs` (the blocked kernel
    /// only; one batch, no bias nor GELU).
    pub(crate) col_sums: bool,
}

impl Operands {
    /// The operands of a plain product into `out` (no bias, GELU or column sums), or
    /// [`LaunchError::Operands`] for a tensor that is not a plain cubecl one.
    fn plain<const D: usize>(
        lhs: &Tensor<D>,
        rhs: &Tensor<D>,
        out: &Tensor<D>,
        kind: FloatKind,
    ) -> Result<Self, LaunchError> {
        let cube = |t: &Tensor<D>| {
            t.clone()
                .try_into_primitive::<Cube>()
                .map_err(|e| LaunchError::Operands(format!("not a cubecl tensor: {e:?}")))
        };
        Ok(Self {
            lhs: cube(lhs)?,
            rhs: cube(rhs)?,
            out: cube(out)?,
            kind,
            bias: None,
            gelu: false,
            col_sums: false,
        })
    }
}

/// Launches `lhs · rhs` through `launcher` into a new tensor of `lhs`'s type, on `lhs`'s
/// device (plain cubecl tensors; strided views such as transposes are read in place). The
/// leading dimensions are batch dimensions, the same in both operands (not broadcast).
///
/// # Shapes
/// - `lhs`: `[..., M, K]`
/// - `rhs`: `[..., K, N]`
/// - output: `[..., M, N]`
pub(crate) fn launch<const D: usize>(
    launcher: &Launcher,
    lhs: &Tensor<D>,
    rhs: &Tensor<D>,
) -> Result<Tensor<D>, LaunchError> {
    launch_affine(launcher, lhs, rhs, None, Activation::Identity)
}

/// [`launch`], then `act(y + bias)`: in the product's own launch through the blocked kernel,
/// after it through this project's bias + GELU kernel or burn's addition through cubek's.
///
/// # Shapes
/// - `lhs`: `[..., M, K]`
/// - `rhs`: `[..., K, N]`
/// - `bias`: `[N]`
/// - output: `[..., M, N]`
pub(crate) fn launch_affine<const D: usize>(
    launcher: &Launcher,
    lhs: &Tensor<D>,
    rhs: &Tensor<D>,
    bias: Option<&Tensor<1>>,
    act: Activation,
) -> Result<Tensor<D>, LaunchError> {
    let (ld, rd) = (lhs.dims(), rhs.dims());
    if let Some(b) = bias
        && (b.dims() != [rd[D - 1]] || b.dtype() != lhs.dtype())
    {
        return Err(LaunchError::Operands(format!(
            "a bias {:?} ({:?}) for {rd:?}",
            b.dims(),
            b.dtype()
        )));
    }
    if D < 2 || ld[..D - 2] != rd[..D - 2] || rd[D - 2] != ld[D - 1] || rhs.dtype() != lhs.dtype() {
        return Err(LaunchError::Operands(format!(
            "{ld:?} ({:?}) times {rd:?} ({:?})",
            lhs.dtype(),
            rhs.dtype()
        )));
    }
    let Some(kind) = float_kind(lhs.dtype()) else {
        return Err(LaunchError::Operands(format!(
            "no float product of {:?}",
            lhs.dtype()
        )));
    };
    let mut out_dims = ld;
    out_dims[D - 1] = rd[D - 1];
    let out = match launcher {
        // a product over heads (`[B, H, M, N]`, attention's) stored as `[B, M, H, N]`, which
        // the blocked kernel writes through the view's strides: merging the heads back
        // (`[B, M, H N]`) is then a view where it was a copy
        Launcher::Blocked(_) if D == 4 => {
            let mut stored = out_dims;
            stored.swap(1, 2);
            Tensor::<D>::empty(stored, (&lhs.device(), lhs.dtype())).swap_dims(1, 2)
        }
        _ => Tensor::<D>::empty(out_dims, (&lhs.device(), lhs.dtype())),
    };
    let mut operands = Operands::plain(lhs, rhs, &out, kind)?;
    match launcher {
        Launcher::Cubek(strategy) => {
            launch_cubek(strategy, operands)?;
            Ok(after_product(out, bias.cloned(), act))
        }
        Launcher::Blocked(blocking) => {
            if let Some(b) = bias {
                let b = b.clone().try_into_primitive::<Cube>().map_err(|e| {
                    LaunchError::Operands(format!("a bias not on the cubecl device: {e:?}"))
                })?;
                operands.bias = Some(b);
            }
            operands.gelu = act == Activation::Gelu;
            super::blocked::launch(*blocking, operands, &lhs.device())?;
            Ok(out)
        }
    }
}

/// `lhs · rhs` and the column sums of `rhs` (`Σ_k rhs[..., k, n]`) from one launch of the
/// blocked kernel, for a linear layer's weight gradient `xᵀ g` and its bias's gradient
/// (plain cubecl tensors of one float type, one batch; strided views read in place). The
/// product is rows `0..M` of a new `[..., M + 1, N]` tensor, the sums its row `M` (views
/// where the device's alignment allows, else burn's copies).
///
/// # Shapes
/// - `lhs`: `[1, ..., M, K]`
/// - `rhs`: `[1, ..., K, N]`
/// - output: `[1, ..., M, N]` and `[N]`
pub(super) fn launch_with_col_sums<const D: usize>(
    blocking: super::blocked::Blocking,
    lhs: &Tensor<D>,
    rhs: &Tensor<D>,
) -> Result<(Tensor<D>, Tensor<1>), LaunchError> {
    if D < 2 {
        return Err(LaunchError::Operands(format!("rank {D} with column sums")));
    }
    let (ld, rd) = (lhs.dims(), rhs.dims());
    let one_batch = ld[..D - 2].iter().all(|&d| d == 1);
    if !one_batch || ld[..D - 2] != rd[..D - 2] || rd[D - 2] != ld[D - 1] {
        return Err(LaunchError::Operands(format!(
            "{ld:?} times {rd:?} with column sums"
        )));
    }
    let kind = match float_kind(lhs.dtype()) {
        Some(kind) if rhs.dtype() == lhs.dtype() => kind,
        _ => {
            return Err(LaunchError::Operands(format!(
                "{:?} times {:?}",
                lhs.dtype(),
                rhs.dtype()
            )));
        }
    };
    let (m, n) = (ld[D - 2], rd[D - 1]);
    let mut out_dims = ld;
    out_dims[D - 2] = m + 1;
    out_dims[D - 1] = n;
    let out = Tensor::<D>::empty(out_dims, (&lhs.device(), lhs.dtype()));
    let operands = Operands {
        col_sums: true,
        ..Operands::plain(lhs, rhs, &out, kind)?
    };
    super::blocked::launch(blocking, operands, &lhs.device())?;
    let rows = |r: std::ops::Range<usize>| {
        let mut ranges: [std::ops::Range<usize>; D] = std::array::from_fn(|i| 0..out_dims[i]);
        ranges[D - 2] = r;
        out.clone().slice(ranges)
    };
    Ok((rows(0..m), rows(m..m + 1).reshape([n])))
}

/// `act(y + bias)` of a plain product `y` computed without them: this project's bias + GELU
/// kernel, or burn's addition.
fn after_product<const D: usize>(
    y: Tensor<D>,
    bias: Option<Tensor<1>>,
    act: Activation,
) -> Tensor<D> {
    match act {
        Activation::Gelu => match super::cube_gelu::try_bias_gelu(y, bias) {
            Ok(out) => out,
            Err((y, bias)) => super::gelu(add_bias(y, bias)),
        },
        Activation::Identity => add_bias(y, bias),
    }
}

/// [`launch`] through one of cubek's routines.
fn launch_cubek(strategy: &Strategy, operands: Operands) -> Result<(), LaunchError> {
    let mut dtypes = elems(operands.kind);
    let client = operands.out.client.clone();
    cubek::matmul::launch::launch_ref(
        strategy,
        &client,
        InputBinding::new(operands.lhs.binding(), dtypes.lhs_global),
        InputBinding::new(operands.rhs.binding(), dtypes.rhs_global),
        operands.out.binding(),
        &mut dtypes,
    )
    .map_err(LaunchError::Setup)
}

#[cfg(test)]
thread_local! {
    /// How many products this thread sent to burn's `matmul` instead (for the tests: products,
    /// backward ones included, launch on the thread that asks for them, so tests running
    /// beside each other do not see each other's).
    static FALLBACKS: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// How many products have fallen back to burn's `matmul` on this thread so far (for the tests).
#[cfg(test)]
pub(crate) fn fallbacks() -> usize {
    FALLBACKS.get()
}

/// Says once per routine and reason that burn's `matmul` computes what the routine did not.
fn note_fallback(routine: MatmulRoutine, reason: &str) {
    static SAID: Mutex<Option<HashSet<String>>> = Mutex::new(None);
    let key = format!("{routine}: {reason}");
    #[cfg(test)]
    FALLBACKS.set(FALLBACKS.get() + 1);
    let mut said = SAID.lock().unwrap_or_else(PoisonError::into_inner);
    if said.get_or_insert_with(HashSet::new).insert(key) {
        log::warn!("matmul routine {routine} did not run ({reason}); burn's matmul computes it");
    }
}

/// `lhs · rhs` through `routine`, or through burn's `matmul` where the routine does not run it.
///
/// # Shapes
/// - `lhs`: `[..., M, K]`
/// - `rhs`: `[..., K, N]`
/// - output: `[..., M, N]`
fn product<const D: usize>(
    routine: MatmulRoutine,
    launcher: &Launcher,
    lhs: Tensor<D>,
    rhs: Tensor<D>,
) -> Tensor<D> {
    affine(routine, launcher, lhs, rhs, None, Activation::Identity)
}

/// `act(lhs · rhs + bias)` of plain tensors through `routine` ([`launch_affine`]), or through
/// burn's `matmul` and the bias and activation after it where the routine does not run it.
///
/// # Shapes
/// - `lhs`: `[..., M, K]`
/// - `rhs`: `[..., K, N]`
/// - `bias`: `[N]`
/// - output: `[..., M, N]`
fn affine<const D: usize>(
    routine: MatmulRoutine,
    launcher: &Launcher,
    lhs: Tensor<D>,
    rhs: Tensor<D>,
    bias: Option<Tensor<1>>,
    act: Activation,
) -> Tensor<D> {
    let launched = catch_unwind(AssertUnwindSafe(|| {
        launch_affine(launcher, &lhs, &rhs, bias.as_ref(), act)
    }));
    let reason = match launched {
        Ok(Ok(out)) => return out,
        Ok(Err(LaunchError::Setup(e))) => format!("{e}"),
        Ok(Err(LaunchError::Operands(e))) => e,
        Err(p) => panic_message(&p),
    };
    note_fallback(routine, &reason);
    after_product(lhs.matmul(rhs), bias, act)
}

/// A plain cubecl primitive as a tensor.
fn plain<const D: usize>(t: CubeTensor) -> Tensor<D> {
    Tensor::from_primitive::<Cube>(t)
}

/// A plain tensor back to its cubecl primitive (every tensor made here from cubecl ones is).
fn primitive<const D: usize>(t: Tensor<D>) -> CubeTensor {
    t.try_into_primitive::<Cube>()
        .expect("products of cubecl tensors are cubecl tensors")
}

/// Whether [`try_matmul`] routes products of tensors like `t` through `routine`: a routine
/// other than `burn`, and a float tensor of the cubecl backend (plain or on an autodiff graph
/// without checkpointing).
pub(crate) fn routes<const D: usize>(routine: MatmulRoutine, t: &Tensor<D>) -> bool {
    routine.launcher().is_some()
        && float_kind(t.dtype()).is_some()
        && (t.clone().try_into_primitive::<Cube>().is_ok()
            || t.clone().try_into_primitive::<Autodiff<Cube>>().is_ok())
}

/// `lhs · rhs` (and, on an autodiff graph, its two backward products) through `routine` when
/// [`routes`] says so for both operands; anything else is handed back as `Err((lhs, rhs))`,
/// operands whose batch dimensions differ (broadcasting) included.
///
/// # Shapes
/// - `lhs`: `[..., M, K]`
/// - `rhs`: `[..., K, N]`
/// - output: `[..., M, N]`
#[allow(clippy::result_large_err)]
pub(crate) fn try_matmul<const D: usize>(
    lhs: Tensor<D>,
    rhs: Tensor<D>,
    routine: MatmulRoutine,
) -> Result<Tensor<D>, (Tensor<D>, Tensor<D>)> {
    let Some(launcher) = routine.launcher().filter(|_| routes(routine, &lhs)) else {
        return Err((lhs, rhs));
    };
    let (ld, rd) = (lhs.dims(), rhs.dims());
    // broadcast batch dimensions (and mismatches, which burn names) stay burn's, forward and
    // backward: the routed backward step computes the gradients of equal batches
    if lhs.dtype() != rhs.dtype() || D < 2 || ld[..D - 2] != rd[..D - 2] || ld[D - 1] != rd[D - 2] {
        return Err((lhs, rhs));
    }
    let y = if lhs.device().is_autodiff() {
        tracked(routine, &launcher, lhs.clone(), rhs.clone())
    } else {
        Some(product(routine, &launcher, lhs.clone(), rhs.clone()))
    };
    y.ok_or((lhs, rhs))
}

/// `act(x W + b)` with the product `x W` (and, on an autodiff device, its two backward
/// products) through `routine`, when `x`, the layer's weight and bias are float tensors of one
/// type on a cubecl device; anything else is handed back as `Err(x)`.
///
/// Through the blocked kernel, plain tensors (inference) get the bias and GELU in the
/// product's own launch. On an autodiff graph, the bias of a layer without activation is
/// added in the product's launch too, and the product, its two backward products and the
/// bias's gradient are one node (the bias's gradient from the weight gradient's launch,
/// [`launch_with_col_sums`], else the column sums of [`super::cube_sum`]); with GELU, bias and
/// activation are one kernel after the product ([`super::cube_gelu`]), forward and backward.
/// cubek's routines leave the bias to burn's addition and GELU to that kernel.
///
/// # Shapes
/// - `x`: `[..., d_input]`
/// - output: `[..., d_output]`
pub(crate) fn try_linear<const D: usize>(
    layer: &Linear,
    x: Tensor<D>,
    routine: MatmulRoutine,
    act: Activation,
) -> Result<Tensor<D>, Tensor<D>> {
    // first the cheap check: with `blocked_split` the default, every linear layer of every device
    // comes here, the CPU's included
    if !routes(routine, &x) {
        return Err(x);
    }
    let Some(launcher) = routine.launcher() else {
        return Err(x);
    };
    let w = layer.weight.val();
    let [d_in, d_out] = w.dims();
    let dims = x.dims();
    let bias = layer.bias.as_ref().map(|b| b.val());
    let device = x.device();
    let unlike =
        |t: &Tensor<1>| t.dims() != [d_out] || t.dtype() != x.dtype() || t.device() != device;
    if dims[D - 1] != d_in
        || w.dtype() != x.dtype()
        || w.device() != device
        || bias.as_ref().is_some_and(unlike)
    {
        return Err(x); // burn's op names the mismatch, or computes another float type
    }
    let rows = dims[..D - 1].iter().product();
    let x3 = x.clone().reshape([1, rows, d_in]);
    let w3 = w.unsqueeze::<3>();
    let y = if !x.device().is_autodiff() {
        affine(routine, &launcher, x3, w3, bias, act)
    } else {
        let y = match (act, bias) {
            (Activation::Identity, Some(b)) => tracked_affine(routine, &launcher, x3, w3, b),
            (act, bias) => tracked(routine, &launcher, x3, w3).map(|y| after_product(y, bias, act)),
        };
        let Some(y) = y else {
            return Err(x);
        };
        y
    };
    let mut out = dims;
    out[D - 1] = d_out;
    Ok(y.reshape(out))
}

/// `y + b` (`y` without a bias): burn's addition, on an autodiff graph with the bias's
/// gradient as one column-sum kernel ([`super::cube_sum::try_add_bias`]).
fn add_bias<const D: usize>(y: Tensor<D>, bias: Option<Tensor<1>>) -> Tensor<D> {
    match bias {
        Some(b) if y.device().is_autodiff() => {
            super::cube_sum::try_add_bias(y, b).unwrap_or_else(|(y, b)| y + b.unsqueeze())
        }
        Some(b) => y + b.unsqueeze(),
        None => y,
    }
}

/// The product on an autodiff graph of cubecl tensors, with [`RoutedMatmul`]'s backward step;
/// `None` when the operands are not on one.
fn tracked<const D: usize>(
    routine: MatmulRoutine,
    launcher: &Launcher,
    x: Tensor<D>,
    w: Tensor<D>,
) -> Option<Tensor<D>> {
    let (Ok(xp), Ok(wp)) = (
        x.try_into_primitive::<Autodiff<Cube>>(),
        w.try_into_primitive::<Autodiff<Cube>>(),
    ) else {
        return None;
    };
    let (lhs, rhs) = (xp.primitive().clone(), wp.primitive().clone());
    let forward = |l: &CubeTensor, r: &CubeTensor| {
        primitive(product::<D>(
            routine,
            launcher,
            plain(l.clone()),
            plain(r.clone()),
        ))
    };
    let y = forward(&lhs, &rhs);
    let step = RoutedMatmul::<D>(routine).prepare::<NoCheckpointing>([xp.node(), wp.node()]);
    let out = finish(step.compute_bound().stateful(), (lhs, rhs), y);
    Some(Tensor::from_primitive::<Autodiff<Cube>>(out))
}

#[cfg(test)]
thread_local! {
    /// How many routed products with their bias this thread put on an autodiff graph as one
    /// node (for the tests).
    pub(crate) static AFFINE_NODES: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// `a b + bias` on an autodiff graph of cubecl tensors, the bias added in the product's launch
/// where the routine is the blocked kernel, with [`RoutedAffine`]'s backward step; `None` when
/// the operands are not on one.
///
/// # Shapes
/// - `a`: `[..., M, K]`
/// - `b`: `[..., K, N]`
/// - `bias`: `[N]`
/// - output: `[..., M, N]`
fn tracked_affine<const D: usize>(
    routine: MatmulRoutine,
    launcher: &Launcher,
    a: Tensor<D>,
    b: Tensor<D>,
    bias: Tensor<1>,
) -> Option<Tensor<D>> {
    let (Ok(ap), Ok(bp), Ok(cp)) = (
        a.try_into_primitive::<Autodiff<Cube>>(),
        b.try_into_primitive::<Autodiff<Cube>>(),
        bias.try_into_primitive::<Autodiff<Cube>>(),
    ) else {
        return None;
    };
    let (lhs, rhs, c) = (
        ap.primitive().clone(),
        bp.primitive().clone(),
        cp.primitive().clone(),
    );
    let forward = |l: &CubeTensor, r: &CubeTensor| {
        let (l, r, c) = (plain(l.clone()), plain(r.clone()), plain(c.clone()));
        primitive(affine::<D>(
            routine,
            launcher,
            l,
            r,
            Some(c),
            Activation::Identity,
        ))
    };
    let y = forward(&lhs, &rhs);
    let nodes = [ap.node(), bp.node(), cp.node()];
    let step = RoutedAffine::<D>(routine).prepare::<NoCheckpointing>(nodes);
    let out = finish(step.compute_bound().stateful(), (lhs, rhs), y);
    #[cfg(test)]
    AFFINE_NODES.set(AFFINE_NODES.get() + 1);
    Some(Tensor::from_primitive::<Autodiff<Cube>>(out))
}

/// The gradients of `a` and `b` in a routed product `y = a b` of rank `D` for the gradient `g`
/// of `y`: `da = g bᵀ`, `db = aᵀ g` (transposes of the last two dimensions), each through
/// `routine`, registered for the parents that track them.
fn product_grads<const D: usize>(
    routine: MatmulRoutine,
    [pa, pb]: [Option<NodeId>; 2],
    (a, b): (CubeTensor, CubeTensor),
    g: Tensor<D>,
    grads: &mut Gradients,
) {
    let launcher = routine.launcher().expect("a routed product has a launcher");
    // `b` a transposed view over heads (attention's `kᵀ`): its gradient as `(gᵀ a)ᵀ`, whose
    // product is stored over heads ([`launch_affine`]), so that the gradient of the tensor
    // `b` was transposed from merges its heads back as a view rather than a copy
    let heads_transposed =
        D == 4 && matches!(launcher, Launcher::Blocked(_)) && b.meta.strides[D - 1] != 1;
    if let Some(id) = pa {
        let bt = plain::<D>(b).swap_dims(D - 2, D - 1);
        let da = product(routine, &launcher, g.clone(), bt);
        grads.register::<Cube>(id, primitive(da));
    }
    if let Some(id) = pb {
        let db = if heads_transposed {
            let gt = g.swap_dims(D - 2, D - 1);
            product(routine, &launcher, gt, plain::<D>(a)).swap_dims(D - 2, D - 1)
        } else {
            product(routine, &launcher, plain::<D>(a).swap_dims(D - 2, D - 1), g)
        };
        grads.register::<Cube>(id, primitive(db));
    }
}

/// The backward step of a routed product `y = a b` ([`product_grads`]; the state holds `a`
/// and `b`).
#[derive(Debug)]
struct RoutedMatmul<const D: usize>(MatmulRoutine);

impl<const D: usize> Backward<Cube, 2> for RoutedMatmul<D> {
    type State = (CubeTensor, CubeTensor);

    fn backward(self, ops: Ops<Self::State, 2>, grads: &mut Gradients, _: &mut Checkpointer) {
        let g = plain::<D>(grads.consume::<Cube>(&ops.node));
        let ids = ops.parents.map(|p| p.map(|node| node.id));
        product_grads(self.0, ids, ops.state, g, grads);
    }
}

/// The backward step of a routed `y = a b + bias` ([`tracked_affine`]): the product's
/// gradients as [`RoutedMatmul`]'s, the bias's the gradient's column sums; through the
/// blocked kernel, `b`'s gradient and the bias's from one launch ([`launch_with_col_sums`]).
#[derive(Debug)]
struct RoutedAffine<const D: usize>(MatmulRoutine);

impl<const D: usize> Backward<Cube, 3> for RoutedAffine<D> {
    type State = (CubeTensor, CubeTensor);

    fn backward(self, ops: Ops<Self::State, 3>, grads: &mut Gradients, _: &mut Checkpointer) {
        let g = plain::<D>(grads.consume::<Cube>(&ops.node));
        let [pa, pb, pc] = ops.parents;
        // through the blocked kernel, the weight's gradient and the bias's from one launch
        if let (Some(Launcher::Blocked(blocking)), Some(wb), Some(bc)) =
            (self.0.launcher(), &pb, &pc)
        {
            let at = plain::<D>(ops.state.0.clone()).swap_dims(D - 2, D - 1);
            let launched =
                catch_unwind(AssertUnwindSafe(|| launch_with_col_sums(blocking, &at, &g)));
            match launched {
                Ok(Ok((dw, dc))) => {
                    grads.register::<Cube>(wb.id, primitive(dw));
                    grads.register::<Cube>(bc.id, primitive(dc));
                    let ids = [pa.map(|node| node.id), None];
                    product_grads(self.0, ids, ops.state, g, grads);
                    return;
                }
                // the product and the column sums apart, as below
                Ok(Err(e)) => log::debug!("no column sums in the weight gradient's launch: {e:?}"),
                Err(p) => log::debug!(
                    "no column sums in the weight gradient's launch: {}",
                    panic_message(&p)
                ),
            }
        }
        if let Some(node) = pc {
            let dc = super::cube_sum::gradient_sums(g.clone());
            grads.register::<Cube>(node.id, primitive(dc));
        }
        let ids = [pa, pb].map(|p| p.map(|node| node.id));
        product_grads(self.0, ids, ops.state, g, grads);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::module::Param;
    use burn::nn::LinearConfig;
    use burn::tensor::Distribution;
    use infembed_testkit::max_rel_diff;

    fn values<const D: usize>(t: Tensor<D>) -> Vec<f32> {
        t.into_data().convert::<f32>().try_to_vec().unwrap()
    }

    /// A linear layer (with bias) on `device` with the weights of `source` (parameters that
    /// take gradients on an autodiff device).
    fn on_device(source: &Linear, device: &Device) -> Linear {
        let mut layer = source.clone();
        layer.weight =
            Param::from_tensor(Tensor::from_data(source.weight.val().into_data(), device));
        layer.bias = source
            .bias
            .as_ref()
            .map(|b| Param::from_tensor(Tensor::from_data(b.val().into_data(), device)));
        layer
    }

    /// On wgpu (Mesa's software driver in CI), cubek's double-buffered SIMT routine and this
    /// project's blocked kernel run the products (none falls back to burn's; burn's own choice
    /// is the simple one) and give burn's `Linear::forward` at inference and, in training, the
    /// gradients of the input, the weight and the bias (of `sum(y * r)` for a fixed random
    /// `r`) that burn's ops give, without an activation and with GELU (through the blocked
    /// kernel the bias and GELU in the product's launch at inference, and in training the
    /// layer without activation one node with the bias's gradient; after cubek's routine the
    /// bias and GELU one kernel), against burn's addition and this project's GELU; a
    /// tensor-core routine does too, through burn's matmul where the driver has no tensor
    /// cores. The CPU and `burn` are not routed.
    #[test]
    fn routed_linear_equals_burns_linear_forward_and_backward() {
        let Some(gpu) = crate::test_wgpu("routed_linear_equals_burns_linear_forward_and_backward")
        else {
            return;
        };
        // random draws from the process's one generator, which the seeded tests share
        let _rng = crate::rng_lock();
        let cpu = Device::flex();
        let cpu_layer = LinearConfig::new(48, 40).init(&cpu);
        let layer = on_device(&cpu_layer, &gpu);
        let x = Tensor::<3>::random([3, 7, 48], Distribution::Normal(0.0, 1.0), &gpu);
        let r = Tensor::<3>::random([3, 7, 40], Distribution::Normal(0.0, 1.0), &gpu);
        let act_of = |act: Activation, y: Tensor<3>| match act {
            Activation::Identity => y,
            Activation::Gelu => super::super::gelu(y),
        };
        let ad = gpu.clone().autodiff();
        let grads_of = |routine: MatmulRoutine, act: Activation| {
            let layer = on_device(&cpu_layer, &ad);
            let x = Tensor::<3>::from_data(x.clone().into_data(), &ad).require_grad();
            let nodes = AFFINE_NODES.get();
            let y = if routine.is_burn() {
                act_of(act, layer.forward(x.clone()))
            } else {
                let y = try_linear(&layer, x.clone(), routine, act)
                    .expect("a wgpu f32 tensor is routed");
                // without an activation, the product and its bias are one node
                let one_node = usize::from(act == Activation::Identity);
                assert_eq!(AFFINE_NODES.get() - nodes, one_node, "{routine} {act:?}");
                y
            };
            let r = Tensor::<3>::from_data(r.clone().into_data(), &ad);
            let grads = (y * r).sum().backward();
            [
                values(x.grad(&grads).expect("the input's gradient")),
                values(layer.weight.grad(&grads).expect("the weight's")),
                values(
                    layer
                        .bias
                        .as_ref()
                        .unwrap()
                        .grad(&grads)
                        .expect("the bias'"),
                ),
            ]
        };
        let no_tensor_cores = Tensor::<1>::zeros([1], &gpu)
            .try_into_primitive::<Cube>()
            .expect("a cubecl tensor")
            .client
            .properties()
            .features
            .matmul
            .cmma
            .is_empty();
        for act in [Activation::Identity, Activation::Gelu] {
            let reference = values(act_of(act, layer.forward(x.clone())));
            let burn_grads = grads_of(MatmulRoutine::BURN, act);
            for name in [
                "double_unit",
                "blocked",
                "blocked_split",
                "simple_cyclic_cmma",
            ] {
                let routine: MatmulRoutine = name.parse().unwrap();
                let before = fallbacks();
                let y = try_linear(&layer, x.clone(), routine, act)
                    .expect("a wgpu f32 tensor is routed");
                let diff = max_rel_diff(&reference, &values(y));
                assert!(diff < 1e-5, "{name} {act:?}: the output differs by {diff}");
                let routed = grads_of(routine, act);
                for (what, a, b) in ["input", "weight", "bias"]
                    .iter()
                    .zip(burn_grads.iter().zip(&routed))
                    .map(|(w, (a, b))| (w, a, b))
                {
                    let diff = max_rel_diff(a, b);
                    assert!(
                        diff < 1e-5,
                        "{name} {act:?}: the {what}'s gradient differs by {diff}"
                    );
                }
                let fell_back = fallbacks() > before;
                if !name.contains("cmma") {
                    assert!(!fell_back, "{name}: a product fell back to burn's matmul");
                } else if no_tensor_cores {
                    assert!(fell_back, "{name} ran without tensor cores");
                }
            }
        }
        let cpu_x = Tensor::<3>::from_data(x.clone().into_data(), &cpu);
        let identity = Activation::Identity;
        let double_unit = "double_unit".parse().unwrap();
        assert!(try_linear(&cpu_layer, cpu_x, double_unit, identity).is_err());
        assert!(try_linear(&layer, x, MatmulRoutine::BURN, identity).is_err());
    }
}
