//! How an (instruction, query) pair becomes one query string: the one template type of the
//! workspace, used by BM25, the held-out builder and the dense encoder's Interaction I.

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// A query template: literal text with the placeholders `{query}` (exactly once) and
/// `{instruction}` (at most once).
///
/// `{Q}` and `{I}` are accepted as aliases of `{query}` and `{instruction}` (the spelling of the
/// BM25 command-line option before the two template types became one), and the two spellings
/// may be mixed. Any other `{` or `}` is an error, so a typo such as `{q}` or `{Query}` cannot
/// go unnoticed; the template is kept as written ([`as_str`](Self::as_str), `Display` and serde
/// give the text back unchanged, and equality compares that text).
///
/// The default is `"{query} {instruction}"`: query first, one space, then the instruction, as the
/// published reference code (and mteb's FollowIR evaluation) does. The paper writes
/// `"{instruction} {query}"`; e5-style templates such as
/// `"Instruct: {instruction}\nQuery: {query}"` work too.
///
/// Serialized as its text (a JSON or TOML string), checked when read.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct QueryTemplate {
    template: String,
    /// The template cut at its placeholders.
    pieces: Vec<Piece>,
}

/// One part of a parsed template.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Piece {
    /// Text copied as is.
    Literal(String),
    /// `{query}` or `{Q}`.
    Query,
    /// `{instruction}` or `{I}`.
    Instruction,
}

/// Every spelling of a placeholder, and what it stands for.
static PLACEHOLDERS: [(&str, Piece); 4] = [
    ("{query}", Piece::Query),
    ("{instruction}", Piece::Instruction),
    ("{Q}", Piece::Query),
    ("{I}", Piece::Instruction),
];

impl Default for QueryTemplate {
    fn default() -> Self {
        QueryTemplate {
            template: Self::DEFAULT.to_string(),
            pieces: vec![
                Piece::Query,
                Piece::Literal(" ".to_string()),
                Piece::Instruction,
            ],
        }
    }
}

impl std::fmt::Display for QueryTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.template)
    }
}

impl std::str::FromStr for QueryTemplate {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        QueryTemplate::new(s)
    }
}

impl TryFrom<String> for QueryTemplate {
    type Error = Error;

    fn try_from(s: String) -> Result<Self> {
        QueryTemplate::new(&s)
    }
}

impl From<QueryTemplate> for String {
    fn from(t: QueryTemplate) -> String {
        t.template
    }
}

impl QueryTemplate {
    /// The default template.
    pub const DEFAULT: &'static str = "{query} {instruction}";

    /// Checks and wraps a template.
    ///
    /// # Errors
    /// [`Error::Template`] when the query placeholder does not occur exactly once, the
    /// instruction placeholder occurs more than once, or a brace is not part of a placeholder
    /// (`{query}`, `{instruction}`, `{Q}`, `{I}`).
    pub fn new(template: &str) -> Result<Self> {
        let err = |problem| Error::Template {
            template: template.to_string(),
            problem,
        };
        let mut pieces = Vec::new();
        let (mut queries, mut instructions) = (0, 0);
        let mut rest = template;
        while let Some(pos) = rest.find(['{', '}']) {
            if pos > 0 {
                pieces.push(Piece::Literal(rest[..pos].to_string()));
            }
            let tail = &rest[pos..];
            let Some((spelling, piece)) = PLACEHOLDERS.iter().find(|(s, _)| tail.starts_with(s))
            else {
                return Err(err(
                    "a brace that is not part of {query}, {instruction}, {Q} or {I}",
                ));
            };
            match piece {
                Piece::Query => queries += 1,
                _ => instructions += 1,
            }
            pieces.push(piece.clone());
            rest = &tail[spelling.len()..];
        }
        if !rest.is_empty() {
            pieces.push(Piece::Literal(rest.to_string()));
        }
        if queries != 1 {
            return Err(err("{query} (or {Q}) must occur exactly once"));
        }
        if instructions > 1 {
            return Err(err("{instruction} (or {I}) may occur at most once"));
        }
        Ok(QueryTemplate {
            template: template.to_string(),
            pieces,
        })
    }

    /// The template text, as written.
    pub fn as_str(&self) -> &str {
        &self.template
    }

    /// Whether the template has an instruction placeholder (a template without one drops the
    /// instruction).
    pub fn has_instruction(&self) -> bool {
        self.pieces.contains(&Piece::Instruction)
    }

    /// Fills the template. The query and instruction are inserted verbatim (placeholder-like
    /// text inside them is not expanded). With no instruction the bare query is returned
    /// unchanged (a template describes how to join a pair; it adds nothing to a lone query);
    /// `Some("")` fills the template with an empty instruction, literals included.
    pub fn render(&self, query: &str, instruction: Option<&str>) -> String {
        let Some(instruction) = instruction else {
            return query.to_string();
        };
        let mut out = String::with_capacity(self.template.len() + query.len() + instruction.len());
        for piece in &self.pieces {
            out.push_str(match piece {
                Piece::Literal(text) => text,
                Piece::Query => query,
                Piece::Instruction => instruction,
            });
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_is_parsed_like_its_text() {
        let parsed = QueryTemplate::new(QueryTemplate::DEFAULT).unwrap();
        assert_eq!(parsed, QueryTemplate::default());
    }
}
