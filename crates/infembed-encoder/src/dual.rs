//! [`DualEncoder`]: InF-Embed's passage tower and instruction-aware query tower, and the
//! batch API that produces what the training objectives need ([`BatchEmbeddings`]).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use burn::prelude::*;
use serde::{Deserialize, Serialize};

use crate::config::{SentenceTransformersConfig, Similarity};
use crate::device::{Precision, Quantization};
use crate::encoder::{Embedder, Encoded, ModelDir, TruncationCounter, max_length};
use crate::error::{Error, Result};
use crate::head::{DenseLayer, load_dense, output_width};
use crate::interaction::{
    CrossAttention, CrossAttentionConfig, CrossAttentionKind, combine_tokens, combine_vectors,
};
use crate::models::{ArchitectureConfig, Backbone};
use crate::ops::Products;
use crate::pool::{Pooling, l2_normalize};
use crate::routine::MatmulRoutine;
use crate::tokenize::TextTokenizer;
use infembed_data::QueryTemplate;

/// Whether passages and queries share one backbone.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Towers {
    /// One backbone for passages and instruction-aware queries (the paper's recommendation).
    #[default]
    Shared,
    /// Two backbones loaded from the same checkpoint and trained apart.
    Separate,
}

/// Which instruction-query interaction builds the query embedding.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Interaction {
    /// Interaction I: encode the templated concatenation of instruction and query.
    SelfAttention {
        /// How the two are joined (default `"{query} {instruction}"`); it must contain the
        /// instruction placeholder.
        #[serde(default)]
        template: QueryTemplate,
        /// Instruction negatives K per row when training (drawn by `infembed-train`, which
        /// also documents the rule); `None` follows the reference (3B/2 - 1 for B records,
        /// i.e. N/2 - 1 for N = 3B rows, at least 1).
        #[serde(default)]
        instruction_negatives: Option<usize>,
    },
    /// Interaction II: encode instruction and query apart and combine them.
    CrossAttention(CrossAttentionConfig),
}

impl Default for Interaction {
    fn default() -> Self {
        Self::SelfAttention {
            template: QueryTemplate::default(),
            instruction_negatives: None,
        }
    }
}

/// Configuration of a [`DualEncoder`] (everything beyond the checkpoint itself).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EncoderConfig {
    /// Shared or separate towers.
    #[serde(default)]
    pub towers: Towers,
    /// Interaction I or II.
    #[serde(default)]
    pub interaction: Interaction,
    /// Maximum tokens of a query-side text; `None` takes the checkpoint's `max_seq_length`
    /// (`sentence_bert_config.json`), else 512 (the paper's reference uses 256:
    /// [`with_reference_lengths`](Self::with_reference_lengths)). Capped by the model's
    /// position limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub query_max_length: Option<usize>,
    /// Maximum tokens of a passage; `None` as for queries (the paper's reference: 512).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub passage_max_length: Option<usize>,
    /// Prepended to every query-side text (e.g. e5's `"query: "`); with Interaction I to
    /// the whole rendered template, with Interaction II to the query alone. Empty takes the
    /// checkpoint's sentence-transformers prompt named `query`, if it has one.
    #[serde(default)]
    pub query_prefix: String,
    /// Prepended to every instruction (both interactions).
    #[serde(default)]
    pub instruction_prefix: String,
    /// Prepended to every passage (e.g. e5's `"passage: "`). Empty takes the checkpoint's
    /// sentence-transformers prompt named `document`, `passage` or `corpus`, if it has one.
    #[serde(default)]
    pub passage_prefix: String,
    /// Overrides the checkpoint's pooling.
    #[serde(default)]
    pub pooling: Option<Pooling>,
    /// Texts per forward pass when encoding many texts.
    #[serde(default = "default_batch")]
    pub encode_batch_size: usize,
    /// How the backbone's linear layers compute at inference on the CPU: `"none"` (`f32`,
    /// the default), `"int8"` or `"bf16"` ([`Quantization`]). Inference only: training
    /// rejects it.
    #[serde(default, skip_serializing_if = "Quantization::is_none")]
    pub quantize: Quantization,
}

/// The paper's query maximum length.
pub const REFERENCE_QUERY_MAX_LENGTH: usize = 256;
/// The paper's passage maximum length.
pub const REFERENCE_PASSAGE_MAX_LENGTH: usize = 512;
fn default_batch() -> usize {
    32
}

impl Default for EncoderConfig {
    fn default() -> Self {
        Self {
            towers: Towers::Shared,
            interaction: Interaction::default(),
            query_max_length: None,
            passage_max_length: None,
            query_prefix: String::new(),
            instruction_prefix: String::new(),
            passage_prefix: String::new(),
            pooling: None,
            encode_batch_size: default_batch(),
            quantize: Quantization::None,
        }
    }
}

impl EncoderConfig {
    /// The same config with the paper's maximum lengths: 256 query tokens, 512 passage
    /// tokens (explicit values, which win over the checkpoint's `max_seq_length`).
    pub fn with_reference_lengths(mut self) -> Self {
        self.query_max_length = Some(REFERENCE_QUERY_MAX_LENGTH);
        self.passage_max_length = Some(REFERENCE_PASSAGE_MAX_LENGTH);
        self
    }

    /// Reads a JSON config file (unknown fields are errors naming the line).
    pub fn from_file(path: &Path) -> Result<Self> {
        let cfg: Self = crate::config::read_json(path, "encoder config")?;
        cfg.validate(path)?;
        Ok(cfg)
    }

    fn validate(&self, path: &Path) -> Result<()> {
        for (field, v) in [
            ("query_max_length", self.query_max_length.unwrap_or(1)),
            ("passage_max_length", self.passage_max_length.unwrap_or(1)),
            ("encode_batch_size", self.encode_batch_size),
        ] {
            if v == 0 {
                return Err(Error::config(path, field, "must be positive"));
            }
        }
        if let Interaction::SelfAttention {
            template,
            instruction_negatives,
        } = &self.interaction
        {
            if *instruction_negatives == Some(0) {
                return Err(Error::config(
                    path,
                    "interaction.instruction_negatives",
                    "must be positive",
                ));
            }
            if !template.has_instruction() {
                return Err(Error::config(
                    path,
                    "interaction.template",
                    "must contain {instruction} (Interaction I joins an instruction and a query)",
                ));
            }
        }
        Ok(())
    }
}

