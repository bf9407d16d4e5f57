//! [`LossConfig`]: the serializable choice of objective, validated into a [`ContrastiveLoss`](crate::ContrastiveLoss).

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
pub use crate::variable::{Variable, VariableSet};

/// The paper's default temperature.
pub const DEFAULT_TEMPERATURE: f64 = 0.05;

/// The constant the reference code adds to the temperature before inverting it
/// (`scale = 1 / (t + 1e-4)`).
pub const REFERENCE_TEMPERATURE_EPSILON: f64 = 1e-4;

/// Whether the set of variables is contrasted by separate softmaxes or by one softmax.
///
/// The meaning depends on [`Convention`]: under [`Convention::Paper`] (the default) the names
/// follow the paper's equations; under [`Convention::ReferenceCode`] they follow the published
/// code, which swaps them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ObjectiveKind {
    /// Paper Eq. 6: a sum of separate log-softmax terms, one per variable.
    Univariate,
    /// Paper Eq. 7: one log-softmax whose denominator adds every variable's marginal sum.
    Multivariate,
}

impl ObjectiveKind {
    fn name(self) -> &'static str {
        match self {
            ObjectiveKind::Univariate => "univariate",
            ObjectiveKind::Multivariate => "multivariate",
        }
    }
}

/// Whose definition of [`ObjectiveKind`] to follow.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Convention {
    /// The paper's equations (default): univariate = sum of per-variable softmaxes,
    /// multivariate = one joint softmax (positive counted per marginal unless
    /// [`PositiveCount::Once`]).
    #[default]
    Paper,
    /// The published InF-Embed code: `model_type = map` (called univariate there) is one joint
    /// softmax with the duplicate positives masked (positive counted once); `map_add` (called
    /// multivariate there) is a sum of per-variable cross-entropies.
    ReferenceCode,
}

impl Convention {
    fn name(self) -> &'static str {
        match self {
            Convention::Paper => "paper",
            Convention::ReferenceCode => "reference_code",
        }
    }
}

/// How often a joint softmax's denominator holds the positive pair's term.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PositiveCount {
    /// Once per marginal sum, as Eqs. 15-21 are written: a joint softmax over n variables has the
    /// positive n times in its denominator (so its minimum is `ln n`, not 0).
    PerMarginal,
    /// Exactly once (the duplicates are masked), as the reference code's `map` model does.
    Once,
}

/// How the cosine similarity is scaled into a logit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Scale {
    /// `s = cos / t` (the paper).
    #[default]
    InverseTemperature,
    /// `s = cos / (t + 1e-4)` (the reference code).
    ReferenceCode,
}

/// How per-row losses are reduced to the scalar that [`ContrastiveLoss::forward`](crate::ContrastiveLoss::forward) returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Reduction {
    /// Mean over the B rows (default; what the paper and the reference code use).
    #[default]
    Mean,
    /// Sum over the B rows.
    Sum,
}

/// The objective as it is computed, after [`LossConfig`] resolved the naming convention.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Objective {
    /// `sum over v in set of l_v`: separate log-softmax terms (paper univariate, reference-code
    /// `map_add`).
    SumOfTerms(VariableSet),
    /// One log-softmax over the concatenated marginal blocks (paper multivariate, reference-code
    /// `map`).
    Joint(VariableSet, PositiveCount),
}

impl Objective {
    /// The variables the objective contrasts.
    pub fn variables(self) -> VariableSet {
        match self {
            Objective::SumOfTerms(v) | Objective::Joint(v, _) => v,
        }
    }
}

fn default_temperature() -> f64 {
    DEFAULT_TEMPERATURE
}

/// The training objective, as a training config file names it.
///
/// JSON form (only `kind` and `terms` are required; unknown fields are rejected):
///
/// ```json
/// { "kind": "multivariate", "terms": ["P", "I", "IQ"], "temperature": 0.05,
///   "scale": "inverse_temperature", "convention": "paper", "positive": "per_marginal",
///   "reduction": "mean" }
/// ```
///
/// [`LossConfig::init`] validates it (typed [`Error`]s for an empty or duplicated `terms`, a
/// multivariate objective of one variable, a non-positive temperature, and a `positive` that
/// does not apply) and returns the [`ContrastiveLoss`](crate::ContrastiveLoss), so a bad config fails before training.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LossConfig {
    /// Univariate (separate softmaxes) or multivariate (one joint softmax), per `convention`.
    pub kind: ObjectiveKind,
    /// The variables contrasted: a non-empty list of distinct `"P"`, `"I"`, `"IQ"`.
    pub terms: Vec<Variable>,
    /// Softmax temperature `t` (default 0.05).
    #[serde(default = "default_temperature")]
    pub temperature: f64,
    /// `1/t` (default) or the reference code's `1/(t + 1e-4)`.
    #[serde(default)]
    pub scale: Scale,
    /// Whose meaning of `kind` to use (default: the paper's).
    #[serde(default)]
    pub convention: Convention,
    /// For a joint-softmax objective only: how often the positive enters the denominator.
    /// Absent: [`PositiveCount::PerMarginal`] under the paper convention,
    /// [`PositiveCount::Once`] under the reference-code convention.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub positive: Option<PositiveCount>,
    /// Mean (default) or sum over rows.
    #[serde(default)]
    pub reduction: Reduction,
}

