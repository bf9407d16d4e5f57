//! A packed, cache-blocked `f32` matrix product with a fused epilogue, for the linear layers of
//! the CPU encoder.
//!
//! burn 0.22's `flex` backend multiplies with the `gemm` crate, which packs the right-hand
//! matrix again for every batch element of a broadcast batched product (speeds on the `K = 384`
//! products that make up two thirds of a MiniLM layer: docs/benchmarks.md). This module computes
//! `C = act(A B + bias [+ C])` the textbook way (Goto/BLIS):
//!
//! - `B` is packed once per call into panels of [`NR`] columns, `KC` rows deep, so the micro-kernel
//!   reads it contiguously from L1;
//! - the rows of `A` are split into blocks that rayon's threads take in turn; each thread packs its
//!   block into micro-panels of [`MR`] rows (k-major) that stay in L2;
//! - both packings transpose eight by eight on AVX registers where the source runs the other
//!   way (a row-major `A`, a column-major `B` such as attention's `Kᵀ`), instead of moving one
//!   float at a time;
//! - a `MR x NR` micro-kernel keeps its 96 accumulators in twelve AVX2 registers and issues two
//!   fused multiply-adds per loaded `B` vector;
//! - the epilogue (bias, residual accumulation, exact GELU) is applied while the tile is still in
//!   registers, which saves the separate passes over the output that burn makes.
//!
//! The micro-kernel uses `pulp`'s safe AVX2/FMA wrappers when the processor has them (detected
//! at run time) and a portable loop otherwise; there is no `unsafe` code. Products are exact to
//! the usual floating-point reassociation (a different summation order from burn's, so results
//! differ in the last bits; the tests compare against a naive triple loop at 1e-5 relative).

use pulp::{as_arrays, as_arrays_mut};
#[cfg(target_arch = "x86_64")]
use pulp::{f32x8, x86::V3};
use rayon::prelude::*;
use std::cell::Cell;

/// The instruction set of the fast micro-kernel: AVX2 + FMA on x86-64.
#[cfg(target_arch = "x86_64")]
pub(crate) type Fast = V3;

/// Elsewhere the portable kernel runs (a placeholder that is never constructed).
#[cfg(not(target_arch = "x86_64"))]
#[derive(Clone, Copy)]
pub(crate) struct Fast;

/// The fast instruction set, when this processor has it.
pub(crate) fn detect() -> Option<Fast> {
    #[cfg(target_arch = "x86_64")]
    {
        V3::try_new()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        None
    }
}

/// Rows of the micro-kernel's output tile.
pub(crate) const MR: usize = 6;
/// Columns of the micro-kernel's output tile (two AVX vectors of eight lanes).
pub(crate) const NR: usize = 16;
/// Depth of one packed block: a `KC x NR` panel of `B` is 32 KiB, a `MR x KC` panel of `A`
/// 12 KiB. (256 and 384 measured the same on MiniLM's products, within the run-to-run spread:
/// docs/benchmarks.md.)
const KC: usize = 512;
/// Most rows of `A` per parallel task (a multiple of [`MR`]).
const MC_MAX: usize = 96;

/// A read-only strided matrix: element `(i, j)` is `data[i * rs + j * cs]`.
#[derive(Clone, Copy, Debug)]
pub struct MatRef<'a> {
    data: &'a [f32],
    rows: usize,
    cols: usize,
    rs: usize,
    cs: usize,
}

impl<'a> MatRef<'a> {
    /// A strided view.
    ///
    /// # Panics
    /// When an element of the view would lie outside `data` (a shape contract of the caller).
    pub fn new(data: &'a [f32], rows: usize, cols: usize, rs: usize, cs: usize) -> Self {
        if rows > 0 && cols > 0 {
            let last = (rows - 1) * rs + (cols - 1) * cs;
            assert!(
                last < data.len(),
                "MatRef: a {rows}x{cols} view with strides ({rs}, {cs}) needs {} elements, got {}",
                last + 1,
                data.len()
            );
        }
        Self {
            data,
            rows,
            cols,
            rs,
            cs,
        }
    }

    /// A row-major (contiguous) `rows x cols` matrix.
    pub fn row_major(data: &'a [f32], rows: usize, cols: usize) -> Self {
        Self::new(data, rows, cols, cols, 1)
    }

    /// The transpose, as a view (no copy).
    pub fn t(self) -> Self {
        Self {
            data: self.data,
            rows: self.cols,
            cols: self.rows,
            rs: self.cs,
            cs: self.rs,
        }
    }

