//! The pipeline's input: (query, passage) pairs and the pool of passages distractors come from.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::Path;

use serde_json::Value;

use crate::config::InputConfig;
use crate::error::{Error, Result};

/// One (query, passage) pair to turn into an InF-IR record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pair {
    /// The query's id in the input.
    pub query_id: String,
    /// Q+.
    pub query: String,
    /// The passage's id in the input.
    pub passage_id: String,
    /// P+.
    pub passage: String,
}

/// A passage that may serve as a distractor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolPassage {
    /// Its id in the input.
    pub id: String,
    /// Its text.
    pub text: String,
}

/// Pairs plus the distractor pool.
#[derive(Debug, Clone, Default)]
pub struct Input {
    /// The pairs, in input order, after `offset` and `limit`.
    pub pairs: Vec<Pair>,
    /// Candidate distractors (every passage of the input, in input order).
    pub pool: Vec<PoolPassage>,
    /// Relevance judgments whose document is missing from the corpus (skipped).
    pub missing_passages: usize,
}

/// Loads the input the config names.
///
/// # Errors
/// Loader errors (naming the file and line), or [`Error::NoPairs`].
pub fn load_input(config: &InputConfig) -> Result<Input> {
    let (mut input, origin) = match (&config.beir, &config.jsonl) {
        (Some(dir), _) => (load_beir_pairs(dir, &config.split)?, dir.clone()),
        (None, Some(path)) => (load_jsonl_pairs(path)?, path.clone()),
        (None, None) => unreachable!("SynthConfig::validate requires one input"),
    };
    let pairs = std::mem::take(&mut input.pairs);
    input.pairs = pairs
        .into_iter()
        .skip(config.offset)
        .take(config.limit.unwrap_or(usize::MAX))
        .collect();
    if input.pairs.is_empty() {
        return Err(Error::NoPairs { origin });
    }
    Ok(input)
}

/// Pairs from a BEIR folder: for each query (file order) each relevant document (grade > 0), by
/// document id. Passages are the data crate's [`infembed_data::Document::full_text`]. Judgments
/// whose document is absent or blank are skipped and counted. The pool is the non-blank corpus.
///
/// # Errors
/// The data crate's loader errors.
pub fn load_beir_pairs(dir: &Path, split: &str) -> Result<Input> {
    let set = infembed_data::load_beir(dir, split)?;
    let docs: HashMap<&str, usize> = set
        .corpus
        .iter()
        .enumerate()
        .map(|(i, d)| (d.id.as_str(), i))
        .collect();
    let mut pairs = Vec::new();
    let mut missing = 0;
    for q in &set.queries {
        let Some(judged) = set.qrels.get(&q.id) else {
            continue;
        };
        let relevant: BTreeMap<&str, i32> = judged
            .iter()
            .filter(|(_, g)| **g > 0)
            .map(|(d, g)| (d.as_str(), *g))
            .collect();
        for doc_id in relevant.keys() {
            match docs
                .get(doc_id)
                .filter(|&&i| !set.corpus[i].full_text().trim().is_empty())
            {
                Some(&i) => pairs.push(Pair {
                    query_id: q.id.clone(),
                    query: q.text.clone(),
                    passage_id: doc_id.to_string(),
                    passage: set.corpus[i].full_text(),
                }),
                None => missing += 1,
            }
        }
    }
    let pool = set
        .corpus
        .iter()
        .filter(|d| !d.full_text().trim().is_empty())
        .map(|d| PoolPassage {
            id: d.id.clone(),
            text: d.full_text(),
        })
        .collect();
    Ok(Input {
        pairs,
        pool,
        missing_passages: missing,
    })
}

/// Pairs from a JSONL file: `query`, `passage` (non-blank strings), optional `query_id`,
/// `passage_id` (string or integer; default `line{N}`, N 1-based). Blank lines are skipped. The
/// pool is the distinct passages (first id wins).
///
/// # Errors
/// I/O, invalid JSON, or a missing/blank/mistyped field, naming file and line.
pub fn load_jsonl_pairs(path: &Path) -> Result<Input> {
    // The data crate's JSONL reader, with its line-level errors said as this crate's.
    let line_err = |e: infembed_data::Error| match e {
        infembed_data::Error::Io { source, .. } => Error::Io {
            path: path.to_path_buf(),
            source,
        },
        infembed_data::Error::Json { line, source, .. } => Error::InputJson {
            path: path.to_path_buf(),
            line,
            source,
        },
        infembed_data::Error::Record {
            at: infembed_data::Location::Line(line),
            ..
        } => Error::InputField {
            path: path.to_path_buf(),
            line,
            field: "(line)",
            problem: "is not a JSON object",
        },
        other => Error::Data(other),
    };
    let mut pairs = Vec::new();
    let mut pool = Vec::new();
    let mut seen_text = HashSet::new();
    for item in infembed_data::JsonObjects::open(path).map_err(line_err)? {
        let (line_no, obj) = item.map_err(line_err)?;
        // The data crate's typed field readers; an absent or null id defaults to `line{N}`.
        let text = |field: &str| -> Result<String> {
            Ok(infembed_data::json_nonempty_str(&obj, field, path, line_no)?.to_string())
        };
        let id = |field: &str| -> Result<String> {
            match obj.get(field) {
                None | Some(Value::Null) => Ok(format!("line{line_no}")),
                Some(_) => Ok(infembed_data::json_id(&obj, field, path, line_no)?),
            }
        };
        let pair = Pair {
            query_id: id("query_id")?,
            query: text("query")?,
            passage_id: id("passage_id")?,
            passage: text("passage")?,
        };
        if seen_text.insert(pair.passage.clone()) {
            pool.push(PoolPassage {
                id: pair.passage_id.clone(),
                text: pair.passage.clone(),
            });
        }
        pairs.push(pair);
    }
    Ok(Input {
        pairs,
        pool,
        missing_passages: 0,
    })
}
