//! [`Trainer`]: the training loop.
//!
//! One optimizer step = `batch.accumulation` contrastive batches of `batch.records` records
//! (3 rows each); each batch's loss is computed over its own rows only (in-batch negatives
//! never cross batches or devices), its gradient weighted by `1 / accumulation`, the sum
//! clipped to `optimizer.max_grad_norm` (global L2 norm) and applied by AdamW at the
//! scheduled learning rate. The loop keeps the optimizer itself so that a checkpoint holds
//! its state together with the data position. After a step only the weights of the
//! [`DualEncoder`] are replaced; its tokenizer and settings are shared, not copied.

use std::path::{Path, PathBuf};
use std::time::Instant;

use burn::module::Module;
use burn::optim::{GradientsAccumulator, ModuleOptimizer};
use burn::store::ModuleRecord;
use burn::tensor::{Bytes, Device};
use infembed_data::{InfIrRecord, ReadMode, read_mined_negatives, read_records};
use infembed_encoder::{DualEncoder, DualEncoderModel, Interaction, ModelInfo, weights_revision};
use infembed_losses::{ContrastiveLoss, Variable};

use crate::batch::{MinedSet, TrainBatch, epoch_batches};
use crate::checkpoint::{self, HistoryEntry, StepRecord, TrainState};
use crate::config::{GPU_TEXTS_PER_PASS, TrainConfig};
use crate::error::{Error, Result};
use crate::optim::{StepHandle, adamw_with_handle, clip_factor, learning_rate};
use crate::progress::{self, ProgressMode, ProgressSink, RunInfo, StepInfo};
use crate::step::{full_batch_pass, full_batch_step, multi_device_step};

/// The per-step log in the output directory: one JSON object per line, `{"step", "epoch",
/// "loss", "lr"}` for each optimizer step and `{"step", "metrics": {...}}` after each
/// evaluation of the development set.
pub const STEP_LOG: &str = "history.jsonl";
/// The training chart's file stem in the output directory (`training.svg`, `training.png`).
pub const CHART_STEM: &str = "training";

fn log_line_step(r: &StepRecord) -> String {
    // Field order as written: step first.
    #[derive(serde::Serialize)]
    struct Line {
        step: usize,
        epoch: usize,
        loss: f64,
        lr: f64,
    }
    let line = Line {
        step: r.step,
        epoch: r.epoch,
        loss: r.loss,
        lr: r.lr,
    };
    let mut text = serde_json::to_string(&line).unwrap_or_default();
    text.push('\n');
    text
}

fn log_line_eval(e: &HistoryEntry) -> String {
    #[derive(serde::Serialize)]
    struct Line {
        step: usize,
        metrics: serde_json::Map<String, serde_json::Value>,
    }
    let line = Line {
        step: e.step,
        metrics: e
            .metrics
            .iter()
            .map(|(k, v)| (k.clone(), serde_json::json!(v)))
            .collect(),
    };
    let mut text = serde_json::to_string(&line).unwrap_or_default();
    text.push('\n');
    text
}

/// Evaluates the model on development data during training.
pub trait DevEvaluator {
    /// Scores `encoder` (weights in validation mode on a plain device) and returns named
    /// metrics, for example `("p_mrr", 26.3)`; they are logged, kept in the history and
    /// plotted.
    fn evaluate(
        &mut self,
        encoder: &DualEncoder,
    ) -> std::result::Result<Vec<(String, f64)>, Box<dyn std::error::Error + Send + Sync>>;
}

/// What a finished (or stopped) run reports.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct TrainSummary {
    /// Optimizer steps done.
    pub steps: usize,
    /// Rows trained on by this process (resumed steps excluded).
    pub rows: usize,
    /// Seconds spent in training steps by this process.
    pub seconds: f64,
    /// Loss and metric history of the whole run.
    pub history: Vec<HistoryEntry>,
    /// Where the final model was saved (`None` when stopped before the end).
    pub final_dir: Option<PathBuf>,
}

impl TrainSummary {
    /// Training rows per second of this process.
    pub fn rows_per_second(&self) -> f64 {
        if self.seconds > 0.0 {
            self.rows as f64 / self.seconds
        } else {
            0.0
        }
    }
}