    /// Number of rows.
    #[cfg_attr(not(feature = "bench-internals"), allow(dead_code))]
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Number of columns.
    #[cfg_attr(not(feature = "bench-internals"), allow(dead_code))]
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Row `i` as a slice, when the columns are contiguous.
    #[inline(always)]
    pub(crate) fn row(&self, i: usize) -> Option<&'a [f32]> {
        (self.cs == 1).then(|| &self.data[i * self.rs..i * self.rs + self.cols])
    }

    #[inline(always)]
    pub(crate) fn at(&self, i: usize, j: usize) -> f32 {
        self.data[i * self.rs + j * self.cs]
    }
}

/// The activation applied by the epilogue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activation {
    /// None.
    Identity,
    /// Exact (erf) GELU, as the element-wise GELU kernel of `cpu::elementwise`.
    Gelu,
}

/// What happens to each output element after the product: `c = act(ab + bias[j] + c_old)`,
/// where `c_old` is the output's previous content when `accumulate` is set and 0 otherwise.
#[derive(Clone, Copy, Debug)]
pub struct Epilogue<'a> {
    /// Added to every row (length: the number of columns).
    pub bias: Option<&'a [f32]>,
    /// Add the product to the output's previous content instead of overwriting it.
    pub accumulate: bool,
    /// Applied last.
    pub activation: Activation,
}

impl Default for Epilogue<'_> {
    fn default() -> Self {
        Self {
            bias: None,
            accumulate: false,
            activation: Activation::Identity,
        }
    }
}

/// `c = act(a b + bias [+ c])` with `c` row-major `a.rows() x b.cols()`.
///
/// # Panics
/// When the inner dimensions differ, `c` has the wrong length, or the bias the wrong length
/// (shape contracts of the caller).
pub fn gemm(a: MatRef<'_>, b: MatRef<'_>, c: &mut [f32], epilogue: Epilogue<'_>) {
    let (m, k, n) = check_shapes(a, b, epilogue);
    assert_eq!(
        c.len(),
        m * n,
        "gemm: c must hold {m}x{n} = {} elements",
        m * n
    );
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        c.par_chunks_mut(n)
            .for_each(|row| epilogue_only(row, epilogue));
        return;
    }
    let panels = n.div_ceil(NR);
    let mut packed_b = scratch(&SCRATCH_B, k * panels * NR);
    pack_b_into(b, true, &mut packed_b);
    let threads = rayon::current_num_threads().max(1);
    // At least about four tasks per thread when the matrix allows it, for load balance.
    let mc = (m.div_ceil(4 * threads).div_ceil(MR) * MR).clamp(MR, MC_MAX);
    let simd = detect();
    c.par_chunks_mut(mc * n)
        .enumerate()
        .for_each(|(block, c_block)| {
            let i0 = block * mc;
            let rows = c_block.len() / n;
            let task = BlockTask {
                a,
                i0,
                rows,
                k,
                n,
                ldc: n,
                panels,
                packed_b: &packed_b,
                c: c_block,
                epilogue,
            };
            task.dispatch(simd);
        });
    keep(&SCRATCH_B, packed_b);
}

/// [`gemm`] on the calling thread only, into rows of `c` that are `ldc` elements apart (row
/// `i` of the product at `c[i * ldc..i * ldc + n]`; the elements between rows are left
/// alone). For small products inside an already parallel loop (attention heads).
///
/// # Panics
/// As [`gemm`], and when `ldc < n` or `c` is too short for `m` rows of stride `ldc`.
pub fn gemm_serial(
    a: MatRef<'_>,
    b: MatRef<'_>,
    c: &mut [f32],
    ldc: usize,
    epilogue: Epilogue<'_>,
) {
    let (m, k, n) = check_shapes(a, b, epilogue);
    assert!(ldc >= n, "gemm: row stride {ldc} is below the {n} columns");
    if m == 0 || n == 0 {
        return;
    }
    assert!(
        c.len() >= (m - 1) * ldc + n,
        "gemm: c must hold {m} rows of stride {ldc}"
    );
    if k == 0 {
        for i in 0..m {
            epilogue_only(&mut c[i * ldc..i * ldc + n], epilogue);
        }
        return;
    }
    let mut packed_b = scratch(&SCRATCH_B, k * n.div_ceil(NR) * NR);
    pack_b_into(b, false, &mut packed_b);
    let task = BlockTask {
        a,
        i0: 0,
        rows: m,
        k,
        n,
        ldc,
        panels: n.div_ceil(NR),
        packed_b: &packed_b,
        c,
        epilogue,
    };
    task.dispatch(detect());
    keep(&SCRATCH_B, packed_b);
}

/// The shape contracts [`gemm`] and [`gemm_serial`] share: `(m, k, n)` once the inner
/// dimensions agree and the bias (if any) has `n` elements.
fn check_shapes(a: MatRef<'_>, b: MatRef<'_>, epilogue: Epilogue<'_>) -> (usize, usize, usize) {
    let (m, k, n) = (a.rows, a.cols, b.cols);
    assert_eq!(
        k, b.rows,
        "gemm: inner dimensions differ: a is {m}x{k}, b is {}x{n}",
        b.rows
    );
    if let Some(bias) = epilogue.bias {
        assert_eq!(bias.len(), n, "gemm: bias must have {n} elements");
    }
    (m, k, n)
}

