//! The crate's error type.
//!
//! Every variant that comes from a file names that file, and, where it makes sense, the line (text
//! formats, 1-based) or row (Parquet, 0-based) and the field or column at fault. Underlying errors are
//! kept as `#[source]`, never flattened into text.

use std::fmt;
use std::path::PathBuf;

/// Where in an input file a problem sits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Location {
    /// A line of a text file, 1-based (as editors number lines).
    Line(usize),
    /// A row of a Parquet file, 0-based over the whole file (as data-frame tools number rows).
    Row(usize),
}

impl Location {
    /// The bare number: the 1-based line or the 0-based row.
    pub fn index(self) -> usize {
        match self {
            Location::Line(n) | Location::Row(n) => n,
        }
    }
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Location::Line(n) => write!(f, "line {n}"),
            Location::Row(n) => write!(f, "row {n} (0-based)"),
        }
    }
}

/// What is wrong with one field of one record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Problem {
    /// The field is absent.
    Missing,
    /// The field is present but `null`.
    Null,
    /// The field holds a value of another type (the found JSON/Arrow type is named).
    WrongType {
        /// The type found.
        found: String,
        /// The type expected (e.g. `string`).
        expected: &'static str,
    },
    /// The field is a string that is empty or holds only whitespace.
    Empty,
    /// The line is valid JSON but not a JSON object.
    NotAnObject {
        /// The JSON type found instead of an object.
        found: &'static str,
    },
    /// A numeric field (a relevance grade) is not an integer.
    NotAnInteger {
        /// The text found.
        found: String,
    },
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Problem::Missing => write!(f, "is missing"),
            Problem::Null => write!(f, "is null"),
            Problem::WrongType { found, expected } => {
                write!(f, "is a {found}, expected a {expected}")
            }
            Problem::Empty => write!(f, "is empty or whitespace-only"),
            Problem::NotAnObject { found } => write!(f, "is a JSON {found}, expected an object"),
            Problem::NotAnInteger { found } => write!(f, "{found:?} is not an integer"),
        }
    }
}

/// All errors of `infembed-data`.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Reading (or opening) a file failed.
    #[error("{path}: I/O error: {source}")]
    Io {
        /// The file being read.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },

    /// A file a loader needs is not there.
    #[error("{path}: missing {what}")]
    MissingFile {
        /// The path that was looked for (the first candidate when several names are accepted).
        path: PathBuf,
        /// What the file should have held.
        what: &'static str,
    },

    /// A line of a JSON Lines file is not valid JSON.
    #[error("{path}: line {line}: invalid JSON: {source}")]
    Json {
        /// The file.
        path: PathBuf,
        /// 1-based line number.
        line: usize,
        /// The parser's error.
        #[source]
        source: serde_json::Error,
    },

    /// A line of a text file is not valid UTF-8.
    #[error("{path}: line {line}: invalid UTF-8: {source}")]
    Utf8 {
        /// The file.
        path: PathBuf,
        /// 1-based line number.
        line: usize,
        /// The decoding error.
        #[source]
        source: std::str::Utf8Error,
    },

    /// One field of one record is bad.
    #[error("{path}: {at}: field `{field}` {problem}")]
    Record {
        /// The file.
        path: PathBuf,
        /// The line or row of the record.
        at: Location,
        /// The field's name as it appears in the file (`(record)` when the whole record is bad).
        field: String,
        /// What is wrong.
        problem: Problem,
    },

    /// A Parquet column the reader needs is absent or not a string column.
    #[error("{path}: column `{column}` {problem}")]
    Column {
        /// The file.
        path: PathBuf,
        /// The column's name.
        column: String,
        /// What is wrong (missing, or the Arrow type found).
        problem: Problem,
    },

    /// A line of a text format (qrels, SMART, TREC SGML) cannot be parsed.
    #[error("{path}: line {line}: {problem}")]
    Format {
        /// The file.
        path: PathBuf,
        /// 1-based line number (the line where the problem was noticed; for an unterminated
        /// element, the line where it started).
        line: usize,
        /// What is wrong, in words.
        problem: String,
    },

    /// The same id is defined twice in one file (document or query ids).
    #[error("{path}: line {line}: duplicate id {id:?}")]
    DuplicateId {
        /// The file.
        path: PathBuf,
        /// 1-based line of the second definition.
        line: usize,
        /// The repeated id.
        id: String,
    },

    /// The same (query, document) pair is judged twice with different grades.
    #[error(
        "{path}: line {line}: conflicting judgments for query {query:?}, document {doc:?}: {first} then {second}"
    )]
    ConflictingJudgment {
        /// The qrels file.
        path: PathBuf,
        /// 1-based line of the second judgment.
        line: usize,
        /// The query id.
        query: String,
        /// The document id.
        doc: String,
        /// The first grade seen.
        first: i32,
        /// The conflicting later grade.
        second: i32,
    },

    /// A query template is malformed.
    #[error("query template {template:?}: {problem}")]
    Template {
        /// The template as given.
        template: String,
        /// What is wrong.
        problem: &'static str,
    },

    /// Two corpus entries built from separate inputs got the same id (e.g. two distractors with one
    /// passage id).
    #[error("duplicate corpus id {id:?} while building {what}")]
    DuplicateCorpusId {
        /// The repeated id.
        id: String,
        /// What was being built.
        what: &'static str,
    },

    /// No query of a queries file has a judgment in the qrels file.
    #[error("{queries}: no query has judgments in {qrels}")]
    NoJudgedQueries {
        /// The queries file.
        queries: PathBuf,
        /// The qrels file.
        qrels: PathBuf,
    },

    /// The file extension does not say which reader to use.
    #[error("{path}: unknown record file format (expected .jsonl, .json or .parquet)")]
    UnknownFormat {
        /// The file.
        path: PathBuf,
    },

    /// Reading or decoding a Parquet file failed.
    #[cfg(feature = "parquet")]
    #[error("{path}: Parquet error: {source}")]
    Parquet {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: parquet::errors::ParquetError,
    },

    /// Decoding Arrow batches of a Parquet file failed.
    #[cfg(feature = "parquet")]
    #[error("{path}: Arrow error: {source}")]
    Arrow {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: arrow::error::ArrowError,
    },

    /// Parquet support was compiled out (the `parquet` feature is off).
    #[error("{path}: this build has no Parquet support (enable the `parquet` feature)")]
    ParquetDisabled {
        /// The file that was asked for.
        path: PathBuf,
    },

    /// Inputs that do not fit together (e.g. mining scores whose length is not records x
    /// candidates).
    #[error("{0}")]
    Invalid(String),
}

/// Result with this crate's [`Error`].
pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    /// An I/O error on `path`.
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io {
            path: path.into(),
            source,
        }
    }

    /// The location (line or row) this error points at, if it points at one.
    pub fn location(&self) -> Option<Location> {
        match self {
            Error::Json { line, .. }
            | Error::Utf8 { line, .. }
            | Error::Format { line, .. }
            | Error::DuplicateId { line, .. }
            | Error::ConflictingJudgment { line, .. } => Some(Location::Line(*line)),
            Error::Record { at, .. } => Some(*at),
            _ => None,
        }
    }
}
