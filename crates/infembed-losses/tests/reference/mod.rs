//! A straightforward f64 reference of the objectives, written from the paper's equations
//! (appendix C) and, separately, from the published reference code's structure. It shares no
//! code with the crate: plain loops, plain `exp`/`ln` (f64 has the range for logits up to
//! |1/0.01| = 100), no max subtraction, no masking tricks.
#![allow(dead_code)]

/// One batch in plain f64.
#[derive(Debug, Clone)]
pub struct RefBatch {
    /// B x d passages.
    pub p: Vec<Vec<f64>>,
    /// B x d own pairs iq[i,i].
    pub iq: Vec<Vec<f64>>,
    /// B x K x d: row i's query with K other instructions.
    pub iq_instr: Vec<Vec<Vec<f64>>>,
    /// B x B: mask_p[i][m] excludes p[m] as a P-negative of row i (diagonal ignored).
    pub mask_p: Vec<Vec<bool>>,
    /// B x B: mask_iq[i][k] excludes iq[k,k] as an IQ-negative of row i (diagonal ignored).
    pub mask_iq: Vec<Vec<bool>>,
    /// B x K: mask_i[i][k] excludes iq_instr[i][k].
    pub mask_i: Vec<Vec<bool>>,
    /// M x d extra passages (mined hard negatives): P-negatives of every row.
    pub extra_p: Vec<Vec<f64>>,
    /// B x M: mask_extra[i][m] excludes extra_p[m] as a P-negative of row i.
    pub mask_extra: Vec<Vec<bool>>,
}

impl RefBatch {
    pub fn b(&self) -> usize {
        self.p.len()
    }
    pub fn k(&self) -> usize {
        self.iq_instr.first().map_or(0, |r| r.len())
    }
}

/// The variables, by the paper's names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum V {
    P,
    I,
    IQ,
}

/// An objective in the paper's terms.
#[derive(Debug, Clone)]
pub enum RefObjective {
    /// Eq. 6: sum of separate log-softmax terms.
    Univariate(Vec<V>),
    /// Eq. 7: one log-softmax; `once` = the positive counted once instead of per marginal.
    Multivariate { vars: Vec<V>, once: bool },
}

