//! Result files as mteb writes them: one JSON object per evaluated set, with fractions (not
//! percentages), a `main_score`, the split, the evaluation time, the model's name and revision,
//! and what produced it, stored at `<folder>/<model name, / as __>/<revision>/<set>.json`
//! beside a `model_meta.json`.
//!
//! The fields mteb reads (`task_name`, `scores.<split>[].main_score`, `hf_subset`,
//! `languages`, `evaluation_time`) keep mteb's names; what mteb does not have
//! (`infembed_version`, `model`, `retriever`, `n_queries`, `n_docs`) is added beside them.

use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::error::{Error, Result};
use crate::evaluate::{FollowIrReport, ReportedMeasure, RetrievalReport};

/// What was evaluated: the model (or the lexical baseline) and how its queries were built.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[non_exhaustive]
pub struct EvaluatedModel {
    /// e.g. `sentence-transformers/all-MiniLM-L6-v2`, or `bm25`.
    pub name: String,
    /// A hub revision, `sha256:` + 16 hex digits of the weights, or the baseline's settings.
    pub revision: String,
    /// The model it was fine-tuned from, when known: `{name, revision}`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub base_model: Option<serde_json::Value>,
    /// How instruction and query are joined (`{query} {instruction}`-style), when one template
    /// is used.
    pub template: Option<String>,
    /// Everything else that decides the embeddings or the ranking (the encoder config, or the
    /// BM25 parameters).
    pub settings: serde_json::Value,
}

impl EvaluatedModel {
    /// A model named `name` at `revision`, built with `settings`.
    pub fn new(
        name: impl Into<String>,
        revision: impl Into<String>,
        template: Option<String>,
        settings: serde_json::Value,
    ) -> Self {
        Self {
            name: name.into(),
            revision: revision.into(),
            base_model: None,
            template,
            settings,
        }
    }

    /// Sets the base model.
    #[must_use]
    pub fn with_base(mut self, name: &str, revision: &str) -> Self {
        self.base_model = Some(serde_json::json!({ "name": name, "revision": revision }));
        self
    }
}

/// One result file ([`EvalResults::write`]), also what `infembed eval --json` prints.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[non_exhaustive]
pub struct EvalResults {
    /// The evaluated set's name (mteb's task name).
    pub task_name: String,
    /// The infembed version that computed it.
    pub infembed_version: String,
    /// Seconds from loading the set to the last metric.
    pub evaluation_time: f64,
    /// The scores per split: `{split: [{main_score, metrics..., hf_subset, languages}]}`.
    pub scores: serde_json::Map<String, serde_json::Value>,
    /// The model.
    pub model: EvaluatedModel,
    /// The retriever's name in the report.
    pub retriever: String,
    /// Queries evaluated.
    pub n_queries: usize,
    /// Corpus documents.
    pub n_docs: usize,
}

/// One split's entry: `main_score` and each metric as fractions (given as the report's
/// percentages; `None` is written as null), then mteb's fixed `hf_subset` and `languages`.
fn split_entry(main_score: f64, metrics: &[ReportedMeasure]) -> serde_json::Value {
    let mut entry = serde_json::Map::new();
    entry.insert("main_score".into(), serde_json::json!(main_score / 100.0));
    for m in metrics {
        entry.insert(
            m.key.to_string(),
            m.value
                .map_or(serde_json::Value::Null, |v| serde_json::json!(v / 100.0)),
        );
    }
    entry.insert("hf_subset".into(), serde_json::json!("default"));
    entry.insert("languages".into(), serde_json::json!(["eng-Latn"]));
    serde_json::Value::Object(entry)
}

impl EvalResults {
    /// The results of an instruction-following test (the report's percentages as fractions;
    /// `main_score` is p-MRR, mteb's main score for FollowIR).
    pub fn followir(
        report: &FollowIrReport,
        split: &str,
        model: EvaluatedModel,
        evaluation_time: f64,
    ) -> Self {
        let entry = split_entry(report.p_mrr, &report.measures());
        Self::assemble(
            &report.name,
            &report.retriever,
            split,
            entry,
            model,
            evaluation_time,
            (report.n_queries, report.n_docs),
        )
    }

    /// The results of an ad hoc retrieval test (`main_score` is nDCG@10, as in mteb's
    /// retrieval tasks).
    pub fn retrieval(
        report: &RetrievalReport,
        split: &str,
        model: EvaluatedModel,
        evaluation_time: f64,
    ) -> Self {
        let entry = split_entry(report.ndcg_at_10, &report.measures());
        Self::assemble(
            &report.name,
            &report.retriever,
            split,
            entry,
            model,
            evaluation_time,
            (report.n_queries, report.n_docs),
        )
    }

    fn assemble(
        name: &str,
        retriever: &str,
        split: &str,
        entry: serde_json::Value,
        model: EvaluatedModel,
        evaluation_time: f64,
        (n_queries, n_docs): (usize, usize),
    ) -> Self {
        let mut scores = serde_json::Map::new();
        scores.insert(split.to_string(), serde_json::json!([entry]));
        Self {
            task_name: name.to_string(),
            infembed_version: env!("CARGO_PKG_VERSION").to_string(),
            evaluation_time,
            scores,
            model,
            retriever: retriever.to_string(),
            n_queries,
            n_docs,
        }
    }

    /// Where [`write`](Self::write) puts the file under `folder`:
    /// `<folder>/<model name with / as __>/<revision with : as _>/<task name>.json`.
    pub fn path_in(&self, folder: &Path) -> PathBuf {
        let clean = |s: &str| {
            s.chars()
                .map(|c| match c {
                    '/' => '_',
                    c if c.is_alphanumeric() || "-_.+=,".contains(c) => c,
                    _ => '_',
                })
                .collect::<String>()
        };
        folder
            .join(clean(&self.model.name.replace('/', "__")))
            .join(clean(&self.model.revision.replace(':', "_")))
            .join(format!("{}.json", clean(&self.task_name)))
    }

    /// Writes the result file and `model_meta.json` beside it (each atomically). Returns the
    /// result file's path.
    ///
    /// # Errors
    /// [`Error::Write`] naming the file.
    pub fn write(&self, folder: &Path) -> Result<PathBuf> {
        let path = self.path_in(folder);
        let dir = path.parent().unwrap_or(folder);
        std::fs::create_dir_all(dir).map_err(|source| Error::Write {
            path: dir.to_path_buf(),
            source,
        })?;
        write_json(&dir.join("model_meta.json"), &self.model)?;
        write_json(&path, self)?;
        Ok(path)
    }
}

/// Writes `value` as pretty JSON (with a final newline) to `path`, atomically.
fn write_json(path: &Path, value: &impl Serialize) -> Result<()> {
    let mut bytes = serde_json::to_vec_pretty(value).map_err(|e| Error::Write {
        path: path.to_path_buf(),
        source: std::io::Error::other(e),
    })?;
    bytes.push(b'\n');
    infembed_data::write_atomic(path, &bytes).map_err(|source| Error::Write {
        path: path.to_path_buf(),
        source,
    })
}
