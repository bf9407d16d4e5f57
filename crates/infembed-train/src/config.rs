//! [`TrainConfig`]: one file (TOML or JSON) that describes a whole training run.
//!
//! Every key, its default and the paper's setting are listed in `docs/training.md`;
//! `examples/configs/` holds ready configs. [`TrainConfig::from_file`] parses and validates,
//! so a bad config fails before any model is loaded.

use std::path::{Path, PathBuf};

use infembed_encoder::{DeviceSpec, EncoderConfig, Interaction, MatmulRoutine, Precision};
use infembed_losses::{LossConfig, ObjectiveKind, Variable};
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// A complete training run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct TrainConfig {
    /// The backbone: a local Hugging Face / sentence-transformers model directory.
    pub model: PathBuf,
    /// Where checkpoints (`checkpoints/`), the final model (`final/`), the history
    /// (`history.json`, `history.jsonl`) and its chart (`training.svg`, `training.png`) go.
    pub output_dir: PathBuf,
    /// The trained model's name in its `infembed_model.json` (what evaluations and result
    /// files call it); by default the base model's name + `-infembed`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Seed of every random choice (data order, instruction negatives).
    #[serde(default = "default_seed")]
    pub seed: u64,
    /// Passes over the training records.
    #[serde(default = "default_epochs")]
    pub epochs: usize,
    /// Stop after this many optimizer steps (for smoke runs); `None` = all epochs.
    #[serde(default)]
    pub max_steps: Option<usize>,
    /// Training and development data.
    pub data: DataConfig,
    /// Pooling, interaction, towers, maximum lengths and prefixes of the dual encoder.
    #[serde(default)]
    pub encoder: EncoderConfig,
    /// The objective (default: the paper's recommendation, multivariate over P and I).
    #[serde(default = "default_loss")]
    pub loss: LossConfig,
    /// AdamW, learning-rate schedule and gradient clipping.
    #[serde(default)]
    pub optimizer: OptimizerConfig,
    /// Batch size, accumulation, GradCache and duplicate masking.
    #[serde(default)]
    pub batch: BatchConfig,
    /// When to evaluate on the development set.
    #[serde(default)]
    pub eval: EvalSchedule,
    /// When to write checkpoints.
    #[serde(default)]
    pub checkpoint: CheckpointConfig,
    /// The device to train on (`cpu`, the default; `wgpu[:N]`, `vulkan[:N]`, `cuda[:N]`;
    /// docs/devices.md). Exclusive with `devices`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device: Option<DeviceSpec>,
    /// Several devices sharing each contrastive batch (`["cpu", "cpu"]`, `["wgpu:0",
    /// "wgpu:1"]`): the first holds the optimizer; every device embeds its share of the
    /// batch's texts and the loss sees the whole batch (docs/devices.md). Needs Interaction
    /// I. Exclusive with `device`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub devices: Option<Vec<DeviceSpec>>,
    /// Float type of the training computation: `f32` (the default), or on the CPU `bf16`:
    /// mixed precision on a processor with AVX512-BF16, where the linear layers' products
    /// (forward and backward) take bf16 operands and sum in `f32` while the parameters, the
    /// optimizer and every other op stay `f32` (docs/training.md). A GPU trains in `f32` (burn
    /// 0.22 has no mixed precision with `f32` master weights; `--dtype` serves inference).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dtype: Option<Precision>,
    /// The matrix-product routine of the linear layers on a GPU device (forward and both
    /// backward products): `blocked_split` (the default, this project's kernel with the depth
    /// of products with few blocks split), `blocked` (the same unsplit), `burn` (burn's own
    /// `matmul`) or one of cubek's by the name `infembed devices --probe-matmul` reports
    /// (docs/devices.md). A name other than `burn` is refused on the CPU.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub matmul: Option<MatmulRoutine>,
}

/// Where the records come from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct DataConfig {
    /// InF-IR-format training records (JSONL or Parquet).
    pub train: PathBuf,
    /// InF-IR-format development records, evaluated with the held-out FollowIR protocol.
    #[serde(default)]
    pub dev: Option<PathBuf>,
    /// Distractor passages added to the development corpus (JSONL, one object per line with
    /// a unique `passage_id` and a non-empty `passage`).
    #[serde(default)]
    pub distractors: Option<PathBuf>,
    /// Hard negatives mined for the training records (`infembed mine`; the format is
    /// `infembed_data::mined`'s); `batch.mined_per_record` says how many of each record's join
    /// its batch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mined_negatives: Option<PathBuf>,
    /// Skip malformed records (reported) instead of failing on the first one.
    #[serde(default)]
    pub lenient: bool,
}

