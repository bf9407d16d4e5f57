//! Embedding texts read from JSONL files into an [`EmbeddingIndex`], and searching one with an
//! instruction and a query.
//!
//! # Input format ([`read_texts`])
//! JSON Lines, one object per line (blank lines are skipped):
//! - the id: `"_id"` (BEIR) or `"id"`, a string or an integer; when both are present they must
//!   agree. Ids must be unique in the file.
//! - `"text"`: a string (required).
//! - `"title"`: optional string or null. On the passage side the encoded text is
//!   `"{title} {text}"` when the title is not blank, else the text alone: BEIR's and
//!   sentence-transformers' convention, the same as [`infembed_data::Document::full_text`], so a
//!   BEIR `corpus.jsonl` embeds exactly as the evaluation harness embeds it.
//! - `"instruction"`: optional string or null, used on the query side only.
//!
//! Other keys are ignored. Every problem is an error naming the file, the line and the field.
//!
//! # Passages and queries
//! [`embed_passages`] encodes each record's passage text with
//! [`DualEncoder::encode_passages`]; [`embed_queries`] encodes `(instruction, text)` with
//! [`DualEncoder::encode_queries`], i.e. through the encoder config's interaction (for
//! Interaction I, its template joins instruction and query; no instruction is the empty string).
//! [`search`] encodes one `(instruction, query)` pair the same way and ranks the index by dot
//! product ([`EmbeddingIndex::top_k`]).

use std::collections::HashMap;
use std::path::Path;

use infembed_data::JsonObjects;
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

/// Reads a JSONL file of texts (see the [module docs](self) for the format).
///
/// # Errors
/// [`Error::Read`] when the file cannot be opened or read, [`Error::InputField`] naming line and
/// field, [`Error::DuplicateId`], and [`Error::EmptyInput`] when it holds no record.
pub fn read_texts(path: impl AsRef<Path>) -> Result<Vec<TextRecord>> {
    let path = path.as_ref();
    let field_err = |line: usize, field: &str, problem: String| Error::InputField {
        path: path.to_path_buf(),
        line,
        field: field.to_string(),
        problem,
    };
    // The data crate's JSONL reader, with its line-level errors said as this module's.
    let line_err = |e: infembed_data::Error| match e {
        infembed_data::Error::Io { source, .. } => Error::Read {
            path: path.to_path_buf(),
            source,
        },
        infembed_data::Error::Utf8 { line, source, .. } => {
            field_err(line, "<line>", format!("not valid UTF-8: {source}"))
        }
        infembed_data::Error::Json { line, source, .. } => {
            field_err(line, "<line>", format!("not valid JSON: {source}"))
        }
        infembed_data::Error::Record {
            at: infembed_data::Location::Line(line),
            ..
        } => field_err(
            line,
            "<line>",
            "expected a JSON object, one per line".into(),
        ),
        other => Error::Data(other),
    };
    let mut records = Vec::new();
    let mut first_line: HashMap<String, usize> = HashMap::new();
    for item in JsonObjects::open(path).map_err(line_err)? {
        let (line_no, obj) = item.map_err(line_err)?;
        let record =
            parse_record(&obj).map_err(|(field, problem)| field_err(line_no, field, problem))?;
        if let Some(&first) = first_line.get(&record.id) {
            return Err(Error::DuplicateId {
                path: path.to_path_buf(),
                line: line_no,
                first_line: first,
                id: record.id,
            });
        }
        first_line.insert(record.id.clone(), line_no);
        records.push(record);
    }
    if records.is_empty() {
        return Err(Error::EmptyInput {
            path: path.to_path_buf(),
        });
    }
    Ok(records)
}

type FieldProblem = (&'static str, String);

fn parse_record(obj: &Map<String, Value>) -> std::result::Result<TextRecord, FieldProblem> {
    let id = match (id_of(obj, "_id")?, id_of(obj, "id")?) {
        (Some(a), Some(b)) if a != b => {
            return Err(("id", format!("`_id` ({a}) and `id` ({b}) disagree")));
        }
        (Some(a), _) | (None, Some(a)) => a,
        (None, None) => return Err(("id", "missing (give `id` or `_id`)".into())),
    };
    let text = match obj.get("text") {
        Some(Value::String(s)) => s.clone(),
        Some(other) => return Err(("text", format!("expected a string, found {}", kind(other)))),
        None => return Err(("text", "missing".into())),
    };
    Ok(TextRecord {
        id,
        title: optional_string(obj, "title")?.unwrap_or_default(),
        text,
        instruction: optional_string(obj, "instruction")?,
    })
}

fn id_of(
    obj: &Map<String, Value>,
    key: &'static str,
) -> std::result::Result<Option<String>, FieldProblem> {
    match obj.get(key) {
        None => Ok(None),
        Some(Value::String(s)) if !s.trim().is_empty() => Ok(Some(s.clone())),
        Some(Value::String(_)) => Err((key, "is blank".into())),
        Some(Value::Number(n)) if n.is_i64() || n.is_u64() => Ok(Some(n.to_string())),
        Some(other) => Err((
            key,
            format!("expected a string or an integer, found {}", kind(other)),
        )),
    }
}

fn optional_string(
    obj: &Map<String, Value>,
    key: &'static str,
) -> std::result::Result<Option<String>, FieldProblem> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(other) => Err((
            key,
            format!("expected a string or null, found {}", kind(other)),
        )),
    }
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// A short description of a model for indexes and errors: its directory as given.
fn model_name(encoder: &DualEncoder) -> String {
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
        dim = encoded.embeddings.dims()[1];
        for row in tensor_rows(encoded.embeddings)? {
            embeddings.extend(row);
        }
    }
    EmbeddingIndex::new(
        records.iter().map(|r| r.id.clone()).collect(),
        embeddings,
        dim,
        model_name(encoder),
    )
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
    index.check_dim(model_dim, &model_name(encoder))?;
    let row = tensor_rows(q)?.pop().unwrap_or_default();
    index.top_k(&row, k)
}
