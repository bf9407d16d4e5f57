//! The classic collections in the project's shared data (`../shared/data`, or
//! `$INFEMBED_SHARED_DATA`), and the vendored copy of `msmarco-subset` (`data/msmarco-subset`).
//! A test that needs the shared data skips when it is absent (recorded, counted by
//! `cargo xtask skips`), and fails under `CI=true`.
//!
//! Expected counts come from `shared/data/README.md` (documents, queries, judged queries) and from
//! counting the qrels files' non-blank lines with standard tools (`wc -l`; Cranfield's last line
//! has no newline, so `wc -l` says 1,836 for its 1,837 lines).

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use infembed_data::{Collection, EvalSet};

/// The shared data; when absent, `None` after a recorded skip, or a failure under `CI=true`.
fn shared(test: &str) -> Option<PathBuf> {
    infembed_testkit::shared_data_dir(test)
}

/// The vendored copy of `msmarco-subset` (`data/msmarco-subset`, always in the repository).
fn vendored_msmarco() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../data/msmarco-subset")
}

/// Counts non-blank lines of a file, independently of the loaders.
fn nonblank_lines(path: &Path) -> usize {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .filter(|l| !l.trim().is_empty())
        .count()
}

/// Checks the counts and the internal consistency of a set: every judged document exists in the
/// corpus, every judged query exists among the queries, ids are unique.
fn check(set: &EvalSet, docs: usize, queries: usize, judged: usize, judgments: usize) {
    assert_eq!(set.corpus.len(), docs, "{} documents", set.name);
    assert_eq!(set.queries.len(), queries, "{} queries", set.name);
    assert_eq!(set.judged_queries(), judged, "{} judged queries", set.name);
    assert_eq!(set.judgment_count(), judgments, "{} judgments", set.name);
    let doc_ids: HashSet<&str> = set.corpus.iter().map(|d| d.id.as_str()).collect();
    let query_ids: HashSet<&str> = set.queries.iter().map(|q| q.id.as_str()).collect();
    assert_eq!(doc_ids.len(), docs);
    assert_eq!(query_ids.len(), queries);
    for (q, judged_docs) in &set.qrels {
        assert!(
            query_ids.contains(q.as_str()),
            "{}: judged query {q} unknown",
            set.name
        );
        for d in judged_docs.keys() {
            assert!(
                doc_ids.contains(d.as_str()),
                "{}: judged doc {d} unknown",
                set.name
            );
        }
    }
    assert!(set.queries.iter().all(|q| !q.text.trim().is_empty()));
}

#[test]
fn cacm() {
    let Some(root) = shared("cacm") else {
        return;
    };
    let set = Collection::Cacm.load_from_root(&root).unwrap();
    let qrels_lines = nonblank_lines(&root.join("collections/cacm/qrels.cacm.txt"));
    assert_eq!(qrels_lines, 796);
    check(&set, 3204, 64, 52, qrels_lines);
    assert!(set.corpus.iter().any(|d| d.id == "CACM-2636"));
    // `cacm.jsonl` writes `CACM-0046`; the qrels (and so the loader) say `CACM-46`.
    assert!(set.corpus.iter().any(|d| d.id == "CACM-46"));
    assert!(set.qrels.values().any(|d| d.contains_key("CACM-46")));
    let q4 = set.queries.iter().find(|q| q.id == "4").unwrap();
    assert!(
        q4.text
            .starts_with("I'm interested in mechanisms for communicating")
    );
    assert!(set.qrels["1"].contains_key("CACM-1410"));
}

#[test]
fn cisi() {
    let Some(root) = shared("cisi") else {
        return;
    };
    let set = Collection::Cisi.load_from_root(&root).unwrap();
    let qrels_lines = nonblank_lines(&root.join("collections/cisi/CISI.REL"));
    assert_eq!(qrels_lines, 3114);
    check(&set, 1460, 112, 76, qrels_lines);
    assert_eq!(
        set.corpus[0].title,
        "18 Editions of the Dewey Decimal Classifications"
    );
    assert!(
        set.corpus[0]
            .text
            .starts_with("The present study is a history of the DEWEY")
    );
    assert!(set.qrels.values().flat_map(|d| d.values()).all(|&g| g == 1));
    assert!(set.qrels["1"].contains_key("28"));
}