/// The trainable part of a [`DualEncoder`]: the backbones and the Interaction II weights.
#[derive(Module, Debug)]
pub struct DualEncoderModel {
    /// Encodes queries, instructions and (when shared) passages.
    pub query_tower: Backbone,
    /// Encodes passages when the towers are separate.
    pub passage_tower: Option<Backbone>,
    /// `W_i, W_q1, W_q2` of a learnable Interaction II.
    pub cross: Option<CrossAttention>,
    /// The checkpoint's sentence-transformers `Dense` modules after pooling (usually none),
    /// shared by both towers and trained with them.
    pub dense: Vec<DenseLayer>,
}

/// One flattened training row: an instruction, a query and a passage.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchRow<'a> {
    /// The instruction.
    pub instruction: &'a str,
    /// The query.
    pub query: &'a str,
    /// The passage.
    pub passage: &'a str,
}

/// What the objectives need for a batch of N rows; every embedding is L2-normalized.
#[derive(Debug, Clone)]
pub struct BatchEmbeddings {
    /// Passage embeddings `[N, d]`.
    pub p: Tensor<2>,
    /// Row i's own instruction with row i's query, `[N, d]`.
    pub iq: Tensor<2>,
    /// Row i's query with the instructions of rows `instruction_rows[i]`, `[N, K, d]`.
    pub iq_instr: Tensor<3>,
    /// For each row, the K rows whose instructions were combined with its query.
    pub instruction_rows: Vec<Vec<usize>>,
    /// Distinct texts that went through a backbone (after deduplication).
    pub texts_encoded: usize,
    /// Texts cut at their maximum length.
    pub truncated: usize,
}

/// InF-Embed's dual encoder: tokenizer, towers, pooling and instruction-query interaction.
///
/// It is the weights ([`DualEncoderModel`], the only part that training changes) plus an
/// immutable context shared behind an [`Arc`] (tokenizer, configuration with its template and
/// prefixes, the checkpoint's settings, pooling, source directory). Swapping the weights
/// ([`set_model`](Self::set_model), [`with_model`](Self::with_model)) and cloning the encoder
/// copy no tokenizer.
#[derive(Debug, Clone)]
pub struct DualEncoder {
    model: DualEncoderModel,
    context: Arc<EncoderContext>,
    device: Device,
    truncations: TruncationCounter,
    /// How the towers' linear products compute on the CPU (inference and training).
    products: Products,
}

/// Why bf16 products or training are refused on this processor (`needs`: "bf16 ... need(s)"),
/// ending with `instead`: the one wording of the missing AVX512-BF16.
fn no_bf16(needs: &str, instead: &str) -> String {
    format!(
        "{needs} a processor with AVX512-BF16 (AMD Zen 4 and later, Intel Cooper Lake / \
         Sapphire Rapids and later); this one has none (its int8 kernels: {}); {instead}",
        crate::cpu::qgemm::Isa::detect().name(),
    )
}

/// What a [`DualEncoder`] reads but never changes.
#[derive(Debug, Clone)]
struct EncoderContext {
    tokenizer: TextTokenizer,
    config: EncoderConfig,
    arch: ArchitectureConfig,
    st_config: SentenceTransformersConfig,
    pooling: Pooling,
    source_dir: PathBuf,
    /// Whether `encode_passages` / `encode_queries` return unit vectors.
    unit_vectors: bool,
    /// How two embeddings are compared.
    similarity: Similarity,
    /// Texts per forward pass on an autodiff device, when not `config.encode_batch_size`
    /// ([`DualEncoder::set_training_pass_texts`]; not saved with the model).
    training_pass_texts: Option<usize>,
}

/// Whether a checkpoint's pipeline under `config` gives unit vectors: its own rule
/// ([`SentenceTransformersConfig::unit_vectors`]), and always for Interaction II (whose
/// combination normalizes).
fn gives_unit_vectors(st: &SentenceTransformersConfig, config: &EncoderConfig) -> bool {
    st.unit_vectors() || matches!(config.interaction, Interaction::CrossAttention(_))
}

/// The config with what the checkpoint supplies for what it leaves unset: the prefixes from
/// the sentence-transformers prompts.
fn resolve_prompts(mut config: EncoderConfig, st: &SentenceTransformersConfig) -> EncoderConfig {
    // sentence-transformers' `encode_query` / `encode_document` fall back to the default
    // prompt when the model has no prompt of their name.
    let default = st
        .default_prompt_name
        .as_ref()
        .and_then(|n| st.prompts.get(n));
    if config.query_prefix.is_empty()
        && let Some(p) = st.prompts.get(QUERY_PROMPT).or(default)
    {
        config.query_prefix = p.clone();
    }
    if config.passage_prefix.is_empty()
        && let Some(p) = PASSAGE_PROMPTS
            .iter()
            .find_map(|n| st.prompts.get(*n))
            .or(default)
    {
        config.passage_prefix = p.clone();
    }
    config
}

/// The sentence-transformers prompt name of queries (`encode_query`).
pub const QUERY_PROMPT: &str = "query";
/// The prompt names sentence-transformers' `encode_document` tries, in its order.
pub const PASSAGE_PROMPTS: [&str; 3] = ["document", "passage", "corpus"];

