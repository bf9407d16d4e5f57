//! The objectives on burn tensors: batch layout, marginal logits, and [`ContrastiveLoss`].
//!
//! # Batch layout
//!
//! | field | shape | holds |
//! |---|---|---|
//! | `p` | `[B, d]` | `p[m]`, the passage of row m |
//! | `iq` | `[B, d]` | `iq[i,i]`, row i's own instruction with its own query |
//! | `iq_instr` | `[B, K, d]` | `iq_instr[i,k] = iq[j_k, i]`: row i's *query* with another row's instruction `j_k != i` |
//! | `p_extra` | `[M, d]` | extra passages (e.g. mined hard negatives), P-negatives of every row; optional |
//!
//! All embeddings are expected to be L2-normalized already (the encoder does it); the loss takes
//! plain dot products, so the logit of a pair is `s(a, b) = scale * <a, b>` with
//! `scale = 1/t` or `1/(t + 1e-4)`.
//!
//! # Marginal logits of row i
//!
//! The positive is `s_i = s(p_i, iq[i,i])`. The negatives vary one variable at a time:
//!
//! - P: `s(p_m, iq[i,i])` for `m != i` (the other passages of the batch), then
//!   `s(p_extra[m], iq[i,i])` for every extra passage `m < M`;
//! - IQ: `s(p_i, iq[k,k])` for `k != i` (the other rows' own instruction-query pairs; appendix C
//!   uses this diagonal, not all `iq[j,k]`);
//! - I: `s(p_i, iq_instr[i,k])` for `k < K` (row i's query with K other instructions).
//!
//! A [`NegativeMask`] removes negatives that duplicate the positive (same passage text, same
//! instruction, same pair); a removed entry contributes nothing to any denominator. The positive
//! itself is never removed: diagonal entries of the `[B, B]` masks are ignored.
//!
//! # Objectives (per row; see `docs/losses.md` for the mapping to the paper and the reference code)
//!
//! - univariate term `l_v = lse(s_i, negatives_v) - s_i`;
//! - [`Objective::SumOfTerms`]: `sum over v of l_v`;
//! - [`Objective::Joint`] with [`PositiveCount::PerMarginal`]:
//!   `lse(s_i repeated |V| times, negatives of every v) - s_i` (each marginal sum includes the
//!   positive, as Eqs. 15-21 are written);
//! - [`Objective::Joint`] with [`PositiveCount::Once`]: `lse(s_i, negatives of every v) - s_i`.
//!
//! `lse` is log-sum-exp with the row maximum subtracted, so logits up to `|1/t|` for any
//! `t >= 0.01` (and far beyond) stay finite. Cost: one `[B, d] x [d, B]` product for P and IQ
//! together and one batched `[K, d] x [d, 1]` product per row for I: `O(B^2 d + B K d)` per
//! batch; the `O(B^3)` instruction-query combinations are never formed.

use burn::tensor::{Bool, Tensor};

use crate::config::{LossConfig, Objective, PositiveCount, Reduction};
use crate::error::{Error, Result};
use crate::variable::{Variable, VariableSet};

/// Which negatives a batch must not count (duplicates of the positive). `true` = excluded.
///
/// Every mask is optional; an absent mask excludes nothing. Diagonal entries of the `[B, B]`
/// masks are ignored (the positive always counts).
#[derive(Debug, Clone, Default)]
pub struct NegativeMask {
    /// `[B, B]`: `passages[i, m]` excludes passage `p[m]` as a P-negative of row i
    /// (e.g. `p[m]` has the same text as `p[i]`).
    pub passages: Option<Tensor<2, Bool>>,
    /// `[B, B]`: `pairs[i, k]` excludes `iq[k,k]` as an IQ-negative of row i
    /// (e.g. rows i and k have the same instruction and query).
    pub pairs: Option<Tensor<2, Bool>>,
    /// `[B, K]`: `instructions[i, k]` excludes `iq_instr[i, k]` as an I-negative of row i
    /// (e.g. the sampled instruction has the same text as row i's own).
    pub instructions: Option<Tensor<2, Bool>>,
    /// `[B, M]`: `extra_passages[i, m]` excludes `p_extra[m]` as a P-negative of row i (e.g. it
    /// has the same text as `p[i]`).
    pub extra_passages: Option<Tensor<2, Bool>>,
}

