//! A FollowIR-style instruction-following test built from any InF-IR-format file, following the
//! held-out protocol of `data/inf-ir-sample/README.md`:
//!
//! - corpus: for every record `r` (its index in the record slice, which is the 0-based line index
//!   of a clean JSONL file) the documents `r{r}-pos` = `document_positive`,
//!   `r{r}-n1` = `hard_negative_document_1`, `r{r}-n2` = `hard_negative_document_2` (in that order,
//!   record by record), then the distractor passages as `d-{passage_id}` in the given order;
//! - queries: one per record, id `r{r}`, text `query_positive`, original instruction
//!   `instruction_positive`, changed instruction `instruction_negative`; how a pair becomes one
//!   string is the caller's [`QueryTemplate`](crate::QueryTemplate) (default `"{query} {instruction}"`);
//! - qrels of the original run: `r{r}` -> {`r{r}-pos`: 1}; of the changed run: `r{r}` ->
//!   {`r{r}-n1`: 1};
//! - changed documents: `r{r}` -> \[`r{r}-pos`\] (relevant under the original instruction, no longer
//!   under the changed one; this is also what [`crate::eval::changed_docs`] derives from the two
//!   qrels).
//!
//! Ranking, p-MRR and the other metrics of the protocol are computed by the evaluation harness.

use std::collections::{HashMap, HashSet};
use std::path::Path;

use crate::error::{Error, Result};
use crate::eval::{Document, FollowIrQuery, FollowIrSet, Qrels};
use crate::load::{IdSet, for_each_json_object, json_id, json_nonempty_str};
use crate::record::InfIrRecord;

/// A distractor passage for held-out corpora.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Distractor {
    /// Its source id (the corpus id becomes `d-{passage_id}`).
    pub passage_id: String,
    /// The passage text.
    pub passage: String,
}

/// Reads a distractor JSONL file: objects with `passage_id` (string or integer) and `passage`
/// (non-blank); other keys (`query_id`, `query`) are ignored.
///
/// # Errors
/// I/O, JSON, a missing or bad field, or a repeated `passage_id`.
pub fn read_distractors(path: impl AsRef<Path>) -> Result<Vec<Distractor>> {
    let path = path.as_ref();
    let mut out = Vec::new();
    let mut ids = IdSet::new();
    for_each_json_object(path, |line, obj| {
        let passage_id = json_id(obj, "passage_id", path, line)?;
        ids.insert(&passage_id, path, line)?;
        let passage = json_nonempty_str(obj, "passage", path, line)?.to_string();
        out.push(Distractor {
            passage_id,
            passage,
        });
        Ok(())
    })?;
    Ok(out)
}

/// The corpus id of record `r`'s positive document.
pub fn pos_id(r: usize) -> String {
    format!("r{r}-pos")
}

/// The corpus id of record `r`'s first hard negative (relevant to I-, Q+).
pub fn n1_id(r: usize) -> String {
    format!("r{r}-n1")
}

/// The corpus id of record `r`'s second hard negative (relevant to I+, Q-).
pub fn n2_id(r: usize) -> String {
    format!("r{r}-n2")
}

/// The query id of record `r`.
pub fn query_id(r: usize) -> String {
    format!("r{r}")
}

/// The corpus id of a distractor passage.
pub fn distractor_id(passage_id: &str) -> String {
    format!("d-{passage_id}")
}

/// Builds the held-out instruction-following set (see the module docs).
///
/// # Errors
/// [`Error::DuplicateCorpusId`] when two distractors share a passage id.
pub fn build_heldout(
    name: &str,
    records: &[InfIrRecord],
    distractors: &[Distractor],
) -> Result<FollowIrSet> {
    let mut corpus = Vec::with_capacity(3 * records.len() + distractors.len());
    let mut queries = Vec::with_capacity(records.len());
    let mut qrels_og = Qrels::with_capacity(records.len());
    let mut qrels_changed = Qrels::with_capacity(records.len());
    let mut changed_docs = HashMap::with_capacity(records.len());
    let doc = |id: String, text: &str| Document {
        id,
        title: String::new(),
        text: text.to_string(),
    };
    for (r, rec) in records.iter().enumerate() {
        corpus.push(doc(pos_id(r), &rec.document_positive));
        corpus.push(doc(n1_id(r), &rec.hard_negative_document_1));
        corpus.push(doc(n2_id(r), &rec.hard_negative_document_2));
        let q = query_id(r);
        queries.push(FollowIrQuery {
            id: q.clone(),
            text: rec.query_positive.to_string(),
            instruction_og: rec.instruction_positive.to_string(),
            instruction_changed: rec.instruction_negative.to_string(),
        });
        qrels_og.insert(q.clone(), HashMap::from([(pos_id(r), 1)]));
        qrels_changed.insert(q.clone(), HashMap::from([(n1_id(r), 1)]));
        changed_docs.insert(q, vec![pos_id(r)]);
    }
    let mut seen = HashSet::with_capacity(distractors.len());
    for d in distractors {
        let id = distractor_id(&d.passage_id);
        if !seen.insert(id.clone()) {
            return Err(Error::DuplicateCorpusId {
                id,
                what: "a held-out corpus",
            });
        }
        corpus.push(doc(id, &d.passage));
    }
    Ok(FollowIrSet {
        name: name.to_string(),
        corpus,
        queries,
        qrels_og,
        qrels_changed,
        changed_docs,
        top_ranked: None,
    })
}
