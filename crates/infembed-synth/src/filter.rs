//! The rule filter (paper appendix B.1) and the parsing of the generator's JSON answers.
//!
//! Instructions and queries are cut at their first line break (`\n` or `\r`) and trimmed; passages
//! are trimmed. A text that is then empty, or longer than its limit (counted in `char`s), is
//! rejected. A negative that equals its positive (ignoring case and surrounding whitespace) is
//! rejected too, since it would teach nothing.

use serde_json::{Map, Value};

use crate::config::FilterConfig;

/// Why a generated text was rejected by the rules.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RuleViolation {
    /// Empty after cutting and trimming.
    Empty,
    /// Longer than the limit.
    TooLong {
        /// Its length in `char`s.
        chars: usize,
        /// The limit.
        limit: usize,
    },
    /// Identical to the positive it should differ from.
    SameAsPositive,
}

impl std::fmt::Display for RuleViolation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RuleViolation::Empty => write!(f, "is empty"),
            RuleViolation::TooLong { chars, limit } => {
                write!(f, "is {chars} characters long (limit {limit})")
            }
            RuleViolation::SameAsPositive => write!(f, "is identical to its positive"),
        }
    }
}

/// What kind of text a rule applies to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TextKind {
    /// I+ or I-: cut at the first line break.
    Instruction,
    /// Q-: cut at the first line break.
    Query,
    /// P1- or P2-: kept whole (line breaks allowed), trimmed.
    Passage,
}

/// Applies the rule for `kind`: returns the cleaned text or the violation.
pub fn apply_rule(
    text: &str,
    kind: TextKind,
    limits: &FilterConfig,
) -> Result<String, RuleViolation> {
    let (cut, limit) = match kind {
        TextKind::Instruction => (first_line(text), limits.max_instruction_chars),
        TextKind::Query => (first_line(text), limits.max_query_chars),
        TextKind::Passage => (text, limits.max_passage_chars),
    };
    let cleaned = cut.trim();
    if cleaned.is_empty() {
        return Err(RuleViolation::Empty);
    }
    let chars = cleaned.chars().count();
    if chars > limit {
        return Err(RuleViolation::TooLong { chars, limit });
    }
    Ok(cleaned.to_string())
}

/// The text before the first `\n` or `\r`, after dropping leading whitespace (so an answer that
/// starts with a blank line is not cut to nothing).
pub fn first_line(text: &str) -> &str {
    let text = text.trim_start();
    match text.find(['\n', '\r']) {
        Some(i) => &text[..i],
        None => text,
    }
}

/// Whether a negative text is the same as its positive (case-insensitive, trimmed).
pub fn same_text(a: &str, b: &str) -> bool {
    a.trim().to_lowercase() == b.trim().to_lowercase()
}

/// Extracts the JSON object from a model answer: the whole text, or, when that is not an
/// object, the span from the first `{` to the last `}` (models wrap JSON in code fences or
/// prose when not constrained).
pub fn extract_json_object(content: &str) -> Option<Map<String, Value>> {
    if let Ok(Value::Object(m)) = serde_json::from_str::<Value>(content.trim()) {
        return Some(m);
    }
    let start = content.find('{')?;
    let end = content.rfind('}')?;
    if end <= start {
        return None;
    }
    match serde_json::from_str::<Value>(&content[start..=end]) {
        Ok(Value::Object(m)) => Some(m),
        _ => None,
    }
}

/// Reads string fields `names` from a model answer.
///
/// # Errors
/// A description of what is malformed (no JSON object, a field missing or not a string).
pub fn parse_fields<const N: usize>(
    content: &str,
    names: [&str; N],
) -> Result<[String; N], String> {
    let obj = extract_json_object(content).ok_or_else(|| {
        let shown: String = content.chars().take(120).collect();
        format!("the answer is not a JSON object: {shown:?}")
    })?;
    let mut out: [String; N] = std::array::from_fn(|_| String::new());
    for (slot, name) in out.iter_mut().zip(names) {
        match obj.get(name) {
            Some(Value::String(s)) => *slot = s.clone(),
            Some(_) => return Err(format!("field `{name}` is not a string")),
            None => return Err(format!("field `{name}` is missing")),
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn limits() -> FilterConfig {
        FilterConfig {
            max_instruction_chars: 10,
            max_query_chars: 5,
            max_passage_chars: 8,
        }
    }

    #[test]
    fn cuts_at_first_newline_and_trims() {
        let l = limits();
        assert_eq!(
            apply_rule("  find it\nExplanation: x", TextKind::Instruction, &l),
            Ok("find it".to_string())
        );
        assert_eq!(
            apply_rule("\n\nabc\r\ndef", TextKind::Query, &l),
            Ok("abc".to_string())
        );
        assert_eq!(
            apply_rule("a\nb c", TextKind::Passage, &l),
            Ok("a\nb c".to_string())
        );
    }

    #[test]
    fn rejects_empty_and_over_long() {
        let l = limits();
        assert_eq!(
            apply_rule(" \n more", TextKind::Instruction, &l),
            Ok("more".to_string())
        );
        assert_eq!(
            apply_rule("   ", TextKind::Instruction, &l),
            Err(RuleViolation::Empty)
        );
        assert_eq!(
            apply_rule("éééééé", TextKind::Query, &l),
            Err(RuleViolation::TooLong { chars: 6, limit: 5 })
        );
        // Limits count chars, not bytes: 5 two-byte chars pass.
        assert!(apply_rule("ééééé", TextKind::Query, &l).is_ok());
    }

    #[test]
    fn extracts_json_from_fenced_answers() {
        let c = "Sure!\n```json\n{\"instruction\": \"x\"}\n```";
        assert_eq!(parse_fields(c, ["instruction"]), Ok(["x".to_string()]));
        assert!(parse_fields("{\"instruction\": 3}", ["instruction"]).is_err());
        assert!(parse_fields("{\"instruction\": \"x\"", ["instruction"]).is_err());
        assert!(parse_fields("no json", ["instruction"]).is_err());
    }

    proptest! {
        /// Against a naive reference: split on line breaks, take the first non-blank-led line.
        #[test]
        fn rule_matches_naive_reference(text in "[ a-c\\n\\r]{0,24}") {
            let l = FilterConfig { max_instruction_chars: 6, max_query_chars: 6, max_passage_chars: 6 };
            let got = apply_rule(&text, TextKind::Instruction, &l);
            let lead = text.trim_start();
            let naive_line: String = lead.chars().take_while(|c| *c != '\n' && *c != '\r').collect();
            let naive = naive_line.trim().to_string();
            if naive.is_empty() {
                prop_assert_eq!(got, Err(RuleViolation::Empty));
            } else if naive.chars().count() > 6 {
                let too_long = matches!(got, Err(RuleViolation::TooLong { .. }));
                prop_assert!(too_long);
            } else {
                prop_assert_eq!(got, Ok(naive));
            }
        }
    }
}
