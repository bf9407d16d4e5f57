//! The reduced-precision matrix products of inference, the linear layers' product when a model
//! is loaded with `quantize = "int8"` (`C = act(dequant(quant(A) · quant(B)) + bias)`) or
//! `quantize = "bf16"` (`C = act(bf16(A) · bf16(B) + bias)` with `f32` sums, on processors with
//! AVX512-BF16: [`QuantizedMatrix::bf16`], [`Isa::bf16`]).
//!
//! **Quantization.** The weights `B` (`k x n`, one column per output channel) are quantized
//! once, when the model is prepared: column `j` to signed 8-bit integers
//! `round(b / s_j)` in `[-127, 127]` with `s_j = max |b_:j| / 127` (symmetric, per output
//! channel). The activations `A` are quantized as each product starts, row by row
//! (per token), to unsigned 8-bit integers with a zero point (asymmetric, the range
//! `[min(0, min a), max(0, max a)]` spread over `0..=255`, so 0 is exact): the scheme of ONNX
//! Runtime's dynamic quantization (`QuantizeLinear` u8 activations, s8 per-channel weights).
//! Each output is then `s_i t_j Σ_p (q_ip - z_i) w_pj` in `f32`, plus the bias, then the
//! activation, as in [`crate::cpu::gemm`]'s epilogue.
//!
//! **Integer products.** Two layouts of the same integers:
//! - *bytes* (AVX-512 VNNI): `q` itself (in `0..=255`) and the weights (in `[-127, 127]`) as
//!   bytes, four consecutive `k` per 32-bit lane, multiplied and summed four at a time into
//!   32-bit sums by `vpdpbusd` (64 multiply-adds an instruction, no intermediate saturation);
//!   the epilogue subtracts `z_i Σ_p w_pj` (each column's sum of weights, computed once);
//! - *pairs* (AVX-512 BW, AVX2, portable): `q - z` (in `[-255, 255]`) and the weights as 16-bit
//!   lanes, two consecutive `k` per 32-bit lane, multiply-added into 32-bit sums
//!   (`vpmaddwd` + `vpaddd`). Every pair sum is at most `2 · 255 · 127` in magnitude, so no step
//!   saturates.
//!
//! Both are exact up to `k = 66,000`, so **every instruction set computes the same integers**,
//! which the tests check against a naive `i64` product. (The byte instruction without VNNI,
//! `vpmaddubsw`, saturates its 16-bit pair sums: it would need 7-bit weights, as ONNX Runtime's
//! `reduce_range` has, and AVX2 and AVX-512 machines would compute different embeddings.)
//!
//! **Kernels**, picked at run time: for int8, AVX-512 with VNNI, AVX-512 (BW), AVX2, and a
//! portable loop; for bf16, AVX512-BF16. Safe code through `pulp`'s target-feature wrappers,
//! except the VNNI and the bf16 micro-kernels (`pulp` wraps neither `vpdpbusd` nor
//! `vdpbf16ps`): `#[target_feature]` functions of safe intrinsics, entered by `unsafe` calls
//! behind `pulp`'s detection of the features ([`ext`]).

#[cfg(target_arch = "x86_64")]
use pulp::x86::{V3, V4};
use rayon::prelude::*;
use std::cell::Cell;

use crate::cpu::gemm::{self, Epilogue, MatRef};

/// Rows of the micro-kernel's tile.
const MR: usize = 8;
/// Columns of the micro-kernel's tile (two AVX-512 vectors of 32-bit sums).
const NR: usize = 32;
/// Depth of one block of the inner dimension, in pairs of `k`: a `KCP x NR` block of `B`
/// (24 KiB) and an `MR x KCP` micro-panel of `A` (6 KiB) fit together in L1.
const KCP: usize = 192;
/// Depth of one block of the inner dimension in the bytes layout, in quads of `k`: a
/// `KCQ x NR` block of `B` (16 KiB) and an `MR x KCQ` micro-panel of `A` (4 KiB).
const KCQ: usize = 128;
/// An integer tile.
type Tile = [[i32; NR]; MR];
/// Most rows of `A` per parallel task (a multiple of [`MR`]).
const MC_MAX: usize = 96;
/// The largest inner dimension whose 32-bit sums cannot overflow: `2^31 / (255 · 127)`.
pub(crate) const K_MAX: usize = 66_000;

#[cfg(target_arch = "x86_64")]
pulp::simd_type! {
    /// AVX-512 with BF16 (the bf16 products' `vdpbf16ps`).
    pub struct V4Bf16 {
        avx512f: "avx512f",
        avx512bw: "avx512bw",
        avx512vl: "avx512vl",
        avx512bf16: "avx512bf16",
    }
}

#[cfg(target_arch = "x86_64")]
pulp::simd_type! {
    /// AVX-512 with VNNI (the bytes layout's `vpdpbusd`).
    pub struct V4Vnni {
        avx512f: "avx512f",
        avx512bw: "avx512bw",
        avx512vl: "avx512vl",
        avx512vnni: "avx512vnni",
    }
}

/// The widest instructions the reduced-precision kernels may use, from the environment
/// variable `INFEMBED_MAX_ISA` (read once): `avx2` leaves out every AVX-512 path (what an AMD
/// Zen 3 runs: int8 through AVX2, bf16 refused), `avx512` leaves out VNNI and BF16; unset (or
/// `all`), whatever the processor has. For comparing paths on one machine and for testing the
/// refusals of a smaller processor; an unknown value is logged and ignored.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum MaxIsa {
    /// AVX2 at most.
    Avx2,
    /// AVX-512 F/BW/VL, without VNNI or BF16.
    Avx512,
    /// No cap.
    All,
}

impl MaxIsa {
    /// The cap in force (`INFEMBED_MAX_ISA`, read once).
    pub fn get() -> Self {
        static CAP: std::sync::OnceLock<MaxIsa> = std::sync::OnceLock::new();
        *CAP.get_or_init(|| {
            let Ok(value) = std::env::var("INFEMBED_MAX_ISA") else {
                return Self::All;
            };
            match value.trim().to_ascii_lowercase().as_str() {
                "avx2" => Self::Avx2,
                "avx512" => Self::Avx512,
                "" | "all" => Self::All,
                other => {
                    log::warn!(
                        "INFEMBED_MAX_ISA={other:?} is not one of avx2, avx512, all: ignored"
                    );
                    Self::All
                }
            }
        })
    }
}

/// The instruction set of the integer kernel.
#[derive(Clone, Copy, Debug)]
pub enum Isa {
    #[cfg(target_arch = "x86_64")]
    /// AVX-512 BW with VNNI: the bytes layout.
    Vnni(V4Vnni, V4),
    #[cfg(target_arch = "x86_64")]
    /// AVX-512 BW with BF16: the products of a bf16 matrix ([`QuantizedMatrix::bf16`]).
    Bf16(V4Bf16, V4),
    #[cfg(target_arch = "x86_64")]
    /// AVX-512 BW.
    V4(V4),
    #[cfg(target_arch = "x86_64")]
    /// AVX2.
    V3(V3),
    /// No SIMD intrinsics.
    Portable,
}

impl Isa {
    /// The best this processor has (detected once).
    pub fn detect() -> Self {
        static BEST: std::sync::OnceLock<Isa> = std::sync::OnceLock::new();
        *BEST.get_or_init(|| Self::available()[0])
    }

