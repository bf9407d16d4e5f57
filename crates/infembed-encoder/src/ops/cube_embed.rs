//! An embedding table's lookup on an autodiff graph of cubecl tensors (`wgpu`, `vulkan`,
//! `cuda`; not a `fusion` build), with a backward step that sums the gradient rows of each
//! token id in parallel.
//!
//! burn's embedding backward scatters the `[T, d]` gradient into a zeroed `[V, d]` table
//! with `select_assign`, which on the cubecl backends runs one unit per feature column, each
//! walking all `T` rows one after the other: `d` units (384 for all-MiniLM-L6-v2) on a
//! device that keeps a hundred thousand threads busy. On an NVIDIA H200 each such launch took
//! 0.42 ms, 10% of a training step's device time (2026-11-28; docs/benchmarks.md).
//!
//! The ids are known on the host when the batch is made ([`super::Lookup`]), so the host
//! groups the rows by id (a stable sort, rows in ascending order within an id) and cuts each
//! id's rows into chunks of at most [`CHUNK`]. One unit per (chunk, column) sums its chunk in
//! the order burn's scatter adds. When every id fits in one chunk, that launch writes the
//! table rows directly (the same `f32` sums as burn's, to the bit); when some id has more rows
//! (the token-type table, whose one or two ids take every row), it writes f32 partial sums
//! and a second launch adds each id's chunk sums in order. Either way the result does not
//! depend on scheduling (no atomics).

use std::sync::Arc;

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::NoCheckpointing;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, unary};
use burn::backend::{Autodiff, Cube};
use burn::prelude::*;
use burn::tensor::{DType, TensorData};
use cubecl::CubeDim;
use cubecl::ir::ElemType;

use super::cube_kit::{cube_count, finish, plain, primitive};
use super::cube_rows::{int_elem, take_rows};
use super::routed::{CubeTensor, float_kind};

/// Units of a cube.
const UNITS: usize = 256;
/// The most rows of one id that one unit sums for a column.
pub(super) const CHUNK: usize = 64;

mod kernel {
    use cubecl::prelude::*;

    use crate::ops::cube_kit::kernel::flat_unit;

    /// Unit `(k, c)` sums `g[order[e], c]` over the entries `e` of chunk `k`
    /// (`plan[starts + k] .. plan[starts + k + 1]`; `order` is `plan[0..]`) in f32, and writes
    /// the sum to `out[plan[targets + k], c]` (`direct`: each chunk is a whole id, and the
    /// target its table row) or to `out[k, c]` (the chunk's partial sum).
    #[allow(clippy::too_many_arguments)]
    #[cube(launch)]
    pub(super) fn chunk_sums<F: Float, O: Float, I: Int>(
        g: &Tensor<F>,
        plan: &Tensor<I>,
        out: &mut Tensor<O>,
        chunks: usize,
        starts: usize,
        targets: usize,
        #[comptime] direct: bool,
        #[comptime] units: usize,
        #[define(F)] _grad_dtype: ElemType,
        #[define(O)] _table_dtype: ElemType,
        #[define(I)] _index_dtype: ElemType,
    ) {
        let d = g.shape(1);
        let i = flat_unit(units);
        if i < chunks * d {
            let (k, c) = (i / d, i % d);
            let from = usize::cast_from(plan[starts + k]);
            let to = usize::cast_from(plan[starts + k + 1]);
            let mut sum = 0.0f32;
            for e in from..to {
                let row = usize::cast_from(plan[e]);
                sum += f32::cast_from(g[row * g.stride(0) + c * g.stride(1)]);
            }
            let row = if direct {
                usize::cast_from(plan[targets + k])
            } else {
                k
            };
            let at = row * out.stride(0) + c * out.stride(1);
            out[at] = O::cast_from(sum);
        }
    }

