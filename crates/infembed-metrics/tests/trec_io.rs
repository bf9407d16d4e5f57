//! TREC qrels and run files: round trips, and typed errors (file, line, problem) for bad input.

use std::io::Write;
use std::path::Path;

use infembed_metrics::{Error, ParseErrorKind, Qrels, Run, TieBreak};

fn write_file(dir: &Path, name: &str, text: &[u8]) -> std::path::PathBuf {
    let path = dir.join(name);
    std::fs::File::create(&path)
        .unwrap()
        .write_all(text)
        .unwrap();
    path
}

/// Asserts that `err` is a parse error at `line` of `path` with `kind`, and that its message
/// names the file and the line.
fn assert_parse_error(err: Error, path: &Path, line: usize, kind: ParseErrorKind) {
    let message = err.to_string();
    match err {
        Error::Parse {
            path: p,
            line: l,
            kind: k,
        } => {
            assert_eq!(p, path);
            assert_eq!(l, line);
            assert_eq!(k, kind);
            assert!(
                message.contains(&format!("{}:{line}", path.display())),
                "{message}"
            );
        }
        other => panic!("expected a parse error, got {other:?}"),
    }
}

#[test]
fn run_errors_name_file_line_and_problem() {
    let dir = tempfile::tempdir().unwrap();
    let cases: [(&str, &[u8], usize, ParseErrorKind); 6] = [
        (
            "columns.run",
            b"q1 Q0 d1 1 0.5 tag\nq1 Q0 d2 2 0.4\n",
            2,
            ParseErrorKind::WrongColumnCount {
                expected: 6,
                found: 5,
            },
        ),
        (
            "too_many.run",
            b"q1 Q0 d1 1 0.5 tag extra\n",
            1,
            ParseErrorKind::WrongColumnCount {
                expected: 6,
                found: 7,
            },
        ),
        (
            "score.run",
            b"q1 Q0 d1 1 0.5 tag\n\nq1 Q0 d2 2 high tag\n",
            3,
            ParseErrorKind::InvalidScore {
                value: "high".into(),
            },
        ),
        (
            "nan.run",
            b"q1 Q0 d1 1 NaN tag\n",
            1,
            ParseErrorKind::InvalidScore {
                value: "NaN".into(),
            },
        ),
        (
            "dup.run",
            b"q1 Q0 d1 1 0.5 t\nq2 Q0 d1 1 0.5 t\nq1 Q0 d2 2 0.4 t\nq1 Q0 d1 3 0.3 t\n",
            4,
            ParseErrorKind::DuplicateDocument {
                query: "q1".into(),
                doc: "d1".into(),
                first_line: 1,
            },
        ),
        ("empty.run", b"\n  \n", 2, ParseErrorKind::EmptyFile),
    ];
    for (name, text, line, kind) in cases {
        let path = write_file(dir.path(), name, text);
        let err = Run::read(&path).expect_err(name);
        assert_parse_error(err, &path, line, kind);
    }
    let path = write_file(dir.path(), "zero.run", b"");
    assert_parse_error(
        Run::read(&path).unwrap_err(),
        &path,
        0,
        ParseErrorKind::EmptyFile,
    );
    let path = write_file(
        dir.path(),
        "utf8.run",
        b"q1 Q0 d1 1 0.5 t\nq1 Q0 d\xff 1 0.5 t\n",
    );
    assert_parse_error(
        Run::read(&path).unwrap_err(),
        &path,
        2,
        ParseErrorKind::InvalidUtf8,
    );
}

#[test]
fn qrels_errors_name_file_line_and_problem() {
    let dir = tempfile::tempdir().unwrap();
    let cases: [(&str, &[u8], usize, ParseErrorKind); 5] = [
        (
            "columns.qrels",
            b"q1 0 d1\n",
            1,
            ParseErrorKind::WrongColumnCount {
                expected: 4,
                found: 3,
            },
        ),
        (
            "label.qrels",
            b"q1 0 d1 1\nq1 0 d2 1.5\n",
            2,
            ParseErrorKind::InvalidLabel {
                value: "1.5".into(),
            },
        ),
        (
            "word.qrels",
            b"q1 0 d1 yes\n",
            1,
            ParseErrorKind::InvalidLabel {
                value: "yes".into(),
            },
        ),
        (
            "dup.qrels",
            b"q1 0 d1 1\nq1 0 d2 0\nq1 0 d1 2\n",
            3,
            ParseErrorKind::DuplicateDocument {
                query: "q1".into(),
                doc: "d1".into(),
                first_line: 1,
            },
        ),
        ("empty.qrels", b"", 0, ParseErrorKind::EmptyFile),
    ];
    for (name, text, line, kind) in cases {
        let path = write_file(dir.path(), name, text);
        let err = Qrels::read(&path).expect_err(name);
        assert_parse_error(err, &path, line, kind);
    }
}

