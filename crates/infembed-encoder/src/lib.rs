//! # infembed-encoder
//!
//! The dual encoder of InF-Embed ("Towards Better Instruction Following Retrieval Models") on
//! [burn](https://burn.dev) 0.22 (CPU `flex` backend by default; `wgpu`, `vulkan` and `cuda` as cargo
//! features):
//!
//! - **Backbones** loaded from a local Hugging Face directory (`config.json`,
//!   `tokenizer.json`, `model.safetensors` or the shards of `model.safetensors.index.json`,
//!   read with `burn-store`; bf16 and f16 weights cast to f32): the BERT family
//!   ([`bert`]: BERT, MiniLM, e5, bge, gte), [`modernbert`], and the [`decoder`] LMs Qwen2 and
//!   Llama (rotary embeddings, grouped-query attention, RMSNorm, SwiGLU, last-token pooling
//!   with left padding). Nothing is downloaded; a missing file is an [`Error::MissingFile`] naming it.
//! - **Tokenization** with Hugging Face `tokenizers` (pure Rust), truncation at a maximum
//!   length with a count of truncated inputs, padding to each batch's own longest row.
//! - **The sentence-transformers pipeline** as `modules.json` lists it: [`Pooling`]
//!   (`cls | mean | last`, masked), [`DenseLayer`]s, L2 normalization only when the pipeline
//!   has `Normalize` or scores by cosine ([`Similarity`]), `max_seq_length` as the default
//!   truncation, the prompts of `config_sentence_transformers.json`; any other module is an
//!   error naming it.
//! - **Instruction-query interactions** ([`interaction`]): Interaction I (a [`QueryTemplate`],
//!   the data crate's template type shared with BM25, joins instruction and query, encoded
//!   together) and Interaction II (encoded apart and
//!   combined by [`CrossAttention`], vector or token level).
//! - **The dual encoder** ([`DualEncoder`]): shared or separate towers, query/passage
//!   maximum lengths and prefixes, and [`DualEncoder::encode_batch`] returning the
//!   [`BatchEmbeddings`] the objectives need (`p: [N, d]`, `iq: [N, d]`,
//!   `iq_instr: [N, K, d]`, all L2-normalized, identical strings encoded once).
//!
//! - **Saving** ([`TextEncoder::save`], [`DualEncoder::save`]) back to a Hugging Face /
//!   sentence-transformers directory with the original key names.
//!
//! Inside, the crate has three wings: the models (backbones and their inputs, written like
//! their Hugging Face originals), the operations they call (linear, GELU, dropout, LayerNorm,
//! attention: the one place that looks at the backend), and the CPU kernels of the `flex`
//! backend behind those operations (docs/encoder.md).
//!
//! Conventions: embeddings are `[B, d]` tensors, one row per input text in input order;
//! token states are `[B, L, d]` with `L` the longest row of the batch; masks are 1.0 on real
//! tokens and 0.0 on padding. Encoders pad on the right, decoders on the left.

// The three wings: `models` (the backbones and their inputs), `ops` (the operations the
// models call, the one place that branches on the backend) and `cpu` (the `flex` kernels).
mod card;
mod config;
mod cpu;
mod device;
pub mod dual;
mod encoder;
mod error;
mod head;
pub mod interaction;
mod models;
mod ops;
mod pool;
#[cfg(all(any(feature = "wgpu", feature = "cuda"), not(feature = "fusion")))]
mod probe;
mod routine;
mod save;
mod tokenize;
mod weights;

pub use card::{BaseModel, MODEL_INFO_FILE, ModelInfo, NameSource, weights_revision};
pub use config::{DenseActivation, SentenceTransformersConfig, Similarity, StDense, StDenseConfig};
pub use device::{
    DeviceListing, DeviceSpec, Precision, Quantization, list_devices, missing_backends,
};
pub use dual::{
    BatchEmbeddings, BatchRow, BatchTexts, DualEncoder, DualEncoderModel, EncoderConfig,
    Interaction, PASSAGE_PROMPTS, QUERY_PROMPT, REFERENCE_PASSAGE_MAX_LENGTH,
    REFERENCE_QUERY_MAX_LENGTH, Towers,
};
pub use encoder::{Encoded, TextEncoder, TokenStates, tensor_rows};
pub use error::{Error, Result};
pub use head::DenseLayer;
pub use infembed_data::QueryTemplate;
pub use interaction::{CrossAttention, CrossAttentionConfig, CrossAttentionKind};
pub use models::{ArchitectureConfig, Backbone, BackboneInput, bert, decoder, modernbert};
pub use pool::{Pooling, l2_normalize, l2_normalize3, pool};
#[cfg(all(any(feature = "wgpu", feature = "cuda"), not(feature = "fusion")))]
pub use probe::{
    MatmulProbe, MatmulTiming, ProbeOutcome, ProbePrecision, ProbeReport, probe_matmuls,
    routine_names,
};
pub use routine::MatmulRoutine;
pub use save::{ENCODER_CONFIG_FILE, INTERACTION_FILE, PASSAGE_TOWER_DIR, safetensors_keys};
pub use tokenize::{TextTokenizer, TokenBatch};

/// The CPU matrix product, for this workspace's benchmarks only (cargo feature
/// `bench-internals`): not a public API, no stability promise.
#[cfg(feature = "bench-internals")]
#[doc(hidden)]
pub mod bench_internals {
    pub use crate::cpu::gemm::{Activation, Epilogue, MatRef, gemm, gemm_serial};
    pub use crate::cpu::qgemm::{Isa, QuantizedMatrix, qgemm_with};
}

/// Serializes this crate's tests that draw from burn's device generator. The `flex` backend
/// keeps one generator per process, so a test running alongside could draw from it between
/// another test's `device.seed(s)` and the draws that the seed is meant to fix (as
/// `infembed-train`'s training tests do with their own lock).
#[cfg(test)]
pub(crate) fn rng_lock() -> std::sync::MutexGuard<'static, ()> {
    static RNG: std::sync::Mutex<()> = std::sync::Mutex::new(());
    RNG.lock().unwrap_or_else(|e| e.into_inner())
}

/// The wgpu device for test `test`, or `None` after [`infembed_testkit::wgpu_missing`] has
/// recorded why there is none (a skip outside CI, a failure under `CI=true`). Used by the
/// tests of the cubecl builds' own kernels.
#[cfg(test)]
#[allow(dead_code)]
pub(crate) fn test_wgpu(test: &str) -> Option<burn::tensor::Device> {
    crate::device::DeviceSpec::Wgpu(None)
        .device()
        .map_err(|e| infembed_testkit::wgpu_missing::<()>(test, &e))
        .ok()
}
