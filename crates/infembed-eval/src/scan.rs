//! Exact search at corpus scale: the dot products of a batch of queries with an index's rows,
//! computed chunk by chunk over the corpus, each query keeping a running top-k. No
//! `[queries x corpus]` matrix exists at any time: memory holds the index (mapped or read), one
//! packed chunk of rows, one block of scores per query tile, and `O(k)` candidates per query.
//!
//! # The product
//! Every score is the same number whatever the batch, the chunk or the code path: the dot
//! product of query `q` and row `r` is the fused multiply-add chain
//! `s = fma(q[d-1], r[d-1], ... fma(q[1], r[1], fma(q[0], r[0], 0.0)))`, in dimension order. The
//! AVX-512 and AVX2 micro-kernels compute each score in one lane of an accumulator, so they
//! produce that chain exactly, and the portable path spells it with [`f32::mul_add`]. A query
//! searched alone therefore gets the scores, and the hits, that it gets in a batch of 1,000, and
//! the unit tests compare every path with the naive chain bit for bit.
//!
//! # Layout (Goto/BLIS-style packing, built once per call and once per chunk)
//! - queries in tiles of [`MR`], dimension-major (`tile[k][r]`), zero rows past the end;
//! - each chunk of rows in panels of [`NR`], dimension-major (`panel[k][j]`), converted from the
//!   stored type (f32 or f16) and checked finite while packing;
//! - the micro-kernel keeps an `MR x NR` tile of scores in 24 AVX-512 registers (two 16-lane
//!   vectors per query row), or in four passes of `6 x 16` under AVX2.
//!
//! # Top-k
//! Each query keeps candidates whose score is at least its current threshold (the `k`-th best
//! score so far); when the candidates reach `2k` they are cut back to the `k` best under the tie
//! rule ([`crate::top_k`]) and the threshold rises. Candidates equal to the threshold are kept,
//! so ties are decided by the tie rule on the ids, exactly as a full sort would.

use infembed_metrics::TieBreak;
use pulp::as_arrays;
#[cfg(target_arch = "x86_64")]
use pulp::x86::{V3, V4};
use rayon::prelude::*;

use crate::topk::top_k;

/// Queries per tile.
pub(crate) const MR: usize = 12;
/// Rows per panel.
pub(crate) const NR: usize = 32;
/// Bytes of packed rows one task reads per chunk: they stay in its core's L2 cache (512 KiB
/// or more on the processors this runs on) while every query tile passes over them.
const PANEL_BYTES: usize = 1 << 19;
/// Bytes of scores one task writes per chunk (a query tile over its group of panels), which
/// bounds a group's length for small dimensions.
const SCORE_BYTES: usize = 1 << 18;

/// The instruction set a scan runs with.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Isa {
    /// AVX-512F (x86-64-v4).
    #[cfg(target_arch = "x86_64")]
    V4(V4),
    /// AVX2 + FMA (x86-64-v3).
    #[cfg(target_arch = "x86_64")]
    V3(V3),
    /// Scalar [`f32::mul_add`].
    Portable,
}

impl Isa {
    /// The best instruction set this processor has.
    pub(crate) fn detect() -> Self {
        #[cfg(target_arch = "x86_64")]
        {
            if let Some(simd) = V4::try_new() {
                return Self::V4(simd);
            }
            if let Some(simd) = V3::try_new() {
                return Self::V3(simd);
            }
        }
        Self::Portable
    }

    /// Every instruction set this processor can run, best first (for tests and benchmarks).
    #[cfg(test)]
    pub(crate) fn all() -> Vec<Self> {
        #[allow(unused_mut)]
        let mut out = Vec::new();
        #[cfg(target_arch = "x86_64")]
        {
            if let Some(simd) = V4::try_new() {
                out.push(Self::V4(simd));
            }
            if let Some(simd) = V3::try_new() {
                out.push(Self::V3(simd));
            }
        }
        out.push(Self::Portable);
        out
    }

    /// A short name for logs and benchmark records: `avx512`, `avx2` or `portable`.
    pub(crate) fn name(self) -> &'static str {
        match self {
            #[cfg(target_arch = "x86_64")]
            Self::V4(_) => "avx512",
            #[cfg(target_arch = "x86_64")]
            Self::V3(_) => "avx2",
            Self::Portable => "portable",
        }
    }
}

