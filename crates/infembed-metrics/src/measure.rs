//! The evaluation measures and their trec_eval names.

use std::fmt;
use std::str::FromStr;

use crate::error::{Error, Result};

/// The cut-offs trec_eval uses by default for `P`, `recall`, `ndcg_cut` and `map_cut`.
pub const TREC_EVAL_CUTOFFS: [usize; 9] = [5, 10, 15, 20, 30, 100, 200, 500, 1000];

/// The cut-offs trec_eval uses by default for `success`.
pub const TREC_EVAL_SUCCESS_CUTOFFS: [usize; 3] = [1, 5, 10];

/// One evaluation measure, computed per query exactly as trec_eval 9 computes it.
///
/// Conventions: a document is relevant when its label is >= 1; `R` is the number of relevant
/// documents judged for the query (retrieved or not); ranks start at 1; cut-offs `k` start at 1.
/// A measure whose denominator is zero (no relevant documents) is 0.
///
/// Names (via [`fmt::Display`] and [`FromStr`]) are trec_eval's: `map`, `map_cut_10`, `ndcg`,
/// `ndcg_cut_10`, `recip_rank`, `P_10`, `recall_10`, `Rprec`, `success_10`, `num_rel`, `num_ret`,
/// `num_rel_ret`; `recip_rank_cut_10` (MRR@10, which trec_eval does not have) is this crate's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Measure {
    /// Average precision: the sum over retrieved relevant documents of the precision at their
    /// rank, divided by `R`. Its mean over queries is MAP.
    Map,
    /// Average precision counting only the top `k` ranks (still divided by `R`).
    MapCut(usize),
    /// nDCG over the whole ranking: gain = label (0 for labels <= 0), discount `log2(rank + 1)`,
    /// normalised by the DCG of the ideal ranking of all judged relevant documents.
    Ndcg,
    /// nDCG of the top `k` ranks, normalised by the ideal ranking's top `k`.
    NdcgCut(usize),
    /// Reciprocal rank of the first relevant document (0 when none is retrieved).
    RecipRank,
    /// Reciprocal rank of the first relevant document within the top `k` (MRR@k).
    RecipRankCut(usize),
    /// Precision at `k`: relevant documents in the top `k`, divided by `k` (even when fewer
    /// than `k` documents were retrieved, as in trec_eval).
    P(usize),
    /// Recall at `k`: relevant documents in the top `k`, divided by `R`.
    Recall(usize),
    /// R-precision: precision at rank `R`.
    Rprec,
    /// 1 if a relevant document is in the top `k`, else 0 (hit rate).
    Success(usize),
    /// `R`: number of relevant judged documents.
    NumRel,
    /// Number of retrieved documents.
    NumRet,
    /// Number of relevant documents retrieved.
    NumRelRet,
}

impl Measure {
    /// Whether this is a count (`num_rel`, `num_ret`, `num_rel_ret`), which trec_eval sums
    /// over queries in its summary instead of averaging.
    pub fn is_count(self) -> bool {
        matches!(self, Measure::NumRel | Measure::NumRet | Measure::NumRelRet)
    }

    /// The cut-off `k`, for measures that have one.
    pub fn cutoff(self) -> Option<usize> {
        match self {
            Measure::MapCut(k)
            | Measure::NdcgCut(k)
            | Measure::RecipRankCut(k)
            | Measure::P(k)
            | Measure::Recall(k)
            | Measure::Success(k) => Some(k),
            _ => None,
        }
    }

    /// Checks that a cut-off measure has `k >= 1`.
    pub fn validate(self) -> Result<()> {
        if self.cutoff() == Some(0) {
            return Err(Error::ZeroCutoff {
                name: self.to_string(),
            });
        }
        Ok(())
    }

