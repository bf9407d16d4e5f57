//! This project's own matrix product for the cubecl devices: a register-blocked SIMT kernel
//! (the `blocked` routines of [`crate::MatmulRoutine`]).
//!
//! On an H100 through Vulkan every product of the encoder ran cubek's plain SIMT kernel at
//! about 6 TFLOP/s, a tenth of the GPU's f32 rate without tensor cores (docs/devices.md,
//! "Where a GPU step goes"), and Vulkan offers tensor cores no f32 type. This kernel is the
//! classic layout for f32 products on such hardware, offered beside cubek's routines so that
//! the GPU check's routine sweep can time it against them:
//!
//! - each cube computes a `BM x BN` block of the output with `(BM / TM) (BN / TN)` units, each
//!   unit a `TM x TN` grid of it held in registers, summed in f32;
//! - the operands' `BM x BK` and `BK x BN` slices pass through shared memory, loaded along
//!   whichever dimension is contiguous in memory (a transposed view is read in place, as the
//!   backward products read `Wᵀ` and `xᵀ`), and stored k-major with each row padded to
//!   `32 / BK` words past a multiple of 32, so that a warp's f32 stores of a depth-contiguous
//!   operand meet no shared-memory bank conflict and the inner loop's reads are conflict-free
//!   or broadcast;
//! - a unit's rows and columns are strided by the unit grid (unit `(ty, tx)` owns rows
//!   `ty + i BM / TM` and columns `tx + j BN / TN`), so neighbouring units read neighbouring
//!   shared words and write neighbouring output columns;
//! - while the cube computes on the slices in shared memory, each unit fetches its share of
//!   the next ones into registers (the global reads' latency hidden behind the arithmetic);
//! - the edges (any `M`, `N`, `K`) are loaded as zeros and not written; any batch dimensions
//!   (shared by the operands and the output, each read through its own strides: attention's
//!   `[B, H, L, Dh]` head views of `[B, L, H Dh]` rows need no copy).
//!
//! Two block sizes: `128 x 128` (8 x 8 a unit, 256 units) for products with enough blocks to
//! fill the device twice, `64 x 64` (4 x 4 a unit, 256 units) for the smaller ones.
//!
//! An epilogue ([`Epilogue`]) adds a linear layer's bias to each output element's f32 sum
//! before it is stored, then applies GELU if asked, so that neither costs a launch of its own.
//!
//! Through the `blocked_split` routine (the default since an H200 timed it against `blocked`,
//! 2026-11-28: a training step 0.35x -> 0.39x PyTorch's in the same run), a product
//! whose blocks do not fill the device twice and whose depth is long (the weight gradients,
//! whose depth is the batch's tokens; the feed-forward down product and the input gradient of
//! the up product, 1,536 deep) has its depth split ([`parts_for`]): each cube sums one run of
//! it for its block into an f32 partial output, and a second launch adds the parts in order,
//! so the result does not depend on scheduling.

use burn::tensor::DType;
use cubecl::ir::{ElemType, FloatKind};
use cubecl::{CubeCount, CubeDim};

use super::routed::{LaunchError, Operands};

/// The block and unit tile of a launch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct Tile {
    /// Output rows of a cube.
    bm: usize,
    /// Output columns of a cube.
    bn: usize,
    /// The depth of the operands' slices in shared memory.
    bk: usize,
    /// Output rows of a unit.
    tm: usize,
    /// Output columns of a unit.
    tn: usize,
}

impl Tile {
    /// `128 x 128` blocks, `8 x 8` a unit.
    pub(crate) const LARGE: Self = Self {
        bm: 128,
        bn: 128,
        bk: 8,
        tm: 8,
        tn: 8,
    };
    /// `64 x 64` blocks, `4 x 4` a unit.
    pub(crate) const SMALL: Self = Self {
        bm: 64,
        bn: 64,
        bk: 16,
        tm: 4,
        tn: 4,
    };

    fn units(self) -> usize {
        (self.bm / self.tm) * (self.bn / self.tn)
    }

    /// Extra words at the end of each shared-memory row: with 32 banks of 4-byte words, a row
    /// of `32 / bk` words past a multiple of 32 (`bm` and `bn` are multiples of 32) puts the
    /// `bk` depth slots of one row `32 / bk` banks apart and the next rows in the gaps, so a
    /// warp's stores of a depth-contiguous operand hit 32 different banks.
    fn pad(self) -> usize {
        32 / self.bk
    }

    fn blocks(self, [b, m, n]: [usize; 3]) -> [usize; 3] {
        [n.div_ceil(self.bn), m.div_ceil(self.bm), b]
    }

    /// The tile for a `[B, M, N]` output on a device of `sms` multiprocessors:
    /// the large one when the output is at least one large block tall and wide and its blocks
    /// fill the device twice, else the small one (which wastes less of a block on attention's
    /// `L x L` scores and `L x 32` contexts).
    pub(crate) fn for_output(out: [usize; 3], sms: usize) -> Self {
        let [_, m, n] = out;
        let [x, y, z] = Self::LARGE.blocks(out);
        if m >= Self::LARGE.bm && n >= Self::LARGE.bn && x * y * z >= 2 * sms {
            Self::LARGE
        } else {
            Self::SMALL
        }
    }
}

/// What a product's launch does to each output element after its sum and before storing it
/// (a linear layer's bias and activation, so that they cost no launch of their own).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub(crate) struct Epilogue {
    /// Add the bias of the element's column (`[N]`).
    pub(crate) bias: bool,
    /// Then apply the exact (erf) GELU.
    pub(crate) gelu: bool,
}

