//! FollowIR (published layout, hand-made fixture) and BEIR loaders.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use infembed_data::load::beir::{read_qrels_jsonl, read_qrels_tsv};
use infembed_data::load::followir::read_top_ranked_jsonl;
use infembed_data::{Error, Problem, Qrels, QueryTemplate, changed_docs, load_beir, load_followir};

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/followir")
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

#[test]
fn followir_fixture_loads_in_published_layout() {
    let set = load_followir(fixture(), "test").unwrap();
    assert_eq!(set.name, "followir");
    assert_eq!(set.corpus.len(), 7);
    // Query 303 has no og judgments and is dropped, as mteb does.
    let ids: Vec<&str> = set.queries.iter().map(|q| q.id.as_str()).collect();
    assert_eq!(ids, ["301", "302"]);
    assert_eq!(set.queries[0].text, "Channel Tunnel financing");
    assert!(
        set.queries[1]
            .instruction_changed
            .starts_with("A relevant document describes the planned")
    );
    // Null and empty titles become empty.
    assert_eq!(set.corpus[1].title, "");
    assert_eq!(set.corpus[4].title, "");
    assert_eq!(set.corpus[0].title, "Tunnel Financing Row");
    assert_eq!(set.qrels_og["302"]["LA010189-0002"], 2);
    assert_eq!(set.qrels_changed["302"]["LA010189-0002"], 0);
    assert_eq!(set.qrels_og.values().map(HashMap::len).sum::<usize>(), 6);
    assert_eq!(set.changed_docs["301"], vec!["FBIS3-10169".to_string()]);
    assert_eq!(set.changed_docs["302"], vec!["LA010189-0002".to_string()]);
    let top = set.top_ranked.as_ref().unwrap();
    assert_eq!(
        top["301"],
        ["FBIS3-10082", "FBIS3-10169", "FR940104-0-00001", "FT911-3"]
    );
    assert_eq!(top["302"].len(), 4);
    // Views as plain eval sets.
    let og = set.og_eval_set();
    assert_eq!(
        og.queries[0].instruction.as_deref(),
        Some(set.queries[0].instruction_og.as_str())
    );
    assert_eq!(og.qrels, set.qrels_og);
    let changed = set.changed_eval_set();
    assert_eq!(changed.qrels, set.qrels_changed);
    // Default template: query, one space, instruction.
    assert_eq!(
        set.queries[0].render_og(&QueryTemplate::default()),
        format!("{} {}", set.queries[0].text, set.queries[0].instruction_og)
    );
}

#[test]
fn followir_accepts_jsonl_qrels_and_requires_files() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("core17-instructions");
    copy_dir(&fixture(), &root);
    // Replace the TSV qrels by Hugging Face JSONL exports with float scores.
    for folder in ["qrels_og", "qrels_changed"] {
        let tsv = root.join(folder).join("test.tsv");
        let text = std::fs::read_to_string(&tsv).unwrap();
        let mut out = String::new();
        for line in text.lines().skip(1) {
            let c: Vec<&str> = line.split('\t').collect();
            out.push_str(&format!(
                "{{\"query-id\": \"{}\", \"corpus-id\": \"{}\", \"score\": {}.0}}\n",
                c[0], c[1], c[2]
            ));
        }
        std::fs::write(root.join(folder).join("test.jsonl"), out).unwrap();
        std::fs::remove_file(tsv).unwrap();
    }
    std::fs::remove_file(root.join("top_ranked.jsonl")).unwrap();
    let from_jsonl = load_followir(&root, "test").unwrap();
    let reference = load_followir(fixture(), "test").unwrap();
    assert_eq!(from_jsonl.name, "core17-instructions");
    assert_eq!(from_jsonl.qrels_og, reference.qrels_og);
    assert_eq!(from_jsonl.qrels_changed, reference.qrels_changed);
    assert_eq!(from_jsonl.changed_docs, reference.changed_docs);
    assert!(from_jsonl.top_ranked.is_none());

    std::fs::remove_file(root.join("qrels_changed/test.jsonl")).unwrap();
    match load_followir(&root, "test").unwrap_err() {
        Error::MissingFile { path, .. } => assert!(path.ends_with("qrels_changed/test.tsv")),
        e => panic!("{e:?}"),
    }
    match load_followir(&root, "dev").unwrap_err() {
        Error::MissingFile { path, .. } => assert!(path.ends_with("qrels_og/dev.tsv")),
        e => panic!("{e:?}"),
    }
}