fn dot(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// exp(s(p_i, iq_ii)).
fn positive_exp(batch: &RefBatch, scale: f64, i: usize) -> f64 {
    (scale * dot(&batch.p[i], &batch.iq[i])).exp()
}

/// The marginal sum of variable `v` for row i, including the positive exactly once.
pub fn marginal_sum(batch: &RefBatch, scale: f64, v: V, i: usize) -> f64 {
    let b = batch.b();
    match v {
        // sum over m of exp(s(p_m, iq[i,i]))
        // plus the extra passages: sum over m of exp(s(extra_p[m], iq[i,i]))
        V::P => {
            let own: f64 = (0..b)
                .filter(|&m| m == i || !batch.mask_p[i][m])
                .map(|m| (scale * dot(&batch.p[m], &batch.iq[i])).exp())
                .sum();
            let extra: f64 = (0..batch.extra_p.len())
                .filter(|&m| !batch.mask_extra[i][m])
                .map(|m| (scale * dot(&batch.extra_p[m], &batch.iq[i])).exp())
                .sum();
            own + extra
        }
        // sum over j of exp(s(p_i, iq[j,i])): j = i is the positive, the others are iq_instr
        V::I => {
            positive_exp(batch, scale, i)
                + (0..batch.k())
                    .filter(|&k| !batch.mask_i[i][k])
                    .map(|k| (scale * dot(&batch.p[i], &batch.iq_instr[i][k])).exp())
                    .sum::<f64>()
        }
        // sum over k of exp(s(p_i, iq[k,k]))
        V::IQ => (0..b)
            .filter(|&k| k == i || !batch.mask_iq[i][k])
            .map(|k| (scale * dot(&batch.p[i], &batch.iq[k])).exp())
            .sum(),
    }
}

/// The univariate term l_v of row i: -log(exp(pos) / marginal sum).
pub fn univariate_term(batch: &RefBatch, scale: f64, v: V, i: usize) -> f64 {
    let pos = scale * dot(&batch.p[i], &batch.iq[i]);
    marginal_sum(batch, scale, v, i).ln() - pos
}

/// The loss of row i.
pub fn row_loss(batch: &RefBatch, scale: f64, objective: &RefObjective, i: usize) -> f64 {
    let pos = scale * dot(&batch.p[i], &batch.iq[i]);
    match objective {
        RefObjective::Univariate(vars) => vars
            .iter()
            .map(|&v| univariate_term(batch, scale, v, i))
            .sum(),
        RefObjective::Multivariate { vars, once } => {
            let mut denominator: f64 = vars.iter().map(|&v| marginal_sum(batch, scale, v, i)).sum();
            if *once {
                denominator -= (vars.len() as f64 - 1.0) * pos.exp();
            }
            denominator.ln() - pos
        }
    }
}

/// Per-row losses.
pub fn rows(batch: &RefBatch, scale: f64, objective: &RefObjective) -> Vec<f64> {
    (0..batch.b())
        .map(|i| row_loss(batch, scale, objective, i))
        .collect()
}

/// Mean loss over rows.
pub fn mean(batch: &RefBatch, scale: f64, objective: &RefObjective) -> f64 {
    let r = rows(batch, scale, objective);
    r.iter().sum::<f64>() / r.len() as f64
}

/// Cross-entropy of one row of logits against the label (`None` = excluded entry).
fn cross_entropy(logits: &[Option<f64>], label: usize) -> f64 {
    let z: f64 = logits.iter().flatten().map(|x| x.exp()).sum();
    z.ln() - logits[label].expect("the label entry is never excluded")
}

/// The published reference code's loss, transcribed from its structure (score blocks `qk`,
/// `kq`, `qq_neg` concatenated or cross-entropied separately), for one GPU, no duplicate masks.
///
/// - `qk[i][m] = <iq_i, p_m>` (contrast passages), label i;
/// - `kq[i][k] = <p_i, iq_k>` (contrast instruction+query), label i;
/// - `qq_neg[i] = [<p_i, iq_i>, <p_i, iq_instr[i][0]>, ...]` (contrast instructions), label 0.
///
/// `add = false` is `model_type = map` (one cross-entropy over the concatenation of the chosen
/// blocks, `kq`'s diagonal and `qq_neg`'s column 0 set to -inf when `qk` is present); `add = true`
/// is `map_add` (the sum of one cross-entropy per block). The mean over rows is taken per
/// cross-entropy, as `nn.CrossEntropyLoss(reduction='mean')` does. Scale is `1/(t + 1e-4)`.
pub fn reference_code_loss(batch: &RefBatch, t: f64, blocks: &[V], add: bool) -> f64 {
    let scale = 1.0 / (t + 1e-4);
    let b = batch.b();
    let qk = |i: usize| -> Vec<Option<f64>> {
        (0..b)
            .map(|m| Some(scale * dot(&batch.iq[i], &batch.p[m])))
            .collect()
    };
    let kq = |i: usize, mask_diag: bool| -> Vec<Option<f64>> {
        (0..b)
            .map(|k| {
                if mask_diag && k == i {
                    None
                } else {
                    Some(scale * dot(&batch.p[i], &batch.iq[k]))
                }
            })
            .collect()
    };
    let qq_neg = |i: usize, mask_first: bool| -> Vec<Option<f64>> {
        let mut row = vec![if mask_first {
            None
        } else {
            Some(scale * dot(&batch.p[i], &batch.iq[i]))
        }];
        row.extend(
            batch.iq_instr[i]
                .iter()
                .map(|e| Some(scale * dot(&batch.p[i], e))),
        );
        row
    };
    let mut total = 0.0;
    if add {
        for &block in blocks {
            let mut sum = 0.0;
            for i in 0..b {
                sum += match block {
                    V::P => cross_entropy(&qk(i), i),
                    V::IQ => cross_entropy(&kq(i, false), i),
                    V::I => cross_entropy(&qq_neg(i, false), 0),
                };
            }
            total += sum / b as f64;
        }
    } else {
        for i in 0..b {
            // The first block in P, IQ, I order holds the live label; later ones mask theirs.
            let mut row: Vec<Option<f64>> = Vec::new();
            let mut label = None;
            for block in [V::P, V::IQ, V::I] {
                if !blocks.contains(&block) {
                    continue;
                }
                let first = label.is_none();
                let (part, at) = match block {
                    V::P => (qk(i), i),
                    V::IQ => (kq(i, !first), i),
                    V::I => (qq_neg(i, !first), 0),
                };
                if first {
                    label = Some(row.len() + at);
                }
                row.extend(part);
            }
            total += cross_entropy(&row, label.expect("at least one block"));
        }
        total /= b as f64;
    }
    total
}
