//! The burn forward pass (f32) equals the independent f64 reference for every objective, over
//! random batch sizes, dimensions, K, temperatures and masks.

mod fixture;
mod reference;

use fixture::{all_objectives, flex, loss_batch, random_batch, values};
use infembed_losses::{
    ContrastiveLoss, Convention, LossBatch, LossConfig, ObjectiveKind, Reduction, Scale, Variable,
};
use proptest::prelude::*;

/// |actual - expected| <= 1e-5 * max(1, |expected|) + 4 ulp(scale).
///
/// 1e-5 absolute for losses of order 1, relative for the large losses of low temperatures, plus
/// the f32 resolution of the logits themselves: a logit of magnitude up to `scale` (100 at
/// t = 0.01) is only known to a few units of `f32::EPSILON * scale` (about 1.2e-5 at t = 0.01),
/// and the loss subtracts two such logits.
fn close(actual: f64, expected: f64, scale: f64) -> bool {
    (actual - expected).abs()
        <= 1e-5 * expected.abs().max(1.0) + 4.0 * f64::from(f32::EPSILON) * scale
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn every_objective_matches_the_reference(
        b in 1usize..=32,
        k in 1usize..=6,
        d in 1usize..=24,
        temperature in 0.01f64..=1.0,
        mask_rate in prop_oneof![Just(0.0), 0.0f64..0.6],
        seed in any::<u64>(),
    ) {
        let batch = random_batch(seed, b, k, d, mask_rate);
        let device = flex();
        let tensors = loss_batch(&batch, &device);
        let scale = 1.0 / temperature;
        for (objective, reference) in all_objectives() {
            let loss = ContrastiveLoss::new(objective, scale, Reduction::Mean).unwrap();
            let rows = values(loss.forward_no_reduction(&tensors));
            let expected = reference::rows(&batch, scale, &reference);
            prop_assert_eq!(rows.len(), b);
            for (i, (got, want)) in rows.iter().zip(&expected).enumerate() {
                prop_assert!(close(*got, *want, scale),
                    "{objective:?} row {i}: burn {got} vs reference {want} (t = {temperature})");
            }
            let mean = values(loss.forward(&tensors))[0];
            let want = reference::mean(&batch, scale, &reference);
            prop_assert!(close(mean, want, scale), "{objective:?} mean: burn {mean} vs reference {want}");
        }
    }

    /// Extra passages (mined hard negatives) join every row's P-marginal, masked per row.
    #[test]
    fn extra_passages_join_the_p_marginal(
        b in 1usize..=16,
        k in 1usize..=4,
        m in 1usize..=6,
        d in 1usize..=16,
        temperature in 0.01f64..=1.0,
        mask_rate in prop_oneof![Just(0.0), 0.0f64..0.6],
        seed in any::<u64>(),
    ) {
        let batch = fixture::with_extra(random_batch(seed, b, k, d, mask_rate), seed, m, mask_rate);
        let tensors = loss_batch(&batch, &flex());
        let scale = 1.0 / temperature;
        for (objective, reference) in all_objectives() {
            let loss = ContrastiveLoss::new(objective, scale, Reduction::Mean).unwrap();
            let rows = values(loss.forward_no_reduction(&tensors));
            let expected = reference::rows(&batch, scale, &reference);
            for (i, (got, want)) in rows.iter().zip(&expected).enumerate() {
                prop_assert!(close(*got, *want, scale),
                    "{objective:?} row {i}: burn {got} vs reference {want} (M = {m})");
            }
        }
    }

    /// `Convention::ReferenceCode` + `Scale::ReferenceCode` reproduce the published code's
    /// loss, transcribed separately in the reference module (no duplicate masks there).
    #[test]
    fn reference_code_convention_matches_the_transcribed_code(
        b in 1usize..=16,
        k in 1usize..=4,
        d in 1usize..=16,
        temperature in 0.01f64..=0.5,
        seed in any::<u64>(),
    ) {
        let batch = random_batch(seed, b, k, d, 0.0);
        let device = flex();
        let (p, iq, iq_instr) = fixture::tensors(&batch, &device);
        let tensors = LossBatch::new(p, iq).with_instruction_negatives(iq_instr);
        use Variable::*;
        let sets: [&[Variable]; 7] = [&[P], &[I], &[Iq], &[P, I], &[P, Iq], &[I, Iq], &[P, I, Iq]];
        for set in sets {
            let blocks = fixture::ref_vars(infembed_losses::VariableSet::of(set));
            for kind in [ObjectiveKind::Univariate, ObjectiveKind::Multivariate] {
                if kind == ObjectiveKind::Multivariate && set.len() == 1 {
                    continue;
                }
                let loss = LossConfig::new(kind, set)
                    .with_temperature(temperature)
                    .with_convention(Convention::ReferenceCode)
                    .with_scale(Scale::ReferenceCode)
                    .init()
                    .unwrap();
                let got = values(loss.forward(&tensors))[0];
                // The code's `map` model is its "univariate", `map_add` its "multivariate".
                let add = kind == ObjectiveKind::Multivariate;
                let want = reference::reference_code_loss(&batch, temperature, &blocks, add);
                prop_assert!(close(got, want, 1.0 / temperature), "{kind:?} {set:?}: burn {got} vs code {want}");
            }
        }
    }
}

