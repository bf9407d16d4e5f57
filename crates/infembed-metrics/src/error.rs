//! The crate's error type.

use std::path::PathBuf;

/// Everything that can go wrong in this crate.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A TREC qrels or run file (or reader) holds a malformed line.
    ///
    /// `path` is the file's path, or `<input>` when the data came from a reader without a name.
    /// `line` is 1-based; for [`ParseErrorKind::EmptyFile`] it is the number of lines read
    /// (0 for a zero-byte file).
    #[error("{}:{line}: {kind}", path.display())]
    Parse {
        /// The file (or `<input>` for an unnamed reader).
        path: PathBuf,
        /// 1-based line number.
        line: usize,
        /// What is wrong with the line.
        kind: ParseErrorKind,
    },
    /// Reading or writing failed at the operating-system level.
    #[error("I/O error on {}: {source}", path.display())]
    Io {
        /// The file (or `<input>` / `<output>` for unnamed readers and writers).
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// The same (query, document) pair was given twice when building a [`crate::Run`] or
    /// [`crate::Qrels`] in memory.
    #[error("document {doc:?} is given twice for query {query:?}")]
    DuplicateDocument {
        /// Query id.
        query: String,
        /// Document id.
        doc: String,
    },
    /// [`crate::Run::insert_query`] was called for a query that the run already holds.
    #[error("query {query:?} is already in the run")]
    DuplicateQuery {
        /// Query id.
        query: String,
    },
    /// A score given in memory is NaN, which cannot be ranked.
    #[error("score of document {doc:?} for query {query:?} is NaN")]
    NanScore {
        /// Query id.
        query: String,
        /// Document id.
        doc: String,
    },
    /// A measure name that this crate does not know.
    #[error("unknown measure {name:?}")]
    UnknownMeasure {
        /// The name as given.
        name: String,
    },
    /// A cut-off measure (`P_k`, `ndcg_cut_k`, ...) with `k = 0`.
    #[error("measure {name:?} has a zero cut-off; cut-offs start at 1")]
    ZeroCutoff {
        /// The measure's name.
        name: String,
    },
}

/// What is wrong with one line of a TREC file; carried by [`Error::Parse`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParseErrorKind {
    /// The line does not have the format's number of whitespace-separated columns
    /// (4 for qrels, 6 for runs).
    #[error("expected {expected} whitespace-separated columns, found {found}")]
    WrongColumnCount {
        /// Columns the format requires.
        expected: usize,
        /// Columns on the line.
        found: usize,
    },
    /// The score column of a run line is not a number (or is NaN).
    #[error("invalid score {value:?}: not a number")]
    InvalidScore {
        /// The column's text.
        value: String,
    },
    /// The relevance column of a qrels line is not an integer.
    #[error("invalid relevance label {value:?}: not a 32-bit integer")]
    InvalidLabel {
        /// The column's text.
        value: String,
    },
    /// The (query, document) pair already appeared on an earlier line.
    #[error("document {doc:?} appears twice for query {query:?} (first on line {first_line})")]
    DuplicateDocument {
        /// Query id.
        query: String,
        /// Document id.
        doc: String,
        /// The line of the first occurrence.
        first_line: usize,
    },
    /// The file holds no entries (it is empty or only blank lines).
    #[error("the file holds no entries")]
    EmptyFile,
    /// The line is not valid UTF-8.
    #[error("the line is not valid UTF-8")]
    InvalidUtf8,
}

/// Result with this crate's [`Error`].
pub type Result<T> = std::result::Result<T, Error>;