#[test]
fn followir_query_errors_name_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("x");
    copy_dir(&fixture(), &root);
    std::fs::write(
        root.join("queries.jsonl"),
        "{\"_id\": \"301\", \"text\": \"t\", \"instruction_og\": \"a\", \"instruction_changed\": \"b\"}\n{\"_id\": \"302\", \"text\": \"t\", \"instruction_og\": \"a\"}\n",
    )
    .unwrap();
    match load_followir(&root, "test").unwrap_err() {
        Error::Record {
            at, field, problem, ..
        } => {
            assert_eq!(at, infembed_data::Location::Line(2));
            assert_eq!(field, "instruction_changed");
            assert_eq!(problem, Problem::Missing);
        }
        e => panic!("{e:?}"),
    }
}

#[test]
fn top_ranked_accepts_lists_and_numbers() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("top_ranked.jsonl");
    std::fs::write(
        &p,
        "{\"qid\": 1, \"pid\": [\"a\", \"b\", 7]}\n{\"qid\": \"1\", \"pid\": \"b\"}\n{\"qid\": \"2\", \"pid\": \"c\"}\n",
    )
    .unwrap();
    let top = read_top_ranked_jsonl(&p).unwrap();
    assert_eq!(top["1"], ["a", "b", "7"]);
    assert_eq!(top["2"], ["c"]);
    std::fs::write(&p, "{\"qid\": \"1\", \"pid\": 1.5}\n").unwrap();
    assert!(matches!(
        read_top_ranked_jsonl(&p).unwrap_err(),
        Error::Record { ref field, .. } if field == "pid"
    ));
}

/// Naive changed-docs: loop over every og judgment, look the pair up in changed.
fn naive_changed(og: &Qrels, changed: &Qrels) -> HashMap<String, Vec<String>> {
    let mut out = HashMap::new();
    for (q, docs) in og {
        let mut v = Vec::new();
        for (d, g) in docs {
            let after = changed.get(q).and_then(|m| m.get(d)).copied();
            let still_relevant = matches!(after, Some(x) if x > 0);
            if *g > 0 && !still_relevant {
                v.push(d.clone());
            }
        }
        v.sort();
        out.insert(q.clone(), v);
    }
    out
}

proptest::proptest! {
    #[test]
    fn changed_docs_matches_naive(
        og in proptest::collection::vec((0u8..4, 0u8..6, -1i32..3), 0..40),
        ch in proptest::collection::vec((0u8..4, 0u8..6, -1i32..3), 0..40),
    ) {
        let build = |v: &Vec<(u8, u8, i32)>| {
            let mut q = Qrels::new();
            for (a, b, g) in v {
                q.entry(format!("q{a}")).or_default().insert(format!("d{b}"), *g);
            }
            q
        };
        let (og, ch) = (build(&og), build(&ch));
        proptest::prop_assert_eq!(changed_docs(&og, &ch), naive_changed(&og, &ch));
    }
}

fn write(path: &Path, text: &str) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, text).unwrap();
}