/// AdamW with a linear (or constant) schedule, as Hugging Face's trainer applies it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct OptimizerConfig {
    /// Peak learning rate (paper: 5e-5).
    #[serde(default = "default_lr")]
    pub lr: f64,
    /// Decoupled weight decay (torch's AdamW default 0.01).
    #[serde(default = "default_weight_decay")]
    pub weight_decay: f32,
    /// Adam's beta1.
    #[serde(default = "default_beta1")]
    pub beta1: f32,
    /// Adam's beta2.
    #[serde(default = "default_beta2")]
    pub beta2: f32,
    /// Adam's epsilon (torch's default 1e-8).
    #[serde(default = "default_epsilon")]
    pub epsilon: f32,
    /// Linear warm-up steps; overrides `warmup_ratio` when set.
    #[serde(default)]
    pub warmup_steps: Option<usize>,
    /// Linear warm-up as a fraction of all optimizer steps (rounded up).
    #[serde(default)]
    pub warmup_ratio: f64,
    /// Learning rate after warm-up: linear decay to zero, or constant.
    #[serde(default)]
    pub schedule: Schedule,
    /// Clip the global L2 norm of all gradients to this value (as torch's
    /// `clip_grad_norm_`; Hugging Face's default 1.0); `None` disables clipping.
    #[serde(default = "default_clip")]
    pub max_grad_norm: Option<f32>,
}

/// Learning rate after warm-up.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Schedule {
    /// Linear decay from the peak to zero at the last step.
    #[default]
    Linear,
    /// The peak until the end.
    Constant,
}

/// How rows are grouped into optimizer steps.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct BatchConfig {
    /// InF-IR records per contrastive batch (each gives 3 rows; paper recipe: 4 -> 12 rows).
    #[serde(default = "default_records")]
    pub records: usize,
    /// Contrastive batches whose gradients are summed (averaged) into one optimizer step.
    /// In-batch negatives stay within each batch; use `grad_cache_chunk` to enlarge the
    /// contrastive batch itself.
    #[serde(default = "default_accumulation")]
    pub accumulation: usize,
    /// GradCache: embed at most this many texts per forward pass (first without a graph,
    /// then again with one), so the contrastive batch is limited by the loss, not by
    /// activation memory. `None` = one forward pass with a graph over the whole batch.
    /// Needs Interaction I.
    #[serde(default)]
    pub grad_cache_chunk: Option<usize>,
    /// Exclude negatives whose text equals the positive's (the same passage, instruction
    /// or instruction-query pair twice in a batch) instead of counting them as false negatives.
    #[serde(default = "default_true")]
    pub mask_duplicates: bool,
    /// Drop the last incomplete batch of an epoch (otherwise it is trained as a smaller batch).
    #[serde(default)]
    pub drop_last: bool,
    /// Mined hard negatives per record (the first of each record's list in
    /// `data.mined_negatives`): they join the batch's passages as P-negatives of every row
    /// (except the rows they are labelled relevant to). 0 = none.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub mined_per_record: usize,
    /// Texts per forward pass of the encoder in training (a batch's passages and its
    /// instruction-query texts are embedded in passes of at most this many). Absent: the
    /// encoder's `encode_batch_size` (32) on the CPU, and on a GPU device at least
    /// [`GPU_TEXTS_PER_PASS`], since each pass costs the host about 640 kernel launches
    /// there for all-MiniLM-L6-v2 (the quickstart's recipe: two passes a step instead of
    /// three). The gradients do not depend on it beyond rounding; the dropout masks do.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub texts_per_pass: Option<usize>,
}

/// The fewest texts a training pass holds on a GPU device unless `batch.texts_per_pass` says
/// otherwise.
pub const GPU_TEXTS_PER_PASS: usize = 128;

fn is_zero(n: &usize) -> bool {
    *n == 0
}

/// When the development set is evaluated.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct EvalSchedule {
    /// Evaluate before the first step (the zero-shot baseline).
    #[serde(default = "default_true")]
    pub at_start: bool,
    /// Evaluate every N optimizer steps; `None` = only at the end of each epoch.
    #[serde(default)]
    pub every_steps: Option<usize>,
}