/// A run of stored rows, as f32 or f16 values (row-major, `dim` per row).
#[derive(Clone, Copy, Debug)]
pub(crate) enum Block<'a> {
    /// `f32` values.
    F32(&'a [f32]),
    /// IEEE half-precision values.
    F16(&'a [half::f16]),
}

impl Block<'_> {
    /// Number of values.
    pub(crate) fn len(&self) -> usize {
        match self {
            Block::F32(v) => v.len(),
            Block::F16(v) => v.len(),
        }
    }

    /// Values `a..b` as `f32` into `out` (`b - a` long).
    pub(crate) fn copy_to_f32(&self, a: usize, b: usize, out: &mut [f32]) {
        use half::slice::HalfFloatSliceExt;
        match self {
            Block::F32(v) => out.copy_from_slice(&v[a..b]),
            Block::F16(v) => v[a..b].convert_to_f32_slice(out),
        }
    }
}

/// Queries packed into tiles of [`MR`], dimension-major: tile `t` is
/// `packed[t * dim * MR..(t + 1) * dim * MR]`, element `(k, r)` at `k * MR + r`.
pub(crate) fn pack_queries(queries: &[f32], dim: usize) -> Vec<f32> {
    let m = queries.len() / dim;
    let tiles = m.div_ceil(MR);
    let mut packed = vec![0f32; tiles * dim * MR];
    for (i, q) in queries.chunks_exact(dim).enumerate() {
        let tile = &mut packed[(i / MR) * dim * MR..(i / MR + 1) * dim * MR];
        for (k, &v) in q.iter().enumerate() {
            tile[k * MR + i % MR] = v;
        }
    }
    packed
}

/// Packs the `rows` rows of `block` into panels of [`NR`] (zero columns past the end) in `out`
/// (`rows.div_ceil(NR) * dim * NR` long), converting to `f32`.
///
/// # Errors
/// The index (in `block`) of the first row holding a non-finite value.
fn pack_rows(block: Block<'_>, dim: usize, rows: usize, out: &mut [f32]) -> Result<(), usize> {
    // Every panel is packed; the smallest bad row is reported, whichever thread finds it.
    let bad = out
        .par_chunks_mut(dim * NR)
        .enumerate()
        .map_init(Vec::new, |wide: &mut Vec<f32>, (p, panel)| {
            let first = p * NR;
            let height = NR.min(rows - first);
            // The panel's rows as f32, row-major (borrowed when stored so).
            let values: &[f32] = match block {
                Block::F32(v) => &v[first * dim..(first + height) * dim],
                Block::F16(_) => {
                    wide.resize(height * dim, 0.0);
                    block.copy_to_f32(first * dim, (first + height) * dim, wide);
                    wide
                }
            };
            if !values.iter().fold(true, |ok, v| ok & v.is_finite()) {
                let bad = values.iter().position(|v| !v.is_finite()).unwrap_or(0);
                return Err(first + bad / dim);
            }
            // Transpose: row j of the chunk becomes column j of the panel's lines.
            let (lines, _) = pulp::as_arrays_mut::<NR, f32>(panel);
            for (j, row) in values.chunks_exact(dim).enumerate() {
                for (line, &v) in lines.iter_mut().zip(row) {
                    line[j] = v;
                }
            }
            if height < NR {
                for line in lines.iter_mut() {
                    line[height..].fill(0.0);
                }
            }
            Ok(())
        })
        .filter_map(std::result::Result::err)
        .min();
    bad.map_or(Ok(()), Err)
}

/// Depth of one pass of the micro-kernel: a query tile's slice (`KC x MR`, 6 KiB) and a panel's
/// (`KC x NR`, 16 KiB) stay in a 32 KiB L1 cache together. The accumulators carry over between
/// passes, so the chain over all dimensions is unchanged.
const KC: usize = 128;

/// A tile of scores.
type Tile = [[f32; NR]; MR];

