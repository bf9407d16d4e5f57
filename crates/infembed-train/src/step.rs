//! One contrastive batch: forward, loss and gradients, either in one pass with a graph or
//! with GradCache.
//!
//! Both functions return the parameter gradients of `loss * weight` (the trainer passes
//! `weight = 1 / accumulation`) and the unweighted loss value.
//!
//! # GradCache
//!
//! [`grad_cache_step`] follows Gao et al. (2021), "Scaling Deep Contrastive Learning Batch
//! Size under Memory Limited Setup": (1) embed every distinct text of the batch in chunks
//! with the model as it trains (dropout on, see below), keeping only each chunk's values so
//! that its graph is dropped at once; (2) make those embeddings leaf
//! tensors, compute the loss over the whole batch and its gradient with respect to each
//! embedding; (3) re-embed each chunk with a graph and backpropagate `sum(e * cached_grad)`,
//! whose parameter gradient is exactly the chunk's share of the full gradient; (4) sum the
//! shares. Peak activation memory is one chunk's, whatever the batch size.
//!
//! # Dropout
//!
//! The backbones apply dropout in training mode (BERT's `hidden_dropout_prob`, as
//! sentence-transformers trains). burn's CPU backend draws from one generator per process,
//! so each batch re-seeds it with [`TrainBatch::dropout_seed`]: a step is reproducible, and a
//! resumed run draws the same masks. GradCache seeds each chunk with a seed derived from the
//! batch's and uses it in both passes, so the cached and the re-computed embeddings see the
//! same masks (as GradCache's `RandContext` does). Its masks are not the full-batch pass's
//! masks, so with dropout the two gradients agree in expectation; without dropout (or with a
//! dropout-free backbone) they agree to float rounding.

use burn::optim::{GradientsAccumulator, GradientsParams};
use burn::tensor::{Device, Int, Tensor, TensorData};
use infembed_encoder::{DualEncoder, DualEncoderModel};
use infembed_losses::{ContrastiveLoss, LossBatch};

use crate::batch::TrainBatch;
use crate::error::Result;

/// What one batch produced.
#[derive(Debug)]
pub struct StepGrads {
    /// The (unweighted) loss of the batch.
    pub loss: f32,
    /// Gradients of `loss * weight` with respect to every trainable parameter.
    pub grads: GradientsParams,
    /// Distinct texts that went through the backbone (per pass).
    pub texts: usize,
}

/// The losses crate's input for one batch: embeddings, the instruction negatives when the
/// objective has them, and the duplicate-text mask when `mask_duplicates`.
pub(crate) fn loss_batch(
    p: Tensor<2>,
    iq: Tensor<2>,
    iq_instr: Option<Tensor<3>>,
    batch: &TrainBatch,
    mask_duplicates: bool,
    device: &Device,
) -> LossBatch {
    let mut lb = LossBatch::new(p, iq);
    let has_instr = iq_instr.is_some();
    if let Some(t) = iq_instr {
        lb = lb.with_instruction_negatives(t);
    }
    if mask_duplicates {
        let mut mask = batch.duplicate_mask(device);
        if !has_instr {
            mask.instructions = None;
        }
        lb = lb.with_mask(mask);
    }
    lb
}

fn scalar(t: Tensor<1>) -> f32 {
    t.into_scalar::<f32>()
}

/// The whole batch in one forward pass with a graph. `encoder` must live on an autodiff
/// device. `batch.instruction_rows` may hold empty lists when the objective has no I term.
pub fn full_batch_step(
    encoder: &DualEncoder,
    batch: &TrainBatch,
    loss: &ContrastiveLoss,
    mask_duplicates: bool,
    weight: f64,
) -> Result<StepGrads> {
    let device = encoder.device().clone();
    device.seed(batch.dropout_seed);
    let rows = batch.encoder_rows();
    let with_instr = batch
        .instruction_rows
        .first()
        .is_some_and(|l| !l.is_empty());
    let (p, iq, iq_instr, texts) = if with_instr {
        let e = encoder.encode_batch(&rows, &batch.instruction_rows)?;
        (e.p, e.iq, Some(e.iq_instr), e.texts_encoded)
    } else {
        let passages: Vec<&str> = rows.iter().map(|r| r.passage).collect();
        let pairs: Vec<(&str, &str)> = rows.iter().map(|r| (r.instruction, r.query)).collect();
        let p = encoder.encode_passages(&passages)?;
        let q = encoder.encode_queries(&pairs)?;
        (p.embeddings, q.embeddings, None, rows.len() * 2)
    };
    let lb = loss_batch(p, iq, iq_instr, batch, mask_duplicates, &device);
    let value = loss.forward(&lb);
    let loss_value = scalar(value.clone().inner());
    let grads = value.mul_scalar(weight).backward();
    Ok(StepGrads {
        loss: loss_value,
        grads: GradientsParams::from_grads(grads, encoder.model()),
        texts,
    })
}

