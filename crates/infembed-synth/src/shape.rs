//! The shape of each answer the pipeline asks for, and its three renderings: an OpenAI-style
//! JSON schema, a GBNF grammar (llama.cpp's `grammar` field), and a completion-token budget.
//!
//! Every generator step answers a flat JSON object of string fields in a fixed order
//! ([`ResponseShape::Fields`]); the judge answers `{"answer": "<letter>"}` with one of the offered
//! letters ([`ResponseShape::Choice`]).
//!
//! The grammar is this crate's own, written for the shape rather than converted from the schema:
//! - the object is laid out exactly as `{"a": "...", "b": "..."}` (one space after `:` and `,`),
//!   so whitespace cannot run away;
//! - a string field holds 1 to `max_chars` characters, the first not a space; an escaped `\"`,
//!   `\\` or `\/` counts as one character. Single-line fields (instructions, queries) cannot hold
//!   a line break at all, passages may hold `\n`; no other control character or escape is
//!   possible;
//! - the judge's letter is one of the offered letters.
//!
//! A lone surrogate or other odd escape (`\uXXXX`) cannot be produced, so whatever the grammar
//! admits is valid JSON that [`crate::filter::parse_fields`] reads.

use serde_json::{Map, Value, json};

/// One string field of a generator answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StringField {
    /// The JSON key.
    pub name: String,
    /// The most characters the value may have (the rule filter's limit for this text).
    pub max_chars: usize,
    /// Whether the value must stay on one line (instructions and queries).
    pub single_line: bool,
}

impl StringField {
    /// A field named `name` of at most `max_chars` characters.
    pub fn new(name: &str, max_chars: usize, single_line: bool) -> Self {
        StringField {
            name: name.to_string(),
            max_chars,
            single_line,
        }
    }
}

/// What an answer must look like.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ResponseShape {
    /// A JSON object holding exactly these string fields, in this order.
    Fields {
        /// The step's name (`instruction`, `poison`, `negative_passage_1`, ...): the schema's
        /// name, and a comment at the top of the grammar.
        name: String,
        /// The fields.
        fields: Vec<StringField>,
    },
    /// `{"answer": L}` with `L` one of `letters`.
    Choice {
        /// The step's name (`judgment`).
        name: String,
        /// The offered option letters (`A`, `B`, ...).
        letters: Vec<char>,
    },
}

impl ResponseShape {
    /// The step's name.
    pub fn name(&self) -> &str {
        match self {
            ResponseShape::Fields { name, .. } | ResponseShape::Choice { name, .. } => name,
        }
    }

    /// The JSON schema (for `response_format: {type: json_schema}`). With `length_limits`,
    /// string fields also get `minLength: 1` and `maxLength` (llama.cpp enforces both in the
    /// grammar it derives; OpenAI's strict mode may reject the keywords).
    pub fn json_schema(&self, length_limits: bool) -> Value {
        match self {
            ResponseShape::Fields { fields, .. } => {
                let mut props = Map::new();
                for f in fields {
                    let mut s = json!({"type": "string"});
                    if length_limits {
                        s["minLength"] = json!(1);
                        s["maxLength"] = json!(f.max_chars);
                    }
                    props.insert(f.name.clone(), s);
                }
                json!({
                    "type": "object",
                    "properties": props,
                    "required": fields.iter().map(|f| f.name.as_str()).collect::<Vec<_>>(),
                    "additionalProperties": false,
                })
            }
            ResponseShape::Choice { letters, .. } => {
                let letters: Vec<String> = letters.iter().map(char::to_string).collect();
                json!({
                    "type": "object",
                    "properties": {"answer": {"type": "string", "enum": letters}},
                    "required": ["answer"],
                    "additionalProperties": false,
                })
            }
        }
    }