/// A training run: config, data, model, optimizer and progress.
pub struct Trainer {
    config: TrainConfig,
    config_json: serde_json::Value,
    records: Vec<InfIrRecord>,
    /// Mined hard negatives (`batch.mined_per_record > 0`).
    mined: Option<MinedSet>,
    encoder: DualEncoder,
    /// Every training device (autodiff), the main one (the encoder's) first.
    devices: Vec<Device>,
    optim: ModuleOptimizer,
    /// The clipping factor `optim` applies to the gradients of its next step, and the end of
    /// its steps (the GPU's updates wait to go several tensors a launch).
    step_handle: StepHandle,
    /// Whether the encoder trains on the CPU (`flex`), whose steps read each loss back before
    /// the update; a GPU device's steps issue the update first.
    on_cpu: bool,
    /// Optimizer steps clipped with the norm left on the device (test hook).
    #[cfg(feature = "test-hooks")]
    device_clips: std::sync::atomic::AtomicUsize,
    /// The optimizer step (1-based) whose gradients, or whose losses alone, are made NaN
    /// (test hook).
    #[cfg(feature = "test-hooks")]
    poison_step: Option<(usize, Poisoned)>,
    loss: ContrastiveLoss,
    needs_instructions: bool,
    state: TrainState,
    evaluator: Option<Box<dyn DevEvaluator>>,
    quiet: bool,
    progress: ProgressMode,
    sink: Option<Box<dyn ProgressSink>>,
}

impl std::fmt::Debug for Trainer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Trainer")
            .field("config", &self.config)
            .field("records", &self.records.len())
            .field("state", &self.state)
            .finish_non_exhaustive()
    }
}

/// Optimizer steps per epoch for `n` records.
pub fn steps_per_epoch(config: &TrainConfig, n: usize) -> usize {
    let b = &config.batch;
    let batches = if b.drop_last {
        n / b.records
    } else {
        n.div_ceil(b.records)
    };
    batches.div_ceil(b.accumulation)
}

impl Trainer {
    /// Validates the config, reads the training records and loads the model on `device`
    /// (a plain device such as `Device::flex()`; autodiff is added here). The config's
    /// `device` / `devices` keys are not read: [`TrainConfig::device_specs`] gives them to the
    /// caller, who opens the devices (the facade's `infembed::train` does).
    pub fn new(config: TrainConfig, device: &Device) -> Result<Self> {
        Self::on_devices(config, std::slice::from_ref(device))
    }

    /// As [`new`](Self::new), on several devices that share every contrastive batch
    /// ([`multi_device_step`]): the model and the optimizer live on the first, each other
    /// device holds a copy of the weights refreshed after every optimizer step. The result
    /// equals one device's over the same batches up to float rounding (dropout aside: each
    /// device's share draws its own masks). Several devices need Interaction I.
    pub fn on_devices(config: TrainConfig, devices: &[Device]) -> Result<Self> {
        config.validate()?;
        let Some(device) = devices.first() else {
            return Err(Error::config(
                Path::new("<TrainConfig>"),
                "devices",
                "names no device",
            ));
        };
        if devices.len() > 1
            && !matches!(
                config.encoder.interaction,
                Interaction::SelfAttention { .. }
            )
        {
            return Err(Error::config(
                Path::new("<TrainConfig>"),
                "devices",
                "several devices need encoder.interaction.type = \"self_attention\"",
            ));
        }
        let mode = if config.data.lenient {
            ReadMode::Lenient
        } else {
            ReadMode::Strict
        };
        let set = read_records(&config.data.train, mode)?;
        if !set.skipped.is_empty() {
            log::warn!(
                "{}: skipped {} malformed record(s) at {:?}",
                config.data.train.display(),
                set.skipped.len(),
                set.skipped_locations()
            );
        }
        let records = set.records;
        if records.is_empty() {
            return Err(Error::Data {
                path: config.data.train.clone(),
                problem: "holds no training record".into(),
            });
        }
        if config.batch.drop_last && records.len() < config.batch.records {
            return Err(Error::Data {
                path: config.data.train.clone(),
                problem: format!(
                    "{} record(s) do not fill one batch of {} with batch.drop_last",
                    records.len(),
                    config.batch.records
                ),
            });
        }
        let mined = match (&config.data.mined_negatives, config.batch.mined_per_record) {
            (Some(path), per_record) if per_record > 0 => {
                let lists = read_mined_negatives(path, &records)?;
                Some(MinedSet::new(lists, &records, per_record))
            }
            _ => None,
        };
        let loss = config.loss.init()?;
        let needs_instructions = loss.objective().variables().contains(Variable::I);
        let plain = device.clone().inner();
        let on_cpu = plain == Device::flex();
        // The objectives score by cosine: the encoder used for dev evaluation does too, so a
        // dot-product checkpoint is measured as it is trained (and as it is saved).
        let loaded = DualEncoder::from_dir(&config.model, config.encoder.clone(), &plain)?
            .with_cosine_scoring();
        let mut encoder = loaded.with_model(loaded.model().clone().train(), &plain.autodiff());
        if let Some(precision) = config.dtype {
            encoder.set_training_precision(precision)?;
        }
        if let Some(routine) = config.matmul {
            encoder.set_gpu_matmul(routine)?;
        }
        encoder.set_training_pass_texts(training_pass_texts(&config, on_cpu));
        let devices: Vec<Device> = devices
            .iter()
            .map(|d| d.clone().inner().autodiff())
            .collect();
        let (optim, step_handle) = adamw_with_handle(&config.optimizer);
        let per_epoch = steps_per_epoch(&config, records.len());
        let total = config.max_steps.map_or(per_epoch * config.epochs, |m| {
            m.min(per_epoch * config.epochs)
        });
        // Through text, as the checkpoint stores it (f32 values then compare equal).
        let config_json: serde_json::Value = serde_json::to_string(&config)
            .and_then(|s| serde_json::from_str(&s))
            .map_err(|e| Error::Config {
                path: PathBuf::from("<TrainConfig>"),
                field: "<root>".into(),
                problem: format!("does not serialize: {e}"),
            })?;
        let state = TrainState {
            step: 0,
            epoch: 0,
            step_in_epoch: 0,
            seed: config.seed,
            total_steps: total,
            history: Vec::new(),
            steps: Vec::new(),
            config: config_json.clone(),
        };
        Ok(Self {
            config,
            config_json,
            records,
            mined,
            encoder,
            devices,
            optim,
            step_handle,
            on_cpu,
            #[cfg(feature = "test-hooks")]
            device_clips: Default::default(),
            #[cfg(feature = "test-hooks")]
            poison_step: None,
            loss,
            needs_instructions,
            state,
            evaluator: None,
            quiet: false,
            progress: ProgressMode::Auto,
            sink: None,
        })
    }