impl DualEncoder {
    /// Loads a checkpoint directory (see [`TextEncoder::from_dir`](crate::TextEncoder::from_dir)
    /// for the files) with `config`. Separate towers load the weights twice so that their
    /// parameters are distinct.
    pub fn from_dir(dir: impl AsRef<Path>, config: EncoderConfig, device: &Device) -> Result<Self> {
        let dir = dir.as_ref();
        config.validate(Path::new("<EncoderConfig>"))?;
        let ModelDir {
            arch,
            st_config,
            tokenizer,
        } = ModelDir::read(dir)?;
        let config = resolve_prompts(config, &st_config);
        if !st_config.dense.is_empty()
            && matches!(config.interaction, Interaction::CrossAttention(_))
        {
            return Err(Error::config(
                dir.join("modules.json"),
                "Dense",
                "Interaction II combines the backbone's states, so a checkpoint with Dense \
                 modules needs Interaction I",
            ));
        }
        let dense = load_dense(&st_config.dense, arch.hidden_size(), device)?;
        let query_tower = Backbone::load(&arch, dir, device)?;
        let passage_tower = match config.towers {
            Towers::Shared => None,
            Towers::Separate => Some(Backbone::load(&arch, dir, device)?),
        };
        let cross = match &config.interaction {
            Interaction::CrossAttention(CrossAttentionConfig {
                learnable: true, ..
            }) => Some(CrossAttention::identity(arch.hidden_size(), device)),
            _ => None,
        };
        let pooling = config
            .pooling
            .or(st_config.pooling)
            .unwrap_or_else(|| arch.default_pooling());
        let quantize = config.quantize;
        let mut encoder = Self {
            model: DualEncoderModel {
                query_tower,
                passage_tower,
                cross,
                dense,
            },
            context: Arc::new(EncoderContext {
                tokenizer,
                unit_vectors: gives_unit_vectors(&st_config, &config),
                similarity: st_config.similarity.unwrap_or_default(),
                config,
                arch,
                st_config,
                pooling,
                source_dir: dir.to_path_buf(),
                training_pass_texts: None,
            }),
            device: device.clone(),
            truncations: TruncationCounter::default(),
            products: Products::default(),
        };
        if !quantize.is_none() {
            encoder.set_quantization(quantize)?;
        }
        Ok(encoder)
    }

    /// The device of the weights.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// Computes the towers' linear layers with `quantization` from now on ([`Quantization`];
    /// the int8 or bf16 weights are prepared now), and records it in [`config`](Self::config).
    ///
    /// # Errors
    /// [`Error::Device`] for int8 or bf16 on a device other than the CPU (`flex`): these
    /// kernels are CPU kernels, and a GPU keeps its own float type (`--dtype`); and for bf16
    /// on a processor without AVX512-BF16 (named in the message with what it has).
    pub fn set_quantization(&mut self, quantization: Quantization) -> Result<()> {
        if !quantization.is_none() && !crate::cpu::is_plain_flex(&self.device) {
            return Err(Error::Device {
                device: format!("{:?}", self.device),
                problem: format!(
                    "{quantization} products run on the CPU (`flex`) device at inference; \
                     a GPU computes in its float type (--dtype bf16 / f16)"
                ),
            });
        }
        let kernels = match quantization {
            Quantization::Int8 => Some(crate::cpu::qgemm::Isa::detect()),
            Quantization::Bf16 => match crate::cpu::qgemm::Isa::bf16() {
                Some(isa) => Some(isa),
                None => {
                    return Err(Error::Device {
                        device: "cpu".into(),
                        problem: no_bf16("bf16 products need", "use --quantize int8 or none"),
                    });
                }
            },
            _ => None,
        };
        self.products.inference = quantization;
        self.apply_products();
        if let Some(isa) = kernels {
            log::info!("{quantization} inference: {} kernels", isa.name());
        }
        Arc::make_mut(&mut self.context).config.quantize = quantization;
        Ok(())
    }

    /// Computes the towers' linear layers on a GPU device through `routine` from now on
    /// ([`MatmulRoutine`]: this project's blocked kernel, `blocked_split` by default, one of
    /// cubek's, or [`MatmulRoutine::BURN`], burn's own `matmul`; the forward product and, in
    /// training, both backward products). Products that the routine declines are left to burn's
    /// `matmul`. Not recorded in [`config`](Self::config): a saved model loads on any device.
    ///
    /// # Errors
    /// [`Error::Device`] for a routine other than `burn` on a device that is not a cubecl GPU
    /// device (`wgpu`, `vulkan`, `cuda`), or in a build without one or with `fusion`.
    pub fn set_gpu_matmul(&mut self, routine: MatmulRoutine) -> Result<()> {
        if !routine.is_burn() && !crate::ops::routes_on(&self.device) {
            return Err(Error::Device {
                device: format!("{:?}", self.device.clone().inner()),
                problem: format!(
                    "matmul routine {routine} runs on GPU devices (wgpu, vulkan, cuda) of a \
                     build without `fusion`; this device computes its own products (use `burn`)"
                ),
            });
        }
        self.products.gpu_matmul = routine;
        self.apply_products();
        if !routine.is_burn() {
            log::info!("GPU products through the {routine} routine");
        }
        Ok(())
    }

    /// The routine of the towers' products on a GPU device ([`set_gpu_matmul`](Self::set_gpu_matmul)).
    pub fn gpu_matmul(&self) -> MatmulRoutine {
        self.products.gpu_matmul
    }

    /// Encodes `batch_size` texts per forward pass from now on (0 counts as 1) when
    /// encoding many texts, and records it in [`config`](Self::config)
    /// (`encode_batch_size`). The results do not depend on it beyond rounding: texts are
    /// sorted by length and each is padded only to the longest of its batch.
    pub fn set_encode_batch_size(&mut self, batch_size: usize) {
        Arc::make_mut(&mut self.context).config.encode_batch_size = batch_size.max(1);
    }

