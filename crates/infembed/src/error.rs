//! The facade's error type.

use std::path::PathBuf;

/// Errors of the retrieval and evaluation harness.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Reading or validating data failed.
    #[error(transparent)]
    Data(#[from] infembed_data::Error),
    /// Building runs or computing metrics failed.
    #[error(transparent)]
    Metrics(#[from] infembed_metrics::Error),
    /// Loading or running an encoder failed.
    #[error(transparent)]
    Encoder(#[from] infembed_encoder::Error),
    /// An evaluation set has nothing to evaluate.
    #[error("{what} is empty: nothing to evaluate")]
    Empty {
        /// What was empty (e.g. "the corpus of dev.jsonl").
        what: String,
    },
    /// A retriever returned scores of the wrong shape.
    #[error(
        "retriever `{retriever}` returned {got} scores for query {query}, expected one per corpus \
         document ({expected})"
    )]
    ScoreShape {
        /// The retriever's name.
        retriever: String,
        /// Index of the query in the batch.
        query: usize,
        /// Corpus size.
        expected: usize,
        /// What it returned.
        got: usize,
    },
    /// A retriever returned the wrong number of score vectors.
    #[error(
        "retriever `{retriever}` returned {got} score vectors for a batch of {expected} queries"
    )]
    ScoreRows {
        /// The retriever's name.
        retriever: String,
        /// Queries in the batch.
        expected: usize,
        /// Score vectors returned.
        got: usize,
    },
    /// A retriever returned a NaN score.
    #[error("retriever `{retriever}` returned a NaN score for query {query}, document {doc}")]
    NanScore {
        /// The retriever's name.
        retriever: String,
        /// The query id.
        query: String,
        /// The document id.
        doc: String,
    },
    /// A candidate list names a document the corpus does not have.
    #[error("top_ranked lists document `{doc}` for query `{query}`, but the corpus has no such id")]
    UnknownCandidate {
        /// The query id.
        query: String,
        /// The unknown document id.
        doc: String,
    },
    /// Writing an output file failed.
    #[error("cannot write {}: {source}", path.display())]
    Write {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
}

/// The facade's result type.
pub type Result<T> = std::result::Result<T, Error>;
