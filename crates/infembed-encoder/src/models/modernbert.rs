//! ModernBERT: pre-norm encoder with rotary embeddings, bias-free LayerNorms, a GeGLU
//! feed-forward and alternating global / local (sliding-window) attention.

use std::path::Path;

use burn::nn::{Embedding, EmbeddingConfig, LayerNorm, LayerNormConfig, Linear, LinearConfig};
use burn::prelude::*;
use serde::{Deserialize, Serialize};

use super::input::BackboneInput;
use super::rope::RopeTables;
use crate::error::{Error, Result};
use crate::ops::Products;
use crate::ops::{
    QuantSlot, attention, gelu, key_padding_mask, linear_q, merge_heads, split_heads,
};
use crate::weights;

/// Hyper-parameters of a ModernBERT checkpoint (`config.json`, either the original field
/// names `global_attn_every_n_layers` / `global_rope_theta` / `local_rope_theta` or the
/// newer `layer_types` / `rope_parameters`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct ModernBertConfig {
    /// Vocabulary size.
    pub vocab_size: usize,
    /// Width of the hidden states.
    pub hidden_size: usize,
    /// Width of the GeGLU layer (the input projection is twice this).
    pub intermediate_size: usize,
    /// Number of layers.
    pub num_hidden_layers: usize,
    /// Number of heads.
    pub num_attention_heads: usize,
    /// Longest supported input.
    #[serde(default = "default_max_pos")]
    pub max_position_embeddings: usize,
    /// LayerNorm epsilon.
    #[serde(default = "default_eps")]
    pub norm_eps: f64,
    /// Whether LayerNorms have a bias.
    #[serde(default)]
    pub norm_bias: bool,
    /// Whether attention projections have biases.
    #[serde(default)]
    pub attention_bias: bool,
    /// Whether feed-forward projections have biases.
    #[serde(default)]
    pub mlp_bias: bool,
    /// Total local attention window (a token sees `local_attention / 2` on each side).
    #[serde(default = "default_local")]
    pub local_attention: usize,
    /// Every n-th layer (from layer 0) is global, the others local.
    #[serde(default = "default_every")]
    pub global_attn_every_n_layers: usize,
    /// Per-layer `full_attention` / `sliding_attention` (overrides the above when given).
    #[serde(default)]
    pub layer_types: Option<Vec<String>>,
    /// Rotary base of global layers.
    #[serde(default)]
    pub global_rope_theta: Option<f64>,
    /// Rotary base of local layers.
    #[serde(default)]
    pub local_rope_theta: Option<f64>,
    /// Newer style rotary parameters per layer type.
    #[serde(default)]
    pub rope_parameters: Option<serde_json::Value>,
    /// Activation (only `gelu`, exact).
    #[serde(default = "default_act")]
    pub hidden_activation: String,
    /// Padding id.
    #[serde(default)]
    pub pad_token_id: Option<u32>,
}

fn default_max_pos() -> usize {
    8192
}
fn default_eps() -> f64 {
    1e-5
}
fn default_local() -> usize {
    128
}
fn default_every() -> usize {
    3
}
fn default_act() -> String {
    "gelu".into()
}

impl ModernBertConfig {
    /// Whether layer `i` attends globally.
    pub fn is_global(&self, i: usize) -> bool {
        match &self.layer_types {
            Some(t) => t.get(i).is_none_or(|s| s == "full_attention"),
            None => i.is_multiple_of(self.global_attn_every_n_layers.max(1)),
        }
    }

    fn theta(&self, global: bool) -> f64 {
        let key = if global {
            "full_attention"
        } else {
            "sliding_attention"
        };
        self.rope_parameters
            .as_ref()
            .and_then(|v| v.get(key))
            .and_then(|v| v.get("rope_theta"))
            .and_then(serde_json::Value::as_f64)
            .or(if global {
                self.global_rope_theta
            } else {
                self.local_rope_theta
            })
            .unwrap_or(if global { 160_000.0 } else { 10_000.0 })
    }

    pub(crate) fn validate(&self, path: &Path) -> Result<()> {
        if self.hidden_activation != "gelu" {
            return Err(Error::config(
                path,
                "hidden_activation",
                "only `gelu` is supported",
            ));
        }
        if self.num_attention_heads == 0
            || !self.hidden_size.is_multiple_of(self.num_attention_heads)
        {
            return Err(Error::config(
                path,
                "num_attention_heads",
                "must be positive and divide hidden_size",
            ));
        }
        if let Some(t) = &self.layer_types {
            if t.len() != self.num_hidden_layers {
                return Err(Error::config(path, "layer_types", "one entry per layer"));
            }
            if let Some(bad) = t
                .iter()
                .find(|s| *s != "full_attention" && *s != "sliding_attention")
            {
                return Err(Error::config(
                    path,
                    "layer_types",
                    format!("unknown layer type `{bad}`"),
                ));
            }
        }
        Ok(())
    }