/// One output row of an empty inner dimension: only the epilogue applies.
fn epilogue_only(row: &mut [f32], epilogue: Epilogue<'_>) {
    let zero = [0f32; NR];
    for (j0, out) in (0..row.len()).step_by(NR).zip(row.chunks_mut(NR)) {
        write_tile_row(out, &zero, j0, epilogue);
    }
}

thread_local! {
    /// Packing buffers kept between calls on each thread (fresh large allocations cost page
    /// faults and zeroing on every call).
    static SCRATCH_A: Cell<Vec<f32>> = const { Cell::new(Vec::new()) };
    static SCRATCH_B: Cell<Vec<f32>> = const { Cell::new(Vec::new()) };
}

/// Buffers larger than this many elements (16 MiB) are freed after use rather than kept.
const SCRATCH_KEEP: usize = 1 << 22;

/// A buffer of at least `len` elements from `slot` (contents unspecified).
fn scratch(slot: &'static std::thread::LocalKey<Cell<Vec<f32>>>, len: usize) -> Vec<f32> {
    let mut v = slot.with(Cell::take);
    if v.len() < len {
        v.resize(len, 0.0);
    }
    v
}

/// Returns a buffer taken with [`scratch`].
fn keep(slot: &'static std::thread::LocalKey<Cell<Vec<f32>>>, v: Vec<f32>) {
    if v.len() <= SCRATCH_KEEP {
        slot.with(|c| c.set(v));
    }
}

/// Packs `B` (`k x n`) into `out` (`k * ceil(n / NR) * NR` elements): `KC`-deep blocks of
/// `NR`-column panels, each panel `kc x NR` row-major and zero-padded on the right. Block
/// `p` starts at `p * KC * panels * NR`.
fn pack_b_into(b: MatRef<'_>, parallel: bool, out: &mut [f32]) {
    let (k, n) = (b.rows, b.cols);
    let panels = n.div_ceil(NR);
    // One chunk per (block, panel), in storage order.
    let mut chunks: Vec<(usize, usize, &mut [f32])> = Vec::with_capacity(k.div_ceil(KC) * panels);
    let mut rest = &mut out[..k * panels * NR];
    for p0 in (0..k).step_by(KC) {
        let kc = KC.min(k - p0);
        for j in 0..panels {
            let (head, tail) = rest.split_at_mut(kc * NR);
            chunks.push((p0, j * NR, head));
            rest = tail;
        }
    }
    let simd = detect();
    let fill = |(p0, j0, dst): (usize, usize, &mut [f32])| {
        let width = NR.min(n - j0);
        if width < NR {
            dst.fill(0.0);
        }
        if b.cs == 1 && width == NR {
            // fixed-size copies compile to vector moves (a slice copy calls memmove)
            for (kk, row) in as_arrays_mut::<NR, f32>(dst).0.iter_mut().enumerate() {
                let start = (p0 + kk) * b.rs + j0;
                *row = b.data[start..start + NR].try_into().expect("NR columns");
            }
        } else if b.cs == 1 {
            for (kk, row) in dst.chunks_exact_mut(NR).enumerate() {
                let start = (p0 + kk) * b.rs + j0;
                row[..width].copy_from_slice(&b.data[start..start + width]);
            }
        } else if b.rs == 1 {
            #[cfg(target_arch = "x86_64")]
            if let (Some(simd), NR) = (simd, width) {
                simd.vectorize(PackColumns {
                    simd,
                    b,
                    p0,
                    j0,
                    dst,
                });
                return;
            }
            pack_columns(b, p0, j0, width, dst);
        } else {
            for (kk, row) in dst.chunks_exact_mut(NR).enumerate() {
                for (jj, v) in row[..width].iter_mut().enumerate() {
                    *v = b.at(p0 + kk, j0 + jj);
                }
            }
        }
    };
    if parallel && k * n >= 1 << 16 {
        chunks.into_par_iter().for_each(fill);
    } else {
        chunks.into_iter().for_each(fill);
    }
}

/// Columns `j0 .. j0 + width` of a column-major `B` (`b.rs == 1`), rows `p0 .. p0 + kc`, into
/// the `kc x NR` panel `dst` (`kc = dst.len() / NR`), one element at a time; the columns past
/// `width` are left alone.
fn pack_columns(b: MatRef<'_>, p0: usize, j0: usize, width: usize, dst: &mut [f32]) {
    let kc = dst.len() / NR;
    for jj in 0..width {
        let start = (j0 + jj) * b.cs + p0;
        for (row, &v) in dst.chunks_exact_mut(NR).zip(&b.data[start..start + kc]) {
            row[jj] = v;
        }
    }
}

