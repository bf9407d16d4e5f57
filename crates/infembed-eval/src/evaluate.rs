//! The evaluation harness: an evaluation set and a [`Retriever`] in, runs and a report out.
//!
//! Two kinds of test:
//! - [`evaluate_followir`]: instruction following, FollowIR-style (a published FollowIR set, or the
//!   held-out test that [`infembed_data::build_heldout`] builds from any InF-IR file). Each query is
//!   run twice, with its original and with its changed instruction; p-MRR measures whether the
//!   documents that the changed instruction made irrelevant fall in the ranking.
//! - [`evaluate_retrieval`]: plain ad hoc retrieval (BEIR layout, the classic collections).
//!
//! Every value in the reports is a percentage (x100), as papers print them.

use infembed_data::{EvalSet, FollowIrSet};
use infembed_metrics::{
    EvalOptions, Evaluation, Measure, PMrr, Qrels, Run, TieBreak, evaluate_with, p_mrr,
};

use crate::error::{Error, Result};
use crate::retrieve::{Depth, QueryRequest, Retriever, run_queries};

/// How an evaluation is run. Start from [`EvalConfig::default`] and change fields with the
/// `with_*` methods (the struct may grow).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct EvalConfig {
    /// The ranking rule for runs, metrics and p-MRR. Default: score descending, ties by document id
    /// descending at full precision ([`TieBreak::DocIdDescending`]), the held-out protocol's rule
    /// and mteb's.
    pub tie: TieBreak,
    /// How many documents each run keeps for ad hoc retrieval (default 1000). Instruction-following
    /// runs always rank the whole corpus (or the whole candidate list), so ranks are exact.
    pub depth: usize,
}

impl Default for EvalConfig {
    fn default() -> Self {
        Self {
            tie: TieBreak::DocIdDescending,
            depth: 1000,
        }
    }
}

impl EvalConfig {
    /// This config with [`EvalConfig::tie`] set to `tie`.
    #[must_use]
    pub fn with_tie(mut self, tie: TieBreak) -> Self {
        self.tie = tie;
        self
    }

    /// This config with [`EvalConfig::depth`] set to `depth`.
    #[must_use]
    pub fn with_depth(mut self, depth: usize) -> Self {
        self.depth = depth;
        self
    }
}

/// The result of [`evaluate_followir`]; values are percentages.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct FollowIrReport {
    /// The evaluation set's name.
    pub name: String,
    /// The retriever's name.
    pub retriever: String,
    /// p-MRR x100: in (-100, 100); positive when changed instructions push the no-longer-relevant
    /// documents down.
    pub p_mrr: f64,
    /// nDCG@5 of the original-instruction run.
    pub ndcg_at_5: f64,
    /// nDCG@10 of the original-instruction run.
    pub ndcg_at_10: f64,
    /// MAP@1000 of the original-instruction run.
    pub map_at_1000: f64,
    /// MRR@10 of the original-instruction run.
    pub mrr_at_10: f64,
    /// nDCG@10 of the changed-instruction run against the changed judgments.
    pub changed_ndcg_at_10: f64,
    /// Pairwise instruction accuracy: the share of queries with exactly one changed document `c`
    /// and exactly one document `n` relevant under the changed instruction for which the original
    /// query scores `c` above `n` AND the changed query scores `n` above `c`. `None` when no query
    /// has that shape (it is defined for the held-out InF-IR test, where `c` = P+ and `n` = P1-).
    pub pairwise_accuracy: Option<f64>,
    /// Queries evaluated.
    pub n_queries: usize,
    /// Corpus documents.
    pub n_docs: usize,
}

/// One measure of a report as the reports are written out: its key in mteb's result files
/// (`ndcg_at_10`), its label in the printed table (`nDCG@10`) and its value (x100; `None` when
/// undefined for the set).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ReportedMeasure {
    /// The key in mteb's result files.
    pub key: &'static str,
    /// The label in `infembed eval`'s table.
    pub label: &'static str,
    /// The value, a percentage.
    pub value: Option<f64>,
}

const fn measure(key: &'static str, label: &'static str, value: Option<f64>) -> ReportedMeasure {
    ReportedMeasure { key, label, value }
}

impl FollowIrReport {
    /// The report's measures in their printed order.
    pub fn measures(&self) -> [ReportedMeasure; 7] {
        [
            measure("p-MRR", "p-MRR", Some(self.p_mrr)),
            measure("ndcg_at_5", "nDCG@5   (original)", Some(self.ndcg_at_5)),
            measure("ndcg_at_10", "nDCG@10  (original)", Some(self.ndcg_at_10)),
            measure("map_at_1000", "MAP@1000 (original)", Some(self.map_at_1000)),
            measure("mrr_at_10", "MRR@10   (original)", Some(self.mrr_at_10)),
            measure(
                "changed_ndcg_at_10",
                "nDCG@10  (changed)",
                Some(self.changed_ndcg_at_10),
            ),
            measure(
                "pairwise_accuracy",
                "pairwise accuracy",
                self.pairwise_accuracy,
            ),
        ]
    }
}

