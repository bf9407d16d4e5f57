//! InF-IR JSONL reader and flattening.

use std::io::Cursor;
use std::sync::Arc;

use infembed_data::{
    Error, InfIrRecord, JsonlRecords, Location, Problem, ReadMode, RecordField, Role, Row, flatten,
    read_jsonl, read_jsonl_from, read_records,
};
use proptest::prelude::*;
use serde_json::json;

const FIELDS: [&str; 7] = [
    "query_positive",
    "instruction_positive",
    "document_positive",
    "query_negative",
    "instruction_negative",
    "hard_negative_document_1",
    "hard_negative_document_2",
];

fn good_object(tag: &str) -> serde_json::Map<String, serde_json::Value> {
    let mut m = serde_json::Map::new();
    for f in FIELDS {
        m.insert(f.to_string(), json!(format!("{f} of {tag}")));
    }
    m
}

fn line_of(m: &serde_json::Map<String, serde_json::Value>) -> String {
    serde_json::to_string(m).unwrap()
}

fn read_str(text: &str, mode: ReadMode) -> infembed_data::Result<infembed_data::RecordSet> {
    read_jsonl_from(Cursor::new(text.as_bytes().to_vec()), "mem.jsonl", mode)
}

#[test]
fn reads_good_records_with_public_field_names_and_ignores_extra_fields() {
    let mut a = good_object("a");
    a.insert("source_query_id".into(), json!("649200"));
    a.insert("nested".into(), json!({"x": [1, 2]}));
    let b = good_object("b");
    let text = format!("{}\n\n   \n{}\n", line_of(&a), line_of(&b));
    let set = read_str(&text, ReadMode::Strict).unwrap();
    assert_eq!(set.records.len(), 2);
    assert!(set.skipped.is_empty());
    assert_eq!(set.locations, vec![Location::Line(1), Location::Line(4)]);
    let r = &set.records[0];
    assert_eq!(&*r.query_positive, "query_positive of a");
    assert_eq!(&*r.instruction_positive, "instruction_positive of a");
    assert_eq!(&*r.document_positive, "document_positive of a");
    assert_eq!(&*r.query_negative, "query_negative of a");
    assert_eq!(&*r.instruction_negative, "instruction_negative of a");
    assert_eq!(
        &*r.hard_negative_document_1,
        "hard_negative_document_1 of a"
    );
    assert_eq!(
        &*r.hard_negative_document_2,
        "hard_negative_document_2 of a"
    );
}

#[test]
fn accepts_document_as_alias_for_document_positive() {
    let mut a = good_object("a");
    a.remove("document_positive");
    a.insert("document".into(), json!("the passage"));
    let set = read_str(&line_of(&a), ReadMode::Strict).unwrap();
    assert_eq!(&*set.records[0].document_positive, "the passage");
    // The main name wins when both are present.
    let mut b = good_object("b");
    b.insert("document".into(), json!("other"));
    let set = read_str(&line_of(&b), ReadMode::Strict).unwrap();
    assert_eq!(&*set.records[0].document_positive, "document_positive of b");
}

#[test]
fn a_byte_order_mark_before_the_first_line_is_ignored() {
    let text = format!("\u{feff}{}\n", line_of(&good_object("a")));
    let set = read_str(&text, ReadMode::Strict).unwrap();
    assert_eq!(&*set.records[0].query_positive, "query_positive of a");
}

#[test]
fn crlf_line_endings_are_accepted() {
    let text = format!(
        "{}\r\n{}\r\n",
        line_of(&good_object("a")),
        line_of(&good_object("b"))
    );
    let set = read_str(&text, ReadMode::Strict).unwrap();
    assert_eq!(set.records.len(), 2);
    assert_eq!(&*set.records[1].query_positive, "query_positive of b");
}

fn strict_error(text: &str) -> Error {
    read_str(text, ReadMode::Strict).unwrap_err()
}