/// Packs rows `r0 .. r0 + height` (`height <= MR`) and columns `p0 .. p0 + kc` of `A` into a
/// k-major micro-panel of `MR * kc` elements, rows past `height` zero.
#[inline(always)]
fn pack_a_panel(a: MatRef<'_>, r0: usize, height: usize, p0: usize, panel: &mut [f32]) {
    let kc = panel.len() / MR;
    if height < MR {
        panel.fill(0.0);
    }
    if a.cs == 1 {
        for r in 0..height {
            let start = (r0 + r) * a.rs + p0;
            for (col, &v) in panel.chunks_exact_mut(MR).zip(&a.data[start..start + kc]) {
                col[r] = v;
            }
        }
    } else if a.rs == 1 && height == MR {
        for (kk, col) in as_arrays_mut::<MR, f32>(panel).0.iter_mut().enumerate() {
            let start = (p0 + kk) * a.cs + r0;
            *col = a.data[start..start + MR].try_into().expect("MR rows");
        }
    } else if a.rs == 1 {
        for (kk, col) in panel.chunks_exact_mut(MR).enumerate() {
            let start = (p0 + kk) * a.cs + r0;
            col[..height].copy_from_slice(&a.data[start..start + height]);
        }
    } else {
        for (kk, col) in panel.chunks_exact_mut(MR).enumerate() {
            for (r, v) in col[..height].iter_mut().enumerate() {
                *v = a.at(r0 + r, p0 + kk);
            }
        }
    }
}

/// [`pack_a_panel`] of a full tile of a row-major `A` (`a.cs == 1`), eight columns at a time
/// as an 8x8 transpose on AVX registers (the six rows and two of zeros), the rest one by one.
/// The panel holds the same values.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn pack_a_rows_v3(simd: V3, a: MatRef<'_>, r0: usize, p0: usize, panel: &mut [f32]) {
    const { assert!(MR == 6, "pack_a_rows_v3 transposes six rows") };
    let kc = panel.len() / MR;
    let row = |r: usize| {
        let start = (r0 + r) * a.rs + p0;
        &a.data[start..start + kc]
    };
    let rows: [&[f32]; MR] = std::array::from_fn(row);
    let avx = simd.avx;
    let zero = avx._mm256_setzero_ps();
    let full = kc / 8 * 8;
    for kk in (0..full).step_by(8) {
        let x: [std::arch::x86_64::__m256; MR] = std::array::from_fn(|r| {
            let v: &[f32; 8] = rows[r][kk..kk + 8].try_into().expect("eight columns");
            pulp::cast(*v)
        });
        // column `k` of the eight: rows 0-5 in lanes 0-5, zeros in lanes 6-7
        let cols = transpose8_v3(simd, [x[0], x[1], x[2], x[3], x[4], x[5], zero, zero]);
        let out: &mut [f32; 8 * MR] = (&mut panel[kk * MR..(kk + 8) * MR])
            .try_into()
            .expect("eight columns");
        // each store writes its column's six values and two zeros that the next one overwrites
        for (k, col) in cols.iter().enumerate().take(7) {
            let v: [f32; 8] = pulp::cast(*col);
            out[k * MR..k * MR + 8].copy_from_slice(&v);
        }
        let last: [f32; 8] = pulp::cast(cols[7]);
        out[7 * MR..].copy_from_slice(&last[..MR]);
    }
    pack_a_panel(a, r0, MR, p0 + full, &mut panel[full * MR..]);
}