/// A launch's comptime layout: its tile, which operands are contiguous along their last
/// dimension (`lhs` along `K`, `rhs` along `N`), whether the depth is split (the output then
/// holds each part's f32 sums, `[parts · B, M, N]`, for [`kernel::sum_parts`]), its
/// epilogue (none when split: [`kernel::sum_parts`] applies it), and whether the output has
/// one more row, `M`, for the column sums of `rhs` (one batch).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Layout {
    tile: Tile,
    lhs_k_major: bool,
    rhs_n_major: bool,
    split: bool,
    epilogue: Epilogue,
    col_sums: bool,
}

mod kernel {
    use cubecl::prelude::*;

    use super::{Epilogue, Layout};
    use crate::ops::cube_kit::kernel::{flat_unit, normal_cdf};

    /// An output element's f32 sum through the epilogue: plus `bias[col]` (read only with
    /// `epilogue.bias`), then GELU `z Φ(z)` (with `epilogue.gelu`), as the bias + GELU kernel
    /// computes it.
    #[cube]
    fn apply_epilogue<F: Float>(
        sum: f32,
        bias: &Tensor<F>,
        col: usize,
        #[comptime] epilogue: Epilogue,
    ) -> f32 {
        let mut z = sum;
        if epilogue.bias {
            z += f32::cast_from(bias[col * bias.stride(0)]);
        }
        if epilogue.gelu {
            z *= normal_cdf(z);
        }
        z
    }

    /// Where an operand's elements sit: `base + row * along_rows + depth * along_depth`.
    #[derive(CubeType)]
    pub(super) struct Strided {
        base: usize,
        along_rows: usize,
        along_depth: usize,
    }

    /// What a unit needs to fetch its share of the operands' slices: where the operands' `M x
    /// K` (`lhs`) and `N x K` (`rhs`) elements sit, the block's first row and column, the
    /// product's extents, and the unit's index in the cube.
    #[derive(CubeType)]
    pub(super) struct Window {
        lhs: Strided,
        rhs: Strided,
        row0: usize,
        col0: usize,
        m: usize,
        n: usize,
        k: usize,
        unit: usize,
    }

    /// Slot `e` of a `rows x depth` slice as `(row, depth)`: consecutive slots walk the depth
    /// when `depth_major` (the operand is contiguous along its depth), else the rows, so that
    /// neighbouring units read neighbouring words.
    #[cube]
    fn slot(
        e: usize,
        #[comptime] rows: usize,
        #[comptime] depth: usize,
        #[comptime] depth_major: bool,
    ) -> (usize, usize) {
        let mut row = e % rows;
        let mut d = e / rows;
        if depth_major {
            row = e / depth;
            d = e % depth;
        }
        (row, d)
    }

    /// A unit's share of the `rows x depth` slice of `operand` whose first row is `row0` and
    /// first depth `d0`, into `into` (zeros past `row_end` and `depth_end`).
    #[allow(clippy::too_many_arguments)]
    #[cube]
    fn fetch<F: Float>(
        operand: &Tensor<F>,
        at: &Strided,
        into: &mut Array<F>,
        row0: usize,
        row_end: usize,
        d0: usize,
        depth_end: usize,
        unit: usize,
        #[comptime] units: usize,
        #[comptime] rows: usize,
        #[comptime] depth: usize,
        #[comptime] depth_major: bool,
    ) {
        #[unroll]
        for l in 0..rows * depth / units {
            let (r, c) = slot(unit + l * units, rows, depth, depth_major);
            let gr = row0 + r;
            let gc = d0 + c;
            let mut v = F::new(0.0);
            if gr < row_end && gc < depth_end {
                v = operand[at.base + gr * at.along_rows + gc * at.along_depth];
            }
            into[l] = v;
        }
    }

    /// A unit's share of both operands' slices at depth `d0` into registers.
    #[cube]
    fn fetch_slices<F: Float>(
        lhs: &Tensor<F>,
        rhs: &Tensor<F>,
        w: &Window,
        a: &mut Array<F>,
        b: &mut Array<F>,
        d0: usize,
        #[comptime] layout: Layout,
    ) {
        let t = layout.tile;
        let units = t.units();
        fetch::<F>(
            lhs,
            &w.lhs,
            a,
            w.row0,
            w.m,
            d0,
            w.k,
            w.unit,
            units,
            t.bm,
            t.bk,
            layout.lhs_k_major,
        );
        fetch::<F>(
            rhs,
            &w.rhs,
            b,
            w.col0,
            w.n,
            d0,
            w.k,
            w.unit,
            units,
            t.bn,
            t.bk,
            !layout.rhs_n_major,
        );
    }