    /// Encodes `texts` texts per forward pass (0 counts as 1) on an autodiff device, in
    /// training, instead of [`config`](Self::config)'s `encode_batch_size`; `None` goes back
    /// to it. Not recorded in the configuration: a saved model does not carry it, and
    /// inference is not affected. A GPU device trains faster with fewer, larger passes (each
    /// costs the host about 640 kernel launches for all-MiniLM-L6-v2); the trainer keeps the
    /// CPU's passes as they are, so that its dropout draws, and its results, stay the same.
    /// Once set, a shared tower under Interaction I also puts both sides of a batch through
    /// the same passes ([`shares_training_passes`](Self::shares_training_passes)).
    pub fn set_training_pass_texts(&mut self, texts: Option<usize>) {
        let texts = texts.map(|n| n.max(1));
        // unchanged: the shared context (tokenizer included) is not copied
        if self.context.training_pass_texts != texts {
            Arc::make_mut(&mut self.context).training_pass_texts = texts;
        }
    }

    /// Texts per forward pass: the training setting on an autodiff device, else the
    /// configuration's `encode_batch_size`.
    fn pass_texts(&self) -> usize {
        match self.context.training_pass_texts {
            Some(n) if self.device.is_autodiff() => n,
            _ => self.config().encode_batch_size,
        }
    }

    /// Trains the towers' linear layers in `precision` from now on: with `bf16`, mixed
    /// precision on a CPU with AVX512-BF16 (the forward product and both backward products,
    /// `dx = g Wᵀ` and `dW = xᵀ g`, take their operands rounded to bf16 and sum in `f32`; the
    /// parameters, their gradients and the optimizer stay `f32`, and so do attention's score
    /// products, softmax, LayerNorm, GELU, pooling and the loss); with `f32`, plain `f32`
    /// again. Inference (a plain device, dev evaluation during training, the saved model) is
    /// not affected, and the setting is not recorded in [`config`](Self::config).
    ///
    /// # Errors
    /// [`Error::Device`] for `bf16` or `f16` on a device other than the CPU (`flex`; a GPU
    /// trains in `f32`: burn 0.22 has no mixed precision with `f32` master weights), for
    /// `f16` on the CPU (no kernel), and for `bf16` on a processor without AVX512-BF16.
    pub fn set_training_precision(&mut self, precision: Precision) -> Result<()> {
        let on_cpu = self.device.clone().inner() == Device::flex();
        let refuse = |problem: String| {
            Err(Error::Device {
                device: if on_cpu {
                    "cpu".to_string()
                } else {
                    format!("{:?}", self.device.clone().inner())
                },
                problem,
            })
        };
        match precision {
            Precision::F32 => {}
            _ if !on_cpu => {
                return refuse(format!(
                    "training in {precision} is a CPU setting (bf16 products on AVX512-BF16); a \
                     GPU trains in f32 (burn 0.22 has no mixed precision with f32 master weights)"
                ));
            }
            Precision::F16 => {
                return refuse(
                    "the CPU trains in f32 or bf16 (AVX512-BF16); it has no f16 products".into(),
                );
            }
            Precision::Bf16 => {
                if crate::cpu::qgemm::Isa::bf16().is_none() {
                    return refuse(no_bf16("bf16 training needs", "train in f32"));
                }
                log::info!("bf16 training: the linear layers' products in bf16, sums in f32");
            }
        }
        self.products.train_bf16 = precision == Precision::Bf16;
        self.apply_products();
        Ok(())
    }

    /// Sets `self.products` on every tower's linear layers, in slots of this encoder's own
    /// (encoders cloned from it before keep theirs).
    fn apply_products(&mut self) {
        self.model.query_tower.set_products(self.products);
        if let Some(tower) = &mut self.model.passage_tower {
            tower.set_products(self.products);
        }
    }

    /// The trainable modules.
    pub fn model(&self) -> &DualEncoderModel {
        &self.model
    }

    /// The trainable modules, to change in place (e.g. to load other weights).
    pub fn model_mut(&mut self) -> &mut DualEncoderModel {
        &mut self.model
    }

    /// The trainable modules, consuming the encoder.
    pub fn into_model(self) -> DualEncoderModel {
        self.model
    }

    /// Replaces the weights (same device), for example after an optimizer step; the shared
    /// context is kept as is.
    pub fn set_model(&mut self, model: DualEncoderModel) {
        self.model = model;
    }

    /// The same encoder (shared context, shared truncation count) with other weights on
    /// another device: for example `model.valid()` on the inner device for evaluation during
    /// training, or the trainable weights on an autodiff device. Copies no tokenizer.
    pub fn with_model(&self, model: DualEncoderModel, device: &Device) -> Self {
        Self {
            model,
            context: Arc::clone(&self.context),
            device: device.clone(),
            truncations: self.truncations.clone(),
            products: self.products,
        }
    }

    /// The shared tokenizer.
    pub fn tokenizer(&self) -> &TextTokenizer {
        &self.context.tokenizer
    }

    /// The configuration (towers, interaction and its template, lengths, prefixes).
    pub fn config(&self) -> &EncoderConfig {
        &self.context.config
    }

    /// The checkpoint's architecture.
    pub fn arch(&self) -> &ArchitectureConfig {
        &self.context.arch
    }

    /// The checkpoint's sentence-transformers settings.
    pub fn st_config(&self) -> &SentenceTransformersConfig {
        &self.context.st_config
    }

    /// The pooling in use.
    pub fn pooling(&self) -> Pooling {
        self.context.pooling
    }

    /// Width of the embeddings (the last `Dense` module's output, else the backbone's).
    pub fn dim(&self) -> usize {
        output_width(&self.model.dense, self.arch())
    }

    /// Whether [`encode_passages`](Self::encode_passages) and
    /// [`encode_queries`](Self::encode_queries) return unit vectors
    /// ([`SentenceTransformersConfig::unit_vectors`]): always, except for a dot-product model
    /// without `Normalize` under Interaction I (and not after
    /// [`with_cosine_scoring`](Self::with_cosine_scoring)). Training embeddings
    /// ([`encode_batch`](Self::encode_batch),
    /// [`embed_passage_texts`](Self::embed_passage_texts)) are unit vectors always.
    pub fn normalizes(&self) -> bool {
        self.context.unit_vectors
    }

