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
//!    a contrastive batch of `3R` rows (I+Q+ -> P+, I-Q+ -> P1-, I+Q- -> P2-), and each row
//!    gets K instruction negatives drawn with a generator seeded by the step ([`batch`]).
//! 3. The encoder embeds passages, own pairs and the instruction-negative pairs (distinct
//!    texts once), the loss sees the embeddings with duplicates masked ([`step`]); in one pass
//!    with a graph, or with GradCache in chunks of any size.
//! 4. Gradients of `batch.accumulation` batches are averaged, clipped to a global norm and
//!    applied by burn-optim's AdamW at the linear/constant schedule's rate ([`optim`]).
//! 5. The development set is evaluated through a [`DevEvaluator`] (the facade crate's
//!    FollowIR harness), checkpoints are written atomically and resume bit-identically
//!    ([`checkpoint`]), and the end of the run saves a sentence-transformers directory, the
//!    history and an SVG chart ([`plot`]).
//!
//! `learner` (cargo feature `learner`, on by default) plugs the same step into burn-train's
//! `Learner` (`TrainStep`/`InferenceStep`); without it burn-train is not compiled.

pub mod batch;
pub mod checkpoint;
pub mod config;
pub mod error;
#[cfg(feature = "learner")]
pub mod learner;
pub mod optim;
pub mod plot;
pub mod progress;
pub mod step;
pub mod trainer;

pub use batch::TrainBatch;
pub use checkpoint::{HistoryEntry, TrainState};
pub use config::{
    BatchConfig, CheckpointConfig, DataConfig, EvalSchedule, OptimizerConfig, Schedule, TrainConfig,
};
pub use error::{DashboardProblem, Error, Result};
#[cfg(feature = "learner")]
pub use learner::{InfEmbedLearnerModel, StepContext};
pub use progress::ProgressMode;
pub use trainer::{DevEvaluator, TrainSummary, Trainer, steps_per_epoch};