impl RetrievalReport {
    /// The report's measures in their printed order.
    pub fn measures(&self) -> [ReportedMeasure; 5] {
        [
            measure("ndcg_at_10", "nDCG@10", Some(self.ndcg_at_10)),
            measure("map_at_1000", "MAP@1000", Some(self.map_at_1000)),
            measure("mrr_at_10", "MRR@10", Some(self.mrr_at_10)),
            measure("precision_at_10", "P@10", Some(self.p_at_10)),
            measure("recall_at_100", "Recall@100", Some(self.recall_at_100)),
        ]
    }
}

/// Everything [`evaluate_followir`] computes: the report and both runs (for TREC files).
#[derive(Debug, Clone)]
pub struct FollowIrOutcome {
    /// The summary.
    pub report: FollowIrReport,
    /// The original-instruction run.
    pub og_run: Run,
    /// The changed-instruction run.
    pub changed_run: Run,
    /// p-MRR in detail: each changed document's ranks and score, each query's mean (fractions,
    /// not percentages), the queries left out.
    pub p_mrr: PMrr,
}

/// The result of [`evaluate_retrieval`]; values are percentages.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct RetrievalReport {
    /// The evaluation set's name.
    pub name: String,
    /// The retriever's name.
    pub retriever: String,
    /// nDCG@10.
    pub ndcg_at_10: f64,
    /// MAP@1000.
    pub map_at_1000: f64,
    /// MRR@10.
    pub mrr_at_10: f64,
    /// P@10.
    pub p_at_10: f64,
    /// Recall@100.
    pub recall_at_100: f64,
    /// Judged queries evaluated.
    pub n_queries: usize,
    /// Corpus documents.
    pub n_docs: usize,
}

/// Everything [`evaluate_retrieval`] computes.
#[derive(Debug, Clone)]
pub struct RetrievalOutcome {
    /// The summary.
    pub report: RetrievalReport,
    /// The run.
    pub run: Run,
    /// Per-query values of every measure in the report.
    pub evaluation: Evaluation,
}

fn to_metrics_qrels(qrels: &infembed_data::Qrels) -> Result<Qrels> {
    Ok(Qrels::from_nested(
        qrels
            .iter()
            .map(|(q, docs)| (q, docs.iter().map(|(d, &l)| (d, l)))),
    )?)
}

fn percent(eval: &Evaluation, measure: Measure) -> f64 {
    100.0 * eval.mean(measure).unwrap_or(0.0)
}

fn index_corpus(
    retriever: &mut dyn Retriever,
    corpus: &[infembed_data::Document],
    what: &str,
) -> Result<Vec<String>> {
    if corpus.is_empty() {
        return Err(Error::Empty {
            what: format!("the corpus of {what}"),
        });
    }
    let texts: Vec<String> = corpus.iter().map(|d| d.full_text()).collect();
    let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
    let ids: Vec<String> = corpus.iter().map(|d| d.id.clone()).collect();
    retriever.index_documents(&ids, &refs)?;
    Ok(ids)
}

/// Runs an instruction-following test: every query with its original and its changed instruction,
/// ranked over the whole corpus (or over its `top_ranked` candidates when the set has them), then
/// p-MRR, the original run's nDCG@5/@10, MAP@1000 and MRR@10, the changed run's nDCG@10 and the
/// pairwise instruction accuracy.
///
/// # Errors
/// An empty corpus or query list, no query with a changed document, and the retriever's errors.
pub fn evaluate_followir(
    set: &FollowIrSet,
    retriever: &mut dyn Retriever,
    config: &EvalConfig,
) -> Result<FollowIrOutcome> {
    if set.queries.is_empty() {
        return Err(Error::Empty {
            what: format!("the query list of {}", set.name),
        });
    }
    let doc_ids = index_corpus(retriever, &set.corpus, &set.name)?;
    let request = |id: &str, query: &str, instruction: &str| QueryRequest {
        id: id.to_string(),
        query: query.to_string(),
        instruction: Some(instruction.to_string()),
    };
    let og: Vec<QueryRequest> = set
        .queries
        .iter()
        .map(|q| request(&q.id, &q.text, &q.instruction_og))
        .collect();
    let changed: Vec<QueryRequest> = set
        .queries
        .iter()
        .map(|q| request(&q.id, &q.text, &q.instruction_changed))
        .collect();
    let candidates = set.top_ranked.as_ref();
    let og_run = run_queries(retriever, &doc_ids, &og, Depth::All, candidates, config.tie)?;
    let changed_run = run_queries(
        retriever,
        &doc_ids,
        &changed,
        Depth::All,
        candidates,
        config.tie,
    )?;

    let pmrr = p_mrr(&og_run, &changed_run, &set.changed_docs, config.tie);
    let p_mrr_mean = pmrr.mean.ok_or_else(|| Error::Empty {
        what: format!("the changed-document lists of {}", set.name),
    })?;
    let options = EvalOptions {
        tie_break: config.tie,
        complete: true,
        ..EvalOptions::default()
    };
    let og_measures = [
        Measure::NdcgCut(5),
        Measure::NdcgCut(10),
        Measure::MapCut(1000),
        Measure::RecipRankCut(10),
    ];
    let og_eval = evaluate_with(
        &to_metrics_qrels(&set.qrels_og)?,
        &og_run,
        &og_measures,
        &options,
    )?;
    let changed_eval = evaluate_with(
        &to_metrics_qrels(&set.qrels_changed)?,
        &changed_run,
        &[Measure::NdcgCut(10)],
        &options,
    )?;

    let report = FollowIrReport {
        name: set.name.clone(),
        retriever: retriever.name(),
        p_mrr: 100.0 * p_mrr_mean,
        ndcg_at_5: percent(&og_eval, Measure::NdcgCut(5)),
        ndcg_at_10: percent(&og_eval, Measure::NdcgCut(10)),
        map_at_1000: percent(&og_eval, Measure::MapCut(1000)),
        mrr_at_10: percent(&og_eval, Measure::RecipRankCut(10)),
        changed_ndcg_at_10: percent(&changed_eval, Measure::NdcgCut(10)),
        pairwise_accuracy: pairwise_accuracy(set, &og_run, &changed_run),
        n_queries: set.queries.len(),
        n_docs: set.corpus.len(),
    };
    Ok(FollowIrOutcome {
        report,
        og_run,
        changed_run,
        p_mrr: pmrr,
    })
}