    /// How embeddings are compared (the checkpoint's `similarity_fn_name`, cosine by
    /// default); the dot product of two embeddings ranks as this similarity does.
    pub fn similarity(&self) -> Similarity {
        self.context.similarity
    }

    /// The same weights scoring by cosine, with unit vectors from every method: what the
    /// training objectives optimize and what [`save`](Self::save) writes. The trainer
    /// evaluates through it, so that a dot-product checkpoint is measured as it is trained.
    pub fn with_cosine_scoring(mut self) -> Self {
        let c = &self.context;
        self.context = Arc::new(EncoderContext {
            tokenizer: c.tokenizer.clone(),
            config: c.config.clone(),
            arch: c.arch.clone(),
            st_config: c.st_config.clone(),
            pooling: c.pooling,
            source_dir: c.source_dir.clone(),
            unit_vectors: true,
            similarity: Similarity::Cosine,
            training_pass_texts: c.training_pass_texts,
        });
        self
    }

    /// Maximum tokens of a query-side text: the config's, else the checkpoint's
    /// `max_seq_length`, else 512, capped by the model's position limit.
    pub fn query_max_length(&self) -> usize {
        self.resolve_length(self.config().query_max_length)
    }

    /// Maximum tokens of a passage (as [`query_max_length`](Self::query_max_length)).
    pub fn passage_max_length(&self) -> usize {
        self.resolve_length(self.config().passage_max_length)
    }

    fn resolve_length(&self, explicit: Option<usize>) -> usize {
        max_length(explicit, &self.context.st_config, self.arch())
    }

    /// The checkpoint directory the encoder was loaded from.
    pub fn source_dir(&self) -> &Path {
        &self.context.source_dir
    }

    /// The same weights under another configuration (the tokenizer and the checkpoint's
    /// settings kept; the pooling follows the new configuration's override if it has one).
    /// Used when a saved directory's own settings replace those it was loaded with.
    pub(crate) fn with_config(mut self, config: EncoderConfig) -> Self {
        let c = &self.context;
        let config = resolve_prompts(config, &c.st_config);
        let pooling = config.pooling.unwrap_or(c.pooling);
        self.context = Arc::new(EncoderContext {
            tokenizer: c.tokenizer.clone(),
            unit_vectors: c.unit_vectors || gives_unit_vectors(&c.st_config, &config),
            similarity: c.similarity,
            config,
            arch: c.arch.clone(),
            st_config: c.st_config.clone(),
            pooling,
            source_dir: c.source_dir.clone(),
            training_pass_texts: c.training_pass_texts,
        });
        self
    }

    /// Total number of texts truncated so far.
    pub fn truncated_total(&self) -> usize {
        self.truncations.total()
    }

