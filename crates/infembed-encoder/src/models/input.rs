//! The padded input of a backbone, with the packed layout of its real tokens.

use burn::prelude::*;

use crate::ops::Packing;

/// A padded batch of token ids on a device.
///
/// Shapes: every tensor is `[B, L]` where `L` is the longest row of THIS batch (never a
/// global maximum). Padding is on the right for encoders and on the left for decoders.
///
/// The packed layout keeps the host's copy of the ids given to [`BackboneInput::from_ids`],
/// and the BERT family looks its embeddings up by that copy: to run other ids, make a new
/// input rather than replacing `input_ids` or `token_type_ids`.
#[derive(Debug, Clone)]
pub struct BackboneInput {
    /// Token ids (padding positions hold the pad id).
    pub input_ids: Tensor<2, Int>,
    /// Token type (segment) ids; 0 on padding.
    pub token_type_ids: Tensor<2, Int>,
    /// 1.0 on real tokens, 0.0 on padding.
    pub attention_mask: Tensor<2>,
    /// `true` on padding positions.
    pub padding: Tensor<2, Bool>,
    /// Number of real tokens per row.
    pub lengths: Vec<usize>,
    /// The packed layout of the real tokens, built on the host from the same flags.
    pub(crate) packing: Packing,
}

impl BackboneInput {
    /// Pads `ids` (and `type_ids`, which must have the same lengths) to the longest row, and
    /// lays out the packed rows of the real tokens from the same host-side flags.
    ///
    /// # Panics
    /// If `ids` is empty, or `type_ids` does not match `ids` row by row.
    pub fn from_ids(
        ids: &[Vec<u32>],
        type_ids: &[Vec<u32>],
        pad_id: u32,
        pad_left: bool,
        device: &Device,
    ) -> Self {
        assert!(!ids.is_empty(), "BackboneInput: empty batch");
        assert_eq!(
            ids.len(),
            type_ids.len(),
            "BackboneInput: ids/type_ids rows"
        );
        let b = ids.len();
        let l = ids.iter().map(Vec::len).max().unwrap_or(0).max(1);
        let mut flat_ids = vec![pad_id as i64; b * l];
        let mut flat_types = vec![0i64; b * l];
        let mut flat_mask = vec![0f32; b * l];
        let mut flat_pad = vec![true; b * l];
        for (r, (row, types)) in ids.iter().zip(type_ids).enumerate() {
            assert_eq!(
                row.len(),
                types.len(),
                "BackboneInput: ids/type_ids row {r}"
            );
            let start = if pad_left { l - row.len() } else { 0 };
            for (j, (&id, &t)) in row.iter().zip(types).enumerate() {
                let at = r * l + start + j;
                flat_ids[at] = id as i64;
                flat_types[at] = t as i64;
                flat_mask[at] = 1.0;
                flat_pad[at] = false;
            }
        }
        let packing = Packing::new(&flat_pad, b, l, device).with_tokens(&flat_ids, &flat_types);
        Self {
            input_ids: Tensor::from_data(TensorData::new(flat_ids, [b, l]), device),
            token_type_ids: Tensor::from_data(TensorData::new(flat_types, [b, l]), device),
            attention_mask: Tensor::from_data(TensorData::new(flat_mask, [b, l]), device),
            padding: packing.padding(),
            lengths: ids.iter().map(Vec::len).collect(),
            packing,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The packed layout made with the input follows the tokenizer's rows: their lengths,
    /// on either padding side, with the padding flags it uploads.
    #[test]
    fn input_carries_the_packed_layout_of_its_rows() {
        let device = Device::flex();
        let ids: Vec<Vec<u32>> = vec![vec![5, 6, 7], vec![8], vec![9, 10]];
        let types: Vec<Vec<u32>> = vec![vec![0, 0, 1], vec![1], vec![0, 1]];
        let ints = |t: Tensor<1, Int>| t.into_data().try_to_vec_as::<i64>().expect("ints");
        for pad_left in [false, true] {
            let input = BackboneInput::from_ids(&ids, &types, 0, pad_left, &device);
            assert_eq!(input.lengths, vec![3, 1, 2]);
            assert_eq!(input.packing.offsets(), &[0, 3, 4, 6]);
            assert_eq!(input.packing.padded_len(), 3);
            let packed_ids = input
                .packing
                .pack_ids(input.input_ids.clone())
                .into_data()
                .try_to_vec_as::<i64>()
                .expect("ints");
            assert_eq!(
                packed_ids,
                vec![5, 6, 7, 8, 9, 10],
                "left padding {pad_left}"
            );
            let positions = input
                .packing
                .positions()
                .into_data()
                .try_to_vec_as::<i64>()
                .expect("ints");
            let want = if pad_left {
                vec![0, 1, 2, 2, 1, 2]
            } else {
                vec![0, 1, 2, 0, 0, 1]
            };
            assert_eq!(positions, want);
            // the embedding lookups made from the host's ids equal the device's gathers of the
            // padded ids, and carry the same ids on the host
            let (words, kinds) = input
                .packing
                .token_rows(&input.input_ids, &input.token_type_ids);
            let t = input.packing.len();
            for (lookup, padded) in [(words, &input.input_ids), (kinds, &input.token_type_ids)] {
                let gathered = ints(input.packing.pack_ids(padded.clone()).reshape([t]));
                let host: Vec<i64> = lookup
                    .host
                    .as_deref()
                    .expect("host ids")
                    .iter()
                    .map(|&i| i64::from(i))
                    .collect();
                assert_eq!(ints(lookup.ids), gathered, "left padding {pad_left}");
                assert_eq!(host, gathered, "left padding {pad_left}");
            }
            let position_rows = input.packing.position_rows();
            let host: Vec<i64> = position_rows
                .host
                .as_deref()
                .expect("host positions")
                .iter()
                .map(|&i| i64::from(i))
                .collect();
            assert_eq!(ints(position_rows.ids.clone()), want);
            assert_eq!(host, want);
            let flags = input
                .padding
                .into_data()
                .try_to_vec::<bool>()
                .expect("bools");
            let real: Vec<bool> = flags.iter().map(|p| !p).collect();
            assert_eq!(real.iter().filter(|&&r| r).count(), 6);
        }
    }
}
