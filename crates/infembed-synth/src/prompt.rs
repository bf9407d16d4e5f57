//! Prompt templates: the built-in texts in `prompts/` (compiled in), optionally replaced file by
//! file from a folder.
//!
//! A template is plain text with `{{name}}` placeholders. Each template has a fixed set of allowed
//! placeholders, all of which must appear (a template that leaves out the query, say, would make
//! the step meaningless); an unknown placeholder is an error too. Text outside placeholders is
//! sent as is, so JSON examples with single braces are fine.

use std::path::Path;

use crate::error::{Error, Result};

/// The template names (also their file names, with `.txt`) and the placeholders each must use.
pub const TEMPLATES: [(&str, &[&str]); 7] = [
    ("generator_system", &[]),
    ("instruction", &["query", "passage"]),
    ("poison", &["query", "instruction", "passage"]),
    (
        "negative_passage_1",
        &["query", "instruction", "negative_instruction", "passage"],
    ),
    (
        "negative_passage_2",
        &["query", "negative_query", "instruction", "passage"],
    ),
    ("judge_system", &[]),
    ("judge", &["query", "instruction", "options", "letters"]),
];

const BUILT_IN: [&str; 7] = [
    include_str!("../prompts/generator_system.txt"),
    include_str!("../prompts/instruction.txt"),
    include_str!("../prompts/poison.txt"),
    include_str!("../prompts/negative_passage_1.txt"),
    include_str!("../prompts/negative_passage_2.txt"),
    include_str!("../prompts/judge_system.txt"),
    include_str!("../prompts/judge.txt"),
];

/// One checked template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Template {
    name: &'static str,
    text: String,
}

impl Template {
    /// Checks `text` against the placeholders allowed for template `name` (one of [`TEMPLATES`]).
    ///
    /// # Errors
    /// [`Error::Template`] for an unknown template name, an unknown or unclosed placeholder, or a
    /// required placeholder that never appears. `origin` names the source in the message.
    pub fn new(name: &'static str, text: String, origin: &str) -> Result<Self> {
        let err = |problem: String| Error::Template {
            origin: origin.to_string(),
            template: name,
            problem,
        };
        let allowed = TEMPLATES
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, a)| *a)
            .ok_or_else(|| err("no such template".into()))?;
        let mut seen = vec![false; allowed.len()];
        let mut rest = text.as_str();
        while let Some(start) = rest.find("{{") {
            let after = &rest[start + 2..];
            let end = after
                .find("}}")
                .ok_or_else(|| err("a `{{` is never closed by `}}`".into()))?;
            let key = after[..end].trim();
            match allowed.iter().position(|a| *a == key) {
                Some(i) => seen[i] = true,
                None => {
                    return Err(err(format!(
                        "unknown placeholder `{{{{{key}}}}}` (allowed: {})",
                        if allowed.is_empty() {
                            "none".to_string()
                        } else {
                            allowed.join(", ")
                        }
                    )));
                }
            }
            rest = &after[end + 2..];
        }
        if let Some(i) = seen.iter().position(|s| !s) {
            return Err(err(format!(
                "placeholder `{{{{{}}}}}` is required but never used",
                allowed[i]
            )));
        }
        Ok(Template { name, text })
    }

    /// The template's name.
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// The raw template text.
    pub fn text(&self) -> &str {
        &self.text
    }

    /// Substitutes every `{{key}}` with its value from `values` (a key not in `values` becomes
    /// empty; [`Template::new`] already guaranteed the keys are the allowed ones). Values are
    /// inserted verbatim and never re-scanned for placeholders. Surrounding whitespace of the
    /// template is trimmed.
    pub fn render(&self, values: &[(&str, &str)]) -> String {
        let mut out = String::with_capacity(self.text.len() + 256);
        let mut rest = self.text.as_str();
        while let Some(start) = rest.find("{{") {
            out.push_str(&rest[..start]);
            let after = &rest[start + 2..];
            let Some(end) = after.find("}}") else {
                out.push_str(&rest[start..]);
                rest = "";
                break;
            };
            let key = after[..end].trim();
            if let Some((_, v)) = values.iter().find(|(k, _)| *k == key) {
                out.push_str(v);
            }
            rest = &after[end + 2..];
        }
        out.push_str(rest);
        out.trim().to_string()
    }
}

