//! The InF-IR training record.

use std::sync::Arc;

use serde_json::{Map, Value};

use crate::error::Problem;

/// One InF-IR record: a positive (instruction, query, passage) triple plus its two poisoned variants.
///
/// Field names are the public dataset's. Texts are kept exactly as read (no trimming, no Unicode
/// normalisation); they are shared `Arc<str>` so that [`crate::flatten()`] can hand the same text to
/// several rows without copying.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct InfIrRecord {
    /// Q+: the original query.
    pub query_positive: Arc<str>,
    /// I+: the original instruction.
    pub instruction_positive: Arc<str>,
    /// P+: the passage relevant to (I+, Q+). Read from `document_positive`, or `document` when
    /// `document_positive` is absent.
    pub document_positive: Arc<str>,
    /// Q-: the poisoned query.
    pub query_negative: Arc<str>,
    /// I-: the poisoned instruction.
    pub instruction_negative: Arc<str>,
    /// P1-: relevant to (I-, Q+), not to (I+, Q+).
    pub hard_negative_document_1: Arc<str>,
    /// P2-: relevant to (I+, Q-), not to (I+, Q+).
    pub hard_negative_document_2: Arc<str>,
}

/// The seven text fields of an [`InfIrRecord`], in the order the public dataset lists them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum RecordField {
    /// `query_positive`
    QueryPositive,
    /// `instruction_positive`
    InstructionPositive,
    /// `document_positive` (alias `document`)
    DocumentPositive,
    /// `query_negative`
    QueryNegative,
    /// `instruction_negative`
    InstructionNegative,
    /// `hard_negative_document_1`
    HardNegativeDocument1,
    /// `hard_negative_document_2`
    HardNegativeDocument2,
}

impl RecordField {
    /// All fields, in dataset order.
    pub const ALL: [RecordField; 7] = [
        RecordField::QueryPositive,
        RecordField::InstructionPositive,
        RecordField::DocumentPositive,
        RecordField::QueryNegative,
        RecordField::InstructionNegative,
        RecordField::HardNegativeDocument1,
        RecordField::HardNegativeDocument2,
    ];

    /// The field's name in the public dataset.
    pub fn name(self) -> &'static str {
        match self {
            RecordField::QueryPositive => "query_positive",
            RecordField::InstructionPositive => "instruction_positive",
            RecordField::DocumentPositive => "document_positive",
            RecordField::QueryNegative => "query_negative",
            RecordField::InstructionNegative => "instruction_negative",
            RecordField::HardNegativeDocument1 => "hard_negative_document_1",
            RecordField::HardNegativeDocument2 => "hard_negative_document_2",
        }
    }

    /// Another accepted name for the field (`document` for `document_positive`), used only when
    /// the main name is absent.
    pub fn alias(self) -> Option<&'static str> {
        match self {
            RecordField::DocumentPositive => Some("document"),
            _ => None,
        }
    }
}

impl std::fmt::Display for RecordField {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl InfIrRecord {
    /// The text of one field.
    pub fn field(&self, field: RecordField) -> &Arc<str> {
        match field {
            RecordField::QueryPositive => &self.query_positive,
            RecordField::InstructionPositive => &self.instruction_positive,
            RecordField::DocumentPositive => &self.document_positive,
            RecordField::QueryNegative => &self.query_negative,
            RecordField::InstructionNegative => &self.instruction_negative,
            RecordField::HardNegativeDocument1 => &self.hard_negative_document_1,
            RecordField::HardNegativeDocument2 => &self.hard_negative_document_2,
        }
    }

    /// Builds a record from seven texts given in [`RecordField::ALL`] order, checking each the way
    /// the readers do (no empty or whitespace-only text).
    ///
    /// # Errors
    /// The first bad field and its problem.
    pub fn from_texts(texts: [&str; 7]) -> std::result::Result<Self, (RecordField, Problem)> {
        let mut out: [Option<Arc<str>>; 7] = Default::default();
        for (i, (field, text)) in RecordField::ALL.iter().zip(texts).enumerate() {
            out[i] = Some(check_text(text).map_err(|p| (*field, p))?);
        }
        let [a, b, c, d, e, f, g] = out.map(|t| t.expect("all seven fields were set"));
        Ok(InfIrRecord {
            query_positive: a,
            instruction_positive: b,
            document_positive: c,
            query_negative: d,
            instruction_negative: e,
            hard_negative_document_1: f,
            hard_negative_document_2: g,
        })
    }

    /// Reads a record from a parsed JSON object. Unknown keys are ignored.
    ///
    /// # Errors
    /// The first bad field (in [`RecordField::ALL`] order) and its problem. The field is reported
    /// under its main name even when its alias was looked at.
    pub fn from_json_object(
        object: &Map<String, Value>,
    ) -> std::result::Result<Self, (RecordField, Problem)> {
        let mut texts: [&str; 7] = [""; 7];
        for (slot, field) in texts.iter_mut().zip(RecordField::ALL) {
            let value = object
                .get(field.name())
                .or_else(|| field.alias().and_then(|a| object.get(a)));
            *slot = match value {
                None => return Err((field, Problem::Missing)),
                Some(Value::Null) => return Err((field, Problem::Null)),
                Some(Value::String(s)) => s.as_str(),
                Some(other) => {
                    return Err((
                        field,
                        Problem::WrongType {
                            found: json_type_name(other).to_string(),
                            expected: "string",
                        },
                    ));
                }
            };
        }
        Self::from_texts(texts)
    }

    /// The record as a JSON object with the public dataset's field names (the inverse of
    /// [`InfIrRecord::from_json_object`]).
    pub fn to_json(&self) -> Value {
        let mut map = Map::new();
        for field in RecordField::ALL {
            map.insert(
                field.name().to_string(),
                Value::String(self.field(field).to_string()),
            );
        }
        Value::Object(map)
    }
}

/// Checks that a text field is not empty or whitespace-only.
pub(crate) fn check_text(text: &str) -> std::result::Result<Arc<str>, Problem> {
    if text.trim().is_empty() {
        Err(Problem::Empty)
    } else {
        Ok(Arc::from(text))
    }
}

/// The JSON type name of a value, for error messages.
pub(crate) fn json_type_name(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}