    /// The measures (of those this crate implements) that `trec_eval -m all_trec` prints, with
    /// trec_eval's default cut-offs.
    pub fn trec_eval_all() -> Vec<Measure> {
        // `official` is the head of `all_trec` in trec_eval's order.
        let mut all = Self::trec_eval_official();
        all.extend(TREC_EVAL_CUTOFFS.map(Measure::Recall));
        all.push(Measure::Ndcg);
        all.extend(TREC_EVAL_CUTOFFS.map(Measure::NdcgCut));
        all.extend(TREC_EVAL_CUTOFFS.map(Measure::MapCut));
        all.extend(TREC_EVAL_SUCCESS_CUTOFFS.map(Measure::Success));
        all
    }

    /// The measures (of those this crate implements) of trec_eval's `official` set: the counts,
    /// `map`, `Rprec`, `recip_rank` and `P` at trec_eval's cut-offs (trec_eval adds `gm_map`,
    /// `bpref` and `iprec_at_recall`, which this crate does not compute).
    pub fn trec_eval_official() -> Vec<Measure> {
        let mut out = vec![
            Measure::NumRet,
            Measure::NumRel,
            Measure::NumRelRet,
            Measure::Map,
            Measure::Rprec,
            Measure::RecipRank,
        ];
        out.extend(TREC_EVAL_CUTOFFS.map(Measure::P));
        out
    }

    /// Parses one argument of trec_eval's `-m` as trec_eval reads it: a set (`all_trec`,
    /// `official`), a measure (`map`), a family with its cut-offs after a dot (`P.5,10`,
    /// `ndcg_cut.10`) or without them (`ndcg_cut`: trec_eval's default cut-offs), or a single
    /// measure in this crate's spelling (`ndcg_cut_10`). Unknown names and parameters are
    /// [`Error::UnknownMeasure`] naming the argument.
    pub fn parse_trec_eval(spec: &str) -> Result<Vec<Measure>> {
        let spec = spec.trim();
        match spec {
            "all_trec" => return Ok(Self::trec_eval_all()),
            "official" => return Ok(Self::trec_eval_official()),
            _ => {}
        }
        let (family, params) = match spec.split_once('.') {
            Some((f, p)) => (f, Some(p)),
            None => (spec, None),
        };
        let defaults: &[usize] = match family {
            "P" | "recall" | "ndcg_cut" | "map_cut" => &TREC_EVAL_CUTOFFS,
            "success" => &TREC_EVAL_SUCCESS_CUTOFFS,
            "recip_rank_cut" => &[],
            _ if params.is_none() => return Ok(vec![spec.parse()?]),
            _ => &[],
        };
        let unknown = || Error::UnknownMeasure {
            name: spec.to_owned(),
        };
        let cutoffs: Vec<String> = match params {
            None if !defaults.is_empty() => defaults.iter().map(usize::to_string).collect(),
            None => return Err(unknown()),
            Some(p) => p.split(',').map(str::to_owned).collect(),
        };
        let mut out = Vec::with_capacity(cutoffs.len());
        for k in cutoffs {
            if k.is_empty() || !k.bytes().all(|b| b.is_ascii_digit()) {
                return Err(unknown());
            }
            let measure: Measure = format!("{family}_{k}").parse().map_err(|e| match e {
                Error::UnknownMeasure { .. } => unknown(),
                other => other,
            })?;
            if !out.contains(&measure) {
                out.push(measure);
            }
        }
        Ok(out)
    }

    /// Sorts measures into the order trec_eval prints them in (its measure table: the counts,
    /// `map`, `Rprec`, `recip_rank`, `P`, `recall`, `ndcg`, `ndcg_cut`, `map_cut`, `success`,
    /// each family by cut-off), whatever order they were asked for in.
    pub fn sort_trec_eval(measures: &mut [Measure]) {
        measures.sort_by_key(|m| match *m {
            Measure::NumRet => (0, 0),
            Measure::NumRel => (1, 0),
            Measure::NumRelRet => (2, 0),
            Measure::Map => (3, 0),
            Measure::Rprec => (4, 0),
            Measure::RecipRank => (5, 0),
            Measure::P(k) => (6, k),
            Measure::Recall(k) => (7, k),
            Measure::Ndcg => (8, 0),
            Measure::NdcgCut(k) => (9, k),
            Measure::MapCut(k) => (10, k),
            Measure::Success(k) => (11, k),
            Measure::RecipRankCut(k) => (12, k),
        });
    }

