//! Mined hard negatives for InF-IR training records: which passages may be mined for a record,
//! how the mined ones are chosen from a model's scores, and the JSONL file that keeps them.
//!
//! # Candidates and the filter
//!
//! The candidates are the distinct passage texts of the training records themselves (every
//! `document_positive`, `hard_negative_document_1` and `hard_negative_document_2`), named by the
//! held-out protocol's ids `r{r}-pos`, `r{r}-n1`, `r{r}-n2` (the first id of a text names it).
//! Nothing outside the training file is a candidate, so no development or test passage leaks
//! into training.
//!
//! Record `r` is mined for its (I+, Q+) row. A candidate is never one of its negatives when it is:
//! - labelled relevant to the pair (I+, Q+) anywhere in the training file: every row of every
//!   record labels its (instruction, query) pair with its passage (so `r`'s own P+ and the P+ of a
//!   record that repeats the pair are out);
//! - already one of `r`'s rows' passages (its P1- and P2-, which are in the batch anyway);
//! - scored above `max_relative` times the positive's score, i.e. within `(1 - max_relative)
//!   |score(positive)|` below the positive's score or above it, whatever the positive's sign
//!   (NV-Retriever's positive-aware
//!   "TopK-PercPos" filter: a passage that the model finds nearly as relevant as the labelled
//!   positive is more likely an unlabelled positive than a negative).
//!
//! The rest are ranked by score (ties: the candidate listed first) and the first `per_record`
//! kept.
//!
//! # File
//!
//! One JSON object per training record, in the training file's order:
//! `{"record": 0, "query_positive": "...", "negatives": [{"id": "r17-pos", "score": 0.61}, ...]}`.
//! [`read_mined_negatives`] checks it against the training records it is used with: one line per
//! record, the record index and its query text, ids that name a passage of the file, and the
//! first rule of the filter (a labelled positive of the pair is refused, naming the line; the
//! other rules depend on the mining model's scores and are the miner's business).

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::Arc;

use serde_json::{Map, Value, json};

use crate::error::{Error, Problem, Result};
use crate::flatten::record_rows;
use crate::heldout::{n1_id, n2_id, pos_id};
use crate::load::{for_each_json_object, format_error, json_str, record_error};
use crate::record::{InfIrRecord, json_type_name};

/// A passage that may be mined: its id (`r{r}-pos` / `-n1` / `-n2`) and text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    /// The held-out protocol's id of the first record field holding this text.
    pub id: String,
    /// The passage text.
    pub text: Arc<str>,
}

/// One mined negative of a record: the candidate's id and the mining model's score.
#[derive(Debug, Clone, PartialEq)]
pub struct MinedPassage {
    /// The candidate's id.
    pub id: String,
    /// The mining model's similarity of the record's (I+, Q+) to the passage.
    pub score: f32,
}

/// How [`select_hard_negatives`] chooses.
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub struct MiningOptions {
    /// Negatives kept per record (the most similar that pass the filter).
    pub per_record: usize,
    /// A candidate scoring above `score(positive) - (1 - max_relative) |score(positive)|`
    /// (`max_relative * score(positive)` for a positive score above 0) is dropped; `None` keeps
    /// every score. Default 0.95, NV-Retriever's recommended margin.
    pub max_relative: Option<f32>,
}

impl Default for MiningOptions {
    fn default() -> Self {
        MiningOptions {
            per_record: 8,
            max_relative: Some(0.95),
        }
    }
}

impl MiningOptions {
    /// The defaults with `per_record` negatives per record.
    pub fn new(per_record: usize) -> Self {
        MiningOptions {
            per_record,
            ..MiningOptions::default()
        }
    }

    /// Sets the positive-aware margin (`None`: no margin).
    pub fn with_max_relative(mut self, max_relative: Option<f32>) -> Self {
        self.max_relative = max_relative;
        self
    }
}

/// The distinct passage texts of `records`, in record order (P+, P1-, P2- of record 0, then of
/// record 1, ...), each named by the id of its first occurrence.
pub fn mining_candidates(records: &[InfIrRecord]) -> Vec<Candidate> {
    let mut seen = HashSet::new();
    let mut out = Vec::new();
    for (r, record) in records.iter().enumerate() {
        for (id, text) in [
            (pos_id(r), &record.document_positive),
            (n1_id(r), &record.hard_negative_document_1),
            (n2_id(r), &record.hard_negative_document_2),
        ] {
            if seen.insert(Arc::clone(text)) {
                out.push(Candidate {
                    id,
                    text: Arc::clone(text),
                });
            }
        }
    }
    out
}