/// The embeddings of one batch, in the layout described in the [module docs](self).
#[derive(Debug, Clone)]
pub struct LossBatch {
    /// `[B, d]` passage embeddings `p[m]`.
    pub p: Tensor<2>,
    /// `[B, d]` own-pair embeddings `iq[i,i]`.
    pub iq: Tensor<2>,
    /// `[B, K, d]` row i's query with K other instructions; needed only by objectives with I.
    pub iq_instr: Option<Tensor<3>>,
    /// `[M, d]` extra passages that are P-negatives of every row (mined hard negatives); used
    /// only by objectives with P.
    pub p_extra: Option<Tensor<2>>,
    /// Negatives that must not count.
    pub mask: NegativeMask,
}

impl LossBatch {
    /// A batch with passages and own pairs only (enough for objectives over P and IQ).
    pub fn new(p: Tensor<2>, iq: Tensor<2>) -> Self {
        LossBatch {
            p,
            iq,
            iq_instr: None,
            p_extra: None,
            mask: NegativeMask::default(),
        }
    }

    /// Adds the `[B, K, d]` instruction negatives.
    pub fn with_instruction_negatives(mut self, iq_instr: Tensor<3>) -> Self {
        self.iq_instr = Some(iq_instr);
        self
    }

    /// Adds `[M, d]` extra passages, P-negatives of every row (see the [module docs](self)).
    pub fn with_extra_passages(mut self, p_extra: Tensor<2>) -> Self {
        self.p_extra = Some(p_extra);
        self
    }

    /// Sets the negative mask.
    pub fn with_mask(mut self, mask: NegativeMask) -> Self {
        self.mask = mask;
        self
    }

    /// Checks every present tensor against the layout and that the tensors `variables` need are
    /// there. Returns `(B, K, d)` (K = 0 without `iq_instr`).
    pub fn check(&self, variables: VariableSet) -> Result<(usize, usize, usize)> {
        let [b, d] = self.p.dims();
        if b == 0 || d == 0 {
            return Err(Error::EmptyBatch(vec![b, d]));
        }
        let expect = |tensor: &'static str, actual: Vec<usize>, want: Vec<usize>, text: String| {
            if actual == want {
                Ok(())
            } else {
                Err(Error::Shape {
                    tensor,
                    expected: text,
                    actual,
                })
            }
        };
        expect(
            "iq",
            self.iq.dims().to_vec(),
            vec![b, d],
            format!("[B, d] = [{b}, {d}]"),
        )?;
        let mut k = 0;
        if let Some(instr) = &self.iq_instr {
            let dims = instr.dims();
            k = dims[1];
            expect(
                "iq_instr",
                dims.to_vec(),
                vec![b, k, d],
                format!("[B, K, d] = [{b}, K, {d}]"),
            )?;
        } else if variables.contains(Variable::I) {
            return Err(Error::MissingTensor {
                variable: Variable::I,
                tensor: "iq_instr",
            });
        }
        let square = format!("[B, B] = [{b}, {b}]");
        if let Some(m) = &self.mask.passages {
            expect(
                "mask.passages",
                m.dims().to_vec(),
                vec![b, b],
                square.clone(),
            )?;
        }
        if let Some(m) = &self.mask.pairs {
            expect("mask.pairs", m.dims().to_vec(), vec![b, b], square)?;
        }
        if let Some(m) = &self.mask.instructions {
            if self.iq_instr.is_none() {
                return Err(Error::MissingTensor {
                    variable: Variable::I,
                    tensor: "iq_instr",
                });
            }
            expect(
                "mask.instructions",
                m.dims().to_vec(),
                vec![b, k],
                format!("[B, K] = [{b}, {k}]"),
            )?;
        }
        let mut m = 0;
        if let Some(extra) = &self.p_extra {
            m = extra.dims()[0];
            expect(
                "p_extra",
                extra.dims().to_vec(),
                vec![m, d],
                format!("[M, d] = [M, {d}]"),
            )?;
        }
        if let Some(mask) = &self.mask.extra_passages {
            expect(
                "mask.extra_passages",
                mask.dims().to_vec(),
                vec![b, m],
                format!("[B, M] = [{b}, {m}]"),
            )?;
        }
        Ok((b, k, d))
    }
}

/// Row-wise log-sum-exp of a `[B, N]` tensor, returned as `[B, 1]`.
///
/// Stable: the row maximum (detached; the gradient of log-sum-exp does not depend on it) is
/// subtracted before exponentiating. Entries equal to `-inf` contribute zero; each row must hold
/// at least one finite entry.
pub fn log_sum_exp(x: Tensor<2>) -> Tensor<2> {
    let max = x.clone().max_dim(1).detach();
    x.sub(max.clone()).exp().sum_dim(1).log().add(max)
}

