//! Loaders for evaluation sets: BEIR layout, FollowIR's published layout, TREC and SMART files, and
//! the classic collections kept in the project's shared data.
//!
//! All loaders read whole files through buffered readers in one pass (no quadratic work) and return
//! typed errors naming the file and line. Text of the TREC-SGML and SMART formats is
//! whitespace-normalised (runs of whitespace, line breaks included, become one space, and the ends
//! are trimmed); JSONL texts are kept exactly as stored.

pub mod beir;
pub mod classic;
pub mod followir;
pub mod smart;
pub mod trec;

use std::collections::HashMap;
use std::fs::File;
use std::io::{BufReader, Read};
use std::path::{Path, PathBuf};

use serde_json::{Map, Value};

use crate::error::{Error, Location, Problem, Result};
use crate::eval::Qrels;
use crate::record::json_type_name;

/// Reads a whole text file, checking UTF-8 (an error names the line of the first bad byte).
pub(crate) fn read_text(path: &Path) -> Result<String> {
    let mut bytes = Vec::new();
    File::open(path)
        .and_then(|f| BufReader::with_capacity(1 << 16, f).read_to_end(&mut bytes))
        .map_err(|e| Error::io(path, e))?;
    String::from_utf8(bytes).map_err(|e| {
        let good = e.utf8_error().valid_up_to();
        let line = 1 + e.as_bytes()[..good].iter().filter(|&&b| b == b'\n').count();
        Error::Utf8 {
            path: path.to_path_buf(),
            line,
            source: e.utf8_error(),
        }
    })
}

/// Lines of a text with 1-based numbers, a trailing `\r` removed.
pub(crate) fn numbered_lines(text: &str) -> impl Iterator<Item = (usize, &str)> {
    text.split('\n')
        .enumerate()
        .map(|(i, l)| (i + 1, l.strip_suffix('\r').unwrap_or(l)))
}

/// Collapses whitespace runs to one space and trims.
pub(crate) fn normalize_ws(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for word in text.split_whitespace() {
        if !out.is_empty() {
            out.push(' ');
        }
        out.push_str(word);
    }
    out
}

/// Calls `f` with each non-blank line of a JSONL file parsed as a JSON object (the first
/// error, the file's or `f`'s, ends the read).
pub(crate) fn for_each_json_object(
    path: &Path,
    mut f: impl FnMut(usize, &Map<String, Value>) -> Result<()>,
) -> Result<()> {
    for item in crate::read::JsonObjects::open(path)? {
        let (line, object) = item?;
        f(line, &object)?;
    }
    Ok(())
}

pub(crate) fn record_error(path: &Path, line: usize, field: &str, problem: Problem) -> Error {
    Error::Record {
        path: path.to_path_buf(),
        at: Location::Line(line),
        field: field.to_string(),
        problem,
    }
}

pub(crate) fn format_error(path: &Path, line: usize, problem: impl Into<String>) -> Error {
    Error::Format {
        path: path.to_path_buf(),
        line,
        problem: problem.into(),
    }
}

/// The string field `field` of a JSON object read from line `line` of `path` (may be empty).
///
/// # Errors
/// [`Error::Record`] naming file, line and field when it is missing, null or not a string.
pub fn json_str<'a>(
    object: &'a Map<String, Value>,
    field: &str,
    path: &Path,
    line: usize,
) -> Result<&'a str> {
    match object.get(field) {
        Some(Value::String(s)) => Ok(s),
        None => Err(record_error(path, line, field, Problem::Missing)),
        Some(Value::Null) => Err(record_error(path, line, field, Problem::Null)),
        Some(other) => Err(record_error(
            path,
            line,
            field,
            Problem::WrongType {
                found: json_type_name(other).to_string(),
                expected: "string",
            },
        )),
    }
}

/// A string field that must not be blank (see [`json_str`]).
///
/// # Errors
/// [`Error::Record`] naming file, line and field when it is missing, null, not a string, empty
/// or whitespace-only.
pub fn json_nonempty_str<'a>(
    object: &'a Map<String, Value>,
    field: &str,
    path: &Path,
    line: usize,
) -> Result<&'a str> {
    let s = json_str(object, field, path, line)?;
    if s.trim().is_empty() {
        Err(record_error(path, line, field, Problem::Empty))
    } else {
        Ok(s)
    }
}

