//! `infembed trec-eval` with trec_eval's own command line, checked against trec_eval's own
//! test outputs (NIST's test suite, vendored in the metrics crate's fixtures): the lines it
//! prints are trec_eval's lines, in trec_eval's order.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn suite(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../infembed-metrics/tests/fixtures/trec_eval")
        .join(name)
}

/// `infembed trec-eval ARGS QRELS RUN`'s process output.
fn run_trec_eval(args: &[&str], qrels: &Path, run: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_infembed"))
        .arg("trec-eval")
        .args(args)
        .arg(qrels)
        .arg(run)
        .output()
        .unwrap()
}

/// Standard output of `infembed trec-eval ARGS` on the test suite, which must succeed.
fn trec_eval(args: &[&str]) -> String {
    let out = run_trec_eval(args, &suite("qrels.test"), &suite("results.test"));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// trec_eval's lines of `file` whose measure is one of `names` (and, with `all_only`, whose
/// query is `all`), in file order.
fn expected(file: &str, names: &[&str], all_only: bool) -> Vec<String> {
    std::fs::read_to_string(suite(file))
        .unwrap()
        .lines()
        .filter(|l| {
            let mut cols = l.split('\t');
            let measure = cols.next().unwrap_or("").trim_end();
            let query = cols.next().unwrap_or("");
            names.contains(&measure) && (!all_only || query == "all")
        })
        .map(str::to_string)
        .collect()
}

/// Every line of `got` is a line of trec_eval's `file`, in the file's order.
fn assert_subsequence(got: &str, file: &str) {
    let want: Vec<String> = std::fs::read_to_string(suite(file))
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect();
    let mut at = 0;
    for line in got.lines() {
        let found = want[at..].iter().position(|w| w == line);
        assert!(
            found.is_some(),
            "not a line of {file}, or out of order: {line:?}"
        );
        at += found.unwrap() + 1;
    }
}

#[test]
fn repeated_measures_with_cutoff_parameters_print_as_trec_eval() {
    // `trec_eval -q -m map -m ndcg_cut.10` (out.test.aq is `trec_eval -q -m all_trec`), the
    // measures asked in the other order.
    let got = trec_eval(&["-q", "-m", "ndcg_cut.10", "-m", "map"]);
    let got: Vec<&str> = got.lines().collect();
    let want = expected("out.test.aq", &["map", "ndcg_cut_10"], false);
    assert_eq!(got, want);
    assert_eq!(got.len(), 8, "3 queries and the summary, 2 measures");

    // Several cut-offs in one argument, and this tool's spelling.
    let got = trec_eval(&["-m", "P.5,10", "-m", "ndcg_cut_5"]);
    let got: Vec<&str> = got.lines().collect();
    let want = expected("out.test.aq", &["P_5", "P_10", "ndcg_cut_5"], true);
    assert_eq!(got, want);
    assert_eq!(got.len(), 3);
}

#[test]
fn no_summary_prints_the_per_query_lines_only() {
    // `trec_eval -n -q -m all_trec` is out.test.aq without its `all` lines; without `-q`,
    // `-n` prints nothing, as trec_eval does.
    let got = trec_eval(&["-n", "-q", "-m", "map", "-m", "P.5"]);
    let got: Vec<&str> = got.lines().collect();
    let want = expected("out.test.aq", &["map", "P_5"], false);
    let want: Vec<&str> = want
        .iter()
        .map(String::as_str)
        .filter(|l| l.split('\t').nth(1) != Some("all"))
        .collect();
    assert_eq!(got, want);
    assert_eq!(got.len(), 6, "3 queries, 2 measures");
    let got = trec_eval(&["--nosummary", "-m", "official"]);
    assert_eq!(got, "");
}

#[test]
fn the_measure_sets_print_trec_evals_lines_in_its_order() {
    // `-q -m all_trec`: per query, then runid, num_q and the summary; trec_eval prints more
    // measures (bpref, gm_map, ...), which this tool does not compute.
    let got = trec_eval(&["-q", "-m", "all_trec"]);
    assert_subsequence(&got, "out.test.aq");
    let per_set = 6 + 9 + 9 + 1 + 9 + 9 + 3;
    assert_eq!(got.lines().count(), 3 * per_set + 2 + per_set);
    assert!(got.contains("\nrunid                 \tall\tSTANDARD\nnum_q "));

    // No `-m`: trec_eval's default, the `official` set (out.test is its output).
    let got = trec_eval(&[]);
    assert_subsequence(&got, "out.test");
    assert!(got.starts_with("runid                 \tall\tSTANDARD\nnum_q "));
    assert_eq!(got.lines().count(), 2 + 6 + 9);
}

/// `-l 2` and `-J` as trec_eval computes them (the metrics crate's fixture made with
/// trec_eval's C code), and `-M` as the run cut to its first documents.
#[test]
fn relevance_level_judged_only_and_max_docs() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../infembed-metrics/tests/fixtures/trec_eval_options");
    let expected: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("expected.json")).unwrap()).unwrap();
    let case = expected["cases"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["relevance_level"] == 2 && c["judged_only"] == true)
        .unwrap();
    let out = run_trec_eval(
        &["-q", "-l2", "-J", "-m", "map", "-m", "num_ret"],
        &dir.join("qrels.graded"),
        &suite("results.test"),
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    for (q, values) in case["values"].as_object().unwrap() {
        let want_map = format!("{:.4}", values["map"].as_f64().unwrap());
        let want_ret = format!("{}", values["num_ret"].as_f64().unwrap() as u64);
        assert!(
            text.lines()
                .any(|l| l.starts_with("map ") && l.ends_with(&format!("\t{q}\t{want_map}"))),
            "{q} map {want_map}:\n{text}"
        );
        assert!(
            text.lines()
                .any(|l| l.starts_with("num_ret ") && l.ends_with(&format!("\t{q}\t{want_ret}"))),
            "{q} num_ret {want_ret}:\n{text}"
        );
    }

    // -M 10: num_ret is 10 per query and P_10 is unchanged (it only sees the first ten).
    let full = trec_eval(&["-q", "-m", "P.10"]);
    let cut = trec_eval(&["-q", "-M", "10", "-m", "P.10", "-m", "num_ret"]);
    for line in full.lines() {
        assert!(cut.contains(line), "{line} missing from -M 10:\n{cut}");
    }
    assert_eq!(
        cut.lines()
            .filter(|l| l.starts_with("num_ret ") && l.ends_with("\t10"))
            .count(),
        3
    );
    assert!(cut.contains("num_ret               \tall\t30"));
}

#[test]
fn unknown_measures_are_named() {
    let out = run_trec_eval(
        &["-m", "ndcg_cut.x"],
        &suite("qrels.test"),
        &suite("results.test"),
    );
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("ndcg_cut.x"), "{err}");
}