    /// The bf16 products' instruction set, when this processor has AVX512-BF16 (detected
    /// once; none under `INFEMBED_MAX_ISA=avx512` or `avx2`, [`MaxIsa`]).
    pub fn bf16() -> Option<Self> {
        static BF16: std::sync::OnceLock<Option<Isa>> = std::sync::OnceLock::new();
        *BF16.get_or_init(|| {
            #[cfg(target_arch = "x86_64")]
            if MaxIsa::get() == MaxIsa::All
                && let (Some(bf16), Some(v4)) = (V4Bf16::try_new(), V4::try_new())
            {
                return Some(Self::Bf16(bf16, v4));
            }
            None
        })
    }

    /// Every int8 path this processor can run, best first (the portable one last), within
    /// `INFEMBED_MAX_ISA` ([`MaxIsa`]).
    pub fn available() -> Vec<Self> {
        let mut out = Vec::with_capacity(4);
        #[cfg(target_arch = "x86_64")]
        {
            let cap = MaxIsa::get();
            if cap == MaxIsa::All
                && let (Some(vnni), Some(v4)) = (V4Vnni::try_new(), V4::try_new())
            {
                out.push(Self::Vnni(vnni, v4));
            }
            if let Some(v4) = V4::try_new().filter(|_| cap >= MaxIsa::Avx512) {
                out.push(Self::V4(v4));
            }
            if let Some(v3) = V3::try_new() {
                out.push(Self::V3(v3));
            }
        }
        out.push(Self::Portable);
        out
    }

    /// `f` compiled with this instruction set's target features (`f.call()` must be
    /// `#[inline(always)]`: `vectorize` applies the features only to code inlined into it,
    /// which a closure does not guarantee); the portable set calls it as it is.
    #[inline(always)]
    fn vectorize<F: pulp::NullaryFnOnce>(self, f: F) -> F::Output {
        match self {
            #[cfg(target_arch = "x86_64")]
            Self::Vnni(simd, _) => simd.vectorize(f),
            #[cfg(target_arch = "x86_64")]
            Self::Bf16(simd, _) => simd.vectorize(f),
            #[cfg(target_arch = "x86_64")]
            Self::V4(simd) => simd.vectorize(f),
            #[cfg(target_arch = "x86_64")]
            Self::V3(simd) => simd.vectorize(f),
            Self::Portable => f.call(),
        }
    }

    /// The layout of the operands this set's kernel takes.
    #[inline(always)]
    fn layout(self) -> Layout {
        match self {
            #[cfg(target_arch = "x86_64")]
            Self::Vnni(..) => Layout::Bytes,
            #[cfg(target_arch = "x86_64")]
            Self::Bf16(..) => Layout::Bf16,
            _ => Layout::Pairs,
        }
    }

    /// A short name for logs and benchmark records.
    pub fn name(self) -> &'static str {
        match self {
            #[cfg(target_arch = "x86_64")]
            Self::Vnni(..) => "avx512-vnni",
            #[cfg(target_arch = "x86_64")]
            Self::Bf16(..) => "avx512-bf16",
            #[cfg(target_arch = "x86_64")]
            Self::V4(_) => "avx512",
            #[cfg(target_arch = "x86_64")]
            Self::V3(_) => "avx2",
            Self::Portable => "portable",
        }
    }
}

/// How a kernel's operands sit in 32-bit lanes.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Layout {
    /// Two consecutive `k` of int8 products as 16-bit integers.
    Pairs,
    /// Four consecutive `k` of int8 products as bytes.
    Bytes,
    /// Two consecutive `k` as bf16 (the weights of a bf16 matrix).
    Bf16,
}

impl Layout {
    /// Consecutive `k` per 32-bit lane.
    #[inline(always)]
    fn per_lane(self) -> usize {
        match self {
            Self::Bytes => 4,
            Self::Pairs | Self::Bf16 => 2,
        }
    }

    /// Lanes an inner dimension of `k` takes.
    #[inline(always)]
    fn depth(self, k: usize) -> usize {
        k.div_ceil(self.per_lane())
    }

    /// Lanes of one L1-sized block of the inner dimension.
    #[inline(always)]
    fn block(self) -> usize {
        match self {
            Self::Bytes => KCQ,
            Self::Pairs | Self::Bf16 => KCP,
        }
    }
}

/// `x` rounded to bf16 (to nearest, ties to even; a NaN stays a NaN, made quiet), as its 16
/// bits. Integer arithmetic and a select, which the compiler vectorizes.
#[inline(always)]
fn bf16_bits(x: f32) -> u16 {
    let bits = x.to_bits();
    let rounded = bits.wrapping_add(0x7fff + ((bits >> 16) & 1)) >> 16;
    let nan = (bits >> 16) | 0x40;
    let is_nan = bits & 0x7fff_ffff > 0x7f80_0000;
    (if is_nan { nan } else { rounded }) as u16
}

/// Two 16-bit values in one 32-bit lane: `lo` for the even `k`, `hi` for the odd one.
#[inline(always)]
fn pair(lo: i16, hi: i16) -> i32 {
    (u32::from(lo as u16) | (u32::from(hi as u16) << 16)) as i32
}

/// The two 16-bit values of a lane (inverse of [`pair`]).
#[inline(always)]
fn unpair(v: i32) -> (i32, i32) {
    (i32::from(v as i16), v >> 16)
}

/// Four bytes in one 32-bit lane, the first `k` in the lowest byte (`vpdpbusd`'s order).
#[inline(always)]
fn quad(bytes: [u8; 4]) -> i32 {
    i32::from_le_bytes(bytes)
}

/// A `k x n` weight matrix prepared for reduced-precision products, packed for the kernels
/// in panels of 32 columns:
/// - quantized per column (output channel) to `[-127, 127]` ([`QuantizedMatrix::new`]): as
///   bytes (`ceil(k / 4)` quads deep), and, for the instruction sets of the pairs layout, as
///   16-bit pairs (`ceil(k / 2)` deep, built from the bytes on first use);
/// - or rounded to bf16 ([`QuantizedMatrix::bf16`]): pairs of bf16, `ceil(k / 2)` deep.
#[derive(Clone)]
pub struct QuantizedMatrix {
    k: usize,
    n: usize,
    /// Whether the values are bf16 (else int8).
    is_bf16: bool,
    /// `ceil(n / NR)` panels of `quads x NR` lanes of four signed bytes, zero past the last
    /// column and row.
    quads: Vec<i32>,
    /// Each column's sum of quantized weights, zero-padded to whole panels.
    col_sums: Vec<i32>,
    /// The same panels as `pairs x NR` lanes of two 16-bit values.
    pairs: std::sync::OnceLock<Vec<i32>>,
    /// The scale of each column, zero-padded to whole panels.
    scales: Vec<f32>,
}

impl std::fmt::Debug for QuantizedMatrix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QuantizedMatrix")
            .field("k", &self.k)
            .field("n", &self.n)
            .finish()
    }
}

