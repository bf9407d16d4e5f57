//! # infembed
//!
//! Instruction-following retrieval in Rust: the InF-IR data format and the InF-Embed training
//! objectives of "Towards Better Instruction Following Retrieval Models", with FollowIR-style
//! evaluation.
//!
//! This facade re-exports the workspace crates and adds the retrieval and evaluation harness:
//! - [`data`]: InF-IR records, training rows, evaluation sets and their loaders;
//! - [`metrics`]: trec_eval-exact IR measures and FollowIR's p-MRR;
//! - [`encoder`]: HF checkpoints on burn, pooling, instruction-query interactions;
//! - [`losses`]: the univariate and multivariate marginal InfoNCE objectives on burn tensors;
//! - [`Retriever`] and [`run_queries`]: anything that scores queries against a corpus, and its runs;
//! - [`evaluate_followir`] / [`evaluate_retrieval`]: reports for instruction-following and ad hoc
//!   retrieval tests;
//! - [`mod@train`]: fine-tuning with the InF-Embed objectives ([`training::train`] runs a config
//!   file with the development split evaluated by [`FollowIrDevEvaluator`]);
//! - `synth` (cargo feature `synth`, on by default): the InF-IR synthesis pipeline against any
//!   OpenAI-compatible server;
//! - [`lexical`]: a BM25 baseline; [`EncoderRetriever`]: dense retrieval with an encoder.
//! - [`embed`] and [`index`]: embed a JSONL corpus into an [`EmbeddingIndex`] (saved as
//!   safetensors or `.npy`) and [`search`] it with an instruction and a query.
//!
//! The `infembed` binary wraps these (`infembed eval --help`, `infembed embed --help`,
//! `infembed search --help`). Runnable examples of the library API are in the repository's
//! `examples/` folder.

pub mod dense;
pub mod embed;
pub mod error;
pub mod evaluate;
pub mod index;
pub mod lexical;
pub mod quickstart;
pub mod retrieve;
pub mod training;

pub use infembed_data as data;
pub use infembed_encoder as encoder;
pub use infembed_losses as losses;
pub use infembed_metrics as metrics;
#[cfg(feature = "synth")]
pub use infembed_synth as synth;
pub use infembed_train as train;

/// The device tensors live on; `Device::default()` is the CPU.
pub use burn::tensor::Device;
pub use dense::EncoderRetriever;
pub use embed::{
    Side, TextRecord, embed_passages, embed_queries, embed_records, read_texts, search,
};
pub use error::{Error, Result};
pub use evaluate::{
    EvalConfig, FollowIrOutcome, FollowIrReport, RetrievalOutcome, RetrievalReport,
    evaluate_followir, evaluate_retrieval,
};
pub use index::{EmbeddingIndex, IndexFormat, SearchHit};
pub use retrieve::{Bm25Retriever, Depth, QUERY_BATCH, QueryRequest, Retriever, run_queries};
pub use training::{FollowIrDevEvaluator, retrieval_report, train};