#[test]
fn cranfield() {
    let Some(root) = shared("cranfield") else {
        return;
    };
    let set = Collection::Cranfield.load_from_root(&root).unwrap();
    let qrels_lines = nonblank_lines(&root.join("collections/cranfield/cranqrel"));
    assert_eq!(qrels_lines, 1837);
    check(&set, 1400, 225, 225, qrels_lines);
    // Query ids are positions: the file's third query is `.I 004`.
    assert_eq!(set.queries[2].id, "3");
    assert!(
        set.queries[2]
            .text
            .starts_with("what problems of heat conduction in composite slabs")
    );
    assert_eq!(set.queries[224].id, "225");
    // First and last qrels lines: `1 184 2`, `225 1188 -1`.
    assert_eq!(set.qrels["1"]["184"], 2);
    assert_eq!(set.qrels["225"]["1188"], -1);
    assert_eq!(
        set.corpus[0].title,
        "experimental investigation of the aerodynamics of a wing in a slipstream ."
    );
}

#[test]
fn vaswani_npl() {
    let Some(root) = shared("vaswani_npl") else {
        return;
    };
    let set = Collection::Vaswani.load_from_root(&root).unwrap();
    let qrels_lines = nonblank_lines(&root.join("collections/vaswani/qrels"));
    assert_eq!(qrels_lines, 2083);
    check(&set, 11429, 93, 93, qrels_lines);
    assert_eq!(set.corpus[0].id, "1");
    assert_eq!(
        set.corpus[0].text,
        "compact memories have flexible capacities a digital data storage system with capacity up to bits and random and or sequential access is described"
    );
    assert_eq!(
        set.queries[0].text,
        "MEASUREMENT OF DIELECTRIC CONSTANT OF LIQUIDS BY THE USE OF MICROWAVE TECHNIQUES"
    );
}

#[test]
fn msmarco_subset_beir_layout() {
    let dir = vendored_msmarco();
    let set = Collection::MsMarcoSubset.load(&dir).unwrap();
    let qrels_lines = nonblank_lines(&dir.join("qrels/test.tsv"));
    assert_eq!(qrels_lines, 1744); // header + 1,743 judgments
    check(&set, 1743, 1743, 1743, qrels_lines - 1);
    assert_eq!(set.name, "msmarco-subset");
    assert_eq!(set.qrels["320792"]["7067677"], 1);
}

#[test]
fn the_vendored_msmarco_subset_is_the_shared_one() {
    let Some(root) = shared("the_vendored_msmarco_subset_is_the_shared_one") else {
        return;
    };
    let shared_dir = root.join("collections/msmarco-subset");
    for file in ["corpus.jsonl", "queries.jsonl", "qrels/test.tsv"] {
        let a = std::fs::read(vendored_msmarco().join(file)).unwrap();
        let b = std::fs::read(shared_dir.join(file)).unwrap();
        assert!(
            a == b,
            "data/msmarco-subset/{file} differs from the shared copy"
        );
    }
    assert_eq!(
        Collection::MsMarcoSubset.load(vendored_msmarco()).unwrap(),
        Collection::MsMarcoSubset.load_from_root(&root).unwrap()
    );
}

#[test]
fn loading_all_collections_is_fast() {
    let Some(root) = shared("loading_all_collections_is_fast") else {
        return;
    };
    let start = std::time::Instant::now();
    let mut docs = 0;
    for c in Collection::ALL {
        let t = std::time::Instant::now();
        let n = c.load_from_root(&root).unwrap().corpus.len();
        eprintln!("{}: {n} documents in {:?}", c.folder(), t.elapsed());
        docs += n;
    }
    let elapsed = start.elapsed();
    eprintln!("loaded {docs} documents of all collections in {elapsed:?}");
    assert_eq!(docs, 3204 + 1460 + 1400 + 11429 + 1743);
    // Generous bound for an unoptimised test build on a slow machine.
    assert!(elapsed.as_secs() < 30, "{elapsed:?}");
}
