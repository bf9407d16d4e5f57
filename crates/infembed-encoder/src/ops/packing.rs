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

use std::sync::OnceLock;

use burn::prelude::*;
use burn::tensor::TensorData;

/// Where the real tokens of a `[B, L]` padded batch go in the packed layout, with the index
/// tensors that move states between the two layouts (built once, on the batch's device).
#[derive(Debug, Clone)]
pub(crate) struct Packing {
    /// `[B, L]`, `true` on padding.
    padding: Tensor<2, Bool>,
    /// The padded batch's key mask for burn's attention, built on first use.
    key_mask: OnceLock<Tensor<4, Bool>>,
    b: usize,
    l: usize,
    /// `B + 1` row offsets.
    offsets: Vec<usize>,
    /// `[T]`: the flat padded position `b L + t` of each packed row.
    gather: Tensor<1, Int>,
    /// `[B L]`: the packed row of each padded position, `T` on padding.
    scatter: Tensor<1, Int>,
    /// `[1, T]`: each packed row's column `t` in its padded row.
    positions: Tensor<2, Int>,
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
        let positions = rows.iter().map(|&r| r % l.max(1)).collect();
        Self {
            padding: Tensor::from_data(TensorData::new(pad.to_vec(), [b, l]), device),
            key_mask: OnceLock::new(),
            b,
            l,
            offsets,
            gather: index(rows, [t], device),
            scatter: index(scatter, [b * l], device),
            positions: index(positions, [1, t], device),
        }
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

    /// `B + 1` row offsets: sequence `s` is rows `offsets[s]..offsets[s + 1]`.
    pub(crate) fn offsets(&self) -> &[usize] {
        &self.offsets
    }

    /// The real tokens' rows of `x`.
    ///
    /// # Shapes
    /// - `x`: `[B, L, d]`
    /// - output: `[T, d]`
    pub(crate) fn pack(&self, x: Tensor<3>) -> Tensor<2> {
        let [_, _, d] = x.dims();
        x.reshape([self.b * self.l, d])
            .select(0, self.gather.clone())
    }

    /// The real tokens' entries of `ids` (`[B, L]`), as one row `[1, T]`.
    pub(crate) fn pack_ids(&self, ids: Tensor<2, Int>) -> Tensor<2, Int> {
        ids.reshape([self.b * self.l])
            .select(0, self.gather.clone())
            .unsqueeze::<2>()
    }

    /// Each real token's position in its padded row (`0..L`), as one row `[1, T]`.
    pub(crate) fn positions(&self) -> Tensor<2, Int> {
        self.positions.clone()
    }

    /// The padded batch again: packed row `r` back at its position, zeros on padding.
    ///
    /// # Shapes
    /// - `x`: `[T, d]`
    /// - output: `[B, L, d]`
    pub(crate) fn unpack(&self, x: Tensor<2>) -> Tensor<3> {
        let [_, d] = x.dims();
        let device = x.device();
        // row T is a zero row that every padding position reads
        Tensor::cat(vec![x, Tensor::zeros([1, d], &device)], 0)
            .select(0, self.scatter.clone())
            .reshape([self.b, self.l, d])
    }
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
}
