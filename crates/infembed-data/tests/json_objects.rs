//! `JsonObjects` (the workspace's one JSONL line reader) against a naive reference: split the
//! text on `\n`, skip blank lines, parse each other line with serde_json, and expect an object.

use infembed_data::{Error, JsonObjects};
use proptest::prelude::*;
use serde_json::Value;

/// What the naive reference expects for one line.
#[derive(Debug, PartialEq)]
enum Expect {
    Object(serde_json::Map<String, Value>),
    Json,
    NotAnObject,
}

fn naive(text: &str) -> Vec<(usize, Expect)> {
    let mut out = Vec::new();
    for (i, line) in text.split('\n').enumerate() {
        let line_no = i + 1;
        let line = if line_no == 1 {
            line.strip_prefix('\u{feff}').unwrap_or(line)
        } else {
            line
        };
        if line.trim().is_empty() {
            continue;
        }
        out.push((
            line_no,
            match serde_json::from_str::<Value>(line) {
                Ok(Value::Object(o)) => Expect::Object(o),
                Ok(_) => Expect::NotAnObject,
                Err(_) => Expect::Json,
            },
        ));
    }
    out
}

fn line_strategy() -> impl Strategy<Value = String> {
    prop_oneof![
        Just(String::new()),
        Just("  \t ".to_string()),
        Just("\r".to_string()),
        ("[a-z]{1,6}", "[ -~]{0,12}")
            .prop_map(|(k, v)| { serde_json::json!({ k: v }).to_string() }),
        Just("[1, 2]".to_string()),
        Just("\"text\"".to_string()),
        Just("{\"a\": ".to_string()),
        Just("not json".to_string()),
        Just("{\"a\": 1}\r".to_string()),
    ]
}

proptest! {
    #[test]
    fn matches_the_naive_reader(
        lines in prop::collection::vec(line_strategy(), 0..12),
        bom in any::<bool>(),
    ) {
        let mut text = lines.join("\n");
        if bom {
            text.insert(0, '\u{feff}');
        }
        let got: Vec<(usize, Expect)> = JsonObjects::new(text.as_bytes(), "mem.jsonl")
            .map(|item| match item {
                Ok((line, object)) => (line, Expect::Object(object)),
                Err(Error::Json { line, .. }) => (line, Expect::Json),
                Err(e @ Error::Record { .. }) => match e.location() {
                    Some(infembed_data::Location::Line(line)) => (line, Expect::NotAnObject),
                    other => panic!("record error without a line: {other:?}"),
                },
                Err(other) => panic!("unexpected error {other}"),
            })
            .collect();
        prop_assert_eq!(got, naive(&text));
    }
}

#[test]
fn bad_utf8_names_its_line_and_reading_goes_on() {
    let bytes = b"{\"a\": 1}\n\n{\"b\": \"\xff\"}\n{\"c\": 3}\n";
    let items: Vec<_> = JsonObjects::new(&bytes[..], "x.jsonl").collect();
    assert_eq!(items.len(), 3);
    assert!(matches!(&items[0], Ok((1, _))));
    assert!(
        matches!(&items[1], Err(Error::Utf8 { line: 3, .. })),
        "{:?}",
        items[1]
    );
    assert!(matches!(&items[2], Ok((4, o)) if o.contains_key("c")));
}

#[test]
fn a_directory_or_missing_file_is_an_io_error_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    for path in [dir.path().to_path_buf(), dir.path().join("missing.jsonl")] {
        match JsonObjects::open(&path) {
            Err(Error::Io { path: p, .. }) => assert_eq!(p, path),
            Err(other) => panic!("unexpected {other}"),
            Ok(_) => panic!("opened {}", path.display()),
        }
    }
}
