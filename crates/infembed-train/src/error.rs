//! The crate's error type.

use std::path::{Path, PathBuf};

/// Everything that can go wrong while configuring or running a training.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A config file could not be parsed (TOML or JSON), with the parser's location.
    #[error("{path}: invalid training config: {message}")]
    ConfigParse {
        /// The config file.
        path: PathBuf,
        /// The parser's message (it names the line and the key).
        message: String,
    },
    /// A config value is out of range or inconsistent.
    #[error("{path}: `{field}` {problem}")]
    Config {
        /// The config file (or `<TrainConfig>` for a config built in code).
        path: PathBuf,
        /// The dotted key, e.g. `optimizer.lr`.
        field: String,
        /// What is wrong and how to fix it.
        problem: String,
    },
    /// A file or directory the config names does not exist.
    #[error("{path}: {what} not found ({fix})")]
    Missing {
        /// The missing path.
        path: PathBuf,
        /// What it should have been.
        what: &'static str,
        /// How to get it.
        fix: &'static str,
    },
    /// The training data holds no record (or too few for one batch).
    #[error("{path}: {problem}")]
    Data {
        /// The data file.
        path: PathBuf,
        /// What is wrong.
        problem: String,
    },
    /// Reading records failed.
    #[error(transparent)]
    Records(#[from] infembed_data::Error),
    /// The encoder failed (loading, tokenizing, encoding, saving).
    #[error(transparent)]
    Encoder(#[from] infembed_encoder::Error),
    /// A batch cannot be formed (for example instruction negatives asked of a batch with
    /// fewer than 2 rows).
    #[error("invalid batch: {0}")]
    Batch(String),
    /// The loss rejected its config or its inputs.
    #[error(transparent)]
    Loss(#[from] infembed_losses::Error),
    /// A chart could not be drawn.
    #[error("drawing {what}: {message}")]
    Chart {
        /// Which chart.
        what: String,
        /// The drawing library's message.
        message: String,
    },
    /// A filesystem operation failed.
    #[error("{path}: {source}")]
    Io {
        /// The path involved.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// A checkpoint could not be written or read back.
    #[error("{path}: checkpoint {problem}")]
    Checkpoint {
        /// The checkpoint directory or file.
        path: PathBuf,
        /// What failed.
        problem: String,
    },
    /// A burn record (weights or optimizer state) could not be (de)serialized.
    #[error("{path}: {source}")]
    Record {
        /// The file involved.
        path: PathBuf,
        /// burn's error.
        #[source]
        source: burn::store::RecordError,
    },
    /// A tensor could not be read back to the host.
    #[error("reading a tensor back failed: {0}")]
    Readback(#[from] burn::tensor::DataError),
    /// The loss became NaN or infinite (learning rate too high, or bad data).
    #[error("step {step}: the loss is {value} (lower optimizer.lr or check the data)")]
    NonFinite {
        /// The optimizer step.
        step: usize,
        /// The value.
        value: f32,
    },
    /// The gradients' global norm became NaN or infinite while the loss stayed finite (for
    /// instance a text whose embedding is all zeros); the step is not taken.
    #[error(
        "step {step}: the gradients' norm is {norm} while the loss is finite (lower \
         optimizer.lr or check the data)"
    )]
    NonFiniteGradients {
        /// The optimizer step.
        step: usize,
        /// The norm.
        norm: f64,
    },
    /// The development-set evaluation failed.
    #[error("evaluation at step {step} failed: {source}")]
    Eval {
        /// The optimizer step.
        step: usize,
        /// The evaluator's error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The terminal dashboard was asked for but cannot be shown.
    #[error("the training dashboard is unavailable: {0}")]
    Dashboard(DashboardProblem),
}

/// Why the terminal dashboard cannot be shown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DashboardProblem {
    /// stdout or stderr is not a terminal (a pipe, a file, CI).
    NoTerminal,
    /// The crate was built without its `tui` feature.
    NotBuilt,
}

impl std::fmt::Display for DashboardProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            DashboardProblem::NoTerminal => {
                "stdout and stderr must both be terminals (use plain progress)"
            }
            DashboardProblem::NotBuilt => {
                "this build has no dashboard (enable the `tui` feature, or use plain progress)"
            }
        })
    }
}

/// The crate's result type.
pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    pub(crate) fn io(path: &Path, source: std::io::Error) -> Self {
        Error::Io {
            path: path.to_path_buf(),
            source,
        }
    }

    pub(crate) fn config(path: &Path, field: &str, problem: impl Into<String>) -> Self {
        Error::Config {
            path: path.to_path_buf(),
            field: field.to_string(),
            problem: problem.into(),
        }
    }

    pub(crate) fn checkpoint(path: &Path, problem: impl Into<String>) -> Self {
        Error::Checkpoint {
            path: path.to_path_buf(),
            problem: problem.into(),
        }
    }
}
