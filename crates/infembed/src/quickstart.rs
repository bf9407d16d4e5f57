//! The quickstart: evaluate a model zero-shot, fine-tune it with the paper's recommended
//! objective on the shipped InF-IR sample, evaluate again, and report before/after.
//!
//! The development split is scored at every evaluation of the run (zero-shot first, then
//! after each epoch) with the held-out FollowIR protocol; `msmarco-subset` (ad hoc retrieval,
//! nDCG@10; vendored in `data/msmarco-subset`) is scored before and after, to show that general
//! retrieval is kept. When it cannot be read that row is reported as skipped.

use std::path::{Path, PathBuf};
use std::time::Instant;

use infembed_data::Collection;
use infembed_encoder::{DeviceSpec, DualEncoder};
use infembed_train::{ProgressMode, TrainConfig, Trainer};
use serde::Serialize;

use crate::error::Result;
use crate::training::{FollowIrDevEvaluator, retrieval_report};

/// One row of the before/after table.
#[derive(Debug, Clone, Serialize)]
pub struct Comparison {
    /// What is measured, e.g. `dev p-MRR`.
    pub metric: String,
    /// Zero-shot value (x100).
    pub before: Option<f64>,
    /// After fine-tuning (x100).
    pub after: Option<f64>,
}

/// What the quickstart measured.
#[derive(Debug, Clone, Serialize)]
pub struct QuickstartReport {
    /// The config that was trained.
    pub config: PathBuf,
    /// The seed.
    pub seed: u64,
    /// Optimizer steps.
    pub steps: usize,
    /// Training rows per second.
    pub rows_per_second: f64,
    /// Seconds spent training (steps only).
    pub train_seconds: f64,
    /// Seconds of the whole quickstart.
    pub total_seconds: f64,
    /// The table.
    pub rows: Vec<Comparison>,
    /// Why `msmarco-subset` was not evaluated, when it was not.
    pub skipped: Option<String>,
    /// The trained model.
    pub model_dir: Option<PathBuf>,
    /// The chart of loss, learning rate and dev metrics (`training.svg`; `training.png`
    /// beside it).
    pub plot: PathBuf,
    /// The chart of dev p-MRR per query and the changed documents' ranks, zero-shot against
    /// fine-tuned (`evaluation.svg`; `evaluation.png` beside it).
    pub evaluation_plot: PathBuf,
}

impl QuickstartReport {
    /// The before/after table as Markdown.
    pub fn markdown(&self) -> String {
        let mut s =
            String::from("| metric | zero-shot | fine-tuned | change |\n|---|---:|---:|---:|\n");
        let f = |v: Option<f64>| v.map_or("skipped".to_string(), |v| format!("{v:.2}"));
        for r in &self.rows {
            let change = match (r.before, r.after) {
                (Some(a), Some(b)) => format!("{:+.2}", b - a),
                _ => String::new(),
            };
            s.push_str(&format!(
                "| {} | {} | {} | {change} |\n",
                r.metric,
                f(r.before),
                f(r.after)
            ));
        }
        s
    }
}

fn metric(entry: Option<&infembed_train::HistoryEntry>, name: &str) -> Option<f64> {
    entry.and_then(|e| e.metrics.iter().find(|(k, _)| k == name).map(|(_, v)| *v))
}

/// Where the quickstart reads `msmarco-subset` by default: the repository's vendored copy,
/// relative to the working directory (as the config's data paths are).
pub const MSMARCO_SUBSET_DIR: &str = "data/msmarco-subset";