    /// Adds a development-set evaluator.
    pub fn with_evaluator(mut self, evaluator: Box<dyn DevEvaluator>) -> Self {
        self.evaluator = Some(evaluator);
        self
    }

    /// Silences the progress lines (errors still propagate; no dashboard either).
    pub fn quiet(mut self, quiet: bool) -> Self {
        self.quiet = quiet;
        self
    }

    /// How progress is shown while [`run`](Self::run) trains (default
    /// [`ProgressMode::Auto`]: burn-train's dashboard on a terminal, plain lines otherwise).
    pub fn progress(mut self, mode: ProgressMode) -> Self {
        self.progress = mode;
        self
    }

    /// The config.
    pub fn config(&self) -> &TrainConfig {
        &self.config
    }

    /// Progress so far.
    pub fn state(&self) -> &TrainState {
        &self.state
    }

    /// Number of training records.
    pub fn num_records(&self) -> usize {
        self.records.len()
    }

    /// The current weights in validation mode on the plain device (for evaluation or saving).
    pub fn encoder(&self) -> DualEncoder {
        let plain = self.encoder.device().clone().inner();
        self.encoder
            .with_model(self.encoder.model().valid(), &plain)
    }

    /// The training devices (autodiff), the main one first.
    pub fn devices(&self) -> &[Device] {
        &self.devices
    }

    /// The encoder as each training device holds it: the main one's, then a copy of its
    /// weights on each other device (the same encoder again where a device repeats the
    /// main one, as `cpu,cpu` does).
    pub fn replicas(&self) -> Vec<DualEncoder> {
        let main = self.encoder.device();
        self.devices
            .iter()
            .map(|d| {
                if d == main {
                    self.encoder.clone()
                } else {
                    self.encoder
                        .with_model(self.encoder.model().clone().fork(d), d)
                }
            })
            .collect()
    }

    /// The trainable modules (on the autodiff device).
    pub fn model(&self) -> &DualEncoderModel {
        self.encoder.model()
    }