fn index(v: &[usize], device: &Device) -> Tensor<1, Int> {
    let data: Vec<i64> = v.iter().map(|&i| i as i64).collect();
    Tensor::from_data(TensorData::new(data, [v.len()]), device)
}

/// Embeds `texts` `chunk` at a time with `embed`, concatenated in input order.
fn embed_chunks(
    texts: &[String],
    chunk: usize,
    embed: &dyn Fn(usize, &[&str]) -> Result<Tensor<2>>,
) -> Result<Tensor<2>> {
    let mut parts = Vec::new();
    for (i, c) in texts.chunks(chunk.max(1)).enumerate() {
        let refs: Vec<&str> = c.iter().map(String::as_str).collect();
        parts.push(embed(i, &refs)?);
    }
    Ok(Tensor::cat(parts, 0))
}

/// GradCache over Interaction I (Gao et al. 2021): embed every distinct text in chunks
/// without keeping graphs, take the loss gradient with respect to each embedding, then
/// re-embed each chunk with a graph and backpropagate its cached gradient; at most `chunk`
/// texts per forward pass. Dropout masks are replayed per chunk from the batch's seed.
/// Gradients equal [`full_batch_step`]'s up to float rounding (without dropout).
pub fn grad_cache_step(
    encoder: &DualEncoder,
    batch: &TrainBatch,
    loss: &ContrastiveLoss,
    mask_duplicates: bool,
    weight: f64,
    chunk: usize,
) -> Result<StepGrads> {
    let device = encoder.device().clone();
    let rows = batch.encoder_rows();
    let n = rows.len();
    let texts = encoder.batch_texts(&rows, &batch.instruction_rows)?;
    let k = texts.k;

    // (1) Embeddings without a graph (the graph of each chunk is dropped at once).
    let seeds = |side: u64, c: usize| crate::batch::mix(batch.dropout_seed, side << 32 | c as u64);
    let ep = embed_chunks(&texts.passages, chunk, &|c, t| {
        device.seed(seeds(1, c));
        Ok(encoder.embed_passage_texts(t)?.embeddings.inner())
    })?;
    let eq = embed_chunks(&texts.queries, chunk, &|c, t| {
        device.seed(seeds(2, c));
        Ok(encoder.embed_query_texts(t)?.embeddings.inner())
    })?;

    // (2) Loss over the whole batch and its gradient w.r.t. each distinct embedding.
    let ep_leaf = Tensor::from_inner(ep).require_grad();
    let eq_leaf = Tensor::from_inner(eq).require_grad();
    let d = ep_leaf.dims()[1];
    let p = ep_leaf
        .clone()
        .select(0, index(&texts.passage_index, &device));
    let all = eq_leaf
        .clone()
        .select(0, index(&texts.query_index, &device));
    let iq = all.clone().slice([0..n, 0..d]);
    let iq_instr = (k > 0).then(|| all.slice([n..n * (k + 1), 0..d]).reshape([n, k, d]));
    let lb = loss_batch(p, iq, iq_instr, batch, mask_duplicates, &device);
    let value = loss.forward(&lb);
    let loss_value = scalar(value.clone().inner());
    let cached = value.mul_scalar(weight).backward();
    let gp = ep_leaf.grad(&cached);
    let gq = eq_leaf.grad(&cached);

    // (3) Re-embed each chunk with a graph and backpropagate the cached gradients.
    let mut acc = GradientsAccumulator::<DualEncoderModel>::new();
    let sides: [(&[String], Option<Tensor<2>>, u64); 2] =
        [(&texts.passages, gp, 1), (&texts.queries, gq, 2)];
    for (list, grad, side) in sides {
        let Some(grad) = grad else { continue };
        let grad = Tensor::from_inner(grad);
        for (i, c) in list.chunks(chunk.max(1)).enumerate() {
            let start = i * chunk.max(1);
            let refs: Vec<&str> = c.iter().map(String::as_str).collect();
            device.seed(seeds(side, i));
            let e = if side == 1 {
                encoder.embed_passage_texts(&refs)?.embeddings
            } else {
                encoder.embed_query_texts(&refs)?.embeddings
            };
            let g = grad.clone().slice([start..start + c.len(), 0..d]);
            let surrogate = (e * g).sum();
            let grads = surrogate.backward();
            acc.accumulate(
                encoder.model(),
                GradientsParams::from_grads(grads, encoder.model()),
            );
        }
    }
    Ok(StepGrads {
        loss: loss_value,
        grads: acc.grads(),
        texts: texts.passages.len() + texts.queries.len(),
    })
}
