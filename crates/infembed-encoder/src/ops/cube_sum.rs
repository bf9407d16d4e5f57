//! Column sums on the cubecl devices (`wgpu`, `vulkan`, `cuda`; not a `fusion` build), and
//! the bias addition of training graphs whose backward step is one.
//!
//! The gradient of a bias, and of LayerNorm's scale and shift, sums a `[tokens, d]` gradient
//! over its rows. burn 0.22 (without its `autotune` feature) reduces a dimension with one unit
//! per output: `d` units, a few warps on a device that keeps a hundred thousand threads busy,
//! each walking thousands of rows one after the other. [`column_sums`] gives each cube
//! 32 columns of a chunk of rows instead: its 32 × 8 units read the chunk a row at a time
//! (32 neighbouring values per load), add their 8 lanes through shared memory and write one
//! partial sum per column; the partials (f32) are summed the same way until one row is left.
//! The sums are f32 whatever the tensor's float type.
//!
//! [`try_add_bias`] adds a bias on an autodiff graph of cubecl tensors with burn's addition,
//! and registers a backward step that passes the gradient through to the input and sums it
//! over the rows for the bias with [`column_sums`], where burn's broadcast backward would run
//! its one-unit-per-column reduction. (A routed linear layer through the blocked kernel adds
//! its bias in the product's launch and sums the bias's gradient with [`gradient_sums`] in
//! its own backward step; this addition serves the other routines.)

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::NoCheckpointing;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops};
use burn::backend::{Autodiff, Cube};
use burn::prelude::*;
use burn::tensor::DType;
use cubecl::ir::ElemType;
use cubecl::{CubeCount, CubeDim};

use super::cube_kit::{MAX_CUBES_X, cube, plain, primitive};
use super::routed::float_kind;

/// Columns of a cube (one warp wide).
const LANES_X: usize = 32;
/// Rows a cube reads at once (a power of two: the lanes' tree halves it).
const LANES_Y: usize = 8;
/// Rows of a chunk, the fewest a cube sums (more when the rows would need more than
/// [`MAX_CUBES_X`] chunks).
const CHUNK: usize = 64;

mod kernel {
    use cubecl::prelude::*;

    /// `out[chunk, c] = Σ input[r, c]` over the rows `r` of chunk `chunk` (`per_cube` rows
    /// from `chunk · per_cube`, the last chunk shorter): cube `(x, chunk)` sums columns
    /// `32 x ..` with units `(column, lane)`, lane `l` reading rows `l, l + lanes, ...` of
    /// the chunk. `input` `[rows, cols]` with any strides, `out` `[chunks, cols]`.
    #[allow(clippy::too_many_arguments)]
    #[cube(launch)]
    pub(super) fn column_sums<I: Float, O: Float>(
        input: &Tensor<I>,
        out: &mut Tensor<O>,
        rows: usize,
        per_cube: usize,
        #[comptime] lanes_x: usize,
        #[comptime] lanes_y: usize,
        #[define(I)] _input_dtype: ElemType,
        #[define(O)] _output_dtype: ElemType,
    ) {
        let cols = input.shape(1);
        let column = UNIT_POS_X as usize;
        let lane = UNIT_POS_Y as usize;
        let col = CUBE_POS_X as usize * lanes_x + column;
        let chunk = CUBE_POS_Y as usize;
        let start = chunk * per_cube;
        let end = select(start + per_cube < rows, start + per_cube, rows);
        let (row_step, col_step) = (input.stride(0), input.stride(1));

        let mut sum = 0.0f32;
        if col < cols {
            let mut r = start + lane;
            while r < end {
                sum += f32::cast_from(input[r * row_step + col * col_step]);
                r += lanes_y;
            }
        }
        // the lanes' tree, its levels unrolled (barriers in uniform control flow)
        let mut partial = Shared::<[f32]>::new_slice(lanes_x * lanes_y);
        let slot = lane * lanes_x + column;
        partial[slot] = sum;
        sync_cube();
        #[unroll]
        for level in 1..lanes_y.trailing_zeros() + 1 {
            let half = comptime!(lanes_y) >> level;
            if lane < half {
                partial[slot] += partial[slot + half * lanes_x];
            }
            sync_cube();
        }
        let at = chunk * out.stride(0) + col * out.stride(1);
        if lane == 0 && col < cols {
            out[at] = O::cast_from(partial[column]);
        }
    }
}