    fn query_embedder(&self) -> Embedder<'_> {
        Embedder {
            backbone: &self.model.query_tower,
            dense: &self.model.dense,
            tokenizer: self.tokenizer(),
            device: &self.device,
            pooling: self.pooling(),
            max_length: self.query_max_length(),
            counter: &self.truncations,
        }
    }

    fn passage_embedder(&self) -> Embedder<'_> {
        Embedder {
            backbone: self
                .model
                .passage_tower
                .as_ref()
                .unwrap_or(&self.model.query_tower),
            dense: &self.model.dense,
            tokenizer: self.tokenizer(),
            device: &self.device,
            pooling: self.pooling(),
            max_length: self.passage_max_length(),
            counter: &self.truncations,
        }
    }

    /// Encodes passages (with the passage prefix): `[N, d]` in input order, unit vectors
    /// when [`normalizes`](Self::normalizes).
    pub fn encode_passages(&self, passages: &[&str]) -> Result<Encoded> {
        self.passages(passages, self.normalizes())
    }

    fn passages(&self, passages: &[&str], unit: bool) -> Result<Encoded> {
        let texts: Vec<String> = passages
            .iter()
            .map(|p| format!("{}{p}", self.config().passage_prefix))
            .collect();
        let (unique, index) = dedupe(texts);
        let refs: Vec<&str> = unique.iter().map(String::as_str).collect();
        let (v, truncated) = self
            .passage_embedder()
            .pooled_sorted(&refs, self.pass_texts())?;
        let v = if unit { l2_normalize(v) } else { v };
        Ok(Encoded {
            embeddings: v.select(0, self.index_tensor(&index)),
            truncated,
        })
    }

    /// Encodes (instruction, query) pairs with the configured interaction: `[N, d]` in input
    /// order, unit vectors when [`normalizes`](Self::normalizes).
    pub fn encode_queries(&self, pairs: &[(&str, &str)]) -> Result<Encoded> {
        let wanted: Vec<(usize, usize)> = (0..pairs.len()).map(|i| (i, i)).collect();
        let instructions: Vec<&str> = pairs.iter().map(|p| p.0).collect();
        let queries: Vec<&str> = pairs.iter().map(|p| p.1).collect();
        let (t, truncated, _) =
            self.combine(&instructions, &queries, &wanted, self.normalizes())?;
        Ok(Encoded {
            embeddings: t,
            truncated,
        })
    }

    /// Encodes a batch for training: row i's query is combined with the instruction of every
    /// row in `instruction_rows[i]` (all lists the same length K >= 1, no index out of
    /// range). The caller chooses the instruction negatives (`infembed-train` draws them).
    ///
    /// Cost: Interaction I runs the backbone on every distinct rendered text, up to
    /// N (K + 1) of them (duplicates are encoded once); Interaction II encodes each
    /// distinct instruction and query once and combines N (K + 1) pairs in O(N K d)
    /// (vector) or O(N K Li Lq d) (token).
    pub fn encode_batch(
        &self,
        rows: &[BatchRow<'_>],
        instruction_rows: &[Vec<usize>],
    ) -> Result<BatchEmbeddings> {
        let n = rows.len();
        let k = check_instruction_rows(n, instruction_rows)?;
        let passages: Vec<&str> = rows.iter().map(|r| r.passage).collect();
        let p = self.passages(&passages, true)?;
        let mut passage_texts = passages.clone();
        passage_texts.sort_unstable();
        passage_texts.dedup();

        // Pairs (instruction row, query row): the diagonal first, then the negatives.
        let mut wanted: Vec<(usize, usize)> = (0..n).map(|i| (i, i)).collect();
        for (i, list) in instruction_rows.iter().enumerate() {
            wanted.extend(list.iter().map(|&j| (j, i)));
        }
        let instructions: Vec<&str> = rows.iter().map(|r| r.instruction).collect();
        let queries: Vec<&str> = rows.iter().map(|r| r.query).collect();
        let (all, truncated, encoded) = self.combine(&instructions, &queries, &wanted, true)?;
        let d = self.dim();
        let iq = all.clone().slice([0..n, 0..d]);
        let iq_instr = all.slice([n..n * (k + 1), 0..d]).reshape([n, k, d]);
        Ok(BatchEmbeddings {
            p: p.embeddings,
            iq,
            iq_instr,
            instruction_rows: instruction_rows.to_vec(),
            texts_encoded: passage_texts.len() + encoded,
            truncated: p.truncated + truncated,
        })
    }

    /// The distinct texts behind a training batch under Interaction I, and where each
    /// embedding of [`BatchEmbeddings`] comes from, so that a caller can embed the texts in
    /// chunks of its choosing (GradCache) and rebuild exactly what
    /// [`encode_batch`](Self::encode_batch) returns.
    ///
    /// Every list of `instruction_rows` empty (K = 0) gives the own pairs only. Fails with
    /// [`Error::InvalidBatch`] for Interaction II (its query embeddings are not a function of
    /// one text each) and for malformed `instruction_rows`.
    pub fn batch_texts(
        &self,
        rows: &[BatchRow<'_>],
        instruction_rows: &[Vec<usize>],
    ) -> Result<BatchTexts> {
        let n = rows.len();
        // K = 0 (every list empty) asks for the own pairs only.
        let k =
            if n > 0 && instruction_rows.len() == n && instruction_rows.iter().all(Vec::is_empty) {
                0
            } else {
                check_instruction_rows(n, instruction_rows)?
            };
        let cfg = self.config();
        let Interaction::SelfAttention { template, .. } = &cfg.interaction else {
            return Err(Error::InvalidBatch(
                "text-level batch embedding needs Interaction I (self_attention)".into(),
            ));
        };
        let passages: Vec<String> = rows
            .iter()
            .map(|r| format!("{}{}", cfg.passage_prefix, r.passage))
            .collect();
        let (passages, passage_index) = dedupe(passages);
        let mut wanted: Vec<(usize, usize)> = (0..n).map(|i| (i, i)).collect();
        for (i, list) in instruction_rows.iter().enumerate() {
            wanted.extend(list.iter().map(|&j| (j, i)));
        }
        let queries: Vec<String> = wanted
            .iter()
            .map(|&(i, q)| {
                let instruction = format!("{}{}", cfg.instruction_prefix, rows[i].instruction);
                format!(
                    "{}{}",
                    cfg.query_prefix,
                    template.render(rows[q].query, Some(&instruction))
                )
            })
            .collect();
        let (queries, query_index) = dedupe(queries);
        Ok(BatchTexts {
            passages,
            passage_index,
            queries,
            query_index,
            k,
        })
    }

    /// Embeds already-prefixed passage texts with the passage tower, one forward pass per
    /// `encode_batch_size` texts (sorted by length): `[N, d]`, L2-normalized, input order.
    pub fn embed_passage_texts(&self, texts: &[&str]) -> Result<Encoded> {
        let (v, truncated) = self
            .passage_embedder()
            .pooled_sorted(texts, self.pass_texts())?;
        Ok(Encoded {
            embeddings: l2_normalize(v),
            truncated,
        })
    }

    /// Embeds already-rendered query-side texts with the query tower (as
    /// [`embed_passage_texts`](Self::embed_passage_texts)).
    pub fn embed_query_texts(&self, texts: &[&str]) -> Result<Encoded> {
        let (v, truncated) = self
            .query_embedder()
            .pooled_sorted(texts, self.pass_texts())?;
        Ok(Encoded {
            embeddings: l2_normalize(v),
            truncated,
        })
    }

    /// Whether training passes mix the two sides: on an autodiff device with training
    /// passes set ([`set_training_pass_texts`](Self::set_training_pass_texts)), one tower
    /// shared by queries and passages (no `passage_tower`) and Interaction I. Then
    /// [`embed_sides`](Self::embed_sides) puts a batch's passages and queries through the
    /// same forward passes: one pass instead of two for a batch that fits in one, half the
    /// kernel launches on a GPU.
    pub fn shares_training_passes(&self) -> bool {
        self.context.training_pass_texts.is_some()
            && self.device.is_autodiff()
            && self.model.passage_tower.is_none()
            && matches!(self.config().interaction, Interaction::SelfAttention { .. })
    }

    /// Embeds already-prefixed passage texts and already-rendered query-side texts, each
    /// cut at its side's maximum length: L2-normalized `[N, d]` per side, input order.
    /// Where [`shares_training_passes`](Self::shares_training_passes), both sides are sorted
    /// by length together and go through the same forward passes; otherwise this is
    /// [`embed_passage_texts`](Self::embed_passage_texts) then
    /// [`embed_query_texts`](Self::embed_query_texts). The embeddings are the same either
    /// way up to float rounding (without dropout: the passes draw their masks in another
    /// order).
    ///
    /// # Errors
    /// [`Error::InvalidBatch`] when both lists are empty; tokenizer errors.
    pub fn embed_sides(&self, passages: &[&str], queries: &[&str]) -> Result<(Encoded, Encoded)> {
        if !self.shares_training_passes() || passages.is_empty() || queries.is_empty() {
            let side = |texts: &[&str], embed: fn(&Self, &[&str]) -> Result<Encoded>| {
                if texts.is_empty() {
                    let empty = Tensor::<2>::zeros([0, self.dim()], &self.device);
                    return Ok(Encoded {
                        embeddings: empty,
                        truncated: 0,
                    });
                }
                embed(self, texts)
            };
            if passages.is_empty() && queries.is_empty() {
                return Err(Error::InvalidBatch("no texts to encode".into()));
            }
            let p = side(passages, Self::embed_passage_texts)?;
            return Ok((p, side(queries, Self::embed_query_texts)?));
        }
        let start = std::time::Instant::now();
        let (pe, qe) = (self.passage_embedder(), self.query_embedder());
        let mut batch = pe.tokenize(passages)?;
        let q = qe.tokenize(queries)?;
        let (pt, qt) = (batch.truncated, q.truncated);
        batch.ids.extend(q.ids);
        batch.type_ids.extend(q.type_ids);
        batch.truncated += qt;
        let all = l2_normalize(qe.pooled_tokens(&batch, self.pass_texts(), start));
        let (np, d) = (passages.len(), self.dim());
        let side = |rows: std::ops::Range<usize>, truncated| Encoded {
            embeddings: all.clone().slice([rows, 0..d]),
            truncated,
        };
        Ok((side(0..np, pt), side(np..np + queries.len(), qt)))
    }

    /// Embeds the `wanted` (instruction index, query index) combinations in order (unit
    /// vectors when `unit`; Interaction II's always are). Returns the embeddings, the
    /// truncation count and the number of distinct texts encoded.
    fn combine(
        &self,
        instructions: &[&str],
        queries: &[&str],
        wanted: &[(usize, usize)],
        unit: bool,
    ) -> Result<(Tensor<2>, usize, usize)> {
        let cfg = self.config();
        match &cfg.interaction {
            Interaction::SelfAttention { template, .. } => {
                let texts: Vec<String> = wanted
                    .iter()
                    .map(|&(i, q)| {
                        let instruction = format!("{}{}", cfg.instruction_prefix, instructions[i]);
                        format!(
                            "{}{}",
                            cfg.query_prefix,
                            template.render(queries[q], Some(&instruction))
                        )
                    })
                    .collect();
                let (unique, index) = dedupe(texts);
                let refs: Vec<&str> = unique.iter().map(String::as_str).collect();
                let (v, truncated) = self
                    .query_embedder()
                    .pooled_sorted(&refs, self.pass_texts())?;
                let v = if unit { l2_normalize(v) } else { v };
                let out = v.select(0, self.index_tensor(&index));
                Ok((out, truncated, unique.len()))
            }
            Interaction::CrossAttention(cross) => {
                let instr_texts: Vec<String> = instructions
                    .iter()
                    .map(|t| format!("{}{t}", cfg.instruction_prefix))
                    .collect();
                let query_texts: Vec<String> = queries
                    .iter()
                    .map(|t| format!("{}{t}", cfg.query_prefix))
                    .collect();
                let (ui, ii) = dedupe(instr_texts);
                let (uq, qi) = dedupe(query_texts);
                let pairs: Vec<(usize, usize)> =
                    wanted.iter().map(|&(i, q)| (ii[i], qi[q])).collect();
                let ri: Vec<&str> = ui.iter().map(String::as_str).collect();
                let rq: Vec<&str> = uq.iter().map(String::as_str).collect();
                let emb = self.query_embedder();
                let weights = self.model.cross.as_ref();
                let encoded = ui.len() + uq.len();
                match cross.kind {
                    CrossAttentionKind::Vector => {
                        let (vi, ti) = emb.pooled_sorted(&ri, self.pass_texts())?;
                        let (vq, tq) = emb.pooled_sorted(&rq, self.pass_texts())?;
                        Ok((combine_vectors(vi, vq, weights, &pairs), ti + tq, encoded))
                    }
                    CrossAttentionKind::Token => {
                        let si = emb.token_states(&ri)?;
                        let sq = emb.token_states(&rq)?;
                        let out =
                            combine_tokens(si.hidden, si.mask, sq.hidden, sq.mask, weights, &pairs);
                        Ok((out, si.truncated + sq.truncated, encoded))
                    }
                }
            }
        }
    }

    fn index_tensor(&self, index: &[usize]) -> Tensor<1, Int> {
        let v: Vec<i64> = index.iter().map(|&i| i as i64).collect();
        Tensor::from_data(TensorData::new(v, [index.len()]), &self.device)
    }
}

/// What [`DualEncoder::batch_texts`] returns: distinct texts and, for every embedding of a
/// [`BatchEmbeddings`], the index of its text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchTexts {
    /// Distinct prefixed passages.
    pub passages: Vec<String>,
    /// Row i's passage is `passages[passage_index[i]]` (length N).
    pub passage_index: Vec<usize>,
    /// Distinct rendered query-side texts.
    pub queries: Vec<String>,
    /// Length `N (K + 1)`: first the N own pairs (`iq`), then row by row the K instruction
    /// negatives (`iq_instr` flattened), each an index into `queries`.
    pub query_index: Vec<usize>,
    /// Instruction negatives per row.
    pub k: usize,
}