#[test]
fn sum_reduction_is_b_times_the_mean() {
    let batch = random_batch(7, 9, 3, 8, 0.2);
    let device = flex();
    let tensors = loss_batch(&batch, &device);
    let config = LossConfig::new(ObjectiveKind::Multivariate, &[Variable::P, Variable::I]);
    let mean = values(config.init().unwrap().forward(&tensors))[0];
    let sum = values(
        config
            .with_reduction(Reduction::Sum)
            .init()
            .unwrap()
            .forward(&tensors),
    )[0];
    let want = reference::mean(
        &batch,
        20.0,
        &reference::RefObjective::Multivariate {
            vars: vec![reference::V::P, reference::V::I],
            once: false,
        },
    );
    assert!(close(mean, want, 20.0), "{mean} vs {want}");
    assert!(
        close(sum, 9.0 * want, 9.0 * 20.0),
        "{sum} vs {}",
        9.0 * want
    );
}

/// Very low temperatures and adversarial similarities (the positive at cosine -1, every
/// negative at +1) stay finite and match the reference.
#[test]
fn extreme_logits_are_finite() {
    let b = 8;
    let k = 3;
    let u: Vec<f64> = vec![1.0, 0.0, 0.0, 0.0];
    let minus_u: Vec<f64> = u.iter().map(|x| -x).collect();
    let batch = reference::RefBatch {
        p: vec![u.clone(); b],
        iq: vec![minus_u.clone(); b],
        iq_instr: vec![vec![u.clone(); k]; b],
        mask_p: vec![vec![false; b]; b],
        mask_iq: vec![vec![false; b]; b],
        mask_i: vec![vec![false; k]; b],
        extra_p: Vec::new(),
        mask_extra: vec![Vec::new(); b],
    };
    // p_m . iq_i = -1 for all pairs except the I negatives (+1).
    let device = flex();
    let tensors = loss_batch(&batch, &device);
    for temperature in [0.01, 0.005, 0.001] {
        let scale = 1.0 / temperature;
        for (objective, reference) in all_objectives() {
            let loss = ContrastiveLoss::new(objective, scale, Reduction::Mean).unwrap();
            let got = values(loss.forward(&tensors))[0];
            assert!(got.is_finite(), "{objective:?} at t = {temperature}: {got}");
            if temperature >= 0.01 {
                let want = reference::mean(&batch, scale, &reference);
                assert!(close(got, want, scale), "{objective:?}: {got} vs {want}");
            }
        }
    }
}