/// When checkpoints are written.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct CheckpointConfig {
    /// Every N optimizer steps (and always at the end); `None` = only at the end.
    #[serde(default)]
    pub every_steps: Option<usize>,
    /// How many step checkpoints to keep (the newest).
    #[serde(default = "default_keep")]
    pub keep: usize,
}

fn default_seed() -> u64 {
    42
}
fn default_epochs() -> usize {
    1
}
fn default_loss() -> LossConfig {
    LossConfig::new(ObjectiveKind::Multivariate, &[Variable::P, Variable::I])
}
fn default_lr() -> f64 {
    5e-5
}
fn default_weight_decay() -> f32 {
    0.01
}
fn default_beta1() -> f32 {
    0.9
}
fn default_beta2() -> f32 {
    0.999
}
fn default_epsilon() -> f32 {
    1e-8
}
fn default_clip() -> Option<f32> {
    Some(1.0)
}
fn default_records() -> usize {
    4
}
fn default_accumulation() -> usize {
    1
}
fn default_true() -> bool {
    true
}
fn default_keep() -> usize {
    2
}

impl Default for OptimizerConfig {
    fn default() -> Self {
        Self {
            lr: default_lr(),
            weight_decay: default_weight_decay(),
            beta1: default_beta1(),
            beta2: default_beta2(),
            epsilon: default_epsilon(),
            warmup_steps: None,
            warmup_ratio: 0.0,
            schedule: Schedule::Linear,
            max_grad_norm: default_clip(),
        }
    }
}

impl Default for BatchConfig {
    fn default() -> Self {
        Self {
            records: default_records(),
            accumulation: default_accumulation(),
            grad_cache_chunk: None,
            mask_duplicates: true,
            drop_last: false,
            mined_per_record: 0,
            texts_per_pass: None,
        }
    }
}

impl Default for EvalSchedule {
    fn default() -> Self {
        Self {
            at_start: true,
            every_steps: None,
        }
    }
}

impl Default for CheckpointConfig {
    fn default() -> Self {
        Self {
            every_steps: None,
            keep: default_keep(),
        }
    }
}

impl TrainConfig {
    /// A config with defaults for everything but the paths.
    pub fn new(
        model: impl Into<PathBuf>,
        train: impl Into<PathBuf>,
        output_dir: impl Into<PathBuf>,
    ) -> Self {
        Self {
            model: model.into(),
            output_dir: output_dir.into(),
            name: None,
            seed: default_seed(),
            epochs: default_epochs(),
            max_steps: None,
            data: DataConfig {
                train: train.into(),
                dev: None,
                distractors: None,
                mined_negatives: None,
                lenient: false,
            },
            encoder: EncoderConfig::default(),
            loss: default_loss(),
            optimizer: OptimizerConfig::default(),
            batch: BatchConfig::default(),
            eval: EvalSchedule::default(),
            checkpoint: CheckpointConfig::default(),
            device: None,
            devices: None,
            dtype: None,
            matmul: None,
        }
    }

