//! The packed token layout of a padded batch: its real tokens stacked as `[T, d]` rows, in
//! batch order, so that the per-token layers (projections, feed-forward, LayerNorm, dropout)
//! spend no work on padding. Sequence `s` holds rows `offsets[s]..offsets[s + 1]`.
//!
//! Training batches of texts of unequal length pad a fifth or more of their positions (the
//! quickstart's 4-record batches: 2,902 real tokens in 3,488 padded positions), and the
//! projections' cost is linear in the number of rows, so BERT runs on this layout.

use burn::prelude::*;
use burn::tensor::TensorData;

/// Where the real tokens of a `[B, L]` padded batch go in the packed layout.
#[derive(Debug, Clone)]
pub(crate) struct Packing {
    b: usize,
    l: usize,
    /// `B + 1` row offsets.
    offsets: Vec<usize>,
    /// Flat padded position `b L + t` of each packed row.
    rows: Vec<usize>,
}

impl Packing {
    /// The layout of a batch whose padding flags (`B * L`, `true` on padding, anywhere in a
    /// row) are `pad`.
    ///
    /// # Panics
    /// When `pad` does not hold `B * L` flags (a shape contract of the caller).
    pub(crate) fn new(pad: &[bool], b: usize, l: usize) -> Self {
        assert_eq!(
            pad.len(),
            b * l,
            "Packing: expected B * L = {} flags",
            b * l
        );
        let rows: Vec<usize> = (0..b * l).filter(|&i| !pad[i]).collect();
        let mut offsets = Vec::with_capacity(b + 1);
        offsets.push(0);
        let mut count = 0;
        for row in pad.chunks(l.max(1)).take(b) {
            count += row.iter().filter(|&&p| !p).count();
            offsets.push(count);
        }
        Self {
            b,
            l,
            offsets,
            rows,
        }
    }

    /// The number `T` of real tokens.
    pub(crate) fn len(&self) -> usize {
        self.rows.len()
    }

    /// `B + 1` row offsets: sequence `s` is rows `offsets[s]..offsets[s + 1]`.
    pub(crate) fn offsets(&self) -> &[usize] {
        &self.offsets
    }

    fn index(v: impl Iterator<Item = usize>, device: &Device) -> Tensor<1, Int> {
        let data: Vec<i64> = v.map(|i| i as i64).collect();
        let n = data.len();
        Tensor::from_data(TensorData::new(data, [n]), device)
    }

    /// The real tokens' rows of `x`.
    ///
    /// # Shapes
    /// - `x`: `[B, L, d]`
    /// - output: `[T, d]`
    pub(crate) fn pack(&self, x: Tensor<3>) -> Tensor<2> {
        let [_, _, d] = x.dims();
        let device = x.device();
        x.reshape([self.b * self.l, d])
            .select(0, Self::index(self.rows.iter().copied(), &device))
    }

    /// The real tokens' entries of `ids` (`[B, L]`), as one row `[1, T]`.
    pub(crate) fn pack_ids(&self, ids: Tensor<2, Int>) -> Tensor<2, Int> {
        let device = ids.device();
        ids.reshape([self.b * self.l])
            .select(0, Self::index(self.rows.iter().copied(), &device))
            .unsqueeze::<2>()
    }

    /// Each real token's position in its padded row (`0..L`), as one row `[1, T]`.
    pub(crate) fn positions(&self, device: &Device) -> Tensor<2, Int> {
        let l = self.l;
        Self::index(self.rows.iter().map(|&r| r % l), device).unsqueeze::<2>()
    }

    /// The padded batch again: packed row `r` back at its position, zeros on padding.
    ///
    /// # Shapes
    /// - `x`: `[T, d]`
    /// - output: `[B, L, d]`
    pub(crate) fn unpack(&self, x: Tensor<2>) -> Tensor<3> {
        let [t, d] = x.dims();
        let device = x.device();
        let mut at = vec![t; self.b * self.l];
        for (r, &p) in self.rows.iter().enumerate() {
            at[p] = r;
        }
        // row T is a zero row that every padding position reads
        Tensor::cat(vec![x, Tensor::zeros([1, d], &device)], 0)
            .select(0, Self::index(at.into_iter(), &device))
            .reshape([self.b, self.l, d])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packs_and_unpacks_around_padding_anywhere() {
        let device = Device::default();
        let (b, l, d) = (3, 4, 2);
        // row 0 right-padded, row 1 left-padded, row 2 all padding
        let pad = [
            false, false, false, true, //
            true, false, false, false, //
            true, true, true, true,
        ];
        let packing = Packing::new(&pad, b, l);
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
            .positions(&device)
            .into_data()
            .try_to_vec_as::<i64>()
            .expect("ints");
        assert_eq!(pos, vec![0, 1, 2, 1, 2, 3]);
    }
}