    /// One `bm x bn` block of `out = lhs · rhs` per cube (module docs). `lhs`: `[..., M, K]`,
    /// `rhs`: `[..., K, N]`, any strides (a GPU runtime may pad the rows of a new tensor).
    ///
    /// The depth is cut into `parts` runs of `run` (split: a multiple of the tile's depth, the
    /// last run no longer; unsplit: one run of the whole depth), and cube `z` sums run `z %
    /// parts` of batch `z / parts` (the batches counted over the operands' batch dimensions,
    /// the last fastest). Unsplit (`parts` 1), `out` is `[..., M, N]` with the operands' batch
    /// dimensions; split, it is `[parts · B, M, N]`, part `p` of batch `b` at `p · B + b`,
    /// summed by [`sum_parts`]. Each element passes through `layout.epilogue` (the bias `[N]`
    /// is read only when it says so) before it is stored.
    ///
    /// With `layout.col_sums` (one batch), the output has one more row, `M`, that receives
    /// `Σ_k rhs[k, n]` over the cube's run of the depth (the bias gradient beside a linear
    /// layer's weight gradient `xᵀ g`): the units of the cube's first row add up the `rhs`
    /// values they read from shared memory anyway, and those of the first block row store
    /// them, without the epilogue.
    // the comptime tests (`layout.*`) stay apart from the runtime ones: cubecl expands a
    // comptime `if` when it builds the kernel
    #[allow(clippy::too_many_arguments, clippy::collapsible_if)]
    #[cube(launch)]
    pub(super) fn blocked_matmul<F: Float, O: Float>(
        lhs: &Tensor<F>,
        rhs: &Tensor<F>,
        bias: &Tensor<F>,
        out: &mut Tensor<O>,
        parts: usize,
        run: usize,
        #[comptime] layout: Layout,
        #[define(F)] _dtype: ElemType,
        #[define(O)] _out_dtype: ElemType,
    ) {
        let t = layout.tile;
        let (bm, bn, bk, tm, tn) = (t.bm, t.bn, t.bk, t.tm, t.tn);
        let units_x = bn / tn;
        let units = t.units();
        let unit = UNIT_POS as usize;
        let ty = unit / units_x;
        let tx = unit % units_x;
        let part = CUBE_POS_Z as usize % parts;
        let batch = CUBE_POS_Z as usize / parts;
        // where this cube's batch starts in each operand (and, unsplit, in the output), by
        // its own strides
        let rank = lhs.rank();
        let (rows_dim, cols_dim) = (rank - 2, rank - 1);
        let mut rest = batch;
        let mut lhs_base = 0usize;
        let mut rhs_base = 0usize;
        let mut out_base = 0usize;
        for i in 0..rows_dim {
            let d = rows_dim - 1 - i;
            let size = lhs.shape(d);
            let index = rest % size;
            rest /= size;
            lhs_base += index * lhs.stride(d);
            rhs_base += index * rhs.stride(d);
            if !layout.split {
                out_base += index * out.stride(d);
            }
        }
        if layout.split {
            let batches = out.shape(0) / parts;
            out_base = (part * batches + batch) * out.stride(0);
        }
        let n = rhs.shape(cols_dim);
        let k = lhs.shape(cols_dim);
        let k_begin = part * run;
        let k_end = select(k_begin + run < k, k_begin + run, k);
        let w = Window {
            lhs: Strided {
                base: lhs_base,
                along_rows: lhs.stride(rows_dim),
                along_depth: lhs.stride(cols_dim),
            },
            rhs: Strided {
                base: rhs_base,
                along_rows: rhs.stride(cols_dim),
                along_depth: rhs.stride(rows_dim),
            },
            row0: CUBE_POS_Y as usize * bm,
            col0: CUBE_POS_X as usize * bn,
            m: lhs.shape(rows_dim),
            n,
            k: k_end,
            unit,
        };

        // k-major slices: a_s[c][r] (row stride bm + pad), b_s[c][j] (bn + pad)
        let a_row = bm + t.pad();
        let b_row = bn + t.pad();
        let mut a_s = Shared::<[F]>::new_slice(bk * a_row);
        let mut b_s = Shared::<[F]>::new_slice(bk * b_row);
        let mut acc = Array::<f32>::new(tm * tn);
        #[unroll]
        for i in 0..tm * tn {
            acc[i] = 0.0;
        }
        let mut a_r = Array::<f32>::new(tm);
        let mut b_r = Array::<f32>::new(tn);
        // the column sums of `rhs` (with `layout.col_sums`; units of the first row only)
        let mut col = Array::<f32>::new(tn);
        #[unroll]
        for j in 0..tn {
            col[j] = 0.0;
        }
        let sums_columns = ty == 0;

        // each unit fetches its share of the next slices into registers while the cube
        // computes on the current ones in shared memory
        let a_loads = bm * bk / units;
        let b_loads = bk * bn / units;
        let mut a_next = Array::<F>::new(a_loads);
        let mut b_next = Array::<F>::new(b_loads);
        fetch_slices::<F>(lhs, rhs, &w, &mut a_next, &mut b_next, k_begin, layout);
        let mut k0 = k_begin;
        while k0 < w.k {
            #[unroll]
            for l in 0..a_loads {
                let (r, c) = slot(unit + l * units, bm, bk, layout.lhs_k_major);
                a_s[c * a_row + r] = a_next[l];
            }
            #[unroll]
            for l in 0..b_loads {
                let (j, c) = slot(unit + l * units, bn, bk, !layout.rhs_n_major);
                b_s[c * b_row + j] = b_next[l];
            }
            sync_cube();
            let next = k0 + bk;
            if next < w.k {
                fetch_slices::<F>(lhs, rhs, &w, &mut a_next, &mut b_next, next, layout);
            }

            #[unroll]
            for kk in 0..bk {
                #[unroll]
                for i in 0..tm {
                    a_r[i] = f32::cast_from(a_s[kk * a_row + ty + i * (bm / tm)]);
                }
                #[unroll]
                for j in 0..tn {
                    b_r[j] = f32::cast_from(b_s[kk * b_row + tx + j * units_x]);
                }
                if layout.col_sums {
                    if sums_columns {
                        #[unroll]
                        for j in 0..tn {
                            col[j] += b_r[j];
                        }
                    }
                }
                #[unroll]
                for i in 0..tm {
                    #[unroll]
                    for j in 0..tn {
                        acc[i * tn + j] += a_r[i] * b_r[j];
                    }
                }
            }
            sync_cube();
            k0 = next;
        }

        let out_rank = out.rank();
        let (out_m, out_n) = (out.stride(out_rank - 2), out.stride(out_rank - 1));
        #[unroll]
        for i in 0..tm {
            let gr = w.row0 + ty + i * (bm / tm);
            #[unroll]
            for j in 0..tn {
                let gj = w.col0 + tx + j * units_x;
                if gr < w.m && gj < n {
                    let v = apply_epilogue::<F>(acc[i * tn + j], bias, gj, layout.epilogue);
                    out[out_base + gr * out_m + gj * out_n] = O::cast_from(v);
                }
            }
        }
        if layout.col_sums {
            if sums_columns && CUBE_POS_Y == 0 {
                #[unroll]
                for j in 0..tn {
                    let gj = w.col0 + tx + j * units_x;
                    if gj < n {
                        out[out_base + w.m * out_m + gj * out_n] = O::cast_from(col[j]);
                    }
                }
            }
        }
    }

