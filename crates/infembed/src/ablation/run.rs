//! Running a grid: each run trained in its own folder, cached by its key, resumed when cut off.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use infembed_data::{Collection, EvalSet, write_atomic};
use infembed_encoder::{DeviceSpec, DualEncoder, weights_revision};
use infembed_eval::FollowIrReport;
use infembed_train::{HistoryEntry, ProgressMode, TrainConfig, Trainer};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::report::{GridReport, first_pass_top};
use super::{Grid, GridError, GridRow, Measure, Measures};
use crate::error::{Error, Result};
use crate::training::{FollowIrDevEvaluator, retrieval_report};

/// Bumped when what a run's result holds, or how it is measured, changes: every key changes
/// with it, so no stale result is reused.
const RUNNER_VERSION: u32 = 1;

/// A run's result file, in its folder.
pub(super) const RESULT_FILE: &str = "result.json";
/// The zero-shot result, in the grid's output folder.
const ZERO_SHOT_FILE: &str = "zero-shot.json";

/// How [`run_grid`] runs.
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct GridOptions {
    /// Train every run on these devices instead of the config's (`--device` / `--devices`);
    /// the first also evaluates. Part of each run's key.
    pub devices: Option<Vec<DeviceSpec>>,
    /// The trainer's progress display (plain lines by default).
    pub progress: ProgressMode,
    /// Stop after this many runs have trained in this call (cached ones do not count): for
    /// smoke tests and for spreading a grid over sessions.
    pub max_runs: Option<usize>,
}

impl GridOptions {
    /// Plain progress lines, the config's devices, no limit.
    pub fn new() -> Self {
        Self {
            progress: ProgressMode::Plain,
            ..Self::default()
        }
    }

    /// Trains on `devices` instead of the configs' devices.
    #[must_use]
    pub fn devices(mut self, devices: Vec<DeviceSpec>) -> Self {
        self.devices = Some(devices);
        self
    }

    /// The trainer's progress display.
    #[must_use]
    pub fn progress(mut self, progress: ProgressMode) -> Self {
        self.progress = progress;
        self
    }

    /// Stops after `n` runs trained in this call.
    #[must_use]
    pub fn max_runs(mut self, n: usize) -> Self {
        self.max_runs = Some(n);
        self
    }
}

/// What one run measured (`result.json` in its folder).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct RunResult {
    /// The run's key (its folder's name).
    pub key: String,
    /// Its row's label.
    pub row: String,
    /// Its seed.
    pub seed: u64,
    /// Optimizer steps.
    pub steps: usize,
    /// Seconds of training steps; when the run was resumed, the seconds per step of the
    /// process that finished it times all steps (`None` if that process ran no step).
    pub train_seconds: Option<f64>,
    /// Whether the run was continued from a checkpoint.
    pub resumed: bool,
    /// The measures of the final model.
    pub measures: Measures,
    /// The development evaluations during training (one per epoch unless the config says
    /// otherwise).
    pub history: Vec<HistoryEntry>,
    /// The run's training config (its `output_dir` is the run's folder).
    pub config: serde_json::Value,
}

impl RunResult {
    /// The result as `row`'s: a result is cached by its key (its whole config), so the same
    /// run may serve a row of another label (an edited label, or another grid whose row has
    /// the same config, its folder copied over).
    fn for_row(mut self, row: &GridRow) -> Self {
        self.row.clone_from(&row.label);
        self
    }
}

/// The base model's measures before training (`zero-shot.json`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct ZeroShotResult {
    /// The key of what was evaluated (model weights, encoder config, data, retrieval set).
    pub key: String,
    /// The measures.
    pub measures: Measures,
}

