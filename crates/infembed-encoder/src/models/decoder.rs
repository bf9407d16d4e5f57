//! Decoder-only backbones, Qwen2 and Llama: pre-norm RMSNorm layers, rotary position
//! embeddings, grouped-query causal attention and a SwiGLU feed-forward.
//!
//! Inputs are left-padded so that the last position holds every row's last real token
//! (last-token pooling, as the reference does). Positions run `0..L` over the padded row,
//! as in `transformers` when no `position_ids` are given; rotary attention depends only on
//! relative positions, so the shift caused by left padding does not change real tokens'
//! states.

use std::path::Path;

use burn::nn::{Embedding, EmbeddingConfig, Linear, LinearConfig, RmsNorm, RmsNormConfig};
use burn::prelude::*;
use burn::tensor::activation::silu;
use serde::{Deserialize, Serialize};

use super::input::BackboneInput;
pub use super::rope::Llama3RopeScaling;
use super::rope::{RopeTables, inverse_frequencies};
use crate::error::{Error, Result};
use crate::ops::Products;
use crate::ops::{QuantSlot, attention, key_padding_mask, linear_q, merge_heads, split_heads};
use crate::weights;

/// Which decoder family.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DecoderKind {
    /// Qwen2 (biases on the q/k/v projections).
    Qwen2,
    /// Llama (biases per `attention_bias` / `mlp_bias`).
    Llama,
}

/// Hyper-parameters of a Qwen2 / Llama checkpoint (`config.json`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct DecoderConfig {
    /// `qwen2` or `llama`.
    pub model_type: DecoderKind,
    /// Vocabulary size.
    pub vocab_size: usize,
    /// Width of the hidden states.
    pub hidden_size: usize,
    /// Number of layers.
    pub num_hidden_layers: usize,
    /// Query heads.
    pub num_attention_heads: usize,
    /// Key/value heads (grouped-query attention); defaults to the query heads.
    #[serde(default)]
    pub num_key_value_heads: Option<usize>,
    /// Width of one head; defaults to `hidden_size / num_attention_heads`.
    #[serde(default)]
    pub head_dim: Option<usize>,
    /// Width of the SwiGLU layer.
    pub intermediate_size: usize,
    /// Activation (only `silu`).
    #[serde(default = "default_act")]
    pub hidden_act: String,
    /// Longest supported input.
    pub max_position_embeddings: usize,
    /// RMSNorm epsilon.
    #[serde(default = "default_eps")]
    pub rms_norm_eps: f64,
    /// Rotary base (older configs).
    #[serde(default)]
    pub rope_theta: Option<f64>,
    /// Rotary parameters (newer configs: `{"rope_theta": .., "rope_type": "default"}`, or
    /// `"llama3"` with its scaling fields).
    #[serde(default)]
    pub rope_parameters: Option<serde_json::Value>,
    /// Rotary scaling (older configs, e.g. Llama 3.x as published: `{"rope_type": "llama3",
    /// "factor": 32.0, ...}`); `null` or absent for none.
    #[serde(default)]
    pub rope_scaling: Option<serde_json::Value>,
    /// Attention type per layer (newer configs); only `full_attention` is supported.
    #[serde(default)]
    pub layer_types: Option<Vec<String>>,
    /// Share of each head that is rotated; only 1 (all of it) is supported.
    #[serde(default)]
    pub partial_rotary_factor: Option<f64>,
    /// Llama: bias on q/k/v/o.
    #[serde(default)]
    pub attention_bias: bool,
    /// Llama: bias on the feed-forward projections.
    #[serde(default)]
    pub mlp_bias: bool,
    /// Padding id, if any.
    #[serde(default)]
    pub pad_token_id: Option<u32>,
    /// Qwen2: whether sliding-window attention is used (not supported).
    #[serde(default)]
    pub use_sliding_window: bool,
}

fn default_act() -> String {
    "silu".into()
}
fn default_eps() -> f64 {
    1e-6
}

impl DecoderConfig {
    /// Key/value heads.
    pub fn kv_heads(&self) -> usize {
        self.num_key_value_heads.unwrap_or(self.num_attention_heads)
    }

    /// Width of one head.
    pub fn head_width(&self) -> usize {
        self.head_dim
            .unwrap_or(self.hidden_size / self.num_attention_heads.max(1))
    }

    /// The rotary base from either config style (default 10000).
    pub fn theta(&self) -> f64 {
        self.rope_parameters
            .as_ref()
            .and_then(|v| v.get("rope_theta"))
            .and_then(serde_json::Value::as_f64)
            .or(self.rope_theta)
            .unwrap_or(10_000.0)
    }

