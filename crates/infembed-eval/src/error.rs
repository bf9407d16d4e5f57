//! The crate's error type.

use std::path::PathBuf;

/// Errors of the retrieval and evaluation harness.
#[non_exhaustive]
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
    /// A model directory that does not exist.
    #[error(
        "model directory {} not found: pass --model DIR (a Hugging Face / sentence-transformers \
         model directory; `cargo xtask fetch-model` puts all-MiniLM-L6-v2 in \
         models/all-MiniLM-L6-v2)",
        path.display()
    )]
    ModelDir {
        /// The path given.
        path: PathBuf,
    },
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
    /// A precomputed corpus index lacks a document of the evaluated corpus.
    #[error(
        "{} has no embedding for document `{id}` of the corpus ({missing} of {total} documents \
         missing): embed the same corpus file with `infembed embed`",
        index.display()
    )]
    IndexMissingDocument {
        /// The index file.
        index: PathBuf,
        /// The first missing document id.
        id: String,
        /// How many corpus documents the index lacks.
        missing: usize,
        /// The corpus's size.
        total: usize,
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
    /// An input file could not be opened or read.
    #[error("cannot read {}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// A line of a JSONL input is malformed, or a field is missing or of the wrong type.
    #[error("{}:{line}: {field}: {problem}", path.display())]
    InputField {
        /// The file.
        path: PathBuf,
        /// The 1-based line number.
        line: usize,
        /// The field at fault (`<line>` when the line itself is not a JSON object).
        field: String,
        /// What is wrong.
        problem: String,
    },
    /// Two records of an input file share an id.
    #[error(
        "{}:{line}: duplicate id `{id}` (first on line {first_line}); ids must be unique",
        path.display()
    )]
    DuplicateId {
        /// The file.
        path: PathBuf,
        /// The line of the second occurrence.
        line: usize,
        /// The line of the first occurrence.
        first_line: usize,
        /// The id.
        id: String,
    },
    /// An input file holds no records.
    #[error(
        "{} holds no records: nothing to embed (expected JSONL, one {{\"id\": ..., \"text\": ...}} \
         object per line)",
        path.display()
    )]
    EmptyInput {
        /// The file.
        path: PathBuf,
    },
    /// An index path whose extension names no supported format.
    #[error(
        "{}: unknown embeddings format (use a .safetensors or .npy extension)",
        path.display()
    )]
    UnknownIndexFormat {
        /// The path.
        path: PathBuf,
    },
    /// An index file that does not hold what [`crate::EmbeddingIndex`] writes.
    #[error("{}: not a valid embeddings index: {problem}", path.display())]
    IndexFormat {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        problem: String,
    },
    /// Embeddings that do not form an `[N, d]` matrix with one id per row.
    #[error("embeddings shape: {problem}")]
    IndexShape {
        /// What is wrong.
        problem: String,
    },
    /// A query embedding whose dimension differs from the index's.
    #[error(
        "index {} holds {index_dim}-dimensional embeddings but model {model} produces \
         {model_dim}-dimensional ones: re-embed the corpus with this model (`infembed embed`)",
        index.display()
    )]
    DimensionMismatch {
        /// The index file (or `<in memory>`).
        index: PathBuf,
        /// The index's dimension.
        index_dim: usize,
        /// The model producing the query embeddings.
        model: String,
        /// The model's dimension.
        model_dim: usize,
    },
    /// A parts folder of an unfinished `infembed embed` made with other inputs or settings.
    #[error(
        "{} holds the shards of another run: its {field} was {recorded}, now {now}; resume with \
         the same input, model and options, or pass --restart (or delete the folder) to start \
         over",
        dir.display()
    )]
    ResumeMismatch {
        /// The parts folder.
        dir: PathBuf,
        /// The manifest field that differs.
        field: String,
        /// Its recorded value (JSON).
        recorded: String,
        /// Its value for this run (JSON).
        now: String,
    },
    /// A parts folder that cannot be resumed from.
    #[error("{}: {problem}", dir.display())]
    PartsDir {
        /// The parts folder.
        dir: PathBuf,
        /// What is wrong.
        problem: String,
    },
    /// An input file that changed between its scan and its embedding.
    #[error("{} changed while it was being embedded: {problem}", path.display())]
    InputChanged {
        /// The input file.
        path: PathBuf,
        /// What differs.
        problem: String,
    },
}

/// The crate's result type.
pub type Result<T> = std::result::Result<T, Error>;
