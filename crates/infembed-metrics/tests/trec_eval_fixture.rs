//! Acceptance: reproduce NIST trec_eval's own test outputs (vendored in `tests/fixtures/trec_eval`)
//! to the printed 4 decimals, parsing the expected files rather than copying numbers.

use std::collections::BTreeSet;
use std::path::PathBuf;

use infembed_metrics::{EvalOptions, Evaluation, Measure, Qrels, Run, evaluate, evaluate_with};

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/trec_eval")
        .join(name)
}

/// `(measure name, query id, printed value)` lines of a trec_eval output file.
fn expected_lines(name: &str) -> Vec<(String, String, String)> {
    let text = std::fs::read_to_string(fixture(name)).expect("fixture present");
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let cols: Vec<&str> = l.split('\t').map(str::trim).collect();
            assert_eq!(cols.len(), 3, "unexpected line in {name}: {l:?}");
            (cols[0].to_owned(), cols[1].to_owned(), cols[2].to_owned())
        })
        .collect()
}

fn load() -> (Qrels, Run) {
    let qrels = Qrels::read(fixture("qrels.test")).expect("qrels parse");
    let run = Run::read(fixture("results.test")).expect("run parse");
    (qrels, run)
}

/// Formats a value as trec_eval prints it: counts as integers, the rest with 4 decimals.
fn printed(measure: Measure, value: f64) -> String {
    if measure.is_count() {
        format!("{value:.0}")
    } else {
        format!("{value:.4}")
    }
}

/// Compares every line of `file` whose measure this crate implements; returns the set of
/// measure names compared (per query and in the summary).
fn check_file(file: &str, eval: &Evaluation) -> BTreeSet<String> {
    let mut compared = BTreeSet::new();
    let mut mismatches = Vec::new();
    for (name, query, expected) in expected_lines(file) {
        if name == "num_q" {
            assert_eq!(query, "all");
            assert_eq!(expected, eval.num_queries().to_string(), "num_q in {file}");
            compared.insert(name);
            continue;
        }
        let Ok(measure) = name.parse::<Measure>() else {
            continue;
        };
        let value = if query == "all" {
            eval.summary(measure)
        } else {
            eval.value(&query, measure)
        };
        let value = value.unwrap_or_else(|| panic!("{name} for {query} not evaluated"));
        let ours = printed(measure, value);
        if ours != expected {
            mismatches.push(format!(
                "{name} {query}: expected {expected}, got {ours} ({value})"
            ));
        }
        compared.insert(name);
    }
    assert!(
        mismatches.is_empty(),
        "{file}: mismatches:\n{}",
        mismatches.join("\n")
    );
    compared
}

fn all_measures() -> Vec<Measure> {
    let mut measures = Measure::trec_eval_all();
    // The extra parameterised measures of out.test.meas_params.
    measures.extend(
        Measure::parse_list("P_3 P_7 recall_2000 ndcg_cut_23 success_2 success_20").unwrap(),
    );
    measures
}

#[test]
fn reproduces_per_query_and_summary_output() {
    let (qrels, run) = load();
    let eval = evaluate(&qrels, &run, &all_measures()).unwrap();
    let compared = check_file("out.test.aq", &eval);
    for required in [
        "num_q",
        "map",
        "ndcg_cut_5",
        "ndcg_cut_10",
        "recip_rank",
        "P_5",
        "P_10",
        "num_rel",
        "num_rel_ret",
        "num_ret",
        "recall_5",
        "recall_10",
        "recall_1000",
        "map_cut_1000",
        "ndcg",
        "Rprec",
        "success_1",
        "success_10",
    ] {
        assert!(compared.contains(required), "{required} was not compared");
    }
    assert!(
        compared.len() >= 40,
        "only {} measures compared",
        compared.len()
    );
}

#[test]
fn reproduces_summary_file() {
    let (qrels, run) = load();
    let eval = evaluate(&qrels, &run, &all_measures()).unwrap();
    let compared = check_file("out.test", &eval);
    for required in [
        "map",
        "recip_rank",
        "P_5",
        "P_10",
        "num_rel",
        "num_rel_ret",
        "num_ret",
    ] {
        assert!(compared.contains(required), "{required} was not compared");
    }
}