/// The transpose of the 8x8 matrix whose rows are `x`: lane `j` of output `k` is lane `k` of
/// `x[j]`.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn transpose8_v3(simd: V3, x: [std::arch::x86_64::__m256; 8]) -> [std::arch::x86_64::__m256; 8] {
    let avx = simd.avx;
    let t0 = avx._mm256_unpacklo_ps(x[0], x[1]);
    let t1 = avx._mm256_unpackhi_ps(x[0], x[1]);
    let t2 = avx._mm256_unpacklo_ps(x[2], x[3]);
    let t3 = avx._mm256_unpackhi_ps(x[2], x[3]);
    let t4 = avx._mm256_unpacklo_ps(x[4], x[5]);
    let t5 = avx._mm256_unpackhi_ps(x[4], x[5]);
    let t6 = avx._mm256_unpacklo_ps(x[6], x[7]);
    let t7 = avx._mm256_unpackhi_ps(x[6], x[7]);
    let s0 = avx._mm256_shuffle_ps::<0x44>(t0, t2);
    let s1 = avx._mm256_shuffle_ps::<0xEE>(t0, t2);
    let s2 = avx._mm256_shuffle_ps::<0x44>(t1, t3);
    let s3 = avx._mm256_shuffle_ps::<0xEE>(t1, t3);
    let s4 = avx._mm256_shuffle_ps::<0x44>(t4, t6);
    let s5 = avx._mm256_shuffle_ps::<0xEE>(t4, t6);
    let s6 = avx._mm256_shuffle_ps::<0x44>(t5, t7);
    let s7 = avx._mm256_shuffle_ps::<0xEE>(t5, t7);
    [
        avx._mm256_permute2f128_ps::<0x20>(s0, s4),
        avx._mm256_permute2f128_ps::<0x20>(s1, s5),
        avx._mm256_permute2f128_ps::<0x20>(s2, s6),
        avx._mm256_permute2f128_ps::<0x20>(s3, s7),
        avx._mm256_permute2f128_ps::<0x31>(s0, s4),
        avx._mm256_permute2f128_ps::<0x31>(s1, s5),
        avx._mm256_permute2f128_ps::<0x31>(s2, s6),
        avx._mm256_permute2f128_ps::<0x31>(s3, s7),
    ]
}

/// One `kc x NR` panel of a column-major `B` (`b.rs == 1`, all `NR` columns inside `B`):
/// `dst[kk * NR + jj] = B[p0 + kk][j0 + jj]`, eight by eight columns as 8x8 transposes on AVX
/// registers, the last `kc % 8` rows one by one. (A named type so `vectorize` inlines it.)
#[cfg(target_arch = "x86_64")]
struct PackColumns<'a, 'b> {
    simd: V3,
    b: MatRef<'a>,
    p0: usize,
    j0: usize,
    dst: &'b mut [f32],
}

#[cfg(target_arch = "x86_64")]
impl pulp::NullaryFnOnce for PackColumns<'_, '_> {
    type Output = ();

    #[inline(always)]
    fn call(self) {
        let Self {
            simd,
            b,
            p0,
            j0,
            dst,
        } = self;
        let kc = dst.len() / NR;
        let col = |jj: usize| {
            let start = (j0 + jj) * b.cs + p0;
            &b.data[start..start + kc]
        };
        let cols: [&[f32]; NR] = std::array::from_fn(col);
        let full = kc / 8 * 8;
        for kk in (0..full).step_by(8) {
            for half in 0..NR / 8 {
                let x: [std::arch::x86_64::__m256; 8] = std::array::from_fn(|jj| {
                    let v: &[f32; 8] = cols[half * 8 + jj][kk..kk + 8]
                        .try_into()
                        .expect("eight rows");
                    pulp::cast(*v)
                });
                for (k, row) in transpose8_v3(simd, x).into_iter().enumerate() {
                    let at = (kk + k) * NR + half * 8;
                    let out: &mut [f32; 8] =
                        (&mut dst[at..at + 8]).try_into().expect("eight columns");
                    *out = pulp::cast(row);
                }
            }
        }
        pack_columns(b, p0 + full, j0, NR, &mut dst[full * NR..]);
    }
}

/// A [`BlockTask`] run under the fast instruction set. (A named type rather than a closure:
/// `vectorize` compiles its argument's `call` with the target features only when it is
/// inlined, which `#[inline(always)]` guarantees and a closure does not.)
#[cfg(target_arch = "x86_64")]
struct FastTask<'a, 'b> {
    task: BlockTask<'a, 'b>,
    simd: V3,
}

#[cfg(target_arch = "x86_64")]
impl pulp::NullaryFnOnce for FastTask<'_, '_> {
    type Output = ();

    #[inline(always)]
    fn call(self) {
        self.task.run(Some(self.simd));
    }
}

/// One parallel task: rows `i0 .. i0 + rows` of the output, all columns.
struct BlockTask<'a, 'b> {
    a: MatRef<'a>,
    i0: usize,
    rows: usize,
    k: usize,
    n: usize,
    /// Row stride of `c`.
    ldc: usize,
    panels: usize,
    packed_b: &'b [f32],
    c: &'b mut [f32],
    epilogue: Epilogue<'a>,
}

impl BlockTask<'_, '_> {
    /// Runs the task under the fast instruction set when `simd` holds it, portably otherwise.
    fn dispatch(self, simd: Option<Fast>) {
        match simd {
            #[cfg(target_arch = "x86_64")]
            Some(simd) => simd.vectorize(FastTask { task: self, simd }),
            _ => self.run(None),
        }
    }

