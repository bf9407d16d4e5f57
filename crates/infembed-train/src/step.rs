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
use infembed_encoder::{BatchTexts, DualEncoder, DualEncoderModel, l2_normalize};
use infembed_losses::{ContrastiveLoss, LossBatch, NegativeMask};

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
/// objective has them, the mined passages' embeddings when the batch has some, the
/// duplicate-text mask when `mask_duplicates`, and (always) the mined passages' exclusions.
pub(crate) fn loss_batch(
    p: Tensor<2>,
    iq: Tensor<2>,
    iq_instr: Option<Tensor<3>>,
    p_extra: Option<Tensor<2>>,
    batch: &TrainBatch,
    mask_duplicates: bool,
    device: &Device,
) -> LossBatch {
    let mut lb = LossBatch::new(p, iq);
    let has_instr = iq_instr.is_some();
    if let Some(t) = iq_instr {
        lb = lb.with_instruction_negatives(t);
    }
    let mut mask = if mask_duplicates {
        let mut mask = batch.duplicate_mask(device);
        if !has_instr {
            mask.instructions = None;
        }
        mask
    } else {
        NegativeMask::default()
    };
    if let Some(t) = p_extra {
        lb = lb.with_extra_passages(t);
        mask.extra_passages = batch.extra_mask(device);
    }
    lb.with_mask(mask)
}

/// The batch's mined passages with their prefix, as the passage tower reads them.
fn prefixed_extras(encoder: &DualEncoder, batch: &TrainBatch) -> Vec<String> {
    let prefix = &encoder.config().passage_prefix;
    batch
        .extra_passages
        .iter()
        .map(|p| format!("{prefix}{p}"))
        .collect()
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
    let start = std::time::Instant::now();
    let pass = full_batch_pass(encoder, batch, loss, mask_duplicates, weight)?;
    let issued = start.elapsed();
    let loss_value = scalar(pass.loss);
    log::debug!(
        "loss read back after {:.1} ms more",
        (start.elapsed() - issued).as_secs_f64() * 1e3
    );
    Ok(StepGrads {
        loss: loss_value,
        grads: pass.grads,
        texts: pass.texts,
    })
}

/// [`StepGrads`] with the loss still on the device (`[1]`): nothing read back yet.
pub(crate) struct PassGrads {
    pub(crate) loss: Tensor<1>,
    pub(crate) grads: GradientsParams,
    pub(crate) texts: usize,
}

/// [`full_batch_step`] without reading the loss back: the forward and backward passes issued,
/// the loss left on the device, so that a GPU device keeps computing while the host issues
/// what follows (the optimizer's step).
pub(crate) fn full_batch_pass(
    encoder: &DualEncoder,
    batch: &TrainBatch,
    loss: &ContrastiveLoss,
    mask_duplicates: bool,
    weight: f64,
) -> Result<PassGrads> {
    let start = std::time::Instant::now();
    let device = encoder.device().clone();
    device.seed(batch.dropout_seed);
    let rows = batch.encoder_rows();
    let with_instr = batch
        .instruction_rows
        .first()
        .is_some_and(|l| !l.is_empty());
    let (p, iq, iq_instr, p_extra, texts) = if encoder.shares_training_passes() {
        shared_passes(encoder, batch, &rows, with_instr)?
    } else {
        separate_passes(encoder, batch, &rows, with_instr)?
    };
    let lb = loss_batch(p, iq, iq_instr, p_extra, batch, mask_duplicates, &device);
    let value = loss.forward(&lb);
    let forward = start.elapsed();
    // the backward pass is issued before the loss is read back, so that a GPU device computes
    // the forward pass while the host issues the backward one (the same values either way)
    let grads = value.clone().mul_scalar(weight).backward();
    log::debug!(
        "training pass: forward issued in {:.1} ms, backward in {:.1} ms",
        forward.as_secs_f64() * 1e3,
        (start.elapsed() - forward).as_secs_f64() * 1e3,
    );
    Ok(PassGrads {
        loss: value.inner(),
        grads: GradientsParams::from_grads(grads, encoder.model()),
        texts,
    })
}

