//! IR evaluation measures that reproduce trec_eval exactly, and FollowIR's p-MRR as mteb
//! computes it.
//!
//! - [`Qrels`] (query -> document -> integer label) and [`Run`] (query -> document -> score),
//!   built in memory or read from / written to TREC files (`qrels`: 4 columns, run: 6 columns).
//!   Malformed files give an [`Error::Parse`] naming the file, the line and the problem.
//! - [`evaluate`] computes [`Measure`]s (AP/MAP, cut AP, nDCG and nDCG@k, reciprocal rank and
//!   RR@k, P@k, Recall@k, R-precision, success@k, `num_rel`, `num_ret`, `num_rel_ret`) per query,
//!   with means, into an [`Evaluation`], matching `trec_eval` 9 to its printed precision.
//! - [`p_mrr`] computes p-MRR, the instruction-following measure of FollowIR, as mteb does.
//!
//! # Conventions (trec_eval's)
//! - Documents are ranked by score, descending; ties break by document id, **descending**
//!   (byte order), and scores are compared at `f32` precision, because trec_eval stores them as C
//!   `float` ([`TieBreak::TrecEval`]). Other rules are available ([`TieBreak`]). The rank column
//!   of run files is ignored.
//! - A document is relevant when its label is >= 1; nDCG's gain is the label (0 for labels
//!   <= 0), its discount `log2(rank + 1)`, and its ideal ranking comes from all judged relevant
//!   documents of the query, retrieved or not.
//! - Queries in the run but not in the qrels are skipped; queries judged but missing from the run
//!   are not averaged unless [`EvalOptions::complete`] (trec_eval `-c`) is set.
//!
//! # Features
//! - `parallel` (default): evaluate queries in parallel with rayon (identical results).
//!
//! # Example
//! ```
//! use infembed_metrics::{Measure, Qrels, Run, evaluate};
//!
//! let qrels = Qrels::from_entries([("q1", "d1", 1), ("q1", "d2", 0), ("q1", "d3", 2)])?;
//! let run = Run::from_entries([("q1", "d1", 0.5), ("q1", "d2", 0.9), ("q1", "d3", 0.1)])?;
//! let eval = evaluate(&qrels, &run, &[Measure::RecipRank, Measure::P(2)])?;
//! assert_eq!(eval.mean(Measure::RecipRank), Some(0.5));
//! assert_eq!(eval.mean(Measure::P(2)), Some(0.5));
//! # Ok::<(), infembed_metrics::Error>(())
//! ```

mod error;
mod evaluate;
mod fast_hash;
mod measure;
mod pmrr;
mod qrels;
mod ranking;
mod run;
mod tie;
mod trec_file;

pub use error::{Error, ParseErrorKind, Result};
pub use evaluate::{EvalOptions, Evaluation, TrecEvalFormat, evaluate, evaluate_with};
pub use measure::{Measure, TREC_EVAL_CUTOFFS, TREC_EVAL_SUCCESS_CUTOFFS};
pub use pmrr::{PMrr, PMrrDocument, p_mrr, p_mrr_document_score};
pub use qrels::{Qrels, QueryQrels};
pub use ranking::{RankedDocument, Ranking};
pub use run::{DEFAULT_RUN_TAG, QueryRun, Run};
pub use tie::TieBreak;
