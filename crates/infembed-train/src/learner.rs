//! burn-train integration: [`InfEmbedLearnerModel`] implements burn-train's
//! [`TrainStep`] and [`InferenceStep`], so the InF-Embed step runs under burn-train's
//! [`Learner`](burn::train::Learner) and its `SupervisedTraining` strategies (one device,
//! several local devices, DDP).
//!
//! Under those strategies each device computes the loss over the rows it received: in-batch
//! negatives are **per device** (embeddings are not gathered across devices). The
//! single-process [`Trainer`](crate::Trainer) calls the same step function and owns the
//! optimizer itself, because its checkpoints must hold the optimizer state together with the
//! data position, which `Learner` does not expose.

use burn::module::Module;
use burn::optim::GradientsParams;
use burn::tensor::Tensor;
use burn::train::metric::{Adaptor, ItemLazy, LossInput};
use burn::train::{InferenceStep, TrainOutput, TrainStep};
use infembed_encoder::{DualEncoder, DualEncoderModel};
use infembed_losses::ContrastiveLoss;

use crate::batch::TrainBatch;
use crate::step::{full_batch_step, grad_cache_step};

/// What the step needs besides the weights: tokenizer and encoder settings, the loss, and
/// the batch options. Not a module (no parameters); cloned with the model.
#[derive(Debug, Clone)]
pub struct StepContext {
    /// An encoder whose settings (tokenizer, pooling, interaction, lengths) are used; its
    /// weights are replaced by the module's at each step.
    pub encoder: DualEncoder,
    /// The objective.
    pub loss: ContrastiveLoss,
    /// Mask duplicate texts out of the negatives.
    pub mask_duplicates: bool,
    /// GradCache chunk size (`None` = one pass with a graph).
    pub grad_cache_chunk: Option<usize>,
}

/// The trainable InF-Embed model as a burn-train learner model.
#[derive(Module, Debug)]
pub struct InfEmbedLearnerModel {
    /// Backbone(s) and Interaction II weights.
    pub model: DualEncoderModel,
    /// Settings of the step.
    #[module(skip)]
    pub context: StepContext,
}

/// The loss of one step, as burn-train's metrics read it.
#[derive(Debug, Clone)]
pub struct StepOutput {
    /// `[1]`: the batch's loss.
    pub loss: Tensor<1>,
}

impl ItemLazy for StepOutput {
    fn sync(self) -> std::result::Result<Self, burn::tensor::ExecutionError> {
        Ok(self)
    }
}

impl Adaptor<LossInput> for StepOutput {
    fn adapt(&self) -> LossInput {
        LossInput::new(self.loss.clone())
    }
}

impl InfEmbedLearnerModel {
    fn encoder(&self) -> DualEncoder {
        let device = self
            .model
            .devices()
            .into_iter()
            .next()
            .unwrap_or_else(|| self.context.encoder.device().clone());
        self.context.encoder.with_model(self.model.clone(), &device)
    }
}

impl TrainStep for InfEmbedLearnerModel {
    type Input = TrainBatch;
    type Output = StepOutput;

    /// # Panics
    /// When the batch cannot be encoded (an empty batch): burn-train's strategies catch a
    /// worker's panic and report it as a training error.
    fn step(&self, item: TrainBatch) -> TrainOutput<StepOutput> {
        let encoder = self.encoder();
        let c = &self.context;
        let out = match c.grad_cache_chunk {
            Some(chunk) => grad_cache_step(&encoder, &item, &c.loss, c.mask_duplicates, 1.0, chunk),
            None => full_batch_step(&encoder, &item, &c.loss, c.mask_duplicates, 1.0),
        }
        .unwrap_or_else(|e| panic!("InF-Embed training step failed: {e}"));
        let device = encoder.device().clone().inner();
        TrainOutput {
            grads: out.grads,
            item: StepOutput {
                loss: Tensor::from_floats([out.loss], &device),
            },
        }
    }
}

impl InferenceStep for InfEmbedLearnerModel {
    type Input = TrainBatch;
    type Output = StepOutput;

    fn step(&self, item: TrainBatch) -> StepOutput {
        let encoder = self.encoder();
        let c = &self.context;
        let rows = item.encoder_rows();
        let device = encoder.device().clone();
        let emb = encoder
            .encode_batch_with(&rows, &item.instruction_rows)
            .unwrap_or_else(|e| panic!("InF-Embed validation step failed: {e}"));
        let with_instr = item.instruction_rows.first().is_some_and(|l| !l.is_empty());
        let lb = crate::step::loss_batch(
            emb.p,
            emb.iq,
            with_instr.then_some(emb.iq_instr),
            &item,
            c.mask_duplicates,
            &device,
        );
        StepOutput {
            loss: c.loss.forward(&lb).detach(),
        }
    }
}

/// Gradients from burn-train's step for one batch (used by tests to check that the
/// learner path and the trainer's path agree).
pub fn learner_grads(model: &InfEmbedLearnerModel, batch: TrainBatch) -> GradientsParams {
    TrainStep::step(model, batch).grads
}
