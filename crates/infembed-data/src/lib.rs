//! # infembed-data
//!
//! Data for instruction-following retrieval (InF-IR / InF-Embed), with no deep-learning
//! dependency:
//!
//! - [`InfIrRecord`]: the InF-IR training record with the public dataset's field names, read from
//!   JSON Lines ([`read_jsonl`], streaming via [`JsonlRecords`]) or Parquet ([`read_parquet`], the
//!   format the dataset is published in; `parquet` feature, on by default). Readers are strict by
//!   default (the first bad record is an error naming file, line or row, and field) and have a
//!   lenient mode that skips and reports bad records ([`ReadMode`], [`RecordSet`]).
//! - [`flatten()`]: each record becomes three training rows (I+,Q+ -> P+), (I-,Q+ -> P1-),
//!   (I+,Q- -> P2-), each remembering its record and [`Role`].
//! - Evaluation sets ([`EvalSet`], [`FollowIrSet`]) and their loaders: FollowIR's published layout
//!   ([`load::followir`]), the BEIR layout ([`load::beir`]), TREC and SMART files
//!   ([`load::trec`], [`load::smart`]), the classic collections of the shared data
//!   ([`load::classic`]), and the held-out instruction-following test built from any InF-IR file
//!   ([`heldout`]).
//! - [`QueryTemplate`]: how an (instruction, query) pair becomes one string (default
//!   `"{query} {instruction}"`, with `{Q}` / `{I}` as aliases); BM25 and the dense encoder share it.
//!
//! Relevance judgments are plain maps ([`Qrels`]: query id -> document id -> grade, `> 0`
//! relevant) so this crate does not depend on the metrics crate.
//!
//! Errors: one [`Error`] enum; inputs never cause panics.

pub mod error;
pub mod eval;
pub mod flatten;
pub mod heldout;
pub mod load;
pub mod read;
pub mod record;
pub mod template;

pub use error::{Error, Location, Problem, Result};
pub use eval::{
    Document, EvalSet, FollowIrQuery, FollowIrSet, Qrels, Query, TopRanked, changed_docs,
};
pub use flatten::{Role, Row, flatten, record_rows};
pub use heldout::{Distractor, build_heldout, read_distractors};
pub use load::beir::load_beir;
pub use load::classic::Collection;
pub use load::followir::load_followir;
pub use read::{
    JsonObjects, JsonlRecords, ReadMode, RecordSet, Skipped, read_jsonl, read_jsonl_from,
    read_parquet, read_records,
};
pub use record::{InfIrRecord, RecordField};
pub use template::QueryTemplate;

/// The environment variable that overrides where the shared data lives.
pub const SHARED_DATA_ENV: &str = "INFEMBED_SHARED_DATA";

/// Where the project's shared data should be: `$INFEMBED_SHARED_DATA` when set and non-empty,
/// else `../shared/data` relative to `repo_root` (the workspace root). The folder may not exist.
pub fn shared_data_candidate(repo_root: impl AsRef<std::path::Path>) -> std::path::PathBuf {
    match std::env::var_os(SHARED_DATA_ENV) {
        Some(v) if !v.is_empty() => std::path::PathBuf::from(v),
        _ => repo_root.as_ref().join("../shared/data"),
    }
}

/// [`shared_data_candidate`] if that folder exists, else `None`, so that callers (tests, examples)
/// can skip loudly.
pub fn shared_data_dir(repo_root: impl AsRef<std::path::Path>) -> Option<std::path::PathBuf> {
    let dir = shared_data_candidate(repo_root);
    dir.is_dir().then_some(dir)
}