    /// Llama 3's rotary scaling when the config asks for it (`rope_parameters` or
    /// `rope_scaling` with `rope_type` / `type` `llama3`); `None` for plain rotary
    /// embeddings. Any other scaling type, or a `llama3` one missing a field, is an error
    /// naming the key.
    pub fn llama3_rope_scaling(&self, path: &Path) -> Result<Option<Llama3RopeScaling>> {
        let sources = [
            ("rope_parameters", self.rope_parameters.as_ref()),
            ("rope_scaling", self.rope_scaling.as_ref()),
        ];
        let mut found = None;
        for (key, value) in sources {
            let Some(value) = value.filter(|v| !v.is_null()) else {
                continue;
            };
            let kind = value
                .get("rope_type")
                .or_else(|| value.get("type"))
                .and_then(serde_json::Value::as_str)
                .unwrap_or("default");
            match kind {
                "default" => {}
                "llama3" => {
                    let field = |name: &str| -> Result<f32> {
                        value
                            .get(name)
                            .and_then(serde_json::Value::as_f64)
                            .map(|v| v as f32)
                            .ok_or_else(|| {
                                Error::config(
                                    path,
                                    format!("{key}.{name}"),
                                    "missing or not a number (needed by `llama3` rotary scaling)",
                                )
                            })
                    };
                    let s = Llama3RopeScaling {
                        factor: field("factor")?,
                        low_freq_factor: field("low_freq_factor")?,
                        high_freq_factor: field("high_freq_factor")?,
                        original_max_position_embeddings: field(
                            "original_max_position_embeddings",
                        )?,
                    };
                    if !(s.factor > 0.0
                        && s.low_freq_factor > 0.0
                        && s.high_freq_factor > s.low_freq_factor
                        && s.original_max_position_embeddings > 0.0)
                    {
                        return Err(Error::config(
                            path,
                            key,
                            "`llama3` scaling needs factor > 0, high_freq_factor > \
                             low_freq_factor > 0 and original_max_position_embeddings > 0",
                        ));
                    }
                    if found.is_some_and(|f| f != s) {
                        return Err(Error::config(
                            path,
                            key,
                            "rope_parameters and rope_scaling disagree",
                        ));
                    }
                    found = Some(s);
                }
                other => {
                    return Err(Error::config(
                        path,
                        format!("{key}.rope_type"),
                        format!(
                            "`{other}` rotary scaling is not supported (only `default` and `llama3`)"
                        ),
                    ));
                }
            }
        }
        Ok(found)
    }

    pub(crate) fn validate(&self, path: &Path) -> Result<()> {
        self.llama3_rope_scaling(path)?;
        if let Some(kinds) = &self.layer_types
            && let Some(other) = kinds.iter().find(|k| k.as_str() != "full_attention")
        {
            return Err(Error::config(
                path,
                "layer_types",
                format!("`{other}` layers are not supported (only `full_attention`)"),
            ));
        }
        if let Some(f) = self.partial_rotary_factor
            && f != 1.0
        {
            return Err(Error::config(
                path,
                "partial_rotary_factor",
                "only 1.0 (rotary embeddings over the whole head) is supported",
            ));
        }
        if self.hidden_act != "silu" {
            return Err(Error::config(
                path,
                "hidden_act",
                "only `silu` is supported",
            ));
        }
        if self.use_sliding_window {
            return Err(Error::config(
                path,
                "use_sliding_window",
                "sliding-window attention is not supported",
            ));
        }
        let h = self.num_attention_heads;
        if h == 0 || self.kv_heads() == 0 || !h.is_multiple_of(self.kv_heads()) {
            return Err(Error::config(
                path,
                "num_key_value_heads",
                "must be positive and divide num_attention_heads",
            ));
        }
        if !self.head_width().is_multiple_of(2) {
            return Err(Error::config(
                path,
                "head_dim",
                "must be even for rotary embeddings",
            ));
        }
        Ok(())
    }

