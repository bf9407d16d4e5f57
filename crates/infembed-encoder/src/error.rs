//! The crate's error type.

use std::path::PathBuf;

/// Everything that can go wrong while loading, running or saving an encoder.
///
/// Problems with user input (model directories, config files, templates) are always reported
/// through this type with the offending file and field named; the crate panics only on
/// documented tensor-shape contracts.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A file the model directory must contain is absent. Nothing is ever downloaded.
    #[error("missing file {path}: {what} (no download is attempted; fetch the model first)")]
    MissingFile {
        /// The path that was looked for.
        path: PathBuf,
        /// What the file is for.
        what: &'static str,
    },

    /// Reading or writing a file failed.
    #[error("I/O error on {path}")]
    Io {
        /// The file concerned.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },

    /// A JSON file could not be parsed (the serde message carries line and column).
    #[error("cannot parse JSON file {path}")]
    Json {
        /// The file concerned.
        path: PathBuf,
        /// The underlying error, with line and column.
        #[source]
        source: serde_json::Error,
    },

    /// A config file parsed but one of its fields holds an unusable value.
    #[error("invalid value in {path}, field `{field}`: {problem}")]
    InvalidConfig {
        /// The file concerned (or a pseudo path such as `<EncoderConfig>`).
        path: PathBuf,
        /// The field at fault.
        field: String,
        /// What is wrong with it.
        problem: String,
    },

    /// The checkpoint's architecture is not one this crate implements.
    #[error(
        "unsupported architecture in {path}: model_type `{model_type}` (supported: bert, modernbert, qwen2, llama)"
    )]
    UnsupportedArchitecture {
        /// The `config.json` read.
        path: PathBuf,
        /// The `model_type` found there.
        model_type: String,
    },

    /// The tokenizer file could not be loaded or a text could not be tokenized.
    #[error("tokenizer error ({context})")]
    Tokenizer {
        /// The tokenizer file or the operation that failed.
        context: String,
        /// The underlying error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },

    /// Reading weights from, or writing them to, a safetensors file failed.
    #[error("safetensors error on {path}: {message}")]
    Safetensors {
        /// The file concerned.
        path: PathBuf,
        /// The store's message.
        message: String,
    },

    /// The weights file does not fit the architecture described by `config.json`.
    #[error("weights in {path} do not match the model: {problem}")]
    WeightsMismatch {
        /// The safetensors file.
        path: PathBuf,
        /// Missing tensors, shape errors, ...
        problem: String,
    },

    /// An instruction-query template is malformed.
    #[error("invalid template {template:?}: {problem}")]
    Template {
        /// The template text.
        template: String,
        /// What is wrong with it.
        problem: String,
    },

    /// Reading a tensor back to the host failed.
    #[error("reading tensor data back: {0}")]
    Readback(String),

    /// A batch given to the encoder is inconsistent (e.g. rows of different lengths).
    #[error("invalid batch: {0}")]
    InvalidBatch(String),

    /// A device name is malformed, or the device cannot be opened in this build or on this
    /// machine.
    #[error("device `{device}`: {problem}")]
    Device {
        /// The device as written (`wgpu:1`).
        device: String,
        /// What is wrong (names the cargo feature when the backend is not compiled in).
        problem: String,
    },

    /// A setting's value is not one of the names it takes.
    #[error("unknown {what} {name:?} (expected {expected})")]
    UnknownName {
        /// The setting (`quantization`).
        what: &'static str,
        /// The name as given.
        name: String,
        /// The names it takes.
        expected: String,
    },
}

/// The crate's result type.
pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    /// An [`Error::Io`] for `path`.
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Self::Io {
            path: path.into(),
            source,
        }
    }

    /// An [`Error::InvalidConfig`].
    pub(crate) fn config(
        path: impl Into<PathBuf>,
        field: impl Into<String>,
        problem: impl Into<String>,
    ) -> Self {
        Self::InvalidConfig {
            path: path.into(),
            field: field.into(),
            problem: problem.into(),
        }
    }
}
