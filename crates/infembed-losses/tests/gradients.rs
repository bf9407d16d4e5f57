//! burn's autodiff gradient of every objective with respect to every embedding equals a central
//! finite-difference gradient of the independent f64 reference.

mod fixture;
mod reference;

use burn::tensor::Device;
use fixture::{all_objectives, mask, random_batch, tensors, values};
use infembed_losses::{ContrastiveLoss, LossBatch, Reduction};
use reference::{RefBatch, RefObjective};

/// Central differences of the reference's mean loss with respect to every coordinate of p, iq
/// and iq_instr (in that order, row-major).
fn finite_difference(batch: &RefBatch, scale: f64, objective: &RefObjective) -> Vec<f64> {
    let h = 1e-6;
    let f = |b: &RefBatch| reference::mean(b, scale, objective);
    let mut grad = Vec::new();
    let (rows, d, k) = (batch.b(), batch.p[0].len(), batch.k());
    for which in 0..3 {
        for i in 0..rows {
            let inner = if which == 2 { k } else { 1 };
            for j in 0..inner {
                for c in 0..d {
                    let mut plus = batch.clone();
                    let mut minus = batch.clone();
                    let (pp, mm) = match which {
                        0 => (&mut plus.p[i][c], &mut minus.p[i][c]),
                        1 => (&mut plus.iq[i][c], &mut minus.iq[i][c]),
                        _ => (&mut plus.iq_instr[i][j][c], &mut minus.iq_instr[i][j][c]),
                    };
                    *pp += h;
                    *mm -= h;
                    grad.push((f(&plus) - f(&minus)) / (2.0 * h));
                }
            }
        }
    }
    grad
}

fn check_gradients(seed: u64, b: usize, k: usize, d: usize, temperature: f64, mask_rate: f64) {
    let batch = random_batch(seed, b, k, d, mask_rate);
    let device = Device::flex().autodiff();
    let scale = 1.0 / temperature;
    for (objective, reference) in all_objectives() {
        let (p, iq, iq_instr) = tensors(&batch, &device);
        let (p, iq, iq_instr) = (p.require_grad(), iq.require_grad(), iq_instr.require_grad());
        let input = LossBatch::new(p.clone(), iq.clone())
            .with_instruction_negatives(iq_instr.clone())
            .with_mask(mask(&batch, &device));
        let loss = ContrastiveLoss::new(objective, scale, Reduction::Mean).unwrap();
        let grads = loss.forward(&input).backward();
        let mut got = values(p.grad(&grads).expect("p has a gradient"));
        got.extend(values(iq.grad(&grads).expect("iq has a gradient")));
        // An objective without I does not touch iq_instr: its gradient is absent or zero.
        match iq_instr.grad(&grads) {
            Some(g) => got.extend(values(g)),
            None => got.extend(std::iter::repeat_n(0.0, b * k * d)),
        }
        let want = finite_difference(&batch, scale, &reference);
        assert_eq!(got.len(), want.len());
        let norm = want.iter().map(|x| x.abs()).fold(0.0, f64::max).max(1.0);
        for (idx, (g, w)) in got.iter().zip(&want).enumerate() {
            assert!(
                (g - w).abs() <= 1e-4 * norm,
                "{objective:?} (t = {temperature}, seed {seed}): coordinate {idx}: \
                 autodiff {g} vs finite difference {w}"
            );
        }
    }
}

#[test]
fn gradients_match_finite_differences_without_masks() {
    check_gradients(1, 4, 3, 5, 0.05, 0.0);
    check_gradients(2, 3, 2, 3, 0.5, 0.0);
}

#[test]
fn gradients_match_finite_differences_with_masks() {
    check_gradients(3, 5, 3, 4, 0.05, 0.35);
}

#[test]
fn gradients_match_finite_differences_at_low_temperature() {
    check_gradients(4, 4, 2, 4, 0.01, 0.2);
}
