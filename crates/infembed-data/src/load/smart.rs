//! The SMART format of the classic Cornell/Glasgow collections (CISI, Cranfield, CACM's original
//! files): records start with a `.I <id>` line; a line that is exactly `.X` (a dot, one upper-case
//! letter, then nothing or whitespace and optional text) starts field `X`; other lines belong to
//! the current field. A field that occurs twice in one record is concatenated (Cranfield document
//! 576 has two `.W` fields). Field texts are whitespace-normalised. Lines may end in `\r\n`.

use std::path::Path;

use crate::error::Result;
use crate::load::{IdSet, format_error, normalize_ws, numbered_lines, read_text};

/// One SMART record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SmartRecord {
    /// The text after `.I`, trimmed (e.g. `"1"`, `"001"`).
    pub id: String,
    /// 1-based line of the `.I` line.
    pub line: usize,
    /// Fields in order of first appearance: (letter, whitespace-normalised text).
    pub fields: Vec<(char, String)>,
}

impl SmartRecord {
    /// The text of field `letter`, or `""` when absent.
    pub fn field(&self, letter: char) -> &str {
        self.fields
            .iter()
            .find(|(l, _)| *l == letter)
            .map_or("", |(_, t)| t.as_str())
    }
}

/// A field marker at the start of a line: `.X` followed by end of line or whitespace. Returns the
/// letter and the rest of the line.
fn marker(line: &str) -> Option<(char, &str)> {
    let bytes = line.as_bytes();
    if bytes.len() >= 2
        && bytes[0] == b'.'
        && bytes[1].is_ascii_uppercase()
        && bytes.get(2).is_none_or(|b| b.is_ascii_whitespace())
    {
        Some((bytes[1] as char, &line[2..]))
    } else {
        None
    }
}

/// Reads a SMART file into records, in file order.
///
/// # Errors
/// I/O, UTF-8, non-blank text before the first `.I`, a `.I` without an id, or a duplicate id.
pub fn read_smart(path: impl AsRef<Path>) -> Result<Vec<SmartRecord>> {
    let path = path.as_ref();
    let text = read_text(path)?;
    let mut records: Vec<SmartRecord> = Vec::new();
    // Raw text per field of the current record, joined with newlines, normalised at the end.
    let mut raw: Vec<(char, String)> = Vec::new();
    let mut current: Option<char> = None;
    let mut ids = IdSet::new();

    fn finish(records: &mut [SmartRecord], raw: &mut Vec<(char, String)>) {
        if let Some(last) = records.last_mut() {
            last.fields = raw.drain(..).map(|(l, t)| (l, normalize_ws(&t))).collect();
        }
    }

    for (line, content) in numbered_lines(&text) {
        match marker(content) {
            Some(('I', rest)) => {
                finish(&mut records, &mut raw);
                let id = rest.trim();
                if id.is_empty() {
                    return Err(format_error(path, line, ".I without an id"));
                }
                ids.insert(id, path, line)?;
                records.push(SmartRecord {
                    id: id.to_string(),
                    line,
                    fields: Vec::new(),
                });
                current = None;
            }
            Some((letter, rest)) => {
                if records.is_empty() {
                    return Err(format_error(path, line, "field marker before the first .I"));
                }
                current = Some(letter);
                append(&mut raw, letter, rest);
            }
            None => match current {
                Some(letter) => append(&mut raw, letter, content),
                None if content.trim().is_empty() => {}
                None => {
                    return Err(format_error(
                        path,
                        line,
                        "text outside a field (expected a .I or field marker)",
                    ));
                }
            },
        }
    }
    finish(&mut records, &mut raw);
    Ok(records)
}

fn append(raw: &mut Vec<(char, String)>, letter: char, text: &str) {
    match raw.iter_mut().find(|(l, _)| *l == letter) {
        Some((_, t)) => {
            t.push('\n');
            t.push_str(text);
        }
        None => raw.push((letter, text.to_string())),
    }
}
