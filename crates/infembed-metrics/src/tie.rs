//! The tie rule: how equal scores are ordered.

use std::cmp::Ordering;

/// How documents are ordered: by score, descending, and then by document id to break ties.
///
/// The order of documents in the input never matters (the rank column of a TREC run file is
/// ignored, as trec_eval ignores it). Document ids compare byte-wise (C `strcmp` order).
/// Scores `0.0` and `-0.0` are equal.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum TieBreak {
    /// trec_eval's (and so pytrec_eval's) rule: scores are compared after rounding to `f32`,
    /// because trec_eval stores them as C `float`, and equal scores rank by document id,
    /// **descending** (`comp_sim_docno` in trec_eval's `form_res_rels.c`). Two scores that differ
    /// only beyond `f32` precision are therefore a tie. This is the default.
    #[default]
    TrecEval,
    /// Scores compared at full `f64` precision; ties by document id, descending. This is what
    /// mteb's own Python sorts give (its p-MRR and its `mrr_at_k`), which compare Python floats.
    DocIdDescending,
    /// Scores compared at full `f64` precision; ties by document id, ascending.
    DocIdAscending,
}

impl TieBreak {
    /// The value scores are compared by under this rule (rounded to `f32` for
    /// [`TieBreak::TrecEval`]; `-0.0` becomes `0.0`).
    #[inline]
    pub fn key(self, score: f64) -> f64 {
        let key = match self {
            TieBreak::TrecEval => f64::from(score as f32),
            TieBreak::DocIdDescending | TieBreak::DocIdAscending => score,
        };
        if key == 0.0 { 0.0 } else { key }
    }

    /// Whether the document `(key_a, doc_a)` ranks strictly before `(key_b, doc_b)`, where the
    /// keys come from [`TieBreak::key`]. Keys must not be NaN.
    #[inline]
    pub fn precedes(self, key_a: f64, doc_a: &str, key_b: f64, doc_b: &str) -> bool {
        if key_a != key_b {
            return key_a > key_b;
        }
        match self {
            TieBreak::TrecEval | TieBreak::DocIdDescending => doc_a > doc_b,
            TieBreak::DocIdAscending => doc_a < doc_b,
        }
    }

    /// The ranking order as an [`Ordering`]: `Less` when `a` ranks before `b`.
    #[inline]
    pub fn compare(self, key_a: f64, doc_a: &str, key_b: f64, doc_b: &str) -> Ordering {
        match key_b.partial_cmp(&key_a).unwrap_or(Ordering::Equal) {
            Ordering::Equal => match self {
                TieBreak::TrecEval | TieBreak::DocIdDescending => doc_b.cmp(doc_a),
                TieBreak::DocIdAscending => doc_a.cmp(doc_b),
            },
            other => other,
        }
    }
}
