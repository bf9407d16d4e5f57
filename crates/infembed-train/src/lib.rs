//! # infembed-train
//!
//! Fine-tunes an instruction-aware dual encoder ([`infembed_encoder::DualEncoder`]) on
//! InF-IR records with the InF-Embed objectives ([`infembed_losses`]), on burn 0.22 (CPU
//! `flex` by default; `cuda` and `tch` as cargo features).
//!
//! From a JSONL record to a gradient step:
//!
//! 1. [`TrainConfig`] (one TOML or JSON file, validated before any work) names the backbone,
//!    the data, the encoder settings, the objective, AdamW, the batch and the schedules.
//! 2. Each epoch shuffles the records with a seeded generator; `batch.records` records make
//!    a contrastive batch of `3R` rows (I+Q+ -> P+, I-Q+ -> P1-, I+Q- -> P2-) ([`TrainBatch`]),
//!    and each row gets K instruction negatives drawn with a generator seeded by the step
//!    (this crate owns that rule: [`instruction_negatives_per_row`]).
//! 3. The encoder embeds passages, own pairs and the instruction-negative pairs (distinct
//!    texts once), the loss sees the embeddings with duplicates masked; in one pass with a
//!    graph ([`full_batch_step`]), or with GradCache in chunks of any size
//!    ([`grad_cache_step`]).
//! 4. Gradients of `batch.accumulation` batches are averaged, clipped to a global norm
//!    ([`clip_global_norm`]) and applied by burn-optim's AdamW ([`adamw`]) at the
//!    linear/constant schedule's rate ([`learning_rate`]); only the encoder's weights are
//!    swapped, its tokenizer and settings are shared.
//! 5. The development set is evaluated through a [`DevEvaluator`] (the facade crate's
//!    FollowIR harness), checkpoints (`<output_dir>/checkpoints/step-N/`) are written
//!    atomically and resume bit-identically ([`Trainer::resume`]); each step is logged to
//!    `history.jsonl` ([`STEP_LOG`]) and each evaluation redraws the chart (`training.svg` and
//!    `training.png`, [`training_chart`]) and rewrites `history.json`; the end of the run saves
//!    a sentence-transformers directory (`final/`) with `infembed_model.json` (its name,
//!    revision and base model).
//!
//! [`Trainer`] is the driver; the step functions and the optimizer helpers are public for
//! loops of one's own. Diagnostics go to the [`log`](https://docs.rs/log) facade; progress
//! goes to the display chosen with [`ProgressMode`] (plain lines on stderr, or burn-train's
//! terminal dashboard with the `tui` feature).
//!
//! Cargo features: `tui` (the dashboard), `cuda` / `tch` (backends), `test-hooks` (hooks
//! for this crate's own tests, such as stopping a run early; not part of the API).

mod batch;
mod checkpoint;
mod config;
mod error;
#[cfg(all(any(feature = "wgpu", feature = "cuda"), not(feature = "fusion")))]
mod fused;
mod negatives;
mod optim;
mod plot;
mod progress;
mod step;
mod trainer;

pub use batch::{MinedSet, TrainBatch};
pub use checkpoint::{HistoryEntry, StepRecord, TrainState};
pub use config::{
    BatchConfig, CheckpointConfig, DataConfig, EvalSchedule, GPU_TEXTS_PER_PASS, OptimizerConfig,
    Schedule, TrainConfig,
};
pub use error::{DashboardProblem, Error, Result};
pub use negatives::instruction_negatives_per_row;
pub use optim::{adamw, clip_global_norm, global_norm, learning_rate, warmup_steps};
pub use plot::{Chart, EvalSeries, GridChartRow, evaluation_chart, grid_chart, training_chart};
pub use progress::ProgressMode;
pub use step::{StepGrads, full_batch_step, grad_cache_step, multi_device_step};
pub use trainer::{
    CHART_STEM, DevEvaluator, STEP_LOG, TrainSummary, Trainer, describe, steps_per_epoch,
};
