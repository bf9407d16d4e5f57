//! Property tests against naive reference implementations written here, independently of the
//! library: a full sort of every query, then each measure straight from its definition.

use std::collections::BTreeMap;

use infembed_metrics::{
    EvalOptions, Measure, Qrels, Run, TieBreak, evaluate_with, p_mrr, p_mrr_document_score,
};
use proptest::prelude::*;

/// One query of a generated test: run scores and judgements by document number.
#[derive(Debug, Clone)]
struct Query {
    run: BTreeMap<usize, f64>,
    qrels: BTreeMap<usize, i32>,
    in_run: bool,
    in_qrels: bool,
}

fn doc(i: usize) -> String {
    // "d1" < "d10" < "d2" in byte order: exercises the tie rule's string order.
    format!("d{i}")
}

fn score() -> impl Strategy<Value = f64> {
    prop_oneof![
        (0..4i32).prop_map(|x| f64::from(x) * 0.5),
        -1.0f64..1.0,
        Just(0.3),
        Just(0.3 + 1e-12), // equal to 0.3 in f32: a tie for trec_eval only
        Just(0.0),
        Just(-0.0),
    ]
}

fn queries() -> impl Strategy<Value = Vec<Query>> {
    let query = (
        prop::collection::btree_map(0..30usize, score(), 0..25),
        prop::collection::btree_map(0..34usize, -1..4i32, 0..12),
        prop::bool::weighted(0.85),
        prop::bool::weighted(0.85),
    )
        .prop_map(|(run, qrels, in_run, in_qrels)| Query {
            run,
            qrels,
            in_run,
            in_qrels,
        });
    prop::collection::vec(query, 1..5)
}

fn run_entries(queries: &[Query]) -> Vec<(String, String, f64)> {
    let mut entries = Vec::new();
    for (q, query) in queries.iter().enumerate().filter(|(_, q)| q.in_run) {
        for (&d, &s) in &query.run {
            entries.push((format!("q{q}"), doc(d), s));
        }
    }
    entries
}

fn qrels_of(queries: &[Query]) -> Qrels {
    let judged = queries
        .iter()
        .enumerate()
        .filter(|(_, q)| q.in_qrels)
        .map(|(q, query)| {
            (
                format!("q{q}"),
                query
                    .qrels
                    .iter()
                    .map(|(&d, &l)| (doc(d), l))
                    .collect::<Vec<_>>(),
            )
        });
    Qrels::from_nested(judged).unwrap()
}

/// Naive ranking: a full sort by the tie rule, written out directly.
fn naive_ranking(run: &BTreeMap<usize, f64>, tie: TieBreak) -> Vec<String> {
    let mut docs: Vec<(String, f64)> = run.iter().map(|(&d, &s)| (doc(d), s)).collect();
    docs.sort_by(|a, b| {
        let by_score = match tie {
            TieBreak::TrecEval => (b.1 as f32).partial_cmp(&(a.1 as f32)).unwrap(),
            _ => b.1.partial_cmp(&a.1).unwrap(),
        };
        by_score.then_with(|| match tie {
            TieBreak::DocIdAscending => a.0.cmp(&b.0),
            _ => b.0.cmp(&a.0),
        })
    });
    docs.into_iter().map(|(d, _)| d).collect()
}