impl QuantizedMatrix {
    /// Quantizes `b` (`k x n`).
    ///
    /// # Panics
    /// When `k` exceeds [`K_MAX`] (no transformer comes near it).
    pub fn new(b: MatRef<'_>) -> Self {
        let (k, n) = (b.rows(), b.cols());
        assert!(k <= K_MAX, "int8: inner dimension {k} exceeds {K_MAX}");
        let quads = Layout::Bytes.depth(k);
        let panels = n.div_ceil(NR);
        let mut scales = vec![0f32; panels * NR];
        for (j, s) in scales.iter_mut().enumerate().take(n) {
            let max = (0..k).map(|p| b.at(p, j).abs()).fold(0f32, f32::max);
            *s = if max > 0.0 && max.is_finite() {
                max / 127.0
            } else {
                0.0
            };
        }
        let mut packed = vec![0i32; panels * quads * NR];
        let mut col_sums = vec![0i32; panels * NR];
        packed
            .par_chunks_mut(quads * NR)
            .zip(col_sums.par_chunks_mut(NR))
            .enumerate()
            .for_each(|(panel, (dst, sums))| {
                for (jj, sum) in sums.iter_mut().enumerate().take(NR.min(n - panel * NR)) {
                    let j = panel * NR + jj;
                    let s = scales[j];
                    let q = |p: usize| -> i8 {
                        if p >= k || s == 0.0 {
                            0
                        } else {
                            (b.at(p, j) / s).round().clamp(-127.0, 127.0) as i8
                        }
                    };
                    for p in 0..quads {
                        let w = [q(4 * p), q(4 * p + 1), q(4 * p + 2), q(4 * p + 3)];
                        *sum += w.iter().map(|&x| i32::from(x)).sum::<i32>();
                        dst[p * NR + jj] = quad(w.map(|x| x as u8));
                    }
                }
            });
        Self {
            k,
            n,
            is_bf16: false,
            quads: packed,
            col_sums,
            pairs: std::sync::OnceLock::new(),
            scales,
        }
    }

    /// `b` (`k x n`) rounded to bf16 (to nearest, ties to even), for the products of
    /// [`Isa::bf16`]: `f32` sums of bf16 products, no scales.
    pub fn bf16(b: MatRef<'_>) -> Self {
        let (k, n) = (b.rows(), b.cols());
        let pairs = Layout::Bf16.depth(k);
        let panels = n.div_ceil(NR);
        let mut packed = vec![0i32; panels * pairs * NR];
        packed
            .par_chunks_mut((pairs * NR).max(1)) // (nothing to pack when k = 0)
            .enumerate()
            .for_each(|(panel, dst)| {
                let (j0, width) = (panel * NR, NR.min(n - panel * NR));
                if b.row(0).is_some() {
                    // contiguous rows (the activation gradients of a weight gradient): two
                    // rows of the panel at a time, a cache line of each per 16 lanes
                    for (p, lanes) in dst.chunks_exact_mut(NR).enumerate() {
                        let row = |i: usize| {
                            (i < k).then(|| &b.row(i).expect("contiguous rows")[j0..j0 + width])
                        };
                        let (lo, hi) = (row(2 * p), row(2 * p + 1));
                        for (jj, lane) in lanes.iter_mut().enumerate().take(width) {
                            let bits = |r: Option<&[f32]>| r.map_or(0, |r| bf16_bits(r[jj]) as i16);
                            *lane = pair(bits(lo), bits(hi));
                        }
                    }
                } else if b.t().row(0).is_some() {
                    // contiguous columns (a weight read transposed): a column at a time
                    for jj in 0..width {
                        let col = b.t().row(j0 + jj).expect("contiguous columns");
                        let (whole, last) = pulp::as_arrays::<2, f32>(col);
                        for (p, &[lo, hi]) in whole.iter().enumerate() {
                            dst[p * NR + jj] = pair(bf16_bits(lo) as i16, bf16_bits(hi) as i16);
                        }
                        if let [x] = last {
                            dst[whole.len() * NR + jj] = pair(bf16_bits(*x) as i16, 0);
                        }
                    }
                } else {
                    let v = |p: usize, j: usize| {
                        if p < k {
                            bf16_bits(b.at(p, j)) as i16
                        } else {
                            0
                        }
                    };
                    for (p, lanes) in dst.chunks_exact_mut(NR).enumerate() {
                        for (jj, lane) in lanes.iter_mut().enumerate().take(width) {
                            *lane = pair(v(2 * p, j0 + jj), v(2 * p + 1, j0 + jj));
                        }
                    }
                }
            });
        Self {
            k,
            n,
            is_bf16: true,
            quads: Vec::new(),
            col_sums: vec![0; panels * NR],
            pairs: std::sync::OnceLock::from(packed),
            scales: vec![1.0; panels * NR],
        }
    }

    /// `b` prepared for `quantization`'s products (`None` for `f32`, and for bf16 on a
    /// processor without AVX512-BF16: the layer then computes in `f32`; the dual encoder
    /// refuses bf16 there with an error before it gets here).
    pub(crate) fn prepare(
        quantization: crate::device::Quantization,
        b: MatRef<'_>,
    ) -> Option<Self> {
        use crate::device::Quantization;
        match quantization {
            Quantization::Int8 => Some(Self::new(b)),
            Quantization::Bf16 => Isa::bf16().map(|_| Self::bf16(b)),
            Quantization::None => None,
        }
    }

    /// Whether the values are bf16 ([`QuantizedMatrix::bf16`]) rather than int8.
    #[cfg(test)]
    pub(crate) fn is_bf16(&self) -> bool {
        self.is_bf16
    }

    /// Columns (`n`).
    pub fn cols(&self) -> usize {
        self.n
    }

    /// Rows (`k`).
    pub fn rows(&self) -> usize {
        self.k
    }

    /// The panels in `layout` (`depth x NR` lanes each).
    fn panels(&self, layout: Layout) -> &[i32] {
        match layout {
            Layout::Bytes => &self.quads,
            Layout::Pairs | Layout::Bf16 => self.pairs(),
        }
    }

    /// The panels in the pairs layout (int8: built from the bytes once; bf16: the values).
    fn pairs(&self) -> &[i32] {
        self.pairs.get_or_init(|| {
            let (quads, pairs) = (Layout::Bytes.depth(self.k), Layout::Pairs.depth(self.k));
            let mut out = vec![0i32; self.quads.len() / (quads * NR) * pairs * NR];
            out.par_chunks_mut(pairs * NR)
                .zip(self.quads.par_chunks(quads * NR))
                .for_each(|(dst, src)| {
                    for (p, lanes) in dst.chunks_exact_mut(NR).enumerate() {
                        let row = &src[(p / 2) * NR..(p / 2 + 1) * NR];
                        for (lane, &q) in lanes.iter_mut().zip(row) {
                            let w = q.to_le_bytes().map(|x| x as i8);
                            let (lo, hi) = (w[2 * (p % 2)], w[2 * (p % 2) + 1]);
                            *lane = pair(i16::from(lo), i16::from(hi));
                        }
                    }
                });
            out
        })
    }

    /// The quantized weight `(p, j)` (tests).
    #[cfg(test)]
    fn value(&self, p: usize, j: usize) -> i32 {
        let quads = Layout::Bytes.depth(self.k);
        let lane = self.quads[(j / NR) * quads * NR + (p / 4) * NR + j % NR];
        i32::from(lane.to_le_bytes()[p % 4] as i8)
    }
}