    /// Reads a `.toml` or `.json` file (by extension), resolves relative paths against the
    /// current directory (as the command line does), and validates it.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
        let ext = path
            .extension()
            .and_then(|e| e.to_str())
            .unwrap_or("")
            .to_ascii_lowercase();
        let cfg: Self = match ext.as_str() {
            "toml" => toml::from_str(&text).map_err(|e| Error::ConfigParse {
                path: path.to_path_buf(),
                message: toml_message(&text, &e),
            })?,
            "json" => serde_json::from_str(&text).map_err(|e| Error::ConfigParse {
                path: path.to_path_buf(),
                message: e.to_string(),
            })?,
            _ => {
                return Err(Error::ConfigParse {
                    path: path.to_path_buf(),
                    message: "the file name must end in .toml or .json".into(),
                });
            }
        };
        cfg.validate_at(path)?;
        Ok(cfg)
    }

    /// A config from its JSON form (as it serializes, possibly edited: the ablation grid sets
    /// keys this way), validated. `origin` names where it came from in errors (a file, or a
    /// file and a grid row).
    ///
    /// # Errors
    /// [`Error::ConfigParse`] for an unknown key or a value of the wrong type (naming it),
    /// [`Error::Config`] / [`Error::Missing`] as [`validate`](Self::validate).
    pub fn from_value(value: serde_json::Value, origin: &Path) -> Result<Self> {
        let cfg: Self = serde_json::from_value(value).map_err(|e| Error::ConfigParse {
            path: origin.to_path_buf(),
            message: e.to_string(),
        })?;
        cfg.validate_at(origin)?;
        Ok(cfg)
    }

    /// The devices to train on: `devices`, else `[device]`, else `[cpu]`.
    pub fn device_specs(&self) -> Vec<DeviceSpec> {
        match (&self.devices, self.device) {
            (Some(list), _) => list.clone(),
            (None, Some(one)) => vec![one],
            (None, None) => vec![DeviceSpec::Cpu],
        }
    }

    /// Replaces the devices (a command-line override): one spec sets `device`, several set
    /// `devices`.
    pub fn set_devices(&mut self, specs: Vec<DeviceSpec>) {
        if specs.len() == 1 {
            self.device = specs.first().copied();
            self.devices = None;
        } else {
            self.device = None;
            self.devices = Some(specs);
        }
    }

    /// Checks every value and that the input paths exist.
    pub fn validate(&self) -> Result<()> {
        self.validate_at(Path::new("<TrainConfig>"))
    }

    fn validate_at(&self, path: &Path) -> Result<()> {
        let bad = |field: &str, problem: &str| Err(Error::config(path, field, problem));
        if self.epochs == 0 {
            return bad("epochs", "must be at least 1");
        }
        if self.max_steps == Some(0) {
            return bad("max_steps", "must be at least 1 (or absent)");
        }
        let o = &self.optimizer;
        if !(o.lr.is_finite() && o.lr > 0.0) {
            return bad("optimizer.lr", "must be a positive number");
        }
        if !(o.weight_decay.is_finite() && o.weight_decay >= 0.0) {
            return bad("optimizer.weight_decay", "must be >= 0");
        }
        for (field, beta) in [("optimizer.beta1", o.beta1), ("optimizer.beta2", o.beta2)] {
            if !(0.0..1.0).contains(&beta) {
                return bad(field, "must be in [0, 1)");
            }
        }
        if !(o.epsilon.is_finite() && o.epsilon > 0.0) {
            return bad("optimizer.epsilon", "must be positive");
        }
        if !(0.0..1.0).contains(&o.warmup_ratio) {
            return bad("optimizer.warmup_ratio", "must be in [0, 1)");
        }
        if let Some(c) = o.max_grad_norm
            && !(c.is_finite() && c > 0.0)
        {
            return bad(
                "optimizer.max_grad_norm",
                "must be positive (remove the key to disable clipping)",
            );
        }
        let b = &self.batch;
        if b.records == 0 {
            return bad("batch.records", "must be at least 1");
        }
        if b.accumulation == 0 {
            return bad("batch.accumulation", "must be at least 1");
        }
        if b.texts_per_pass == Some(0) {
            return bad("batch.texts_per_pass", "must be at least 1 (or absent)");
        }
        if b.grad_cache_chunk == Some(0) {
            return bad("batch.grad_cache_chunk", "must be at least 1 (or absent)");
        }
        if b.grad_cache_chunk.is_some()
            && !matches!(self.encoder.interaction, Interaction::SelfAttention { .. })
        {
            return bad(
                "batch.grad_cache_chunk",
                "needs encoder.interaction.type = \"self_attention\" (Interaction II \
                 combines token states after the backbone, so it trains without GradCache)",
            );
        }
        if !self.encoder.quantize.is_none() {
            return bad(
                "encoder.quantize",
                "is an inference setting (int8 or bf16 products on the CPU); training computes \
                 in f32: evaluate the trained model with `infembed eval --quantize int8`",
            );
        }
        if self.device.is_some() && self.devices.is_some() {
            return bad("devices", "give either `device` or `devices`, not both");
        }
        if self.devices.as_ref().is_some_and(Vec::is_empty) {
            return bad("devices", "names no device");
        }
        if self.device_specs().len() > 1
            && !matches!(self.encoder.interaction, Interaction::SelfAttention { .. })
        {
            return bad(
                "devices",
                "several devices need encoder.interaction.type = \"self_attention\" (the \
                 devices share the batch's texts as GradCache does)",
            );
        }
        if let Some(p) = self.dtype
            && p != Precision::F32
        {
            if p == Precision::F16 {
                return bad(
                    "dtype",
                    "training computes in f32, or in bf16 products on a CPU with AVX512-BF16; \
                     f16 is for inference on a GPU: `infembed embed/eval/search --dtype f16`",
                );
            }
            if let Some(gpu) = self.device_specs().iter().find(|d| !d.is_cpu()) {
                return bad(
                    "dtype",
                    &format!(
                        "bf16 training is the CPU's mixed precision (AVX512-BF16); `{gpu}` trains \
                         in f32 (burn 0.22 offers no mixed precision with f32 master weights); \
                         bf16 on a GPU is for inference: `infembed embed/eval/search --dtype bf16`"
                    ),
                );
            }
        }
        if self.eval.every_steps == Some(0) {
            return bad("eval.every_steps", "must be at least 1 (or absent)");
        }
        if self.checkpoint.every_steps == Some(0) {
            return bad("checkpoint.every_steps", "must be at least 1 (or absent)");
        }
        if self.checkpoint.keep == 0 {
            return bad("checkpoint.keep", "must be at least 1");
        }
        // The instruction-negative rule (crate::negatives): a K that no full batch holds is
        // an error here; a shorter last batch clamps.
        if let Interaction::SelfAttention {
            instruction_negatives: Some(k),
            ..
        } = self.encoder.interaction
            && k + 1 > 3 * b.records
        {
            return bad(
                "encoder.interaction.instruction_negatives",
                &format!(
                    "is {k}, but a batch of {} records has only {} other rows",
                    b.records,
                    3 * b.records - 1
                ),
            );
        }
        if 3 * b.records < 2 {
            return bad("batch.records", "a batch needs at least 2 rows");
        }
        let loss = self.loss.init()?;
        if b.mined_per_record == 0 && self.data.mined_negatives.is_some() {
            return bad(
                "data.mined_negatives",
                "is read only with `batch.mined_per_record` of 1 or more; set it, or remove the \
                 path",
            );
        }
        if b.mined_per_record > 0 {
            if self.data.mined_negatives.is_none() {
                return bad(
                    "batch.mined_per_record",
                    "needs `data.mined_negatives` (a file written by `infembed mine`)",
                );
            }
            if !loss.objective().variables().contains(Variable::P) {
                return bad(
                    "batch.mined_per_record",
                    "mined passages are P-negatives: the objective (`loss.terms`) must have P",
                );
            }
        }
        if !self.model.is_dir() {
            return Err(Error::Missing {
                path: self.model.clone(),
                what: "model directory (`model`)",
                fix: "run `cargo xtask fetch-model` or point `model` at a local Hugging Face directory",
            });
        }
        for (p, what) in [
            (Some(&self.data.train), "training data (`data.train`)"),
            (self.data.dev.as_ref(), "development data (`data.dev`)"),
            (
                self.data.distractors.as_ref(),
                "distractor passages (`data.distractors`)",
            ),
            (
                self.data.mined_negatives.as_ref(),
                "mined hard negatives (`data.mined_negatives`)",
            ),
        ] {
            if let Some(p) = p
                && !p.is_file()
            {
                return Err(Error::Missing {
                    path: p.clone(),
                    what,
                    fix: "check the path (relative paths are read from the current directory)",
                });
            }
        }
        Ok(())
    }
}