/// All seven templates of the pipeline.
#[derive(Debug, Clone)]
pub struct PromptSet {
    /// System message for every generator request.
    pub generator_system: Template,
    /// Q+, P+ -> I+.
    pub instruction: Template,
    /// I+, Q+, P+ -> I-, Q-.
    pub poison: Template,
    /// Q+, I-, (I+ to avoid), P+ as a style example -> P1-.
    pub negative_passage_1: Template,
    /// Q-, I+, (Q+ to avoid), P+ as a style example -> P2-.
    pub negative_passage_2: Template,
    /// System message for every judge request.
    pub judge_system: Template,
    /// Instruction, query, lettered options -> one letter.
    pub judge: Template,
}

impl PromptSet {
    /// The built-in templates (the files in this crate's `prompts/` folder).
    pub fn built_in() -> Self {
        Self::build(|i, _| Ok((BUILT_IN[i].to_string(), "<built-in>".to_string())))
            .expect("the built-in templates are valid (checked by a unit test)")
    }

    /// The built-in templates, each replaced by `dir/NAME.txt` where that file exists.
    ///
    /// # Errors
    /// I/O reading a file, or an invalid template (naming the file).
    pub fn from_dir(dir: &Path) -> Result<Self> {
        Self::build(|i, name| {
            let path = dir.join(format!("{name}.txt"));
            if path.is_file() {
                let text = std::fs::read_to_string(&path).map_err(|source| Error::Io {
                    path: path.clone(),
                    source,
                })?;
                Ok((text, path.display().to_string()))
            } else {
                Ok((BUILT_IN[i].to_string(), "<built-in>".to_string()))
            }
        })
    }

    fn build(
        mut source: impl FnMut(usize, &'static str) -> Result<(String, String)>,
    ) -> Result<Self> {
        let mut t = Vec::with_capacity(7);
        for (i, (name, _)) in TEMPLATES.iter().enumerate() {
            let (text, origin) = source(i, name)?;
            t.push(Template::new(name, text, &origin)?);
        }
        let mut it = t.into_iter();
        let mut next = || it.next().expect("seven templates were built");
        Ok(PromptSet {
            generator_system: next(),
            instruction: next(),
            poison: next(),
            negative_passage_1: next(),
            negative_passage_2: next(),
            judge_system: next(),
            judge: next(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn built_in_templates_are_valid() {
        let p = PromptSet::built_in();
        assert!(p.instruction.text().contains("{{query}}"));
    }

    #[test]
    fn unknown_and_missing_placeholders_are_errors() {
        let e = Template::new(
            "instruction",
            "{{query}} {{passage}} {{oops}}".into(),
            "x.txt",
        )
        .unwrap_err();
        assert!(e.to_string().contains("oops"), "{e}");
        assert!(e.to_string().contains("x.txt"), "{e}");
        let e = Template::new("instruction", "{{query}} only".into(), "x.txt").unwrap_err();
        assert!(e.to_string().contains("passage"), "{e}");
        let e = Template::new("instruction", "{{query}} {{passage".into(), "x.txt").unwrap_err();
        assert!(e.to_string().contains("never closed"), "{e}");
    }

    #[test]
    fn render_substitutes_verbatim_without_rescanning() {
        let t = Template::new(
            "instruction",
            "  Q={{ query }} P={{passage}} {\"a\": 1}  ".into(),
            "t",
        )
        .unwrap();
        let s = t.render(&[("query", "{{passage}}"), ("passage", "p")]);
        assert_eq!(s, "Q={{passage}} P=p {\"a\": 1}");
    }
}