/// The per-row quantization of an activation row: `(scale, zero point)`, with the range
/// widened to include 0 (so 0 is exact) and a zero row given scale 1.
#[inline(always)]
fn row_params(row: &[f32]) -> (f32, i32) {
    // sixteen running extremes, lane by lane (the compiler keeps them in one vector each;
    // a single running min/max would be a serial chain of scalar comparisons)
    const L: usize = 16;
    let (mut lo, mut hi) = ([0f32; L], [0f32; L]);
    let (chunks, tail) = pulp::as_arrays::<L, f32>(row);
    for chunk in chunks {
        for ((l, h), &x) in lo.iter_mut().zip(hi.iter_mut()).zip(chunk) {
            *l = if x < *l { x } else { *l };
            *h = if x > *h { x } else { *h };
        }
    }
    for (i, &x) in tail.iter().enumerate() {
        lo[i] = if x < lo[i] { x } else { lo[i] };
        hi[i] = if x > hi[i] { x } else { hi[i] };
    }
    let lo = lo.iter().fold(0f32, |a, &b| if b < a { b } else { a });
    let hi = hi.iter().fold(0f32, |a, &b| if b > a { b } else { a });
    let scale = (hi - lo) / 255.0;
    if !(scale > 0.0 && scale.is_finite()) {
        return (1.0, 0);
    }
    let zero = (-lo / scale).round_ties_even().clamp(0.0, 255.0) as i32;
    (scale, zero)
}

/// `x` quantized with `(inverse scale, zero point)`, in `0..=255`.
///
/// `x * inv` rounds to the nearest integer (ties to even) by adding `1.5 * 2^23`, whose
/// spacing of floats is 1, and reading the integer back from the bits: exact for magnitudes
/// below `2^22` (the row's own values scale to at most 255), and plain integer arithmetic the
/// compiler vectorizes (a float-to-int `as` cast checks for overflow and NaN lane by lane). A
/// NaN input lands somewhere in `0..=255`, as no `f32` product would.
#[inline(always)]
fn quantize(x: f32, inv: f32, zero: i32) -> i32 {
    const MAGIC: f32 = 12_582_912.0; // 1.5 * 2^23
    let rounded = ((x * inv + MAGIC).to_bits() as i32).wrapping_sub(MAGIC.to_bits() as i32);
    rounded.wrapping_add(zero).clamp(0, 255)
}

thread_local! {
    /// Each thread's packed activations, kept between calls.
    static SCRATCH: Cell<PackedA> = Cell::new(PackedA::default());
}

/// The quantized activations of one task in either layout, with each row's scale and zero
/// point.
#[derive(Default)]
struct PackedA {
    /// `ceil(rows / MR)` micro-panels of `depth x MR` lanes (rows past the end zero).
    lanes: Vec<i32>,
    scales: Vec<f32>,
    zeros: Vec<i32>,
}

/// Packs rows `i0 .. i0 + rows` of `a` into `ceil(rows / MR)` micro-panels of `depth x MR`
/// lanes (rows past the end zero) in `layout`: `ceil(k / 2)` pairs of `q - z`, `ceil(k / 4)`
/// quads of `q`, or `ceil(k / 2)` pairs of bf16 (scale 1, zero point 0).
#[inline(always)]
fn pack_a(a: MatRef<'_>, i0: usize, rows: usize, layout: Layout, out: &mut PackedA) {
    let k = a.cols();
    let bytes = layout == Layout::Bytes;
    let depth = layout.depth(k);
    let tiles = rows.div_ceil(MR);
    out.lanes.resize(tiles * depth * MR, 0);
    out.scales.clear();
    out.zeros.clear();
    if layout == Layout::Bf16 && a.row(0).is_none() && a.t().row(0).is_some() {
        // contiguous columns (training's `xᵀ g`): each lane pairs two columns' values of a
        // row, so a micro-panel is read as two column segments of `MR` values per pair
        for (t, panel) in out.lanes.chunks_exact_mut(depth * MR).enumerate() {
            let (r0, height) = (i0 + t * MR, MR.min(rows - t * MR));
            let col = |q: usize| {
                (q < k).then(|| &a.t().row(q).expect("contiguous columns")[r0..r0 + height])
            };
            for (p, lanes) in panel.chunks_exact_mut(MR).enumerate() {
                let (lo, hi) = (col(2 * p), col(2 * p + 1));
                for (r, lane) in lanes.iter_mut().enumerate() {
                    let bits = |c: Option<&[f32]>| c.map_or(0, |c| bf16_bits(c[r]) as i16);
                    *lane = if r < height {
                        pair(bits(lo), bits(hi))
                    } else {
                        0
                    };
                }
            }
            out.scales.extend(std::iter::repeat_n(1.0, height));
            out.zeros.extend(std::iter::repeat_n(0, height));
        }
        return;
    }
    let mut vals = vec![0i32; depth * layout.per_lane()];
    let mut gathered = Vec::new();
    for (t, panel) in out.lanes.chunks_exact_mut(depth * MR).enumerate() {
        let height = MR.min(rows - t * MR);
        if height < MR {
            panel.fill(0);
        }
        for r in 0..height {
            let i = i0 + t * MR + r;
            let row = match a.row(i) {
                Some(row) => row,
                None => {
                    gathered.clear();
                    gathered.extend((0..k).map(|p| a.at(i, p)));
                    &gathered[..]
                }
            };
            if layout == Layout::Bf16 {
                // converted in one contiguous pass (vectorized), then spread over the panel
                let (whole, last) = pulp::as_arrays::<2, f32>(row);
                for (v, &[lo, hi]) in vals.iter_mut().zip(whole) {
                    *v = pair(bf16_bits(lo) as i16, bf16_bits(hi) as i16);
                }
                if let [x] = last {
                    vals[whole.len()] = pair(bf16_bits(*x) as i16, 0);
                }
                for (lanes, &v) in panel.chunks_exact_mut(MR).zip(&vals[..depth]) {
                    lanes[r] = v;
                }
                out.scales.push(1.0);
                out.zeros.push(0);
                continue;
            }
            let (scale, zero) = row_params(row);
            let inv = 1.0 / scale;
            // past `k`, `q - z` is 0 in the pairs layout and `q` is 0 in the bytes layout
            // (its weights are 0 there, and the column sums stop at `k`)
            let shift = if bytes { 0 } else { zero };
            for (v, &x) in vals.iter_mut().zip(row) {
                *v = quantize(x, inv, zero) - shift;
            }
            if bytes {
                let (val_quads, _) = pulp::as_arrays::<4, i32>(&vals);
                for (lanes, &v) in panel.chunks_exact_mut(MR).zip(val_quads) {
                    lanes[r] = quad(v.map(|x| x as u8));
                }
            } else {
                let (val_pairs, _) = pulp::as_arrays::<2, i32>(&vals);
                for (lanes, &[lo, hi]) in panel.chunks_exact_mut(MR).zip(val_pairs) {
                    lanes[r] = pair(lo as i16, hi as i16);
                }
            }
            out.scales.push(scale);
            out.zeros.push(zero);
        }
    }
}

/// `c = act(dequant(quant(a) · b) + bias)` with `c` row-major `a.rows() x b.cols()`; the
/// epilogue's `accumulate` adds the previous content of `c` first, as [`gemm::gemm`] does.
///
/// # Panics
/// When the inner dimensions differ or `c` or the bias have the wrong length (shape
/// contracts of the caller).
/// Also when `b` is bf16 and this processor lacks AVX512-BF16 (the encoder checks that first).
pub(crate) fn qgemm(a: MatRef<'_>, b: &QuantizedMatrix, c: &mut [f32], epilogue: Epilogue<'_>) {
    let isa = if b.is_bf16 {
        Isa::bf16().expect("bf16 products need AVX512-BF16")
    } else {
        Isa::detect()
    };
    qgemm_with(isa, a, b, c, epilogue);
}