/// `acc` advanced over a query tile and a row panel (both dimension-major, equally deep):
/// `acc[r][j] = fma(q[k][r], p[k][j], acc[r][j])` for each `k` in order, from zeros when
/// `fresh`.
#[inline(always)]
fn micro(isa: Isa, q: &[[f32; MR]], r: &[[f32; NR]], acc: &mut Tile, fresh: bool) {
    match isa {
        #[cfg(target_arch = "x86_64")]
        Isa::V4(simd) => {
            struct Op<'a>(V4, &'a [[f32; MR]], &'a [[f32; NR]], &'a mut Tile, bool);
            impl pulp::NullaryFnOnce for Op<'_> {
                type Output = ();
                #[inline(always)]
                fn call(self) {
                    micro_v4(self.0, self.1, self.2, self.3, self.4)
                }
            }
            simd.vectorize(Op(simd, q, r, acc, fresh))
        }
        #[cfg(target_arch = "x86_64")]
        Isa::V3(simd) => {
            struct Op<'a>(V3, &'a [[f32; MR]], &'a [[f32; NR]], &'a mut Tile, bool);
            impl pulp::NullaryFnOnce for Op<'_> {
                type Output = ();
                #[inline(always)]
                fn call(self) {
                    micro_v3(self.0, self.1, self.2, self.3, self.4)
                }
            }
            simd.vectorize(Op(simd, q, r, acc, fresh))
        }
        Isa::Portable => {
            if fresh {
                *acc = [[0.0; NR]; MR];
            }
            micro_portable(q, r, acc)
        }
    }
}

/// AVX-512: 12 rows x 2 vectors of 16 lanes, one broadcast per query value.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn micro_v4(simd: V4, q: &[[f32; MR]], r: &[[f32; NR]], out: &mut Tile, fresh: bool) {
    let mut acc: [[pulp::f32x16; 2]; MR] = if fresh {
        [[simd.splat_f32x16(0.0); 2]; MR]
    } else {
        pulp::cast(*out)
    };
    for (qk, rk) in q.iter().zip(r) {
        let [r0, r1]: [pulp::f32x16; 2] = pulp::cast(*rk);
        for (row, &qv) in acc.iter_mut().zip(qk) {
            let qv = simd.splat_f32x16(qv);
            row[0] = simd.mul_add_f32x16(qv, r0, row[0]);
            row[1] = simd.mul_add_f32x16(qv, r1, row[1]);
        }
    }
    *out = pulp::cast(acc);
}

/// AVX2: the tile in four passes of 6 rows x 2 vectors of 8 lanes (12 of the 16 registers).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn micro_v3(simd: V3, q: &[[f32; MR]], r: &[[f32; NR]], out: &mut Tile, fresh: bool) {
    const H: usize = MR / 2;
    for rows in 0..2 {
        for cols in 0..2 {
            let mut acc = [[simd.splat_f32x8(0.0); 2]; H];
            if !fresh {
                for (a, o) in acc.iter_mut().zip(&out[rows * H..rows * H + H]) {
                    let o: [f32; 16] = o[cols * 16..cols * 16 + 16].try_into().expect("16 lanes");
                    *a = pulp::cast(o);
                }
            }
            for (qk, rk) in q.iter().zip(r) {
                let [r0, r1]: [pulp::f32x8; 2] = pulp::cast(
                    <[f32; 16]>::try_from(&rk[cols * 16..cols * 16 + 16]).expect("16 lanes"),
                );
                for (row, &qv) in acc.iter_mut().zip(&qk[rows * H..rows * H + H]) {
                    let qv = simd.splat_f32x8(qv);
                    row[0] = simd.mul_add_f32x8(qv, r0, row[0]);
                    row[1] = simd.mul_add_f32x8(qv, r1, row[1]);
                }
            }
            let acc: [[f32; 16]; H] = pulp::cast(acc);
            for (o, a) in out[rows * H..rows * H + H].iter_mut().zip(acc) {
                o[cols * 16..cols * 16 + 16].copy_from_slice(&a);
            }
        }
    }
}

/// The same chain with [`f32::mul_add`], one element at a time.
#[inline(always)]
fn micro_portable(q: &[[f32; MR]], r: &[[f32; NR]], acc: &mut Tile) {
    for (qk, rk) in q.iter().zip(r) {
        for (row, &qv) in acc.iter_mut().zip(qk) {
            for (x, &rv) in row.iter_mut().zip(rk) {
                *x = qv.mul_add(rv, *x);
            }
        }
    }
}

/// One query's running top-k.
#[derive(Debug, Clone)]
pub(crate) struct Running {
    /// `(row, score)` pairs at least as good as `threshold`.
    candidates: Vec<(usize, f64)>,
    /// The `k`-th best score once `k` candidates were seen; `-inf` before.
    threshold: f32,
}