    /// A randomly initialized model of this shape.
    pub fn init(&self, device: &Device) -> DecoderModel {
        let d = self.hidden_size;
        let dh = self.head_width();
        let (qkv_bias, o_bias, mlp_bias) = match self.model_type {
            DecoderKind::Qwen2 => (true, false, false),
            DecoderKind::Llama => (self.attention_bias, self.attention_bias, self.mlp_bias),
        };
        let lin = |i, o, bias| LinearConfig::new(i, o).with_bias(bias).init(device);
        let norm = || {
            RmsNormConfig::new(d)
                .with_epsilon(self.rms_norm_eps)
                .init(device)
        };
        DecoderModel {
            embed_tokens: EmbeddingConfig::new(self.vocab_size, d).init(device),
            layers: (0..self.num_hidden_layers)
                .map(|_| DecoderLayer {
                    input_layernorm: norm(),
                    self_attn: DecoderAttention {
                        q_proj: lin(d, self.num_attention_heads * dh, qkv_bias),
                        k_proj: lin(d, self.kv_heads() * dh, qkv_bias),
                        v_proj: lin(d, self.kv_heads() * dh, qkv_bias),
                        o_proj: lin(self.num_attention_heads * dh, d, o_bias),
                        heads: self.num_attention_heads,
                        kv_heads: self.kv_heads(),
                        int8: Default::default(),
                    },
                    post_attention_layernorm: norm(),
                    mlp: SwiGlu {
                        gate_proj: lin(d, self.intermediate_size, mlp_bias),
                        up_proj: lin(d, self.intermediate_size, mlp_bias),
                        down_proj: lin(self.intermediate_size, d, mlp_bias),
                        int8: Default::default(),
                    },
                })
                .collect(),
            norm: norm(),
            head_dim: dh,
            theta: self.theta(),
            // Validated when the config was read from a file; a config built in code with
            // a bad scaling gets plain rotary embeddings, and a warning.
            rope_scaling: match self.llama3_rope_scaling(Path::new("<DecoderConfig>")) {
                Ok(scaling) => scaling,
                Err(e) => {
                    log::warn!("{e}: using plain rotary embeddings");
                    None
                }
            },
        }
    }

    /// Builds the model and loads `dir`'s weights (keys with or without the
    /// `model.` prefix of causal-LM checkpoints; an `lm_head` is ignored).
    pub fn load(&self, dir: &Path, device: &Device) -> Result<DecoderModel> {
        let names = weights::checkpoint_tensor_names(dir)?;
        let mut model = self.init(device);
        let remaps: Vec<(&str, &str)> = if names.iter().any(|n| n.starts_with("model.")) {
            vec![(r"^model\.", "")]
        } else {
            Vec::new()
        };
        weights::load_checkpoint(&mut model, dir, &remaps)?;
        Ok(model)
    }
}

/// A Qwen2 / Llama decoder without its LM head; field names follow Hugging Face keys.
#[derive(Module, Debug)]
pub struct DecoderModel {
    /// Token embeddings.
    pub embed_tokens: Embedding,
    /// The layers.
    pub layers: Vec<DecoderLayer>,
    /// Final RMSNorm.
    pub norm: RmsNorm,
    /// Width of one head.
    pub head_dim: usize,
    /// Rotary base.
    pub theta: f64,
    /// Llama 3's rotary scaling, if the checkpoint uses it.
    #[module(skip)]
    pub rope_scaling: Option<Llama3RopeScaling>,
}

/// One pre-norm decoder layer.
#[derive(Module, Debug)]
pub struct DecoderLayer {
    /// Norm before attention.
    pub input_layernorm: RmsNorm,
    /// Grouped-query causal self-attention.
    pub self_attn: DecoderAttention,
    /// Norm before the feed-forward.
    pub post_attention_layernorm: RmsNorm,
    /// SwiGLU feed-forward.
    pub mlp: SwiGlu,
}

/// Grouped-query attention projections.
#[derive(Module, Debug)]
pub struct DecoderAttention {
    /// Query projection.
    pub q_proj: Linear,
    /// Key projection (`kv_heads` heads).
    pub k_proj: Linear,
    /// Value projection (`kv_heads` heads).
    pub v_proj: Linear,
    /// Output projection.
    pub o_proj: Linear,
    /// Query heads.
    pub heads: usize,
    /// Key/value heads.
    pub kv_heads: usize,
    /// How `q_proj`, `k_proj`, `v_proj` and `o_proj` compute at inference (no parameters).
    #[module(skip)]
    int8: [QuantSlot; 4],
}

/// `down(silu(gate(x)) * up(x))`.
#[derive(Module, Debug)]
pub struct SwiGlu {
    /// Gate projection.
    pub gate_proj: Linear,
    /// Up projection.
    pub up_proj: Linear,
    /// Down projection.
    pub down_proj: Linear,
    /// How `gate_proj`, `up_proj` and `down_proj` compute at inference (no parameters).
    #[module(skip)]
    int8: [QuantSlot; 3],
}

impl DecoderModel {
    /// Computes every layer's seven linear layers with `products` on the CPU, their int8 /
    /// bf16 inference weights prepared now. Embeddings and norms stay `f32`.
    pub(crate) fn set_products(&mut self, products: Products) {
        for layer in &mut self.layers {
            let a = &mut layer.self_attn;
            for (slot, l) in a
                .int8
                .iter_mut()
                .zip([&a.q_proj, &a.k_proj, &a.v_proj, &a.o_proj])
            {
                slot.set(products, l);
            }
            let m = &mut layer.mlp;
            for (slot, l) in m
                .int8
                .iter_mut()
                .zip([&m.gate_proj, &m.up_proj, &m.down_proj])
            {
                slot.set(products, l);
            }
        }
    }

