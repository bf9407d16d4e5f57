//! InF-Embed training objectives on burn tensors.
//!
//! The paper "Towards Better Instruction Following Retrieval Models" (2025) trains on triples
//! (P, I, Q) and contrasts a positive against negatives made by varying one variable at a time
//! over the batch ("marginal" negatives):
//!
//! - **P**: other passages `p[m]` against row i's instruction-aware query `iq[i,i]`;
//! - **I**: row i's query with other instructions, `iq[j,i]`, against `p[i]`;
//! - **IQ**: other rows' pairs `iq[k,k]` against `p[i]` (appendix C's diagonal convention).
//!
//! Objectives over a set of variables V (a [`LossConfig`] picks one):
//!
//! - **univariate** (paper Eq. 6, appendix C Eqs. 8-14): `sum over v in V` of a separate
//!   log-softmax `l_v = -log( e^{s+} / (e^{s+} + sum of e^{negatives_v}) )`;
//! - **multivariate** (Eq. 7, Eqs. 15-21): one log-softmax whose denominator adds every
//!   variable's marginal sum. As the equations are written each marginal sum includes the
//!   positive ([`PositiveCount::PerMarginal`], the default); [`PositiveCount::Once`] counts it
//!   once.
//!
//! The published reference code swaps the names (its "univariate" is one softmax with the
//! duplicate positives masked, its "multivariate" a sum of cross-entropies);
//! [`Convention::ReferenceCode`] reproduces it, and [`Scale::ReferenceCode`] its logit scale
//! `1/(t + 1e-4)`. `docs/losses.md` in the repository maps every name.
//!
//! The loss sees embeddings, not models: [`LossBatch`] holds `p: [B, d]`, `iq: [B, d]`
//! (`iq[i,i]`), optionally `iq_instr: [B, K, d]` (row i's query with K other instructions) and a
//! [`NegativeMask`] of duplicates that must not count as negatives. The same code runs on every
//! burn device (CPU `flex` by default; the `cuda` feature adds CUDA).
//!
//! # Worked example
//!
//! Two rows, `d = 2`, temperature 1 (so a logit is the plain dot product). Passages and own
//! pairs are the unit vectors, `p = iq = [[1, 0], [0, 1]]`, and each row's query with the other
//! row's instruction points at the other passage: `iq_instr = [[[0, 1]], [[1, 0]]]` (K = 1).
//! Every row then has positive logit 1 and one negative of logit 0 per variable, so by hand:
//!
//! - each univariate term: `l = ln(e^1 + e^0) - 1 = ln(1 + 1/e) = 0.3132617`;
//! - univariate `{P, I, IQ}`: `3 x 0.3132617 = 0.9397851`;
//! - multivariate `{P, I, IQ}`, positive per marginal: `ln(3e + 3) - 1 = ln 3 + 0.3132617
//!   = 1.4118740`;
//! - multivariate `{P, I, IQ}`, positive once: `ln(e + 3) - 1 = 0.7436684`.
//!
//! ```
//! use burn::tensor::{Device, Tensor};
//! use infembed_losses::{LossBatch, LossConfig, ObjectiveKind, PositiveCount, Variable};
//!
//! let device = Device::flex();
//! let unit = Tensor::<2>::from_floats([[1.0, 0.0], [0.0, 1.0]], &device);
//! let iq_instr = Tensor::<3>::from_floats([[[0.0, 1.0]], [[1.0, 0.0]]], &device);
//! let batch = LossBatch::new(unit.clone(), unit).with_instruction_negatives(iq_instr);
//!
//! let all = [Variable::P, Variable::I, Variable::Iq];
//! let value = |config: LossConfig| -> f32 {
//!     let loss = config.with_temperature(1.0).init().unwrap();
//!     loss.forward(&batch).try_to_vec_as::<f32>().unwrap()[0]
//! };
//! let close = |a: f32, b: f32| (a - b).abs() < 1e-6;
//!
//! assert!(close(value(LossConfig::new(ObjectiveKind::Univariate, &[Variable::P])), 0.3132617));
//! assert!(close(value(LossConfig::new(ObjectiveKind::Univariate, &all)), 0.9397851));
//! assert!(close(value(LossConfig::new(ObjectiveKind::Multivariate, &all)), 1.4118740));
//! let once = LossConfig::new(ObjectiveKind::Multivariate, &all).with_positive(PositiveCount::Once);
//! assert!(close(value(once), 0.7436684));
//! ```
//!
//! # Config
//!
//! ```
//! use infembed_losses::{Error, LossConfig};
//!
//! let config = LossConfig::from_json_str(r#"{ "kind": "multivariate", "terms": ["P", "IQ"] }"#)
//!     .unwrap();
//! assert_eq!(config.temperature, 0.05);
//! assert!(config.init().is_ok());
//!
//! let single = LossConfig::from_json_str(r#"{ "kind": "multivariate", "terms": ["I"] }"#).unwrap();
//! assert!(matches!(single.init(), Err(Error::SingleVariableMultivariate(_))));
//! ```

pub mod config;
pub mod error;
pub mod objective;
mod variable;

pub use config::{
    Convention, DEFAULT_TEMPERATURE, LossConfig, Objective, ObjectiveKind, PositiveCount,
    REFERENCE_TEMPERATURE_EPSILON, Reduction, Scale, Variable, VariableSet,
};
pub use error::{Error, Result};
pub use objective::{ContrastiveLoss, LossBatch, MarginalLogits, NegativeMask, log_sum_exp};