    /// `out[b, r, c] = Σ_p sums[p · B + b, r, c]`, the parts in order, through `epilogue`
    /// (`sums` `[parts · B, M, N]` of f32, `out` `[..., M, N]` with `B` batches over its batch
    /// dimensions, `bias` `[N]`; any strides), one unit an element (cubes on two axes).
    #[allow(clippy::too_many_arguments)]
    #[cube(launch)]
    pub(super) fn sum_parts<O: Float>(
        sums: &Tensor<f32>,
        bias: &Tensor<O>,
        out: &mut Tensor<O>,
        parts: usize,
        #[comptime] units: usize,
        #[comptime] epilogue: Epilogue,
        #[define(O)] _dtype: ElemType,
    ) {
        let (batches, m, n) = (sums.shape(0) / parts, sums.shape(1), sums.shape(2));
        let index = flat_unit(units);
        if index < batches * m * n {
            let c = index % n;
            let r = (index / n) % m;
            let batch = index / (m * n);
            let at = r * sums.stride(1) + c * sums.stride(2);
            let mut total = 0.0f32;
            for p in 0..parts {
                total += sums[(p * batches + batch) * sums.stride(0) + at];
            }
            let rank = out.rank();
            let mut rest = batch;
            let mut out_at = r * out.stride(rank - 2) + c * out.stride(rank - 1);
            for i in 0..rank - 2 {
                let d = rank - 3 - i;
                let size = out.shape(d);
                out_at += (rest % size) * out.stride(d);
                rest /= size;
            }
            out[out_at] = O::cast_from(apply_epilogue::<O>(total, bias, c, epilogue));
        }
    }
}

#[cfg(test)]
thread_local! {
    /// How many products this thread sent to the kernel (for the tests; see
    /// `routed::fallbacks`).
    pub(crate) static LAUNCHES: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// How a product is blocked: its tile (`None`: [`Tile::for_output`]) and into how many parts
/// its depth is split (`None`: [`parts_for`], the `blocked_split` routine; `Some(1)`: never,
/// the other `blocked` ones).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct Blocking {
    pub(crate) tile: Option<Tile>,
    pub(crate) parts: Option<usize>,
}

/// The multiprocessors of a device that does not report them (wgpu does not).
const ASSUMED_SMS: usize = 100;

/// The shallowest run of the depth that a part of a split product sums (but the last part).
const MIN_RUN: usize = 256;

/// The fewest multiply-adds (`B M N K`) of a product worth a second launch: below it, the
/// launch costs more than the idle device.
const MIN_SPLIT_WORK: usize = 1 << 24;

/// The most parts a product's depth is split into.
const MAX_PARTS: usize = 16;

/// Into how many parts to split the depth `k` of a product with a `[B, M, N]` output blocked
/// by `tile`, on a device of `sms` multiprocessors ([`ASSUMED_SMS`] through wgpu, which does
/// not say): one when its blocks fill the device twice or it has fewer than
/// [`MIN_SPLIT_WORK`] multiply-adds, else enough parts to make four cubes a multiprocessor as
/// far as the depth allows (each part at least [`MIN_RUN`] deep, but the last), and at most
/// [`MAX_PARTS`].
///
/// A product with a small output and a deep sum has few blocks, each summing the whole depth
/// one after the other while most of the device waits: the weight gradients of the encoder's
/// `384 x 384` projections are 36 blocks of `64 x 64` over the batch's tokens. Split, each
/// cube sums a run of the depth into an f32 partial output, and one more launch adds the
/// parts ([`kernel::sum_parts`]).
fn parts_for(tile: Tile, out: [usize; 3], k: usize, sms: usize) -> usize {
    let [x, y, z] = tile.blocks(out);
    let blocks = (x * y * z).max(1);
    let [b, m, n] = out;
    if blocks >= 2 * sms || b * m * n * k < MIN_SPLIT_WORK {
        return 1;
    }
    (4 * sms)
        .div_ceil(blocks)
        .min(k / MIN_RUN)
        .clamp(1, MAX_PARTS)
}

/// The run of the depth `k` each of (at most) `parts` parts sums: a multiple of the tile's
/// depth; and how many parts that makes (at least one).
fn runs(tile: Tile, k: usize, parts: usize) -> (usize, usize) {
    let run = k
        .div_ceil(parts.max(1))
        .next_multiple_of(tile.bk)
        .max(tile.bk);
    (run, k.div_ceil(run).max(1))
}

