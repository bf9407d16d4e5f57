//! The backbone enum (one variant per architecture): loading, the forward pass and saving,
//! dispatched to the model of the checkpoint's architecture.

use std::path::Path;

use burn::prelude::*;

use super::bert::{self, BertModel};
use super::config::ArchitectureConfig;
use super::decoder::DecoderModel;
use super::input::BackboneInput;
use super::modernbert::{self, ModernBertModel};
use crate::device::Quantization;
use crate::error::Result;
use crate::ops::Products;
use crate::weights;

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
    /// Builds the backbone described by `arch` and loads `dir`'s weights into it
    /// (`model.safetensors` or the shards of `model.safetensors.index.json`, any float dtype
    /// cast to f32).
    pub fn load(arch: &ArchitectureConfig, dir: &Path, device: &Device) -> Result<Self> {
        Ok(match arch {
            ArchitectureConfig::Bert(c) => Self::Bert(c.load(dir, device)?),
            ArchitectureConfig::ModernBert(c) => Self::ModernBert(c.load(dir, device)?),
            ArchitectureConfig::Decoder(c) => Self::Decoder(c.load(dir, device)?),
        })
    }

    /// Last-layer hidden states `[B, L, d]`.
    pub fn forward(&self, input: &BackboneInput) -> Tensor<3> {
        // a GPU training pass draws its dropouts' keys in one launch
        crate::ops::dropout_scope(|| match self {
            Self::Bert(m) => m.forward(input),
            Self::ModernBert(m) => m.forward(input),
            Self::Decoder(m) => m.forward(input),
        })
    }

    /// Computes the backbone's linear layers with `quantization` at inference on the CPU
    /// (`flex`), their int8 weights prepared now (and trains them in `f32`); elsewhere (a GPU)
    /// they keep computing in the device's float type.
    pub fn set_quantization(&mut self, quantization: Quantization) {
        self.set_products(Products {
            inference: quantization,
            ..Products::default()
        });
    }

    /// Computes the backbone's linear layers with `products` on the CPU ([`Products`]).
    pub(crate) fn set_products(&mut self, products: Products) {
        match self {
            Self::Bert(m) => m.set_products(products),
            Self::ModernBert(m) => m.set_products(products),
            Self::Decoder(m) => m.set_products(products),
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
