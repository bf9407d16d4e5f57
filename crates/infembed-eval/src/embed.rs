//! Embedding texts read from JSONL files into an [`EmbeddingIndex`], and searching one with an
//! instruction and a query.
//!
//! The input format is [`read_texts`]'s.
//!
//! # Passages and queries
//! [`embed_passages`] encodes each record's passage text with
//! [`DualEncoder::encode_passages`]; [`embed_queries`] encodes `(instruction, text)` with
//! [`DualEncoder::encode_queries`], i.e. through the encoder config's interaction (for
//! Interaction I, its template joins instruction and query; no instruction is the empty string).
//! [`search`] encodes one `(instruction, query)` pair the same way and ranks the index by dot
//! product ([`EmbeddingIndex::top_k`]).

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use infembed_data::{JsonObjects, json_id, json_opt_str, json_str};
use infembed_encoder::{DualEncoder, tensor_rows};
use serde_json::{Map, Value};

use crate::error::{Error, Result};
use crate::index::{EmbeddingIndex, SearchHit};

/// One record of an input file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TextRecord {
    /// The record's id (`_id` or `id`).
    pub id: String,
    /// The title; empty when absent or null.
    pub title: String,
    /// The text.
    pub text: String,
    /// The instruction, for the query side.
    pub instruction: Option<String>,
}

impl TextRecord {
    /// The text encoded on the passage side: `"{title} {text}"` when the title is not blank,
    /// else the text alone.
    pub fn passage_text(&self) -> String {
        if self.title.trim().is_empty() {
            self.text.clone()
        } else {
            format!("{} {}", self.title, self.text)
        }
    }
}

/// Which tower embeds the records.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Side {
    /// [`TextRecord::passage_text`] through the passage tower (the default).
    #[default]
    Passages,
    /// `(instruction, text)` through the query tower and the configured interaction.
    Queries,
}

/// How many records go to the encoder at once (it batches further inside); bounds the memory
/// that one call holds on the device.
pub const EMBED_CHUNK: usize = 512;

/// Reads a JSONL file of texts. Fields are read with the data crate's typed readers
/// ([`infembed_data::json_str`] and its siblings).
///
/// # Input format
/// JSON Lines, one object per line (blank lines are skipped):
/// - the id: `"_id"` (BEIR) or `"id"`, a string or an integer; when both are present they must
///   agree. Ids must be unique in the file.
/// - `"text"`: a string (required).
/// - `"title"`: optional string or null. On the passage side the encoded text is
///   `"{title} {text}"` when the title is not blank, else the text alone: BEIR's and
///   sentence-transformers' convention, the same as [`infembed_data::Document::full_text`], so a
///   BEIR `corpus.jsonl` embeds exactly as the evaluation harness embeds it.
/// - `"instruction"`: optional string or null, used on the query side only.
///
/// Other keys are ignored. Every problem is an error naming the file, the line and the field.
///
/// # Errors
/// [`Error::Read`] when the file cannot be opened or read, [`Error::InputField`] naming line and
/// field, [`Error::DuplicateId`], and [`Error::EmptyInput`] when it holds no record.
pub fn read_texts(path: impl AsRef<Path>) -> Result<Vec<TextRecord>> {
    let path = path.as_ref();
    let mut records = Vec::new();
    let mut first_line: HashMap<String, usize> = HashMap::new();
    for item in TextReader::open(path)? {
        let (line_no, record) = item?;
        note_new_id(&mut first_line, path, line_no, &record.id)?;
        records.push(record);
    }
    if records.is_empty() {
        return Err(Error::EmptyInput {
            path: path.to_path_buf(),
        });
    }
    Ok(records)
}

/// Records that `id` first appears on `line` of `path`, or errors with [`Error::DuplicateId`]
/// naming both lines: the uniqueness rule of [`read_texts`] and [`crate::scan_texts`].
pub(crate) fn note_new_id(
    first_line: &mut HashMap<String, usize>,
    path: &Path,
    line: usize,
    id: &str,
) -> Result<()> {
    if let Some(&first) = first_line.get(id) {
        return Err(Error::DuplicateId {
            path: path.to_path_buf(),
            line,
            first_line: first,
            id: id.to_string(),
        });
    }
    first_line.insert(id.to_string(), line);
    Ok(())
}