#[test]
fn strict_errors_name_file_line_and_field() {
    let good = line_of(&good_object("g"));
    let cases: Vec<(serde_json::Map<String, serde_json::Value>, &str, Problem)> = vec![
        (
            {
                let mut m = good_object("x");
                m.remove("query_negative");
                m
            },
            "query_negative",
            Problem::Missing,
        ),
        (
            {
                let mut m = good_object("x");
                m.insert("instruction_negative".into(), json!(null));
                m
            },
            "instruction_negative",
            Problem::Null,
        ),
        (
            {
                let mut m = good_object("x");
                m.insert("hard_negative_document_2".into(), json!(17));
                m
            },
            "hard_negative_document_2",
            Problem::WrongType {
                found: "number".into(),
                expected: "string",
            },
        ),
        (
            {
                let mut m = good_object("x");
                m.insert("query_positive".into(), json!(" \t\n "));
                m
            },
            "query_positive",
            Problem::Empty,
        ),
        (
            {
                let mut m = good_object("x");
                m.insert("document_positive".into(), json!(""));
                m
            },
            "document_positive",
            Problem::Empty,
        ),
        (
            {
                let mut m = good_object("x");
                m.remove("document_positive");
                m
            },
            "document_positive",
            Problem::Missing,
        ),
    ];
    for (obj, field, problem) in cases {
        let text = format!("{good}\n{}\n{good}\n", line_of(&obj));
        match strict_error(&text) {
            Error::Record {
                path,
                at,
                field: f,
                problem: p,
            } => {
                assert_eq!(path.to_str(), Some("mem.jsonl"));
                assert_eq!(at, Location::Line(2));
                assert_eq!(f, field);
                assert_eq!(p, problem);
            }
            other => panic!("unexpected error {other:?}"),
        }
    }
}

#[test]
fn error_message_mentions_file_line_and_field() {
    let mut m = good_object("x");
    m.insert("instruction_positive".into(), json!(null));
    let msg = strict_error(&line_of(&m)).to_string();
    assert!(msg.contains("mem.jsonl"), "{msg}");
    assert!(msg.contains("line 1"), "{msg}");
    assert!(msg.contains("instruction_positive"), "{msg}");
}

#[test]
fn json_utf8_and_shape_errors() {
    let good = line_of(&good_object("g"));
    match strict_error(&format!("{good}\n{{\"query_positive\": \n")) {
        Error::Json { line, .. } => assert_eq!(line, 2),
        e => panic!("{e:?}"),
    }
    match strict_error("[1, 2]\n") {
        Error::Record {
            at, field, problem, ..
        } => {
            assert_eq!(at, Location::Line(1));
            assert_eq!(field, "(record)");
            assert_eq!(problem, Problem::NotAnObject { found: "array" });
        }
        e => panic!("{e:?}"),
    }
    let mut bytes = format!("{good}\n{good}\n").into_bytes();
    bytes.extend_from_slice(b"{\"a\": \"\xff\xfe\"}\n");
    let err = read_jsonl_from(Cursor::new(bytes), "mem.jsonl", ReadMode::Strict).unwrap_err();
    match err {
        Error::Utf8 { line, .. } => assert_eq!(line, 3),
        e => panic!("{e:?}"),
    }
}

#[test]
fn lenient_mode_skips_and_reports_lines() {
    let good = line_of(&good_object("g"));
    let mut missing = good_object("m");
    missing.remove("hard_negative_document_1");
    let text = format!(
        "{good}\nnot json\n{good}\n\n{}\n42\n{good}",
        line_of(&missing)
    );
    let set = read_str(&text, ReadMode::Lenient).unwrap();
    assert_eq!(set.records.len(), 3);
    assert_eq!(
        set.skipped_locations(),
        vec![Location::Line(2), Location::Line(5), Location::Line(6)]
    );
    assert!(matches!(set.skipped[0].error, Error::Json { line: 2, .. }));
    assert!(matches!(
        &set.skipped[1].error,
        Error::Record { field, problem: Problem::Missing, .. } if field == "hard_negative_document_1"
    ));
    assert_eq!(
        set.locations,
        vec![Location::Line(1), Location::Line(3), Location::Line(7)]
    );
}

