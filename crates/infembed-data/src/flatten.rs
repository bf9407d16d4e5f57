//! Flattening InF-IR records into training rows, as the paper's batches do.
//!
//! Each record becomes three rows, in this order:
//!
//! | index in record | role | instruction | query | passage |
//! |---|---|---|---|---|
//! | 0 | [`Role::Pos`] | I+ | Q+ | P+ |
//! | 1 | [`Role::InstrNeg`] | I- | Q+ | P1- |
//! | 2 | [`Role::QueryNeg`] | I+ | Q- | P2- |
//!
//! so record `r` owns rows `3r`, `3r + 1`, `3r + 2` of [`flatten`]'s output. Every row is a
//! *positive* pair for its own (instruction, query); the other rows of the batch supply the
//! negatives. A row remembers its record and role so that the losses can build instruction-, query-
//! and passage-marginal negatives (e.g. rows of one record share I+ or Q+, which is what makes the
//! poisoned variants hard).

use std::sync::Arc;

use crate::record::InfIrRecord;

/// Which of a record's three scenarios a row is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Role {
    /// (I+, Q+) -> P+.
    Pos,
    /// (I-, Q+) -> P1-: the instruction was poisoned.
    InstrNeg,
    /// (I+, Q-) -> P2-: the query was poisoned.
    QueryNeg,
}

impl Role {
    /// The three roles in row order.
    pub const ALL: [Role; 3] = [Role::Pos, Role::InstrNeg, Role::QueryNeg];

    /// The row's offset inside its record's three rows (0, 1, 2).
    pub fn offset(self) -> usize {
        match self {
            Role::Pos => 0,
            Role::InstrNeg => 1,
            Role::QueryNeg => 2,
        }
    }
}

/// One training row: an (instruction, query) pair and the passage relevant to it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Row {
    /// Index of the record the row came from (its position in the slice given to [`flatten`]).
    pub record: usize,
    /// Which scenario of the record.
    pub role: Role,
    /// The instruction (I+ or I-).
    pub instruction: Arc<str>,
    /// The query (Q+ or Q-).
    pub query: Arc<str>,
    /// The passage relevant to this (instruction, query).
    pub passage: Arc<str>,
}

impl Row {
    /// The row's index in [`flatten`]'s output: `3 * record + role.offset()`.
    pub fn index(&self) -> usize {
        3 * self.record + self.role.offset()
    }
}

/// The three rows of one record (`index` is stored as [`Row::record`]), in [`Role::ALL`] order.
pub fn record_rows(index: usize, record: &InfIrRecord) -> [Row; 3] {
    let row = |role, instruction: &Arc<str>, query: &Arc<str>, passage: &Arc<str>| Row {
        record: index,
        role,
        instruction: Arc::clone(instruction),
        query: Arc::clone(query),
        passage: Arc::clone(passage),
    };
    [
        row(
            Role::Pos,
            &record.instruction_positive,
            &record.query_positive,
            &record.document_positive,
        ),
        row(
            Role::InstrNeg,
            &record.instruction_negative,
            &record.query_positive,
            &record.hard_negative_document_1,
        ),
        row(
            Role::QueryNeg,
            &record.instruction_positive,
            &record.query_negative,
            &record.hard_negative_document_2,
        ),
    ]
}

/// Flattens records into `3 * records.len()` rows; record `r` gives rows `3r..3r + 3` (see the
/// module docs). Texts are shared with the records, not copied.
pub fn flatten(records: &[InfIrRecord]) -> Vec<Row> {
    let mut rows = Vec::with_capacity(3 * records.len());
    for (i, record) in records.iter().enumerate() {
        rows.extend(record_rows(i, record));
    }
    rows
}