/// The records of a JSONL file of texts one by one, with their line numbers, in
/// [`read_texts`]'s format and with its errors (but no check that ids are unique): what reads a
/// corpus too large to hold.
pub(crate) struct TextReader<R> {
    objects: JsonObjects<R>,
    path: PathBuf,
}

impl TextReader<std::io::BufReader<std::fs::File>> {
    /// Opens `path`.
    pub(crate) fn open(path: &Path) -> Result<Self> {
        Ok(Self {
            objects: JsonObjects::open(path).map_err(|e| data_error(path, e))?,
            path: path.to_path_buf(),
        })
    }
}

impl<R: std::io::BufRead> TextReader<R> {
    /// Reads from `reader`; `path` names the source in errors.
    pub(crate) fn new(reader: R, path: &Path) -> Self {
        Self {
            objects: JsonObjects::new(reader, path),
            path: path.to_path_buf(),
        }
    }
}

impl<R: std::io::BufRead> Iterator for TextReader<R> {
    type Item = Result<(usize, TextRecord)>;

    fn next(&mut self) -> Option<Self::Item> {
        let path = self.path.as_path();
        Some(
            self.objects
                .next()?
                .map_err(|e| data_error(path, e))
                .and_then(|(line, obj)| {
                    parse_record(&obj, path, line)
                        .map(|record| (line, record))
                        .map_err(|e| match e {
                            RecordError::Data(e) => data_error(path, e),
                            RecordError::Ids(problem) => field_error(path, line, "id", problem),
                        })
                }),
        )
    }
}

fn field_error(path: &Path, line: usize, field: &str, problem: String) -> Error {
    Error::InputField {
        path: path.to_path_buf(),
        line,
        field: field.to_string(),
        problem,
    }
}

/// The data crate's JSONL and field readers' errors, said as this module's.
fn data_error(path: &Path, e: infembed_data::Error) -> Error {
    match e {
        infembed_data::Error::Io { source, .. } => Error::Read {
            path: path.to_path_buf(),
            source,
        },
        infembed_data::Error::Utf8 { line, source, .. } => {
            field_error(path, line, "<line>", format!("not valid UTF-8: {source}"))
        }
        infembed_data::Error::Json { line, source, .. } => {
            field_error(path, line, "<line>", format!("not valid JSON: {source}"))
        }
        infembed_data::Error::Record {
            at: infembed_data::Location::Line(line),
            problem: infembed_data::Problem::NotAnObject { .. },
            ..
        } => field_error(
            path,
            line,
            "<line>",
            "expected a JSON object, one per line".into(),
        ),
        infembed_data::Error::Record {
            at: infembed_data::Location::Line(line),
            field,
            problem,
            ..
        } => field_error(path, line, &field, problem.to_string()),
        other => Error::Data(other),
    }
}

/// Why a line is not a [`TextRecord`]: a field the typed readers reject, or ids that do not
/// name one record.
enum RecordError {
    Data(infembed_data::Error),
    Ids(String),
}

impl From<infembed_data::Error> for RecordError {
    fn from(e: infembed_data::Error) -> Self {
        Self::Data(e)
    }
}

fn parse_record(
    obj: &Map<String, Value>,
    path: &Path,
    line: usize,
) -> std::result::Result<TextRecord, RecordError> {
    let id_of = |key: &str| -> std::result::Result<Option<String>, RecordError> {
        match obj.get(key) {
            None => Ok(None),
            Some(_) => Ok(Some(json_id(obj, key, path, line)?)),
        }
    };
    let id = match (id_of("_id")?, id_of("id")?) {
        (Some(a), Some(b)) if a != b => {
            return Err(RecordError::Ids(format!(
                "`_id` ({a}) and `id` ({b}) disagree"
            )));
        }
        (Some(a), _) | (None, Some(a)) => a,
        (None, None) => {
            return Err(RecordError::Ids("missing (give `id` or `_id`)".into()));
        }
    };
    Ok(TextRecord {
        id,
        text: json_str(obj, "text", path, line)?.to_string(),
        title: json_opt_str(obj, "title", path, line)?
            .unwrap_or_default()
            .to_string(),
        instruction: json_opt_str(obj, "instruction", path, line)?.map(str::to_string),
    })
}