    #[inline(always)]
    fn run(self, simd: Option<Fast>) {
        let Self {
            a,
            i0,
            rows,
            k,
            n,
            ldc,
            panels,
            packed_b,
            c,
            epilogue,
        } = self;
        let tiles = rows.div_ceil(MR);
        let mut packed_a = scratch(&SCRATCH_A, tiles * MR * KC.min(k));
        for p0 in (0..k).step_by(KC) {
            let kc = KC.min(k - p0);
            let first = p0 == 0;
            let last = p0 + kc == k;
            // Pack this block's rows of A, k-major per micro-panel, zero rows past the end.
            for (t, panel) in packed_a.chunks_exact_mut(MR * kc).take(tiles).enumerate() {
                let r0 = i0 + t * MR;
                let height = MR.min(i0 + rows - r0);
                match simd {
                    #[cfg(target_arch = "x86_64")]
                    Some(simd) if a.cs == 1 && height == MR => {
                        pack_a_rows_v3(simd, a, r0, p0, panel);
                    }
                    _ => pack_a_panel(a, r0, height, p0, panel),
                }
            }
            let b_block = &packed_b[p0 * panels * NR..(p0 + kc) * panels * NR];
            for (j, b_panel) in b_block.chunks_exact(kc * NR).enumerate() {
                let (b_panel, _) = as_arrays::<NR, f32>(b_panel);
                let j0 = j * NR;
                let width = NR.min(n - j0);
                for (t, a_panel) in packed_a.chunks_exact(MR * kc).take(tiles).enumerate() {
                    let (a_panel, _) = as_arrays::<MR, f32>(a_panel);
                    let acc = match simd {
                        #[cfg(target_arch = "x86_64")]
                        Some(simd) => micro_v3(simd, a_panel, b_panel),
                        _ => micro_portable(a_panel, b_panel),
                    };
                    let r0 = t * MR;
                    let height = MR.min(rows - r0);
                    let ep = Epilogue {
                        accumulate: epilogue.accumulate || !first,
                        bias: if last { epilogue.bias } else { None },
                        activation: if last {
                            epilogue.activation
                        } else {
                            Activation::Identity
                        },
                    };
                    #[cfg(target_arch = "x86_64")]
                    if let (Some(simd), MR, NR) = (simd, height, width) {
                        write_tile_v3(simd, c, r0 * ldc + j0, ldc, &acc, j0, ep);
                        continue;
                    }
                    for (r, acc_row) in acc.iter().enumerate().take(height) {
                        let start = (r0 + r) * ldc + j0;
                        epilogue_row(simd, &mut c[start..start + width], acc_row, j0, ep);
                    }
                }
            }
        }
        keep(&SCRATCH_A, packed_a);
    }
}

/// Writes one row of `NR` computed columns (the first `out.len()` of them valid, starting at
/// column `j0`) through the epilogue: on AVX vectors for a full row when `simd` holds AVX2.
#[inline(always)]
pub(crate) fn epilogue_row(
    simd: Option<Fast>,
    out: &mut [f32],
    acc: &[f32; NR],
    j0: usize,
    ep: Epilogue<'_>,
) {
    match (simd, out.len() == NR) {
        #[cfg(target_arch = "x86_64")]
        (Some(simd), true) => {
            let full: &mut [f32; NR] = out.try_into().expect("NR columns");
            write_row_v3(simd, full, acc, j0, ep);
        }
        _ => write_tile_row(out, acc, j0, ep),
    }
}

/// Writes one row of a tile (`out.len()` valid columns starting at column `j0`) through the
/// epilogue.
#[inline(always)]
fn write_tile_row(out: &mut [f32], acc: &[f32; NR], j0: usize, ep: Epilogue<'_>) {
    let width = out.len();
    let mut v = [0f32; NR];
    v[..width].copy_from_slice(&acc[..width]);
    if ep.accumulate {
        for (x, &o) in v.iter_mut().zip(out.iter()) {
            *x += o;
        }
    }
    if let Some(bias) = ep.bias {
        for (x, &b) in v.iter_mut().zip(&bias[j0..j0 + width]) {
            *x += b;
        }
    }
    if ep.activation == Activation::Gelu {
        for x in v.iter_mut() {
            *x = crate::cpu::elementwise::gelu_scalar(*x);
        }
    }
    out.copy_from_slice(&v[..width]);
}

