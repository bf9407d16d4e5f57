//! The BEIR layout, and its JSONL / TSV building blocks (also used by the FollowIR loader).
//!
//! A BEIR dataset folder holds:
//! - `corpus.jsonl`: one object per line with `_id` (string or integer), `text` (string, may be
//!   empty), optional `title` (string or null); other keys (e.g. `metadata`) are ignored;
//! - `queries.jsonl`: `_id`, `text` (non-blank), optional `instruction` (string or null, kept as
//!   [`Query::instruction`]); other keys ignored;
//! - `qrels/{split}.tsv`: tab-separated `query-id, corpus-id, score` with a header line.
//!
//! Ids must be unique within the corpus and within the queries ([`crate::Error::DuplicateId`]).

use std::path::Path;

use serde_json::Value;

use crate::error::{Problem, Result};
use crate::eval::{Document, EvalSet, Qrels, Query};
use crate::load::{
    IdSet, add_judgment, for_each_json_object, format_error, json_id, json_nonempty_str,
    json_opt_str, json_str, numbered_lines, parse_grade, read_text, record_error, require_file,
};
use crate::record::json_type_name;

/// Reads a BEIR `corpus.jsonl`.
///
/// # Errors
/// I/O, JSON, a missing or mistyped `_id`/`text`/`title`, or a duplicate id.
pub fn read_corpus_jsonl(path: impl AsRef<Path>) -> Result<Vec<Document>> {
    let path = path.as_ref();
    let mut docs = Vec::new();
    let mut ids = IdSet::new();
    for_each_json_object(path, |line, obj| {
        let id = json_id(obj, "_id", path, line)?;
        ids.insert(&id, path, line)?;
        let text = json_str(obj, "text", path, line)?.to_string();
        let title = json_opt_str(obj, "title", path, line)?
            .unwrap_or_default()
            .to_string();
        docs.push(Document { id, title, text });
        Ok(())
    })?;
    Ok(docs)
}

/// Reads a BEIR `queries.jsonl` (optional `instruction` field kept).
///
/// # Errors
/// I/O, JSON, a missing, mistyped or blank `_id`/`text`, or a duplicate id.
pub fn read_queries_jsonl(path: impl AsRef<Path>) -> Result<Vec<Query>> {
    let path = path.as_ref();
    let mut queries = Vec::new();
    let mut ids = IdSet::new();
    for_each_json_object(path, |line, obj| {
        let id = json_id(obj, "_id", path, line)?;
        ids.insert(&id, path, line)?;
        let text = json_nonempty_str(obj, "text", path, line)?.to_string();
        let instruction = json_opt_str(obj, "instruction", path, line)?.map(str::to_string);
        queries.push(Query {
            id,
            text,
            instruction,
        });
        Ok(())
    })?;
    Ok(queries)
}

/// Reads a qrels TSV: `query-id <TAB> corpus-id <TAB> score` per line (lines without a tab are
/// split on whitespace). The first non-blank line is taken as a header, and skipped, when its
/// third column is not a number. Scores are integers or integral floats (`1.0`). Blank lines are
/// skipped.
///
/// # Errors
/// I/O, UTF-8, a line without exactly three columns, a non-integer score, or the same pair judged
/// twice with different scores.
pub fn read_qrels_tsv(path: impl AsRef<Path>) -> Result<Qrels> {
    let path = path.as_ref();
    let text = read_text(path)?;
    let mut qrels = Qrels::new();
    let mut first = true;
    for (line, content) in numbered_lines(&text) {
        if content.trim().is_empty() {
            continue;
        }
        let cols: Vec<&str> = if content.contains('\t') {
            content.split('\t').map(str::trim).collect()
        } else {
            content.split_whitespace().collect()
        };
        if cols.len() != 3 || cols.iter().any(|c| c.is_empty()) {
            return Err(format_error(
                path,
                line,
                format!(
                    "expected 3 columns (query-id, corpus-id, score), found {}",
                    cols.len()
                ),
            ));
        }
        let is_first = std::mem::replace(&mut first, false);
        let grade = match parse_grade(cols[2]) {
            Ok(g) => g,
            Err(_) if is_first && cols[2].parse::<f64>().is_err() => continue, // header line
            Err(problem) => {
                return Err(format_error(path, line, format!("score {problem}")));
            }
        };
        add_judgment(&mut qrels, cols[0], cols[1], grade, path, line)?;
    }
    Ok(qrels)
}

/// Reads a qrels JSONL file (Hugging Face export): objects with `query-id`, `corpus-id` (strings
/// or integers) and `score` (integer or integral float).
///
/// # Errors
/// I/O, JSON, a missing or mistyped field, a non-integer score, or a conflicting duplicate.
pub fn read_qrels_jsonl(path: impl AsRef<Path>) -> Result<Qrels> {
    let path = path.as_ref();
    let mut qrels = Qrels::new();
    for_each_json_object(path, |line, obj| {
        let query = json_id(obj, "query-id", path, line)?;
        let doc = json_id(obj, "corpus-id", path, line)?;
        let grade = match obj.get("score") {
            Some(Value::Number(n)) => parse_grade(&n.to_string()),
            None => Err(Problem::Missing),
            Some(Value::Null) => Err(Problem::Null),
            Some(other) => Err(Problem::WrongType {
                found: json_type_name(other).to_string(),
                expected: "number",
            }),
        }
        .map_err(|problem| record_error(path, line, "score", problem))?;
        add_judgment(&mut qrels, &query, &doc, grade, path, line)
    })?;
    Ok(qrels)
}

/// Loads a BEIR dataset folder (`corpus.jsonl`, `queries.jsonl`, `qrels/{split}.tsv`). The set is
/// named after the folder.
///
/// # Errors
/// [`crate::Error::MissingFile`] for an absent file, else as the readers above.
pub fn load_beir(dir: impl AsRef<Path>, split: &str) -> Result<EvalSet> {
    let dir = dir.as_ref();
    let corpus = read_corpus_jsonl(require_file(dir, "corpus.jsonl", "BEIR corpus")?)?;
    let queries = read_queries_jsonl(require_file(dir, "queries.jsonl", "BEIR queries")?)?;
    let qrels = read_qrels_tsv(require_file(
        dir,
        &format!("qrels/{split}.tsv"),
        "BEIR qrels",
    )?)?;
    Ok(EvalSet {
        name: dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "beir".to_string()),
        corpus,
        queries,
        qrels,
        top_ranked: None,
    })
}