    /// A randomly initialized model of this shape.
    pub fn init(&self, device: &Device) -> ModernBertModel {
        let d = self.hidden_size;
        let ln = || {
            LayerNormConfig::new(d)
                .with_epsilon(self.norm_eps)
                .with_bias(self.norm_bias)
                .init(device)
        };
        let lin = |i, o, b| LinearConfig::new(i, o).with_bias(b).init(device);
        ModernBertModel {
            embeddings: ModernBertEmbeddings {
                tok_embeddings: EmbeddingConfig::new(self.vocab_size, d).init(device),
                norm: ln(),
            },
            layers: (0..self.num_hidden_layers)
                .map(|i| {
                    let global = self.is_global(i);
                    ModernBertLayer {
                        attn_norm: (i > 0).then(ln),
                        attn: ModernBertAttention {
                            wqkv: lin(d, 3 * d, self.attention_bias),
                            wo: lin(d, d, self.attention_bias),
                            heads: self.num_attention_heads,
                            window: if global { 0 } else { self.local_attention / 2 },
                            theta: self.theta(global),
                            wqkv_int8: QuantSlot::default(),
                            wo_int8: QuantSlot::default(),
                        },
                        mlp_norm: ln(),
                        mlp: ModernBertMlp {
                            wi: lin(d, 2 * self.intermediate_size, self.mlp_bias),
                            wo: lin(self.intermediate_size, d, self.mlp_bias),
                            wi_int8: QuantSlot::default(),
                            wo_int8: QuantSlot::default(),
                        },
                    }
                })
                .collect(),
            final_norm: ln(),
        }
    }

    /// Builds the model and loads `dir`'s weights (with or without the `model.`
    /// prefix of task heads).
    pub fn load(&self, dir: &Path, device: &Device) -> Result<ModernBertModel> {
        let names = weights::checkpoint_tensor_names(dir)?;
        let mut model = self.init(device);
        let mut remaps: Vec<(&str, &str)> = LOAD_REMAPS.to_vec();
        if names.iter().any(|n| n.starts_with("model.")) {
            remaps.insert(0, (r"^model\.", ""));
        }
        weights::load_checkpoint(&mut model, dir, &remaps)?;
        Ok(model)
    }
}

const LOAD_REMAPS: [(&str, &str); 3] = [
    (r"\.Wqkv\.", ".wqkv."),
    (r"\.Wi\.", ".wi."),
    (r"\.Wo\.", ".wo."),
];
/// Module path -> file key rewrites.
pub(crate) const SAVE_REMAPS: [(&str, &str); 3] = [
    (r"\.wqkv\.", ".Wqkv."),
    (r"\.wi\.", ".Wi."),
    (r"\.wo\.", ".Wo."),
];

/// A ModernBERT encoder (no task head); field names follow Hugging Face keys.
#[derive(Module, Debug)]
pub struct ModernBertModel {
    /// Token embeddings and their norm.
    pub embeddings: ModernBertEmbeddings,
    /// The layers.
    pub layers: Vec<ModernBertLayer>,
    /// Norm after the last layer.
    pub final_norm: LayerNorm,
}

/// Token embeddings followed by a LayerNorm (no position embeddings: rotary).
#[derive(Module, Debug)]
pub struct ModernBertEmbeddings {
    /// Token embeddings.
    pub tok_embeddings: Embedding,
    /// LayerNorm.
    pub norm: LayerNorm,
}

/// One pre-norm layer.
#[derive(Module, Debug)]
pub struct ModernBertLayer {
    /// Norm before attention (absent, i.e. identity, in layer 0).
    pub attn_norm: Option<LayerNorm>,
    /// Attention.
    pub attn: ModernBertAttention,
    /// Norm before the feed-forward.
    pub mlp_norm: LayerNorm,
    /// GeGLU feed-forward.
    pub mlp: ModernBertMlp,
}