    /// Restores the newest checkpoint of `output_dir`, if there is one. Returns whether it
    /// did. Fails when the checkpoint was written under a different config (other than
    /// `max_steps`, `eval`, `checkpoint`).
    pub fn resume(&mut self) -> Result<bool> {
        let Some(loaded) = checkpoint::load_latest(&self.config.output_dir)? else {
            return Ok(false);
        };
        let diff = checkpoint::config_differences(&loaded.state.config, &self.config_json);
        if !diff.is_empty() {
            return Err(Error::checkpoint(
                &loaded.dir,
                format!(
                    "was written under another config (keys {}); use a new output_dir or the \
                     same config",
                    diff.join(", ")
                ),
            ));
        }
        let path = loaded.dir.join("model.bpk");
        let record =
            ModuleRecord::from_bytes(Bytes::from_bytes_vec(loaded.model)).map_err(|source| {
                Error::Record {
                    path: path.clone(),
                    source,
                }
            })?;
        // A checkpoint of another model (other widths) is a typed error, not burn's panic.
        let model = self
            .encoder
            .model()
            .clone()
            .try_load_record(record)
            .map_err(|source| Error::Record {
                path: path.clone(),
                source,
            })?;
        self.encoder.set_model(model);
        let opath = loaded.dir.join("optimizer.bpk");
        self.optim = self
            .optim
            .clone()
            .from_bytes(Bytes::from_bytes_vec(loaded.optimizer))
            .map_err(|source| Error::Record {
                path: opath,
                source,
            })?;
        let total = self.state.total_steps;
        self.state = loaded.state;
        self.state.total_steps = total;
        self.state.config = self.config_json.clone();
        self.log(&format!(
            "resumed from {} at step {}/{} (epoch {}, {} step(s) into it)",
            loaded.dir.display(),
            self.state.step,
            total,
            self.state.epoch + 1,
            self.state.step_in_epoch
        ));
        Ok(true)
    }

    /// Writes a checkpoint of the current state now.
    pub fn save_checkpoint(&self) -> Result<PathBuf> {
        let root = checkpoint::checkpoints_dir(&self.config.output_dir);
        let model = self
            .encoder
            .model()
            .clone()
            .into_record()
            .into_bytes()
            .map_err(|source| Error::Record {
                path: root.clone(),
                source,
            })?;
        let optim = self.optim.into_bytes().map_err(|source| Error::Record {
            path: root.clone(),
            source,
        })?;
        checkpoint::save(
            &self.config.output_dir,
            &self.state,
            &model,
            &optim,
            self.config.checkpoint.keep,
        )
    }

    /// A progress note: to the open display while training, else to the `log` facade (info).
    fn log(&mut self, line: &str) {
        match self.sink.as_mut() {
            Some(sink) => sink.note(line),
            None if !self.quiet => log::info!("{line}"),
            None => {}
        }
    }

    fn evaluate(&mut self, loss: Option<f64>, lr: Option<f64>) -> Result<()> {
        let encoder = self.encoder();
        let step = self.state.step;
        let metrics = match self.evaluator.as_mut() {
            Some(ev) => {
                let t = Instant::now();
                let m = ev
                    .evaluate(&encoder)
                    .map_err(|source| Error::Eval { step, source })?;
                let seconds = t.elapsed().as_secs_f64();
                if let Some(sink) = self.sink.as_mut() {
                    sink.eval(step, &m, seconds);
                }
                m
            }
            None => Vec::new(),
        };
        if loss.is_some() || !metrics.is_empty() {
            let entry = HistoryEntry {
                step,
                loss,
                lr,
                metrics,
            };
            if !entry.metrics.is_empty() {
                self.append_log(&log_line_eval(&entry))?;
            }
            self.state.history.push(entry);
        }
        self.write_history()
    }

    /// `<output_dir>/history.jsonl`: one line per optimizer step, one per evaluation.
    fn log_path(&self) -> PathBuf {
        self.config.output_dir.join(STEP_LOG)
    }

    /// Appends one line to the step log.
    fn append_log(&self, line: &str) -> Result<()> {
        use std::io::Write;
        let path = self.log_path();
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .map_err(|e| Error::io(&path, e))?;
        file.write_all(line.as_bytes())
            .map_err(|e| Error::io(&path, e))
    }

    /// Rewrites the step log from the state: at the start of a run, and on resuming, where lines
    /// written after the checkpoint (by a run that was killed) are dropped with the steps they
    /// describe.
    fn rewrite_log(&self) -> Result<()> {
        let mut text = String::new();
        let mut evals = self
            .state
            .history
            .iter()
            .filter(|h| !h.metrics.is_empty())
            .peekable();
        for record in &self.state.steps {
            while let Some(e) = evals.next_if(|e| e.step < record.step) {
                text.push_str(&log_line_eval(e));
            }
            text.push_str(&log_line_step(record));
        }
        for e in evals {
            text.push_str(&log_line_eval(e));
        }
        checkpoint::write_atomic(&self.log_path(), text.as_bytes())
    }

    /// Runs to the end (all epochs, or `max_steps`), evaluating and checkpointing as
    /// configured, then saves the model to `<output_dir>/final` and the history to
    /// `<output_dir>/history.json`.
    pub fn run(&mut self) -> Result<TrainSummary> {
        self.run_inner(None)
    }

