//! TREC formats: qrels (`qid iter docno rel`), SGML documents (`<DOC><DOCNO>`), and SGML topics
//! (`<top><num><title><desc><narr>`, or topics written as `<DOC><DOCNO>` blocks as CACM's are).
//!
//! SGML parsing is tag-based and forgiving about layout: a field's text runs from its opening tag to
//! its closing tag or the next tag, whichever comes first (classic TREC topics do not close
//! `<num>`, `<desc>`, `<narr>`). Tag names are case-insensitive. A `<` that does not start a
//! well-formed tag is text. Non-blank text outside blocks, an unterminated block, or a block inside
//! a block is an error.

use std::path::Path;

use crate::error::Result;
use crate::eval::{Document, Qrels, Query};
use crate::load::{
    IdSet, add_judgment, format_error, normalize_ws, numbered_lines, parse_grade, read_text,
};

/// Reads a TREC qrels file: whitespace-separated `query-id iteration doc-id relevance` per line
/// (the iteration column is ignored); blank lines are skipped.
///
/// # Errors
/// I/O, UTF-8, a line without 4 columns, a non-integer relevance, or a conflicting duplicate.
pub fn read_trec_qrels(path: impl AsRef<Path>) -> Result<Qrels> {
    let path = path.as_ref();
    let text = read_text(path)?;
    let mut qrels = Qrels::new();
    for (line, content) in numbered_lines(&text) {
        let cols: Vec<&str> = content.split_whitespace().collect();
        if cols.is_empty() {
            continue;
        }
        if cols.len() != 4 {
            return Err(format_error(
                path,
                line,
                format!(
                    "expected 4 columns (query-id iteration doc-id relevance), found {}",
                    cols.len()
                ),
            ));
        }
        let grade =
            parse_grade(cols[3]).map_err(|p| format_error(path, line, format!("relevance {p}")))?;
        add_judgment(&mut qrels, cols[0], cols[2], grade, path, line)?;
    }
    Ok(qrels)
}

/// One `<DOC>` or `<top>` block: its tag (lower-case), first line, and fields in order. Text not
/// inside a field tag is stored under the empty name.
#[derive(Debug)]
struct Block {
    tag: String,
    line: usize,
    fields: Vec<(String, String)>,
}

impl Block {
    /// All text of the fields named `name`, concatenated (space-separated), or `None`.
    fn field(&self, name: &str) -> Option<String> {
        let mut parts = self.fields.iter().filter(|(n, _)| n == name).peekable();
        parts.peek()?;
        Some(parts.map(|(_, t)| t.as_str()).collect::<Vec<_>>().join(" "))
    }
}

/// A tag at the start of `s` (which begins with `<`): (is closing, lower-case name, byte length).
fn parse_tag(s: &str) -> Option<(bool, String, usize)> {
    let bytes = s.as_bytes();
    let mut i = 1;
    let closing = bytes.get(1) == Some(&b'/');
    if closing {
        i += 1;
    }
    let start = i;
    while i < bytes.len()
        && (bytes[i].is_ascii_alphanumeric() || bytes[i] == b'_' || bytes[i] == b'-')
    {
        i += 1;
    }
    if i == start || bytes.get(i) != Some(&b'>') {
        return None;
    }
    Some((closing, s[start..i].to_ascii_lowercase(), i + 1))
}

/// Splits a TREC SGML file into `<DOC>` / `<top>` blocks.
fn parse_blocks(path: &Path, text: &str) -> Result<Vec<Block>> {
    let mut blocks = Vec::new();
    let mut current: Option<Block> = None;
    let mut field = String::new();
    let mut line = 1usize;
    let mut rest = text;
    loop {
        let next = rest.find('<');
        let (chunk, after) = match next {
            Some(pos) => (&rest[..pos], &rest[pos..]),
            None => (rest, ""),
        };
        // Text before the next '<'.
        if !chunk.is_empty() {
            match current.as_mut() {
                Some(block) => match block.fields.last_mut() {
                    Some((name, t)) if *name == field => t.push_str(chunk),
                    _ => block.fields.push((field.clone(), chunk.to_string())),
                },
                None if !chunk.trim().is_empty() => {
                    return Err(format_error(
                        path,
                        line,
                        "text outside a <DOC> or <top> block",
                    ));
                }
                None => {}
            }
            line += chunk.matches('\n').count();
        }
        if after.is_empty() {
            break;
        }
        match parse_tag(after) {
            None => {
                // A lone '<' is text.
                if let Some(block) = current.as_mut() {
                    match block.fields.last_mut() {
                        Some((name, t)) if *name == field => t.push('<'),
                        _ => block.fields.push((field.clone(), "<".to_string())),
                    }
                } else {
                    return Err(format_error(
                        path,
                        line,
                        "text outside a <DOC> or <top> block",
                    ));
                }
                rest = &after[1..];
            }
            Some((closing, name, len)) => {
                let is_block = name == "doc" || name == "top";
                match (is_block, closing, current.is_some()) {
                    (true, false, false) => {
                        current = Some(Block {
                            tag: name,
                            line,
                            fields: Vec::new(),
                        });
                        field.clear();
                    }
                    (true, false, true) => {
                        let started = current.as_ref().map_or(0, |b| b.line);
                        return Err(format_error(
                            path,
                            line,
                            format!("<{name}> inside the block that started at line {started}"),
                        ));
                    }
                    (true, true, true) => {
                        let block = current.take().expect("checked above");
                        if block.tag != name {
                            return Err(format_error(
                                path,
                                line,
                                format!("</{name}> closes a <{}> block", block.tag),
                            ));
                        }
                        blocks.push(block);
                    }
                    (_, _, false) => {
                        return Err(format_error(
                            path,
                            line,
                            format!(
                                "tag <{}{name}> outside a block",
                                if closing { "/" } else { "" }
                            ),
                        ));
                    }
                    (false, false, true) => field = name,
                    (false, true, true) => field.clear(),
                }
                rest = &after[len..];
            }
        }
    }
    if let Some(block) = current {
        return Err(format_error(
            path,
            block.line,
            format!("<{}> block is never closed", block.tag),
        ));
    }
    Ok(blocks)
}

