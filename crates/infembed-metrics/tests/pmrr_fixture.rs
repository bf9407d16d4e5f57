//! Acceptance: reproduce the 200 FollowIR-style cases of `tests/fixtures/pmrr/cases.json`, whose
//! expected values mteb 2.26.24 computed (`calculate_pmrr` and `evaluate_p_mrr_change`).
//!
//! The fixture keys the runs `qN-og` / `qN-changed` and `changed_docs` by bare `qN` (mteb's
//! convention); the library takes plain query ids, so the suffixes are stripped here.

use std::path::PathBuf;

use infembed_metrics::{EvalOptions, Measure, Qrels, Run, TieBreak, evaluate_with, p_mrr};
use serde_json::Value;

fn cases() -> Vec<Value> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/pmrr/cases.json");
    let text = std::fs::read_to_string(path).expect("fixture present");
    let root: Value = serde_json::from_str(&text).unwrap();
    let cases = root["cases"].as_array().unwrap().clone();
    assert_eq!(cases.len(), 200);
    cases
}

/// A run from the fixture's `{query-suffix: {doc: score}}`, with `suffix` removed from ids.
fn run(value: &Value, suffix: &str) -> Run {
    let queries = value.as_object().unwrap().iter().map(|(q, docs)| {
        let q = q
            .strip_suffix(suffix)
            .unwrap_or_else(|| panic!("{q} lacks {suffix}"));
        let docs = docs
            .as_object()
            .unwrap()
            .iter()
            .map(|(d, s)| (d.clone(), s.as_f64().unwrap()));
        (q.to_owned(), docs.collect::<Vec<_>>())
    });
    Run::from_nested(queries).unwrap()
}

fn og_qrels(value: &Value) -> Qrels {
    let queries = value.as_object().unwrap().iter().filter_map(|(q, docs)| {
        let q = q.strip_suffix("-og")?;
        let docs = docs
            .as_object()
            .unwrap()
            .iter()
            .map(|(d, l)| (d.clone(), l.as_i64().unwrap() as i32));
        Some((q.to_owned(), docs.collect::<Vec<_>>()))
    });
    Qrels::from_nested(queries).unwrap()
}

fn changed_docs(value: &Value) -> Vec<(String, Vec<String>)> {
    value
        .as_object()
        .unwrap()
        .iter()
        .map(|(q, docs)| {
            let docs = docs
                .as_array()
                .unwrap()
                .iter()
                .map(|d| d.as_str().unwrap().to_owned());
            (q.clone(), docs.collect())
        })
        .collect()
}

#[test]
fn p_mrr_matches_mteb_on_every_case() {
    for (i, case) in cases().iter().enumerate() {
        let og = run(&case["og_run"], "-og");
        let changed = run(&case["changed_run"], "-changed");
        let docs = changed_docs(&case["changed_docs"]);
        let expected = case["expected"]["p_mrr"].as_f64().unwrap();
        for tie in [TieBreak::DocIdDescending, TieBreak::TrecEval] {
            let result = p_mrr(&og, &changed, docs.clone(), tie);
            assert!(result.missing_queries.is_empty());
            let got = result.mean.expect("every case has changed documents");
            assert!(
                (got - expected).abs() < 1e-9,
                "case {i} ({tie:?}): {got} vs {expected}"
            );
        }
    }
}

#[test]
fn og_metrics_match_mteb_on_every_case() {
    // mteb gets map/ndcg/recall from pytrec_eval (trec_eval's rule) and rounds them to 5 decimals;
    // its mrr_at_10 is its own Python sort (f64 scores, ties by doc id descending), unrounded.
    let trec = [
        ("map_at_1000", Measure::MapCut(1000)),
        ("ndcg_at_5", Measure::NdcgCut(5)),
        ("ndcg_at_10", Measure::NdcgCut(10)),
        ("recall_at_10", Measure::Recall(10)),
    ];
    let mut compared = 0;
    for (i, case) in cases().iter().enumerate() {
        let og = run(&case["og_run"], "-og");
        let qrels = og_qrels(&case["qrels"]);
        let expected = &case["expected"]["og"];
        let measures: Vec<Measure> = trec.iter().map(|t| t.1).collect();
        let eval = evaluate_with(&qrels, &og, &measures, &EvalOptions::default()).unwrap();
        assert_eq!(eval.num_queries(), og.len());
        for (name, measure) in trec {
            let want = expected[name].as_f64().unwrap();
            let got = eval.mean(measure).unwrap();
            assert!(
                (got - want).abs() <= 1e-5,
                "case {i} {name}: {got} vs {want}"
            );
            compared += 1;
        }
        let mteb_sort = EvalOptions {
            tie_break: TieBreak::DocIdDescending,
            ..Default::default()
        };
        let eval = evaluate_with(&qrels, &og, &[Measure::RecipRankCut(10)], &mteb_sort).unwrap();
        let want = expected["mrr_at_10"].as_f64().unwrap();
        let got = eval.mean(Measure::RecipRankCut(10)).unwrap();
        assert!(
            (got - want).abs() < 1e-9,
            "case {i} mrr_at_10: {got} vs {want}"
        );
        compared += 1;
    }
    assert_eq!(compared, 200 * 5);
}

#[test]
fn ascending_tie_rule_would_not_reproduce_mteb() {
    // Guards the tie rule: the fixture includes ties, and ascending ids give other values.
    let differing = cases()
        .iter()
        .filter(|case| {
            let og = run(&case["og_run"], "-og");
            let changed = run(&case["changed_run"], "-changed");
            let docs = changed_docs(&case["changed_docs"]);
            let got = p_mrr(&og, &changed, docs, TieBreak::DocIdAscending)
                .mean
                .unwrap();
            (got - case["expected"]["p_mrr"].as_f64().unwrap()).abs() > 1e-9
        })
        .count();
    assert!(differing > 0);
}