    /// Test hook (the `test-hooks` feature, which this crate's own tests enable): as
    /// [`run`](Self::run), but returns after optimizer step `stop_after` (once its
    /// checkpoint, if one was due, is written) without saving a final model: a stand-in for
    /// a crash in resume tests.
    #[cfg(feature = "test-hooks")]
    #[doc(hidden)]
    pub fn run_until(&mut self, stop_after: Option<usize>) -> Result<TrainSummary> {
        self.run_inner(stop_after)
    }

    /// Test hook (the `test-hooks` feature): how many optimizer steps clipped with the norm
    /// left on the device.
    #[cfg(feature = "test-hooks")]
    #[doc(hidden)]
    pub fn device_clip_steps(&self) -> usize {
        self.device_clips.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Test hook (the `test-hooks` feature): the gradients of optimizer step `step` (1-based)
    /// are multiplied by NaN before clipping, the loss left as it is.
    #[cfg(feature = "test-hooks")]
    #[doc(hidden)]
    pub fn poison_gradients_at(mut self, step: usize) -> Self {
        self.poison_step = Some((step, Poisoned::Gradients));
        self
    }

    /// Test hook (the `test-hooks` feature): the losses of optimizer step `step` (1-based)
    /// are made NaN, the gradients left as they are.
    #[cfg(feature = "test-hooks")]
    #[doc(hidden)]
    pub fn poison_loss_at(mut self, step: usize) -> Self {
        self.poison_step = Some((step, Poisoned::Loss));
        self
    }

    /// Whether the test hooks make `what` of optimizer step `step` (0-based) NaN.
    #[allow(unused_variables, clippy::unused_self)]
    fn poisoned(&self, step: usize, what: Poisoned) -> bool {
        #[cfg(feature = "test-hooks")]
        if self.poison_step == Some((step + 1, what)) {
            return true;
        }
        false
    }

    fn run_inner(&mut self, stop_after: Option<usize>) -> Result<TrainSummary> {
        self.sink = Some(progress::open(self.progress, self.quiet)?);
        let out = self.train_loop(stop_after);
        // Finished, stopped or failed: close the display (the dashboard gives the terminal
        // back) before the caller prints anything.
        if let Some(mut sink) = self.sink.take() {
            sink.finish();
        }
        out
    }

    fn train_loop(&mut self, stop_after: Option<usize>) -> Result<TrainSummary> {
        let total = self.state.total_steps;
        let n = self.records.len();
        let per_epoch = steps_per_epoch(&self.config, n);
        let rows_per_batch = 3 * self.config.batch.records;
        std::fs::create_dir_all(&self.config.output_dir)
            .map_err(|e| Error::io(&self.config.output_dir, e))?;
        self.rewrite_log()?;
        if self.state.step == 0 && self.config.eval.at_start && self.evaluator.is_some() {
            self.evaluate(None, None)?;
        }
        let label = format!(
            "training {} on {} records ({} rows): {} epoch(s) x {} step(s) = {} optimizer steps, \
             {} row(s) per batch x {} accumulation, loss {:?} {:?}",
            self.config.model.display(),
            n,
            3 * n,
            self.config.epochs,
            per_epoch,
            total,
            rows_per_batch,
            self.config.batch.accumulation,
            self.config.loss.kind,
            self.config.loss.terms,
        );
        let run = RunInfo {
            epochs: self.config.epochs,
            start_epoch: self.state.epoch,
            total_steps: total,
            label,
        };
        if let Some(sink) = self.sink.as_mut() {
            sink.start(&run);
        }
        let started = Instant::now();
        let mut rows_done = 0usize;
        // The mean loss of the next history entry covers every step since the previous entry,
        // those before a resume included (their losses are in the checkpoint's step records),
        // so a resumed run's history equals an uninterrupted one's.
        let since = self.state.history.last().map_or(0, |h| h.step);
        let mut window_loss = 0.0f64;
        let mut window_steps = 0usize;
        for r in self.state.steps.iter().filter(|r| r.step > since) {
            window_loss += r.loss;
            window_steps += 1;
        }
        let mut stopped = false;
        'epochs: while self.state.epoch < self.config.epochs && self.state.step < total {
            let epoch = self.state.epoch;
            let batches = epoch_batches(
                n,
                self.config.batch.records,
                self.config.batch.drop_last,
                self.config.seed,
                epoch,
            );
            let groups: Vec<&[Vec<usize>]> =
                batches.chunks(self.config.batch.accumulation).collect();
            while self.state.step_in_epoch < groups.len() {
                let group = groups[self.state.step_in_epoch];
                let step = self.state.step;
                let (loss, rows) = self.optimizer_step(group, step, total)?;
                rows_done += rows;
                window_loss += f64::from(loss);
                window_steps += 1;
                let lr = learning_rate(&self.config.optimizer, step, total);
                self.state.step += 1;
                self.state.step_in_epoch += 1;
                let done = self.state.step;
                let record = StepRecord {
                    step: done,
                    epoch,
                    loss: f64::from(loss),
                    lr,
                };
                self.append_log(&log_line_step(&record))?;
                self.state.steps.push(record);
                let secs = started.elapsed().as_secs_f64();
                let info = StepInfo {
                    done,
                    total,
                    epoch,
                    epochs: self.config.epochs,
                    in_epoch: self.state.step_in_epoch,
                    epoch_steps: groups.len(),
                    loss,
                    lr,
                    rows_per_second: rows_done as f64 / secs.max(1e-9),
                };
                if let Some(sink) = self.sink.as_mut() {
                    sink.step(&info);
                }
                let end_of_epoch = self.state.step_in_epoch == groups.len();
                let eval_due = match self.config.eval.every_steps {
                    Some(k) => done.is_multiple_of(k) || done == total,
                    None => end_of_epoch || done == total,
                };
                if eval_due {
                    let mean = window_loss / window_steps.max(1) as f64;
                    window_loss = 0.0;
                    window_steps = 0;
                    self.evaluate(Some(mean), Some(lr))?;
                }
                if end_of_epoch {
                    self.state.epoch += 1;
                    self.state.step_in_epoch = 0;
                }
                let ckpt_due = self
                    .config
                    .checkpoint
                    .every_steps
                    .is_some_and(|k| done.is_multiple_of(k))
                    || done == total;
                // A quit asked for on the last step changes nothing: the run ends anyway.
                let quit = done < total && self.sink.as_ref().is_some_and(|s| s.stop_requested());
                if ckpt_due || quit {
                    let dir = self.save_checkpoint()?;
                    self.log(&format!("checkpoint {}", dir.display()));
                }
                if quit {
                    self.log(&format!(
                        "stopped from the dashboard after step {done}/{total}; continue with \
                         --resume"
                    ));
                    stopped = true;
                    break 'epochs;
                }
                if stop_after.is_some_and(|s| done >= s) {
                    stopped = true;
                    break 'epochs;
                }
                if done >= total {
                    break 'epochs;
                }
                if end_of_epoch {
                    // The next epoch has its own order: recompute the batches.
                    break;
                }
            }
        }
        let seconds = started.elapsed().as_secs_f64();
        let mut final_dir = None;
        if !stopped {
            let dir = self.config.output_dir.join("final");
            self.encoder().save(&dir)?;
            self.write_model_info(&dir)?;
            self.log(&format!("saved the trained model to {}", dir.display()));
            final_dir = Some(dir);
        }
        Ok(TrainSummary {
            steps: self.state.step,
            rows: rows_done,
            seconds,
            history: self.state.history.clone(),
            final_dir,
        })
    }