#[test]
fn missing_file_is_an_io_error_naming_the_path() {
    let err = read_jsonl("/definitely/not/here.jsonl", ReadMode::Lenient).unwrap_err();
    match err {
        Error::Io { path, .. } => assert!(path.ends_with("here.jsonl")),
        e => panic!("{e:?}"),
    }
    let err = read_records("/tmp/whatever.csv", ReadMode::Strict).unwrap_err();
    assert!(matches!(err, Error::UnknownFormat { .. }));
}

#[test]
fn streaming_iterator_yields_per_line_results() {
    let good = line_of(&good_object("g"));
    let text = format!("{good}\nbad\n{good}\n");
    let items: Vec<_> = JsonlRecords::new(Cursor::new(text.into_bytes()), "mem").collect();
    assert_eq!(items.len(), 3);
    assert!(items[0].is_ok());
    assert!(items[1].is_err());
    assert_eq!(items[2].as_ref().unwrap().0, Location::Line(3));
}

#[test]
fn shipped_sample_files_read_strictly_with_published_counts() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../data/inf-ir-sample");
    let train = read_jsonl(dir.join("train.jsonl"), ReadMode::Strict).unwrap();
    let dev = read_jsonl(dir.join("dev.jsonl"), ReadMode::Strict).unwrap();
    assert_eq!(train.records.len(), 226);
    assert_eq!(dev.records.len(), 59);
    // Independent check of the first record against the raw JSON.
    let first_line = std::fs::read_to_string(dir.join("train.jsonl"))
        .unwrap()
        .lines()
        .next()
        .unwrap()
        .to_string();
    let v: serde_json::Value = serde_json::from_str(&first_line).unwrap();
    for field in RecordField::ALL {
        assert_eq!(
            &**train.records[0].field(field),
            v[field.name()].as_str().unwrap()
        );
    }
}

#[test]
fn to_json_round_trips() {
    let rec = InfIrRecord::from_texts(["q", "i", "p", "q-", "i-", "n1", "n2"]).unwrap();
    let line = serde_json::to_string(&rec.to_json()).unwrap();
    let set = read_str(&line, ReadMode::Strict).unwrap();
    assert_eq!(set.records, vec![rec]);
}

/// Naive flattening written independently of the library: looks each row up by role.
fn naive_rows(records: &[InfIrRecord]) -> Vec<(usize, Role, String, String, String)> {
    let mut out = Vec::new();
    for (i, r) in records.iter().enumerate() {
        out.push((
            i,
            Role::Pos,
            r.instruction_positive.to_string(),
            r.query_positive.to_string(),
            r.document_positive.to_string(),
        ));
        out.push((
            i,
            Role::InstrNeg,
            r.instruction_negative.to_string(),
            r.query_positive.to_string(),
            r.hard_negative_document_1.to_string(),
        ));
        out.push((
            i,
            Role::QueryNeg,
            r.instruction_positive.to_string(),
            r.query_negative.to_string(),
            r.hard_negative_document_2.to_string(),
        ));
    }
    out
}

fn as_tuples(rows: &[Row]) -> Vec<(usize, Role, String, String, String)> {
    rows.iter()
        .map(|r| {
            (
                r.record,
                r.role,
                r.instruction.to_string(),
                r.query.to_string(),
                r.passage.to_string(),
            )
        })
        .collect()
}

#[test]
fn flatten_matches_naive_and_shares_text() {
    let records: Vec<InfIrRecord> = (0..4)
        .map(|i| {
            let t: Vec<String> = FIELDS.iter().map(|f| format!("{f}#{i}")).collect();
            InfIrRecord::from_texts(std::array::from_fn(|k| t[k].as_str())).unwrap()
        })
        .collect();
    let rows = flatten(&records);
    assert_eq!(as_tuples(&rows), naive_rows(&records));
    for (k, row) in rows.iter().enumerate() {
        assert_eq!(row.index(), k);
    }
    // Texts are shared, not copied: Pos and QueryNeg point at the same I+ allocation.
    assert!(Arc::ptr_eq(&rows[0].instruction, &rows[2].instruction));
    assert!(Arc::ptr_eq(&rows[0].query, &rows[1].query));
    assert!(Arc::ptr_eq(&rows[0].passage, &records[0].document_positive));
}