/// `Σ_r x[r, c]`, as a `[cols]` tensor of `dtype` (a float type), when `x` is a plain float
/// tensor of a cubecl device (any strides); `None` otherwise, and for more columns than one
/// axis of cubes holds (2 million).
///
/// # Shapes
/// - `x`: `[rows, cols]`
/// - output: `[cols]`
pub(crate) fn column_sums(x: &Tensor<2>, dtype: DType) -> Option<Tensor<1>> {
    let [rows, cols] = x.dims();
    let device = x.device();
    let (Some(_), Some(out_kind)) = (float_kind(x.dtype()), float_kind(dtype)) else {
        return None;
    };
    let cubes_x = u32::try_from(cols.div_ceil(LANES_X))
        .ok()
        .filter(|&c| c as usize <= MAX_CUBES_X)?;
    if device.is_autodiff() || cube(x).is_none() {
        return None;
    }
    if rows == 0 || cols == 0 {
        return Some(Tensor::zeros([cols], (&device, dtype)));
    }
    let (mut input, mut rows) = (x.clone(), rows);
    loop {
        let per_cube = CHUNK.max(rows.div_ceil(MAX_CUBES_X));
        let chunks = rows.div_ceil(per_cube);
        let (out_dtype, kind) = if chunks == 1 {
            (dtype, out_kind)
        } else {
            (DType::F32, cubecl::ir::FloatKind::F32)
        };
        let out = Tensor::<2>::empty([chunks, cols], (&device, out_dtype));
        let (ip, op) = (cube(&input)?, cube(&out)?);
        let in_kind = float_kind(input.dtype())?;
        let client = op.client.clone();
        kernel::column_sums::launch(
            &client,
            CubeCount::Static(cubes_x, chunks as u32, 1),
            CubeDim::new_2d(LANES_X as u32, LANES_Y as u32),
            ip.into_tensor_arg(),
            op.into_tensor_arg(),
            rows,
            per_cube,
            LANES_X,
            LANES_Y,
            ElemType::Float(in_kind),
            ElemType::Float(kind),
        );
        if chunks == 1 {
            return Some(out.reshape([cols]));
        }
        (input, rows) = (out, chunks);
    }
}

/// `Σ_r g[r, c]` of a gradient `[..., d]` of a plain cubecl tensor, as `[d]` of its type:
/// [`column_sums`], or burn's sum where that does not run.
pub(super) fn gradient_sums<const D: usize>(g: Tensor<D>) -> Tensor<1> {
    let d = g.dims()[D - 1];
    let rows = g.dims()[..D - 1].iter().product();
    let g2 = g.reshape([rows, d]);
    column_sums(&g2, g2.dtype()).unwrap_or_else(|| g2.sum_dim(0).reshape([d]))
}

/// `y + b`, `b` broadcast over the leading dimensions of `y`, on an autodiff graph of cubecl
/// tensors of one float type, with the backward step of [`BiasBackward`]; anything else is
/// handed back as `Err`.
///
/// # Shapes
/// - `y`: `[..., d]`
/// - `b`: `[d]`
/// - output: `[..., d]`
#[allow(clippy::result_large_err)]
pub(crate) fn try_add_bias<const D: usize>(
    y: Tensor<D>,
    b: Tensor<1>,
) -> Result<Tensor<D>, (Tensor<D>, Tensor<1>)> {
    let d = y.dims()[D - 1];
    if b.dims() != [d] || b.dtype() != y.dtype() || float_kind(y.dtype()).is_none() {
        return Err((y, b));
    }
    let (Ok(yp), Ok(bp)) = (
        y.clone().try_into_primitive::<Autodiff<Cube>>(),
        b.clone().try_into_primitive::<Autodiff<Cube>>(),
    ) else {
        return Err((y, b));
    };
    let sum = plain::<D>(yp.primitive().clone()) + plain::<1>(bp.primitive().clone()).unsqueeze();
    let sum = primitive(sum);
    let out = BiasBackward::<D>
        .prepare::<NoCheckpointing>([yp.node(), bp.node()])
        .compute_bound()
        .stateless(sum);
    Ok(Tensor::from_primitive::<Autodiff<Cube>>(out))
}