/// A short description of a model for indexes and errors: its directory as given.
pub(crate) fn encoder_source(encoder: &DualEncoder) -> String {
    encoder.source_dir().display().to_string()
}

/// Embeds `records` with `encoder` on the given side into an [`EmbeddingIndex`] whose `model` is
/// the encoder's directory. Rows are in record order.
///
/// # Errors
/// [`Error::IndexShape`] for no records or duplicate ids, and the encoder's errors.
pub fn embed_records(
    encoder: &DualEncoder,
    records: &[TextRecord],
    side: Side,
) -> Result<EmbeddingIndex> {
    if records.is_empty() {
        return Err(Error::IndexShape {
            problem: "no records to embed".into(),
        });
    }
    let mut embeddings = Vec::new();
    let mut dim = 0;
    for chunk in records.chunks(EMBED_CHUNK) {
        let (rows, d) = embed_chunk(encoder, chunk, side)?;
        embeddings.extend(rows);
        dim = d;
    }
    EmbeddingIndex::new(
        records.iter().map(|r| r.id.clone()).collect(),
        embeddings,
        dim,
        encoder_source(encoder),
    )
}

/// Embeds one chunk of at most [`EMBED_CHUNK`] records: row-major values and the dimension.
pub(crate) fn embed_chunk(
    encoder: &DualEncoder,
    chunk: &[TextRecord],
    side: Side,
) -> Result<(Vec<f32>, usize)> {
    let start = std::time::Instant::now();
    let encoded = match side {
        Side::Passages => {
            let texts: Vec<String> = chunk.iter().map(TextRecord::passage_text).collect();
            let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
            encoder.encode_passages(&refs)?
        }
        Side::Queries => {
            let pairs: Vec<(&str, &str)> = chunk
                .iter()
                .map(|r| (r.instruction.as_deref().unwrap_or(""), r.text.as_str()))
                .collect();
            encoder.encode_queries(&pairs)?
        }
    };
    let dim = encoded.embeddings.dims()[1];
    let issued = start.elapsed();
    let mut values = Vec::with_capacity(chunk.len() * dim);
    for row in tensor_rows(encoded.embeddings)? {
        values.extend(row);
    }
    // on a GPU device the wait for the read includes the device's time not yet overlapped
    log::debug!(
        "embedded {} records: encoder returned after {:.1} ms, embeddings read back after \
         {:.1} ms more",
        chunk.len(),
        issued.as_secs_f64() * 1e3,
        (start.elapsed() - issued).as_secs_f64() * 1e3
    );
    Ok((values, dim))
}

/// [`embed_records`] on the passage side.
///
/// # Errors
/// As [`embed_records`].
pub fn embed_passages(encoder: &DualEncoder, records: &[TextRecord]) -> Result<EmbeddingIndex> {
    embed_records(encoder, records, Side::Passages)
}

/// [`embed_records`] on the query side.
///
/// # Errors
/// As [`embed_records`].
pub fn embed_queries(encoder: &DualEncoder, records: &[TextRecord]) -> Result<EmbeddingIndex> {
    embed_records(encoder, records, Side::Queries)
}

/// Encodes `(instruction, query)` with [`DualEncoder::encode_queries`] and returns the index's
/// `k` best documents ([`EmbeddingIndex::top_k`]: score descending, ties by id descending).
/// `instruction` may be empty.
///
/// # Errors
/// [`Error::DimensionMismatch`] (naming the index file, both dimensions and the fix) when the
/// model's embeddings do not have the index's dimension, and the encoder's errors.
pub fn search(
    encoder: &DualEncoder,
    index: &EmbeddingIndex,
    instruction: &str,
    query: &str,
    k: usize,
) -> Result<Vec<SearchHit>> {
    let q = encoder.encode_queries(&[(instruction, query)])?.embeddings;
    let model_dim = q.dims()[1];
    index.check_dim(model_dim, &encoder_source(encoder))?;
    let row = tensor_rows(q)?.pop().unwrap_or_default();
    index.top_k(&row, k)
}
