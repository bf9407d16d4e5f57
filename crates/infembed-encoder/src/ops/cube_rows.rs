//! A gather of rows as one kernel on the cubecl devices (`wgpu`, `vulkan`, `cuda`; not a
//! `fusion` build): the packing's moves between the packed and the padded layouts
//! ([`super::Packing`]).
//!
//! A move into the padded layout reads a zero row for every padding position. With burn's ops
//! that row is appended first (a zeroed row and a concatenation, three launches that copy the
//! whole input) and the gather follows. [`take_rows`] reads an index past the input's last
//! row as a zero row instead, in the one launch of the gather.

use burn::prelude::*;
use burn::tensor::DType;
use cubecl::CubeDim;
use cubecl::ir::{ElemType, IntKind, UIntKind};

use super::cube_kit::{cube_count, primitive};
use super::routed::{CubeTensor, float_kind};

/// Units of a cube.
const UNITS: usize = 256;

mod kernel {
    use cubecl::prelude::*;

    use crate::ops::cube_kit::kernel::flat_unit;

    /// `out[r, c] = x[index[r], c]`, zero where `index[r]` is past `x`'s last row: `x`
    /// `[N, d]` and `out` `[M, d]` with any strides, `index` `[M]`.
    #[allow(clippy::too_many_arguments)]
    #[cube(launch)]
    pub(super) fn gather_rows<F: Float, I: Int>(
        x: &Tensor<F>,
        index: &Tensor<I>,
        out: &mut Tensor<F>,
        rows: usize,
        #[comptime] units: usize,
        #[define(F)] _float: ElemType,
        #[define(I)] _int: ElemType,
    ) {
        let d = out.shape(1);
        let i = flat_unit(units);
        if i < rows * d {
            let (r, c) = (i / d, i % d);
            let source = usize::cast_from(index[r * index.stride(0)]);
            let at = r * out.stride(0) + c * out.stride(1);
            if source < x.shape(0) {
                out[at] = x[source * x.stride(0) + c * x.stride(1)];
            } else {
                out[at] = F::new(0.0);
            }
        }
    }
}

/// The kernel's type of an integer index tensor's elements.
pub(super) fn int_elem(dtype: DType) -> Option<ElemType> {
    Some(match dtype {
        DType::I64 => ElemType::Int(IntKind::I64),
        DType::I32 => ElemType::Int(IntKind::I32),
        DType::U32 => ElemType::UInt(UIntKind::U32),
        DType::U64 => ElemType::UInt(UIntKind::U64),
        _ => return None,
    })
}

/// The rows of `x` at `index`, an index past `x`'s last row reading a zero row, as one
/// launch, when `x` is a float and `index` an integer primitive of a cubecl device (neither
/// stored tiled); `None` otherwise.
///
/// # Shapes
/// - `x`: `[N, d]`
/// - `index`: `[M]`
/// - output: `[M, d]`
pub(crate) fn take_rows(x: &CubeTensor, index: &CubeTensor) -> Option<CubeTensor> {
    let (shape, index_shape) = (x.meta.shape(), index.meta.shape());
    if shape.num_dims() != 2
        || index_shape.num_dims() != 1
        || x.meta.is_tiled()
        || index.meta.is_tiled()
    {
        return None;
    }
    let (float, int) = (float_kind(x.dtype)?, int_elem(index.dtype)?);
    let (m, d) = (index_shape[0], shape[1]);
    let xt = Tensor::<2>::from_primitive::<burn::backend::Cube>(x.clone());
    let out = Tensor::<2>::empty([m, d], (&xt.device(), x.dtype));
    if m * d == 0 {
        return Some(primitive(out));
    }
    let op = primitive(out);
    let client = op.client.clone();
    kernel::gather_rows::launch(
        &client,
        cube_count((m * d).div_ceil(UNITS))?,
        CubeDim::new_1d(UNITS as u32),
        x.clone().into_tensor_arg(),
        index.clone().into_tensor_arg(),
        op.clone().into_tensor_arg(),
        m,
        UNITS,
        ElemType::Float(float),
        int,
    );
    Some(op)
}
