//! Ablation grids: many training runs from one file, each cached by its config's hash, with a
//! report of means and spreads over seeds (`infembed ablate --grid FILE`; docs/ablation.md).
//!
//! A grid names a base training config, keys set over it, and axes; the cartesian product of
//! the axes' values makes the rows (recipes), and every row runs once per seed. A run trains
//! in `<output_dir>/runs/<key>/`, where `key` is the first 16 hex digits of the SHA-256 of the
//! run's whole config (every default filled in), the base model's weights and the retrieval
//! set's folder; its measures go to `result.json` there when it finishes. Running the grid
//! again skips every run that has its result, continues a run that was cut off from its
//! newest checkpoint (the trainer resumes bit-identically), and starts the others. After each
//! run the report is rewritten: `results.json` (every run), `report.md` (a table of rows:
//! mean and sample standard deviation over seeds) and `p_mrr.svg` / `.png` (a chart).

mod grid;
mod report;
mod run;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

pub use grid::{DEFAULT_RETRIEVAL_SET, Grid, GridRow, MoreSeeds, PaperValues};
pub use report::{GridReport, RowSummary, Stat};
pub use run::{GridOptions, RunResult, ZeroShotResult, load_results, run_grid};

/// Errors of grid files and grid runs.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GridError {
    /// The grid file cannot be read.
    #[error("cannot read {}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The grid file is not a valid grid.
    #[error("{}: invalid ablation grid: {problem}", path.display())]
    Invalid {
        /// The grid file.
        path: PathBuf,
        /// What is wrong (the key, axis or line).
        problem: String,
    },
    /// A row's training config is invalid (the error names the grid file, the row and the
    /// seed as its path).
    #[error(transparent)]
    Config(#[from] infembed_train::Error),
    /// A row's key cannot be set.
    #[error("{}: row `{row}`: {problem}", path.display())]
    Row {
        /// The grid file.
        path: PathBuf,
        /// The row's label.
        row: String,
        /// What is wrong with its config.
        problem: String,
    },
}

impl GridError {
    fn io(path: &Path, source: std::io::Error) -> Self {
        GridError::Io {
            path: path.to_path_buf(),
            source,
        }
    }
}

/// A measure of a run, as grid reports name it.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize,
)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Measure {
    /// Development split: p-MRR (FollowIR's held-out protocol), x100.
    #[default]
    PMrr,
    /// Development split: pairwise instruction accuracy, x100.
    PairwiseAccuracy,
    /// Development split: nDCG@10 under the original instructions, x100.
    #[serde(rename = "ndcg_at_10")]
    NdcgAt10,
    /// The ad hoc retrieval set (`msmarco-subset` by default): nDCG@10, x100.
    #[serde(rename = "retrieval_ndcg_at_10")]
    RetrievalNdcgAt10,
}

impl Measure {
    /// Every measure, in the report's column order.
    pub const ALL: [Measure; 4] = [
        Measure::PMrr,
        Measure::PairwiseAccuracy,
        Measure::NdcgAt10,
        Measure::RetrievalNdcgAt10,
    ];

    /// The report's column header.
    pub fn header(self) -> &'static str {
        match self {
            Measure::PMrr => "dev p-MRR",
            Measure::PairwiseAccuracy => "dev pairwise acc.",
            Measure::NdcgAt10 => "dev nDCG@10",
            Measure::RetrievalNdcgAt10 => "msmarco-subset nDCG@10",
        }
    }

    /// The name in grid files and result files (`p_mrr`, `retrieval_ndcg_at_10`, ...).
    pub fn name(self) -> &'static str {
        match self {
            Measure::PMrr => "p_mrr",
            Measure::PairwiseAccuracy => "pairwise_accuracy",
            Measure::NdcgAt10 => "ndcg_at_10",
            Measure::RetrievalNdcgAt10 => "retrieval_ndcg_at_10",
        }
    }

    /// The name in the trainer's evaluation history (dev measures only).
    fn history_name(self) -> Option<&'static str> {
        match self {
            Measure::RetrievalNdcgAt10 => None,
            dev => Some(dev.name()),
        }
    }
}

/// The measures of one evaluated model, by [`Measure`].
pub type Measures = BTreeMap<Measure, f64>;