/// Checks explicit instruction negatives for a batch of `n` rows; returns K.
fn check_instruction_rows(n: usize, instruction_rows: &[Vec<usize>]) -> Result<usize> {
    if n == 0 {
        return Err(Error::InvalidBatch("empty batch".into()));
    }
    if instruction_rows.len() != n {
        return Err(Error::InvalidBatch(format!(
            "{} instruction lists for {n} rows",
            instruction_rows.len()
        )));
    }
    let k = instruction_rows[0].len();
    if k == 0 {
        return Err(Error::InvalidBatch("K must be at least 1".into()));
    }
    for (i, list) in instruction_rows.iter().enumerate() {
        if list.len() != k {
            return Err(Error::InvalidBatch(format!(
                "row {i} has {} instruction negatives, row 0 has {k}",
                list.len()
            )));
        }
        if let Some(&bad) = list.iter().find(|&&j| j >= n) {
            return Err(Error::InvalidBatch(format!(
                "row {i}: instruction row {bad} out of range (batch of {n})"
            )));
        }
    }
    Ok(k)
}

/// Distinct strings in first-seen order, and for each input its index among them.
pub(crate) fn dedupe(texts: Vec<String>) -> (Vec<String>, Vec<usize>) {
    let mut seen: HashMap<String, usize> = HashMap::with_capacity(texts.len());
    let mut unique = Vec::new();
    let mut index = Vec::with_capacity(texts.len());
    for t in texts {
        let next = unique.len();
        let at = *seen.entry(t.clone()).or_insert(next);
        if at == next {
            unique.push(t);
        }
        index.push(at);
    }
    (unique, index)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dedupe_keeps_first_seen_order() {
        let (u, idx) = dedupe(vec![
            "b".into(),
            "a".into(),
            "b".into(),
            "c".into(),
            "a".into(),
        ]);
        assert_eq!(u, vec!["b", "a", "c"]);
        assert_eq!(idx, vec![0, 1, 0, 2, 1]);
    }

    /// The training pass size applies on an autodiff device only, is not written into the
    /// configuration, and `None` restores the configuration's `encode_batch_size`.
    #[test]
    fn training_pass_texts_apply_to_autodiff_devices_only() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tiny-bert");
        let plain = Device::flex();
        let config = EncoderConfig {
            encode_batch_size: 3,
            ..EncoderConfig::default()
        };
        let loaded = DualEncoder::from_dir(&dir, config, &plain).unwrap();
        let mut training = loaded.with_model(loaded.model().clone(), &plain.clone().autodiff());
        assert_eq!(training.pass_texts(), 3);
        training.set_training_pass_texts(Some(0));
        assert_eq!(training.pass_texts(), 1);
        training.set_training_pass_texts(Some(40));
        assert_eq!(training.pass_texts(), 40);
        assert_eq!(training.config().encode_batch_size, 3);
        let inference = training.with_model(training.model().clone(), &plain);
        assert_eq!(inference.pass_texts(), 3);
        training.set_training_pass_texts(None);
        assert_eq!(training.pass_texts(), 3);
    }

    /// A copy of the tiny BERT fixture with dropout off, in `dir`.
    fn tiny_bert_without_dropout(dir: &std::path::Path) -> std::path::PathBuf {
        let from =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tiny-bert");
        infembed_testkit::copy_dir(&from, dir);
        let path = dir.join("config.json");
        let mut cfg: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        for key in ["hidden_dropout_prob", "attention_probs_dropout_prob"] {
            cfg[key] = 0.0.into();
        }
        std::fs::write(&path, cfg.to_string()).unwrap();
        dir.to_path_buf()
    }

    /// Passages and queries through the same training passes ([`DualEncoder::embed_sides`])
    /// get the embeddings and truncation counts of each side's own passes: each side keeps
    /// its maximum length (a text in both lists is cut differently), whatever the pass size.
    /// Separate towers and plain devices keep the sides apart.
    #[test]
    fn shared_training_passes_embed_each_side_as_its_own_passes() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tiny_bert_without_dropout(tmp.path());
        let plain = Device::flex();
        let config = EncoderConfig {
            query_max_length: Some(6),
            passage_max_length: Some(9),
            ..EncoderConfig::default()
        };
        let loaded = DualEncoder::from_dir(&dir, config.clone(), &plain).unwrap();
        let mut training = loaded.with_model(loaded.model().clone(), &plain.clone().autodiff());
        let long = "one two three four five six seven eight nine ten eleven twelve";
        let passages = [
            long,
            "a short passage",
            "another passage of medium size here",
        ];
        let queries = [
            "q",
            long,
            "what is a query",
            "how long is a piece of string",
        ];
        let host = |e: &Encoded| {
            e.embeddings
                .clone()
                .into_data()
                .convert::<f32>()
                .try_into_vec::<f32>()
                .unwrap()
        };
        let (sp, sq) = training.embed_sides(&passages, &queries).unwrap();
        assert!(!training.shares_training_passes());
        let (p, q) = (
            training.embed_passage_texts(&passages).unwrap(),
            training.embed_query_texts(&queries).unwrap(),
        );
        assert_eq!((host(&sp), host(&sq)), (host(&p), host(&q)), "unshared");
        assert!(p.truncated >= 1 && q.truncated >= 1 && q.truncated < queries.len());
        for texts in [1, 2, 100] {
            training.set_training_pass_texts(Some(texts));
            assert!(training.shares_training_passes());
            let (sp, sq) = training.embed_sides(&passages, &queries).unwrap();
            assert_eq!(
                (sp.truncated, sq.truncated),
                (p.truncated, q.truncated),
                "{texts} a pass"
            );
            for (got, want) in [(host(&sp), host(&p)), (host(&sq), host(&q))] {
                assert_eq!(got.len(), want.len());
                let diff = got
                    .iter()
                    .zip(&want)
                    .map(|(a, b)| (a - b).abs())
                    .fold(0.0f32, f32::max);
                assert!(diff < 1e-5, "{texts} a pass: {diff}");
            }
            // one side empty: the other side's own passes
            let (ep, eq) = training.embed_sides(&[], &queries).unwrap();
            assert_eq!(ep.embeddings.dims(), [0, training.dim()]);
            assert_eq!(host(&eq).len(), host(&q).len());
        }
        assert!(matches!(
            training.embed_sides(&[], &[]),
            Err(Error::InvalidBatch(_))
        ));
        let inference = training.with_model(training.model().clone(), &plain);
        assert!(!inference.shares_training_passes());

        let separate = EncoderConfig {
            towers: Towers::Separate,
            ..config
        };
        let loaded = DualEncoder::from_dir(&dir, separate, &plain).unwrap();
        let mut training = loaded.with_model(loaded.model().clone(), &plain.clone().autodiff());
        training.set_training_pass_texts(Some(100));
        assert!(!training.shares_training_passes());
    }
}