/// Runs every run of `grid` that has no result yet (the grid's seeds for every row, then
/// `more_seeds` for the best rows), rewriting the report after each, and returns the report.
///
/// # Errors
/// Grid, config, data, model, training and evaluation errors, each naming its file; a
/// failure leaves the finished runs' results and the failed run's checkpoints in place, so the
/// next call continues.
pub fn run_grid(grid: &Grid, options: &GridOptions) -> Result<GridReport> {
    let mut ctx = Context::new(grid, options, true)?;
    std::fs::create_dir_all(&grid.output_dir)
        .map_err(|source| write_err(&grid.output_dir, source))?;
    let zero = ctx.zero_shot()?;
    let report = |results: &[RunResult]| -> Result<GridReport> {
        let report = GridReport::build(grid, Some(zero.clone()), results.to_vec());
        report.write(&grid.output_dir)?;
        Ok(report)
    };
    let mut results = Vec::new();
    for row in &grid.rows {
        for &seed in &grid.seeds {
            match ctx.run(row, seed)? {
                Some(r) => results.push(r),
                None => return report(&results),
            }
            report(&results)?;
        }
    }
    if let Some(more) = &grid.more_seeds {
        // The first pass's ranking (its report is already written).
        for label in first_pass_top(grid, more, &results) {
            let Some(row) = grid.rows.iter().find(|r| r.label == label) else {
                continue;
            };
            for &seed in &more.seeds {
                match ctx.run(row, seed)? {
                    Some(r) => results.push(r),
                    None => return report(&results),
                }
                report(&results)?;
            }
        }
    }
    report(&results)
}

/// The results already in `grid`'s output folder (nothing is trained or evaluated): the
/// zero-shot result and the finished runs of the grid as it is now (every row with its seeds and
/// `more_seeds`; results of runs under another config, such as an edited row, are left out),
/// for the report of a grid in progress. `options` must be the ones the grid runs with (its
/// devices are part of each run's key).
///
/// # Errors
/// A result file that cannot be read or parsed (named); the base model's weights unreadable.
pub fn load_results(
    grid: &Grid,
    options: &GridOptions,
) -> Result<(Option<ZeroShotResult>, Vec<RunResult>)> {
    let mut ctx = Context::new(grid, options, false)?;
    let base = grid.base_config()?;
    let zero = ctx.zero_shot_key(&base).and_then(|key| {
        Ok(
            read_json::<ZeroShotResult>(&grid.output_dir.join(ZERO_SHOT_FILE))?
                .filter(|r| r.key == key),
        )
    })?;
    let mut runs = Vec::new();
    for row in &grid.rows {
        for seed in grid.all_seeds() {
            let (key, dir, _) = ctx.run_key(row, seed)?;
            if let Some(r) = read_json::<RunResult>(&dir.join(RESULT_FILE))?
                && r.key == key
            {
                runs.push(r.for_row(row));
            }
        }
    }
    Ok((zero, runs))
}

fn write_err(path: &Path, source: std::io::Error) -> Error {
    Error::Write {
        path: path.to_path_buf(),
        source,
    }
}