/// The value of `measure` from its definition, with documents labelled `level` or more
/// relevant for the binary measures (trec_eval's `-l`; nDCG's gains stay the labels).
fn naive_value(
    measure: Measure,
    ranked: &[String],
    qrels: &BTreeMap<usize, i32>,
    level: i32,
) -> f64 {
    let label = |d: &str| -> i32 {
        qrels
            .iter()
            .find(|(k, _)| doc(**k) == d)
            .map_or(0, |(_, l)| *l)
    };
    let relevant = |d: &str| label(d) >= level;
    let num_rel = qrels.values().filter(|&&l| l >= level).count();
    let rel_in_top = |k: usize| ranked.iter().take(k).filter(|d| relevant(d)).count();
    let div = |x: f64| {
        if num_rel == 0 {
            0.0
        } else {
            x / num_rel as f64
        }
    };
    let ap = |k: usize| {
        let mut total = 0.0;
        for (i, d) in ranked.iter().enumerate().take(k) {
            if relevant(d) {
                total += rel_in_top(i + 1) as f64 / (i + 1) as f64;
            }
        }
        div(total)
    };
    let first_rel = ranked.iter().position(|d| relevant(d)).map(|i| i + 1);
    let ndcg = |k: usize| {
        let mut dcg = 0.0;
        for (i, d) in ranked.iter().take(k).enumerate() {
            dcg += f64::from(label(d).max(0)) / ((i + 2) as f64).log2();
        }
        let mut gains: Vec<i32> = qrels.values().copied().filter(|&l| l > 0).collect();
        gains.sort_by(|a, b| b.cmp(a));
        let mut ideal = 0.0;
        for (i, g) in gains.iter().take(k).enumerate() {
            ideal += f64::from(*g) / ((i + 2) as f64).log2();
        }
        if ideal > 0.0 { dcg / ideal } else { 0.0 }
    };
    match measure {
        Measure::Map => ap(usize::MAX),
        Measure::MapCut(k) => ap(k),
        Measure::Ndcg => ndcg(usize::MAX),
        Measure::NdcgCut(k) => ndcg(k),
        Measure::RecipRank => first_rel.map_or(0.0, |r| 1.0 / r as f64),
        Measure::RecipRankCut(k) => first_rel
            .filter(|&r| r <= k)
            .map_or(0.0, |r| 1.0 / r as f64),
        Measure::P(k) => rel_in_top(k) as f64 / k as f64,
        Measure::Recall(k) => div(rel_in_top(k) as f64),
        Measure::Rprec => div(rel_in_top(num_rel) as f64),
        Measure::Success(k) => f64::from(u8::from(first_rel.is_some_and(|r| r <= k))),
        Measure::NumRel => num_rel as f64,
        Measure::NumRet => ranked.len() as f64,
        Measure::NumRelRet => rel_in_top(usize::MAX) as f64,
    }
}

fn measures() -> Vec<Measure> {
    Measure::parse_list(
        "map map_cut_3 map_cut_10 ndcg ndcg_cut_1 ndcg_cut_5 ndcg_cut_10 recip_rank \
         recip_rank_cut_3 P_1 P_5 P_30 recall_5 recall_10 Rprec success_1 success_5 \
         num_rel num_ret num_rel_ret",
    )
    .unwrap()
}

fn tie_rule() -> impl Strategy<Value = TieBreak> {
    prop::sample::select(vec![
        TieBreak::TrecEval,
        TieBreak::DocIdDescending,
        TieBreak::DocIdAscending,
    ])
}