impl LossConfig {
    /// A config with the given kind and terms and every other field at its default.
    pub fn new(kind: ObjectiveKind, terms: &[Variable]) -> Self {
        LossConfig {
            kind,
            terms: terms.to_vec(),
            temperature: DEFAULT_TEMPERATURE,
            scale: Scale::default(),
            convention: Convention::default(),
            positive: None,
            reduction: Reduction::default(),
        }
    }

    /// Sets the temperature.
    pub fn with_temperature(mut self, temperature: f64) -> Self {
        self.temperature = temperature;
        self
    }

    /// Sets the logit scale rule.
    pub fn with_scale(mut self, scale: Scale) -> Self {
        self.scale = scale;
        self
    }

    /// Sets the naming convention.
    pub fn with_convention(mut self, convention: Convention) -> Self {
        self.convention = convention;
        self
    }

    /// Sets how often a joint softmax counts the positive.
    pub fn with_positive(mut self, positive: PositiveCount) -> Self {
        self.positive = Some(positive);
        self
    }

    /// Sets the reduction.
    pub fn with_reduction(mut self, reduction: Reduction) -> Self {
        self.reduction = reduction;
        self
    }

    /// The multiplier turning a cosine into a logit: `1/t` or `1/(t + 1e-4)`.
    pub fn logit_scale(&self) -> f64 {
        match self.scale {
            Scale::InverseTemperature => 1.0 / self.temperature,
            Scale::ReferenceCode => 1.0 / (self.temperature + REFERENCE_TEMPERATURE_EPSILON),
        }
    }

    /// Checks the config and resolves it into the [`Objective`] it computes.
    pub fn objective(&self) -> Result<Objective> {
        if !(self.temperature.is_finite() && self.temperature > 0.0) {
            return Err(Error::InvalidTemperature(self.temperature));
        }
        let mut seen = VariableSet::EMPTY;
        for &v in &self.terms {
            if seen.contains(v) {
                return Err(Error::DuplicateTerm(v));
            }
            seen = VariableSet::of(&[v]).union(seen);
        }
        if seen.is_empty() {
            return Err(Error::EmptyTerms);
        }
        if self.kind == ObjectiveKind::Multivariate && seen.len() == 1 {
            return Err(Error::SingleVariableMultivariate(self.terms[0]));
        }
        let joint = matches!(
            (self.convention, self.kind),
            (Convention::Paper, ObjectiveKind::Multivariate)
                | (Convention::ReferenceCode, ObjectiveKind::Univariate)
        );
        if joint {
            let default = match self.convention {
                Convention::Paper => PositiveCount::PerMarginal,
                Convention::ReferenceCode => PositiveCount::Once,
            };
            Ok(Objective::Joint(seen, self.positive.unwrap_or(default)))
        } else if self.positive.is_some() {
            Err(Error::PositiveNotApplicable {
                kind: self.kind.name(),
                convention: self.convention.name(),
            })
        } else {
            Ok(Objective::SumOfTerms(seen))
        }
    }

    /// Parses (without validating; call [`LossConfig::init`]) a config from a JSON string; the
    /// error carries line and column.
    pub fn from_json_str(json: &str) -> std::result::Result<Self, serde_json::Error> {
        serde_json::from_str(json)
    }

    /// Reads, parses and validates a JSON config file; every error names the file (and, for
    /// syntax or field errors, the line and column).
    pub fn from_json_file(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|source| Error::Io {
            path: path.to_path_buf(),
            source,
        })?;
        let config: LossConfig = serde_json::from_str(&text).map_err(|source| Error::Parse {
            path: path.to_path_buf(),
            line: source.line(),
            column: source.column(),
            source,
        })?;
        config.objective().map_err(|e| Error::InvalidFile {
            path: path.to_path_buf(),
            source: Box::new(e),
        })?;
        Ok(config)
    }
}

impl burn::config::Config for LossConfig {}
