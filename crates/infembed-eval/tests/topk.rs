//! The one top-k routine against a naive full sort written here from the tie rules' definitions:
//! trec_eval's (scores compared as `f32`, ties by document id descending) and the harness's
//! (full precision, ties by id descending or ascending).

use infembed_eval::top_k;
use infembed_metrics::TieBreak;
use proptest::prelude::*;

/// Every entry sorted by the rule, then the first `k`.
fn naive(entries: &[(usize, f64)], ids: &[String], k: usize, tie: TieBreak) -> Vec<(usize, f64)> {
    let key = |s: f64| match tie {
        TieBreak::TrecEval => f64::from(s as f32),
        _ => s,
    };
    let mut all = entries.to_vec();
    all.sort_by(|a, b| {
        let by_score = key(b.1).partial_cmp(&key(a.1)).unwrap();
        let by_id = match tie {
            TieBreak::DocIdAscending => ids[a.0].cmp(&ids[b.0]),
            _ => ids[b.0].cmp(&ids[a.0]),
        };
        by_score.then(by_id)
    });
    all.truncate(k);
    all
}

fn tie_rule() -> impl Strategy<Value = TieBreak> {
    prop_oneof![
        Just(TieBreak::TrecEval),
        Just(TieBreak::DocIdDescending),
        Just(TieBreak::DocIdAscending),
    ]
}

proptest! {
    #[test]
    fn top_k_is_the_head_of_a_naive_full_sort(
        // Few distinct scores, so that ties are common; a tiny offset that only f64 sees.
        scores in proptest::collection::vec((0u8..4, any::<bool>()), 0..40),
        k in 0usize..45,
        tie in tie_rule(),
        subset_step in 1usize..3,
    ) {
        let ids: Vec<String> = (0..scores.len()).map(|i| format!("d{}", (i * 7) % 53)).collect();
        // Ids must be unique for a total order: make them so.
        let ids: Vec<String> = ids.iter().enumerate().map(|(i, d)| format!("{d}-{i}")).collect();
        let entries: Vec<(usize, f64)> = scores
            .iter()
            .enumerate()
            .step_by(subset_step)
            .map(|(i, &(s, nudge))| (i, f64::from(s) + if nudge { 1e-12 } else { 0.0 }))
            .collect();
        let got = top_k(entries.clone(), &ids, k, tie);
        prop_assert_eq!(got, naive(&entries, &ids, k, tie));
    }
}
