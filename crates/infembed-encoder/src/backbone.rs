//! The backbone enum (one variant per architecture) and the padded input it takes.

use std::path::Path;

use burn::prelude::*;

use crate::bert::{self, BertModel};
use crate::config::ArchitectureConfig;
use crate::decoder::DecoderModel;
use crate::error::Result;
use crate::modernbert::{self, ModernBertModel};
use crate::weights;

/// A padded batch of token ids on a device.
///
/// Shapes: every tensor is `[B, L]` where `L` is the longest row of THIS batch (never a
/// global maximum). Padding is on the right for encoders and on the left for decoders.
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
}

impl BackboneInput {
    /// Pads `ids` (and `type_ids`, which must have the same lengths) to the longest row.
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
        Self {
            input_ids: Tensor::from_data(TensorData::new(flat_ids, [b, l]), device),
            token_type_ids: Tensor::from_data(TensorData::new(flat_types, [b, l]), device),
            attention_mask: Tensor::from_data(TensorData::new(flat_mask, [b, l]), device),
            padding: Tensor::from_data(TensorData::new(flat_pad, [b, l]), device),
            lengths: ids.iter().map(Vec::len).collect(),
        }
    }
}

/// A transformer backbone turning token ids into hidden states.
// One backbone per tower lives for the whole run, so the size difference between variants
// costs nothing worth an extra indirection.
#[allow(clippy::large_enum_variant)]
#[derive(Module, Debug)]
pub enum Backbone {
    /// BERT family.
    Bert(BertModel),
    /// ModernBERT.
    ModernBert(ModernBertModel),
    /// Qwen2 / Llama decoders.
    Decoder(DecoderModel),
}

impl Backbone {
    /// Builds the backbone described by `arch` and loads `dir/model.safetensors` into it.
    pub fn load(arch: &ArchitectureConfig, dir: &Path, device: &Device) -> Result<Self> {
        Ok(match arch {
            ArchitectureConfig::Bert(c) => Self::Bert(c.load(dir, device)?),
            ArchitectureConfig::ModernBert(c) => Self::ModernBert(c.load(dir, device)?),
            ArchitectureConfig::Decoder(c) => Self::Decoder(c.load(dir, device)?),
        })
    }

    /// Last-layer hidden states `[B, L, d]`.
    pub fn forward(&self, input: &BackboneInput) -> Tensor<3> {
        match self {
            Self::Bert(m) => m.forward(input),
            Self::ModernBert(m) => m.forward(input),
            Self::Decoder(m) => m.forward(input),
        }
    }

    /// Writes the weights to `path` (safetensors) under their original Hugging Face names.
    pub fn save_safetensors(&self, path: &Path) -> Result<()> {
        match self {
            Self::Bert(m) => weights::save_from(m, path, &bert::SAVE_REMAPS),
            Self::ModernBert(m) => weights::save_from(m, path, &modernbert::SAVE_REMAPS),
            Self::Decoder(m) => weights::save_from(m, path, &[]),
        }
    }
}
