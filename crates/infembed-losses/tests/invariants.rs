//! Properties every objective must have, and the exact closed forms of degenerate batches.

mod fixture;
mod reference;

use fixture::{all_objectives, flex, loss_batch, random_batch, values};
use infembed_losses::{
    ContrastiveLoss, LossBatch, MarginalLogits, NegativeMask, Objective, PositiveCount, Reduction,
    Variable, VariableSet,
};
use proptest::prelude::*;
use reference::RefBatch;

/// Slack for f32 rounding in comparisons that are exact in real arithmetic: 2e-5 plus 8 ulp of
/// the largest logit magnitude (`1/t`), the resolution at which f32 knows the logits.
fn slack(temperature: f64) -> f64 {
    2e-5 + 8.0 * f64::from(f32::EPSILON) / temperature
}

fn loss(objective: Objective, temperature: f64) -> ContrastiveLoss {
    ContrastiveLoss::new(objective, 1.0 / temperature, Reduction::Mean).unwrap()
}

/// Applies a row permutation consistently: row `perm[r]` of the input becomes row r.
fn permute(batch: &RefBatch, perm: &[usize]) -> RefBatch {
    RefBatch {
        p: perm.iter().map(|&r| batch.p[r].clone()).collect(),
        iq: perm.iter().map(|&r| batch.iq[r].clone()).collect(),
        iq_instr: perm.iter().map(|&r| batch.iq_instr[r].clone()).collect(),
        mask_p: perm
            .iter()
            .map(|&r| perm.iter().map(|&c| batch.mask_p[r][c]).collect())
            .collect(),
        mask_iq: perm
            .iter()
            .map(|&r| perm.iter().map(|&c| batch.mask_iq[r][c]).collect())
            .collect(),
        mask_i: perm.iter().map(|&r| batch.mask_i[r].clone()).collect(),
        extra_p: batch.extra_p.clone(),
        mask_extra: perm.iter().map(|&r| batch.mask_extra[r].clone()).collect(),
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 40, ..ProptestConfig::default() })]

    #[test]
    fn every_term_and_objective_is_non_negative(
        b in 1usize..=24, k in 1usize..=5, d in 1usize..=16,
        temperature in 0.01f64..=1.0, mask_rate in 0.0f64..0.7, seed in any::<u64>(),
    ) {
        let batch = loss_batch(&random_batch(seed, b, k, d, mask_rate), &flex());
        let logits = MarginalLogits::new(&batch, VariableSet::ALL, 1.0 / temperature);
        for v in Variable::ALL {
            for x in values(logits.univariate(v)) {
                prop_assert!(x >= -slack(temperature), "l_{v} = {x}");
            }
        }
        for (objective, _) in all_objectives() {
            for x in values(loss(objective, temperature).forward_no_reduction(&batch)) {
                prop_assert!(x >= -slack(temperature), "{objective:?} row loss {x}");
            }
        }
    }

    #[test]
    fn permuting_the_rows_keeps_the_mean_loss(
        b in 1usize..=24, k in 1usize..=5, d in 1usize..=16,
        temperature in 0.01f64..=1.0, mask_rate in 0.0f64..0.5, seed in any::<u64>(),
        shuffle_seed in any::<u64>(),
    ) {
        let original = random_batch(seed, b, k, d, mask_rate);
        // Fisher-Yates with the fixture's generator.
        let mut rng = fixture::Rng::new(shuffle_seed);
        let mut perm: Vec<usize> = (0..b).collect();
        for i in (1..b).rev() {
            let j = (rng.next_u64() % (i as u64 + 1)) as usize;
            perm.swap(i, j);
        }
        let shuffled = permute(&original, &perm);
        let device = flex();
        let (a, s) = (loss_batch(&original, &device), loss_batch(&shuffled, &device));
        for (objective, _) in all_objectives() {
            let l = loss(objective, temperature);
            let x = values(l.forward(&a))[0];
            let y = values(l.forward(&s))[0];
            prop_assert!((x - y).abs() <= slack(temperature) * x.abs().max(1.0),
                "{objective:?}: {x} before, {y} after permuting by {perm:?}");
            // Row by row, the permuted losses are the original ones moved.
            let rx = values(l.forward_no_reduction(&a));
            let ry = values(l.forward_no_reduction(&s));
            for (r, &from) in perm.iter().enumerate() {
                prop_assert!((ry[r] - rx[from]).abs() <= slack(temperature) * rx[from].abs().max(1.0));
            }
        }
    }

    /// A joint softmax over a set has a larger denominator than each of its variables' own
    /// softmax (same numerator), so it is at least each single-variable term, row by row.
    #[test]
    fn multivariate_is_at_least_each_single_variable_term(
        b in 1usize..=24, k in 1usize..=5, d in 1usize..=16,
        temperature in 0.01f64..=1.0, mask_rate in 0.0f64..0.5, seed in any::<u64>(),
    ) {
        let batch = loss_batch(&random_batch(seed, b, k, d, mask_rate), &flex());
        let logits = MarginalLogits::new(&batch, VariableSet::ALL, 1.0 / temperature);
        for set in VariableSet::non_empty_subsets().into_iter().filter(|s| s.len() >= 2) {
            for positive in [PositiveCount::PerMarginal, PositiveCount::Once] {
                let joint = values(logits.joint(set, positive));
                for v in set.iter() {
                    let single = values(logits.univariate(v));
                    for i in 0..b {
                        prop_assert!(joint[i] >= single[i] - slack(temperature),
                            "{set} {positive:?} row {i}: {} < l_{v} = {}", joint[i], single[i]);
                    }
                }
            }
        }
    }

    /// The joint softmax of a single variable is that variable's univariate term, through the
    /// public loss (and both agree with the reference's univariate term).
    #[test]
    fn single_variable_multivariate_equals_univariate(
        b in 1usize..=24, k in 1usize..=5, d in 1usize..=16,
        temperature in 0.01f64..=1.0, mask_rate in 0.0f64..0.5, seed in any::<u64>(),
    ) {
        let raw = random_batch(seed, b, k, d, mask_rate);
        let batch = loss_batch(&raw, &flex());
        for v in Variable::ALL {
            let set = VariableSet::of(&[v]);
            let uni = values(loss(Objective::SumOfTerms(set), temperature).forward_no_reduction(&batch));
            let rv = fixture::ref_vars(set)[0];
            for positive in [PositiveCount::PerMarginal, PositiveCount::Once] {
                let multi = values(loss(Objective::Joint(set, positive), temperature)
                    .forward_no_reduction(&batch));
                for i in 0..b {
                    prop_assert!((multi[i] - uni[i]).abs() <= slack(temperature) * uni[i].abs().max(1.0));
                    let want = reference::univariate_term(&raw, 1.0 / temperature, rv, i);
                    prop_assert!((uni[i] - want).abs() <= slack(temperature) * want.abs().max(1.0));
                }
            }
        }
    }

    /// Every negative masked: each denominator holds only positives. Univariate terms are 0;
    /// a joint softmax over n variables is ln n with the positive per marginal, 0 counted once.
    #[test]
    fn all_negatives_masked_has_closed_form(
        b in 1usize..=16, k in 1usize..=5, d in 1usize..=16,
        temperature in 0.01f64..=1.0, seed in any::<u64>(),
    ) {
        let batch = loss_batch(&random_batch(seed, b, k, d, 1.0), &flex());
        for set in VariableSet::non_empty_subsets() {
            let n = set.len() as f64;
            let cases = [
                (Objective::SumOfTerms(set), 0.0),
                (Objective::Joint(set, PositiveCount::PerMarginal), n.ln()),
                (Objective::Joint(set, PositiveCount::Once), 0.0),
            ];
            for (objective, want) in cases {
                for x in values(loss(objective, temperature).forward_no_reduction(&batch)) {
                    prop_assert!((x - want).abs() <= slack(temperature), "{objective:?}: {x} vs {want}");
                }
            }
        }
    }

    /// All rows identical (every passage u, every pair and instruction pairing v): every logit
    /// equals the positive, so a softmax over N equal entries gives ln N. The P and IQ marginals
    /// hold B entries, the I marginal K + 1; a joint softmax holds the sum of its marginals'
    /// sizes, minus |V| - 1 when the positive is counted once.
    #[test]
    fn identical_rows_have_closed_form(
        b in 1usize..=16, k in 1usize..=5, d in 1usize..=16,
        temperature in 0.01f64..=1.0, seed in any::<u64>(),
    ) {
        let mut rng = fixture::Rng::new(seed);
        let u = fixture::unit_vector(&mut rng, d);
        let v = fixture::unit_vector(&mut rng, d);
        let raw = RefBatch {
            p: vec![u.clone(); b],
            iq: vec![v.clone(); b],
            iq_instr: vec![vec![v.clone(); k]; b],
            mask_p: vec![vec![false; b]; b],
            mask_iq: vec![vec![false; b]; b],
            mask_i: vec![vec![false; k]; b],
            extra_p: Vec::new(),
            mask_extra: vec![Vec::new(); b],
        };
        let batch = loss_batch(&raw, &flex());
        let size = |v: Variable| -> f64 {
            match v { Variable::P | Variable::Iq => b as f64, Variable::I => (k + 1) as f64 }
        };
        for set in VariableSet::non_empty_subsets() {
            let total: f64 = set.iter().map(size).sum();
            let cases = [
                (Objective::SumOfTerms(set), set.iter().map(|v| size(v).ln()).sum::<f64>()),
                (Objective::Joint(set, PositiveCount::PerMarginal), total.ln()),
                (Objective::Joint(set, PositiveCount::Once), (total - (set.len() as f64 - 1.0)).ln()),
            ];
            for (objective, want) in cases {
                for x in values(loss(objective, temperature).forward_no_reduction(&batch)) {
                    prop_assert!((x - want).abs() <= slack(temperature) * want.max(1.0),
                        "{objective:?} B={b} K={k}: {x} vs {want}");
                }
            }
        }
    }
}

/// A batch of one row has no in-batch negatives at all: P and IQ terms are 0.
#[test]
fn single_row_batch_without_instruction_negatives() {
    let raw = random_batch(11, 1, 1, 6, 0.0);
    let device = flex();
    let (p, iq, _) = fixture::tensors(&raw, &device);
    let batch = LossBatch::new(p, iq).with_mask(NegativeMask::default());
    let set = VariableSet::of(&[Variable::P, Variable::Iq]);
    let x = values(loss(Objective::SumOfTerms(set), 0.05).forward(&batch))[0];
    assert!(x.abs() <= slack(0.05), "{x}");
    let y =
        values(loss(Objective::Joint(set, PositiveCount::PerMarginal), 0.05).forward(&batch))[0];
    assert!((y - 2f64.ln()).abs() <= slack(0.05), "{y}");
}
