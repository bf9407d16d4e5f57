//! # infembed
//!
//! Instruction-following retrieval in Rust: the InF-IR data format and the InF-Embed training
//! objectives of "Towards Better Instruction Following Retrieval Models", with FollowIR-style
//! evaluation.
//!
//! This facade re-exports the workspace crates and adds the training glue and the quickstart:
//! - [`data`]: InF-IR records, training rows, evaluation sets and their loaders;
//! - [`metrics`]: trec_eval-exact IR measures and FollowIR's p-MRR;
//! - [`encoder`]: HF checkpoints on burn, pooling, instruction-query interactions;
//! - [`losses`]: the univariate and multivariate marginal InfoNCE objectives on burn tensors;
//! - [`eval`]: the retrieval and evaluation harness, its main names re-exported here:
//!   [`Retriever`] and [`run_queries`]; [`evaluate_followir`] / [`evaluate_retrieval`];
//!   [`Bm25Retriever`] (a BM25 baseline) and [`EncoderRetriever`] (dense retrieval with an
//!   encoder); [`embed_records`] into an [`EmbeddingIndex`] (saved as safetensors or `.npy`) and
//!   [`search`] it with an instruction and a query;
//! - [`mod@train`]: fine-tuning with the InF-Embed objectives ([`training::train`] runs a config
//!   file with the development split evaluated by [`FollowIrDevEvaluator`]);
//! - `synth` (cargo feature `synth`, on by default): the InF-IR synthesis pipeline against any
//!   OpenAI-compatible server;
//! - [`quickstart`]: zero-shot evaluation, fine-tuning and evaluation again;
//! - [`ablation`]: grids of training runs from one file, cached and resumable, reported as
//!   means and spreads over seeds.
//!
//! The `infembed` binary wraps these (`infembed eval --help`, `infembed embed --help`,
//! `infembed search --help`). Runnable examples of the library API are in the repository's
//! `examples/` folder.

pub mod ablation;
mod error;
pub mod mining;
pub mod quickstart;
pub mod training;

pub use infembed_data as data;
pub use infembed_encoder as encoder;
pub use infembed_eval as eval;
pub use infembed_losses as losses;
pub use infembed_metrics as metrics;
#[cfg(feature = "synth")]
pub use infembed_synth as synth;
pub use infembed_train as train;

/// The device tensors live on. Open one from a [`DeviceSpec`] (`"cpu"`, `"wgpu:1"`, ...)
/// with [`DeviceSpec::device`]; nothing in this workspace uses `Device::default()`, which
/// prefers a GPU backend when one is compiled in (docs/devices.md).
pub use burn::tensor::Device;
pub use error::{Error, Result};
pub use infembed_encoder::{
    DeviceListing, DeviceSpec, MatmulRoutine, Precision, Quantization, list_devices,
    missing_backends,
};
pub use infembed_eval::{
    Bm25Config, Bm25Retriever, Depth, EmbeddingIndex, EncoderRetriever, EvalConfig, EvalResults,
    EvaluatedModel, FollowIrOutcome, FollowIrReport, IndexDtype, IndexFormat, IndexWriter,
    QUERY_BATCH, QueryRequest, ReportedMeasure, RetrievalOutcome, RetrievalReport, Retriever,
    SearchHit, Side, Stemmer, StopWords, TextRecord, embed_passages, embed_queries, embed_records,
    evaluate_followir, evaluate_retrieval, load_encoder, load_heldout, read_texts, run_queries,
    search,
};
pub use mining::{MinedNegatives, mine_hard_negatives};
pub use training::{
    EvaluationDetails, FollowIrDevEvaluator, eval_series, open_devices, retrieval_report, train,
};