/// [`write_tile_row`] for a full `MR x NR` tile whose first element is `c[start]` (rows
/// `ldc` apart), on AVX vectors, the activation applied to all twelve vectors together.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn write_tile_v3(
    simd: V3,
    c: &mut [f32],
    start: usize,
    ldc: usize,
    acc: &[[f32; NR]; MR],
    j0: usize,
    ep: Epilogue<'_>,
) {
    let mut v: [f32x8; 2 * MR] = pulp::cast(*acc);
    if ep.accumulate {
        for (r, pair) in v.chunks_exact_mut(2).enumerate() {
            let row = start + r * ldc;
            let old: &[f32; NR] = c[row..row + NR].try_into().expect("NR columns");
            let old: [f32x8; 2] = pulp::cast(*old);
            pair[0] = simd.add_f32x8(pair[0], old[0]);
            pair[1] = simd.add_f32x8(pair[1], old[1]);
        }
    }
    if let Some(bias) = ep.bias {
        let b: &[f32; NR] = bias[j0..j0 + NR].try_into().expect("NR columns");
        let b: [f32x8; 2] = pulp::cast(*b);
        for pair in v.chunks_exact_mut(2) {
            pair[0] = simd.add_f32x8(pair[0], b[0]);
            pair[1] = simd.add_f32x8(pair[1], b[1]);
        }
    }
    if ep.activation == Activation::Gelu {
        for quad in v.chunks_exact_mut(4) {
            let quad: &mut [f32x8; 4] = quad.try_into().expect("four");
            crate::cpu::elementwise::gelu_v3_many(simd, quad);
        }
    }
    for (r, pair) in v.chunks_exact(2).enumerate() {
        let row = start + r * ldc;
        let out: &mut [f32; NR] = (&mut c[row..row + NR]).try_into().expect("NR columns");
        *out = pulp::cast([pair[0], pair[1]]);
    }
}

/// [`write_tile_row`] for a full row of `NR` columns, on AVX vectors.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn write_row_v3(simd: V3, out: &mut [f32; NR], acc: &[f32; NR], j0: usize, ep: Epilogue<'_>) {
    let mut v: [f32x8; 2] = pulp::cast(*acc);
    if ep.accumulate {
        let o: [f32x8; 2] = pulp::cast(*out);
        v = [simd.add_f32x8(v[0], o[0]), simd.add_f32x8(v[1], o[1])];
    }
    if let Some(bias) = ep.bias {
        let b: &[f32; NR] = bias[j0..j0 + NR].try_into().expect("NR columns");
        let b: [f32x8; 2] = pulp::cast(*b);
        v = [simd.add_f32x8(v[0], b[0]), simd.add_f32x8(v[1], b[1])];
    }
    if ep.activation == Activation::Gelu {
        v = [
            crate::cpu::elementwise::gelu_v3(simd, v[0]),
            crate::cpu::elementwise::gelu_v3(simd, v[1]),
        ];
    }
    *out = pulp::cast(v);
}

/// The `MR x NR` product of a k-major `A` micro-panel and a row-major `B` panel, AVX2 + FMA.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn micro_v3(simd: V3, a: &[[f32; MR]], b: &[[f32; NR]]) -> [[f32; NR]; MR] {
    let zero = simd.splat_f32x8(0.0);
    let mut acc = [[zero; 2]; MR];
    for (ak, bk) in a.iter().zip(b) {
        let [b0, b1]: [f32x8; 2] = pulp::cast(*bk);
        for (row, &av) in acc.iter_mut().zip(ak) {
            let av = simd.splat_f32x8(av);
            row[0] = simd.mul_add_f32x8(av, b0, row[0]);
            row[1] = simd.mul_add_f32x8(av, b1, row[1]);
        }
    }
    pulp::cast(acc)
}