/// Passages labelled relevant, by query.
type PassagesByQuery = HashMap<Arc<str>, HashSet<Arc<str>>>;

/// Every (instruction, query) pair of the training rows with the passages labelled relevant
/// to it.
#[derive(Debug, Clone, Default)]
pub struct LabelledPairs(HashMap<Arc<str>, PassagesByQuery>);

impl LabelledPairs {
    /// The labels of every row of `records`.
    pub fn new(records: &[InfIrRecord]) -> Self {
        let mut map: HashMap<Arc<str>, PassagesByQuery> = HashMap::new();
        for (r, record) in records.iter().enumerate() {
            for row in record_rows(r, record) {
                map.entry(row.instruction)
                    .or_default()
                    .entry(row.query)
                    .or_default()
                    .insert(row.passage);
            }
        }
        LabelledPairs(map)
    }

    /// Whether `passage` is labelled relevant to (`instruction`, `query`).
    pub fn is_positive(&self, instruction: &str, query: &str, passage: &str) -> bool {
        self.0
            .get(instruction)
            .and_then(|by_query| by_query.get(query))
            .is_some_and(|set| set.contains(passage))
    }
}

/// The highest score a candidate may have under the positive-aware margin `m`.
fn margin_limit(m: f32, positive_score: f32) -> f32 {
    positive_score - (1.0 - m) * positive_score.abs()
}

/// The filter of the [module docs](self) for one set of training records and candidates:
/// [`HardNegativeFilter::select`] chooses one record's negatives from any subset of scored
/// candidates (all of them, or an exact search's top hits).
#[derive(Debug, Clone)]
pub struct HardNegativeFilter<'a> {
    records: &'a [InfIrRecord],
    candidates: &'a [Candidate],
    labelled: LabelledPairs,
    options: MiningOptions,
}

impl<'a> HardNegativeFilter<'a> {
    /// The filter for `records` (the training set) and its `candidates`
    /// ([`mining_candidates`]).
    pub fn new(
        records: &'a [InfIrRecord],
        candidates: &'a [Candidate],
        options: MiningOptions,
    ) -> Self {
        HardNegativeFilter {
            records,
            candidates,
            labelled: LabelledPairs::new(records),
            options,
        }
    }

    /// Whether candidate `c` may be a negative of record `r` with `score`, given the record's
    /// positive score.
    pub fn allows(&self, r: usize, c: usize, score: f32, positive_score: f32) -> bool {
        let record = &self.records[r];
        let text = &*self.candidates[c].text;
        score.is_finite()
            && self
                .options
                .max_relative
                .is_none_or(|m| score <= margin_limit(m, positive_score))
            && text != &*record.hard_negative_document_1
            && text != &*record.hard_negative_document_2
            && !self.labelled.is_positive(
                &record.instruction_positive,
                &record.query_positive,
                text,
            )
    }

    /// Record `r`'s negatives among `hits` (`(candidate index, score)`, any order): those the
    /// filter allows, highest score first (equal scores: lower candidate index first), at most
    /// `per_record`.
    pub fn select(
        &self,
        r: usize,
        hits: &[(usize, f32)],
        positive_score: f32,
    ) -> Vec<MinedPassage> {
        let mut kept: Vec<(usize, f32)> = hits
            .iter()
            .copied()
            .filter(|&(c, score)| self.allows(r, c, score, positive_score))
            .collect();
        kept.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        kept.truncate(self.options.per_record);
        kept.into_iter()
            .map(|(c, score)| MinedPassage {
                id: self.candidates[c].id.clone(),
                score,
            })
            .collect()
    }

    /// The options it filters with.
    pub fn options(&self) -> MiningOptions {
        self.options
    }
}

