//! The crate's error type.
//!
//! Errors from user input (the config file, the input pairs, prompt templates, an existing output
//! file being resumed) name the file and, where it makes sense, the line and the field at fault.
//! Failures of single requests to the model server are [`RequestError`]s; the pipeline handles most
//! of them itself (retries, then the pair is left for a later run) and reports them in counts.

use std::path::PathBuf;

/// All errors of `infembed-synth`.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Reading, creating or writing a file failed.
    #[error("{path}: I/O error: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },

    /// The config file is not valid TOML for [`crate::SynthConfig`] (unknown keys included); the
    /// parser's message gives the line and column.
    #[error("{path}: invalid TOML config: {source}")]
    ConfigToml {
        /// The config file.
        path: PathBuf,
        /// The parser's error.
        #[source]
        source: toml::de::Error,
    },

    /// The config file is not valid JSON for [`crate::SynthConfig`].
    #[error("{path}: invalid JSON config: {source}")]
    ConfigJson {
        /// The config file.
        path: PathBuf,
        /// The parser's error (it carries line and column).
        #[source]
        source: serde_json::Error,
    },

    /// The config file's extension is neither `.toml` nor `.json`.
    #[error("{path}: unsupported config format (use a .toml or .json file)")]
    ConfigFormat {
        /// The config file.
        path: PathBuf,
    },

    /// A config value is present but unusable, or a required value is absent.
    #[error("{origin}: field `{field}`: {problem}")]
    ConfigValue {
        /// The config file, or `<config>` for a config built in code.
        origin: String,
        /// The dotted field name, e.g. `client.concurrency`.
        field: &'static str,
        /// What is wrong.
        problem: String,
    },

    /// The data crate could not load the input (BEIR folder) or read back an output file.
    #[error(transparent)]
    Data(#[from] infembed_data::Error),

    /// A line of an input pairs JSONL file is not valid JSON.
    #[error("{path}: line {line}: invalid JSON: {source}")]
    InputJson {
        /// The file.
        path: PathBuf,
        /// 1-based line number.
        line: usize,
        /// The parser's error.
        #[source]
        source: serde_json::Error,
    },

    /// A line of an input pairs JSONL file is not a JSON object (a missing, blank or mistyped
    /// field is an [`Error::Data`] naming file, line and field).
    #[error("{path}: line {line}: field `{field}` {problem}")]
    InputField {
        /// The file.
        path: PathBuf,
        /// 1-based line number.
        line: usize,
        /// The field name.
        field: &'static str,
        /// What is wrong (e.g. `is missing`).
        problem: &'static str,
    },

    /// The input holds no (query, passage) pair to work on.
    #[error("{origin}: no (query, passage) pairs in the input")]
    NoPairs {
        /// The input file or folder.
        origin: PathBuf,
    },

    /// A prompt template uses an unknown placeholder or lacks a required one.
    #[error("{origin}: prompt template `{template}`: {problem}")]
    Template {
        /// The template file, or `<built-in>`.
        origin: String,
        /// The template's name (e.g. `instruction`).
        template: &'static str,
        /// What is wrong.
        problem: String,
    },

    /// A complete line of an existing output file (being resumed) is not a valid JSON object with
    /// a `provenance.source` naming its pair. A partial last line (a crash mid-write) is not an
    /// error: it is cut off and reported.
    #[error("{path}: line {line}: cannot resume from this output line: {problem}")]
    OutputLine {
        /// The output file.
        path: PathBuf,
        /// 1-based line number.
        line: usize,
        /// What is wrong.
        problem: String,
    },

    /// A single request failed for good (outside the pipeline, which handles these itself).
    #[error(transparent)]
    Request(#[from] RequestError),
}

/// Why one chat-completion request (after its retries) produced no completion.
#[derive(Debug, thiserror::Error)]
pub enum RequestError {
    /// The run's request budget is spent; nothing was sent.
    #[error("the request budget is exhausted")]
    BudgetExhausted,

    /// The server kept answering with a retryable status (429, 408 or 5xx) or timing out or
    /// failing the connection until the retries ran out; `last` is the last failure.
    #[error("gave up after {attempts} attempts: {last}")]
    RetriesExhausted {
        /// How many attempts were sent.
        attempts: u32,
        /// The last failure.
        #[source]
        last: Box<RequestError>,
    },

    /// The server answered with a status that retrying will not fix (e.g. 400, 401, 404).
    #[error("HTTP status {status}: {body}")]
    Status {
        /// The HTTP status code.
        status: u16,
        /// The start of the response body (at most 500 characters), for diagnosis.
        body: String,
    },

    /// No complete answer within the configured timeout.
    #[error("timed out")]
    Timeout,

    /// Connecting, sending or receiving failed.
    #[error("transport error: {0}")]
    Transport(#[source] ureq::Error),

    /// A 200 answer whose body is not a chat completion (`choices[0].message.content`).
    #[error("malformed chat-completion response: {problem}")]
    MalformedResponse {
        /// What is wrong.
        problem: String,
    },
}

impl RequestError {
    /// Whether a new attempt may succeed (429, 408, 5xx, timeouts, connection failures and
    /// malformed 200 bodies).
    pub fn is_retryable(&self) -> bool {
        match self {
            RequestError::Status { status, .. } => {
                *status == 429 || *status == 408 || (500..600).contains(status)
            }
            RequestError::Timeout
            | RequestError::Transport(_)
            | RequestError::MalformedResponse { .. } => true,
            RequestError::BudgetExhausted | RequestError::RetriesExhausted { .. } => false,
        }
    }
}

/// The crate's result type.
pub type Result<T> = std::result::Result<T, Error>;
