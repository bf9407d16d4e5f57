//! The packed token layout of a padded batch: its real tokens stacked as `[T, d]` rows, in
//! batch order, so that the per-token layers (projections, feed-forward, LayerNorm, dropout)
//! spend no work on padding. Sequence `s` holds rows `offsets[s]..offsets[s + 1]`.
//!
//! Training batches of texts of unequal length pad a fifth or more of their positions (the
//! quickstart's 4-record batches: 2,902 real tokens in 3,488 padded positions), and the
//! projections' cost is linear in the number of rows, so BERT runs on this layout.
//!
//! The layout is built on the host from the tokenizer's padding flags when the batch's input
//! is made ([`crate::BackboneInput`]), once per batch: nothing is read back from the device.
//!
//! Moving rows between the layouts is a gather by a one-to-one index, so its gradient is the
//! gather by the inverse index. burn's `select` does not know that its index is one-to-one and
//! scatters the gradient (`select_assign`), which on the cubecl backends runs one thread per
//! feature column over every row in turn: on an H100 each such launch took 0.44 ms of a 311 ms
//! training step, 13 of them a forward pass (docs/devices.md, "Where a GPU step goes"). Under
//! autodiff the moves here are therefore one operation whose backward step is the inverse
//! gather, on every backend (the same values: each row's gradient is copied, not summed).

use std::sync::{Arc, OnceLock};

#[cfg(any(feature = "wgpu", feature = "cuda"))]
use burn::backend::Cube;
use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::NoCheckpointing;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind, unary};
use burn::backend::{
    Autodiff, Backend, DispatchKindConversion, DispatchTensor, Flex, TensorMetadata,
};
use burn::prelude::*;
use burn::tensor::TensorData;

/// Where the real tokens of a `[B, L]` padded batch go in the packed layout, with the index
/// tensors that move states between the two layouts (built once, on the batch's device).
#[derive(Debug, Clone)]
pub(crate) struct Packing {
    /// `[B, L]`, `true` on padding.
    padding: Tensor<2, Bool>,
    /// The same flags on the host.
    pad: Vec<bool>,
    /// The padded batch's key mask for burn's attention, built on first use.
    key_mask: OnceLock<Tensor<4, Bool>>,
    /// The key mask as `[B, 1, 1, L]` f32 values for the fused softmax, built on first use.
    key_rows_float: OnceLock<Tensor<4>>,
    b: usize,
    l: usize,
    /// `B + 1` row offsets.
    offsets: Vec<usize>,
    /// `[T]`: the flat padded position `b L + t` of each packed row.
    gather: Tensor<1, Int>,
    /// `[B L]`: the packed row of each padded position, `T` on padding.
    scatter: Tensor<1, Int>,
    /// `[T]`: each packed row's column `t` in its padded row, as a lookup of the position
    /// table.
    position_rows: Lookup,
    /// The packed rows' token ids and token-type ids on the host, when the batch was made
    /// from host ids ([`Packing::with_tokens`]).
    tokens: Option<HostTokens>,
    /// Their lookups, uploaded on first use (models that do not look them up here upload
    /// nothing).
    token_rows: OnceLock<(Lookup, Lookup)>,
}

/// The packed rows' token ids and token-type ids on the host.
#[derive(Debug, Clone)]
struct HostTokens {
    ids: Arc<[u32]>,
    types: Arc<[u32]>,
}

/// The rows of an embedding table that the packed rows read, `[T]`, on the device and, where
/// the batch was made on the host, there too: [`super::embedding`] then sums the table's
/// gradient by id with a plan made from the host's copy ([`super::cube_embed`]).
#[derive(Debug, Clone)]
pub(crate) struct Lookup {
    /// `[T]` table rows on the batch's device.
    pub(crate) ids: Tensor<1, Int>,
    /// The same on the host (read by the cubecl builds' lookup only).
    #[cfg_attr(
        not(all(any(feature = "wgpu", feature = "cuda"), not(feature = "fusion"))),
        allow(dead_code)
    )]
    pub(crate) host: Option<Arc<[u32]>>,
}