/// The product on the given instruction set (what the encoder runs: [`Isa::detect`] for an
/// int8 matrix, [`Isa::bf16`] for a bf16 one).
///
/// # Panics
/// When the inner dimensions differ, `c` or the bias have the wrong length (shape contracts of
/// the caller), or `isa` is not for `b`'s values (bf16 or int8).
pub fn qgemm_with(
    isa: Isa,
    a: MatRef<'_>,
    b: &QuantizedMatrix,
    c: &mut [f32],
    epilogue: Epilogue<'_>,
) {
    let (m, k, n) = (a.rows(), a.cols(), b.n);
    assert_eq!(
        k, b.k,
        "qgemm: inner dimensions differ: a is {m}x{k}, b is {}x{n}",
        b.k
    );
    assert_eq!(c.len(), m * n, "qgemm: c must hold {m}x{n} elements");
    if let Some(bias) = epilogue.bias {
        assert_eq!(bias.len(), n, "qgemm: bias must have {n} elements");
    }
    assert_eq!(
        isa.layout() == Layout::Bf16,
        b.is_bf16,
        "qgemm: the {} kernels do not take this matrix",
        isa.name()
    );
    if m == 0 || n == 0 {
        return;
    }
    let threads = rayon::current_num_threads().max(1);
    let mc = (m.div_ceil(4 * threads).div_ceil(MR) * MR).clamp(MR, MC_MAX);
    c.par_chunks_mut(mc * n)
        .enumerate()
        .for_each(|(block, c_block)| {
            let rows = c_block.len() / n;
            let task = Task {
                a,
                i0: block * mc,
                rows,
                b,
                c: c_block,
                epilogue,
            };
            task.dispatch(isa);
        });
}

/// One parallel task: rows `i0 .. i0 + rows` of the output, all columns.
struct Task<'a, 'b> {
    a: MatRef<'a>,
    i0: usize,
    rows: usize,
    b: &'b QuantizedMatrix,
    c: &'b mut [f32],
    epilogue: Epilogue<'a>,
}

/// A [`Task`] as the argument of [`Isa::vectorize`].
struct RunTask<'a, 'b>(Task<'a, 'b>, Isa);

impl pulp::NullaryFnOnce for RunTask<'_, '_> {
    type Output = ();

    #[inline(always)]
    fn call(self) {
        self.0.run(self.1);
    }
}

impl Task<'_, '_> {
    /// Runs the task under `isa`'s target features.
    fn dispatch(self, isa: Isa) {
        isa.vectorize(RunTask(self, isa));
    }

    #[inline(always)]
    fn run(self, isa: Isa) {
        let Self {
            a,
            i0,
            rows,
            b,
            c,
            epilogue,
        } = self;
        let n = b.n;
        let layout = isa.layout();
        // the inner dimension in lanes of the layout, and its L1-sized blocks
        let (depth, block, b_panels) = (layout.depth(b.k), layout.block(), b.panels(layout));
        let tiles = rows.div_ceil(MR);
        // the f32 epilogue's vectors (AVX2; the AVX-512 paths include it)
        let v3: Option<gemm::Fast> = match isa {
            #[cfg(target_arch = "x86_64")]
            Isa::Vnni(_, v4) | Isa::Bf16(_, v4) | Isa::V4(v4) => Some(*v4),
            #[cfg(target_arch = "x86_64")]
            Isa::V3(v3) => Some(v3),
            Isa::Portable => None,
        };
        let mut packed = SCRATCH.with(Cell::take);
        pack_a(a, i0, rows, layout, &mut packed);
        let mut tiles_acc: Vec<Tile> = vec![[[0; NR]; MR]; tiles];
        for (j, b_panel) in b_panels.chunks_exact(depth * NR).enumerate() {
            // the panel's products, one L1-sized block of the inner dimension at a time
            for p0 in (0..depth).step_by(block) {
                let kc = block.min(depth - p0);
                let (b_block, _) = pulp::as_arrays::<NR, i32>(&b_panel[p0 * NR..(p0 + kc) * NR]);
                for (acc, a_panel) in tiles_acc
                    .iter_mut()
                    .zip(packed.lanes.chunks_exact(depth * MR))
                {
                    let a_block = &a_panel[p0 * MR..(p0 + kc) * MR];
                    let (a_block, _) = pulp::as_arrays::<MR, i32>(a_block);
                    micro(isa, a_block, b_block, acc, p0 == 0);
                }
            }
            let j0 = j * NR;
            let width = NR.min(n - j0);
            let w_scales: &[f32; NR] = b.scales[j0..j0 + NR].try_into().expect("a panel");
            let col_sums: &[i32; NR] = b.col_sums[j0..j0 + NR].try_into().expect("a panel");
            for (t, acc) in tiles_acc.iter().enumerate() {
                let r0 = t * MR;
                for (r, acc_row) in acc.iter().enumerate().take(MR.min(rows - r0)) {
                    let sa = packed.scales[r0 + r];
                    // the bytes layout summed `q w`: `Σ (q - z) w = Σ q w - z Σ w`
                    let zero = if layout == Layout::Bytes {
                        packed.zeros[r0 + r]
                    } else {
                        0
                    };
                    let mut v = [0f32; NR];
                    if layout == Layout::Bf16 {
                        // the bf16 kernel's sums are `f32` already (held as their bits)
                        v = pulp::cast(*acc_row);
                    } else {
                        for (((x, &s), &q), &sum) in
                            v.iter_mut().zip(w_scales).zip(acc_row).zip(col_sums)
                        {
                            *x = q.wrapping_sub(zero.wrapping_mul(sum)) as f32 * (sa * s);
                        }
                    }
                    let start = (r0 + r) * n + j0;
                    let out = &mut c[start..start + width];
                    const HALF: usize = NR / 2;
                    let (out_lo, out_hi) = out.split_at_mut(width.min(HALF));
                    let (lo, hi) = v.split_at(HALF);
                    let lo: &[f32; HALF] = lo.try_into().expect("half a tile");
                    gemm::epilogue_row(v3, out_lo, lo, j0, epilogue);
                    if !out_hi.is_empty() {
                        let hi: &[f32; HALF] = hi.try_into().expect("half a tile");
                        gemm::epilogue_row(v3, out_hi, hi, j0 + HALF, epilogue);
                    }
                }
            }
        }
        SCRATCH.with(|s| s.set(packed));
    }
}

/// `acc` (from zeros when `fresh`) advanced by the integer products of an `A` micro-panel
/// and a `B` block of the same depth (in `isa`'s layout), on `isa` (inlined into a caller that runs under its
/// target features).
#[inline(always)]
fn micro(isa: Isa, a: &[[i32; MR]], b: &[[i32; NR]], acc: &mut Tile, fresh: bool) {
    if fresh {
        *acc = [[0; NR]; MR];
    }
    match isa {
        #[cfg(target_arch = "x86_64")]
        Isa::Vnni(vnni, _) => ext::micro_vnni(vnni, a, b, acc),
        #[cfg(target_arch = "x86_64")]
        Isa::Bf16(bf16, _) => ext::micro_bf16(bf16, a, b, acc),
        #[cfg(target_arch = "x86_64")]
        Isa::V4(v4) => micro_512(v4, a, b, acc),
        #[cfg(target_arch = "x86_64")]
        Isa::V3(simd) => micro_v3(simd, a, b, acc),
        Isa::Portable => micro_portable(a, b, acc),
    }
}