/// The same product without SIMD intrinsics (the compiler vectorizes for the baseline).
#[inline(always)]
fn micro_portable(a: &[[f32; MR]], b: &[[f32; NR]]) -> [[f32; NR]; MR] {
    let mut acc = [[0f32; NR]; MR];
    for (ak, bk) in a.iter().zip(b) {
        for (row, &av) in acc.iter_mut().zip(ak) {
            for (x, &bv) in row.iter_mut().zip(bk) {
                *x += av * bv;
            }
        }
    }
    acc
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn naive(a: MatRef<'_>, b: MatRef<'_>, c: &mut [f32], ep: Epilogue<'_>) {
        let n = b.cols;
        for i in 0..a.rows {
            for j in 0..n {
                let mut s = 0f64;
                for p in 0..a.cols {
                    s += f64::from(a.at(i, p)) * f64::from(b.at(p, j));
                }
                let mut v = s as f32;
                if ep.accumulate {
                    v += c[i * n + j];
                }
                if let Some(bias) = ep.bias {
                    v += bias[j];
                }
                if ep.activation == Activation::Gelu {
                    v = crate::cpu::elementwise::gelu_scalar(v);
                }
                c[i * n + j] = v;
            }
        }
    }

    fn values(len: usize, seed: u64) -> Vec<f32> {
        let mut s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
        (0..len)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                (s >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
            })
            .collect()
    }

    fn check(m: usize, k: usize, n: usize, trans_a: bool, trans_b: bool, ep_kind: u8, seed: u64) {
        let a_data = values(m * k, seed);
        let b_data = values(k * n, seed + 1);
        let bias = values(n, seed + 2);
        let init = values(m * n, seed + 3);
        let a = if trans_a {
            MatRef::row_major(&a_data, k, m).t()
        } else {
            MatRef::row_major(&a_data, m, k)
        };
        let b = if trans_b {
            MatRef::row_major(&b_data, n, k).t()
        } else {
            MatRef::row_major(&b_data, k, n)
        };
        let ep = Epilogue {
            bias: (ep_kind & 1 != 0).then_some(bias.as_slice()),
            accumulate: ep_kind & 2 != 0,
            activation: if ep_kind & 4 != 0 {
                Activation::Gelu
            } else {
                Activation::Identity
            },
        };
        let mut got = init.clone();
        gemm(a, b, &mut got, ep);
        let mut want = init;
        naive(a, b, &mut want, ep);
        for (idx, (g, w)) in got.iter().zip(&want).enumerate() {
            let tol = 1e-5 * (k as f32).sqrt().max(1.0) * w.abs().max(1.0);
            assert!(
                (g - w).abs() <= tol,
                "{m}x{k}x{n} ta={trans_a} tb={trans_b} ep={ep_kind}: element {idx}: {g} vs {w}"
            );
        }
    }

    #[test]
    fn block_edges_and_depth_blocks() {
        // Rows and columns not multiples of the tile, depth over two KC blocks.
        check(13, 2 * KC + 5, 37, false, false, 7, 1);
        check(MC_MAX * 3 + 1, 40, NR * 2, false, true, 1, 2);
        check(1, 1, 1, true, false, 0, 3);
        check(200, KC, 17, true, true, 5, 4);
    }

    #[test]
    fn serial_product_writes_strided_rows_only() {
        let (m, k, n, ldc) = (17, 45, 23, 31);
        let a_data = values(m * k, 5);
        let b_data = values(k * n, 6);
        let a = MatRef::row_major(&a_data, m, k);
        let b = MatRef::row_major(&b_data, n, k).t();
        let mut want = vec![0f32; m * n];
        naive(a, b, &mut want, Epilogue::default());
        let mut c = vec![7f32; (m - 1) * ldc + n + 3];
        gemm_serial(a, b, &mut c, ldc, Epilogue::default());
        for i in 0..m {
            for j in 0..ldc {
                let idx = i * ldc + j;
                if idx >= c.len() {
                    break;
                }
                if j < n {
                    assert!((c[idx] - want[i * n + j]).abs() < 1e-4, "({i}, {j})");
                } else {
                    assert_eq!(c[idx], 7.0, "gap element ({i}, {j}) was written");
                }
            }
        }
    }

    /// The AVX packers write exactly what the element-by-element ones write (strided rows and
    /// columns, offsets into both operands, depths with and without a tail of `kc % 8`).
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn vectorized_packing_equals_the_scalar_packing() {
        let Some(simd) = detect() else {
            eprintln!("no AVX2 + FMA here: the scalar packing is the only one");
            return;
        };
        for (kc, stride, p0) in [(8, 8, 0), (37, 50, 5), (64, 200, 64), (300, 301, 1)] {
            let data = values(40 * stride, kc as u64);
            // A: rows r0..r0 + MR of a row-major matrix with row stride `stride`
            let a = MatRef::new(&data, 40, stride, stride, 1);
            let (mut want, mut got) = (vec![1f32; MR * kc], vec![2f32; MR * kc]);
            pack_a_panel(a, 3, MR, p0, &mut want);
            pack_a_rows_v3(simd, a, 3, p0, &mut got);
            assert_eq!(got, want, "A panel, kc {kc}, stride {stride}, p0 {p0}");
            // B: NR columns from j0 of a column-major matrix (columns `stride` apart)
            let b = MatRef::new(&data, stride, 40, 1, stride);
            let (mut want, mut got) = (vec![1f32; NR * kc], vec![2f32; NR * kc]);
            for (kk, row) in want.chunks_exact_mut(NR).enumerate() {
                for (jj, v) in row.iter_mut().enumerate() {
                    *v = b.at(p0 + kk, 7 + jj);
                }
            }
            simd.vectorize(PackColumns {
                simd,
                b,
                p0,
                j0: 7,
                dst: &mut got,
            });
            assert_eq!(got, want, "B panel, kc {kc}, stride {stride}, p0 {p0}");
        }
    }

    #[test]
    fn empty_depth_is_only_the_epilogue() {
        check(5, 0, 9, false, false, 7, 9);
        check(0, 4, 9, false, false, 7, 9);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        #[test]
        fn matches_naive(
            m in 1usize..40, k in 0usize..300, n in 1usize..40,
            ta: bool, tb: bool, ep in 0u8..8, seed: u64,
        ) {
            check(m, k, n, ta, tb, ep, seed);
        }
    }
}