impl Lookup {
    /// The lookup of the table rows `rows`, uploaded to `device`.
    fn from_host(rows: Arc<[u32]>, device: &Device) -> Self {
        Self {
            ids: index(
                rows.iter().map(|&r| r as usize).collect(),
                [rows.len()],
                device,
            ),
            host: Some(rows),
        }
    }
}

/// `v` as an integer tensor of `shape` (which must hold `v.len()` elements).
fn index<const D: usize>(v: Vec<usize>, shape: [usize; D], device: &Device) -> Tensor<D, Int> {
    let data: Vec<i64> = v.into_iter().map(|i| i as i64).collect();
    Tensor::from_data(TensorData::new(data, shape), device)
}

impl Packing {
    /// The layout of a batch whose padding flags (`B * L`, `true` on padding, anywhere in a
    /// row) are `pad`, with its index tensors and padding flags on `device`.
    ///
    /// # Panics
    /// When `pad` does not hold `B * L` flags (a shape contract of the caller).
    pub(crate) fn new(pad: &[bool], b: usize, l: usize, device: &Device) -> Self {
        assert_eq!(
            pad.len(),
            b * l,
            "Packing: expected B * L = {} flags",
            b * l
        );
        let rows: Vec<usize> = (0..b * l).filter(|&i| !pad[i]).collect();
        let t = rows.len();
        let mut offsets = Vec::with_capacity(b + 1);
        offsets.push(0);
        let mut count = 0;
        for row in pad.chunks(l.max(1)).take(b) {
            count += row.iter().filter(|&&p| !p).count();
            offsets.push(count);
        }
        let mut scatter = vec![t; b * l];
        for (r, &p) in rows.iter().enumerate() {
            scatter[p] = r;
        }
        // a column is below L, the length of a tokenized text
        let positions = rows.iter().map(|&r| (r % l.max(1)) as u32).collect();
        let position_rows = Lookup::from_host(positions, device);
        Self {
            padding: Tensor::from_data(TensorData::new(pad.to_vec(), [b, l]), device),
            pad: pad.to_vec(),
            key_mask: OnceLock::new(),
            key_rows_float: OnceLock::new(),
            b,
            l,
            offsets,
            gather: index(rows, [t], device),
            scatter: index(scatter, [b * l], device),
            position_rows,
            tokens: None,
            token_rows: OnceLock::new(),
        }
    }

    /// The layout with the packed rows' token ids and token-type ids taken on the host from
    /// the padded batch's `ids` and `types` (`B * L` each, row-major), uploaded once, so that
    /// the embedding lookups need no gather on the device and their gradients can be summed by
    /// id ([`Self::token_rows`]). Ids past `u32` keep the device's gather.
    pub(crate) fn with_tokens(mut self, ids: &[i64], types: &[i64]) -> Self {
        let packed = |values: &[i64]| -> Option<Arc<[u32]>> {
            (values.len() == self.b * self.l)
                .then(|| {
                    (0..values.len())
                        .filter(|&i| !self.pad[i])
                        .map(|i| u32::try_from(values[i]).ok())
                        .collect::<Option<Arc<[u32]>>>()
                })
                .flatten()
        };
        if let (Some(ids), Some(types)) = (packed(ids), packed(types)) {
            self.tokens = Some(HostTokens { ids, types });
        }
        self
    }

    /// The lookups of the packed rows' token ids and token-type ids: the host's
    /// ([`Self::with_tokens`]), else gathered on the device from the padded `ids` and
    /// `types` (`[B, L]`).
    pub(crate) fn token_rows(
        &self,
        ids: &Tensor<2, Int>,
        types: &Tensor<2, Int>,
    ) -> (Lookup, Lookup) {
        if let Some(host) = &self.tokens {
            let device = self.padding.device();
            return self
                .token_rows
                .get_or_init(|| {
                    (
                        Lookup::from_host(host.ids.clone(), &device),
                        Lookup::from_host(host.types.clone(), &device),
                    )
                })
                .clone();
        }
        let on_device = |t: &Tensor<2, Int>| Lookup {
            ids: self.pack_ids(t.clone()).reshape([self.len()]),
            host: None,
        };
        (on_device(ids), on_device(types))
    }

