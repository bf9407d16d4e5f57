//! The two instruction-query interactions of InF-Embed.
//!
//! - **Interaction I** (self-attention, the paper's Eq. 3): instruction and query are joined
//!   into one text with a [`QueryTemplate`](crate::QueryTemplate) and encoded together, so the
//!   backbone's own self-attention mixes them. Every (instruction, query) combination needs its
//!   own forward pass.
//! - **Interaction II** (cross-attention, Eq. 4): instruction and query are encoded apart and
//!   combined afterwards ([`CrossAttention`]), so all B x B combinations of a batch cost one
//!   encoding of each text plus a cheap combination.

use burn::nn::{Linear, LinearConfig};
use burn::prelude::*;
use burn::tensor::activation::softmax;
use serde::{Deserialize, Serialize};

use crate::pool::l2_normalize;

/// Which form of Interaction II combines an instruction with a query.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum CrossAttentionKind {
    /// On pooled vectors `i, q` in R^d (Eq. 4 with single vectors). The product
    /// `(i W_i)(q W_q1)^T` is taken element-wise (the diagonal of the outer product, the
    /// only reading that is not a softmax over a single score and that keeps the
    /// combination O(B^2 d)): `iq = softmax((i W_i) * (q W_q1) / sqrt(d)) * (q W_q2)`, the
    /// softmax running over the d dimensions and `*` being element-wise.
    Vector,
    /// On token states (the published code's variant): with instruction tokens `I [Li, d]`
    /// and query tokens `Q [Lq, d]`, `att = softmax(I' Q1^T / sqrt(d))` with padded query
    /// tokens masked out, and `iq` = the mean over the real instruction tokens of
    /// `att Q2`, where `I' = I W_i, Q1 = Q W_q1, Q2 = Q W_q2` when learnable and
    /// `I, Q, Q` otherwise (parameter-free, as the reference).
    #[default]
    Token,
}

/// Configuration of Interaction II.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct CrossAttentionConfig {
    /// Vector or token level.
    #[serde(default)]
    pub kind: CrossAttentionKind,
    /// Whether `W_i, W_q1, W_q2` (d x d, no bias, initialized to the identity) are learned;
    /// without them the combination is parameter-free.
    #[serde(default)]
    pub learnable: bool,
}

impl Default for CrossAttentionConfig {
    fn default() -> Self {
        Self {
            kind: CrossAttentionKind::Token,
            learnable: false,
        }
    }
}

/// The learnable projections of Interaction II (`W_i`, `W_q1`, `W_q2`, each d x d).
#[derive(Module, Debug)]
pub struct CrossAttention {
    /// Applied to the instruction.
    pub w_i: Linear,
    /// Applied to the query on the score side.
    pub w_q1: Linear,
    /// Applied to the query on the value side.
    pub w_q2: Linear,
}

impl CrossAttention {
    /// Three d x d projections without bias, initialized to the identity (so training starts
    /// from the parameter-free combination).
    pub fn identity(d: usize, device: &Device) -> Self {
        let eye = || {
            let mut l = LinearConfig::new(d, d).with_bias(false).init(device);
            l.weight = l.weight.map(|_| Tensor::eye(d, device));
            l
        };
        Self {
            w_i: eye(),
            w_q1: eye(),
            w_q2: eye(),
        }
    }
}

/// Interaction II on pooled vectors for the given `pairs` of (instruction row, query row).
///
/// Shapes: `instr: [Ni, d]`, `query: [Nq, d]`; returns `[pairs.len(), d]`, L2-normalized.
pub fn combine_vectors(
    instr: Tensor<2>,
    query: Tensor<2>,
    weights: Option<&CrossAttention>,
    pairs: &[(usize, usize)],
) -> Tensor<2> {
    let [_, d] = query.dims();
    let device = query.device();
    let (a, b, c) = match weights {
        Some(w) => (
            w.w_i.forward(instr),
            w.w_q1.forward(query.clone()),
            w.w_q2.forward(query),
        ),
        None => (instr, query.clone(), query),
    };
    let (ii, qi) = pair_indices(pairs, &device);
    let a = a.select(0, ii);
    let b = b.select(0, qi.clone());
    let c = c.select(0, qi);
    let att = softmax((a * b) / (d as f64).sqrt(), 1);
    l2_normalize(att * c)
}