/// Fused-QKV attention with rotary embeddings.
#[derive(Module, Debug)]
pub struct ModernBertAttention {
    /// Fused query/key/value projection `d -> 3d`.
    pub wqkv: Linear,
    /// Output projection.
    pub wo: Linear,
    /// Number of heads.
    pub heads: usize,
    /// Half window of local attention (0 = global).
    pub window: usize,
    /// Rotary base.
    pub theta: f64,
    /// How `wqkv` computes at inference (no parameters).
    #[module(skip)]
    wqkv_int8: QuantSlot,
    /// How `wo` computes at inference (no parameters).
    #[module(skip)]
    wo_int8: QuantSlot,
}

/// `Wo(gelu(input) * gate)` with `input, gate = Wi(x).chunk(2)`.
#[derive(Module, Debug)]
pub struct ModernBertMlp {
    /// Input projection `d -> 2 * intermediate`.
    pub wi: Linear,
    /// Output projection.
    pub wo: Linear,
    /// How `wi` computes at inference (no parameters).
    #[module(skip)]
    wi_int8: QuantSlot,
    /// How `wo` computes at inference (no parameters).
    #[module(skip)]
    wo_int8: QuantSlot,
}

impl ModernBertModel {
    /// Computes every layer's four linear layers with `products` on the CPU, their int8 /
    /// bf16 inference weights prepared now. Embeddings and norms stay `f32`.
    pub(crate) fn set_products(&mut self, products: Products) {
        for layer in &mut self.layers {
            let (a, m) = (&mut layer.attn, &mut layer.mlp);
            a.wqkv_int8.set(products, &a.wqkv);
            a.wo_int8.set(products, &a.wo);
            m.wi_int8.set(products, &m.wi);
            m.wo_int8.set(products, &m.wo);
        }
    }

    /// Last-layer hidden states `[B, L, d]` (after the final norm) of a right-padded batch.
    pub fn forward(&self, input: &BackboneInput) -> Tensor<3> {
        let [_, l] = input.input_ids.dims();
        let device = input.input_ids.device();
        let pad_mask = key_padding_mask(input.padding.clone());
        let mut x = self.embeddings.norm.forward(
            self.embeddings
                .tok_embeddings
                .forward(input.input_ids.clone()),
        );
        let mut tables: Vec<(f64, RopeTables)> = Vec::new();
        for layer in &self.layers {
            let a = &layer.attn;
            let head_dim = x.dims()[2] / a.heads;
            if !tables.iter().any(|(t, _)| *t == a.theta) {
                tables.push((a.theta, RopeTables::new(l, head_dim, a.theta, &device)));
            }
            let rope = &tables.iter().find(|(t, _)| *t == a.theta).expect("made").1;
            let h = match &layer.attn_norm {
                Some(n) => n.forward(x.clone()),
                None => x.clone(),
            };
            let [b, _, d] = h.dims();
            let qkv = linear_q(&a.wqkv, &a.wqkv_int8, h);
            let q = qkv.clone().slice([0..b, 0..l, 0..d]);
            let k = qkv.clone().slice([0..b, 0..l, d..2 * d]);
            let v = qkv.slice([0..b, 0..l, 2 * d..3 * d]);
            let q = rope.apply(split_heads(q, a.heads));
            let k = rope.apply(split_heads(k, a.heads));
            let v = split_heads(v, a.heads);
            let mask = if a.window == 0 {
                pad_mask.clone()
            } else {
                let b = pad_mask.dims()[0];
                window_mask(l, a.window, &device)
                    .expand([b, 1, l, l])
                    .bool_or(pad_mask.clone())
            };
            let ctx = merge_heads(attention(q, k, v, mask, false));
            x = x + linear_q(&a.wo, &a.wo_int8, ctx);
            let h = layer.mlp_norm.forward(x.clone());
            let [b, _, _] = h.dims();
            let inter = layer.mlp.wo.weight.dims()[0];
            let m = &layer.mlp;
            let wi = linear_q(&m.wi, &m.wi_int8, h);
            let input_half = wi.clone().slice([0..b, 0..l, 0..inter]);
            let gate = wi.slice([0..b, 0..l, inter..2 * inter]);
            x = x + linear_q(&m.wo, &m.wo_int8, gelu(input_half) * gate);
        }
        self.final_norm.forward(x)
    }
}

/// `[1, 1, L, L]`, `true` where `|q - k| > window` (outside the local window).
fn window_mask(l: usize, window: usize, device: &Device) -> Tensor<4, Bool> {
    let data: Vec<bool> = (0..l * l)
        .map(|idx| (idx / l).abs_diff(idx % l) > window)
        .collect();
    Tensor::from_data(TensorData::new(data, [1, 1, l, l]), device)
}