    /// The lookup of the position table: each packed row's column in its padded row.
    pub(crate) fn position_rows(&self) -> &Lookup {
        &self.position_rows
    }

    /// The number `T` of real tokens.
    pub(crate) fn len(&self) -> usize {
        self.gather.dims()[0]
    }

    /// The length `L` of the padded rows.
    pub(crate) fn padded_len(&self) -> usize {
        self.l
    }

    /// The padding flags `[B, L]` (`true` on padding) on the batch's device.
    pub(crate) fn padding(&self) -> Tensor<2, Bool> {
        self.padding.clone()
    }

    /// The padded batch's key-padding mask ([`super::key_padding_mask`]), built once.
    pub(crate) fn key_mask(&self) -> Tensor<4, Bool> {
        self.key_mask
            .get_or_init(|| super::key_padding_mask(self.padding()))
            .clone()
    }

    /// The key-padding mask as `[B, 1, 1, L]` (`true` on padding), for ops that broadcast it
    /// over the heads and queries themselves.
    pub(crate) fn key_rows_mask(&self) -> Tensor<4, Bool> {
        self.padding().reshape([self.b, 1, 1, self.l])
    }

    /// [`Self::key_rows_mask`] as f32 values (`1` on padding), made from the host's flags once
    /// per batch, where converting the flags on the device would take launches in every layer.
    pub(crate) fn key_rows_float_mask(&self) -> Tensor<4> {
        self.key_rows_float
            .get_or_init(|| {
                let values: Vec<f32> = self.pad.iter().map(|&p| f32::from(u8::from(p))).collect();
                let data = TensorData::new(values, [self.b, 1, 1, self.l]);
                Tensor::from_data(data, (&self.padding.device(), burn::tensor::DType::F32))
            })
            .clone()
    }

    /// `B + 1` row offsets: sequence `s` is rows `offsets[s]..offsets[s + 1]`.
    pub(crate) fn offsets(&self) -> &[usize] {
        &self.offsets
    }

    /// Whether some position is padding (`T < B L`): then the moves to the padded layout read
    /// an appended zero row.
    fn padded(&self) -> bool {
        self.len() < self.b * self.l
    }

    /// The real tokens' rows of `x`.
    ///
    /// # Shapes
    /// - `x`: `[B, L, d]`
    /// - output: `[T, d]`
    pub(crate) fn pack(&self, x: Tensor<3>) -> Tensor<2> {
        let [_, _, d] = x.dims();
        move_rows(
            x.reshape([self.b * self.l, d]),
            RowIndex::new(&self.gather, false),
            RowIndex::new(&self.scatter, self.padded()),
        )
    }

    /// The real tokens' entries of `ids` (`[B, L]`), as one row `[1, T]`.
    pub(crate) fn pack_ids(&self, ids: Tensor<2, Int>) -> Tensor<2, Int> {
        ids.reshape([self.b * self.l])
            .select(0, self.gather.clone())
            .unsqueeze::<2>()
    }

    /// Each real token's position in its padded row (`0..L`), as one row `[1, T]`.
    #[cfg(test)]
    pub(crate) fn positions(&self) -> Tensor<2, Int> {
        self.position_rows.ids.clone().reshape([1, self.len()])
    }

    /// The padded batch again: packed row `r` back at its position, zeros on padding.
    ///
    /// # Shapes
    /// - `x`: `[T, d]`
    /// - output: `[B, L, d]`
    pub(crate) fn unpack(&self, x: Tensor<2>) -> Tensor<3> {
        let [_, d] = x.dims();
        // row T is a zero row that every padding position reads
        move_rows(
            x,
            RowIndex::new(&self.scatter, self.padded()),
            RowIndex::new(&self.gather, false),
        )
        .reshape([self.b, self.l, d])
    }
}