/// Interaction II on token states for the given `pairs` of (instruction row, query row).
///
/// Shapes: `instr: [Ni, Li, d]` with `instr_mask: [Ni, Li]`, `query: [Nq, Lq, d]` with
/// `query_mask: [Nq, Lq]` (1.0 real, 0.0 padding). Returns `[pairs.len(), d]`,
/// L2-normalized. Padded query tokens get no attention and padded instruction tokens are
/// left out of the mean, so the result does not depend on padding; every row must have at
/// least one real token.
pub fn combine_tokens(
    instr: Tensor<3>,
    instr_mask: Tensor<2>,
    query: Tensor<3>,
    query_mask: Tensor<2>,
    weights: Option<&CrossAttention>,
    pairs: &[(usize, usize)],
) -> Tensor<2> {
    let [ni, li, d] = instr.dims();
    let [nq, lq, _] = query.dims();
    let device = query.device();
    let (a, b, c) = match weights {
        Some(w) => (
            w.w_i.forward(instr),
            w.w_q1.forward(query.clone()),
            w.w_q2.forward(query),
        ),
        None => (instr, query.clone(), query),
    };
    // Mean over real instruction tokens as weights: [Ni, Li], rows sum to 1.
    let count = instr_mask.clone().sum_dim(1).clamp_min(1.0);
    let tok_w = instr_mask / count;
    let scale = (d as f64).sqrt();
    let p = pairs.len();
    if 2 * p >= ni * nq {
        // Most of the grid is wanted: compute all Nq x Ni combinations at once.
        let s = a
            .reshape([ni * li, d])
            .matmul(b.reshape([nq * lq, d]).transpose())
            .reshape([ni, li, nq, lq])
            .permute([2, 0, 1, 3])
            / scale; // [Nq, Ni, Li, Lq]
        let key_pad = query_mask
            .equal_elem(0.0)
            .reshape([nq, 1, 1, lq])
            .expand([nq, ni, li, lq]);
        let att = softmax(s.mask_fill(key_pad, -1.0e9), 3);
        // Average the attention rows over instruction tokens first: [Nq, Ni, 1, Lq].
        let w = tok_w.reshape([1, ni, 1, li]).expand([nq, ni, 1, li]);
        let avg = w.matmul(att).reshape([nq, ni, lq]);
        let out = avg.matmul(c).reshape([nq * ni, d]); // row q * Ni + i
        let flat: Vec<i64> = pairs.iter().map(|&(i, q)| (q * ni + i) as i64).collect();
        let idx = Tensor::<1, Int>::from_data(TensorData::new(flat, [p]), &device);
        return l2_normalize(out.select(0, idx));
    }
    let (ii, qi) = pair_indices(pairs, &device);
    let a = a.select(0, ii.clone()); // [P, Li, d]
    let b = b.select(0, qi.clone()); // [P, Lq, d]
    let c = c.select(0, qi.clone()); // [P, Lq, d]
    let w = tok_w.select(0, ii).reshape([p, 1, li]);
    let qm = query_mask.select(0, qi); // [P, Lq]
    let s = a.matmul(b.swap_dims(1, 2)) / scale; // [P, Li, Lq]
    // Padded keys: a large negative (not the reference's -1e-8, which masks nothing).
    let key_pad = qm.equal_elem(0.0).reshape([p, 1, lq]).expand([p, li, lq]);
    let att = softmax(s.mask_fill(key_pad, -1.0e9), 2);
    let out = w.matmul(att).matmul(c).reshape([p, d]);
    l2_normalize(out)
}

fn pair_indices(pairs: &[(usize, usize)], device: &Device) -> (Tensor<1, Int>, Tensor<1, Int>) {
    let n = pairs.len();
    let ii: Vec<i64> = pairs.iter().map(|&(i, _)| i as i64).collect();
    let qi: Vec<i64> = pairs.iter().map(|&(_, q)| q as i64).collect();
    (
        Tensor::from_data(TensorData::new(ii, [n]), device),
        Tensor::from_data(TensorData::new(qi, [n]), device),
    )
}
