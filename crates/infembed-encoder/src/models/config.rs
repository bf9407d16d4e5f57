//! The architecture of a Hugging Face checkpoint, read from its `config.json`.

use std::path::Path;

use super::bert::BertConfig;
use super::decoder::DecoderConfig;
use super::modernbert::ModernBertConfig;
use crate::config::read_json;
use crate::error::{Error, Result};
use crate::pool::Pooling;

/// The architecture described by a Hugging Face `config.json`, with its hyper-parameters.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum ArchitectureConfig {
    /// BERT family (`model_type` `bert`: BERT, MiniLM, e5, bge, gte).
    Bert(BertConfig),
    /// ModernBERT (`model_type` `modernbert`).
    ModernBert(ModernBertConfig),
    /// Decoder-only LMs (`model_type` `qwen2` or `llama`).
    Decoder(DecoderConfig),
}

impl ArchitectureConfig {
    /// Reads `dir/config.json` and dispatches on its `model_type`.
    pub fn from_dir(dir: &Path) -> Result<Self> {
        let path = dir.join("config.json");
        let value: serde_json::Value = read_json(&path, "Hugging Face model config")?;
        let model_type = value
            .get("model_type")
            .and_then(|v| v.as_str())
            .ok_or_else(|| Error::config(&path, "model_type", "missing or not a string"))?
            .to_string();
        let de_err = |source| Error::Json {
            path: path.clone(),
            source,
        };
        let arch = match model_type.as_str() {
            "bert" => Self::Bert(serde_json::from_value(value).map_err(de_err)?),
            "modernbert" => Self::ModernBert(serde_json::from_value(value).map_err(de_err)?),
            "qwen2" | "llama" => Self::Decoder(serde_json::from_value(value).map_err(de_err)?),
            _ => {
                return Err(Error::UnsupportedArchitecture { path, model_type });
            }
        };
        arch.validate(&path)?;
        Ok(arch)
    }

    /// Checks the hyper-parameters for values the implementation cannot run.
    fn validate(&self, path: &Path) -> Result<()> {
        match self {
            Self::Bert(c) => c.validate(path),
            Self::ModernBert(c) => c.validate(path),
            Self::Decoder(c) => c.validate(path),
        }
    }

    /// The width `d` of the hidden states and embeddings.
    pub fn hidden_size(&self) -> usize {
        match self {
            Self::Bert(c) => c.hidden_size,
            Self::ModernBert(c) => c.hidden_size,
            Self::Decoder(c) => c.hidden_size,
        }
    }

    /// The pooling used when no sentence-transformers config says otherwise:
    /// encoders default to `mean`, decoders to `last`.
    pub fn default_pooling(&self) -> Pooling {
        match self {
            Self::Bert(_) | Self::ModernBert(_) => Pooling::Mean,
            Self::Decoder(_) => Pooling::Last,
        }
    }

    /// Whether inputs are padded on the left (decoders, so that the last position is the
    /// last real token, as the reference does) or on the right (encoders).
    pub fn pads_left(&self) -> bool {
        matches!(self, Self::Decoder(_))
    }

    /// The id used on padding positions (`pad_token_id`, else 0; its value never matters
    /// since padding is masked).
    pub fn pad_token_id(&self) -> u32 {
        match self {
            Self::Bert(c) => c.pad_token_id.unwrap_or(0),
            Self::ModernBert(c) => c.pad_token_id.unwrap_or(0),
            Self::Decoder(c) => c.pad_token_id.unwrap_or(0),
        }
    }

    /// The largest number of positions the model can embed, if it has a limit.
    pub fn max_positions(&self) -> usize {
        match self {
            Self::Bert(c) => c.max_position_embeddings,
            Self::ModernBert(c) => c.max_position_embeddings,
            Self::Decoder(c) => c.max_position_embeddings,
        }
    }
}