    /// Unit `(u, c)` adds the partial sums `partial[k, c]` of id `u`'s chunks
    /// (`plan[firsts + u] .. plan[firsts + u + 1]`) in order and writes the total to
    /// `out[plan[targets + u], c]`.
    #[allow(clippy::too_many_arguments)]
    #[cube(launch)]
    pub(super) fn id_sums<O: Float, I: Int>(
        partial: &Tensor<f32>,
        plan: &Tensor<I>,
        out: &mut Tensor<O>,
        ids: usize,
        firsts: usize,
        targets: usize,
        #[comptime] units: usize,
        #[define(O)] _table_dtype: ElemType,
        #[define(I)] _index_dtype: ElemType,
    ) {
        let d = partial.shape(1);
        let i = flat_unit(units);
        if i < ids * d {
            let (u, c) = (i / d, i % d);
            let from = usize::cast_from(plan[firsts + u]);
            let to = usize::cast_from(plan[firsts + u + 1]);
            let mut sum = 0.0f32;
            for k in from..to {
                sum += partial[k * partial.stride(0) + c * partial.stride(1)];
            }
            let row = usize::cast_from(plan[targets + u]);
            let at = row * out.stride(0) + c * out.stride(1);
            out[at] = O::cast_from(sum);
        }
    }
}

/// How the rows of a `[T, d]` gradient add up into the rows of its table, as one integer
/// list: `order` (the `T` rows, grouped by id, ascending within an id), the `chunks + 1`
/// chunk bounds into `order`, the `ids + 1` chunk bounds of each id, and each id's table row.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Plan {
    /// The list.
    pub(super) values: Vec<i64>,
    /// Chunks (`ids` when each id is one chunk).
    pub(super) chunks: usize,
    /// Distinct ids.
    pub(super) ids: usize,
}

impl Plan {
    /// Where the chunk bounds start in [`Self::values`].
    pub(super) fn starts(&self, t: usize) -> usize {
        t
    }

    /// Where the ids' chunk bounds start.
    pub(super) fn firsts(&self, t: usize) -> usize {
        t + self.chunks + 1
    }

    /// Where the ids' table rows start.
    pub(super) fn targets(&self, t: usize) -> usize {
        self.firsts(t) + self.ids + 1
    }

    /// The plan of the ids `ids` (row `r` reads table row `ids[r]`), chunks of at most `chunk`
    /// rows.
    pub(super) fn new(ids: &[u32], chunk: usize) -> Self {
        let t = ids.len();
        let mut order: Vec<usize> = (0..t).collect();
        order.sort_by_key(|&r| ids[r]); // stable: ascending rows within an id
        let (mut starts, mut firsts, mut targets) = (vec![0usize], vec![0usize], Vec::new());
        let mut e = 0;
        while e < t {
            let id = ids[order[e]];
            let mut end = e;
            while end < t && ids[order[end]] == id {
                end += 1;
            }
            let mut from = e;
            while from < end {
                from = (from + chunk.max(1)).min(end);
                starts.push(from);
            }
            firsts.push(starts.len() - 1);
            targets.push(id as usize);
            e = end;
        }
        let (chunks, distinct) = (starts.len() - 1, targets.len());
        let values = order
            .into_iter()
            .chain(starts)
            .chain(firsts)
            .chain(targets)
            .map(|v| v as i64)
            .collect();
        Self {
            values,
            chunks,
            ids: distinct,
        }
    }
}

