//! # infembed-eval
//!
//! The retrieval and evaluation harness of infembed, usable without the command line, the
//! synthesis client or the training dashboard:
//!
//! - [`Retriever`] and [`run_queries`]: anything that scores queries against a corpus, and the
//!   runs it produces; [`top_k`] is the one ranking routine (score descending, ties by the
//!   [`TieBreak`](infembed_metrics::TieBreak) rule) that runs and searches share.
//! - [`Bm25Retriever`] (Okapi BM25, [`Bm25Index`]) and [`EncoderRetriever`] (dense retrieval with
//!   an [`infembed_encoder::DualEncoder`], loaded by [`load_encoder`]).
//! - [`evaluate_followir`]: instruction following, FollowIR-style (a published FollowIR set, or
//!   the held-out test that [`infembed_data::build_heldout`] builds from any InF-IR file,
//!   [`load_heldout`]). Each query is run twice, with its original and with its changed
//!   instruction; p-MRR measures whether the documents that the changed instruction made
//!   irrelevant fall in the ranking. [`evaluate_retrieval`]: plain ad hoc retrieval (BEIR layout,
//!   the classic collections). Every value in the reports is a percentage (x100), as papers print
//!   them.
//! - [`read_texts`], [`embed_records`] and [`search`]: embed a JSONL file into an
//!   [`EmbeddingIndex`] (saved as safetensors or `.npy`) and search it with an instruction and a
//!   query; [`scan_texts`] and [`embed_file`] do it for corpora of any size, in shards that
//!   resume after a crash. Indexes store `f32` or `f16` ([`IndexDtype`]), open memory-mapped
//!   ([`EmbeddingIndex::open`]) and are searched exactly for a batch of queries in one pass
//!   ([`EmbeddingIndex::search_batch`]); [`IndexWriter`] writes one larger than memory.
//!
//! Errors: one [`Error`] enum. Diagnostics go through the `log` facade.

mod dense;
mod embed;
mod error;
mod evaluate;
mod index;
mod lexical;
mod load;
mod mmap;
mod results;
mod retrieve;
mod scan;
mod stem;
mod store;
mod stream;
mod topk;

pub use dense::{CORPUS_BLOCK, EncoderRetriever};
pub use embed::{
    EMBED_CHUNK, Side, TextRecord, embed_passages, embed_queries, embed_records, read_texts, search,
};
pub use error::{Error, Result};
pub use evaluate::{
    EvalConfig, FollowIrOutcome, FollowIrReport, ReportedMeasure, RetrievalOutcome,
    RetrievalReport, evaluate_followir, evaluate_retrieval,
};
pub use index::{
    EMBEDDINGS_TENSOR, EmbeddingIndex, FORMAT_TAG, FORMAT_TAG_V1, ID_BYTES_TENSOR,
    ID_OFFSETS_TENSOR, IN_MEMORY, IndexFormat, IndexWriter, SearchHit, ids_path,
};
pub use lexical::{Bm25Config, Bm25Index, Stemmer, StopWords, tokenize};
pub use load::{ENCODER_CONFIG_FILE, load_encoder, load_heldout, model_name};
pub use results::{EvalResults, EvaluatedModel};
pub use retrieve::{Bm25Retriever, Depth, QUERY_BATCH, QueryRequest, Retriever, run_queries};
pub use stem::porter_stem;
pub use store::IndexDtype;
pub use stream::{
    DEFAULT_SHARD_RECORDS, EmbedFileOptions, EmbedFileSummary, EmbedProgress, PARTS_FORMAT,
    TextFileScan, embed_file, parts_dir, scan_texts,
};
pub use topk::top_k;