/// The micro-kernels of the instructions `pulp` has no wrapper for, AVX-512 VNNI's `vpdpbusd`
/// and AVX512-BF16's `vdpbf16ps`: the one place of this crate with `unsafe`.
#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
mod ext {
    use super::{MR, NR, Tile, V4Bf16, V4Vnni};
    use core::arch::x86_64::{
        __m512, __m512bh, __m512i, _mm512_dpbf16_ps, _mm512_dpbusd_epi32, _mm512_set1_epi32,
    };

    /// [`vnni_tile`] on a processor with AVX-512 (F, BW) and VNNI, which `_proof` shows.
    #[inline(always)]
    pub(super) fn micro_vnni(_proof: V4Vnni, a: &[[i32; MR]], b: &[[i32; NR]], out: &mut Tile) {
        // SAFETY: `vnni_tile` is safe code compiled for AVX-512 F, BW and VNNI; calling it is
        // sound wherever the processor has those features, and a `V4Vnni` value exists only
        // where `pulp`'s run-time detection found all of them (its constructor is `try_new`).
        unsafe { vnni_tile(a, b, out) }
    }

    /// [`bf16_tile`] on a processor with AVX-512 (F, BW) and BF16, which `_proof` shows.
    #[inline(always)]
    pub(super) fn micro_bf16(_proof: V4Bf16, a: &[[i32; MR]], b: &[[i32; NR]], out: &mut Tile) {
        // SAFETY: as for `micro_vnni`, with AVX512-BF16 and `V4Bf16`.
        unsafe { bf16_tile(a, b, out) }
    }

    /// Eight rows of two vectors: per quad of `k`, one broadcast lane of four `u8` of `A`
    /// per row against two vectors of sixteen lanes of four `i8` of `B`; `vpdpbusd` sums the
    /// four products of each lane into its 32-bit sum (exactly: no intermediate saturation).
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    fn vnni_tile(a: &[[i32; MR]], b: &[[i32; NR]], out: &mut Tile) {
        let mut acc: [[__m512i; 2]; MR] = pulp::cast(*out);
        for (ak, bk) in a.iter().zip(b) {
            let [b0, b1]: [__m512i; 2] = pulp::cast(*bk);
            for (row, &av) in acc.iter_mut().zip(ak) {
                let av = _mm512_set1_epi32(av);
                row[0] = _mm512_dpbusd_epi32(row[0], av, b0);
                row[1] = _mm512_dpbusd_epi32(row[1], av, b1);
            }
        }
        *out = pulp::cast(acc);
    }

    /// The 32 bits of a vector as sixteen pairs of bf16.
    #[inline(always)]
    fn as_bf16(v: __m512i) -> __m512bh {
        // SAFETY: both are 64 bytes of plain data with no invalid bit patterns.
        unsafe { core::mem::transmute::<__m512i, __m512bh>(v) }
    }

    /// The tile of [`vnni_tile`] in `f32` sums (held as their bits): per pair of `k`, one
    /// broadcast pair of bf16 of `A` per row against two vectors of sixteen pairs of `B`;
    /// `vdpbf16ps` adds both products of each lane to its `f32` sum.
    #[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
    fn bf16_tile(a: &[[i32; MR]], b: &[[i32; NR]], out: &mut Tile) {
        let mut acc: [[__m512; 2]; MR] = pulp::cast(*out);
        for (ak, bk) in a.iter().zip(b) {
            let [b0, b1]: [__m512i; 2] = pulp::cast(*bk);
            let (b0, b1) = (as_bf16(b0), as_bf16(b1));
            for (row, &av) in acc.iter_mut().zip(ak) {
                let av = as_bf16(_mm512_set1_epi32(av));
                row[0] = _mm512_dpbf16_ps(row[0], av, b0);
                row[1] = _mm512_dpbf16_ps(row[1], av, b1);
            }
        }
        *out = pulp::cast(acc);
    }
}

/// AVX-512: eight rows of two vectors, one broadcast pair of `A` per row and `k` pair.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn micro_512(simd: V4, a: &[[i32; MR]], b: &[[i32; NR]], out: &mut Tile) {
    use core::arch::x86_64::__m512i;
    let (f, bw) = (simd.avx512f, simd.avx512bw);
    let mut acc: [[__m512i; 2]; MR] = pulp::cast(*out);
    for (ak, bk) in a.iter().zip(b) {
        let [b0, b1]: [__m512i; 2] = pulp::cast(*bk);
        for (row, &av) in acc.iter_mut().zip(ak) {
            let av = f._mm512_set1_epi32(av);
            row[0] = f._mm512_add_epi32(row[0], bw._mm512_madd_epi16(av, b0));
            row[1] = f._mm512_add_epi32(row[1], bw._mm512_madd_epi16(av, b1));
        }
    }
    *out = pulp::cast(acc);
}

/// AVX2: the tile in four passes of four rows by two vectors (11 of the 16 registers).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn micro_v3(simd: V3, a: &[[i32; MR]], b: &[[i32; NR]], out: &mut Tile) {
    use core::arch::x86_64::__m256i;
    const H: usize = MR / 2;
    const W: usize = NR / 2;
    let (avx, avx2) = (simd.avx, simd.avx2);
    for rows in 0..2 {
        for cols in 0..2 {
            let mut acc = [[avx._mm256_setzero_si256(); 2]; H];
            for (a, o) in acc.iter_mut().zip(&out[rows * H..rows * H + H]) {
                let o: [i32; NR / 2] = o[cols * W..cols * W + W].try_into().expect("half");
                *a = pulp::cast(o);
            }
            for (ak, bk) in a.iter().zip(b) {
                let half: [i32; W] = bk[cols * W..cols * W + W].try_into().expect("half");
                let [b0, b1]: [__m256i; 2] = pulp::cast(half);
                for (row, &av) in acc.iter_mut().zip(&ak[rows * H..rows * H + H]) {
                    let av = avx._mm256_set1_epi32(av);
                    row[0] = avx2._mm256_add_epi32(row[0], avx2._mm256_madd_epi16(av, b0));
                    row[1] = avx2._mm256_add_epi32(row[1], avx2._mm256_madd_epi16(av, b1));
                }
            }
            let acc: [[i32; W]; H] = pulp::cast(acc);
            for (o, v) in out[rows * H..rows * H + H].iter_mut().zip(acc) {
                o[cols * W..cols * W + W].copy_from_slice(&v);
            }
        }
    }
}