/// The positive logit and the masked negative logits of every marginal, for one batch.
///
/// Excluded negatives (the positive's own slot in the `[B, B]` blocks and everything the
/// [`NegativeMask`] removes) hold `-inf`.
#[derive(Debug, Clone)]
pub struct MarginalLogits {
    /// `[B, 1]`: `s(p_i, iq[i,i])`.
    pub positive: Tensor<2>,
    /// `[B, B + M]`: P-negatives `s(p_m, iq[i,i])` at `[i, m]`, then the M extra passages'
    /// `s(p_extra[m], iq[i,i])` at `[i, B + m]`; present if P was requested.
    pub p: Option<Tensor<2>>,
    /// `[B, K]`: I-negatives `s(p_i, iq_instr[i,k])` at `[i, k]`; present if I was requested and
    /// K > 0.
    pub i: Option<Tensor<2>>,
    /// `[B, B]`: IQ-negatives `s(p_i, iq[k,k])` at `[i, k]`; present if IQ was requested.
    pub iq: Option<Tensor<2>>,
    /// The variables whose logits were computed.
    pub variables: VariableSet,
}

impl MarginalLogits {
    /// Computes the logits the variables in `variables` need, with `scale` (`1/t`) applied.
    ///
    /// # Panics
    ///
    /// If the batch violates the layout (see [`LossBatch::check`]); the message names the
    /// tensor and the dimensions.
    pub fn new(batch: &LossBatch, variables: VariableSet, scale: f64) -> Self {
        let (b, k, d) = match batch.check(variables) {
            Ok(dims) => dims,
            Err(e) => panic!("{e}"),
        };
        let device = batch.p.device();
        // S[i, m] = scale * <iq[i,i], p[m]>: row i holds the P-marginal, column i the IQ-marginal.
        let s = batch
            .iq
            .clone()
            .matmul(batch.p.clone().transpose())
            .mul_scalar(scale);
        // `true` off the diagonal.
        let off_diagonal = Tensor::<2, Bool>::diag_mask([b, b], 0, &device);
        let diagonal = off_diagonal.clone().bool_not();
        let positive = s.clone().mask_fill(off_diagonal.clone(), 0.0).sum_dim(1);

        let square_block = |block: Tensor<2>, mask: &Option<Tensor<2, Bool>>| {
            let excluded = match mask {
                Some(m) => diagonal.clone().bool_or(m.clone()),
                None => diagonal.clone(),
            };
            block.mask_fill(excluded, f32::NEG_INFINITY)
        };
        let p = variables.contains(Variable::P).then(|| {
            let own = square_block(s.clone(), &batch.mask.passages);
            match &batch.p_extra {
                Some(extra) if extra.dims()[0] > 0 => {
                    let logits = batch
                        .iq
                        .clone()
                        .matmul(extra.clone().transpose())
                        .mul_scalar(scale);
                    let logits = match &batch.mask.extra_passages {
                        Some(m) => logits.mask_fill(m.clone(), f32::NEG_INFINITY),
                        None => logits,
                    };
                    Tensor::cat(vec![own, logits], 1)
                }
                _ => own,
            }
        });
        let iq = variables
            .contains(Variable::Iq)
            .then(|| square_block(s.clone().transpose(), &batch.mask.pairs));
        let i = match (&batch.iq_instr, variables.contains(Variable::I) && k > 0) {
            (Some(instr), true) => {
                let logits = instr
                    .clone()
                    .matmul(batch.p.clone().reshape([b, d, 1]))
                    .reshape([b, k])
                    .mul_scalar(scale);
                Some(match &batch.mask.instructions {
                    Some(m) => logits.mask_fill(m.clone(), f32::NEG_INFINITY),
                    None => logits,
                })
            }
            _ => None,
        };
        MarginalLogits {
            positive,
            p,
            i,
            iq,
            variables,
        }
    }

    fn negatives(&self, v: Variable) -> Option<Tensor<2>> {
        match v {
            Variable::P => self.p.clone(),
            Variable::I => self.i.clone(),
            Variable::Iq => self.iq.clone(),
        }
    }

    /// Per-row univariate term `l_v = lse(s_i, negatives_v) - s_i`, shape `[B]`.
    ///
    /// # Panics
    ///
    /// If `v`'s logits were not requested in [`MarginalLogits::new`] (an I term with K = 0 is
    /// fine: it is identically 0).
    pub fn univariate(&self, v: Variable) -> Tensor<1> {
        self.joint(VariableSet::of(&[v]), PositiveCount::Once)
    }