fn nonblank_text() -> impl Strategy<Value = String> {
    "\\PC{0,12}[a-z\\p{Han}]\\PC{0,12}"
}

fn record_strategy() -> impl Strategy<Value = InfIrRecord> {
    proptest::collection::vec(nonblank_text(), 7)
        .prop_map(|t| InfIrRecord::from_texts(std::array::from_fn(|k| t[k].as_str())).unwrap())
}

/// Naive count of lines the reader must look at: non-blank pieces between `\n`s.
fn nonblank_lines(bytes: &[u8]) -> usize {
    bytes
        .split(|&b| b == b'\n')
        .filter(|l| !l.iter().all(u8::is_ascii_whitespace))
        .count()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn arbitrary_bytes_never_panic_and_every_line_is_accounted_for(
        bytes in proptest::collection::vec(any::<u8>(), 0..400)
    ) {
        let lenient = read_jsonl_from(Cursor::new(bytes.clone()), "fuzz", ReadMode::Lenient).unwrap();
        prop_assert_eq!(lenient.records.len() + lenient.skipped.len(), nonblank_lines(&bytes));
        let strict = read_jsonl_from(Cursor::new(bytes.clone()), "fuzz", ReadMode::Strict);
        match strict {
            Ok(set) => prop_assert!(lenient.skipped.is_empty() && set.records == lenient.records),
            Err(e) => prop_assert_eq!(e.location(), Some(lenient.skipped[0].at)),
        }
    }

    #[test]
    fn jsonish_bytes_never_panic(
        pieces in proptest::collection::vec(
            prop_oneof![
                Just("{".to_string()), Just("}".to_string()), Just("\"query_positive\"".to_string()),
                Just(":".to_string()), Just(",".to_string()), Just("\n".to_string()),
                Just("null".to_string()), Just("\"x\"".to_string()), Just("[".to_string()),
                Just("\\u00".to_string()), "\\PC{0,4}",
            ],
            0..60,
        )
    ) {
        let text: String = pieces.concat();
        let set = read_str(&text, ReadMode::Lenient).unwrap();
        prop_assert_eq!(set.records.len() + set.skipped.len(), nonblank_lines(text.as_bytes()));
    }

    #[test]
    fn good_and_corrupted_lines_are_sorted_out_exactly(
        items in proptest::collection::vec((record_strategy(), 0u8..6), 1..12)
    ) {
        // kind 0 = good line; 1..=5 = one kind of corruption on a random field.
        let mut lines = Vec::new();
        let mut expected_good = Vec::new();
        let mut expected_bad = Vec::new();
        for (k, (rec, kind)) in items.iter().enumerate() {
            let mut obj = rec.to_json().as_object().unwrap().clone();
            let field = FIELDS[k % 7];
            match kind {
                0 => expected_good.push(rec.clone()),
                1 => { obj.remove(field); }
                2 => { obj.insert(field.into(), json!(null)); }
                3 => { obj.insert(field.into(), json!("  ")); }
                4 => { obj.insert(field.into(), json!(["list"])); }
                _ => {}
            }
            let line = if *kind == 5 { "{not json".to_string() } else { line_of(&obj) };
            if *kind != 0 {
                expected_bad.push(Location::Line(k + 1));
            }
            lines.push(line);
        }
        let text = lines.join("\n");
        let set = read_str(&text, ReadMode::Lenient).unwrap();
        prop_assert_eq!(&set.records, &expected_good);
        prop_assert_eq!(set.skipped_locations(), expected_bad.clone());
        match read_str(&text, ReadMode::Strict) {
            Ok(s) => { prop_assert!(expected_bad.is_empty()); prop_assert_eq!(s.records, expected_good); }
            Err(e) => prop_assert_eq!(e.location(), expected_bad.first().copied()),
        }
    }
}
