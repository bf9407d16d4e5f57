//! How an (instruction, query) pair becomes one query string.

use crate::error::{Error, Result};

/// A query template with the placeholders `{Q}` (the query, exactly once) and `{I}` (the
/// instruction, at most once). Any other `{` or `}` is an error, so a typo such as `{q}` cannot go
/// unnoticed.
///
/// The default is `"{Q} {I}"`: query first, one space, then the instruction, as the published
/// reference code (and mteb's FollowIR evaluation) does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueryTemplate {
    template: String,
}

impl Default for QueryTemplate {
    fn default() -> Self {
        QueryTemplate {
            template: Self::DEFAULT.to_string(),
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

impl QueryTemplate {
    /// The default template.
    pub const DEFAULT: &'static str = "{Q} {I}";

    /// Checks and wraps a template.
    ///
    /// # Errors
    /// [`Error::Template`] when `{Q}` does not occur exactly once, `{I}` occurs more than once, or
    /// a brace is not part of `{Q}` / `{I}`.
    pub fn new(template: &str) -> Result<Self> {
        let err = |problem| Error::Template {
            template: template.to_string(),
            problem,
        };
        let (mut q, mut i) = (0, 0);
        let mut rest = template;
        while let Some(pos) = rest.find(['{', '}']) {
            let tail = &rest[pos..];
            if tail.starts_with("{Q}") {
                q += 1;
            } else if tail.starts_with("{I}") {
                i += 1;
            } else {
                return Err(err("a brace that is not part of {Q} or {I}"));
            }
            rest = &tail[3..];
        }
        if q != 1 {
            return Err(err("{Q} must occur exactly once"));
        }
        if i > 1 {
            return Err(err("{I} may occur at most once"));
        }
        Ok(QueryTemplate {
            template: template.to_string(),
        })
    }

    /// The template text.
    pub fn as_str(&self) -> &str {
        &self.template
    }

    /// Fills the template. With no instruction the bare query is returned unchanged (a template
    /// describes how to join a pair; it adds nothing to a lone query).
    pub fn render(&self, query: &str, instruction: Option<&str>) -> String {
        let Some(instruction) = instruction else {
            return query.to_string();
        };
        let mut out = String::with_capacity(self.template.len() + query.len() + instruction.len());
        let mut rest = self.template.as_str();
        while let Some(pos) = rest.find('{') {
            out.push_str(&rest[..pos]);
            // `new` guarantees every brace starts `{Q}` or `{I}`.
            out.push_str(if rest[pos..].starts_with("{Q}") {
                query
            } else {
                instruction
            });
            rest = &rest[pos + 3..];
        }
        out.push_str(rest);
        out
    }
}