/// One direction of a row move: the rows to read, from the input with a zero row appended
/// when `zero_row` (index `N` of an `N`-row input is then that row).
#[derive(Clone, Copy)]
struct RowIndex<'a> {
    index: &'a Tensor<1, Int>,
    zero_row: bool,
}

impl<'a> RowIndex<'a> {
    fn new(index: &'a Tensor<1, Int>, zero_row: bool) -> Self {
        Self { index, zero_row }
    }
}

/// The rows of `x` that `forward` names, in its order; under autodiff the gradient flows back
/// by the gather `backward` (the inverse of `forward`: each row of `x` that `forward` reads is
/// read exactly once, and `backward` reads, for each row of `x`, the output row that took it,
/// or a zero row).
///
/// # Shapes
/// - `x`: `[N, d]`
/// - output: `[M, d]`, `M` the length of `forward.index`
fn move_rows(x: Tensor<2>, forward: RowIndex<'_>, backward: RowIndex<'_>) -> Tensor<2> {
    if x.device().is_autodiff() {
        let moved = move_rows_autodiff::<Flex>(&x, forward, backward, take_rows::<Flex>);
        #[cfg(any(feature = "wgpu", feature = "cuda"))]
        let moved =
            moved.or_else(|| move_rows_autodiff::<Cube>(&x, forward, backward, take_rows_cube));
        if let Some(y) = moved {
            return y;
        }
    }
    // one gather kernel on a cubecl device, which reads the zero row without appending it
    #[cfg(all(any(feature = "wgpu", feature = "cuda"), not(feature = "fusion")))]
    if let (Ok(xp), Ok(ip)) = (
        x.clone().try_into_primitive::<Cube>(),
        forward.index.clone().try_into_primitive::<Cube>(),
    ) {
        return Tensor::from_primitive::<Cube>(take_rows_cube(xp, ip, forward.zero_row));
    }
    let x = if forward.zero_row {
        let [_, d] = x.dims();
        let device = x.device();
        Tensor::cat(vec![x, Tensor::zeros([1, d], &device)], 0)
    } else {
        x
    };
    x.select(0, forward.index.clone())
}

/// The rows of `x` (with a zero row appended when `zero_row`) at `index`, on backend `B`'s
/// primitives: [`move_rows`]' forward step, and with the inverse index its backward step.
fn take_rows<B: Backend>(
    x: B::FloatTensorPrimitive,
    index: B::IntTensorPrimitive,
    zero_row: bool,
) -> B::FloatTensorPrimitive {
    let x = if zero_row {
        let shape = x.shape();
        let zeros = B::float_zeros([1, shape[1]].into(), &x.device(), x.dtype().into());
        B::float_cat(vec![x, zeros], 0)
    } else {
        x
    };
    B::float_select(x, 0, index)
}

/// [`take_rows`] on the cubecl backend: one gather kernel ([`super::cube_rows`]), which
/// reads an index past the last row as the zero row, in builds without `fusion`; burn's ops
/// otherwise.
#[cfg(any(feature = "wgpu", feature = "cuda"))]
fn take_rows_cube(
    x: <Cube as burn::backend::BackendTypes>::FloatTensorPrimitive,
    index: <Cube as burn::backend::BackendTypes>::IntTensorPrimitive,
    zero_row: bool,
) -> <Cube as burn::backend::BackendTypes>::FloatTensorPrimitive {
    #[cfg(not(feature = "fusion"))]
    if let Some(y) = super::cube_rows::take_rows(&x, &index) {
        return y;
    }
    take_rows::<Cube>(x, index, zero_row)
}

/// How a backend takes rows: [`take_rows`], or a kernel of its own.
type TakeRows<B> = fn(
    <B as burn::backend::BackendTypes>::FloatTensorPrimitive,
    <B as burn::backend::BackendTypes>::IntTensorPrimitive,
    bool,
) -> <B as burn::backend::BackendTypes>::FloatTensorPrimitive;