#[cfg(test)]
thread_local! {
    /// How many lookups this thread put on an autodiff graph through this module (for the
    /// tests).
    pub(crate) static NODES: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
    /// How many table gradients this thread summed by id (for the tests).
    pub(crate) static GRADIENTS: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// The rows `ids` of `weight` (`[V, d]`, a float tensor on an autodiff graph of cubecl
/// tensors, not stored tiled), as one autodiff operation whose backward step is
/// [`LookupBackward`]; `None` for anything else. `host` holds the same ids as `ids`.
///
/// # Shapes
/// - `weight`: `[V, d]`
/// - `ids`: `[T]`
/// - output: `[T, d]`
pub(crate) fn try_lookup(
    weight: &Tensor<2>,
    ids: &Tensor<1, Int>,
    host: &Arc<[u32]>,
) -> Option<Tensor<2>> {
    let [v, _] = weight.dims();
    float_kind(weight.dtype())?;
    if ids.dims() != [host.len()] || host.iter().any(|&i| i as usize >= v) {
        return None;
    }
    let w = weight.clone().try_into_primitive::<Autodiff<Cube>>().ok()?;
    let index = ids.clone().try_into_primitive::<Autodiff<Cube>>().ok()?;
    let table = w.primitive().clone();
    if table.meta.is_tiled() || index.meta.is_tiled() {
        return None;
    }
    let rows = take_rows(&table, &index)?;
    let step = LookupBackward
        .prepare::<NoCheckpointing>([w.node()])
        .compute_bound();
    let out = finish(step.stateful(), (host.clone(), index.clone(), v), rows);
    #[cfg(test)]
    NODES.set(NODES.get() + 1);
    Some(Tensor::from_primitive::<Autodiff<Cube>>(out))
}

/// The table's gradient `[V, d]` (the type of `g`) of a lookup of `ids` whose output has the
/// gradient `g` (`[T, d]`): row `v` is the sum of the rows of `g` whose id is `v`, zeros for
/// ids not looked up. `None` when a launch cannot be made (more cubes than two axes hold).
pub(super) fn table_gradient(g: CubeTensor, ids: &[u32], v: usize) -> Option<CubeTensor> {
    if g.meta.is_tiled() {
        return None;
    }
    let shape = g.meta.shape();
    let (t, d) = (shape[0], shape[1]);
    let kind = float_kind(g.dtype)?;
    let gt = plain::<2>(g.clone());
    let device = gt.device();
    let out = primitive(Tensor::<2>::zeros([v, d], (&device, g.dtype)));
    if t * d == 0 {
        return Some(out);
    }
    let plan = Plan::new(ids, CHUNK);
    let n = plan.values.len();
    let (chunks, distinct) = (plan.chunks, plan.ids);
    let (starts, firsts, targets) = (plan.starts(t), plan.firsts(t), plan.targets(t));
    let plan_tensor = Tensor::<1, Int>::from_data(TensorData::new(plan.values, [n]), &device)
        .try_into_primitive::<Cube>()
        .ok()?;
    let int = int_elem(plan_tensor.dtype)?;
    let client = out.client.clone();
    let direct = chunks == distinct;
    let cubes = |units: usize| cube_count(units.div_ceil(UNITS));
    let (chunk_cubes, id_cubes) = (cubes(chunks * d)?, cubes(distinct * d)?);
    let partial = if direct {
        out.clone()
    } else {
        primitive(Tensor::<2>::empty([chunks, d], (&device, DType::F32)))
    };
    let partial_kind = if direct {
        kind
    } else {
        cubecl::ir::FloatKind::F32
    };
    kernel::chunk_sums::launch(
        &client,
        chunk_cubes,
        CubeDim::new_1d(UNITS as u32),
        g.into_tensor_arg(),
        plan_tensor.clone().into_tensor_arg(),
        partial.clone().into_tensor_arg(),
        chunks,
        starts,
        targets,
        direct,
        UNITS,
        ElemType::Float(kind),
        ElemType::Float(partial_kind),
        int,
    );
    if !direct {
        kernel::id_sums::launch(
            &client,
            id_cubes,
            CubeDim::new_1d(UNITS as u32),
            partial.into_tensor_arg(),
            plan_tensor.into_tensor_arg(),
            out.clone().into_tensor_arg(),
            distinct,
            firsts,
            targets,
            UNITS,
            ElemType::Float(kind),
            int,
        );
    }
    #[cfg(test)]
    GRADIENTS.set(GRADIENTS.get() + 1);
    Some(out)
}

/// The backward step of [`try_lookup`]: [`table_gradient`] of the host's ids, burn's
/// scatter by the device's ids where it cannot launch.
#[derive(Debug)]
struct LookupBackward;

impl Backward<Cube, 1> for LookupBackward {
    /// The ids on the host and on the device, and the table's rows `V`.
    type State = (Arc<[u32]>, CubeTensor, usize);

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let (ids, index, v) = ops.state;
        unary::<Cube, _>(ops.parents, ops.node, grads, |g| {
            table_gradient(g.clone(), &ids, v).unwrap_or_else(|| {
                let gt = plain::<2>(g);
                let [_, d] = gt.dims();
                let index = Tensor::<1, Int>::from_primitive::<Cube>(index);
                let zeros = Tensor::<2>::zeros([v, d], (&gt.device(), gt.dtype()));
                primitive(zeros.select_assign(0, index, gt, burn::tensor::IndexingUpdateOp::Add))
            })
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::module::Param;
    use burn::nn::{Embedding, EmbeddingConfig};
    use burn::tensor::Distribution;
    use infembed_testkit::max_rel_diff;

    fn values<const D: usize>(t: Tensor<D>) -> Vec<f32> {
        t.into_data().convert::<f32>().try_to_vec::<f32>().unwrap()
    }

    /// The plan groups rows by id in ascending row order, cuts long ids into chunks, and its
    /// bounds index its own list.
    #[test]
    fn plan_groups_rows_by_id_in_chunks() {
        let ids = [7, 2, 7, 7, 2, 9, 7];
        let plan = Plan::new(&ids, 2);
        let t = ids.len();
        // ids 2 (rows 1, 4), 7 (rows 0, 2, 3, 6 in chunks [0, 2], [3, 6]), 9 (row 5)
        assert_eq!(&plan.values[..t], &[1, 4, 0, 2, 3, 6, 5]);
        assert_eq!((plan.chunks, plan.ids), (4, 3));
        assert_eq!(
            &plan.values[plan.starts(t)..plan.firsts(t)],
            &[0, 2, 4, 6, 7]
        );
        assert_eq!(&plan.values[plan.firsts(t)..plan.targets(t)], &[0, 1, 3, 4]);
        assert_eq!(&plan.values[plan.targets(t)..], &[2, 7, 9]);
        let whole = Plan::new(&ids, 64);
        assert_eq!((whole.chunks, whole.ids), (3, 3));
        let empty = Plan::new(&[], 64);
        assert_eq!((empty.chunks, empty.ids, empty.values), (0, 0, vec![0, 0]));
    }

    /// On a wgpu autodiff graph the lookup gives burn's embedding rows, and its table gradient
    /// equals burn's scatter and naive f64 sums on the host: every id at most a chunk
    /// (written directly, equal to burn's to the bit), an id with more rows than a chunk and
    /// than two (its chunk sums added by a second launch), ids never looked up (zeros), a
    /// table of 1 row, and a gradient of another float type (f16).
    #[test]
    fn lookup_equals_burns_embedding_and_naive_sums() {
        let Some(gpu) = crate::test_wgpu("lookup_equals_burns_embedding_and_naive_sums") else {
            return;
        };
        let _rng = crate::rng_lock();
        gpu.seed(41);
        let ad = gpu.clone().autodiff();
        let cases: Vec<(usize, usize, Vec<u32>)> = vec![
            (50, 37, vec![3, 9, 3, 0, 49, 9, 3, 17]),
            (
                30,
                384,
                (0..700)
                    .map(|r| if r % 5 == 0 { 4 } else { (r % 23) as u32 })
                    .collect(),
            ),
            (1, 16, vec![0; 200]),
            (2, 8, (0..130).map(|r| u32::from(r % 3 == 0)).collect()),
        ];
        for (v, d, ids) in cases {
            let t = ids.len();
            let plan = Plan::new(&ids, CHUNK);
            let direct = plan.chunks == plan.ids;
            let w = Tensor::<2>::random([v, d], Distribution::Normal(0.0, 1.0), &gpu).into_data();
            let g = Tensor::<2>::random([t, d], Distribution::Normal(0.0, 1.0), &gpu);
            let host: Arc<[u32]> = ids.clone().into();
            let index_data = TensorData::new(ids.iter().map(|&i| i64::from(i)).collect(), [t]);
            let run = |ours: bool| {
                let table = Embedding {
                    weight: Param::from_tensor(Tensor::from_data(w.clone(), &ad).require_grad()),
                };
                let index = Tensor::<1, Int>::from_data(index_data.clone(), &ad);
                let (nodes, sums) = (NODES.get(), GRADIENTS.get());
                let y = if ours {
                    try_lookup(&table.weight.val(), &index, &host).expect("a wgpu autodiff table")
                } else {
                    table.forward(index.unsqueeze::<2>()).reshape([t, d])
                };
                assert_eq!(NODES.get() - nodes, usize::from(ours));
                let grads = (y.clone() * Tensor::from_data(g.to_data(), &ad))
                    .sum()
                    .backward();
                // the backward step ran here, on this thread, and summed by id
                assert_eq!(GRADIENTS.get() - sums, usize::from(ours), "[{v}, {d}]");
                (
                    values(y),
                    values(table.weight.grad(&grads).expect("a gradient")),
                )
            };
            let (burn, ours) = (run(false), run(true));
            assert_eq!(burn.0, ours.0, "[{v}, {d}] rows");
            let host_g = values(g.clone());
            let mut naive = vec![0f64; v * d];
            for (r, &id) in ids.iter().enumerate() {
                for c in 0..d {
                    naive[id as usize * d + c] += f64::from(host_g[r * d + c]);
                }
            }
            let naive: Vec<f32> = naive.into_iter().map(|x| x as f32).collect();
            let diff = max_rel_diff(&naive, &ours.1);
            assert!(diff < 1e-5, "[{v}, {d}] against naive sums: {diff}");
            if direct {
                assert_eq!(burn.1, ours.1, "[{v}, {d}]: burn's sums in burn's order");
            } else {
                let diff = max_rel_diff(&burn.1, &ours.1);
                assert!(diff < 1e-5, "[{v}, {d}] against burn's: {diff}");
            }
        }

        // an f16 gradient: table rows of f16, summed in f32; ids of one chunk each (written
        // directly) and ids of 150 rows (partial sums, then the second launch)
        for modulo in [7, 2] {
            let ids: Vec<u32> = (0..300).map(|r| (r % modulo) as u32).collect();
            let g = Tensor::<2>::random([300, 24], Distribution::Normal(0.0, 1.0), &gpu)
                .cast(DType::F16);
            let host_g = values(g.clone());
            let got = table_gradient(primitive(g), &ids, 9).expect("a launch");
            assert_eq!(got.dtype, DType::F16);
            let got = values(plain::<2>(got));
            for (id, row) in got.chunks(24).enumerate() {
                for (c, &x) in row.iter().enumerate() {
                    let want: f32 = (0..300)
                        .filter(|&r| ids[r] as usize == id)
                        .map(|r| host_g[r * 24 + c])
                        .sum();
                    let tolerance = 2e-3 * want.abs().max(1.0);
                    assert!((x - want).abs() <= tolerance, "% {modulo}: {id}, {c}");
                }
            }
        }

        // not an autodiff graph, an id past the table, a length that is not the host's
        let table = EmbeddingConfig::new(4, 3).init(&gpu);
        let ids = Tensor::<1, Int>::from_data(TensorData::new(vec![1i64, 2], [2]), &gpu);
        let host: Arc<[u32]> = vec![1, 2].into();
        assert!(
            try_lookup(&table.weight.val(), &ids, &host).is_none(),
            "plain"
        );
        let table = Embedding {
            weight: Param::from_tensor(
                Tensor::from_data(table.weight.val().into_data(), &ad).require_grad(),
            ),
        };
        let ids = Tensor::<1, Int>::from_data(TensorData::new(vec![1i64, 4], [2]), &ad);
        let past: Arc<[u32]> = vec![1, 4].into();
        assert!(
            try_lookup(&table.weight.val(), &ids, &past).is_none(),
            "id 4 of 4 rows"
        );
        let short: Arc<[u32]> = vec![1].into();
        assert!(
            try_lookup(&table.weight.val(), &ids, &short).is_none(),
            "1 host id for 2"
        );
    }
}