#[cfg(test)]
thread_local! {
    /// How many products this thread split (for the tests).
    pub(crate) static SPLITS: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// `act(lhs · rhs + bias)` through the blocked kernel as `blocking` says, into `operands.out`
/// (the bias and GELU as `operands` asks; [`routed::launch_affine`](super::routed::launch_affine)
/// checks the operands and makes the output; a split product's partial sums are a new f32
/// tensor on `device`). f32, f16 and bf16 operands (the sums in f32); strided views are read
/// in place.
///
/// # Shapes
/// - `lhs`: `[..., M, K]`
/// - `rhs`: `[..., K, N]`
/// - `bias`: `[N]`
/// - output: `[..., M, N]` (the operands' batch dimensions); with `operands.col_sums`,
///   `[1, ..., M + 1, N]`, its row `M` the column sums of `rhs`
pub(crate) fn launch(
    blocking: Blocking,
    operands: Operands,
    device: &burn::tensor::Device,
) -> Result<(), LaunchError> {
    #[cfg(test)]
    LAUNCHES.set(LAUNCHES.get() + 1);
    let Operands {
        lhs,
        rhs,
        out,
        kind,
        bias,
        gelu,
        col_sums,
    } = operands;
    if lhs.meta.is_tiled()
        || rhs.meta.is_tiled()
        || bias.as_ref().is_some_and(|b| b.meta.is_tiled())
    {
        return Err(LaunchError::Operands("a storage-tiled operand".into()));
    }
    // rank 2 or more: `routed::launch_affine` checked the operands and made the output
    let shape = out.meta.shape();
    let rank = shape.len();
    // with the column sums, the output's last row is theirs: `M` is `lhs`'s rows
    let (b, m, n) = (
        shape[..rank - 2].iter().product::<usize>(),
        shape[rank - 2] - usize::from(col_sums),
        shape[rank - 1],
    );
    if col_sums && (b != 1 || m == 0 || bias.is_some() || gelu || m != lhs.meta.shape()[rank - 2]) {
        return Err(LaunchError::Operands(
            "column sums need one batch, no epilogue and one more output row".into(),
        ));
    }
    if b * m * n == 0 {
        return Ok(());
    }
    let k = lhs.meta.shape()[rank - 1];
    let client = out.client.clone();
    let sms = client
        .properties()
        .hardware
        .num_streaming_multiprocessors
        .map_or(ASSUMED_SMS, |s| s as usize);
    let tile = blocking
        .tile
        .unwrap_or_else(|| Tile::for_output([b, m, n], sms));
    let wanted = blocking
        .parts
        .unwrap_or_else(|| parts_for(tile, [b, m, n], k, sms));
    let (run, parts) = runs(tile, k, wanted);
    let lhs_k_major = lhs.meta.strides[rank - 1] == 1;
    let rhs_n_major = rhs.meta.strides[rank - 1] == 1;
    let [x, y, z] = tile.blocks([b, m, n]);
    let (max_x, max_y, max_z) = client.properties().hardware.max_cube_count;
    let count = |v: usize, max: u32| {
        u32::try_from(v)
            .ok()
            .filter(|&v| v <= max)
            .ok_or_else(|| LaunchError::Operands(format!("{v} blocks on one axis, over {max}")))
    };
    let cube_count =
        CubeCount::Static(count(x, max_x)?, count(y, max_y)?, count(z * parts, max_z)?);
    let cube_dim = CubeDim::new_1d(tile.units() as u32);
    log::trace!(
        "blocked product: batch {b} m {m} n {n} k {k} tile {tile:?} blocks {x}x{y}x{z} parts {parts} lhs k-major {lhs_k_major} rhs n-major {rhs_n_major}",
    );
    let elem = ElemType::Float(kind);
    let split = parts > 1;
    let epilogue = Epilogue {
        bias: bias.is_some(),
        gelu,
    };
    let layout = Layout {
        tile,
        lhs_k_major,
        rhs_n_major,
        split,
        // split, `sum_parts` applies it
        epilogue: if split { Epilogue::default() } else { epilogue },
        col_sums,
    };
    // without a bias, a one-element stand-in that the kernels do not read
    let bias = match bias {
        Some(bias) => bias,
        None => super::cube_kit::cube(&burn::tensor::Tensor::<1>::empty([1], (device, out.dtype)))
            .ok_or_else(|| LaunchError::Operands("a stand-in off the cubecl device".into()))?,
    };
    // split, the parts' sums go to an f32 tensor that `sum_parts` adds up into `out` (its
    // cubes counted before anything launches)
    let sums = if split {
        let rows = m + usize::from(col_sums);
        let sums = burn::tensor::Tensor::<3>::empty([parts * b, rows, n], (device, DType::F32));
        let cubes = super::cube_kit::cube_count((b * rows * n).div_ceil(SUM_UNITS))
            .ok_or_else(|| LaunchError::Operands(format!("{} output elements", b * rows * n)))?;
        Some((
            super::cube_kit::cube(&sums).ok_or_else(|| {
                LaunchError::Operands("partial sums off the cubecl device".into())
            })?,
            cubes,
        ))
    } else {
        None
    };
    let (target, target_elem, run) = match &sums {
        Some((sums, _)) => (sums.clone(), ElemType::Float(FloatKind::F32), run),
        None => (out.clone(), elem, k.max(1)),
    };
    kernel::blocked_matmul::launch(
        &client,
        cube_count,
        cube_dim,
        lhs.into_tensor_arg(),
        rhs.into_tensor_arg(),
        bias.clone().into_tensor_arg(),
        target.into_tensor_arg(),
        parts,
        run,
        layout,
        elem,
        target_elem,
    );
    if let Some((sums, cubes)) = sums {
        kernel::sum_parts::launch(
            &client,
            cubes,
            CubeDim::new_1d(SUM_UNITS as u32),
            sums.into_tensor_arg(),
            bias.into_tensor_arg(),
            out.into_tensor_arg(),
            parts,
            SUM_UNITS,
            epilogue,
            elem,
        );
        #[cfg(test)]
        SPLITS.set(SPLITS.get() + 1);
    }
    Ok(())
}

/// Units of a cube of [`kernel::sum_parts`].
const SUM_UNITS: usize = 256;

#[cfg(test)]
mod tests {
    use super::*;
    use burn::prelude::*;
    use burn::tensor::{DType, Distribution, TensorData};

    use crate::cpu::gemm::Activation;
    use crate::ops::routed;
    use crate::routine::Launcher;
    use infembed_testkit::max_rel_diff;

    fn values(t: Tensor<3>) -> Vec<f32> {
        t.into_data().convert::<f32>().try_to_vec().unwrap()
    }

    /// Both tiles, each whole and with the depth asked in `parts` parts, as launchers.
    fn fixed_launchers(parts: usize) -> Vec<(Tile, usize, Launcher)> {
        [Tile::SMALL, Tile::LARGE]
            .into_iter()
            .flat_map(|tile| [(tile, 1), (tile, parts)])
            .map(|(tile, parts)| {
                let blocking = Blocking {
                    tile: Some(tile),
                    parts: Some(parts),
                };
                (tile, parts, Launcher::Blocked(blocking))
            })
            .collect()
    }

    /// The blocked kernel on wgpu (Mesa's software driver in CI) against a naive f64 product
    /// on the host, for both tiles, whole and split, shapes that are and are not multiples of
    /// the blocks, several batches, plain and transposed operands (the backward products'
    /// layouts), f16 operands (within f16's rounding, and not f32's exact result), and the
    /// epilogue (bias, bias and GELU).
    #[test]
    fn blocked_products_equal_a_naive_product() {
        let Some(gpu) = crate::test_wgpu("blocked_products_equal_a_naive_product") else {
            return;
        };
        // random draws from the process's one generator, which the seeded tests share
        let _rng = crate::rng_lock();
        let naive = |a: &[f32], b: &[f32], [bs, m, k, n]: [usize; 4]| {
            let mut out = vec![0f32; bs * m * n];
            for z in 0..bs {
                for i in 0..m {
                    for j in 0..n {
                        let s: f64 = (0..k)
                            .map(|c| {
                                f64::from(a[(z * m + i) * k + c])
                                    * f64::from(b[(z * k + c) * n + j])
                            })
                            .sum();
                        out[(z * m + i) * n + j] = s as f32;
                    }
                }
            }
            out
        };
        let shapes = [
            [1, 128, 64, 128],
            [1, 37, 50, 70],
            [2, 130, 17, 129],
            [3, 5, 200, 9],
        ];
        for [bs, m, k, n] in shapes {
            let a = Tensor::<3>::random([bs, m, k], Distribution::Normal(0.0, 1.0), &gpu);
            let b = Tensor::<3>::random([bs, k, n], Distribution::Normal(0.0, 1.0), &gpu);
            let expected = naive(&values(a.clone()), &values(b.clone()), [bs, m, k, n]);
            // the same operands stored transposed, read through swapped views
            let stored_transposed = |t: &Tensor<3>| {
                let [bs, rows, cols] = t.dims();
                let v = values(t.clone());
                let mut tr = vec![0f32; v.len()];
                for z in 0..bs {
                    for i in 0..rows {
                        for j in 0..cols {
                            tr[(z * cols + j) * rows + i] = v[(z * rows + i) * cols + j];
                        }
                    }
                }
                Tensor::<3>::from_data(TensorData::new(tr, [bs, cols, rows]), &gpu).swap_dims(1, 2)
            };
            let (at, bt) = (stored_transposed(&a), stored_transposed(&b));
            for (tile, parts, launcher) in fixed_launchers(3) {
                // every depth here is past one slice, so three parts always split it
                let product = |l: &Tensor<3>, r: &Tensor<3>| {
                    let before = SPLITS.get();
                    let out = routed::launch(&launcher, l, r);
                    assert_eq!(SPLITS.get() - before, usize::from(parts > 1), "{tile:?}");
                    out
                };
                let case = format!("{tile:?} in {parts} parts [{bs}, {m}, {k}, {n}]");
                for (what, l, r) in [
                    ("plain", &a, &b),
                    ("lhs transposed", &at, &b),
                    ("rhs transposed", &a, &bt),
                ] {
                    let got = values(product(l, r).expect("an f32 product"));
                    let diff = max_rel_diff(&expected, &got);
                    assert!(diff < 1e-5, "{case} {what}: differs by {diff}");
                }
                let (a16, b16) = (a.clone().cast(DType::F16), b.clone().cast(DType::F16));
                let got = values(product(&a16, &b16).expect("an f16 product"));
                let exact = naive(&values(a16), &values(b16), [bs, m, k, n]);
                let diff = max_rel_diff(&exact, &got);
                assert!(
                    (1e-6..1e-2).contains(&diff),
                    "{case} f16: differs by {diff}"
                );
                // the epilogue (in the product's launch, or split in `sum_parts`'): a bias,
                // then GELU, against burn's addition and GELU of the naive product
                let bias = Tensor::<1>::random([n], Distribution::Normal(0.0, 1.0), &gpu);
                let naive_y = TensorData::new(expected.clone(), [bs, m, n]);
                let biased = Tensor::<3>::from_data(naive_y, &gpu) + bias.clone().unsqueeze();
                for (act, reference) in [
                    (Activation::Identity, biased.clone()),
                    (
                        Activation::Gelu,
                        burn::tensor::activation::gelu(biased.clone()),
                    ),
                ] {
                    let before = SPLITS.get();
                    let got = routed::launch_affine(&launcher, &a, &b, Some(&bias), act)
                        .expect("an f32 product");
                    assert_eq!(SPLITS.get() - before, usize::from(parts > 1), "{case}");
                    let diff = max_rel_diff(&values(reference), &values(got));
                    assert!(diff < 1e-5, "{case} {act:?}: differs by {diff}");
                }
            }
        }
    }

    /// A weight gradient `xᵀ g` and its bias's gradient (the column sums of `g`) from one
    /// launch ([`routed::launch_with_col_sums`]) on wgpu, against naive f64 sums on the host:
    /// both tiles, whole and in three parts, `xᵀ` a transposed view as the backward step
    /// reads it, shapes that are and are not multiples of the blocks; several batches and an
    /// epilogue are refused.
    #[test]
    fn a_weight_gradient_and_its_column_sums_equal_naive_sums() {
        let Some(gpu) = crate::test_wgpu("a_weight_gradient_and_its_column_sums_equal_naive_sums")
        else {
            return;
        };
        let _rng = crate::rng_lock();
        for [m, k, n] in [[64, 300, 128], [37, 513, 70], [130, 40, 129]] {
            let x = Tensor::<3>::random([1, k, m], Distribution::Normal(0.0, 1.0), &gpu);
            let g = Tensor::<3>::random([1, k, n], Distribution::Normal(0.0, 1.0), &gpu);
            let (xv, gv) = (values(x.clone()), values(g.clone()));
            let mut product = vec![0f32; m * n];
            for i in 0..m {
                for j in 0..n {
                    let s: f64 = (0..k)
                        .map(|c| f64::from(xv[c * m + i]) * f64::from(gv[c * n + j]))
                        .sum();
                    product[i * n + j] = s as f32;
                }
            }
            let sums: Vec<f32> = (0..n)
                .map(|j| (0..k).map(|c| f64::from(gv[c * n + j])).sum::<f64>() as f32)
                .collect();
            let xt = x.clone().swap_dims(1, 2);
            for (tile, parts, launcher) in fixed_launchers(3) {
                let Launcher::Blocked(blocking) = launcher else {
                    unreachable!("blocked launchers")
                };
                let case = format!("{tile:?} in {parts} parts [{m}, {k}, {n}]");
                let before = SPLITS.get();
                let (dw, db) =
                    routed::launch_with_col_sums(blocking, &xt, &g).expect("an f32 product");
                assert_eq!(SPLITS.get() - before, usize::from(parts > 1), "{case}");
                assert_eq!((dw.dims(), db.dims()), ([1, m, n], [n]), "{case}");
                let diff = max_rel_diff(&product, &values(dw));
                assert!(diff < 1e-5, "{case}: the product differs by {diff}");
                let got = db.into_data().convert::<f32>().try_to_vec::<f32>().unwrap();
                let diff = max_rel_diff(&sums, &got);
                assert!(diff < 1e-5, "{case}: the column sums differ by {diff}");
            }
        }
        let blocking = Blocking {
            tile: None,
            parts: None,
        };
        let two = Tensor::<3>::zeros([2, 8, 8], &gpu);
        assert!(routed::launch_with_col_sums(blocking, &two, &two).is_err());
    }

    /// How a product is split: never when its blocks fill the device twice or its depth is
    /// short, else toward four cubes a multiprocessor; and every split's runs are whole slices
    /// that cover the depth with no empty part, for any depth and number of parts asked for.
    #[test]
    fn products_are_split_where_their_blocks_leave_the_device_idle() {
        // the weight gradient of a 384 x 384 projection over 1,664 tokens: 36 blocks
        let tile = Tile::for_output([1, 384, 384], 100);
        assert_eq!(tile, Tile::SMALL);
        assert_eq!(parts_for(tile, [1, 384, 384], 1664, 100), 6); // depth-bound: 1664 / 256
        assert_eq!(parts_for(tile, [1, 384, 384], 4096, 132), 15); // 528 cubes / 36
        assert_eq!(parts_for(tile, [1, 64, 64], 40_000, 132), MAX_PARTS); // one block
        // a forward projection's depth (384) is too short to split
        assert_eq!(parts_for(tile, [1, 1664, 384], 384, 100), 1);
        // the feed-forward down product over 1,664 tokens: 156 blocks of 64 x 64
        assert_eq!(parts_for(tile, [1, 1664, 384], 1536, 100), 3);
        // enough blocks: the feed-forward up product over 4,096 tokens takes the large tile
        let up = [1, 4096, 1536];
        let large = Tile::for_output(up, 100);
        assert_eq!(large, Tile::LARGE);
        assert_eq!(parts_for(large, up, 384, 100), 1);
        assert_eq!(parts_for(Tile::SMALL, [64, 128, 128], 4096, 100), 1); // 256 blocks
        // too little work for a second launch: a 10-token feed-forward down product
        assert_eq!(parts_for(tile, [1, 10, 384], 1536, 100), 1);
        assert_eq!(parts_for(tile, [1, 64, 64], 4096, 100), 16); // MIN_SPLIT_WORK exactly
        assert_eq!(parts_for(tile, [1, 64, 64], 4095, 100), 1);
        for tile in [Tile::SMALL, Tile::LARGE] {
            assert_eq!(runs(tile, 0, 5), (tile.bk, 1));
            for k in 1..600 {
                for asked in 0..20 {
                    let (run, parts) = runs(tile, k, asked);
                    assert!(
                        run % tile.bk == 0 && run > 0,
                        "{tile:?} k {k} asked {asked}"
                    );
                    assert!(parts >= 1 && parts <= asked.max(1), "{k} {asked}: {parts}");
                    assert!(
                        (parts - 1) * run < k && parts * run >= k,
                        "{tile:?} k {k} asked {asked}: {parts} parts of {run}"
                    );
                }
            }
        }
    }

    /// A linear layer on an autodiff graph through `blocked_split` (tile and split chosen per
    /// product) over enough rows that its weight gradient, four small blocks deep in rows, is
    /// split and nothing else is: the output and the gradients equal burn's `Linear`, and no
    /// product fell back to burn's `matmul`.
    #[test]
    fn split_weight_gradients_equal_burns() {
        use crate::routine::MatmulRoutine;
        use burn::nn::LinearConfig;
        let Some(gpu) = crate::test_wgpu("split_weight_gradients_equal_burns") else {
            return;
        };
        // random draws from the process's one generator, which the seeded tests share
        let _rng = crate::rng_lock();
        let ad = gpu.autodiff();
        let layer = LinearConfig::new(128, 96).init(&ad);
        let x = Tensor::<2>::random([1500, 128], Distribution::Normal(0.0, 1.0), &ad);
        let r = Tensor::<2>::random([1500, 96], Distribution::Normal(0.0, 1.0), &ad);
        let split_routine: MatmulRoutine = "blocked_split".parse().unwrap();
        let grads_of = |routed: bool| {
            let x = x.clone().detach().require_grad();
            let before = SPLITS.get();
            let fallbacks = routed::fallbacks();
            let y = if routed {
                routed::try_linear(&layer, x.clone(), split_routine, Activation::Identity)
                    .expect("a wgpu f32 tensor is routed")
            } else {
                layer.forward(x.clone())
            };
            let grads = (y.clone() * r.clone()).sum().backward();
            let grad = |t: Option<Tensor<2>>| {
                t.expect("a gradient")
                    .into_data()
                    .convert::<f32>()
                    .try_to_vec::<f32>()
                    .unwrap()
            };
            let out = y.into_data().convert::<f32>().try_to_vec::<f32>().unwrap();
            let split = SPLITS.get() - before;
            assert_eq!(
                routed::fallbacks(),
                fallbacks,
                "a product fell back to burn's"
            );
            let bias = layer.bias.as_ref().expect("a bias").grad(&grads);
            let bias = bias.expect("the bias's gradient").into_data();
            let bias = bias.convert::<f32>().try_to_vec::<f32>().unwrap();
            (
                [
                    out,
                    grad(x.grad(&grads)),
                    grad(layer.weight.grad(&grads)),
                    bias,
                ],
                split,
            )
        };
        let (burn, _) = grads_of(false);
        let (blocked, split) = grads_of(true);
        // 1,500 rows: the weight gradient's four blocks sum them in five parts (the forward
        // product and the input gradient are 128 and 96 deep)
        assert_eq!(split, 1, "the weight gradient was not split");
        for (what, a, b) in [
            "output",
            "input gradient",
            "weight gradient",
            "bias gradient",
        ]
        .iter()
        .zip(burn.iter().zip(&blocked))
        .map(|(w, (a, b))| (w, a, b))
        {
            let diff = max_rel_diff(a, b);
            assert!(diff < 1e-5, "{what} differs by {diff}");
        }
    }

    /// Products of rank 4 with two batch dimensions, as attention computes them: the heads of
    /// `[B, L, H Dh]` projections read as `[B, H, L, Dh]` views (`q kᵀ`, the key transposed
    /// in place, then `p v`), against burn's own `matmul` of the same views, for both tiles.
    #[test]
    fn blocked_products_of_head_views_equal_burns() {
        let Some(gpu) = crate::test_wgpu("blocked_products_of_head_views_equal_burns") else {
            return;
        };
        // random draws from the process's one generator, which the seeded tests share
        let _rng = crate::rng_lock();
        let values4 = |t: Tensor<4>| t.into_data().convert::<f32>().try_to_vec::<f32>().unwrap();
        let (b, l, h, dh) = (2, 37, 3, 8);
        let heads = |t: Tensor<3>| t.reshape([b, l, h, dh]).swap_dims(1, 2);
        let rand = || Tensor::<3>::random([b, l, h * dh], Distribution::Normal(0.0, 1.0), &gpu);
        let (q, k, v) = (heads(rand()), heads(rand()), heads(rand()));
        let p = Tensor::<4>::random([b, h, l, l], Distribution::Normal(0.0, 1.0), &gpu);
        for (tile, parts, launcher) in fixed_launchers(2) {
            // `p v` sums over 37 keys: two parts split it (`q kT`'s 8 are one slice)
            for (what, lhs, rhs, split) in [
                ("q kT", q.clone(), k.clone().swap_dims(2, 3), 0),
                ("p v", p.clone(), v.clone(), usize::from(parts > 1)),
            ] {
                let before = SPLITS.get();
                let got = routed::launch(&launcher, &lhs, &rhs).expect("an f32 product");
                assert_eq!(SPLITS.get() - before, split, "{tile:?} {parts} {what}");
                assert_eq!(got.dims(), lhs.clone().matmul(rhs.clone()).dims());
                let diff = max_rel_diff(&values4(lhs.matmul(rhs)), &values4(got));
                assert!(
                    diff < 1e-5,
                    "{tile:?} in {parts} parts {what}: differs by {diff}"
                );
            }
        }
    }
}
