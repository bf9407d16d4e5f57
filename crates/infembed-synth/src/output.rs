//! Resumable JSONL output and the provenance every output line carries.
//!
//! Three append-only files:
//! - **generated**: every pair whose seven texts were generated and passed the rule filter, as an
//!   InF-IR record plus `provenance` (with the judge's verdicts and whether it was kept);
//! - **records**: the kept subset of those lines (same line, byte for byte);
//! - **rejected**: pairs rejected before a record existed (malformed answer, rule filter), as
//!   `provenance` plus whatever was `generated`.
//!
//! Every line is written with a single `write` and synced, so a crash or Ctrl-C loses at most the
//! pairs in flight. A kept record is written to the generated file first, then to the records
//! file; on start, all three files are read back, the pairs they hold are skipped, a partial last
//! line (a crash mid-write) is cut off, and a kept line missing from one of the two record files
//! is copied over.

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::error::{Error, Result};
use crate::judge::Scenario;

/// Where a record came from in the input.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Source {
    /// The query's id.
    pub query_id: String,
    /// The positive passage's id.
    pub passage_id: String,
}

/// Whether a pair's record was kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// Passed the rules and the quality check.
    Kept,
    /// Rejected at `stage`.
    Rejected,
}

/// The stage that rejected a pair.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Stage {
    /// The generator's answer was not the JSON asked for.
    Malformed,
    /// The rule filter (empty, over-long, negative equal to positive).
    Rule,
    /// The quality check (at least one scenario judged wrong or answered invalidly).
    Judge,
}

/// One judgment of the quality check.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Judgment {
    /// The scenario.
    pub scenario: Scenario,
    /// The option labels in the order shown (A first): record field names or
    /// `distractor:<passage id>`.
    pub options: Vec<String>,
    /// The right letter.
    pub expected: String,
    /// The judge's answer text, trimmed and cut to 40 characters.
    pub answer: String,
    /// The letter the answer was read as, if valid.
    pub chosen: Option<String>,
    /// Whether `chosen == expected`.
    pub correct: bool,
}

/// Provenance of one finished pair (the `provenance` object of every output line).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Provenance {
    /// The input pair.
    pub source: Source,
    /// Kept or rejected.
    pub status: Status,
    /// The rejecting stage, for rejected pairs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stage: Option<Stage>,
    /// Why it was rejected, for rejected pairs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The generator's model name.
    pub generator_model: String,
    /// The judge's model name (absent when the quality check is off).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub judge_model: Option<String>,
    /// The run seed ([`crate::QualityConfig::seed`]).
    pub seed: u64,
    /// The quality check's judgments (empty when it did not run).
    #[serde(default)]
    pub judgments: Vec<Judgment>,
}

/// An append-only JSONL file that was read back for resuming.
#[derive(Debug)]
pub struct JsonlAppender {
    path: PathBuf,
    file: File,
}

/// One complete line of an existing output file.
#[derive(Debug, Clone)]
pub struct ResumedLine {
    /// The whole line.
    pub value: Value,
    /// Its `provenance` object.
    pub provenance: Provenance,
}

/// What an existing output file held.
#[derive(Debug, Default)]
pub struct Resumed {
    /// Every complete line, in file order.
    pub lines: Vec<ResumedLine>,
    /// Whether a partial last line was cut off.
    pub dropped_partial_line: bool,
}

impl JsonlAppender {
    /// Opens `path` for appending (creating it and its folder if needed) after reading back its
    /// complete lines. A trailing partial line is truncated away.
    ///
    /// # Errors
    /// I/O, or a complete line that is not JSON or has no valid `provenance`
    /// ([`Error::OutputLine`]).
    pub fn open_resuming(path: &Path) -> Result<(Self, Resumed)> {
        let io = |source| Error::Io {
            path: path.to_path_buf(),
            source,
        };
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::create_dir_all(parent).map_err(io)?;
        }
        let mut resumed = Resumed::default();
        if path.exists() {
            let mut bytes = Vec::new();
            File::open(path)
                .and_then(|mut f| f.read_to_end(&mut bytes))
                .map_err(io)?;
            let complete = bytes.iter().rposition(|b| *b == b'\n').map_or(0, |i| i + 1);
            if complete < bytes.len() {
                let f = OpenOptions::new().write(true).open(path).map_err(io)?;
                f.set_len(complete as u64).map_err(io)?;
                f.sync_all().map_err(io)?;
                resumed.dropped_partial_line = true;
            }
            for (i, line) in bytes[..complete].split(|b| *b == b'\n').enumerate() {
                if line.iter().all(u8::is_ascii_whitespace) {
                    continue;
                }
                let bad = |problem: String| Error::OutputLine {
                    path: path.to_path_buf(),
                    line: i + 1,
                    problem,
                };
                let v: Value =
                    serde_json::from_slice(line).map_err(|e| bad(format!("invalid JSON: {e}")))?;
                let prov = v
                    .get("provenance")
                    .ok_or_else(|| bad("no `provenance` object".into()))?;
                let prov: Provenance = serde_json::from_value(prov.clone())
                    .map_err(|e| bad(format!("bad `provenance`: {e}")))?;
                resumed.lines.push(ResumedLine {
                    value: v,
                    provenance: prov,
                });
            }
        }
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .map_err(io)?;
        Ok((
            JsonlAppender {
                path: path.to_path_buf(),
                file,
            },
            resumed,
        ))
    }

    /// Appends one JSON value as one line (a single write, then a data sync).
    ///
    /// # Errors
    /// I/O.
    pub fn append(&mut self, value: &Value) -> Result<()> {
        let mut line = serde_json::to_string(value).expect("a JSON value always serializes");
        line.push('\n');
        self.file
            .write_all(line.as_bytes())
            .and_then(|()| self.file.sync_data())
            .map_err(|source| Error::Io {
                path: self.path.clone(),
                source,
            })
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// The line written for a generated record (to the generated file, and to the records file when
/// kept): the record's public fields plus `provenance`.
pub fn kept_line(record: &infembed_data::InfIrRecord, provenance: &Provenance) -> Value {
    let mut v = record.to_json();
    v.as_object_mut().expect("to_json gives an object").insert(
        "provenance".into(),
        serde_json::to_value(provenance).expect("provenance serializes"),
    );
    v
}

/// The line written for a pair rejected before a record existed: `provenance` plus the texts
/// generated so far (record field names as keys).
pub fn rejected_line(generated: &Map<String, Value>, provenance: &Provenance) -> Value {
    let mut m = Map::new();
    m.insert(
        "provenance".into(),
        serde_json::to_value(provenance).expect("provenance serializes"),
    );
    m.insert("generated".into(), Value::Object(generated.clone()));
    Value::Object(m)
}