    /// Last-layer hidden states `[B, L, d]` (after the final norm) of a left-padded batch.
    pub fn forward(&self, input: &BackboneInput) -> Tensor<3> {
        let [_, l] = input.input_ids.dims();
        let device = input.input_ids.device();
        let inv = inverse_frequencies(self.head_dim, self.theta, self.rope_scaling.as_ref());
        let rope = RopeTables::from_frequencies(l, &inv, &device);
        let mask = key_padding_mask(input.padding.clone());
        let mut x = self.embed_tokens.forward(input.input_ids.clone());
        for layer in &self.layers {
            let a = &layer.self_attn;
            let [q8, k8, v8, o8] = &a.int8;
            let h = layer.input_layernorm.forward(x.clone());
            let q = rope.apply(split_heads(linear_q(&a.q_proj, q8, h.clone()), a.heads));
            let k = rope.apply(split_heads(linear_q(&a.k_proj, k8, h.clone()), a.kv_heads));
            let v = split_heads(linear_q(&a.v_proj, v8, h), a.kv_heads);
            let ctx = merge_heads(attention(q, k, v, mask.clone(), true));
            x = x + linear_q(&a.o_proj, o8, ctx);
            let h = layer.post_attention_layernorm.forward(x.clone());
            let m = &layer.mlp;
            let [gate8, up8, down8] = &m.int8;
            let gated =
                silu(linear_q(&m.gate_proj, gate8, h.clone())) * linear_q(&m.up_proj, up8, h);
            x = x + linear_q(&m.down_proj, down8, gated);
        }
        self.norm.forward(x)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The `config.json` files of the paper's decoders as published (Qwen2.5-0.5B and
    /// Llama-3.2-1B, written by transformers 4.x) parse and validate, with their values.
    #[test]
    fn published_decoder_configs_parse() {
        let qwen: DecoderConfig = serde_json::from_str(
            r#"{"architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0,
            "bos_token_id": 151643, "eos_token_id": 151643, "hidden_act": "silu",
            "hidden_size": 896, "initializer_range": 0.02, "intermediate_size": 4864,
            "max_position_embeddings": 32768, "max_window_layers": 24, "model_type": "qwen2",
            "num_attention_heads": 14, "num_hidden_layers": 24, "num_key_value_heads": 2,
            "rms_norm_eps": 1e-06, "rope_scaling": null, "rope_theta": 1000000.0,
            "sliding_window": 32768, "tie_word_embeddings": true, "torch_dtype": "bfloat16",
            "transformers_version": "4.40.1", "use_cache": true, "use_sliding_window": false,
            "vocab_size": 151936}"#,
        )
        .unwrap();
        let path = Path::new("config.json");
        qwen.validate(path).unwrap();
        assert_eq!((qwen.kv_heads(), qwen.head_width()), (2, 64));
        assert_eq!(qwen.theta(), 1_000_000.0);
        assert_eq!(qwen.llama3_rope_scaling(path).unwrap(), None);

        let llama: DecoderConfig = serde_json::from_str(
            r#"{"architectures": ["LlamaForCausalLM"], "attention_bias": false,
            "attention_dropout": 0.0, "bos_token_id": 128000, "eos_token_id": 128001,
            "head_dim": 64, "hidden_act": "silu", "hidden_size": 2048,
            "initializer_range": 0.02, "intermediate_size": 8192,
            "max_position_embeddings": 131072, "mlp_bias": false, "model_type": "llama",
            "num_attention_heads": 32, "num_hidden_layers": 16, "num_key_value_heads": 8,
            "pretraining_tp": 1, "rms_norm_eps": 1e-05,
            "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                "original_max_position_embeddings": 8192, "rope_type": "llama3"},
            "rope_theta": 500000.0, "tie_word_embeddings": true, "torch_dtype": "bfloat16",
            "transformers_version": "4.45.0.dev0", "use_cache": true, "vocab_size": 128256}"#,
        )
        .unwrap();
        llama.validate(path).unwrap();
        assert_eq!(llama.theta(), 500_000.0);
        assert_eq!(
            llama.llama3_rope_scaling(path).unwrap(),
            Some(Llama3RopeScaling {
                factor: 32.0,
                low_freq_factor: 1.0,
                high_freq_factor: 4.0,
                original_max_position_embeddings: 8192.0,
            })
        );
    }
}