impl Running {
    pub(crate) fn new() -> Self {
        Self {
            candidates: Vec::new(),
            threshold: f32::NEG_INFINITY,
        }
    }

    /// Offers the scores of rows `base..base + scores.len()`.
    #[inline(always)]
    pub(crate) fn offer(
        &mut self,
        base: usize,
        scores: &[f32],
        k: usize,
        ids: &[String],
        tie: TieBreak,
    ) {
        const LANES: usize = 16;
        let (blocks, rest) = as_arrays::<LANES, f32>(scores);
        for (c, block) in blocks.iter().enumerate() {
            // Most blocks hold no candidate once the threshold has risen: one branch-free test
            // per block (vectorized), the scalar loop only where something passes.
            let threshold = self.threshold;
            if block.iter().fold(false, |any, &s| any | (s >= threshold)) {
                self.offer_each(base + c * LANES, block, k, ids, tie);
            }
        }
        if !rest.is_empty() {
            self.offer_each(base + blocks.len() * LANES, rest, k, ids, tie);
        }
    }

    /// [`Running::offer`] one score at a time.
    #[inline(never)]
    fn offer_each(&mut self, base: usize, scores: &[f32], k: usize, ids: &[String], tie: TieBreak) {
        for (j, &s) in scores.iter().enumerate() {
            if s >= self.threshold {
                self.candidates.push((base + j, f64::from(s)));
                if self.candidates.len() >= 2 * k {
                    self.shrink(k, ids, tie);
                }
            }
        }
    }

    /// Cuts the candidates back to the `k` best (unordered) and raises the threshold to the
    /// `k`-th best score.
    fn shrink(&mut self, k: usize, ids: &[String], tie: TieBreak) {
        let cmp = |a: &(usize, f64), b: &(usize, f64)| {
            tie.compare(tie.key(a.1), &ids[a.0], tie.key(b.1), &ids[b.0])
        };
        self.candidates.select_nth_unstable_by(k - 1, cmp);
        self.candidates.truncate(k);
        self.threshold = self.candidates[k - 1].1 as f32;
    }

    /// The best `k`, best first.
    pub(crate) fn finish(self, k: usize, ids: &[String], tie: TieBreak) -> Vec<(usize, f64)> {
        top_k(self.candidates, ids, k, tie)
    }
}

/// What a scan hands back per chunk of rows: a non-finite stored value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct NonFinite {
    /// The row holding it.
    pub(crate) row: usize,
}

/// Rows in chunks: `chunk(a, b)` gives the stored values of rows `a..b`.
pub(crate) trait RowSource: Sync {
    /// Number of rows.
    fn rows(&self) -> usize;
    /// The values of rows `a..b`, row-major.
    fn chunk(&self, a: usize, b: usize) -> Block<'_>;
}

/// How `m` queries split a scan among the threads: `(groups, panels per group)`. With at
/// least as many query tiles as threads, each task takes a tile over the whole chunk (one
/// group); with fewer, each tile's chunk is split into groups of panels computed in parallel.
/// A group's packed rows fill [`PANEL_BYTES`] (its scores at most [`SCORE_BYTES`]); a chunk is
/// `groups * per_group` panels.
fn split(m: usize, dim: usize) -> (usize, usize) {
    let tiles = m.div_ceil(MR).max(1);
    let threads = rayon::current_num_threads().max(1);
    let groups = if tiles >= threads {
        1
    } else {
        (2 * threads).div_ceil(tiles)
    };
    let per_group = (PANEL_BYTES / (dim * NR * 4)).clamp(1, SCORE_BYTES / (MR * NR * 4));
    (groups, per_group)
}

/// Rows per chunk (a multiple of [`NR`]) for `m` queries of dimension `dim`.
#[cfg(test)]
fn chunk_rows(m: usize, dim: usize) -> usize {
    let (groups, per_group) = split(m, dim);
    groups * per_group * NR
}