/// Naive p-MRR: ranks from full sorts, absent documents at (number ranked + 1).
fn naive_p_mrr(
    og: &BTreeMap<String, BTreeMap<usize, f64>>,
    changed: &BTreeMap<String, BTreeMap<usize, f64>>,
    changed_docs: &BTreeMap<String, Vec<usize>>,
    tie: TieBreak,
) -> Option<f64> {
    let rank = |run: &BTreeMap<usize, f64>, d: usize| {
        let ranked = naive_ranking(run, tie);
        ranked
            .iter()
            .position(|x| *x == doc(d))
            .map_or(ranked.len() + 1, |i| i + 1)
    };
    let mut per_query = Vec::new();
    for (q, docs) in changed_docs {
        let (Some(o), Some(n)) = (og.get(q), changed.get(q)) else {
            continue;
        };
        if docs.is_empty() {
            continue;
        }
        let scores: Vec<f64> = docs
            .iter()
            .map(|&d| {
                let (ro, rn) = (rank(o, d) as f64, rank(n, d) as f64);
                if ro >= rn {
                    rn / ro - 1.0
                } else {
                    1.0 - ro / rn
                }
            })
            .collect();
        per_query.push(scores.iter().sum::<f64>() / scores.len() as f64);
    }
    if per_query.is_empty() {
        None
    } else {
        Some(per_query.iter().sum::<f64>() / per_query.len() as f64)
    }
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-12 * (1.0 + a.abs().max(b.abs()))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn evaluate_matches_naive_reference(
        queries in queries(),
        tie in tie_rule(),
        complete in any::<bool>(),
        level in prop::sample::select(vec![1, 1, 2, 3]),
        judged_only in prop::bool::weighted(0.3),
        max_docs in prop::option::weighted(0.3, 1..20usize),
    ) {
        let run = Run::from_entries(run_entries(&queries)).unwrap();
        let qrels = qrels_of(&queries);
        let measures = measures();
        let options = EvalOptions {
            tie_break: tie,
            complete,
            parallel: false,
            relevance_level: level,
            judged_only,
            max_docs,
        };
        let eval = evaluate_with(&qrels, &run, &measures, &options).unwrap();
        let mut expected_queries = Vec::new();
        for (q, query) in queries.iter().enumerate() {
            let id = format!("q{q}");
            // A query without documents does not appear in a run at all.
            let in_run = query.in_run && !query.run.is_empty();
            if !query.in_qrels || !(in_run || complete) {
                prop_assert!(eval.query_values(&id).is_none(), "{id} should not be evaluated");
                continue;
            }
            expected_queries.push(id.clone());
            let empty = BTreeMap::new();
            let mut ranked = naive_ranking(if in_run { &query.run } else { &empty }, tie);
            // trec_eval's -J (judged documents only; a negative label reads as unjudged),
            // then -M (the first max_docs).
            if judged_only {
                ranked.retain(|d| query.qrels.iter().any(|(k, &l)| doc(*k) == *d && l >= 0));
            }
            if let Some(m) = max_docs {
                ranked.truncate(m);
            }
            for &m in &measures {
                let want = naive_value(m, &ranked, &query.qrels, level);
                let got = eval.value(&id, m).unwrap();
                prop_assert!(close(got, want), "{id} {m}: got {got}, want {want}");
                if !m.is_count() {
                    prop_assert!((0.0..=1.0).contains(&got), "{m} = {got} out of [0, 1]");
                }
            }
        }
        prop_assert_eq!(eval.query_ids(), &expected_queries[..]);
        for &m in &measures {
            match eval.mean(m) {
                None => prop_assert!(expected_queries.is_empty()),
                Some(mean) => {
                    let sum: f64 = expected_queries.iter().map(|q| eval.value(q, m).unwrap()).sum();
                    prop_assert!(close(mean, sum / expected_queries.len() as f64));
                }
            }
        }
    }

    #[test]
    fn input_order_and_parallelism_change_nothing(
        (queries, shuffled) in queries().prop_flat_map(|qs| {
            let entries = run_entries(&qs);
            (Just(qs), Just(entries).prop_shuffle())
        }),
        tie in tie_rule(),
    ) {
        let qrels = qrels_of(&queries);
        let measures = measures();
        let run = Run::from_entries(run_entries(&queries)).unwrap();
        let run_shuffled = Run::from_entries(shuffled).unwrap();
        let seq = EvalOptions { tie_break: tie, complete: false, parallel: false, ..EvalOptions::default() };
        let par = EvalOptions { parallel: true, ..seq };
        let a = evaluate_with(&qrels, &run, &measures, &seq).unwrap();
        let b = evaluate_with(&qrels, &run_shuffled, &measures, &seq).unwrap();
        let c = evaluate_with(&qrels, &run_shuffled, &measures, &par).unwrap();
        prop_assert_eq!(&a, &b);
        prop_assert_eq!(&a, &c);
        // Rankings too: the same documents in the same order whatever the input order.
        for (q, docs) in run.queries() {
            let other = run_shuffled.query(q).unwrap();
            let x: Vec<_> = docs.ranking(tie).iter().map(|e| e.doc.to_owned()).collect();
            let y: Vec<_> = other.ranking(tie).iter().map(|e| e.doc.to_owned()).collect();
            prop_assert_eq!(x, y);
        }
    }

    #[test]
    fn ranking_and_rank_of_match_naive_sort(run in prop::collection::btree_map(0..30usize, score(), 0..25), tie in tie_rule()) {
        let built = Run::from_nested([("q", run.iter().map(|(&d, &s)| (doc(d), s)).collect::<Vec<_>>())]).unwrap();
        let docs = built.query("q").unwrap();
        let naive = naive_ranking(&run, tie);
        let ours: Vec<String> = docs.ranking(tie).iter().map(|e| e.doc.to_owned()).collect();
        prop_assert_eq!(&ours, &naive);
        for (i, d) in naive.iter().enumerate() {
            prop_assert_eq!(docs.rank_of(d, tie), Some(i + 1));
        }
    }

    #[test]
    fn p_mrr_matches_naive_and_its_invariants(
        og in prop::collection::btree_map("q[0-3]", prop::collection::btree_map(0..20usize, score(), 0..15), 0..4),
        changed in prop::collection::btree_map("q[0-3]", prop::collection::btree_map(0..20usize, score(), 0..15), 0..4),
        changed_docs in prop::collection::btree_map("q[0-4]", prop::collection::vec(0..22usize, 0..4), 0..5),
        tie in tie_rule(),
    ) {
        let to_run = |m: &BTreeMap<String, BTreeMap<usize, f64>>| {
            Run::from_nested(m.iter().map(|(q, docs)| (q.clone(), docs.iter().map(|(&d, &s)| (doc(d), s)).collect::<Vec<_>>()))).unwrap()
        };
        let (og_run, changed_run) = (to_run(&og), to_run(&changed));
        let listed: Vec<(String, Vec<String>)> =
            changed_docs.iter().map(|(q, ds)| (q.clone(), ds.iter().map(|&d| doc(d)).collect())).collect();
        let forward = p_mrr(&og_run, &changed_run, listed.clone(), tie);
        let backward = p_mrr(&changed_run, &og_run, listed, tie);
        let want = naive_p_mrr(&og, &changed, &changed_docs, tie);
        match (forward.mean, want) {
            (None, None) => {}
            (Some(got), Some(want)) => prop_assert!(close(got, want), "got {got}, want {want}"),
            other => prop_assert!(false, "mean mismatch {other:?}"),
        }
        prop_assert_eq!(forward.documents.len(), backward.documents.len());
        for (f, b) in forward.documents.iter().zip(&backward.documents) {
            prop_assert!(f.score > -1.0 && f.score < 1.0, "score {} outside (-1, 1)", f.score);
            prop_assert_eq!((&f.query, &f.doc), (&b.query, &b.doc));
            prop_assert_eq!((f.og_rank, f.changed_rank), (b.changed_rank, b.og_rank));
            prop_assert_eq!(f.score, -b.score);
            prop_assert_eq!(f.score, p_mrr_document_score(f.og_rank, f.changed_rank));
        }
        if let Some(mean) = forward.mean {
            prop_assert!(mean > -1.0 && mean < 1.0);
        }
    }
}

#[test]
fn p_mrr_document_score_follows_the_definition() {
    // Moved up from 4 to 2: 2/4 - 1; moved down from 2 to 4: 1 - 2/4; unchanged: 0.
    assert_eq!(p_mrr_document_score(4, 2), -0.5);
    assert_eq!(p_mrr_document_score(2, 4), 0.5);
    assert_eq!(p_mrr_document_score(3, 3), 0.0);
}