/// The backward step of [`move_rows`]: the gather by the inverse index, through `take`.
struct MoveRowsBackward<B: Backend> {
    take: TakeRows<B>,
}

impl<B: Backend> std::fmt::Debug for MoveRowsBackward<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("MoveRowsBackward")
    }
}

impl<B: Backend> Backward<B, 1> for MoveRowsBackward<B> {
    type State = (B::IntTensorPrimitive, bool);

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let (index, zero_row) = ops.state;
        let take = self.take;
        unary::<B, _>(ops.parents, ops.node, grads, |g| take(g, index, zero_row));
    }
}

/// [`move_rows`] as one autodiff operation of backend `B` (without gradient checkpointing),
/// or `None` when `x` is not such a tensor.
fn move_rows_autodiff<B: Backend>(
    x: &Tensor<2>,
    forward: RowIndex<'_>,
    backward: RowIndex<'_>,
    take: TakeRows<B>,
) -> Option<Tensor<2>>
where
    DispatchTensor: DispatchKindConversion<Autodiff<B>>,
{
    let t = x.clone().try_into_primitive::<Autodiff<B>>().ok()?;
    let fwd = forward
        .index
        .clone()
        .try_into_primitive::<Autodiff<B>>()
        .ok()?;
    let bwd = backward
        .index
        .clone()
        .try_into_primitive::<Autodiff<B>>()
        .ok()?;
    let input = t.primitive().clone();
    let out = match (MoveRowsBackward::<B> { take })
        .prepare::<NoCheckpointing>([t.node()])
        .compute_bound()
        .stateful()
    {
        OpsKind::Tracked(prep) => {
            prep.finish((bwd, backward.zero_row), take(input, fwd, forward.zero_row))
        }
        OpsKind::UnTracked(prep) => prep.finish(take(input, fwd, forward.zero_row)),
    };
    Some(Tensor::from_primitive::<Autodiff<B>>(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packs_and_unpacks_around_padding_anywhere() {
        let device = Device::flex();
        let (b, l, d) = (3, 4, 2);
        // row 0 right-padded, row 1 left-padded, row 2 all padding
        let pad = [
            false, false, false, true, //
            true, false, false, false, //
            true, true, true, true,
        ];
        let packing = Packing::new(&pad, b, l, &device);
        assert_eq!(packing.offsets(), &[0, 3, 6, 6]);
        assert_eq!(packing.len(), 6);
        let data: Vec<f32> = (0..b * l * d).map(|i| i as f32).collect();
        let x = Tensor::<3>::from_data(TensorData::new(data.clone(), [b, l, d]), &device);
        let packed = packing
            .pack(x)
            .into_data()
            .try_to_vec::<f32>()
            .expect("f32");
        let want: Vec<f32> = (0..b * l)
            .filter(|&i| !pad[i])
            .flat_map(|i| [data[i * d], data[i * d + 1]])
            .collect();
        assert_eq!(packed, want);
        let back = packing
            .unpack(Tensor::from_data(TensorData::new(packed, [6, d]), &device))
            .into_data()
            .try_to_vec::<f32>()
            .expect("f32");
        for i in 0..b * l {
            for j in 0..d {
                let expected = if pad[i] { 0.0 } else { data[i * d + j] };
                assert_eq!(back[i * d + j], expected, "position {i}, column {j}");
            }
        }
        let pos = packing
            .positions()
            .into_data()
            .try_to_vec_as::<i64>()
            .expect("ints");
        assert_eq!(pos, vec![0, 1, 2, 1, 2, 3]);
        // a batch of padding only packs to no rows and unpacks to zeros
        let empty = Packing::new(&[true; 4], 2, 2, &device);
        assert_eq!((empty.len(), empty.offsets()), (0, &[0, 0, 0][..]));
        let zeros = empty
            .unpack(Tensor::zeros([0, d], &device))
            .into_data()
            .try_to_vec::<f32>()
            .expect("f32");
        assert_eq!(zeros, vec![0.0; 4 * d]);
    }

    /// `(x, gradient of sum(w * f(x)) with respect to x)` on an autodiff device.
    fn value_and_grad<const D: usize, const E: usize>(
        device: &Device,
        x: &[f32],
        x_shape: [usize; D],
        w: &[f32],
        w_shape: [usize; E],
        f: impl Fn(Tensor<D>) -> Tensor<E>,
    ) -> (Vec<f32>, Vec<f32>) {
        let x = Tensor::<D>::from_data(TensorData::new(x.to_vec(), x_shape), device).require_grad();
        let w = Tensor::<E>::from_data(TensorData::new(w.to_vec(), w_shape), device);
        let y = f(x.clone());
        let value = y.to_data().try_to_vec::<f32>().expect("f32");
        let grads = (y * w).sum().backward();
        let g = x.grad(&grads).expect("x has a gradient");
        (value, g.into_data().try_to_vec::<f32>().expect("f32"))
    }

    /// The key mask made from the host's flags as f32 equals the device's flags converted,
    /// `[B, 1, 1, L]`, on plain and autodiff devices, and is made once.
    #[test]
    fn the_float_key_mask_is_the_flags_converted() {
        for device in [Device::flex(), Device::flex().autodiff()] {
            let (b, l) = (3, 5);
            let pad: Vec<bool> = (0..b * l).map(|i| (i * 7) % 3 == 0).collect();
            let packing = Packing::new(&pad, b, l, &device);
            let got = packing.key_rows_float_mask();
            assert_eq!(got.dims(), [b, 1, 1, l]);
            assert_eq!(got.dtype(), burn::tensor::DType::F32);
            let expected = packing
                .key_rows_mask()
                .float()
                .cast(burn::tensor::DType::F32);
            assert_eq!(
                got.to_data().convert::<f32>().try_to_vec::<f32>().unwrap(),
                expected
                    .to_data()
                    .convert::<f32>()
                    .try_to_vec::<f32>()
                    .unwrap()
            );
            assert!(
                packing.key_rows_float.get().is_some(),
                "kept for the next layer"
            );
        }
    }

    #[test]
    fn row_moves_have_the_gradients_of_burns_select() {
        row_moves_equal_burns_select_on(&Device::flex().autodiff());
    }

    /// On wgpu (Mesa's software driver in CI) the moves run one gather kernel, which reads
    /// the zero row without appending it: on an autodiff graph they give burn's select and
    /// its gradients, and on plain tensors (inference) burn's select, exactly. The f32 key
    /// mask made once a batch goes to the fused softmax (no fallback) and gives the
    /// probabilities of the flags; an f16 mask and a mask of fewer keys are handed back.
    #[cfg(all(any(feature = "wgpu", feature = "cuda"), not(feature = "fusion")))]
    #[test]
    fn row_moves_on_wgpu_equal_burns_select() {
        let Some(gpu) = crate::test_wgpu("row_moves_on_wgpu_equal_burns_select") else {
            return;
        };
        // random draws from the process's one generator, which the seeded tests share
        let _rng = crate::rng_lock();
        row_moves_equal_burns_select_on(&gpu.clone().autodiff());
        // the key mask made once a batch is the fused softmax's (plain and on an autodiff
        // graph: no fallback), with the probabilities of the flags it was made from
        let (b, h, l) = (3, 2, 6);
        let flags: Vec<bool> = (0..b * l).map(|i| i % l >= [6, 2, 4][i / l]).collect();
        for device in [gpu.clone(), gpu.clone().autodiff()] {
            let packing = Packing::new(&flags, b, l, &device);
            let mask = packing.key_rows_float_mask();
            assert_eq!(mask.device(), device);
            let scores = Tensor::<4>::random(
                [b, h, l, l],
                burn::tensor::Distribution::Normal(0.0, 2.0),
                &device,
            );
            let softmax = super::super::cube_softmax::try_masked_softmax_f32;
            let got = softmax(scores.clone(), &mask, 0.5, -6e4, None).expect("the fused softmax");
            let by_flags = super::super::cube_softmax::try_masked_softmax(
                scores.clone(),
                &packing.key_rows_mask(),
                0.5,
                -6e4,
                None,
            )
            .expect("the fused softmax");
            let values = |t: Tensor<4>| t.into_data().convert::<f32>().try_to_vec::<f32>().unwrap();
            assert_eq!(values(got), values(by_flags));
            let half = mask.clone().cast(burn::tensor::DType::F16);
            assert!(
                softmax(scores.clone(), &half, 0.5, -6e4, None).is_err(),
                "an f16 mask"
            );
            let short = mask.slice([0..b, 0..1, 0..1, 0..l - 1]);
            assert!(
                softmax(scores, &short, 0.5, -6e4, None).is_err(),
                "a mask of fewer keys"
            );
        }
        let (b, l, d) = (3, 5, 4);
        let pad = [
            false, false, true, true, true, //
            false, false, false, false, false, //
            true, false, false, true, true,
        ];
        let packing = Packing::new(&pad, b, l, &gpu);
        let t = packing.len();
        let values = |t: Tensor<2>| t.into_data().try_to_vec::<f32>().expect("f32");
        let x = Tensor::<3>::from_data(
            TensorData::new((0..b * l * d).map(|i| i as f32 + 0.5).collect(), [b, l, d]),
            &gpu,
        );
        let reference = x
            .clone()
            .reshape([b * l, d])
            .select(0, packing.gather.clone());
        let packed = packing.pack(x);
        assert_eq!(values(packed.clone()), values(reference), "pack");
        let reference = Tensor::cat(vec![packed.clone(), Tensor::zeros([1, d], &gpu)], 0)
            .select(0, packing.scatter.clone());
        let unpacked = packing.unpack(packed).reshape([b * l, d]);
        assert_eq!(values(unpacked), values(reference), "unpack");
        assert_eq!(t, 9);
    }

    fn row_moves_equal_burns_select_on(device: &Device) {
        let device = device.clone();
        let d = 3;
        // some padding (anywhere in a row), none, and only padding
        let cases: [(&[bool], usize, usize); 3] = [
            (&[false, false, true, true, false, true], 2, 3),
            (&[false; 6], 3, 2),
            (&[true; 4], 2, 2),
        ];
        for (pad, b, l) in cases {
            let packing = Packing::new(pad, b, l, &device);
            let t = packing.len();
            let x: Vec<f32> = (0..b * l * d).map(|i| (i as f32 * 0.37).sin()).collect();
            let w_t: Vec<f32> = (0..t * d).map(|i| (i as f32 * 0.91).cos()).collect();
            // pack, against a gather of the flat rows by burn's select (its gradient a scatter)
            let ours = value_and_grad(&device, &x, [b, l, d], &w_t, [t, d], |x| packing.pack(x));
            let reference = value_and_grad(&device, &x, [b, l, d], &w_t, [t, d], |x| {
                x.reshape([b * l, d]).select(0, packing.gather.clone())
            });
            assert_eq!(ours, reference, "pack, padding {pad:?}");
            // unpack, against the zero row and select of burn's ops
            let xt: Vec<f32> = (0..t * d).map(|i| (i as f32 * 0.53).sin()).collect();
            let w_p: Vec<f32> = (0..b * l * d).map(|i| (i as f32 * 0.29).cos()).collect();
            let ours = value_and_grad(&device, &xt, [t, d], &w_p, [b, l, d], |x| packing.unpack(x));
            if t == 0 {
                // (burn's `cat` leaves the empty input out of the graph: no reference here)
                assert_eq!(ours, (vec![0.0; b * l * d], vec![]), "unpack of no rows");
                continue;
            }
            let reference = value_and_grad(&device, &xt, [t, d], &w_p, [b, l, d], |x| {
                let device = x.device();
                Tensor::cat(vec![x, Tensor::zeros([1, d], &device)], 0)
                    .select(0, packing.scatter.clone())
                    .reshape([b, l, d])
            });
            assert_eq!(ours, reference, "unpack, padding {pad:?}");
        }
    }
}
