//! Evaluation-set types that every loader returns.
//!
//! Relevance judgments are plain maps (`query id -> document id -> grade`) so that this crate does
//! not depend on the metrics crate; the facade converts. Grades are kept as the source gives them:
//! a grade `> 0` means relevant, `<= 0` means judged not relevant.

use std::collections::{BTreeSet, HashMap};

use crate::template::QueryTemplate;

/// Relevance judgments: query id -> document id -> grade (`> 0` relevant).
pub type Qrels = HashMap<String, HashMap<String, i32>>;

/// Candidate documents per query for re-ranking tasks (FollowIR's `top_ranked`): query id -> document
/// ids in file order.
pub type TopRanked = HashMap<String, Vec<String>>;

/// One corpus document.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Document {
    /// Its id, unique in the corpus.
    pub id: String,
    /// Its title (empty when the collection has none).
    pub title: String,
    /// Its body text.
    pub text: String,
}

impl Document {
    /// The text to encode: `"{title} {text}"` when the title is not blank, else the text alone (the
    /// BEIR / sentence-transformers convention).
    pub fn full_text(&self) -> String {
        if self.title.trim().is_empty() {
            self.text.clone()
        } else {
            format!("{} {}", self.title, self.text)
        }
    }
}

/// One query, optionally with an instruction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Query {
    /// Its id, unique in the set.
    pub id: String,
    /// The bare query text (without the instruction).
    pub text: String,
    /// The instruction that goes with it, if any.
    pub instruction: Option<String>,
}

impl Query {
    /// The text to encode as one string: the query alone, or the template applied to the query and
    /// its instruction.
    pub fn render(&self, template: &QueryTemplate) -> String {
        template.render(&self.text, self.instruction.as_deref())
    }
}

/// A retrieval evaluation set: corpus, queries, judgments, and optionally candidate lists.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EvalSet {
    /// A short name for reports (e.g. `cacm`, `msmarco-subset`).
    pub name: String,
    /// The documents, in file order.
    pub corpus: Vec<Document>,
    /// The queries, in file order.
    pub queries: Vec<Query>,
    /// The judgments.
    pub qrels: Qrels,
    /// Candidate documents per query, for re-ranking sets.
    pub top_ranked: Option<TopRanked>,
}

impl EvalSet {
    /// Number of queries with at least one judgment (of any grade).
    pub fn judged_queries(&self) -> usize {
        self.qrels.values().filter(|d| !d.is_empty()).count()
    }

    /// Total number of (query, document) judgments.
    pub fn judgment_count(&self) -> usize {
        self.qrels.values().map(HashMap::len).sum()
    }
}

/// A FollowIR query: one query with its original and its changed instruction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FollowIrQuery {
    /// The query id (the same id is used in both qrels).
    pub id: String,
    /// The bare query text.
    pub text: String,
    /// The original instruction (`instruction_og`).
    pub instruction_og: String,
    /// The changed instruction (`instruction_changed`), which makes some relevant documents
    /// irrelevant.
    pub instruction_changed: String,
}

impl FollowIrQuery {
    /// The original-instruction query string under `template`.
    pub fn render_og(&self, template: &QueryTemplate) -> String {
        template.render(&self.text, Some(&self.instruction_og))
    }

    /// The changed-instruction query string under `template`.
    pub fn render_changed(&self, template: &QueryTemplate) -> String {
        template.render(&self.text, Some(&self.instruction_changed))
    }
}

/// An instruction-following evaluation set in FollowIR's shape.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FollowIrSet {
    /// A short name for reports.
    pub name: String,
    /// The documents.
    pub corpus: Vec<Document>,
    /// The queries.
    pub queries: Vec<FollowIrQuery>,
    /// Judgments under the original instructions.
    pub qrels_og: Qrels,
    /// Judgments under the changed instructions.
    pub qrels_changed: Qrels,
    /// Per query: the documents relevant under the original instruction but not under the changed
    /// one (see [`changed_docs`]). Every query of `qrels_og` has an entry, possibly empty.
    pub changed_docs: HashMap<String, Vec<String>>,
    /// Candidate documents per query (FollowIR re-ranks these), when the set has them.
    pub top_ranked: Option<TopRanked>,
}

impl FollowIrSet {
    /// The original-instruction run as a plain [`EvalSet`] (queries carry `instruction_og`,
    /// judgments are `qrels_og`).
    pub fn og_eval_set(&self) -> EvalSet {
        self.eval_set(false)
    }

    /// The changed-instruction run as a plain [`EvalSet`] (queries carry `instruction_changed`,
    /// judgments are `qrels_changed`).
    pub fn changed_eval_set(&self) -> EvalSet {
        self.eval_set(true)
    }

    fn eval_set(&self, changed: bool) -> EvalSet {
        let queries = self
            .queries
            .iter()
            .map(|q| Query {
                id: q.id.clone(),
                text: q.text.clone(),
                instruction: Some(if changed {
                    q.instruction_changed.clone()
                } else {
                    q.instruction_og.clone()
                }),
            })
            .collect();
        EvalSet {
            name: format!("{}-{}", self.name, if changed { "changed" } else { "og" }),
            corpus: self.corpus.clone(),
            queries,
            qrels: if changed {
                self.qrels_changed.clone()
            } else {
                self.qrels_og.clone()
            },
            top_ranked: self.top_ranked.clone(),
        }
    }
}

/// FollowIR's changed documents: for every query of `og`, the documents judged relevant (`> 0`) in
/// `og` but not relevant in `changed` (grade `<= 0`, or not judged there), sorted by id.
///
/// This is mteb's `create_qrel_diff` restricted to documents that lose relevance, which is the only
/// kind of change FollowIR's annotations make (a changed instruction narrows relevance).
pub fn changed_docs(og: &Qrels, changed: &Qrels) -> HashMap<String, Vec<String>> {
    og.iter()
        .map(|(q, docs)| {
            let after = changed.get(q);
            let lost: BTreeSet<&String> = docs
                .iter()
                .filter(|(d, g)| {
                    **g > 0 && after.and_then(|a| a.get(*d)).copied().unwrap_or(0) <= 0
                })
                .map(|(d, _)| d)
                .collect();
            (q.clone(), lost.into_iter().cloned().collect())
        })
        .collect()
}