    /// `infembed_model.json` of the trained model: its name (the config's `name`, else the
    /// base model's + `-infembed`), the revision of the weights just written, and the base.
    fn write_model_info(&self, dir: &Path) -> Result<()> {
        let base = ModelInfo::of_dir(&self.config.model)?;
        let name = self
            .config
            .name
            .clone()
            .unwrap_or_else(|| format!("{}-infembed", base.name));
        ModelInfo::new(name, weights_revision(dir)?)
            .with_base(&base)
            .with_trained_with(concat!("infembed ", env!("CARGO_PKG_VERSION")))
            .write(dir)?;
        Ok(())
    }

    fn write_history(&self) -> Result<()> {
        let path = self.config.output_dir.join("history.json");
        let json = serde_json::to_vec_pretty(&self.state.history)
            .map_err(|e| Error::checkpoint(&path, format!("history does not serialize: {e}")))?;
        checkpoint::write_atomic(&path, &json)?;
        crate::plot::training_chart(&self.state.steps, &self.state.history)?
            .write(&self.config.output_dir.join(CHART_STEM))?;
        Ok(())
    }

    /// One optimizer step over `group` (one or more batches of record indices). Returns the
    /// mean loss and the rows seen.
    fn optimizer_step(
        &mut self,
        group: &[Vec<usize>],
        step: usize,
        total: usize,
    ) -> Result<(f32, usize)> {
        let weight = 1.0 / group.len() as f64;
        let mut acc = GradientsAccumulator::<DualEncoderModel>::new();
        let mut loss_sum = 0.0f32;
        let mut rows = 0;
        let acc_n = self.config.batch.accumulation as u64;
        // The weights do not change within the group: copy them to the other devices once.
        let replicas = (self.devices.len() > 1).then(|| self.replicas());
        // On a GPU device, one device without GradCache: the losses stay on the device until
        // the update is issued, so that the device computes the passes while the host issues
        // the norm's squares and the update, when clipping computes its factor on the device
        // (whose kernel leaves the weights as they were if the norm is not finite); they are
        // checked for NaN and infinity after it. Otherwise they are read before the update.
        let defer =
            !self.on_cpu && replicas.is_none() && self.config.batch.grad_cache_chunk.is_none();
        let mut deferred = Vec::new();
        for (j, records) in group.iter().enumerate() {
            let mut batch = TrainBatch::new(
                &self.records,
                records,
                &self.config.encoder.interaction,
                self.config.seed,
                step as u64 * acc_n + j as u64,
            )?;
            if let Some(mined) = &self.mined {
                batch = batch.with_mined(mined, records);
            }
            if !self.needs_instructions {
                for l in &mut batch.instruction_rows {
                    l.clear();
                }
            }
            rows += batch.rows.len();
            if defer {
                let out = full_batch_pass(
                    &self.encoder,
                    &batch,
                    &self.loss,
                    self.config.batch.mask_duplicates,
                    weight,
                )?;
                deferred.push(if self.poisoned(step, Poisoned::Loss) {
                    out.loss.mul_scalar(f32::NAN)
                } else {
                    out.loss
                });
                acc.accumulate(self.encoder.model(), out.grads);
                continue;
            }
            // One device without GradCache: one pass with a graph. Otherwise GradCache, over
            // the devices' replicas or the one encoder (`grad_cache_step` is that call).
            let out = match (&replicas, self.config.batch.grad_cache_chunk) {
                (None, None) => full_batch_step(
                    &self.encoder,
                    &batch,
                    &self.loss,
                    self.config.batch.mask_duplicates,
                    weight,
                )?,
                (replicas, chunk) => multi_device_step(
                    replicas
                        .as_deref()
                        .unwrap_or(std::slice::from_ref(&self.encoder)),
                    &batch,
                    &self.loss,
                    self.config.batch.mask_duplicates,
                    weight,
                    chunk,
                )?,
            };
            let loss = if self.poisoned(step, Poisoned::Loss) {
                f32::NAN
            } else {
                out.loss
            };
            if !loss.is_finite() {
                return Err(Error::NonFinite {
                    step: step + 1,
                    value: loss,
                });
            }
            loss_sum += loss;
            acc.accumulate(self.encoder.model(), out.grads);
        }
        let mut grads = acc.grads();
        if self.poisoned(step, Poisoned::Gradients) {
            crate::optim::scale_grads(self.encoder.model(), &mut grads, f64::NAN);
        }
        let start = std::time::Instant::now();
        // Clipping (torch's clip_grad_norm_): the optimizer multiplies each gradient by the
        // factor as it updates that tensor (the values of scaling them all first; on a GPU,
        // no launch of its own, and the factor computed there from the norm, not read back).
        let max_norm = self.config.optimizer.max_grad_norm;
        let on_device = max_norm.and_then(|max| self.clip_on_device(&grads, max, &deferred));
        if on_device.is_none() {
            loss_sum += read_losses(std::mem::take(&mut deferred), step)?;
            if let Some(max) = max_norm {
                let (norm, factor) = clip_factor(self.encoder.model(), &grads, max);
                if !norm.is_finite() {
                    return Err(Error::NonFiniteGradients {
                        step: step + 1,
                        norm,
                    });
                }
                self.step_handle.set_grad_scale(factor);
            }
        }
        let clipped = start.elapsed();
        let lr = learning_rate(&self.config.optimizer, step, total);
        // Only the weights change: the encoder's shared context (tokenizer, settings) stays.
        let model = self.encoder.model().clone();
        let model = self.optim.step(lr, model, grads);
        self.step_handle.finish_step();
        self.encoder.set_model(model);
        let issued = start.elapsed();
        if let Some(total) = on_device {
            // the losses, then the squares' total (guarded by them: finite when they are);
            // where it is not finite the kernel did not take the step
            loss_sum += read_losses(deferred, step)?;
            let squares = f64::from(total.into_scalar::<f32>());
            if !squares.is_finite() {
                return Err(Error::NonFiniteGradients {
                    step: step + 1,
                    norm: squares.sqrt(),
                });
            }
            log::debug!(
                "optimizer step: gradients clipped in {:.1} ms, the update issued in {:.1} \
                 ms, the losses and the norm read back after {:.1} ms more",
                clipped.as_secs_f64() * 1e3,
                (issued - clipped).as_secs_f64() * 1e3,
                (start.elapsed() - issued).as_secs_f64() * 1e3
            );
        } else {
            log::debug!(
                "optimizer step: gradients clipped in {:.1} ms (their norm read back), the \
                 update issued in {:.1} ms",
                clipped.as_secs_f64() * 1e3,
                (issued - clipped).as_secs_f64() * 1e3,
            );
        }
        Ok((loss_sum / group.len() as f32, rows))
    }

