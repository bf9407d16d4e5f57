//! FollowIR's p-MRR (pairwise mean reciprocal rank change), as mteb computes it.

use std::collections::BTreeMap;

use crate::run::{QueryRun, Run};
use crate::tie::TieBreak;

/// The p-MRR score of one document whose relevance the changed instruction removed.
///
/// `og_rank` is its 1-based rank under the original instruction, `changed_rank` under the
/// changed one. The score is `changed_rank / og_rank - 1` when `og_rank >= changed_rank` (the
/// document moved up or stayed: a score in `(-1, 0]`, bad for the model), else
/// `1 - og_rank / changed_rank` (it moved down: a score in `(0, 1)`, good). Panics if a rank is 0.
pub fn p_mrr_document_score(og_rank: usize, changed_rank: usize) -> f64 {
    assert!(og_rank >= 1 && changed_rank >= 1, "ranks start at 1");
    let (o, n) = (og_rank as f64, changed_rank as f64);
    if og_rank >= changed_rank {
        n / o - 1.0
    } else {
        1.0 - o / n
    }
}

/// One changed document's ranks and score.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct PMrrDocument {
    /// Query id.
    pub query: String,
    /// Document id.
    pub doc: String,
    /// 1-based rank under the original instruction (number of ranked documents + 1 if absent).
    pub og_rank: usize,
    /// 1-based rank under the changed instruction (number of ranked documents + 1 if absent).
    pub changed_rank: usize,
    /// [`p_mrr_document_score`] of the two ranks.
    pub score: f64,
}

/// The result of [`p_mrr`].
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct PMrr {
    /// Per changed document, grouped by query in byte order of the ids, documents in the given
    /// order.
    pub documents: Vec<PMrrDocument>,
    /// Mean document score per query (only queries with at least one changed document).
    pub per_query: BTreeMap<String, f64>,
    /// Mean of `per_query` (a fraction in `(-1, 1)`; papers print it x100). `None` when no query
    /// contributed.
    pub mean: Option<f64>,
    /// Queries with changed documents that one of the runs lacks; they are left out (mteb warns
    /// and skips them).
    pub missing_queries: Vec<String>,
}

/// p-MRR exactly as FollowIR / mteb (`calculate_pmrr`) define it.
///
/// `og` is the run under the original instructions and `changed` the run under the changed
/// instructions, both keyed by the same plain query ids; `changed_docs` maps a query id to the
/// documents whose relevance the changed instruction removed. For each such document its rank in
/// each run is taken (documents ranked by `tie`; a document missing from a run ranks at the
/// number of ranked documents + 1) and scored by [`p_mrr_document_score`]; scores are averaged per
/// query, then over queries. Queries with no changed document drop out. A query listed twice in
/// `changed_docs` has its lists concatenated; a document listed twice counts twice.
///
/// Ties: mteb compares Python floats and breaks ties by document id, descending, which is
/// [`TieBreak::DocIdDescending`]; [`TieBreak::TrecEval`] differs only for scores equal in `f32`.
pub fn p_mrr<Q, V, D, L>(og: &Run, changed: &Run, changed_docs: L, tie: TieBreak) -> PMrr
where
    Q: AsRef<str>,
    D: AsRef<str>,
    V: IntoIterator<Item = D>,
    L: IntoIterator<Item = (Q, V)>,
{
    let mut by_query: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (query, docs) in changed_docs {
        by_query
            .entry(query.as_ref().to_owned())
            .or_default()
            .extend(docs.into_iter().map(|d| d.as_ref().to_owned()));
    }
    let mut documents = Vec::new();
    let mut per_query = BTreeMap::new();
    let mut missing_queries = Vec::new();
    for (query, docs) in by_query {
        let (Some(og_docs), Some(changed_docs)) = (og.query(&query), changed.query(&query)) else {
            missing_queries.push(query);
            continue;
        };
        if docs.is_empty() {
            continue;
        }
        let mut sum = 0.0;
        for doc in &docs {
            let og_rank = rank_or_after_last(og_docs, doc, tie);
            let changed_rank = rank_or_after_last(changed_docs, doc, tie);
            let score = p_mrr_document_score(og_rank, changed_rank);
            sum += score;
            documents.push(PMrrDocument {
                query: query.clone(),
                doc: doc.clone(),
                og_rank,
                changed_rank,
                score,
            });
        }
        per_query.insert(query, sum / docs.len() as f64);
    }
    let mean = if per_query.is_empty() {
        None
    } else {
        Some(per_query.values().fold(0.0, |acc, x| acc + x) / per_query.len() as f64)
    };
    PMrr {
        documents,
        per_query,
        mean,
        missing_queries,
    }
}

fn rank_or_after_last(docs: &QueryRun, doc: &str, tie: TieBreak) -> usize {
    docs.rank_of(doc, tie).unwrap_or(docs.len() + 1)
}