    /// The GBNF grammar (llama.cpp's `grammar` request field); see the module docs for what it
    /// admits. Its first line is a comment naming the step (`# infembed step: NAME`).
    pub fn gbnf(&self) -> String {
        let mut g = format!("# infembed step: {}\n", sanitize_comment(self.name()));
        match self {
            ResponseShape::Fields { fields, .. } => {
                let mut root = String::from("root ::= \"{\"");
                for (i, f) in fields.iter().enumerate() {
                    if i > 0 {
                        root.push_str(" \", \"");
                    }
                    root.push_str(&format!(
                        " {} \": \" v{i}",
                        gbnf_literal(&format!("\"{}\"", f.name))
                    ));
                }
                root.push_str(" \"}\"\n");
                g.push_str(&root);
                for (i, f) in fields.iter().enumerate() {
                    let rest = if f.single_line {
                        "line-char"
                    } else {
                        "text-char"
                    };
                    let tail = match f.max_chars.saturating_sub(1) {
                        0 => String::new(),
                        n => format!(" {rest}{{0,{n}}}"),
                    };
                    g.push_str(&format!("v{i} ::= \"\\\"\" first{tail} \"\\\"\"\n"));
                }
                // A first character that is printable and not a space, quote or backslash.
                g.push_str("first ::= [^\"\\\\\\x00-\\x20\\x7F]\n");
                // Any printable character, or an escaped quote, backslash or slash.
                g.push_str("line-char ::= [^\"\\\\\\x00-\\x1F\\x7F] | \"\\\\\" [\"\\\\/]\n");
                // As line-char, plus an escaped line break.
                g.push_str("text-char ::= line-char | \"\\\\n\"\n");
            }
            ResponseShape::Choice { letters, .. } => {
                let alts: Vec<String> = letters
                    .iter()
                    .map(|c| gbnf_literal(&c.to_string()))
                    .collect();
                g.push_str(&format!(
                    "root ::= \"{{\\\"answer\\\": \\\"\" ({}) \"\\\"}}\"\n",
                    alts.join(" | ")
                ));
            }
        }
        g
    }

    /// A completion-token budget large enough that an answer the grammar (or a schema with
    /// `maxLength`) admits is never cut by the limit when its text is ASCII: every token emits at
    /// least one byte, and a field of `n` characters takes at most `2n` bytes (escapes), plus the
    /// keys and punctuation.
    pub fn token_budget(&self) -> u32 {
        let n: usize = match self {
            ResponseShape::Fields { fields, .. } => {
                8 + fields
                    .iter()
                    .map(|f| 2 * f.max_chars + f.name.len() + 8)
                    .sum::<usize>()
            }
            ResponseShape::Choice { .. } => 24,
        };
        u32::try_from(n).unwrap_or(u32::MAX)
    }
}

/// A GBNF string literal for `text` (quotes, backslashes and control characters escaped).
pub fn gbnf_literal(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 || c as u32 == 0x7F => {
                out.push_str(&format!("\\x{:02X}", c as u32));
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

fn sanitize_comment(s: &str) -> String {
    s.chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn poison() -> ResponseShape {
        ResponseShape::Fields {
            name: "poison".into(),
            fields: vec![
                StringField::new("negative_instruction", 300, true),
                StringField::new("negative_query", 200, true),
            ],
        }
    }

    #[test]
    fn schema_lists_fields_in_order_with_optional_limits() {
        let s = poison().json_schema(false);
        assert_eq!(
            s["required"],
            json!(["negative_instruction", "negative_query"])
        );
        assert!(s["properties"]["negative_query"].get("maxLength").is_none());
        let s = poison().json_schema(true);
        assert_eq!(s["properties"]["negative_query"]["maxLength"], 200);
        assert_eq!(s["properties"]["negative_query"]["minLength"], 1);
        let c = ResponseShape::Choice {
            name: "judgment".into(),
            letters: vec!['A', 'B', 'C'],
        };
        assert_eq!(
            c.json_schema(true)["properties"]["answer"]["enum"],
            json!(["A", "B", "C"])
        );
    }

    #[test]
    fn grammar_text_is_as_documented() {
        let g = poison().gbnf();
        let lines: Vec<&str> = g.lines().collect();
        assert_eq!(lines[0], "# infembed step: poison");
        assert_eq!(
            lines[1],
            r#"root ::= "{" "\"negative_instruction\"" ": " v0 ", " "\"negative_query\"" ": " v1 "}""#
        );
        assert_eq!(lines[2], r#"v0 ::= "\"" first line-char{0,299} "\"""#);
        assert_eq!(lines[3], r#"v1 ::= "\"" first line-char{0,199} "\"""#);
        let c = ResponseShape::Choice {
            name: "judgment".into(),
            letters: vec!['A', 'B'],
        };
        assert_eq!(
            c.gbnf().lines().nth(1).unwrap(),
            r#"root ::= "{\"answer\": \"" ("A" | "B") "\"}""#
        );
    }

    #[test]
    fn literals_escape_specials() {
        assert_eq!(gbnf_literal("a\"b\\c\nd\u{1}"), r#""a\"b\\c\nd\x01""#);
    }

    #[test]
    fn budgets_cover_the_longest_admitted_answer() {
        // The longest answer the poison grammar admits: every character an escaped quote.
        let longest = format!(
            "{{\"negative_instruction\": \"{}\", \"negative_query\": \"{}\"}}",
            "\\\"".repeat(300),
            "\\\"".repeat(200)
        );
        assert!(poison().token_budget() as usize >= longest.len());
        let judge = r#"{"answer": "Z"}"#;
        let c = ResponseShape::Choice {
            name: "judgment".into(),
            letters: vec!['Z'],
        };
        assert!(c.token_budget() as usize >= judge.len());
    }
}