#[test]
fn missing_file_is_an_io_error_naming_the_path() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("absent.run");
    match Run::read(&path).unwrap_err() {
        Error::Io { path: p, .. } => assert_eq!(p, path),
        other => panic!("expected Io, got {other:?}"),
    }
    let err = Qrels::read(&path).unwrap_err();
    assert!(err.to_string().contains("absent.run"), "{err}");
}

#[test]
fn reader_errors_use_a_placeholder_name() {
    let err = Run::from_reader(&b"q1 Q0 d1 1 x t\n"[..]).unwrap_err();
    assert_parse_error(
        err,
        Path::new("<input>"),
        1,
        ParseErrorKind::InvalidScore { value: "x".into() },
    );
}

#[test]
fn run_round_trips_through_a_file_and_ranks_are_written_in_order() {
    let dir = tempfile::tempdir().unwrap();
    // Interleaved queries, a tie (d2/d3), a negative and a tiny score.
    let mut run = Run::from_entries([
        ("q2", "d9", 1.0),
        ("q1", "d1", 0.25),
        ("q1", "d2", 0.5),
        ("q2", "d8", -3.5),
        ("q1", "d3", 0.5),
        ("q1", "d4", 1e-7),
    ])
    .unwrap();
    run.set_tag("myrun");
    let path = dir.path().join("out.run");
    run.write(&path, TieBreak::TrecEval).unwrap();
    let text = std::fs::read_to_string(&path).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(
        lines,
        [
            "q1 Q0 d3 1 0.5 myrun",
            "q1 Q0 d2 2 0.5 myrun",
            "q1 Q0 d1 3 0.25 myrun",
            "q1 Q0 d4 4 0.0000001 myrun",
            "q2 Q0 d9 1 1 myrun",
            "q2 Q0 d8 2 -3.5 myrun",
        ]
    );
    let back = Run::read(&path).unwrap();
    assert_eq!(back.tag(), Some("myrun"));
    assert_eq!(back.num_entries(), 6);
    for (query, docs) in run.queries() {
        for (doc, score) in docs.iter() {
            assert_eq!(back.query(query).unwrap().score_of(doc), Some(score));
        }
    }
}

#[test]
fn qrels_round_trip_through_a_writer() {
    let qrels = Qrels::from_entries([("q1", "b", 2), ("q1", "a", 0), ("q0", "z", -1)]).unwrap();
    let mut out = Vec::new();
    qrels.to_writer(&mut out).unwrap();
    assert_eq!(
        String::from_utf8(out.clone()).unwrap(),
        "q0 0 z -1\nq1 0 a 0\nq1 0 b 2\n"
    );
    assert_eq!(Qrels::from_reader(&out[..]).unwrap(), qrels);
}

#[test]
fn in_memory_construction_rejects_duplicates_and_nan() {
    assert!(matches!(
        Run::from_entries([("q", "d", 1.0), ("q", "d", 2.0)]),
        Err(Error::DuplicateDocument { .. })
    ));
    assert!(matches!(
        Run::from_entries([("q", "d", f64::NAN)]),
        Err(Error::NanScore { .. })
    ));
    assert!(matches!(
        Qrels::from_entries([("q", "d", 1), ("q", "d", 1)]),
        Err(Error::DuplicateDocument { .. })
    ));
    let mut run = Run::new();
    run.insert_query("q", [("a", 1.0)]).unwrap();
    assert!(matches!(
        run.insert_query("q", [("b", 1.0)]),
        Err(Error::DuplicateQuery { .. })
    ));
    assert!(matches!(
        run.insert_query("r", [("b", 1.0), ("b", 0.0)]),
        Err(Error::DuplicateDocument { .. })
    ));
    assert_eq!(run.len(), 1);
}
