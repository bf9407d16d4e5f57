//! The FollowIR-style held-out test built from InF-IR files (protocol of
//! `data/inf-ir-sample/README.md`).

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};

use infembed_data::{
    Distractor, Error, InfIrRecord, QueryTemplate, ReadMode, build_heldout, changed_docs,
    read_distractors, read_jsonl,
};

fn sample() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../data/inf-ir-sample")
}

fn rec(tag: &str) -> InfIrRecord {
    InfIrRecord::from_texts([
        &format!("Q+ {tag}"),
        &format!("I+ {tag}"),
        &format!("P+ {tag}"),
        &format!("Q- {tag}"),
        &format!("I- {tag}"),
        &format!("P1 {tag}"),
        &format!("P2 {tag}"),
    ])
    .unwrap()
}

#[test]
fn inline_records_follow_the_protocol() {
    let records = vec![rec("a"), rec("b")];
    let distractors = vec![
        Distractor {
            passage_id: "7775154".into(),
            passage: "distractor one".into(),
        },
        Distractor {
            passage_id: "42".into(),
            passage: "distractor two".into(),
        },
    ];
    let set = build_heldout("tiny", &records, &distractors).unwrap();
    let ids: Vec<(&str, &str)> = set
        .corpus
        .iter()
        .map(|d| (d.id.as_str(), d.text.as_str()))
        .collect();
    assert_eq!(
        ids,
        [
            ("r0-pos", "P+ a"),
            ("r0-n1", "P1 a"),
            ("r0-n2", "P2 a"),
            ("r1-pos", "P+ b"),
            ("r1-n1", "P1 b"),
            ("r1-n2", "P2 b"),
            ("d-7775154", "distractor one"),
            ("d-42", "distractor two"),
        ]
    );
    let q = &set.queries[1];
    assert_eq!(q.id, "r1");
    assert_eq!(q.text, "Q+ b");
    assert_eq!(q.instruction_og, "I+ b");
    assert_eq!(q.instruction_changed, "I- b");
    assert_eq!(q.render_og(&QueryTemplate::default()), "Q+ b I+ b");
    assert_eq!(q.render_changed(&QueryTemplate::default()), "Q+ b I- b");
    let custom = QueryTemplate::new("Instruct: {I}\nQuery: {Q}").unwrap();
    assert_eq!(q.render_og(&custom), "Instruct: I+ b\nQuery: Q+ b");
    assert_eq!(
        set.qrels_og["r1"],
        HashMap::from([("r1-pos".to_string(), 1)])
    );
    assert_eq!(
        set.qrels_changed["r1"],
        HashMap::from([("r1-n1".to_string(), 1)])
    );
    assert_eq!(set.changed_docs["r0"], ["r0-pos"]);
    // The stored changed docs agree with FollowIR's derivation from the two qrels.
    assert_eq!(
        set.changed_docs,
        changed_docs(&set.qrels_og, &set.qrels_changed)
    );
    assert!(set.top_ranked.is_none());
}

#[test]
fn duplicate_distractors_are_rejected() {
    let d = Distractor {
        passage_id: "1".into(),
        passage: "x".into(),
    };
    match build_heldout("t", &[rec("a")], &[d.clone(), d]).unwrap_err() {
        Error::DuplicateCorpusId { id, .. } => assert_eq!(id, "d-1"),
        e => panic!("{e:?}"),
    }
}

#[test]
fn empty_input_gives_empty_set() {
    let set = build_heldout("empty", &[], &[]).unwrap();
    assert!(set.corpus.is_empty() && set.queries.is_empty() && set.qrels_og.is_empty());
}

#[test]
fn shipped_sample_builds_with_published_counts() {
    let dir = sample();
    let train = read_jsonl(dir.join("train.jsonl"), ReadMode::Strict).unwrap();
    let dev = read_jsonl(dir.join("dev.jsonl"), ReadMode::Strict).unwrap();
    let distractors = read_distractors(dir.join("distractors.jsonl")).unwrap();
    assert_eq!(train.records.len(), 226);
    assert_eq!(dev.records.len(), 59);
    assert_eq!(distractors.len(), 1011);

    let set = build_heldout("dev", &dev.records, &distractors).unwrap();
    assert_eq!(set.corpus.len(), 3 * 59 + 1011);
    assert_eq!(set.queries.len(), 59);
    let ids: HashSet<&str> = set.corpus.iter().map(|d| d.id.as_str()).collect();
    assert_eq!(ids.len(), set.corpus.len(), "corpus ids are unique");

    // Independent check against the raw files: record r's texts sit at the protocol's ids.
    let raw_dev: Vec<serde_json::Value> = std::fs::read_to_string(dir.join("dev.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let by_id: HashMap<&str, &str> = set
        .corpus
        .iter()
        .map(|d| (d.id.as_str(), d.text.as_str()))
        .collect();
    for (r, v) in raw_dev.iter().enumerate() {
        assert_eq!(
            by_id[format!("r{r}-pos").as_str()],
            v["document_positive"].as_str().unwrap()
        );
        assert_eq!(
            by_id[format!("r{r}-n1").as_str()],
            v["hard_negative_document_1"].as_str().unwrap()
        );
        assert_eq!(
            by_id[format!("r{r}-n2").as_str()],
            v["hard_negative_document_2"].as_str().unwrap()
        );
        let q = &set.queries[r];
        assert_eq!(q.text, v["query_positive"].as_str().unwrap());
        assert_eq!(
            q.instruction_og,
            v["instruction_positive"].as_str().unwrap()
        );
        assert_eq!(
            q.instruction_changed,
            v["instruction_negative"].as_str().unwrap()
        );
    }
    let raw_first: serde_json::Value = serde_json::from_str(
        std::fs::read_to_string(dir.join("distractors.jsonl"))
            .unwrap()
            .lines()
            .next()
            .unwrap(),
    )
    .unwrap();
    let first_id = format!("d-{}", raw_first["passage_id"].as_str().unwrap());
    assert_eq!(
        by_id[first_id.as_str()],
        raw_first["passage"].as_str().unwrap()
    );

    let train_set = build_heldout("train", &train.records, &[]).unwrap();
    assert_eq!(train_set.corpus.len(), 3 * 226);
    assert_eq!(train_set.changed_docs.len(), 226);
}

#[test]
fn distractor_file_errors() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("d.jsonl");
    std::fs::write(
        &p,
        "{\"passage_id\": \"1\", \"passage\": \"a\"}\n{\"passage_id\": \"2\"}\n",
    )
    .unwrap();
    assert!(matches!(
        read_distractors(&p).unwrap_err(),
        Error::Record { ref field, .. } if field == "passage"
    ));
    std::fs::write(
        &p,
        "{\"passage_id\": 1, \"passage\": \"a\"}\n{\"passage_id\": \"1\", \"passage\": \"b\"}\n",
    )
    .unwrap();
    assert!(matches!(
        read_distractors(&p).unwrap_err(),
        Error::DuplicateId { line: 2, .. }
    ));
}