/// Calls `visit(&mut states[i], base, scores)` with the scores of query `i` against every row,
/// chunk by chunk (`scores` holds rows `base..base + scores.len()`); queries are `dim`-long rows
/// of `queries`, one state each. Each query sees its scores in row order.
///
/// # Errors
/// [`NonFinite`] at the first stored row holding a NaN or an infinity.
pub(crate) fn scan<S: Send>(
    isa: Isa,
    source: &impl RowSource,
    dim: usize,
    queries: &[f32],
    states: &mut [S],
    visit: &(impl Fn(&mut S, usize, &[f32]) + Sync),
) -> Result<(), NonFinite> {
    let m = queries.len() / dim;
    assert_eq!(states.len(), m, "one state per query");
    let n = source.rows();
    if m == 0 || n == 0 {
        return Ok(());
    }
    let packed_q = pack_queries(queries, dim);
    let tiles = m.div_ceil(MR);
    // With fewer tiles than threads, each tile's chunk is split into groups of panels computed
    // in parallel, then visited in order; otherwise each tile is computed and visited by one
    // task while its scores are still in cache.
    let (groups, per_group) = split(m, dim);
    let per_group = per_group.min(n.div_ceil(NR).div_ceil(groups));
    let chunk = groups * per_group * NR;
    // Two packed chunks: the next one is packed while the current one is searched.
    let mut packed = [
        vec![0f32; chunk / NR * dim * NR],
        vec![0f32; chunk / NR * dim * NR],
    ];
    let mut scores: Vec<Tile> = vec![[[0.0; NR]; MR]; tiles * groups * per_group];
    let pack = |base: usize, out: &mut [f32]| -> Result<(), NonFinite> {
        let rows = chunk.min(n - base);
        let block = source.chunk(base, base + rows);
        pack_rows(block, dim, rows, &mut out[..rows.div_ceil(NR) * dim * NR])
            .map_err(|r| NonFinite { row: base + r })
    };
    pack(0, &mut packed[0])?;
    for (c, base) in (0..n).step_by(chunk).enumerate() {
        let rows = chunk.min(n - base);
        let panels = rows.div_ceil(NR);
        let [even, odd] = &mut packed;
        let (current, next) = if c % 2 == 0 { (even, odd) } else { (odd, even) };
        let job = Chunk {
            isa,
            dim,
            packed_q: &packed_q,
            packed_r: &current[..panels * dim * NR],
            rows,
            panels,
            per_group,
        };
        let search = || {
            if groups == 1 {
                scores
                    .par_chunks_mut(per_group)
                    .zip(states.par_chunks_mut(MR))
                    .enumerate()
                    .for_each(|(t, (acc, tile_states))| {
                        job.compute(t, 0, acc);
                        job.visit(0, base, acc, tile_states, visit);
                    });
            } else {
                scores
                    .par_chunks_mut(per_group)
                    .enumerate()
                    .filter(|(item, _)| (item % groups) * per_group < panels)
                    .for_each(|(item, acc)| job.compute(item / groups, item % groups, acc));
                let scores = &scores;
                states
                    .par_chunks_mut(MR)
                    .enumerate()
                    .for_each(|(t, tile_states)| {
                        for g in 0..groups {
                            let acc = &scores[(t * groups + g) * per_group..][..per_group];
                            job.visit(g, base, acc, tile_states, visit);
                        }
                    });
            }
        };
        let following = base + chunk;
        let ((), packed_next) = rayon::join(search, || {
            if following < n {
                pack(following, next)
            } else {
                Ok(())
            }
        });
        packed_next?;
    }
    Ok(())
}

/// One chunk of packed rows and the packed queries.
struct Chunk<'a> {
    isa: Isa,
    dim: usize,
    packed_q: &'a [f32],
    packed_r: &'a [f32],
    /// Rows in this chunk.
    rows: usize,
    /// Panels in this chunk.
    panels: usize,
    /// Panels per group.
    per_group: usize,
}