/// Chooses each record's hard negatives from `scores` (row-major `[records, candidates]`: the
/// mining model's similarity of record r's (I+, Q+) to candidate c) and `positive_scores` (its
/// similarity to record r's P+), with the filter of the [module docs](self).
///
/// # Errors
/// [`Error::Invalid`] when the score lengths do not match the records and candidates.
pub fn select_hard_negatives(
    records: &[InfIrRecord],
    candidates: &[Candidate],
    scores: &[f32],
    positive_scores: &[f32],
    options: MiningOptions,
) -> Result<Vec<Vec<MinedPassage>>> {
    let (n, c) = (records.len(), candidates.len());
    if scores.len() != n * c || positive_scores.len() != n {
        return Err(Error::Invalid(format!(
            "mining scores: expected {n} x {c} candidate scores and {n} positive scores, got {} \
             and {}",
            scores.len(),
            positive_scores.len()
        )));
    }
    let filter = HardNegativeFilter::new(records, candidates, options);
    Ok((0..n)
        .map(|r| {
            let hits: Vec<(usize, f32)> = scores[r * c..(r + 1) * c]
                .iter()
                .copied()
                .enumerate()
                .collect();
            filter.select(r, &hits, positive_scores[r])
        })
        .collect())
}

/// The mined-negatives file's bytes for `records` (see the [module docs](self)).
pub fn mined_negatives_jsonl(records: &[InfIrRecord], lists: &[Vec<MinedPassage>]) -> Vec<u8> {
    let mut out = Vec::new();
    for (r, (record, list)) in records.iter().zip(lists).enumerate() {
        let negatives: Vec<Value> = list
            .iter()
            .map(|m| json!({"id": m.id, "score": m.score}))
            .collect();
        let line = json!({
            "record": r,
            "query_positive": &*record.query_positive,
            "negatives": negatives,
        });
        out.extend_from_slice(line.to_string().as_bytes());
        out.push(b'\n');
    }
    out
}

/// The text a candidate id names in `records`, if any.
fn resolve(records: &[InfIrRecord], id: &str) -> Option<Arc<str>> {
    let rest = id.strip_prefix('r')?;
    let (index, field) = rest.split_once('-')?;
    let record = records.get(index.parse::<usize>().ok()?)?;
    Some(Arc::clone(match field {
        "pos" => &record.document_positive,
        "n1" => &record.hard_negative_document_1,
        "n2" => &record.hard_negative_document_2,
        _ => return None,
    }))
}