    /// Parses a list of measure names separated by commas and/or whitespace, e.g.
    /// `"map, ndcg_cut_10 P_5"`, dropping repeats (first occurrence kept).
    pub fn parse_list(names: &str) -> Result<Vec<Measure>> {
        let mut out: Vec<Measure> = Vec::new();
        for name in names
            .split(|c: char| c == ',' || c.is_whitespace())
            .filter(|s| !s.is_empty())
        {
            let measure: Measure = name.parse()?;
            if !out.contains(&measure) {
                out.push(measure);
            }
        }
        Ok(out)
    }
}

impl fmt::Display for Measure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Measure::Map => f.write_str("map"),
            Measure::MapCut(k) => write!(f, "map_cut_{k}"),
            Measure::Ndcg => f.write_str("ndcg"),
            Measure::NdcgCut(k) => write!(f, "ndcg_cut_{k}"),
            Measure::RecipRank => f.write_str("recip_rank"),
            Measure::RecipRankCut(k) => write!(f, "recip_rank_cut_{k}"),
            Measure::P(k) => write!(f, "P_{k}"),
            Measure::Recall(k) => write!(f, "recall_{k}"),
            Measure::Rprec => f.write_str("Rprec"),
            Measure::Success(k) => write!(f, "success_{k}"),
            Measure::NumRel => f.write_str("num_rel"),
            Measure::NumRet => f.write_str("num_ret"),
            Measure::NumRelRet => f.write_str("num_rel_ret"),
        }
    }
}

/// Builds a cut-off measure from its `k`.
type MeasureFamily = fn(usize) -> Measure;

impl FromStr for Measure {
    type Err = Error;

    /// Parses a trec_eval-style name (see [`Measure`]). Cut-offs are decimal digits only and
    /// must be >= 1 ([`Error::ZeroCutoff`]); anything else is [`Error::UnknownMeasure`].
    fn from_str(name: &str) -> Result<Self> {
        let exact = match name {
            "map" => Some(Measure::Map),
            "ndcg" => Some(Measure::Ndcg),
            "recip_rank" => Some(Measure::RecipRank),
            "Rprec" => Some(Measure::Rprec),
            "num_rel" => Some(Measure::NumRel),
            "num_ret" => Some(Measure::NumRet),
            "num_rel_ret" => Some(Measure::NumRelRet),
            _ => None,
        };
        if let Some(measure) = exact {
            return Ok(measure);
        }
        let families: [(&str, MeasureFamily); 6] = [
            ("map_cut_", Measure::MapCut),
            ("ndcg_cut_", Measure::NdcgCut),
            ("recip_rank_cut_", Measure::RecipRankCut),
            ("P_", Measure::P),
            ("recall_", Measure::Recall),
            ("success_", Measure::Success),
        ];
        for (prefix, make) in families {
            if let Some(k) = name.strip_prefix(prefix) {
                if k.is_empty() || !k.bytes().all(|b| b.is_ascii_digit()) {
                    break;
                }
                let k: usize = k.parse().map_err(|_| Error::UnknownMeasure {
                    name: name.to_owned(),
                })?;
                let measure = make(k);
                measure.validate()?;
                return Ok(measure);
            }
        }
        Err(Error::UnknownMeasure {
            name: name.to_owned(),
        })
    }
}

impl serde::Serialize for Measure {
    fn serialize<S: serde::Serializer>(
        &self,
        serializer: S,
    ) -> std::result::Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for Measure {
    fn deserialize<D: serde::Deserializer<'de>>(
        deserializer: D,
    ) -> std::result::Result<Self, D::Error> {
        let name = String::deserialize(deserializer)?;
        name.parse().map_err(serde::de::Error::custom)
    }
}