/// The toml error on one line, with its line and column.
fn toml_message(text: &str, e: &toml::de::Error) -> String {
    let message = e.message().trim().replace('\n', " ");
    match e.span() {
        Some(span) => {
            let before = &text[..span.start.min(text.len())];
            let line = before.matches('\n').count() + 1;
            let column = before.len() - before.rfind('\n').map_or(0, |i| i + 1) + 1;
            format!("line {line}, column {column}: {message}")
        }
        None => message,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn minimal_toml_gets_the_paper_defaults() {
        let cfg: TrainConfig =
            toml::from_str("model = \"m\"\noutput_dir = \"o\"\n[data]\ntrain = \"t.jsonl\"\n")
                .unwrap();
        assert_eq!(cfg.optimizer.lr, 5e-5);
        assert_eq!(cfg.batch.records, 4);
        assert_eq!(cfg.loss.kind, ObjectiveKind::Multivariate);
        assert_eq!(cfg.loss.terms, vec![Variable::P, Variable::I]);
        assert_eq!(cfg.seed, 42);
        // an unset pass size is left out of the written config (checkpoints' configs compare
        // equal to those written before the key existed)
        assert_eq!(cfg.batch.texts_per_pass, None);
        let json = serde_json::to_value(&cfg).unwrap();
        assert!(json["batch"].get("texts_per_pass").is_none(), "{json}");
        let cfg: TrainConfig = toml::from_str(
            "model = \"m\"\noutput_dir = \"o\"\n[data]\ntrain = \"t.jsonl\"\n\
             [batch]\ntexts_per_pass = 64\n",
        )
        .unwrap();
        assert_eq!(cfg.batch.texts_per_pass, Some(64));
    }

    /// The Interaction I template of a training config, in both spellings, as TOML.
    #[test]
    fn templates_are_read_from_toml() {
        for (text, rendered) in [("{query} {instruction}", "q i"), ("{I}: {Q}", "i: q")] {
            let toml_text = format!(
                "model = \"m\"\noutput_dir = \"o\"\n[data]\ntrain = \"t.jsonl\"\n\
                 [encoder.interaction]\ntype = \"self_attention\"\ntemplate = {text:?}\n"
            );
            let cfg: TrainConfig = toml::from_str(&toml_text).unwrap();
            let Interaction::SelfAttention { template, .. } = &cfg.encoder.interaction else {
                panic!("not Interaction I");
            };
            assert_eq!(template.as_str(), text);
            assert_eq!(template.render("q", Some("i")), rendered);
            // Written back (as the checkpoint's config is) unchanged.
            let json = serde_json::to_value(&cfg).unwrap();
            assert_eq!(json["encoder"]["interaction"]["template"], text);
        }
        let err = toml::from_str::<TrainConfig>(
            "model = \"m\"\noutput_dir = \"o\"\n[data]\ntrain = \"t\"\n\
             [encoder.interaction]\ntype = \"self_attention\"\ntemplate = \"{q} {I}\"\n",
        )
        .unwrap_err();
        assert!(err.to_string().contains("{q} {I}"), "{err}");
    }

    #[test]
    fn unknown_keys_are_errors() {
        let err = toml::from_str::<TrainConfig>(
            "model = \"m\"\noutput_dir = \"o\"\nlearning_rate = 1\n[data]\ntrain = \"t\"\n",
        )
        .unwrap_err();
        assert!(err.to_string().contains("learning_rate"), "{err}");
    }

    #[test]
    fn bad_values_name_their_key() {
        let mut cfg = TrainConfig::new(".", "Cargo.toml", "out");
        cfg.optimizer.lr = -1.0;
        let err = cfg.validate().unwrap_err().to_string();
        assert!(err.contains("optimizer.lr"), "{err}");
        // int8 is an inference mode: a training config that asks for it is refused
        let mut cfg = TrainConfig::new(".", "Cargo.toml", "out");
        cfg.encoder.quantize = infembed_encoder::Quantization::Int8;
        let err = cfg.validate().unwrap_err().to_string();
        assert!(err.contains("encoder.quantize"), "{err}");
        let mut cfg = TrainConfig::new(".", "Cargo.toml", "out");
        cfg.batch.texts_per_pass = Some(0);
        let err = cfg.validate().unwrap_err().to_string();
        assert!(err.contains("batch.texts_per_pass"), "{err}");
        let mut cfg = TrainConfig::new(".", "Cargo.toml", "out");
        cfg.batch.records = 0;
        assert!(
            cfg.validate()
                .unwrap_err()
                .to_string()
                .contains("batch.records")
        );
        // An instruction-negative count that no full batch holds (3 records = 9 rows, 8
        // other rows) is refused naming its key; the largest possible one passes this check.
        let mut cfg = TrainConfig::new(".", "Cargo.toml", "out");
        cfg.batch.records = 3;
        cfg.encoder.interaction = Interaction::SelfAttention {
            template: infembed_encoder::QueryTemplate::default(),
            instruction_negatives: Some(9),
        };
        let err = cfg.validate().unwrap_err();
        assert!(
            matches!(&err, Error::Config { field, .. } if field == "encoder.interaction.instruction_negatives"),
            "{err}"
        );
        cfg.encoder.interaction = Interaction::SelfAttention {
            template: infembed_encoder::QueryTemplate::default(),
            instruction_negatives: Some(8),
        };
        if let Err(err) = cfg.validate() {
            assert!(!err.to_string().contains("instruction_negatives"), "{err}");
        }
        let mut cfg = TrainConfig::new("/nonexistent/model", "Cargo.toml", "out");
        cfg.epochs = 1;
        let err = cfg.validate().unwrap_err().to_string();
        assert!(
            err.contains("/nonexistent/model") && err.contains("fetch-model"),
            "{err}"
        );
    }
}
