//! Instruction negatives: for each row of a batch, the other rows whose instructions are
//! combined with its query (the I-marginal terms of the objectives).
//!
//! The one rule, for a batch of N rows (N = 3R for R records):
//!
//! - **Interaction I**: K = `encoder.interaction.instruction_negatives`, or by default
//!   N/2 - 1 (the reference code's 3R/2 - 1), then clamped to `1..=N-1`; each row draws K
//!   distinct other rows uniformly without replacement. A K that no full batch can hold
//!   (K > 3R - 1 for `batch.records = R`) is refused by config validation, naming the field;
//!   the clamp only shortens the list of a smaller last batch of an epoch (without
//!   `batch.drop_last`).
//! - **Interaction II**: every other row, in increasing order (K = N - 1; its combinations
//!   are cheap).
//!
//! A batch of fewer than 2 rows has no other rows and is an [`Error::Batch`].

use infembed_encoder::Interaction;
use rand::Rng;

use crate::error::{Error, Result};

/// K, the instruction negatives per row, for a batch of `rows` rows under Interaction I:
/// `configured` (or `rows / 2 - 1` when `None`), clamped to `1..=rows-1` (1 for fewer than 2
/// rows).
pub fn instruction_negatives_per_row(configured: Option<usize>, rows: usize) -> usize {
    configured
        .unwrap_or((rows / 2).saturating_sub(1))
        .clamp(1, rows.saturating_sub(1).max(1))
}

/// The instruction negatives of a batch of `n` rows under `interaction` (see the
/// [module docs](self) for the rule); Interaction I draws them from `rng`.
pub(crate) fn instruction_rows<R: Rng>(
    interaction: &Interaction,
    n: usize,
    rng: &mut R,
) -> Result<Vec<Vec<usize>>> {
    match interaction {
        Interaction::SelfAttention {
            instruction_negatives,
            ..
        } => sample_other_rows(
            n,
            instruction_negatives_per_row(*instruction_negatives, n),
            rng,
        ),
        Interaction::CrossAttention(_) => all_other_rows(n),
    }
}

/// For each of `n` rows, `k` distinct other rows drawn uniformly without replacement.
///
/// Fails when `k > n - 1`.
pub(crate) fn sample_other_rows<R: Rng>(
    n: usize,
    k: usize,
    rng: &mut R,
) -> Result<Vec<Vec<usize>>> {
    if n < 2 || k > n - 1 {
        return Err(Error::Batch(format!(
            "cannot draw {k} other rows from a batch of {n}"
        )));
    }
    Ok((0..n)
        .map(|i| {
            rand::seq::index::sample(rng, n - 1, k)
                .into_iter()
                .map(|j| if j >= i { j + 1 } else { j })
                .collect()
        })
        .collect())
}

/// For each of `n` rows, every other row in increasing order (K = n - 1).
pub(crate) fn all_other_rows(n: usize) -> Result<Vec<Vec<usize>>> {
    if n < 2 {
        return Err(Error::Batch(format!(
            "a batch of {n} row(s) has no other rows"
        )));
    }
    Ok((0..n)
        .map(|i| (0..n).filter(|&j| j != i).collect())
        .collect())
}

#[cfg(test)]
mod tests {
    use infembed_encoder::{CrossAttentionConfig, QueryTemplate};
    use proptest::prelude::*;
    use rand::SeedableRng;
    use rand_chacha::ChaCha8Rng;

    use super::*;

    #[test]
    fn the_default_follows_the_reference_and_short_batches_clamp() {
        // 3R rows: 3R/2 - 1.
        assert_eq!(instruction_negatives_per_row(None, 12), 5);
        assert_eq!(instruction_negatives_per_row(None, 9), 3);
        // One record (3 rows): 3/2 - 1 = 0, raised to 1.
        assert_eq!(instruction_negatives_per_row(None, 3), 1);
        // A configured K larger than a short last batch holds: all its other rows.
        assert_eq!(instruction_negatives_per_row(Some(8), 6), 5);
        assert_eq!(instruction_negatives_per_row(Some(4), 12), 4);
    }

    #[test]
    fn interaction_two_takes_every_other_row_and_tiny_batches_are_errors() {
        let cross = Interaction::CrossAttention(CrossAttentionConfig::default());
        let mut rng = ChaCha8Rng::seed_from_u64(0);
        assert_eq!(
            instruction_rows(&cross, 3, &mut rng).unwrap(),
            vec![vec![1, 2], vec![0, 2], vec![0, 1]]
        );
        assert!(matches!(all_other_rows(1), Err(Error::Batch(_))));
        let one = Interaction::SelfAttention {
            template: QueryTemplate::default(),
            instruction_negatives: None,
        };
        assert!(matches!(
            instruction_rows(&one, 1, &mut rng),
            Err(Error::Batch(_))
        ));
    }

    proptest! {
        #[test]
        fn sampled_rows_are_distinct_others_and_seeded(
            n in 2usize..20,
            seed in any::<u64>(),
            kk in 0usize..100,
        ) {
            let k = 1 + kk % (n - 1);
            let a = sample_other_rows(n, k, &mut ChaCha8Rng::seed_from_u64(seed)).unwrap();
            let b = sample_other_rows(n, k, &mut ChaCha8Rng::seed_from_u64(seed)).unwrap();
            prop_assert_eq!(&a, &b);
            for (i, list) in a.iter().enumerate() {
                prop_assert_eq!(list.len(), k);
                let mut s = list.clone();
                s.sort();
                s.dedup();
                prop_assert_eq!(s.len(), k);
                prop_assert!(list.iter().all(|&j| j != i && j < n));
            }
            prop_assert!(sample_other_rows(n, n, &mut ChaCha8Rng::seed_from_u64(seed)).is_err());
        }

        /// Under Interaction I, the lists have the rule's length whatever K is asked for.
        #[test]
        fn interaction_one_lists_follow_the_rule(
            n in 2usize..30,
            configured in proptest::option::of(1usize..40),
            seed in any::<u64>(),
        ) {
            let interaction = Interaction::SelfAttention {
                template: QueryTemplate::default(),
                instruction_negatives: configured,
            };
            let mut rng = ChaCha8Rng::seed_from_u64(seed);
            let lists = instruction_rows(&interaction, n, &mut rng).unwrap();
            let want = configured.unwrap_or(n / 2 - usize::from(n / 2 > 0)).max(1).min(n - 1);
            prop_assert_eq!(lists.len(), n);
            prop_assert!(lists.iter().all(|l| l.len() == want));
        }
    }
}
