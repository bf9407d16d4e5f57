//! The crate's error type.

use std::path::PathBuf;

use crate::variable::Variable;

/// Everything that can go wrong in this crate, at config time or when checking a batch's shapes.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// `terms` names no variable.
    #[error("loss config: field `terms` is empty; name at least one of \"P\", \"I\", \"IQ\"")]
    EmptyTerms,

    /// A variable appears twice in `terms`.
    #[error("loss config: field `terms` names variable {0} more than once")]
    DuplicateTerm(Variable),

    /// A multivariate objective over a single variable (it would equal the univariate term;
    /// ask for `kind = "univariate"` instead).
    #[error(
        "loss config: field `kind` is \"multivariate\" but `terms` names only {0}; a multivariate \
         objective needs at least two variables (use kind \"univariate\" for a single one)"
    )]
    SingleVariableMultivariate(Variable),

    /// The temperature is not a finite number greater than zero.
    #[error("loss config: field `temperature` must be finite and > 0, got {0}")]
    InvalidTemperature(f64),

    /// `positive` was set for an objective that is a sum of separate softmaxes, where it has no
    /// meaning (each softmax holds the positive exactly once).
    #[error(
        "loss config: field `positive` only applies to a joint (one-softmax) objective, but this \
         config ({kind}, convention {convention}) is a sum of separate softmax terms; remove it"
    )]
    PositiveNotApplicable {
        /// The configured kind, as written in the config.
        kind: &'static str,
        /// The configured convention, as written in the config.
        convention: &'static str,
    },

    /// A loss config file could not be read.
    #[error("loss config {path}: cannot read the file: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The underlying I/O error.
        #[source]
        source: std::io::Error,
    },

    /// A loss config file is not valid JSON for [`LossConfig`](crate::LossConfig).
    #[error("loss config {path}: line {line}, column {column}: {source}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// 1-based line of the problem.
        line: usize,
        /// 1-based column of the problem.
        column: usize,
        /// The underlying JSON error (names the unknown or missing field or the bad value).
        #[source]
        source: serde_json::Error,
    },

    /// A loss config file parsed but holds an invalid combination.
    #[error("loss config {path}: {source}")]
    InvalidFile {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        #[source]
        source: Box<Error>,
    },

    /// A tensor's dimension does not match the batch layout.
    #[error(
        "loss input `{tensor}` has shape {actual:?}, expected {expected} \
         (B = batch size from `p`, K = instruction negatives per row from `iq_instr`, d = embedding dim)"
    )]
    Shape {
        /// The offending tensor, by its field name in [`LossBatch`](crate::LossBatch) or
        /// [`NegativeMask`](crate::NegativeMask).
        tensor: &'static str,
        /// The expected shape, written with the named dimensions and their values.
        expected: String,
        /// The shape it has.
        actual: Vec<usize>,
    },

    /// The objective contrasts a variable whose embeddings the batch does not carry.
    #[error("the objective contrasts {variable} but the batch has no `{tensor}` tensor")]
    MissingTensor {
        /// The variable that needs the tensor.
        variable: Variable,
        /// The missing field.
        tensor: &'static str,
    },

    /// The batch is empty (`B = 0`) or has zero-width embeddings (`d = 0`).
    #[error("loss input `p` has shape {0:?}; B and d must both be at least 1")]
    EmptyBatch(Vec<usize>),
}

/// The crate's result type.
pub type Result<T> = std::result::Result<T, Error>;