#[test]
fn reproduces_parameterised_measures() {
    let (qrels, run) = load();
    let eval = evaluate(&qrels, &run, &all_measures()).unwrap();
    let compared = check_file("out.test.meas_params", &eval);
    for required in [
        "P_3",
        "P_7",
        "recall_2000",
        "ndcg_cut_23",
        "success_2",
        "success_20",
    ] {
        assert!(compared.contains(required), "{required} was not compared");
    }
}

#[test]
fn sequential_and_parallel_agree_bitwise() {
    let (qrels, run) = load();
    let measures = all_measures();
    let seq = evaluate_with(
        &qrels,
        &run,
        &measures,
        &EvalOptions {
            parallel: false,
            ..Default::default()
        },
    )
    .unwrap();
    let par = evaluate_with(
        &qrels,
        &run,
        &measures,
        &EvalOptions {
            parallel: true,
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(seq, par);
}

#[test]
fn trec_eval_text_output_reproduces_summary_lines() {
    let (qrels, run) = load();
    let measures =
        Measure::parse_list("num_ret num_rel num_rel_ret map recip_rank P_5 P_10").unwrap();
    let eval = evaluate(&qrels, &run, &measures).unwrap();
    let mut out = Vec::new();
    eval.write_trec_eval(&mut out, false).unwrap();
    let ours: Vec<(String, String, String)> = String::from_utf8(out)
        .unwrap()
        .lines()
        .map(|l| {
            let c: Vec<&str> = l.split('\t').map(str::trim).collect();
            (c[0].to_owned(), c[1].to_owned(), c[2].to_owned())
        })
        .collect();
    let expected = expected_lines("out.test");
    for line in &ours {
        assert!(expected.contains(line), "{line:?} is not in out.test");
    }
    assert_eq!(ours.len(), measures.len() + 1);
}

/// trec_eval's `-l` and `-J` on graded qrels (`fixtures/trec_eval_options`, values from
/// trec_eval's C code through pytrec_eval): every query and measure, to 1e-9.
#[test]
fn relevance_level_and_judged_only_match_trec_eval() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    let qrels = Qrels::read(dir.join("trec_eval_options/qrels.graded")).unwrap();
    let run = Run::read(dir.join("trec_eval/results.test")).unwrap();
    let expected: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(dir.join("trec_eval_options/expected.json")).unwrap(),
    )
    .unwrap();
    let mut checked = 0;
    let mut differ_by_option = false;
    for case in expected["cases"].as_array().unwrap() {
        let options = EvalOptions {
            relevance_level: case["relevance_level"].as_i64().unwrap() as i32,
            judged_only: case["judged_only"].as_bool().unwrap(),
            ..Default::default()
        };
        let values = case["values"].as_object().unwrap();
        let names: Vec<&String> = values
            .values()
            .next()
            .unwrap()
            .as_object()
            .unwrap()
            .keys()
            .collect();
        let measures: Vec<Measure> = names.iter().map(|n| n.parse().unwrap()).collect();
        let eval = evaluate_with(&qrels, &run, &measures, &options).unwrap();
        let plain = evaluate_with(&qrels, &run, &measures, &EvalOptions::default()).unwrap();
        for (q, per_measure) in values {
            for (name, want) in per_measure.as_object().unwrap() {
                let m: Measure = name.parse().unwrap();
                let want = want.as_f64().unwrap();
                let got = eval.value(q, m).unwrap();
                assert!(
                    (got - want).abs() <= 1e-9,
                    "{q} {name} at {:?}: got {got}, trec_eval {want}",
                    (options.relevance_level, options.judged_only)
                );
                differ_by_option |= (plain.value(q, m).unwrap() - got).abs() > 1e-6;
                checked += 1;
            }
        }
    }
    assert!(checked >= 4 * 3 * 15, "{checked} values");
    assert!(differ_by_option, "the options change the values");
}
