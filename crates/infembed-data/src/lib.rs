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
//! - [`json_str`], [`json_nonempty_str`], [`json_opt_str`], [`json_id`]: the one typed reader of JSON fields, whose
//!   errors name file, line and field; [`write_atomic`]: the one atomic, durable file write.
//! - [`QueryTemplate`]: how an (instruction, query) pair becomes one string (default
//!   `"{query} {instruction}"`, with `{Q}` / `{I}` as aliases); BM25 and the dense encoder share it.
//!
//! Relevance judgments are plain maps ([`Qrels`]: query id -> document id -> grade, `> 0`
//! relevant) so this crate does not depend on the metrics crate.
//!
//! Errors: one [`Error`] enum; inputs never cause panics.

mod atomic;
pub mod error;
pub mod eval;
pub mod flatten;
pub mod heldout;
pub mod load;
pub mod mined;
pub mod read;
pub mod record;
pub mod template;

pub use atomic::{AtomicFile, sync_dir, write_atomic, write_synced};
pub use error::{Error, Location, Problem, Result};
pub use eval::{
    Document, EvalSet, FollowIrQuery, FollowIrSet, Qrels, Query, TopRanked, changed_docs,
};
pub use flatten::{Role, Row, flatten, record_rows};
pub use heldout::{Distractor, build_heldout, read_distractors};
pub use load::beir::load_beir;
pub use load::classic::Collection;
pub use load::followir::load_followir;
pub use load::{json_id, json_nonempty_str, json_opt_str, json_str};
pub use mined::{
    Candidate, HardNegativeFilter, LabelledPairs, MinedPassage, MiningOptions,
    mined_negatives_jsonl, mining_candidates, read_mined_negatives, select_hard_negatives,
};
pub use read::{
    JsonObjects, JsonlRecords, ReadMode, RecordSet, Skipped, read_jsonl, read_jsonl_from,
    read_parquet, read_records,
};
pub use record::{InfIrRecord, RecordField};
pub use template::QueryTemplate;