/// An optional string field (see [`json_str`]): absent or null give `None`.
///
/// # Errors
/// [`Error::Record`] naming file, line and field when it is present but not a string.
pub fn json_opt_str<'a>(
    object: &'a Map<String, Value>,
    field: &str,
    path: &Path,
    line: usize,
) -> Result<Option<&'a str>> {
    match object.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(_) => json_str(object, field, path, line).map(Some),
    }
}

/// An id field (see [`json_str`]): a non-blank string, or an integer (ids such as MS MARCO's are
/// sometimes stored as numbers), returned as a string.
///
/// # Errors
/// [`Error::Record`] naming file, line and field when it is missing, null, blank or of another
/// type.
pub fn json_id(
    object: &Map<String, Value>,
    field: &str,
    path: &Path,
    line: usize,
) -> Result<String> {
    id_value(object.get(field), field, path, line)
}

pub(crate) fn id_value(
    value: Option<&Value>,
    field: &str,
    path: &Path,
    line: usize,
) -> Result<String> {
    match value {
        Some(Value::Number(n)) if n.is_i64() || n.is_u64() => Ok(n.to_string()),
        Some(Value::String(s)) if s.trim().is_empty() => {
            Err(record_error(path, line, field, Problem::Empty))
        }
        Some(Value::String(s)) => Ok(s.clone()),
        None => Err(record_error(path, line, field, Problem::Missing)),
        Some(Value::Null) => Err(record_error(path, line, field, Problem::Null)),
        Some(other) => Err(record_error(
            path,
            line,
            field,
            Problem::WrongType {
                found: json_type_name(other).to_string(),
                expected: "string or integer",
            },
        )),
    }
}

/// Parses a relevance grade: an integer, or a float with no fractional part (`1.0`), as stored in
/// Hugging Face exports.
pub(crate) fn parse_grade(text: &str) -> std::result::Result<i32, Problem> {
    let bad = || Problem::NotAnInteger {
        found: text.to_string(),
    };
    if let Ok(g) = text.parse::<i32>() {
        return Ok(g);
    }
    let f: f64 = text.parse().map_err(|_| bad())?;
    if f.is_finite() && f.fract() == 0.0 && f >= f64::from(i32::MIN) && f <= f64::from(i32::MAX) {
        Ok(f as i32)
    } else {
        Err(bad())
    }
}

/// Adds one judgment, rejecting a conflicting duplicate (an identical duplicate is accepted).
pub(crate) fn add_judgment(
    qrels: &mut Qrels,
    query: &str,
    doc: &str,
    grade: i32,
    path: &Path,
    line: usize,
) -> Result<()> {
    let docs = qrels.entry(query.to_string()).or_default();
    match docs.get(doc) {
        Some(&first) if first != grade => Err(Error::ConflictingJudgment {
            path: path.to_path_buf(),
            line,
            query: query.to_string(),
            doc: doc.to_string(),
            first,
            second: grade,
        }),
        Some(_) => Ok(()),
        None => {
            docs.insert(doc.to_string(), grade);
            Ok(())
        }
    }
}

/// Tracks ids seen in one file and rejects a repeat.
pub(crate) struct IdSet {
    seen: HashMap<String, usize>,
}

impl IdSet {
    pub(crate) fn new() -> Self {
        IdSet {
            seen: HashMap::new(),
        }
    }

    pub(crate) fn insert(&mut self, id: &str, path: &Path, line: usize) -> Result<()> {
        if self.seen.insert(id.to_string(), line).is_some() {
            Err(Error::DuplicateId {
                path: path.to_path_buf(),
                line,
                id: id.to_string(),
            })
        } else {
            Ok(())
        }
    }
}

/// The first of `candidates` (relative to `dir`) that exists, or [`Error::MissingFile`] naming
/// the first candidate.
pub(crate) fn find_file(dir: &Path, candidates: &[&str], what: &'static str) -> Result<PathBuf> {
    candidates
        .iter()
        .map(|c| dir.join(c))
        .find(|p| p.is_file())
        .ok_or_else(|| Error::MissingFile {
            path: dir.join(candidates[0]),
            what,
        })
}

/// `dir.join(name)` if it is a file, else [`Error::MissingFile`].
pub(crate) fn require_file(dir: &Path, name: &str, what: &'static str) -> Result<PathBuf> {
    find_file(dir, &[name], what)
}