#[test]
fn beir_layout_loads() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("scifact");
    write(
        &root.join("corpus.jsonl"),
        "{\"_id\": \"d1\", \"title\": \"T1\", \"text\": \"alpha\", \"metadata\": {}}\n{\"_id\": 2, \"text\": \"beta\"}\n",
    );
    write(
        &root.join("queries.jsonl"),
        "{\"_id\": \"q1\", \"text\": \"what alpha\", \"metadata\": {\"x\": 1}}\n{\"_id\": \"q2\", \"text\": \"b\", \"instruction\": \"only beta\"}\n",
    );
    write(
        &root.join("qrels/test.tsv"),
        "query-id\tcorpus-id\tscore\nq1\td1\t1\nq2\t2\t2\n",
    );
    let set = load_beir(&root, "test").unwrap();
    assert_eq!(set.name, "scifact");
    assert_eq!(set.corpus.len(), 2);
    assert_eq!(set.corpus[1].id, "2");
    assert_eq!(set.corpus[0].full_text(), "T1 alpha");
    assert_eq!(set.corpus[1].full_text(), "beta");
    assert_eq!(set.queries[1].instruction.as_deref(), Some("only beta"));
    assert_eq!(set.qrels["q2"]["2"], 2);
    assert_eq!(set.judgment_count(), 2);
    assert_eq!(set.judged_queries(), 2);
    assert!(matches!(
        load_beir(&root, "dev").unwrap_err(),
        Error::MissingFile { .. }
    ));
}

#[test]
fn qrels_tsv_rules() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("q.tsv");
    // No header, float scores, whitespace separated, blank lines.
    std::fs::write(&p, "1 a 1.0\n\n1 b 0\n2 a -1\n").unwrap();
    let q = read_qrels_tsv(&p).unwrap();
    assert_eq!(q["1"]["a"], 1);
    assert_eq!(q["2"]["a"], -1);
    // A non-numeric score after the first line is an error with its line.
    std::fs::write(&p, "qid\tpid\tscore\n1\ta\t1\n1\tb\thigh\n").unwrap();
    match read_qrels_tsv(&p).unwrap_err() {
        Error::Format { line, .. } => assert_eq!(line, 3),
        e => panic!("{e:?}"),
    }
    std::fs::write(&p, "1\ta\t0.5\n").unwrap();
    assert!(matches!(
        read_qrels_tsv(&p).unwrap_err(),
        Error::Format { line: 1, .. }
    ));
    std::fs::write(&p, "1\ta\n").unwrap();
    assert!(matches!(
        read_qrels_tsv(&p).unwrap_err(),
        Error::Format { line: 1, .. }
    ));
    std::fs::write(&p, "1\ta\t1\n1\ta\t1\n1\ta\t2\n").unwrap();
    match read_qrels_tsv(&p).unwrap_err() {
        Error::ConflictingJudgment {
            line,
            first,
            second,
            ..
        } => assert_eq!((line, first, second), (3, 1, 2)),
        e => panic!("{e:?}"),
    }
    let j = dir.path().join("q.jsonl");
    std::fs::write(
        &j,
        "{\"query-id\": \"1\", \"corpus-id\": \"a\", \"score\": \"1\"}\n",
    )
    .unwrap();
    assert!(matches!(
        read_qrels_jsonl(&j).unwrap_err(),
        Error::Record { ref field, problem: Problem::WrongType { .. }, .. } if field == "score"
    ));
}

#[test]
fn duplicate_ids_are_errors() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("dup");
    write(
        &root.join("corpus.jsonl"),
        "{\"_id\": \"d1\", \"text\": \"a\"}\n{\"_id\": \"d2\", \"text\": \"b\"}\n{\"_id\": \"d1\", \"text\": \"c\"}\n",
    );
    write(
        &root.join("queries.jsonl"),
        "{\"_id\": \"q\", \"text\": \"x\"}\n",
    );
    write(&root.join("qrels/test.tsv"), "q\td1\t1\n");
    match load_beir(&root, "test").unwrap_err() {
        Error::DuplicateId { line, id, .. } => assert_eq!((line, id.as_str()), (3, "d1")),
        e => panic!("{e:?}"),
    }
}
