//! FollowIR in its published layout (the Hugging Face datasets `jhu-clsp/robust04-instructions`,
//! `jhu-clsp/core17-instructions`, `jhu-clsp/news21-instructions`, as mteb's
//! `HFDataLoaderInstructions` reads them).
//!
//! Files accepted in the dataset folder (names are exact):
//!
//! | file | required | content |
//! |---|---|---|
//! | `corpus.jsonl` | yes | `_id`, `title` (optional / null), `text` |
//! | `queries.jsonl` | yes | `_id`, `text`, `instruction_og`, `instruction_changed`; other keys (`keywords`, `short_query`) ignored |
//! | `qrels_og/{split}.tsv` or `qrels_og/{split}.jsonl` | yes (TSV preferred when both exist) | `query-id`, `corpus-id`, `score` (TSV with header line; scores integer or `1.0`-style) |
//! | `qrels_changed/{split}.tsv` or `qrels_changed/{split}.jsonl` | yes (same) | as above |
//! | `top_ranked.jsonl` | no | `qid`, `pid`: one candidate per line (as published), or `pid` an array of candidates |
//!
//! The split is normally `test`. Query ids are the same in `queries.jsonl` and both qrels files.
//! As mteb does, only queries that have judgments in `qrels_og` are kept. The changed documents are
//! derived with [`crate::eval::changed_docs`].

use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::error::{Error, Result};
use crate::eval::{FollowIrQuery, FollowIrSet, Qrels, TopRanked, changed_docs};
use crate::load::beir::{read_corpus_jsonl, read_qrels_jsonl, read_qrels_tsv};
use crate::load::{IdSet, find_file, for_each_json_object, id_value, json_id, json_nonempty_str};

/// Reads a FollowIR `queries.jsonl`.
///
/// # Errors
/// I/O, JSON, a missing/blank `_id`, `text`, `instruction_og` or `instruction_changed`, or a
/// duplicate id.
pub fn read_followir_queries(path: impl AsRef<Path>) -> Result<Vec<FollowIrQuery>> {
    let path = path.as_ref();
    let mut out = Vec::new();
    let mut ids = IdSet::new();
    for_each_json_object(path, |line, obj| {
        let id = json_id(obj, "_id", path, line)?;
        ids.insert(&id, path, line)?;
        out.push(FollowIrQuery {
            id,
            text: json_nonempty_str(obj, "text", path, line)?.to_string(),
            instruction_og: json_nonempty_str(obj, "instruction_og", path, line)?.to_string(),
            instruction_changed: json_nonempty_str(obj, "instruction_changed", path, line)?
                .to_string(),
        });
        Ok(())
    })?;
    Ok(out)
}

/// Reads a `top_ranked.jsonl`: objects with `qid` and `pid`, where `pid` is one document id (one
/// line per candidate, as published) or an array of ids. Candidates keep file order; a repeated
/// (qid, pid) is kept once.
///
/// # Errors
/// I/O, JSON, or a missing or mistyped `qid` / `pid`.
pub fn read_top_ranked_jsonl(path: impl AsRef<Path>) -> Result<TopRanked> {
    let path = path.as_ref();
    let mut top = TopRanked::new();
    let mut seen = std::collections::HashSet::new();
    for_each_json_object(path, |line, obj| {
        let qid = json_id(obj, "qid", path, line)?;
        let pids = match obj.get("pid") {
            Some(Value::Array(items)) => items
                .iter()
                .map(|v| id_value(Some(v), "pid", path, line))
                .collect::<Result<Vec<_>>>()?,
            other => vec![id_value(other, "pid", path, line)?],
        };
        let list = top.entry(qid.clone()).or_default();
        for pid in pids {
            if seen.insert((qid.clone(), pid.clone())) {
                list.push(pid);
            }
        }
        Ok(())
    })?;
    Ok(top)
}

fn qrels_file(dir: &Path, folder: &str, split: &str, what: &'static str) -> Result<PathBuf> {
    find_file(
        dir,
        &[
            &format!("{folder}/{split}.tsv"),
            &format!("{folder}/{split}.jsonl"),
        ],
        what,
    )
}

fn read_qrels_any(path: &Path) -> Result<Qrels> {
    if path.extension().is_some_and(|e| e == "jsonl") {
        read_qrels_jsonl(path)
    } else {
        read_qrels_tsv(path)
    }
}

/// Loads a FollowIR dataset folder in the published layout (see the module docs). The set is
/// named after the folder.
///
/// # Errors
/// [`crate::Error::MissingFile`] for an absent required file, else as the readers.
pub fn load_followir(dir: impl AsRef<Path>, split: &str) -> Result<FollowIrSet> {
    let dir = dir.as_ref();
    let corpus = read_corpus_jsonl(find_file(dir, &["corpus.jsonl"], "FollowIR corpus")?)?;
    let queries_path = find_file(dir, &["queries.jsonl"], "FollowIR queries")?;
    let queries = read_followir_queries(&queries_path)?;
    let og_path = qrels_file(dir, "qrels_og", split, "FollowIR qrels_og")?;
    let qrels_og = read_qrels_any(&og_path)?;
    let qrels_changed = read_qrels_any(&qrels_file(
        dir,
        "qrels_changed",
        split,
        "FollowIR qrels_changed",
    )?)?;
    let top_path = dir.join("top_ranked.jsonl");
    let top_ranked = if top_path.is_file() {
        Some(read_top_ranked_jsonl(&top_path)?)
    } else {
        None
    };
    let queries: Vec<FollowIrQuery> = queries
        .into_iter()
        .filter(|q| qrels_og.contains_key(&q.id))
        .collect();
    if queries.is_empty() {
        return Err(Error::NoJudgedQueries {
            queries: queries_path,
            qrels: og_path,
        });
    }
    let changed_docs = changed_docs(&qrels_og, &qrels_changed);
    Ok(FollowIrSet {
        name: dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "followir".to_string()),
        corpus,
        queries,
        qrels_og,
        qrels_changed,
        changed_docs,
        top_ranked,
    })
}