/// Runs the quickstart for the training config at `config_path` (which must name a
/// development split). `shared_data` is a shared-data root (the folder holding
/// `collections/msmarco-subset`) that overrides where `msmarco-subset` is read; by default it
/// is [`MSMARCO_SUBSET_DIR`] (the same files). `devices` overrides the config's `device` /
/// `devices` (the CPU by default); evaluation runs on the first.
///
/// # Errors
/// Config, data, model, device and evaluation errors, each naming its file or device.
pub fn run(
    config_path: &Path,
    shared_data: Option<&Path>,
    devices: Option<&[DeviceSpec]>,
) -> Result<QuickstartReport> {
    let started = Instant::now();
    let mut config = TrainConfig::from_file(config_path)?;
    if let Some(specs) = devices {
        config.set_devices(specs.to_vec());
        config.validate()?;
    }
    let Some(dev) = config.data.dev.clone() else {
        return Err(infembed_train::Error::Missing {
            path: config_path.to_path_buf(),
            what: "development split (`data.dev`) in the quickstart config",
            fix: "add data.dev = \"data/inf-ir-sample/dev.jsonl\"",
        }
        .into());
    };
    let (evaluator, details) =
        FollowIrDevEvaluator::from_files(&dev, config.data.distractors.as_deref())?
            .keeping_details();
    let dev_name = evaluator.set_name().to_string();
    let devices = crate::open_devices(&config.device_specs())?;
    let device = devices[0].clone();

    let msmarco_dir = match shared_data {
        Some(root) => root
            .join("collections")
            .join(Collection::MsMarcoSubset.folder()),
        None => PathBuf::from(MSMARCO_SUBSET_DIR),
    };
    let msmarco = Collection::MsMarcoSubset.load(&msmarco_dir).map_err(|e| {
        format!(
            "msmarco-subset not readable in {}: {e}",
            msmarco_dir.display()
        )
    });
    if let Err(why) = &msmarco {
        eprintln!("SKIPPED: msmarco-subset evaluation: {why}");
    }

    let mut msmarco_before = None;
    if let Ok(set) = &msmarco {
        let t = Instant::now();
        let zero_shot = DualEncoder::from_dir(&config.model, config.encoder.clone(), &device)?;
        let r = retrieval_report(&zero_shot, set)?;
        eprintln!(
            "zero-shot msmarco-subset nDCG@10 {:.2} ({:.1} s)",
            r.ndcg_at_10,
            t.elapsed().as_secs_f64()
        );
        msmarco_before = Some(r.ndcg_at_10);
    }

    // Plain lines: the quickstart's story is the sequence of dev evaluations in the log.
    let mut trainer = Trainer::on_devices(config.clone(), &devices)?
        .with_evaluator(Box::new(evaluator))
        .progress(ProgressMode::Plain);
    let summary = trainer.run()?;
    let trained = trainer.encoder();
    let mut msmarco_after = None;
    if let Ok(set) = &msmarco {
        let r = retrieval_report(&trained, set)?;
        eprintln!("fine-tuned msmarco-subset nDCG@10 {:.2}", r.ndcg_at_10);
        msmarco_after = Some(r.ndcg_at_10);
    }

    let evals: Vec<&infembed_train::HistoryEntry> = summary
        .history
        .iter()
        .filter(|h| !h.metrics.is_empty())
        .collect();
    let first = evals.first().copied().filter(|h| h.step == 0);
    let last = evals.last().copied().filter(|h| h.step > 0);
    // The evaluation chart: the same two dev evaluations as the table, in detail (kept by the
    // evaluator as it ran; one detail per evaluation, in the history's order).
    let evaluation_plot = config.output_dir.join("evaluation");
    {
        let details = details.lock().map_err(|_| crate::Error::Write {
            path: evaluation_plot.clone(),
            source: std::io::Error::other("the evaluation details' lock was poisoned"),
        })?;
        let mut series = Vec::new();
        if first.is_some()
            && let Some(p) = details.first()
        {
            series.push(crate::eval_series("zero-shot", p));
        }
        if last.is_some()
            && let Some(p) = details.last()
        {
            series.push(crate::eval_series("fine-tuned", p));
        }
        infembed_train::evaluation_chart(&format!("{dev_name}: zero-shot vs fine-tuned"), &series)?
            .write(&evaluation_plot)?;
    }
    let rows = vec![
        Comparison {
            metric: "dev p-MRR".into(),
            before: metric(first, "p_mrr"),
            after: metric(last, "p_mrr"),
        },
        Comparison {
            metric: "dev pairwise instruction accuracy".into(),
            before: metric(first, "pairwise_accuracy"),
            after: metric(last, "pairwise_accuracy"),
        },
        Comparison {
            metric: "dev nDCG@10".into(),
            before: metric(first, "ndcg_at_10"),
            after: metric(last, "ndcg_at_10"),
        },
        Comparison {
            metric: "msmarco-subset nDCG@10".into(),
            before: msmarco_before,
            after: msmarco_after,
        },
    ];
    let report = QuickstartReport {
        config: config_path.to_path_buf(),
        seed: config.seed,
        steps: summary.steps,
        rows_per_second: summary.rows_per_second(),
        train_seconds: summary.seconds,
        total_seconds: started.elapsed().as_secs_f64(),
        rows,
        skipped: msmarco.err(),
        model_dir: summary.final_dir.clone(),
        plot: config.output_dir.join("training.svg"),
        evaluation_plot: evaluation_plot.with_extension("svg"),
    };
    let json = serde_json::to_vec_pretty(&report).map_err(|e| crate::Error::Write {
        path: config.output_dir.join("quickstart.json"),
        source: std::io::Error::other(e),
    })?;
    let out = config.output_dir.join("quickstart.json");
    std::fs::write(&out, json).map_err(|source| crate::Error::Write { path: out, source })?;
    Ok(report)
}
