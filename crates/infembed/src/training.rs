//! Training with the evaluation harness attached: [`FollowIrDevEvaluator`] scores the
//! development split with the held-out FollowIR protocol at each evaluation of a
//! [`Trainer`], and [`train`] runs a config file end to end.

use std::path::Path;
use std::sync::{Arc, Mutex};

use burn::tensor::Device;
use infembed_data::{EvalSet, FollowIrSet};
use infembed_encoder::{DeviceSpec, DualEncoder};
use infembed_eval::{
    EncoderRetriever, EvalConfig, FollowIrOutcome, FollowIrReport, RetrievalReport,
    evaluate_followir, evaluate_retrieval, load_heldout,
};
use infembed_metrics::PMrr;
use infembed_train::{DevEvaluator, EvalSeries, ProgressMode, TrainConfig, TrainSummary, Trainer};

use crate::error::Result;

/// Evaluates an encoder on the held-out instruction-following test built from an InF-IR file
/// (exactly as `infembed eval --data FILE --distractors FILE` does).
#[derive(Debug, Clone)]
pub struct FollowIrDevEvaluator {
    set: FollowIrSet,
    config: EvalConfig,
    details: Option<EvaluationDetails>,
}

/// p-MRR in detail of each evaluation a [`FollowIrDevEvaluator`] made, in order (see
/// [`FollowIrDevEvaluator::keeping_details`]).
pub type EvaluationDetails = Arc<Mutex<Vec<PMrr>>>;

impl FollowIrDevEvaluator {
    /// Builds the test from `dev` (InF-IR JSONL or Parquet) and optional distractors
    /// ([`load_heldout`]).
    ///
    /// # Errors
    /// Unreadable or malformed files (named), an empty file.
    pub fn from_files(dev: &Path, distractors: Option<&Path>) -> Result<Self> {
        Ok(Self {
            set: load_heldout(dev, distractors)?,
            config: EvalConfig::default(),
            details: None,
        })
    }

    /// The development set's name (the file's stem).
    pub fn set_name(&self) -> &str {
        &self.set.name
    }

    /// Keeps each evaluation's p-MRR in detail (per query, per changed document) in the returned
    /// list, for pictures drawn after training (the quickstart's evaluation chart).
    #[must_use]
    pub fn keeping_details(mut self) -> (Self, EvaluationDetails) {
        let details = EvaluationDetails::default();
        self.details = Some(details.clone());
        (self, details)
    }

    /// The full report for `encoder`.
    ///
    /// # Errors
    /// The encoder's errors.
    pub fn report(&self, encoder: &DualEncoder) -> Result<FollowIrReport> {
        Ok(self.outcome(encoder)?.report)
    }

    /// Everything the evaluation computes for `encoder`: the report, both runs, p-MRR in
    /// detail.
    ///
    /// # Errors
    /// The encoder's errors.
    pub fn outcome(&self, encoder: &DualEncoder) -> Result<FollowIrOutcome> {
        let mut retriever = EncoderRetriever::new(encoder.clone(), "model");
        Ok(evaluate_followir(&self.set, &mut retriever, &self.config)?)
    }
}

impl DevEvaluator for FollowIrDevEvaluator {
    fn evaluate(
        &mut self,
        encoder: &DualEncoder,
    ) -> std::result::Result<Vec<(String, f64)>, Box<dyn std::error::Error + Send + Sync>> {
        let outcome = self.outcome(encoder)?;
        if let Some(details) = &self.details {
            details
                .lock()
                .map_err(|_| "the evaluation details' lock was poisoned")?
                .push(outcome.p_mrr);
        }
        let r = outcome.report;
        let mut m = vec![
            ("p_mrr".to_string(), r.p_mrr),
            ("ndcg_at_10".to_string(), r.ndcg_at_10),
        ];
        if let Some(p) = r.pairwise_accuracy {
            m.push(("pairwise_accuracy".to_string(), p));
        }
        Ok(m)
    }
}

/// What the evaluation chart ([`infembed_train::evaluation_chart`]) draws of one model's
/// p-MRR: each query's p-MRR and each changed document's two ranks, labelled `label`.
pub fn eval_series(label: &str, p_mrr: &PMrr) -> EvalSeries {
    EvalSeries {
        label: label.to_string(),
        per_query: p_mrr.per_query.values().copied().collect(),
        ranks: p_mrr
            .documents
            .iter()
            .map(|d| (d.og_rank, d.changed_rank))
            .collect(),
    }
}

/// Ad hoc retrieval quality of `encoder` on an evaluation set (e.g. `msmarco-subset`).
///
/// # Errors
/// An empty set, the encoder's errors.
pub fn retrieval_report(encoder: &DualEncoder, set: &EvalSet) -> Result<RetrievalReport> {
    let mut retriever = EncoderRetriever::new(encoder.clone(), "model");
    Ok(evaluate_retrieval(set, &mut retriever, &EvalConfig::default())?.report)
}

/// Opens every device of `specs` (each once: a repeated spec, as in `cpu,cpu`, gives the
/// same device twice).
///
/// # Errors
/// A device whose backend is not compiled in (the error names the cargo feature), or that
/// this machine cannot open.
pub fn open_devices(specs: &[DeviceSpec]) -> Result<Vec<Device>> {
    Ok(specs
        .iter()
        .map(DeviceSpec::device)
        .collect::<std::result::Result<Vec<_>, _>>()?)
}

/// Trains as `config` says on its devices (`device` / `devices`; the CPU by default), with the development split (when the config names
/// one) evaluated by [`FollowIrDevEvaluator`]; with `resume`, continues from the newest
/// checkpoint of the output directory when there is one. `progress` picks plain lines or
/// burn-train's terminal dashboard ([`ProgressMode::Auto`]: the dashboard on a terminal).
///
/// # Errors
/// Config, data, model and checkpoint errors, each naming its file; a dashboard asked for
/// without a terminal.
pub fn train(config: TrainConfig, resume: bool, progress: ProgressMode) -> Result<TrainSummary> {
    let evaluator = match &config.data.dev {
        Some(dev) => Some(FollowIrDevEvaluator::from_files(
            dev,
            config.data.distractors.as_deref(),
        )?),
        None => None,
    };
    let devices = open_devices(&config.device_specs())?;
    let mut trainer = Trainer::on_devices(config, &devices)?.progress(progress);
    if let Some(ev) = evaluator {
        trainer = trainer.with_evaluator(Box::new(ev));
    }
    if resume {
        trainer.resume()?;
    }
    Ok(trainer.run()?)
}