/// Strips a leading label such as `Number:` (case-insensitive) from a TREC topic field.
fn strip_label<'a>(text: &'a str, label: &str) -> &'a str {
    let t = text.trim_start();
    match t.get(..label.len()) {
        Some(head) if head.eq_ignore_ascii_case(label) => &t[label.len()..],
        _ => t,
    }
}

/// Reads TREC SGML documents: `<DOC>` blocks with a `<DOCNO>` (the id) and text in any other
/// fields or untagged. A `<TITLE>` or `<HEADLINE>` field becomes the title; everything else except
/// `<DOCNO>`/`<DOCID>` is the text (whitespace-normalised, fields joined by a space).
///
/// # Errors
/// I/O, UTF-8, malformed blocks, a block without a non-blank `<DOCNO>`, or a duplicate id.
pub fn read_trec_docs(path: impl AsRef<Path>) -> Result<Vec<Document>> {
    let path = path.as_ref();
    let text = read_text(path)?;
    let blocks = parse_blocks(path, &text)?;
    let mut ids = IdSet::new();
    let mut docs = Vec::with_capacity(blocks.len());
    for block in blocks {
        if block.tag != "doc" {
            return Err(format_error(
                path,
                block.line,
                "expected <DOC>, found <top>",
            ));
        }
        let id = normalize_ws(&block.field("docno").unwrap_or_default());
        if id.is_empty() {
            return Err(format_error(path, block.line, "<DOC> without a <DOCNO>"));
        }
        ids.insert(&id, path, block.line)?;
        let mut title = Vec::new();
        let mut body = Vec::new();
        for (name, t) in &block.fields {
            match name.as_str() {
                "docno" | "docid" => {}
                "title" | "headline" => title.push(t.as_str()),
                _ => body.push(t.as_str()),
            }
        }
        docs.push(Document {
            id,
            title: normalize_ws(&title.join(" ")),
            text: normalize_ws(&body.join(" ")),
        });
    }
    Ok(docs)
}

/// Reads TREC SGML topics. Two shapes are accepted, block by block:
/// - `<top>` with `<num>` (id; a leading `Number:` is dropped), `<title>` (the query text; a leading
///   `Topic:` is dropped; when blank, `<desc>` is used, minus `Description:`), and an optional
///   `<narr>` that becomes [`Query::instruction`] (minus `Narrative:`; TREC narratives are what
///   FollowIR uses as instructions);
/// - `<DOC>` with `<DOCNO>` (id) and untagged text (the query), as CACM's topics are written.
///
/// # Errors
/// I/O, UTF-8, malformed blocks, a topic without an id or without text, or a duplicate id.
pub fn read_trec_topics(path: impl AsRef<Path>) -> Result<Vec<Query>> {
    let path = path.as_ref();
    let text = read_text(path)?;
    let blocks = parse_blocks(path, &text)?;
    let mut ids = IdSet::new();
    let mut queries = Vec::with_capacity(blocks.len());
    for block in blocks {
        let (id, text, instruction) = if block.tag == "top" {
            let id = normalize_ws(strip_label(
                &block.field("num").unwrap_or_default(),
                "Number:",
            ));
            let title = normalize_ws(strip_label(
                &block.field("title").unwrap_or_default(),
                "Topic:",
            ));
            let text = if title.is_empty() {
                normalize_ws(strip_label(
                    &block.field("desc").unwrap_or_default(),
                    "Description:",
                ))
            } else {
                title
            };
            let narr = block
                .field("narr")
                .map(|n| normalize_ws(strip_label(&n, "Narrative:")))
                .filter(|n| !n.is_empty());
            (id, text, narr)
        } else {
            let id = normalize_ws(&block.field("docno").unwrap_or_default());
            let body: Vec<&str> = block
                .fields
                .iter()
                .filter(|(n, _)| n != "docno")
                .map(|(_, t)| t.as_str())
                .collect();
            (id, normalize_ws(&body.join(" ")), None)
        };
        if id.is_empty() {
            return Err(format_error(path, block.line, "topic without an id"));
        }
        if text.is_empty() {
            return Err(format_error(
                path,
                block.line,
                format!("topic {id} has no text"),
            ));
        }
        ids.insert(&id, path, block.line)?;
        queries.push(Query {
            id,
            text,
            instruction,
        });
    }
    Ok(queries)
}