    /// Per-row joint log-softmax over the marginals of `variables`, shape `[B]`.
    ///
    /// # Panics
    ///
    /// If `variables` is empty or holds a variable whose logits were not computed.
    ///
    /// With [`PositiveCount::PerMarginal`] the denominator holds the positive once per variable;
    /// with [`PositiveCount::Once`], once. For a single variable both equal
    /// [`MarginalLogits::univariate`].
    pub fn joint(&self, variables: VariableSet, positive: PositiveCount) -> Tensor<1> {
        assert!(
            !variables.is_empty(),
            "a joint softmax needs at least one variable"
        );
        let copies = match positive {
            PositiveCount::PerMarginal => variables.len(),
            PositiveCount::Once => 1,
        };
        let mut columns: Vec<Tensor<2>> = vec![self.positive.clone(); copies];
        for v in variables.iter() {
            assert!(
                self.variables.contains(v),
                "the {v} logits were not computed for this batch (computed: {})",
                self.variables
            );
            if let Some(block) = self.negatives(v) {
                columns.push(block);
            }
        }
        let [b, _] = self.positive.dims();
        let logits = Tensor::cat(columns, 1);
        log_sum_exp(logits).sub(self.positive.clone()).reshape([b])
    }
}

/// A validated InF-Embed objective; build it with [`LossConfig::init`](crate::LossConfig::init).
///
/// It holds no parameters: the trainer keeps it beside the model.
#[derive(Debug, Clone)]
pub struct ContrastiveLoss {
    objective: Objective,
    scale: f64,
    reduction: Reduction,
}

impl ContrastiveLoss {
    /// A loss computing `objective` with logits `scale * <a, b>`, reduced by `reduction`.
    ///
    /// Only the empty variable set is rejected ([`Error::EmptyTerms`]); prefer
    /// [`LossConfig::init`](crate::LossConfig::init), which also rejects the combinations a
    /// config must not name. Mathematically every objective is defined here, including a joint
    /// softmax over one variable (which equals that variable's univariate term).
    pub fn new(objective: Objective, scale: f64, reduction: Reduction) -> Result<Self> {
        if objective.variables().is_empty() {
            return Err(Error::EmptyTerms);
        }
        Ok(ContrastiveLoss {
            objective,
            scale,
            reduction,
        })
    }

    /// The objective computed.
    pub fn objective(&self) -> Objective {
        self.objective
    }

    /// The logit scale (`1/t` or `1/(t + 1e-4)`).
    pub fn scale(&self) -> f64 {
        self.scale
    }

    /// The reduction [`ContrastiveLoss::forward`] applies.
    pub fn reduction(&self) -> Reduction {
        self.reduction
    }

    /// Checks the batch against the layout and this objective's needs, without computing.
    pub fn check(&self, batch: &LossBatch) -> Result<()> {
        batch.check(self.objective.variables()).map(|_| ())
    }

    /// The reduced loss, shape `[1]`.
    ///
    /// # Panics
    ///
    /// If the batch violates the layout (see [`ContrastiveLoss::check`]).
    pub fn forward(&self, batch: &LossBatch) -> Tensor<1> {
        let rows = self.forward_no_reduction(batch);
        match self.reduction {
            Reduction::Mean => rows.mean(),
            Reduction::Sum => rows.sum(),
        }
    }

    /// The per-row loss, shape `[B]`.
    ///
    /// # Panics
    ///
    /// If the batch violates the layout (see [`ContrastiveLoss::check`]).
    pub fn forward_no_reduction(&self, batch: &LossBatch) -> Tensor<1> {
        let variables = self.objective.variables();
        let logits = MarginalLogits::new(batch, variables, self.scale);
        match self.objective {
            Objective::SumOfTerms(set) => set
                .iter()
                .map(|v| logits.univariate(v))
                .reduce(|a, b| a.add(b))
                .expect("ContrastiveLoss::new rejects an empty variable set"),
            Objective::Joint(set, positive) => logits.joint(set, positive),
        }
    }

    /// Every variable's univariate term per row (`[B]` each), for logging.
    ///
    /// # Panics
    ///
    /// If the batch violates the layout (see [`ContrastiveLoss::check`]).
    pub fn univariate_terms(&self, batch: &LossBatch) -> Vec<(Variable, Tensor<1>)> {
        let variables = self.objective.variables();
        let logits = MarginalLogits::new(batch, variables, self.scale);
        variables
            .iter()
            .map(|v| (v, logits.univariate(v)))
            .collect()
    }
}

impl LossConfig {
    /// Validates the config and builds the loss.
    pub fn init(&self) -> Result<ContrastiveLoss> {
        let objective = self.objective()?;
        ContrastiveLoss::new(objective, self.logit_scale(), self.reduction)
    }
}
