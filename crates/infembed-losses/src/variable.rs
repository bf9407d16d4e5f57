//! The variables a negative can vary (the paper's P, I and IQ) and sets of them.

use std::fmt;

use serde::{Deserialize, Serialize};

/// One of the three variables of a triple that an objective can vary to build negatives.
///
/// Serialized as `"P"`, `"I"`, `"IQ"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Variable {
    /// Passage negatives: row i's instruction-aware query `iq[i,i]` against every passage `p[m]`.
    #[serde(rename = "P")]
    P,
    /// Instruction negatives: row i's passage against its query paired with other instructions,
    /// `iq[j,i]`.
    #[serde(rename = "I")]
    I,
    /// Instruction-query negatives: row i's passage against every row's own pair `iq[k,k]`
    /// (appendix C's diagonal convention).
    #[serde(rename = "IQ")]
    Iq,
}

impl Variable {
    /// All variables in canonical order (P, I, IQ); objectives concatenate blocks in this order.
    pub const ALL: [Variable; 3] = [Variable::P, Variable::I, Variable::Iq];

    /// The paper's name of the variable.
    pub fn name(self) -> &'static str {
        match self {
            Variable::P => "P",
            Variable::I => "I",
            Variable::Iq => "IQ",
        }
    }

    fn bit(self) -> u8 {
        match self {
            Variable::P => 1,
            Variable::I => 2,
            Variable::Iq => 4,
        }
    }
}

impl fmt::Display for Variable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A set of [`Variable`]s (possibly empty), iterated in canonical order P, I, IQ.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct VariableSet(u8);

impl VariableSet {
    /// The empty set.
    pub const EMPTY: VariableSet = VariableSet(0);
    /// `{P, I, IQ}`.
    pub const ALL: VariableSet = VariableSet(7);

    /// The set holding exactly the given variables (duplicates collapse).
    pub fn of(variables: &[Variable]) -> Self {
        VariableSet(variables.iter().fold(0, |acc, v| acc | v.bit()))
    }

    /// Whether `v` is in the set.
    pub fn contains(self, v: Variable) -> bool {
        self.0 & v.bit() != 0
    }

    /// Number of variables in the set.
    pub fn len(self) -> usize {
        self.0.count_ones() as usize
    }

    /// Whether the set is empty.
    pub fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// The variables in canonical order (P, I, IQ).
    pub fn iter(self) -> impl Iterator<Item = Variable> {
        Variable::ALL.into_iter().filter(move |v| self.contains(*v))
    }

    /// The union of two sets.
    pub fn union(self, other: VariableSet) -> VariableSet {
        VariableSet(self.0 | other.0)
    }

    /// All seven non-empty subsets, singletons first, then pairs, then `{P, I, IQ}`.
    pub fn non_empty_subsets() -> [VariableSet; 7] {
        use Variable::*;
        [
            VariableSet::of(&[P]),
            VariableSet::of(&[I]),
            VariableSet::of(&[Iq]),
            VariableSet::of(&[P, I]),
            VariableSet::of(&[P, Iq]),
            VariableSet::of(&[I, Iq]),
            VariableSet::ALL,
        ]
    }
}

impl fmt::Display for VariableSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = self.iter().map(Variable::name).collect();
        write!(f, "{{{}}}", names.join(","))
    }
}