/// A JSON file, or `None` when it does not exist.
fn read_json<T: for<'de> Deserialize<'de>>(path: &Path) -> Result<Option<T>> {
    match std::fs::read(path) {
        Ok(bytes) => serde_json::from_slice(&bytes).map(Some).map_err(|e| {
            Error::from(GridError::Invalid {
                path: path.to_path_buf(),
                problem: format!("unreadable result file ({e}); delete it to run again"),
            })
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(GridError::io(path, e).into()),
    }
}

fn write_json<T: Serialize>(path: &Path, value: &T) -> Result<()> {
    let bytes =
        serde_json::to_vec_pretty(value).map_err(|e| write_err(path, std::io::Error::other(e)))?;
    write_atomic(path, &bytes).map_err(|source| write_err(path, source))
}

/// What every run of one grid call shares: the grid, the options, the retrieval set (read
/// once), the weights' revisions (hashed once per model folder).
struct Context<'g> {
    grid: &'g Grid,
    options: &'g GridOptions,
    retrieval: Option<EvalSet>,
    revisions: BTreeMap<PathBuf, String>,
    trained: usize,
}

impl<'g> Context<'g> {
    /// Reads the retrieval set (when the grid scores one) unless only results are read.
    fn new(grid: &'g Grid, options: &'g GridOptions, read_retrieval: bool) -> Result<Self> {
        let retrieval = match &grid.retrieval {
            Some(dir) if read_retrieval => Some(Collection::MsMarcoSubset.load(dir).map_err(
                |e| GridError::Invalid {
                    path: grid.path.clone(),
                    problem: format!(
                        "the retrieval set (`retrieval`, default {}) cannot be read: {e}; \
                             set `retrieval = false` to train without it",
                        super::DEFAULT_RETRIEVAL_SET
                    ),
                },
            )?),
            _ => None,
        };
        Ok(Self {
            grid,
            options,
            retrieval,
            revisions: BTreeMap::new(),
            trained: 0,
        })
    }

    fn revision(&mut self, model: &Path) -> Result<String> {
        if let Some(r) = self.revisions.get(model) {
            return Ok(r.clone());
        }
        let r = weights_revision(model)?;
        self.revisions.insert(model.to_path_buf(), r.clone());
        Ok(r)
    }

    /// The config of a run, its devices applied.
    fn config(&self, row: &GridRow, seed: u64) -> Result<TrainConfig> {
        let mut config = self.grid.config(row, seed)?;
        if let Some(specs) = &self.options.devices {
            config.set_devices(specs.clone());
            config.validate()?;
        }
        Ok(config)
    }

    /// The key of `what` (a config as JSON, its `output_dir` left out) with the model's
    /// revision and the retrieval set.
    fn key(&mut self, kind: &str, mut what: serde_json::Value, model: &Path) -> Result<String> {
        if let serde_json::Value::Object(map) = &mut what {
            map.remove("output_dir");
        }
        let keyed = serde_json::json!({
            "runner": RUNNER_VERSION,
            "kind": kind,
            "config": what,
            "weights": self.revision(model)?,
            "retrieval": self.grid.retrieval,
        });
        // serde_json's maps are sorted by key: the text is canonical.
        let digest = Sha256::digest(keyed.to_string().as_bytes());
        Ok(digest.iter().take(8).map(|b| format!("{b:02x}")).collect())
    }

    /// The zero-shot result's key: the base model, its encoder config, the data, the devices.
    fn zero_shot_key(&mut self, config: &TrainConfig) -> Result<String> {
        let what = serde_json::json!({
            "model": config.model,
            "encoder": config.encoder,
            "data": config.data,
            "devices": self.options.devices.clone().unwrap_or_else(|| config.device_specs()),
        });
        self.key("zero-shot", what, &config.model)
    }

    fn zero_shot(&mut self) -> Result<ZeroShotResult> {
        let config = self.grid.base_config()?;
        let key = self.zero_shot_key(&config)?;
        let path = self.grid.output_dir.join(ZERO_SHOT_FILE);
        if let Some(r) = read_json::<ZeroShotResult>(&path)?
            && r.key == key
        {
            return Ok(r);
        }
        let dev = dev_split(self.grid, &config)?;
        let evaluator = FollowIrDevEvaluator::from_files(&dev, config.data.distractors.as_deref())?;
        let specs = self
            .options
            .devices
            .clone()
            .unwrap_or_else(|| config.device_specs());
        let devices = crate::open_devices(&specs)?;
        let encoder = DualEncoder::from_dir(&config.model, config.encoder.clone(), &devices[0])?;
        let t = Instant::now();
        let report = evaluator.report(&encoder)?;
        let mut measures = dev_measures(&report);
        self.add_retrieval(&mut measures, &encoder)?;
        log::info!(
            "zero-shot {}: dev p-MRR {:.2} ({:.1} s)",
            config.model.display(),
            report.p_mrr,
            t.elapsed().as_secs_f64()
        );
        let result = ZeroShotResult { key, measures };
        write_json(&path, &result)?;
        Ok(result)
    }

    /// A run's key, its folder and its config (devices applied, `output_dir` not yet set).
    fn run_key(&mut self, row: &GridRow, seed: u64) -> Result<(String, PathBuf, TrainConfig)> {
        let config = self.config(row, seed)?;
        let json = serde_json::to_value(&config)
            .map_err(|e| write_err(&self.grid.output_dir, std::io::Error::other(e)))?;
        let key = self.key("run", json, &config.model)?;
        let dir = self.grid.output_dir.join("runs").join(&key);
        Ok((key, dir, config))
    }

    /// Runs (or reads) one run. `None` when `max_runs` runs have trained in this call.
    fn run(&mut self, row: &GridRow, seed: u64) -> Result<Option<RunResult>> {
        let (key, dir, mut config) = self.run_key(row, seed)?;
        let result_path = dir.join(RESULT_FILE);
        if let Some(r) = read_json::<RunResult>(&result_path)?
            && r.key == key
        {
            self.tidy(&dir)?;
            log::info!("cached: `{}` seed {seed} ({})", row.label, dir.display());
            return Ok(Some(r.for_row(row)));
        }
        if self.options.max_runs.is_some_and(|m| self.trained >= m) {
            log::info!(
                "stopping: {} run(s) trained in this call (max_runs)",
                self.trained
            );
            return Ok(None);
        }
        config.output_dir = dir.clone();
        let config_json =
            serde_json::to_value(&config).map_err(|e| write_err(&dir, std::io::Error::other(e)))?;
        std::fs::create_dir_all(&dir).map_err(|source| write_err(&dir, source))?;
        write_json(&dir.join("config.json"), &config_json)?;
        let dev = dev_split(self.grid, &config)?;
        let evaluator = FollowIrDevEvaluator::from_files(&dev, config.data.distractors.as_deref())?;
        let devices = crate::open_devices(&config.device_specs())?;
        let mut trainer = Trainer::on_devices(config.clone(), &devices)?
            .with_evaluator(Box::new(evaluator.clone()))
            .progress(self.options.progress);
        let resumed = trainer.resume()?;
        let start_step = trainer.state().step;
        log::info!(
            "run `{}` seed {seed} -> {}{}",
            row.label,
            dir.display(),
            if resumed {
                format!(" (resumed at step {start_step})")
            } else {
                String::new()
            }
        );
        let summary = trainer.run()?;
        let encoder = trainer.encoder();
        drop(trainer);
        let ran = summary.steps.saturating_sub(start_step);
        let train_seconds = (ran > 0).then(|| summary.seconds / ran as f64 * summary.steps as f64);
        let mut measures = Measures::new();
        let last_eval = summary
            .history
            .iter()
            .rev()
            .find(|h| h.step == summary.steps && !h.metrics.is_empty());
        match last_eval {
            Some(h) => {
                for m in Measure::ALL {
                    if let Some(name) = m.history_name()
                        && let Some((_, v)) = h.metrics.iter().find(|(k, _)| k == name)
                    {
                        measures.insert(m, *v);
                    }
                }
            }
            // The schedule did not evaluate the last step: evaluate the final model now.
            None => measures = dev_measures(&evaluator.report(&encoder)?),
        }
        self.add_retrieval(&mut measures, &encoder)?;
        let result = RunResult {
            key,
            row: row.label.clone(),
            seed,
            steps: summary.steps,
            train_seconds,
            resumed,
            measures,
            history: summary
                .history
                .into_iter()
                .filter(|h| !h.metrics.is_empty())
                .collect(),
            config: config_json,
        };
        write_json(&result_path, &result)?;
        self.tidy(&dir)?;
        self.trained += 1;
        log::info!(
            "done `{}` seed {seed}: dev p-MRR {}",
            row.label,
            result
                .measures
                .get(&Measure::PMrr)
                .map_or("-".into(), |v| format!("{v:.2}"))
        );
        Ok(Some(result))
    }

    /// Adds the retrieval set's nDCG@10 of `encoder`, when the grid scores one.
    fn add_retrieval(&self, measures: &mut Measures, encoder: &DualEncoder) -> Result<()> {
        if let Some(set) = &self.retrieval {
            measures.insert(
                Measure::RetrievalNdcgAt10,
                retrieval_report(encoder, set)?.ndcg_at_10,
            );
        }
        Ok(())
    }

    /// Removes a finished run's model and checkpoints unless the grid keeps models.
    fn tidy(&self, dir: &Path) -> Result<()> {
        if self.grid.keep_models {
            return Ok(());
        }
        for sub in ["checkpoints", "final"] {
            let p = dir.join(sub);
            if p.exists() {
                std::fs::remove_dir_all(&p).map_err(|source| write_err(&p, source))?;
            }
        }
        Ok(())
    }
}

/// The development split's measures of a report.
fn dev_measures(report: &FollowIrReport) -> Measures {
    let mut m = Measures::new();
    m.insert(Measure::PMrr, report.p_mrr);
    m.insert(Measure::NdcgAt10, report.ndcg_at_10);
    if let Some(p) = report.pairwise_accuracy {
        m.insert(Measure::PairwiseAccuracy, p);
    }
    m
}

fn dev_split(grid: &Grid, config: &TrainConfig) -> Result<PathBuf> {
    config.data.dev.clone().ok_or_else(|| {
        GridError::Invalid {
            path: grid.path.clone(),
            problem: "the base config has no development split (`data.dev`): a grid compares \
                      runs on it"
                .into(),
        }
        .into()
    })
}