impl Chunk<'_> {
    /// The panels of group `g`.
    fn panels_of(&self, g: usize) -> std::ops::Range<usize> {
        let p0 = (g * self.per_group).min(self.panels);
        p0..(p0 + self.per_group).min(self.panels)
    }

    /// Tile `t`'s scores over group `g`'s panels into `acc`, one [`Tile`] per panel: [`KC`]
    /// dimensions at a time over all the group's panels, so that the tile's slice stays in L1
    /// (the accumulators carry over between passes).
    fn compute(&self, t: usize, g: usize, acc: &mut [Tile]) {
        let (dim, panels) = (self.dim, self.panels_of(g));
        let acc = &mut acc[..panels.len()];
        let q = &self.packed_q[t * dim * MR..(t + 1) * dim * MR];
        let (q, _) = as_arrays::<MR, f32>(q);
        for k0 in (0..dim).step_by(KC) {
            let k1 = (k0 + KC).min(dim);
            for (tile, p) in acc.iter_mut().zip(panels.clone()) {
                let r = &self.packed_r[p * dim * NR..(p + 1) * dim * NR];
                let (r, _) = as_arrays::<NR, f32>(r);
                micro(self.isa, &q[k0..k1], &r[k0..k1], tile, k0 == 0);
            }
        }
    }

    /// Hands each query of a tile its scores over group `g` (computed into `acc`), panel by
    /// panel in row order.
    fn visit<S>(
        &self,
        g: usize,
        base: usize,
        acc: &[Tile],
        tile_states: &mut [S],
        visit: &impl Fn(&mut S, usize, &[f32]),
    ) {
        let panels = self.panels_of(g);
        for (i, state) in tile_states.iter_mut().enumerate() {
            for (tile, p) in acc.iter().zip(panels.clone()) {
                let valid = NR.min(self.rows - p * NR);
                visit(state, base + p * NR, &tile[i][..valid]);
            }
        }
    }
}

/// The `k` best rows for each query (`dim`-long rows of `queries`), best first under `tie` on
/// `ids`: `(row, score)` pairs.
///
/// # Errors
/// [`NonFinite`] as [`scan`].
pub(crate) fn search(
    isa: Isa,
    source: &impl RowSource,
    ids: &[String],
    dim: usize,
    queries: &[f32],
    k: usize,
    tie: TieBreak,
) -> Result<Vec<Vec<(usize, f64)>>, NonFinite> {
    let m = queries.len() / dim;
    // More than the corpus is the corpus (and keeps `2 * k` far from overflow).
    let k = k.min(source.rows());
    let mut states = vec![Running::new(); m];
    if k > 0 {
        scan(isa, source, dim, queries, &mut states, &|state, base, s| {
            state.offer(base, s, k, ids, tie)
        })?;
    }
    Ok(states
        .into_iter()
        .map(|state| state.finish(k, ids, tie))
        .collect())
}

