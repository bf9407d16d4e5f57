//! The BERT family backbone (BERT, MiniLM, e5, bge, gte): absolute position embeddings,
//! post-norm transformer layers with exact (erf) GELU.

use std::path::Path;

use burn::nn::{
    Dropout, DropoutConfig, Embedding, EmbeddingConfig, LayerNorm, LayerNormConfig, Linear,
    LinearConfig,
};
use burn::prelude::*;
use serde::{Deserialize, Serialize};

use super::input::BackboneInput;
use crate::error::{Error, Result};
use crate::ops::{
    self, FusedQkv, Products, QuantSlot, dropout, dropout_add_layer_norm, layer_norm,
    linear_gelu_q, linear_q,
};
use crate::weights;

/// Hyper-parameters of a BERT checkpoint, as in its Hugging Face `config.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct BertConfig {
    /// Vocabulary size.
    pub vocab_size: usize,
    /// Width of the hidden states.
    pub hidden_size: usize,
    /// Number of transformer layers.
    pub num_hidden_layers: usize,
    /// Number of attention heads (must divide `hidden_size`).
    pub num_attention_heads: usize,
    /// Width of the feed-forward layer.
    pub intermediate_size: usize,
    /// Activation of the feed-forward layer (only `gelu`, the exact erf form, is supported).
    #[serde(default = "default_act")]
    pub hidden_act: String,
    /// Number of position embeddings (the longest input).
    pub max_position_embeddings: usize,
    /// Number of token types (segments).
    #[serde(default = "default_type_vocab")]
    pub type_vocab_size: usize,
    /// Epsilon of every LayerNorm (1e-12 for BERT).
    #[serde(default = "default_eps")]
    pub layer_norm_eps: f64,
    /// Id of the padding token.
    #[serde(default)]
    pub pad_token_id: Option<u32>,
    /// Dropout on hidden states (training only).
    #[serde(default)]
    pub hidden_dropout_prob: f64,
    /// Dropout on attention probabilities (training only; 0 when absent from `config.json`).
    #[serde(default)]
    pub attention_probs_dropout_prob: f64,
    /// Position embedding kind; only `absolute` is supported.
    #[serde(default = "default_pos")]
    pub position_embedding_type: String,
}

fn default_act() -> String {
    "gelu".into()
}
fn default_type_vocab() -> usize {
    2
}
fn default_eps() -> f64 {
    1e-12
}
fn default_pos() -> String {
    "absolute".into()
}