/// The same sums one lane at a time.
#[inline(always)]
fn micro_portable(a: &[[i32; MR]], b: &[[i32; NR]], acc: &mut Tile) {
    for (ak, bk) in a.iter().zip(b) {
        for (row, &av) in acc.iter_mut().zip(ak) {
            let (a0, a1) = unpair(av);
            for (x, &bv) in row.iter_mut().zip(bk) {
                let (b0, b1) = unpair(bv);
                *x = x.wrapping_add(a0 * b0 + a1 * b1);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::gemm::Activation;
    use proptest::prelude::*;

    /// The integer sums every instruction set must produce, computed naively in `i64` from
    /// the quantized values: `Σ_p (q_ip - z_i) w_pj`.
    fn naive_sums(a: MatRef<'_>, b: &QuantizedMatrix) -> Vec<i64> {
        let (m, k, n) = (a.rows(), a.cols(), b.cols());
        let mut out = vec![0i64; m * n];
        for i in 0..m {
            let row: Vec<f32> = (0..k).map(|p| a.at(i, p)).collect();
            let (scale, zero) = row_params(&row);
            let q: Vec<i64> = row
                .iter()
                .map(|&x| {
                    // the definition, spelled out: round to the grid, clamp to u8, remove z
                    let u = ((x * (1.0 / scale)).round_ties_even() as i64 + i64::from(zero))
                        .clamp(0, 255);
                    u - i64::from(zero)
                })
                .collect();
            for j in 0..n {
                out[i * n + j] = (0..k).map(|p| q[p] * i64::from(b.value(p, j))).sum();
            }
        }
        out
    }

    /// [`micro`] under `isa`'s target features.
    fn tile(isa: Isa, a: &[[i32; MR]], b: &[[i32; NR]], acc: &mut Tile, fresh: bool) {
        struct Op<'a>(Isa, &'a [[i32; MR]], &'a [[i32; NR]], &'a mut Tile, bool);
        impl pulp::NullaryFnOnce for Op<'_> {
            type Output = ();
            #[inline(always)]
            fn call(self) {
                micro(self.0, self.1, self.2, self.3, self.4)
            }
        }
        isa.vectorize(Op(isa, a, b, acc, fresh));
    }

    /// The integer sums `Σ_p (q_ip - z_i) w_pj` the kernel of `isa` computes (in its layout's
    /// blocks, as [`qgemm`] runs them; the bytes layout's sums less `z_i Σ_p w_pj`).
    fn kernel_sums(isa: Isa, a: MatRef<'_>, b: &QuantizedMatrix) -> Vec<i64> {
        let (m, k, n) = (a.rows(), a.cols(), b.cols());
        let layout = isa.layout();
        let bytes = layout == Layout::Bytes;
        let (depth, block, panels) = (layout.depth(k), layout.block(), b.panels(layout));
        let mut packed = PackedA::default();
        pack_a(a, 0, m, layout, &mut packed);
        let mut out = vec![0i64; m * n];
        for (j, b_panel) in panels.chunks_exact(depth * NR).enumerate() {
            for (t, a_panel) in packed.lanes.chunks_exact(depth * MR).enumerate() {
                let mut acc = [[i32::MIN; NR]; MR];
                for p0 in (0..depth).step_by(block) {
                    let end = (p0 + block).min(depth);
                    let (ab, _) = pulp::as_arrays::<MR, i32>(&a_panel[p0 * MR..end * MR]);
                    let (bb, _) = pulp::as_arrays::<NR, i32>(&b_panel[p0 * NR..end * NR]);
                    tile(isa, ab, bb, &mut acc, p0 == 0);
                }
                for (r, row) in acc.iter().enumerate() {
                    for (jj, &v) in row.iter().enumerate() {
                        let (i, col) = (t * MR + r, j * NR + jj);
                        if i < m && col < n {
                            let shift = if bytes {
                                i64::from(packed.zeros[i]) * i64::from(b.col_sums[col])
                            } else {
                                0
                            };
                            out[i * n + col] = i64::from(v) - shift;
                        }
                    }
                }
            }
        }
        out
    }

    fn matrix(rows: usize, cols: usize, seed: u64, spread: f32) -> Vec<f32> {
        // a small deterministic generator: values of both signs, some zeros, some outliers
        let mut s = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (0..rows * cols)
            .map(|i| {
                s = s
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let u = ((s >> 33) as f32) / (1u64 << 31) as f32 - 0.5;
                match i % 17 {
                    0 => 0.0,
                    5 => u * spread * 8.0,
                    _ => u * spread,
                }
            })
            .collect()
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(24))]

        /// Every instruction set's integer sums equal the naive `i64` sums exactly, for
        /// shapes that leave partial tiles, partial panels and an odd `k`.
        #[test]
        fn integer_sums_are_exact_on_every_path(
            m in 1usize..40, k in 1usize..900, n in 1usize..100, seed in any::<u64>(),
        ) {
            let a = matrix(m, k, seed, 3.0);
            let b = matrix(k, n, seed ^ 0x5555, 0.2);
            let am = MatRef::row_major(&a, m, k);
            let q = QuantizedMatrix::new(MatRef::row_major(&b, k, n));
            let want = naive_sums(am, &q);
            for isa in Isa::available() {
                prop_assert_eq!(&kernel_sums(isa, am, &q), &want, "{}", isa.name());
            }
        }
    }

    #[test]
    fn extreme_values_do_not_saturate() {
        // every activation at the end of its range against weights of +-127: the largest
        // pair sums the kernels can meet, over a deep inner dimension
        let (m, k, n) = (MR + 3, 2049, NR + 5);
        let a: Vec<f32> = (0..m * k)
            .map(|i| if (i / k) % 2 == 0 { 1.0 } else { -1.0 })
            .collect();
        let b: Vec<f32> = (0..k * n)
            .map(|i| if i % 3 == 0 { -1.0 } else { 1.0 })
            .collect();
        let am = MatRef::row_major(&a, m, k);
        let q = QuantizedMatrix::new(MatRef::row_major(&b, k, n));
        let want = naive_sums(am, &q);
        assert!(
            want.iter().any(|&v| v.unsigned_abs() > 1 << 24),
            "a deep sum"
        );
        for isa in Isa::available() {
            assert_eq!(kernel_sums(isa, am, &q), want, "{}", isa.name());
        }
    }

    #[test]
    fn weights_round_trip_within_half_a_step() {
        let (k, n) = (37, 45);
        let b = matrix(k, n, 7, 0.4);
        let q = QuantizedMatrix::new(MatRef::row_major(&b, k, n));
        for j in 0..n {
            let s = q.scales[j];
            let max = (0..k).map(|p| b[p * n + j].abs()).fold(0f32, f32::max);
            assert!((s * 127.0 - max).abs() <= max * 1e-6, "column {j} scale");
            for p in 0..k {
                let w = q.value(p, j);
                assert!(w.abs() <= 127);
                assert!((w as f32 * s - b[p * n + j]).abs() <= s / 2.0 * 1.0001);
            }
        }
    }

    #[test]
    fn zero_columns_and_rows_give_zeros_and_the_bias() {
        let (m, k, n) = (3, 8, 5);
        let mut a = matrix(m, k, 3, 1.0);
        a[k..2 * k].fill(0.0); // row 1 all zero
        let mut b = matrix(k, n, 4, 1.0);
        for p in 0..k {
            b[p * n + 2] = 0.0; // column 2 all zero
        }
        let bias = [0.5f32, -1.0, 2.0, 0.25, 3.0];
        let q = QuantizedMatrix::new(MatRef::row_major(&b, k, n));
        let mut c = vec![f32::NAN; m * n];
        let ep = Epilogue {
            bias: Some(&bias),
            ..Epilogue::default()
        };
        qgemm(MatRef::row_major(&a, m, k), &q, &mut c, ep);
        for j in 0..n {
            assert_eq!(c[n + j], bias[j], "zero row, column {j}");
        }
        for i in 0..m {
            assert_eq!(c[i * n + 2], bias[2], "zero column, row {i}");
        }
    }

    /// The dequantized product against the exact `f32` product: within the error the two
    /// roundings allow, `Σ_p |a_ip| t_j / 2 + |b_pj| s_i / 2 + s_i t_j / 4`, on every path
    /// and with the fused bias and GELU.
    #[test]
    fn dequantized_product_is_within_the_rounding_bound() {
        let (m, k, n) = (29, 384, 70);
        let a = matrix(m, k, 11, 2.0);
        let b = matrix(k, n, 12, 0.1);
        let bias = matrix(1, n, 13, 1.0);
        let am = MatRef::row_major(&a, m, k);
        let bm = MatRef::row_major(&b, k, n);
        let q = QuantizedMatrix::new(bm);
        for act in [Activation::Identity, Activation::Gelu] {
            let ep = Epilogue {
                bias: Some(&bias),
                accumulate: false,
                activation: act,
            };
            for isa in Isa::available() {
                let mut c = vec![0f32; m * n];
                qgemm_with(isa, am, &q, &mut c, ep);
                for i in 0..m {
                    let (s, _) = row_params(&a[i * k..(i + 1) * k]);
                    for j in 0..n {
                        let t = q.scales[j];
                        let exact: f64 = (0..k)
                            .map(|p| f64::from(a[i * k + p]) * f64::from(b[p * n + j]))
                            .sum::<f64>()
                            + f64::from(bias[j]);
                        let bound: f64 = (0..k)
                            .map(|p| {
                                f64::from(a[i * k + p].abs() * t + b[p * n + j].abs() * s) / 2.0
                                    + f64::from(s * t) / 4.0
                            })
                            .sum::<f64>()
                            * 1.001
                            + 1e-5;
                        let got = f64::from(c[i * n + j]);
                        let want = match act {
                            Activation::Identity => exact,
                            // GELU is 1.13-Lipschitz
                            Activation::Gelu => {
                                f64::from(crate::cpu::elementwise::gelu_scalar(exact as f32))
                            }
                        };
                        let bound = if act == Activation::Gelu {
                            bound * 1.13
                        } else {
                            bound
                        };
                        assert!(
                            (got - want).abs() <= bound,
                            "{} {act:?} ({i}, {j}): {got} vs {want}, bound {bound}",
                            isa.name()
                        );
                    }
                }
            }
        }
    }

    /// `bf16_bits` against the `half` crate's conversion: ties, the ends of the range,
    /// infinities, subnormals and NaN.
    #[test]
    fn bf16_rounding_matches_half() {
        let mut xs = vec![
            0.0f32,
            -0.0,
            1.0,
            f32::MAX,
            f32::MIN,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::MIN_POSITIVE,
            1e-40,
            f32::from_bits(0x3f80_8000), // a tie, rounds down to even
            f32::from_bits(0x3f81_8000), // a tie, rounds up to even
            f32::from_bits(0x7f7f_ffff),
        ];
        xs.extend(matrix(1, 4000, 21, 50.0));
        xs.extend((0..4000u32).map(|i| f32::from_bits(i.wrapping_mul(2_654_435_761))));
        for x in xs {
            let want = half::bf16::from_f32(x);
            let got = bf16_bits(x);
            if x.is_nan() {
                assert!(half::bf16::from_bits(got).is_nan(), "{x:?}");
            } else {
                assert_eq!(got, want.to_bits(), "{x:?} ({:#x})", x.to_bits());
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(16))]

        /// The bf16 products against an `f64` product of the same bf16 values: within the
        /// `f32` accumulation's bound `k · 2^-23 · Σ_p |a_ip b_pj|` (`vdpbf16ps` rounds
        /// each sum to `f32`; the products of two bf16 are exact), with the bias and GELU
        /// fused. Where the processor lacks AVX512-BF16 the test says so and checks nothing
        /// (the encoder refuses `bf16` there: `tests/int8.rs`).
        #[test]
        fn bf16_products_are_the_f32_sums_of_bf16_values(
            m in 1usize..30, k in 1usize..700, n in 1usize..80, seed in any::<u64>(),
        ) {
            let Some(isa) = Isa::bf16() else {
                eprintln!("this processor has no AVX512-BF16: bf16 kernels not run");
                return Ok(());
            };
            let a = matrix(m, k, seed, 3.0);
            let b = matrix(k, n, seed ^ 0x3333, 0.2);
            let bias = matrix(1, n, seed ^ 0x7777, 1.0);
            let q = QuantizedMatrix::bf16(MatRef::row_major(&b, k, n));
            // the same panels from a transposed copy (contiguous columns) and from a view
            // with neither rows nor columns contiguous
            let bt: Vec<f32> = (0..n * k).map(|t| b[(t % k) * n + t / k]).collect();
            let by_cols = QuantizedMatrix::bf16(MatRef::row_major(&bt, n, k).t());
            let mut wide = vec![f32::NAN; 2 * k * n];
            for (t, &x) in b.iter().enumerate() {
                wide[2 * t] = x;
            }
            let strided = QuantizedMatrix::bf16(MatRef::new(&wide, k, n, 2 * n, 2));
            prop_assert_eq!(q.pairs(), by_cols.pairs());
            prop_assert_eq!(q.pairs(), strided.pairs());
            let round = |x: f32| f64::from(half::bf16::from_f32(x).to_f32());
            for act in [Activation::Identity, Activation::Gelu] {
                let ep = Epilogue { bias: Some(&bias), accumulate: false, activation: act };
                let mut c = vec![f32::NAN; m * n];
                qgemm_with(isa, MatRef::row_major(&a, m, k), &q, &mut c, ep);
                // `a` read through a transposed copy (contiguous columns): the same sums
                let at: Vec<f32> = (0..m * k).map(|t| a[(t % m) * k + t / m]).collect();
                let mut c_cols = vec![f32::NAN; m * n];
                qgemm_with(isa, MatRef::row_major(&at, k, m).t(), &q, &mut c_cols, ep);
                prop_assert_eq!(&c, &c_cols);
                for i in 0..m {
                    for j in 0..n {
                        let terms = (0..k).map(|p| round(a[i * k + p]) * round(b[p * n + j]));
                        let exact: f64 = terms.clone().sum::<f64>();
                        let magnitude: f64 = terms.map(f64::abs).sum();
                        // and the bias's own f32 addition
                        let bound = k as f64 * f64::from(f32::EPSILON) * magnitude
                            + (exact.abs() + f64::from(bias[j].abs())) * f64::from(f32::EPSILON)
                            + 1e-6;
                        let sum = f64::from(c[i * n + j]);
                        let got = match act {
                            Activation::Identity => sum - f64::from(bias[j]),
                            Activation::Gelu => sum,
                        };
                        let want = match act {
                            Activation::Identity => exact,
                            Activation::Gelu => f64::from(crate::cpu::elementwise::gelu_scalar(
                                (exact + f64::from(bias[j])) as f32,
                            )),
                        };
                        let bound = if act == Activation::Gelu { 1.13 * bound + 1e-5 } else { bound };
                        prop_assert!(
                            (got - want).abs() <= bound,
                            "{act:?} ({i}, {j}): {got} vs {want}, bound {bound}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn int8_and_bf16_kernels_refuse_each_others_matrices() {
        let b = matrix(8, 8, 1, 1.0);
        let bf = QuantizedMatrix::bf16(MatRef::row_major(&b, 8, 8));
        let i8m = QuantizedMatrix::new(MatRef::row_major(&b, 8, 8));
        let a = matrix(2, 8, 2, 1.0);
        let mut c = vec![0f32; 16];
        let run = |isa: Isa, q: &QuantizedMatrix, c: &mut [f32]| {
            let a = MatRef::row_major(&a, 2, 8);
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                qgemm_with(isa, a, q, c, Epilogue::default())
            }))
            .is_err()
        };
        for isa in Isa::available() {
            assert!(run(isa, &bf, &mut c), "{} took a bf16 matrix", isa.name());
        }
        if let Some(isa) = Isa::bf16() {
            assert!(run(isa, &i8m, &mut c), "bf16 took an int8 matrix");
        }
    }
}