    /// Hands the optimizer clipping to `max` with the norm left on the device, guarded by the
    /// step's `losses` ([`crate::fused::DeviceClip::guard`]), when the encoder trains on a
    /// cubecl device whose f32 atomics add (a tensor the update's kernel declines is clipped
    /// by burn's ops, to the same effect); returns
    /// the squares' total to read once the update is issued (`None` elsewhere: nothing done,
    /// and the CPU reads the norm back as before).
    #[cfg_attr(
        not(all(any(feature = "wgpu", feature = "cuda"), not(feature = "fusion"))),
        allow(unused_variables, clippy::unused_self)
    )]
    fn clip_on_device(
        &self,
        grads: &burn::optim::GradientsParams,
        max: f32,
        losses: &[burn::tensor::Tensor<1>],
    ) -> Option<burn::tensor::Tensor<1>> {
        #[cfg(all(any(feature = "wgpu", feature = "cuda"), not(feature = "fusion")))]
        if !self.on_cpu
            && let Some(clip) = crate::optim::device_clip(
                self.encoder.model(),
                grads,
                max,
                &self.encoder.device().clone().inner(),
            )
        {
            let clip = clip.guard(losses);
            let total = clip.total().clone();
            self.step_handle.set_clip(clip);
            #[cfg(feature = "test-hooks")]
            self.device_clips
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            return Some(total);
        }
        None
    }
}