/// Reads a mined-negatives file for `records` (the training records it was mined from, in the
/// same order): for each record, the texts of its negatives in the file's order.
///
/// # Errors
/// I/O and JSON errors; a line whose `record` is not its record index, whose `query_positive`
/// differs from the record's (a file mined from another training file), whose `negatives` is
/// not a list of objects with an `id` naming a passage of `records`, or which names a passage
/// labelled relevant to the record's (I+, Q+); fewer or more lines than records. Each error
/// names the file and line.
pub fn read_mined_negatives(
    path: impl AsRef<Path>,
    records: &[InfIrRecord],
) -> Result<Vec<Vec<Arc<str>>>> {
    let path = path.as_ref();
    let labelled = LabelledPairs::new(records);
    let mut out: Vec<Vec<Arc<str>>> = Vec::with_capacity(records.len());
    let mut last_line = 0;
    for_each_json_object(path, |line, obj: &Map<String, Value>| {
        last_line = line;
        let r = out.len();
        let Some(record) = records.get(r) else {
            return Err(format_error(
                path,
                line,
                format!(
                    "more lines than the {} training records (mined from another training file?)",
                    records.len()
                ),
            ));
        };
        match obj.get("record").and_then(Value::as_u64) {
            Some(x) if x == r as u64 => {}
            Some(x) => {
                return Err(format_error(
                    path,
                    line,
                    format!("`record` is {x}, expected {r} (one line per record, in order)"),
                ));
            }
            None => {
                return Err(record_error(
                    path,
                    line,
                    "record",
                    match obj.get("record") {
                        None => Problem::Missing,
                        Some(v) => Problem::WrongType {
                            found: json_type_name(v).into(),
                            expected: "non-negative integer",
                        },
                    },
                ));
            }
        }
        let query = json_str(obj, "query_positive", path, line)?;
        if query != &*record.query_positive {
            return Err(format_error(
                path,
                line,
                format!(
                    "`query_positive` {query:?} is not record {r}'s ({:?}): the file was mined \
                     from another training file",
                    &*record.query_positive
                ),
            ));
        }
        let list = match obj.get("negatives") {
            Some(Value::Array(list)) => list,
            Some(v) => {
                return Err(record_error(
                    path,
                    line,
                    "negatives",
                    Problem::WrongType {
                        found: json_type_name(v).into(),
                        expected: "list",
                    },
                ));
            }
            None => return Err(record_error(path, line, "negatives", Problem::Missing)),
        };
        let mut texts = Vec::with_capacity(list.len());
        for (k, item) in list.iter().enumerate() {
            let id = item.get("id").and_then(Value::as_str).ok_or_else(|| {
                format_error(path, line, format!("negatives[{k}] has no string `id`"))
            })?;
            let text = resolve(records, id).ok_or_else(|| {
                format_error(
                    path,
                    line,
                    format!(
                        "negatives[{k}]: {id:?} names no passage of the {} training records",
                        records.len()
                    ),
                )
            })?;
            if labelled.is_positive(&record.instruction_positive, &record.query_positive, &text) {
                return Err(format_error(
                    path,
                    line,
                    format!(
                        "negatives[{k}]: {id:?} is labelled relevant to record {r}'s (I+, Q+); a \
                         labelled positive is never a negative"
                    ),
                ));
            }
            texts.push(text);
        }
        out.push(texts);
        Ok(())
    })?;
    if out.is_empty() && !records.is_empty() {
        return Err(format_error(
            path,
            1,
            format!(
                "the file holds no line, the training file has {} records",
                records.len()
            ),
        ));
    }
    if out.len() != records.len() {
        return Err(format_error(
            path,
            last_line,
            format!(
                "the file ends after {} records, the training file has {}",
                out.len(),
                records.len()
            ),
        ));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(i: usize, shared_pair: bool) -> InfIrRecord {
        let s = |x: String| -> Arc<str> { Arc::from(x) };
        InfIrRecord {
            query_positive: s(if shared_pair {
                "q".into()
            } else {
                format!("q{i}")
            }),
            instruction_positive: s(if shared_pair {
                "i".into()
            } else {
                format!("i{i}")
            }),
            document_positive: s(format!("p{i}")),
            query_negative: s(format!("qn{i}")),
            instruction_negative: s(format!("in{i}")),
            hard_negative_document_1: s(format!("n1-{i}")),
            hard_negative_document_2: s(format!("n2-{i}")),
        }
    }

    /// A naive reference: for each record, every candidate id with its score, minus the
    /// excluded ones, sorted by (score desc, candidate index).
    fn naive(
        records: &[InfIrRecord],
        cands: &[Candidate],
        scores: &[f32],
        pos: &[f32],
        opts: MiningOptions,
    ) -> Vec<Vec<String>> {
        let c = cands.len();
        (0..records.len())
            .map(|r| {
                let mut v: Vec<(f32, usize)> = Vec::new();
                for (j, cand) in cands.iter().enumerate() {
                    let t = &*cand.text;
                    let labelled = records.iter().any(|s| {
                        (s.instruction_positive == records[r].instruction_positive
                            && s.query_positive == records[r].query_positive
                            && &*s.document_positive == t)
                            || (s.instruction_negative == records[r].instruction_positive
                                && s.query_positive == records[r].query_positive
                                && &*s.hard_negative_document_1 == t)
                            || (s.instruction_positive == records[r].instruction_positive
                                && s.query_negative == records[r].query_positive
                                && &*s.hard_negative_document_2 == t)
                    });
                    let own = t == &*records[r].hard_negative_document_1
                        || t == &*records[r].hard_negative_document_2;
                    let too_close = opts.max_relative.is_some_and(|m| {
                        f64::from(scores[r * c + j])
                            > f64::from(pos[r]) - (1.0 - f64::from(m)) * f64::from(pos[r]).abs()
                    });
                    if !labelled && !own && !too_close {
                        v.push((scores[r * c + j], j));
                    }
                }
                v.sort_by(|a, b| b.0.partial_cmp(&a.0).unwrap().then(a.1.cmp(&b.1)));
                v.into_iter()
                    .take(opts.per_record)
                    .map(|(_, j)| cands[j].id.clone())
                    .collect()
            })
            .collect()
    }

    #[test]
    fn selection_matches_a_naive_reference_and_round_trips_through_the_file() {
        let mut records: Vec<InfIrRecord> = (0..7).map(|i| record(i, i >= 4)).collect();
        // A repeated passage text: record 6's P1- is record 0's P+.
        records[6].hard_negative_document_1 = Arc::clone(&records[0].document_positive);
        let cands = mining_candidates(&records);
        assert_eq!(cands.len(), 7 * 3 - 1);
        assert_eq!(cands[0].id, "r0-pos");
        // Deterministic pseudo-random scores with ties.
        let c = cands.len();
        let scores: Vec<f32> = (0..7 * c)
            .map(|x| ((x * 37 % 11) as f32) / 10.0 - 0.2)
            .collect();
        // Record 0's positive scores below 0: its margin must stay below the positive.
        let pos: Vec<f32> = (0..7)
            .map(|r| if r == 0 { -0.1 } else { 0.5 + r as f32 * 0.05 })
            .collect();
        for opts in [
            MiningOptions::new(3),
            MiningOptions::new(100),
            MiningOptions::new(5).with_max_relative(None),
        ] {
            let got = select_hard_negatives(&records, &cands, &scores, &pos, opts).unwrap();
            let ids: Vec<Vec<String>> = got
                .iter()
                .map(|l| l.iter().map(|m| m.id.clone()).collect())
                .collect();
            assert_eq!(ids, naive(&records, &cands, &scores, &pos, opts));
            // Records 4..7 share (I+, Q+): none of their P+ is mined for any of them.
            for list in &got[4..7] {
                for m in list {
                    assert!(!["r4-pos", "r5-pos", "r6-pos"].contains(&m.id.as_str()));
                }
            }
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("mined.jsonl");
            std::fs::write(&path, mined_negatives_jsonl(&records, &got)).unwrap();
            let texts = read_mined_negatives(&path, &records).unwrap();
            for (list, text) in got.iter().zip(&texts) {
                let want: Vec<Arc<str>> = list
                    .iter()
                    .map(|m| resolve(&records, &m.id).unwrap())
                    .collect();
                assert_eq!(text, &want);
            }
        }
        assert!(
            select_hard_negatives(&records, &cands, &scores[1..], &pos, MiningOptions::new(1))
                .is_err()
        );
    }

    #[test]
    fn bad_files_name_the_line_and_the_problem() {
        let records: Vec<InfIrRecord> = (0..3).map(|i| record(i, false)).collect();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.jsonl");
        let line = |r: usize, q: &str, ids: &[&str]| {
            let negs: Vec<Value> = ids.iter().map(|i| json!({"id": i, "score": 0.1})).collect();
            json!({"record": r, "query_positive": q, "negatives": negs}).to_string()
        };
        let cases: Vec<(Vec<String>, &str)> = vec![
            (
                vec![
                    line(0, "q0", &["r1-pos"]),
                    line(1, "q1", &[]),
                    line(2, "q2", &["r0-n3"]),
                ],
                "line 3: negatives[0]: \"r0-n3\" names no passage",
            ),
            (
                vec![line(0, "q0", &["r0-pos"])],
                "line 1: negatives[0]: \"r0-pos\" is labelled relevant",
            ),
            (
                vec![line(0, "q0", &[]), line(1, "qX", &[])],
                "line 2: `query_positive` \"qX\" is not record 1's",
            ),
            (
                vec![line(0, "q0", &[]), line(2, "q2", &[])],
                "line 2: `record` is 2, expected 1",
            ),
            (
                vec![line(0, "q0", &[]), line(1, "q1", &[])],
                "line 2: the file ends after 2 records, the training file has 3",
            ),
            (
                vec![r#"{"record": 0, "query_positive": "q0", "negatives": 3}"#.to_string()],
                "line 1: field `negatives` is a number, expected a list",
            ),
        ];
        for (lines, want) in cases {
            std::fs::write(&path, lines.join("\n") + "\n").unwrap();
            let err = read_mined_negatives(&path, &records)
                .unwrap_err()
                .to_string();
            assert!(err.contains(want), "{err}\nwanted: {want}");
            assert!(err.contains("m.jsonl"), "{err}");
        }
    }
}