/// What a step's passes give the loss: the rows' passages `[N, d]`, their queries `[N, d]`,
/// the instruction negatives `[N, K, d]`, the mined passages `[M, d]`, and the number of
/// texts embedded.
type StepEmbeddings = (
    Tensor<2>,
    Tensor<2>,
    Option<Tensor<3>>,
    Option<Tensor<2>>,
    usize,
);

/// The batch's passages, mined passages and query-side texts through the same forward
/// passes ([`DualEncoder::embed_sides`]), each distinct text once.
fn shared_passes(
    encoder: &DualEncoder,
    batch: &TrainBatch,
    rows: &[infembed_encoder::BatchRow<'_>],
    with_instr: bool,
) -> Result<StepEmbeddings> {
    let n = rows.len();
    let own_pairs = vec![Vec::new(); n];
    let lists = if with_instr {
        &batch.instruction_rows
    } else {
        &own_pairs
    };
    let texts = encoder.batch_texts(rows, lists)?;
    let own_passages = texts.passages.len();
    let extras = prefixed_extras(encoder, batch);
    let m = extras.len();
    let passages: Vec<&str> = texts
        .passages
        .iter()
        .chain(&extras)
        .map(String::as_str)
        .collect();
    let queries: Vec<&str> = texts.queries.iter().map(String::as_str).collect();
    let (ep, eq) = encoder.embed_sides(&passages, &queries)?;
    let (p, iq, iq_instr, p_extra) = assemble(
        ep.embeddings,
        eq.embeddings,
        &texts,
        (own_passages, m),
        encoder.device(),
    );
    Ok((p, iq, iq_instr, p_extra, passages.len() + queries.len()))
}

/// The loss's embeddings from those of a batch's distinct texts ([`BatchTexts`]): `ep` the
/// distinct passages' `[P + M, d]` (the rows' `own` first, then the `M` mined ones), `eq`
/// the distinct query-side texts' `[Q, d]`. Returns the rows' passages `[N, d]`, their
/// queries `[N, d]`, the instruction negatives `[N, K, d]` (K > 0) and the mined passages
/// `[M, d]` (M > 0).
fn assemble(
    ep: Tensor<2>,
    eq: Tensor<2>,
    texts: &BatchTexts,
    (own, m): (usize, usize),
    device: &Device,
) -> (Tensor<2>, Tensor<2>, Option<Tensor<3>>, Option<Tensor<2>>) {
    let (n, k, d) = (texts.passage_index.len(), texts.k, ep.dims()[1]);
    let p = ep.clone().select(0, index(&texts.passage_index, device));
    let all = eq.select(0, index(&texts.query_index, device));
    let iq = all.clone().slice([0..n, 0..d]);
    let iq_instr = (k > 0).then(|| all.slice([n..n * (k + 1), 0..d]).reshape([n, k, d]));
    let p_extra = (m > 0).then(|| ep.slice([own..own + m, 0..d]));
    (p, iq, iq_instr, p_extra)
}

/// The batch's passages, its query-side texts and its mined passages, each side in passes of
/// its own.
fn separate_passes(
    encoder: &DualEncoder,
    batch: &TrainBatch,
    rows: &[infembed_encoder::BatchRow<'_>],
    with_instr: bool,
) -> Result<StepEmbeddings> {
    let (p, iq, iq_instr, texts) = if with_instr {
        let e = encoder.encode_batch(rows, &batch.instruction_rows)?;
        (e.p, e.iq, Some(e.iq_instr), e.texts_encoded)
    } else {
        let passages: Vec<&str> = rows.iter().map(|r| r.passage).collect();
        let pairs: Vec<(&str, &str)> = rows.iter().map(|r| (r.instruction, r.query)).collect();
        let p = encoder.encode_passages(&passages)?.embeddings;
        let q = encoder.encode_queries(&pairs)?.embeddings;
        // The objectives score by cosine: unit vectors whatever the checkpoint's pipeline.
        let (p, q) = if encoder.normalizes() {
            (p, q)
        } else {
            (l2_normalize(p), l2_normalize(q))
        };
        (p, q, None, rows.len() * 2)
    };
    // Mined passages: one more pass of the passage tower (unit vectors, as the rows').
    let extras = prefixed_extras(encoder, batch);
    let p_extra = if extras.is_empty() {
        None
    } else {
        let refs: Vec<&str> = extras.iter().map(String::as_str).collect();
        Some(encoder.embed_passage_texts(&refs)?.embeddings)
    };
    Ok((p, iq, iq_instr, p_extra, texts + extras.len()))
}

fn index(v: &[usize], device: &Device) -> Tensor<1, Int> {
    let data: Vec<i64> = v.iter().map(|&i| i as i64).collect();
    Tensor::from_data(TensorData::new(data, [v.len()]), device)
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
    multi_device_step(
        std::slice::from_ref(encoder),
        batch,
        loss,
        mask_duplicates,
        weight,
        Some(chunk),
    )
}

/// Which replica embeds which texts: `n` texts in contiguous shares over `devices`, each
/// cut in chunks of at most `chunk`. Returns `(device, start, end)` per chunk, in text order,
/// so that the chunk's position in the list also numbers its dropout seed.
fn plan_chunks(n: usize, devices: usize, chunk: Option<usize>) -> Vec<(usize, usize, usize)> {
    let share = n.div_ceil(devices.max(1)).max(1);
    let mut out = Vec::new();
    for d in 0..devices.max(1) {
        let (lo, hi) = ((d * share).min(n), ((d + 1) * share).min(n));
        let step = chunk.unwrap_or(share).max(1);
        let mut at = lo;
        while at < hi {
            let end = (at + step).min(hi);
            out.push((d, at, end));
            at = end;
        }
    }
    out
}

/// One contrastive batch shared by several devices, with the embeddings gathered: `replicas`
/// hold the same weights, one per device, the first on the main device. Each replica embeds
/// a contiguous share of the batch's distinct texts (in chunks of at most `chunk` texts when
/// given) without a graph; the embeddings move to the main device, where the loss sees the
/// whole batch; each replica then re-embeds its share with a graph and backpropagates the
/// gradient of its embeddings (GradCache across devices). The returned gradients live on the
/// main device and equal one device's over the same batch up to float rounding (without
/// dropout; with dropout, each share draws its own masks). Needs Interaction I.
pub fn multi_device_step(
    replicas: &[DualEncoder],
    batch: &TrainBatch,
    loss: &ContrastiveLoss,
    mask_duplicates: bool,
    weight: f64,
    chunk: Option<usize>,
) -> Result<StepGrads> {
    let main = &replicas[0];
    let device = main.device().clone();
    let main_plain = device.clone().inner();
    let rows = batch.encoder_rows();
    let mut texts = main.batch_texts(&rows, &batch.instruction_rows)?;
    // The mined passages go after the rows' distinct passages (none equals one of them).
    let own_passages = texts.passages.len();
    let extras = prefixed_extras(main, batch);
    let m = extras.len();
    texts.passages.extend(extras);
    let seeds = |side: u64, c: usize| crate::batch::mix(batch.dropout_seed, side << 32 | c as u64);
    let embed = |side: u64, r: &DualEncoder, t: &[&str]| -> Result<Tensor<2>> {
        Ok(if side == 1 {
            r.embed_passage_texts(t)?.embeddings
        } else {
            r.embed_query_texts(t)?.embeddings
        })
    };
    let sides: [(&[String], u64); 2] = [(&texts.passages, 1), (&texts.queries, 2)];
    let plans: Vec<_> = sides
        .iter()
        .map(|(list, _)| plan_chunks(list.len(), replicas.len(), chunk))
        .collect();

    // (1) Embeddings without a graph (the graph of each chunk is dropped at once), gathered
    // on the main device.
    let mut cached = Vec::with_capacity(2);
    for ((list, side), plan) in sides.iter().zip(&plans) {
        let mut parts = Vec::with_capacity(plan.len());
        for (c, &(d, lo, hi)) in plan.iter().enumerate() {
            let r = &replicas[d];
            let refs: Vec<&str> = list[lo..hi].iter().map(String::as_str).collect();
            r.device().seed(seeds(*side, c));
            parts.push(embed(*side, r, &refs)?.inner().to_device(&main_plain));
        }
        cached.push(Tensor::cat(parts, 0));
    }
    let eq = cached.pop().expect("two sides");
    let ep = cached.pop().expect("two sides");

    // (2) Loss over the whole batch and its gradient w.r.t. each distinct embedding.
    let ep_leaf = Tensor::from_inner(ep).require_grad();
    let eq_leaf = Tensor::from_inner(eq).require_grad();
    let d = ep_leaf.dims()[1];
    let (p, iq, iq_instr, p_extra) = assemble(
        ep_leaf.clone(),
        eq_leaf.clone(),
        &texts,
        (own_passages, m),
        &device,
    );
    let lb = loss_batch(p, iq, iq_instr, p_extra, batch, mask_duplicates, &device);
    let value = loss.forward(&lb);
    let loss_value = scalar(value.clone().inner());
    let cached = value.mul_scalar(weight).backward();
    let grads = [ep_leaf.grad(&cached), eq_leaf.grad(&cached)];

    // (3) Re-embed each chunk with a graph on its device and backpropagate the cached
    // gradients; each replica's gradients move to the main device.
    let mut acc = GradientsAccumulator::<DualEncoderModel>::new();
    for (((list, side), plan), grad) in sides.iter().zip(&plans).zip(grads) {
        let Some(grad) = grad else { continue };
        for (c, &(dev, lo, hi)) in plan.iter().enumerate() {
            let r = &replicas[dev];
            let refs: Vec<&str> = list[lo..hi].iter().map(String::as_str).collect();
            r.device().seed(seeds(*side, c));
            let e = embed(*side, r, &refs)?;
            let g = grad.clone().slice([lo..hi, 0..d]);
            let g = Tensor::<2>::from_inner(g.to_device(&r.device().clone().inner()));
            let surrogate = (e * g).sum();
            let mut shares = GradientsParams::from_grads(surrogate.backward(), r.model());
            if dev > 0 && r.device() != main.device() {
                shares = shares.to_device(&device, main.model());
            }
            acc.accumulate(main.model(), shares);
        }
    }
    Ok(StepGrads {
        loss: loss_value,
        grads: acc.grads(),
        texts: texts.passages.len() + texts.queries.len(),
    })
}

#[cfg(test)]
mod tests {
    use super::plan_chunks;

    #[test]
    fn chunks_cover_the_texts_in_order_and_split_over_devices() {
        for n in 0..23 {
            for devices in 1..5 {
                for chunk in [None, Some(1), Some(3), Some(50)] {
                    let plan = plan_chunks(n, devices, chunk);
                    let mut at = 0;
                    for &(d, lo, hi) in &plan {
                        assert_eq!(lo, at);
                        assert!(hi > lo && d < devices);
                        if let Some(c) = chunk {
                            assert!(hi - lo <= c);
                        }
                        at = hi;
                    }
                    assert_eq!(at, n);
                    assert!(plan.windows(2).all(|w| w[0].0 <= w[1].0));
                }
            }
        }
        // One device with a chunk size is plain GradCache's chunking.
        assert_eq!(
            plan_chunks(7, 1, Some(3)),
            vec![(0, 0, 3), (0, 3, 6), (0, 6, 7)]
        );
        // Two devices share 7 texts 4 + 3.
        assert_eq!(plan_chunks(7, 2, None), vec![(0, 0, 4), (1, 4, 7)]);
    }
}