/// What a test hook makes NaN ([`Trainer::poison_gradients_at`], `poison_loss_at`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Poisoned {
    Gradients,
    Loss,
}

/// The sum of a step's `losses` (`[1]` each, on the device), read back; the first that is NaN
/// or infinite is an error naming the step (0-based `step`).
fn read_losses(losses: Vec<burn::tensor::Tensor<1>>, step: usize) -> Result<f32> {
    let mut sum = 0.0;
    for loss in losses {
        let value = loss.into_scalar::<f32>();
        if !value.is_finite() {
            return Err(Error::NonFinite {
                step: step + 1,
                value,
            });
        }
        sum += value;
    }
    Ok(sum)
}

/// Texts per training pass: `batch.texts_per_pass` if set; else on the CPU the encoder's
/// `encode_batch_size` (`None`: the passes stay as they were, and with them the CPU's
/// dropout draws and results), on a GPU device at least [`GPU_TEXTS_PER_PASS`].
fn training_pass_texts(config: &TrainConfig, cpu: bool) -> Option<usize> {
    config
        .batch
        .texts_per_pass
        .or_else(|| (!cpu).then(|| GPU_TEXTS_PER_PASS.max(config.encoder.encode_batch_size)))
}

/// One line saying which model trains into which output directory, with the seed, the epochs
/// and the batch size (for command-line tools).
pub fn describe(config: &TrainConfig) -> String {
    format!(
        "model {} -> {} (seed {}, {} epoch(s), {} records per batch)",
        config.model.display(),
        config.output_dir.display(),
        config.seed,
        config.epochs,
        config.batch.records
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The CPU keeps its passes unless told; a GPU device puts at least
    /// `GPU_TEXTS_PER_PASS` texts in one; `batch.texts_per_pass` decides on both.
    #[test]
    fn texts_per_training_pass_by_device() {
        let mut cfg = TrainConfig::new(".", "Cargo.toml", "out");
        assert_eq!(training_pass_texts(&cfg, true), None);
        assert_eq!(training_pass_texts(&cfg, false), Some(GPU_TEXTS_PER_PASS));
        cfg.encoder.encode_batch_size = 500;
        assert_eq!(training_pass_texts(&cfg, false), Some(500));
        cfg.batch.texts_per_pass = Some(7);
        assert_eq!(training_pass_texts(&cfg, true), Some(7));
        assert_eq!(training_pass_texts(&cfg, false), Some(7));
    }
}