/// See [`FollowIrReport::pairwise_accuracy`].
fn pairwise_accuracy(set: &FollowIrSet, og: &Run, changed: &Run) -> Option<f64> {
    let (mut right, mut total) = (0usize, 0usize);
    for q in &set.queries {
        let Some([c]) = set.changed_docs.get(&q.id).map(Vec::as_slice) else {
            continue;
        };
        let relevant: Vec<&String> = set
            .qrels_changed
            .get(&q.id)
            .map(|d| d.iter().filter(|(_, l)| **l > 0).map(|(d, _)| d).collect())
            .unwrap_or_default();
        let [n] = relevant.as_slice() else { continue };
        if *n == c {
            continue;
        }
        total += 1;
        let score = |run: &Run, doc: &str| run.query(&q.id).and_then(|r| r.score_of(doc));
        let og_ok = matches!((score(og, c), score(og, n)), (Some(a), Some(b)) if a > b);
        let ch_ok = matches!((score(changed, n), score(changed, c)), (Some(a), Some(b)) if a > b);
        right += usize::from(og_ok && ch_ok);
    }
    (total > 0).then(|| 100.0 * right as f64 / total as f64)
}

/// Runs an ad hoc retrieval test: each query (with its instruction, if any)
/// against the corpus, keeping the top [`EvalConfig::depth`] documents (or re-ranking
/// `top_ranked`), evaluated over all judged queries (trec_eval `-c`).
///
/// # Errors
/// An empty corpus or query list, and the retriever's errors.
pub fn evaluate_retrieval(
    set: &EvalSet,
    retriever: &mut dyn Retriever,
    config: &EvalConfig,
) -> Result<RetrievalOutcome> {
    let judged: Vec<QueryRequest> = set
        .queries
        .iter()
        .filter(|q| {
            set.qrels
                .get(&q.id)
                .is_some_and(|d| d.values().any(|&l| l > 0))
        })
        .map(|q| QueryRequest {
            id: q.id.clone(),
            query: q.text.clone(),
            instruction: q.instruction.clone(),
        })
        .collect();
    if judged.is_empty() {
        return Err(Error::Empty {
            what: format!("the judged queries of {}", set.name),
        });
    }
    let doc_ids = index_corpus(retriever, &set.corpus, &set.name)?;
    let run = run_queries(
        retriever,
        &doc_ids,
        &judged,
        Depth::TopK(config.depth),
        set.top_ranked.as_ref(),
        config.tie,
    )?;
    let measures = [
        Measure::NdcgCut(10),
        Measure::MapCut(1000),
        Measure::RecipRankCut(10),
        Measure::P(10),
        Measure::Recall(100),
    ];
    let options = EvalOptions {
        tie_break: config.tie,
        complete: true,
        ..EvalOptions::default()
    };
    let evaluation = evaluate_with(&to_metrics_qrels(&set.qrels)?, &run, &measures, &options)?;
    let report = RetrievalReport {
        name: set.name.clone(),
        retriever: retriever.name(),
        ndcg_at_10: percent(&evaluation, Measure::NdcgCut(10)),
        map_at_1000: percent(&evaluation, Measure::MapCut(1000)),
        mrr_at_10: percent(&evaluation, Measure::RecipRankCut(10)),
        p_at_10: percent(&evaluation, Measure::P(10)),
        recall_at_100: percent(&evaluation, Measure::Recall(100)),
        n_queries: evaluation.num_queries(),
        n_docs: set.corpus.len(),
    };
    Ok(RetrievalOutcome {
        report,
        run,
        evaluation,
    })
}