/// The backward step of `y + b` ([`try_add_bias`]): the gradient itself for `y`, its sums
/// over the rows for `b`.
#[derive(Debug)]
struct BiasBackward<const D: usize>;

impl<const D: usize> Backward<Cube, 2> for BiasBackward<D> {
    type State = ();

    fn backward(self, ops: Ops<Self::State, 2>, grads: &mut Gradients, _: &mut Checkpointer) {
        let g = grads.consume::<Cube>(&ops.node);
        let [py, pb] = ops.parents;
        if let Some(node) = pb {
            let db = gradient_sums(plain::<D>(g.clone()));
            grads.register::<Cube>(node.id, primitive(db));
        }
        if let Some(node) = py {
            grads.register::<Cube>(node.id, g);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::tensor::{Distribution, TensorData};
    use infembed_testkit::max_rel_diff;

    fn values<const D: usize>(t: Tensor<D>) -> Vec<f32> {
        t.into_data().convert::<f32>().try_to_vec::<f32>().unwrap()
    }

    /// Column sums on wgpu (Mesa's software driver in CI) equal naive f64 sums on the host:
    /// fewer columns than a cube's 32 and not a multiple of them, one chunk and many, partial
    /// sums summed twice (200,000 rows), a transposed input read in place, an f16 input summed
    /// into f32 and into f16.
    #[test]
    fn column_sums_equal_naive_sums() {
        let Some(gpu) = crate::test_wgpu("column_sums_equal_naive_sums") else {
            return;
        };
        let _rng = crate::rng_lock();
        gpu.seed(23);
        let naive = |x: &[f32], cols: usize| -> Vec<f32> {
            let mut sums = vec![0f64; cols];
            for row in x.chunks(cols) {
                for (s, &v) in sums.iter_mut().zip(row) {
                    *s += f64::from(v);
                }
            }
            sums.into_iter().map(|s| s as f32).collect()
        };
        for (rows, cols) in [
            (1, 1),
            (3, 5),
            (64, 384),
            (65, 33),
            (2_400, 384),
            (200_000, 3),
        ] {
            let x = Tensor::<2>::random([rows, cols], Distribution::Normal(0.5, 1.0), &gpu);
            let host = values(x.clone());
            let expected = naive(&host, cols);
            let got = column_sums(&x, DType::F32).expect("a plain wgpu tensor");
            let diff = max_rel_diff(&expected, &values(got));
            assert!(diff < 1e-5, "[{rows}, {cols}]: {diff}");

            // the same values stored `[cols, rows]`, read through swapped dims
            let mut stored = vec![0f32; host.len()];
            for (i, &v) in host.iter().enumerate() {
                stored[(i % cols) * rows + i / cols] = v;
            }
            let strided =
                Tensor::<2>::from_data(TensorData::new(stored, [cols, rows]), &gpu).swap_dims(0, 1);
            let got = column_sums(&strided, DType::F32).expect("a strided wgpu tensor");
            let diff = max_rel_diff(&expected, &values(got));
            assert!(diff < 1e-5, "[{rows}, {cols}] transposed: {diff}");
        }
        let x16 =
            Tensor::<2>::random([500, 40], Distribution::Normal(0.5, 1.0), &gpu).cast(DType::F16);
        let expected = naive(&values(x16.clone()), 40);
        let got = column_sums(&x16, DType::F32).expect("f16 into f32");
        assert!(max_rel_diff(&expected, &values(got)) < 1e-5, "f16 into f32");
        let got = column_sums(&x16, DType::F16).expect("f16 into f16");
        assert!(max_rel_diff(&expected, &values(got)) < 2e-3, "f16 into f16");

        let empty = Tensor::<2>::zeros([0, 7], &gpu);
        assert_eq!(
            values(column_sums(&empty, DType::F32).unwrap()),
            vec![0.0; 7]
        );
        let ad = Tensor::<2>::zeros([2, 3], &gpu.autodiff());
        assert!(column_sums(&ad, DType::F32).is_none(), "an autodiff tensor");
    }

    /// On a wgpu autodiff graph, the bias addition with its column-sum backward gives burn's
    /// `y + b` and burn's gradients for both operands, ranks 2 and 3; a bias of another width
    /// is handed back.
    #[test]
    fn bias_addition_equals_burns_forward_and_backward() {
        let Some(gpu) = crate::test_wgpu("bias_addition_equals_burns_forward_and_backward") else {
            return;
        };
        let _rng = crate::rng_lock();
        gpu.seed(29);
        let ad = gpu.clone().autodiff();
        for dims in [[3, 70, 48], [1, 1, 5], [2, 300, 384]] {
            let y0 = Tensor::<3>::random(dims, Distribution::Normal(0.0, 1.0), &gpu);
            let b0 = Tensor::<1>::random([dims[2]], Distribution::Normal(0.0, 1.0), &gpu);
            let w = Tensor::<3>::random(dims, Distribution::Normal(0.0, 1.0), &ad);
            let run = |ours: bool| {
                let y = Tensor::<3>::from_data(y0.to_data(), &ad).require_grad();
                let b = Tensor::<1>::from_data(b0.to_data(), &ad).require_grad();
                // a product before the sum gives the gradient of `y` a shape of its own
                let y2 = y.clone() * 2.0;
                let out = if ours {
                    try_add_bias(y2, b.clone()).expect("an autodiff wgpu graph")
                } else {
                    y2 + b.clone().unsqueeze()
                };
                let grads = (out.clone() * w.clone()).sum().backward();
                let gy = y.grad(&grads).unwrap();
                let gb = b.grad(&grads).unwrap();
                (values(out), values(gy), values(gb))
            };
            let (burn, ours) = (run(false), run(true));
            assert!(max_rel_diff(&burn.0, &ours.0) < 1e-6, "{dims:?} values");
            assert!(max_rel_diff(&burn.1, &ours.1) < 1e-6, "{dims:?} dy");
            assert!(max_rel_diff(&burn.2, &ours.2) < 1e-5, "{dims:?} db");
            let flat = Tensor::<2>::from_data(
                y0.clone().reshape([dims[0] * dims[1], dims[2]]).to_data(),
                &ad,
            );
            let b = Tensor::<1>::from_data(b0.to_data(), &ad).require_grad();
            let out = try_add_bias(flat.clone(), b.clone()).expect("rank 2");
            let expected = flat + b.clone().unsqueeze();
            assert!(
                max_rel_diff(&values(expected), &values(out.clone())) < 1e-6,
                "rank 2"
            );
            let grads = out.sum().backward();
            let rows = (dims[0] * dims[1]) as f32;
            assert!(
                values(b.grad(&grads).unwrap())
                    .iter()
                    .all(|&g| (g - rows).abs() < 1e-3),
                "rank 2 db"
            );
        }
        let y = Tensor::<2>::zeros([2, 3], &ad);
        assert!(
            try_add_bias(y, Tensor::<1>::zeros([4], &ad)).is_err(),
            "a bias of another width"
        );
        let y = Tensor::<2>::zeros([2, 3], &gpu);
        assert!(
            try_add_bias(y, Tensor::<1>::zeros([3], &gpu)).is_err(),
            "a plain tensor"
        );
    }
}