impl BertConfig {
    /// Rejects configurations this implementation cannot run, naming the field.
    pub(crate) fn validate(&self, path: &Path) -> Result<()> {
        if self.hidden_act != "gelu" {
            return Err(Error::config(
                path,
                "hidden_act",
                format!("`{}` is not supported (only `gelu`)", self.hidden_act),
            ));
        }
        if self.position_embedding_type != "absolute" {
            return Err(Error::config(
                path,
                "position_embedding_type",
                format!(
                    "`{}` is not supported (only `absolute`)",
                    self.position_embedding_type
                ),
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
        Ok(())
    }

    /// A randomly initialized model of this shape (`with_pooler` adds the pooler dense layer).
    pub fn init(&self, with_pooler: bool, device: &Device) -> BertModel {
        let d = self.hidden_size;
        let ln = || {
            LayerNormConfig::new(d)
                .with_epsilon(self.layer_norm_eps)
                .init(device)
        };
        let drop = || DropoutConfig::new(self.hidden_dropout_prob).init();
        let lin = |i, o| LinearConfig::new(i, o).init(device);
        BertModel {
            embeddings: BertEmbeddings {
                word_embeddings: EmbeddingConfig::new(self.vocab_size, d).init(device),
                position_embeddings: EmbeddingConfig::new(self.max_position_embeddings, d)
                    .init(device),
                token_type_embeddings: EmbeddingConfig::new(self.type_vocab_size, d).init(device),
                layer_norm: ln(),
                dropout: drop(),
            },
            encoder: BertEncoder {
                layer: (0..self.num_hidden_layers)
                    .map(|_| BertLayer {
                        attention: BertAttention {
                            self_attn: BertSelfAttention {
                                query: lin(d, d),
                                key: lin(d, d),
                                value: lin(d, d),
                                heads: self.num_attention_heads,
                                dropout: DropoutConfig::new(self.attention_probs_dropout_prob)
                                    .init(),
                                fused: FusedQkv::default(),
                            },
                            output: BertResidualOutput {
                                dense: lin(d, d),
                                layer_norm: ln(),
                                dropout: drop(),
                                dense_int8: QuantSlot::default(),
                            },
                        },
                        intermediate: BertIntermediate {
                            dense: lin(d, self.intermediate_size),
                            dense_int8: QuantSlot::default(),
                        },
                        output: BertResidualOutput {
                            dense: lin(self.intermediate_size, d),
                            layer_norm: ln(),
                            dropout: drop(),
                            dense_int8: QuantSlot::default(),
                        },
                    })
                    .collect(),
            },
            pooler: with_pooler.then(|| BertPooler { dense: lin(d, d) }),
            layer_norm_eps: self.layer_norm_eps,
        }
    }

    /// Builds the model and loads the weights in `dir` (keys with or without the
    /// `bert.` prefix of task heads are accepted).
    pub fn load(&self, dir: &Path, device: &Device) -> Result<BertModel> {
        let names = weights::checkpoint_tensor_names(dir)?;
        let prefixed = names.iter().any(|n| n.starts_with("bert."));
        let with_pooler = names
            .iter()
            .any(|n| n == "pooler.dense.weight" || n == "bert.pooler.dense.weight");
        let mut model = self.init(with_pooler, device);
        let mut remaps: Vec<(&str, &str)> = LOAD_REMAPS.to_vec();
        if prefixed {
            remaps.insert(0, (r"^bert\.", ""));
        }
        weights::load_checkpoint(&mut model, dir, &remaps)?;
        Ok(model)
    }
}

/// File key -> module path rewrites.
const LOAD_REMAPS: [(&str, &str); 2] = [
    (r"\.LayerNorm\.", ".layer_norm."),
    (r"\.attention\.self\.", ".attention.self_attn."),
];
/// Module path -> file key rewrites (inverse of [`LOAD_REMAPS`]).
pub(crate) const SAVE_REMAPS: [(&str, &str); 2] = [
    (r"\.layer_norm\.", ".LayerNorm."),
    (r"\.attention\.self_attn\.", ".attention.self."),
];

/// A BERT encoder (no task head). Field names follow the Hugging Face keys.
#[derive(Module, Debug)]
pub struct BertModel {
    /// Token, position and token-type embeddings.
    pub embeddings: BertEmbeddings,
    /// The transformer layers.
    pub encoder: BertEncoder,
    /// The pooler (tanh dense on the CLS state); kept only so saving preserves it, unused by
    /// the sentence-embedding poolings.
    pub pooler: Option<BertPooler>,
    /// The LayerNorms' epsilon (burn's `LayerNorm` keeps its own private; the fused training
    /// LayerNorm of `ops` needs the value).
    pub layer_norm_eps: f64,
}

/// BERT's embedding block.
#[derive(Module, Debug)]
pub struct BertEmbeddings {
    /// Word-piece embeddings `[vocab, d]`.
    pub word_embeddings: Embedding,
    /// Absolute position embeddings `[max_positions, d]`.
    pub position_embeddings: Embedding,
    /// Segment embeddings `[type_vocab, d]`.
    pub token_type_embeddings: Embedding,
    /// LayerNorm after the sum.
    pub layer_norm: LayerNorm,
    /// Dropout (training only).
    pub dropout: Dropout,
}

/// The stack of layers.
#[derive(Module, Debug)]
pub struct BertEncoder {
    /// The layers, in order.
    pub layer: Vec<BertLayer>,
}

/// One post-norm transformer layer.
#[derive(Module, Debug)]
pub struct BertLayer {
    /// Self-attention with its residual output block.
    pub attention: BertAttention,
    /// First feed-forward projection.
    pub intermediate: BertIntermediate,
    /// Second feed-forward projection with residual and LayerNorm.
    pub output: BertResidualOutput,
}

/// Self-attention and its output projection.
#[derive(Module, Debug)]
pub struct BertAttention {
    /// Query/key/value projections (`attention.self` in Hugging Face keys).
    pub self_attn: BertSelfAttention,
    /// Output projection, residual, LayerNorm.
    pub output: BertResidualOutput,
}

/// Query, key and value projections.
#[derive(Module, Debug)]
pub struct BertSelfAttention {
    /// Query projection.
    pub query: Linear,
    /// Key projection.
    pub key: Linear,
    /// Value projection.
    pub value: Linear,
    /// Number of heads.
    pub heads: usize,
    /// Dropout on the attention probabilities (training only).
    pub dropout: Dropout,
    /// The three projections prepared once for the inference kernel (no parameters).
    #[module(skip)]
    fused: FusedQkv,
}

impl BertSelfAttention {
    /// The context of the packed rows `x` (`[T, d]`): [`ops::self_attention`].
    fn forward(&self, x: &Tensor<2>, packing: &ops::Packing) -> Tensor<2> {
        ops::self_attention(
            [&self.query, &self.key, &self.value],
            self.heads,
            &self.dropout,
            &self.fused,
            x,
            packing,
        )
    }
}

/// `LayerNorm(dropout(dense(x)) + residual)`.
#[derive(Module, Debug)]
pub struct BertResidualOutput {
    /// Projection.
    pub dense: Linear,
    /// LayerNorm.
    pub layer_norm: LayerNorm,
    /// Dropout (training only).
    pub dropout: Dropout,
    /// How `dense` computes at inference (no parameters).
    #[module(skip)]
    dense_int8: QuantSlot,
}

/// Feed-forward expansion with GELU.
#[derive(Module, Debug)]
pub struct BertIntermediate {
    /// Projection to the intermediate width.
    pub dense: Linear,
    /// How `dense` computes at inference (no parameters).
    #[module(skip)]
    dense_int8: QuantSlot,
}

/// BERT's pooler head.
#[derive(Module, Debug)]
pub struct BertPooler {
    /// Dense layer applied to the CLS state.
    pub dense: Linear,
}

impl BertResidualOutput {
    fn forward<const D: usize>(&self, x: Tensor<D>, residual: Tensor<D>, eps: f64) -> Tensor<D> {
        let x = linear_q(&self.dense, &self.dense_int8, x);
        dropout_add_layer_norm(&self.dropout, &self.layer_norm, eps, x, residual)
    }
}

impl BertModel {
    /// Computes the linear layers of every transformer layer (query, key, value, attention
    /// output, both feed-forward projections) with `products` on the CPU, their int8 / bf16
    /// inference weights prepared now. The embeddings and the pooler stay `f32`.
    pub(crate) fn set_products(&mut self, products: Products) {
        for layer in &mut self.encoder.layer {
            let a = &mut layer.attention.self_attn;
            a.fused.set_products(products, [&a.query, &a.key, &a.value]);
            let o = &mut layer.attention.output;
            o.dense_int8.set(products, &o.dense);
            let i = &mut layer.intermediate;
            i.dense_int8.set(products, &i.dense);
            let o = &mut layer.output;
            o.dense_int8.set(products, &o.dense);
        }
    }

    /// Hidden states of the last layer, `[B, L, d]`, zeros on padding positions.
    ///
    /// The batch runs packed: only its real tokens, stacked as `[T, d]` rows, go through the
    /// layers, and each attends to the real tokens of its own row, so the states of real tokens do not
    /// depend on how much padding the batch holds. The layout comes with the input (built on
    /// the host from the tokenizer's padding).
    pub fn forward(&self, input: &BackboneInput) -> Tensor<3> {
        let [b, l] = input.input_ids.dims();
        let device = input.input_ids.device();
        let d = self.embeddings.word_embeddings.weight.dims()[1];
        let packing = &input.packing;
        if packing.len() == 0 {
            return Tensor::zeros([b, l, d], &device);
        }
        let e = &self.embeddings;
        let (words, types) = packing.token_rows(&input.input_ids, &input.token_type_ids);
        let x = ops::embedding(&e.word_embeddings, &words)
            + ops::embedding(&e.position_embeddings, packing.position_rows())
            + ops::embedding(&e.token_type_embeddings, &types);
        let eps = self.layer_norm_eps;
        let mut x = dropout(&e.dropout, layer_norm(&e.layer_norm, eps, x));
        for layer in &self.encoder.layer {
            let ctx = layer.attention.self_attn.forward(&x, packing);
            let h = layer.attention.output.forward(ctx, x, eps);
            let inter = &layer.intermediate;
            let inner = linear_gelu_q(&inter.dense, &inter.dense_int8, h.clone());
            x = layer.output.forward(inner, h, eps);
        }
        packing.unpack(x)
    }
}