/// Every row's score for each query: `m` vectors of `n` scores.
///
/// # Errors
/// [`NonFinite`] as [`scan`].
pub(crate) fn all_scores(
    isa: Isa,
    source: &impl RowSource,
    dim: usize,
    queries: &[f32],
) -> Result<Vec<Vec<f32>>, NonFinite> {
    let n = source.rows();
    let mut out = vec![vec![0f32; n]; queries.len() / dim];
    scan(isa, source, dim, queries, &mut out, &|row, base, s| {
        row[base..base + s.len()].copy_from_slice(s)
    })?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    struct Rows(Vec<f32>, usize);

    impl RowSource for Rows {
        fn rows(&self) -> usize {
            self.0.len() / self.1
        }
        fn chunk(&self, a: usize, b: usize) -> Block<'_> {
            Block::F32(&self.0[a * self.1..b * self.1])
        }
    }

    /// The defining chain, one pair at a time.
    fn chain(q: &[f32], r: &[f32]) -> f32 {
        q.iter().zip(r).fold(0.0, |acc, (&a, &b)| a.mul_add(b, acc))
    }

    /// Query `i`'s naive `(row, score)` against every row of `r` (both `dim` wide), each score
    /// [`chain`]ed in dimension order.
    fn naive_entries(q: &[f32], r: &[f32], dim: usize, i: usize) -> Vec<(usize, f64)> {
        r.chunks_exact(dim)
            .enumerate()
            .map(|(j, row)| (j, f64::from(chain(&q[i * dim..(i + 1) * dim], row))))
            .collect()
    }

    fn values(len: usize, seed: u64) -> Vec<f32> {
        let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
        (0..len)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                ((x >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
            })
            .collect()
    }

    #[test]
    fn every_path_computes_the_fma_chain_bit_for_bit() {
        // The last two span several chunks (of a few thousand rows), with one tile split into
        // panel groups and with tiles in parallel.
        for (m, n, dim) in [
            (1, 1, 1),
            (3, 70, 5),
            (13, 33, 384),
            (25, 200, 17),
            (1, 5000, 8),
            (1, 23_000, 2),
            (37, 12_001, 3),
        ] {
            let q = values(m * dim, 1);
            let r = values(n * dim, 2);
            let rows = Rows(r.clone(), dim);
            for isa in Isa::all() {
                let got = all_scores(isa, &rows, dim, &q).unwrap();
                for i in 0..m {
                    for j in 0..n {
                        let want = chain(&q[i * dim..(i + 1) * dim], &r[j * dim..(j + 1) * dim]);
                        assert_eq!(
                            got[i][j].to_bits(),
                            want.to_bits(),
                            "{} m={m} n={n} dim={dim} ({i}, {j})",
                            isa.name()
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn top_k_over_several_chunks_is_the_head_of_the_full_ranking() {
        let (m, n, dim, k) = (30, 20_000, 2, 7);
        let q = values(m * dim, 5);
        // Coarse values: many ties across chunk boundaries.
        let r: Vec<f32> = values(n * dim, 6)
            .iter()
            .map(|v| (v * 4.0).round())
            .collect();
        let ids: Vec<String> = (0..n).map(|i| format!("d{:05}", (i * 7919) % n)).collect();
        assert!(chunk_rows(m, dim) < n, "the test must span chunks");
        let got = search(
            Isa::detect(),
            &Rows(r.clone(), dim),
            &ids,
            dim,
            &q,
            k,
            TieBreak::DocIdDescending,
        )
        .unwrap();
        assert_eq!(got.len(), m);
        for (i, hits) in got.iter().enumerate() {
            let entries = naive_entries(&q, &r, dim, i);
            assert_eq!(
                *hits,
                top_k(entries, &ids, k, TieBreak::DocIdDescending),
                "query {i}"
            );
        }
    }

    #[test]
    fn the_first_non_finite_row_is_named() {
        // Bad rows in three panels of one chunk: the first is named, whichever thread saw it.
        let mut r = values(200 * 4, 3);
        r[170 * 4 + 2] = f32::NAN;
        r[37 * 4] = f32::INFINITY;
        r[90 * 4 + 3] = f32::NAN;
        let ids: Vec<String> = (0..200).map(|i| format!("d{i}")).collect();
        for m in [1, 30] {
            let err = search(
                Isa::detect(),
                &Rows(r.clone(), 4),
                &ids,
                4,
                &values(m * 4, 4),
                3,
                TieBreak::DocIdDescending,
            )
            .unwrap_err();
            assert_eq!(err, NonFinite { row: 37 }, "{m} queries");
        }
    }

    #[test]
    fn a_k_beyond_the_corpus_returns_the_whole_ranking() {
        let (n, dim) = (50, 3);
        let q = values(2 * dim, 1);
        let r = values(n * dim, 2);
        let ids: Vec<String> = (0..n).map(|i| format!("d{i}")).collect();
        let tie = TieBreak::DocIdDescending;
        let got = search(
            Isa::detect(),
            &Rows(r.clone(), dim),
            &ids,
            dim,
            &q,
            usize::MAX,
            tie,
        )
        .unwrap();
        for (i, hits) in got.iter().enumerate() {
            let entries = naive_entries(&q, &r, dim, i);
            assert_eq!(*hits, top_k(entries, &ids, n, tie));
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]

        /// The running top-k keeps exactly the head of a full sort under the tie rule, scores
        /// coarsened so that ties are common; a query alone gets what it gets in the batch.
        #[test]
        fn running_top_k_is_the_head_of_the_full_ranking(
            m in 1usize..30, n in 0usize..400, dim in 1usize..12, k in 0usize..40,
            seed in 0u64..1000,
        ) {
            let q: Vec<f32> = values(m * dim, seed).iter().map(|v| (v * 2.0).round()).collect();
            let r: Vec<f32> = values(n * dim, seed + 1).iter().map(|v| (v * 2.0).round()).collect();
            let ids: Vec<String> = (0..n).map(|i| format!("d{:03}", (i * 7919) % 1000)).collect();
            let rows = Rows(r.clone(), dim);
            let tie = TieBreak::DocIdDescending;
            let got = search(Isa::detect(), &rows, &ids, dim, &q, k, tie).unwrap();
            for i in 0..m {
                let entries = naive_entries(&q, &r, dim, i);
                let want = top_k(entries, &ids, k, tie);
                prop_assert_eq!(&got[i], &want);
                let alone = search(Isa::Portable, &rows, &ids, dim, &q[i * dim..(i + 1) * dim], k, tie)
                    .unwrap();
                prop_assert_eq!(&alone[0], &want);
            }
        }
    }
}
