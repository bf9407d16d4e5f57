//! Evaluating a run against qrels: per-query values and their means.

use std::io::Write;
use std::path::PathBuf;

use crate::error::{Error, Result};
use crate::measure::Measure;
use crate::qrels::{Qrels, QueryQrels};
use crate::run::{QueryRun, Run};
use crate::tie::TieBreak;
use crate::trec_file::WRITER_NAME;

/// How [`evaluate_with`] works.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EvalOptions {
    /// How documents are ranked (default: [`TieBreak::TrecEval`]).
    pub tie_break: TieBreak,
    /// trec_eval's `-c`: also evaluate judged queries that the run lacks (every measure but
    /// `num_rel` is then 0), so means are over all judged queries. Default `false`: queries judged
    /// but absent from the run are left out. Queries in the run but not in the qrels are always
    /// left out.
    pub complete: bool,
    /// Evaluate queries in parallel (rayon's global pool). Ignored without the `parallel`
    /// feature. The results are bit-for-bit the same either way. Default `true`.
    pub parallel: bool,
    /// trec_eval's `-l`: the lowest label that counts as relevant for the binary measures
    /// (`map`, `P`, `recall`, `Rprec`, `recip_rank`, `success`, `num_rel`, `num_rel_ret`;
    /// TREC DL uses 2 for `map` and recall). nDCG's gains stay the labels, as in trec_eval.
    /// Default 1; values below 1 act as 1.
    pub relevance_level: i32,
    /// trec_eval's `-J`: rank only the judged documents of each query (unjudged ones are
    /// dropped before ranking, so they neither count as retrieved nor push others down). As in
    /// trec_eval, a document judged with a negative label counts as unjudged here. Default
    /// `false`.
    pub judged_only: bool,
    /// trec_eval's `-M`: consider only each query's first `max_docs` ranked documents (after
    /// `judged_only`). Default `None`: all of them.
    pub max_docs: Option<usize>,
}

impl Default for EvalOptions {
    fn default() -> Self {
        Self {
            tie_break: TieBreak::TrecEval,
            complete: false,
            parallel: true,
            relevance_level: 1,
            judged_only: false,
            max_docs: None,
        }
    }
}

/// Per-query values of a set of measures, with means (serialisable with serde).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Evaluation {
    measures: Vec<Measure>,
    /// Evaluated query ids in byte order.
    query_ids: Vec<String>,
    /// Row-major: `values[q * measures.len() + m]`.
    values: Vec<f64>,
}

impl Evaluation {
    /// The measures, in the order given to [`evaluate`].
    pub fn measures(&self) -> &[Measure] {
        &self.measures
    }

    /// The evaluated queries, in byte order of their ids.
    pub fn query_ids(&self) -> &[String] {
        &self.query_ids
    }

    /// Number of evaluated queries (trec_eval's `num_q`).
    pub fn num_queries(&self) -> usize {
        self.query_ids.len()
    }

    fn measure_index(&self, measure: Measure) -> Option<usize> {
        self.measures.iter().position(|&m| m == measure)
    }

    /// All measures' values for one query, in [`Evaluation::measures`] order.
    pub fn query_values(&self, query: &str) -> Option<&[f64]> {
        let q = self
            .query_ids
            .binary_search_by(|id| id.as_str().cmp(query))
            .ok()?;
        let n = self.measures.len();
        Some(&self.values[q * n..(q + 1) * n])
    }

    /// One query's value of one measure.
    pub fn value(&self, query: &str, measure: Measure) -> Option<f64> {
        let m = self.measure_index(measure)?;
        Some(self.query_values(query)?[m])
    }

    /// `(query id, value)` for one measure, queries in byte order.
    pub fn per_query(&self, measure: Measure) -> Option<impl Iterator<Item = (&str, f64)> + '_> {
        let m = self.measure_index(measure)?;
        let n = self.measures.len();
        Some(
            self.query_ids
                .iter()
                .enumerate()
                .map(move |(q, id)| (id.as_str(), self.values[q * n + m])),
        )
    }

    /// Sum over queries (in byte order of the ids).
    pub fn sum(&self, measure: Measure) -> Option<f64> {
        Some(self.per_query(measure)?.fold(0.0, |acc, (_, v)| acc + v))
    }

    /// Arithmetic mean over the evaluated queries; `None` when the measure was not evaluated or
    /// no query was evaluated.
    pub fn mean(&self, measure: Measure) -> Option<f64> {
        if self.query_ids.is_empty() {
            return None;
        }
        Some(self.sum(measure)? / self.query_ids.len() as f64)
    }

    /// trec_eval's summary value: the sum over queries for counts ([`Measure::is_count`]), the
    /// mean otherwise. `None` when the measure was not evaluated; with no queries, counts are 0
    /// and means `None`.
    pub fn summary(&self, measure: Measure) -> Option<f64> {
        if measure.is_count() {
            self.sum(measure)
        } else {
            self.mean(measure)
        }
    }

    /// Writes trec_eval-style text (`name<TAB>query<TAB>value`): per query first when
    /// `per_query` (as `trec_eval -q`), then the summary under the query id `all`, starting with
    /// `num_q`. Counts print as integers, everything else with 4 decimals.
    pub fn write_trec_eval(&self, writer: impl Write, per_query: bool) -> Result<()> {
        let format = TrecEvalFormat {
            per_query,
            ..TrecEvalFormat::default()
        };
        self.write_trec_eval_as(writer, &format)
    }

    /// Writes trec_eval-style text as `format` says: the measures in the order given (see
    /// [`Measure::sort_trec_eval`] for trec_eval's own), per query first when asked, then the
    /// summary lines under `all`, led by `runid` and `num_q` when asked (none at all without
    /// [`TrecEvalFormat::summary`]).
    pub fn write_trec_eval_as(
        &self,
        mut writer: impl Write,
        format: &TrecEvalFormat,
    ) -> Result<()> {
        self.write_lines(&mut writer, format)
            .map_err(|source| Error::Io {
                path: PathBuf::from(WRITER_NAME),
                source,
            })
    }

    fn write_lines(&self, writer: &mut impl Write, format: &TrecEvalFormat) -> std::io::Result<()> {
        let per_query = format.per_query;
        fn line(w: &mut impl Write, m: Measure, q: &str, v: f64) -> std::io::Result<()> {
            if m.is_count() {
                writeln!(w, "{:<22}\t{q}\t{v:.0}", m.to_string())
            } else {
                writeln!(w, "{:<22}\t{q}\t{v:.4}", m.to_string())
            }
        }
        let n = self.measures.len();
        if per_query {
            for (q, id) in self.query_ids.iter().enumerate() {
                for (m, &measure) in self.measures.iter().enumerate() {
                    line(writer, measure, id, self.values[q * n + m])?;
                }
            }
        }
        if !format.summary {
            return Ok(());
        }
        if let Some(runid) = &format.runid {
            writeln!(writer, "{:<22}\tall\t{runid}", "runid")?;
        }
        if format.num_q {
            writeln!(writer, "{:<22}\tall\t{}", "num_q", self.num_queries())?;
        }
        for &measure in &self.measures {
            if let Some(v) = self.summary(measure) {
                line(writer, measure, "all", v)?;
            }
        }
        Ok(())
    }
}

/// How [`Evaluation::write_trec_eval_as`] lays out trec_eval's text.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct TrecEvalFormat {
    /// Per-query lines before the summary (`trec_eval -q`). Default `false`.
    pub per_query: bool,
    /// The `runid` summary line with this tag (trec_eval's `runid` measure, part of its
    /// `official` and `all_trec` sets). Default `None`: no line.
    pub runid: Option<String>,
    /// The `num_q` summary line (trec_eval's `num_q` measure). Default `true`.
    pub num_q: bool,
    /// The summary lines under `all` (`runid`, `num_q` and the means). Default `true`;
    /// `false` is `trec_eval -n` (`--nosummary`), which prints the per-query lines only.
    pub summary: bool,
}

impl Default for TrecEvalFormat {
    fn default() -> Self {
        Self {
            per_query: false,
            runid: None,
            num_q: true,
            summary: true,
        }
    }
}

impl TrecEvalFormat {
    /// The layout with per-query lines or not, a `runid` line or not, a `num_q` line or not.
    pub fn new(per_query: bool, runid: Option<String>, num_q: bool) -> Self {
        Self {
            per_query,
            runid,
            num_q,
            summary: true,
        }
    }

    /// The same layout without the summary lines (`trec_eval -n`).
    pub fn without_summary(mut self) -> Self {
        self.summary = false;
        self
    }
}

/// Evaluates `run` against `qrels` with the default [`EvalOptions`] (trec_eval's rules, in
/// parallel when the `parallel` feature is on).
///
/// Errors only with [`Error::ZeroCutoff`] for a measure with cut-off 0.
pub fn evaluate(qrels: &Qrels, run: &Run, measures: &[Measure]) -> Result<Evaluation> {
    evaluate_with(qrels, run, measures, &EvalOptions::default())
}

/// Evaluates `run` against `qrels` with explicit options.
///
/// Each query is ranked once and all measures are computed from the ranks of its relevant
/// retrieved documents. Queries are those in both the run and the qrels (with
/// [`EvalOptions::complete`], all judged queries). Errors only with [`Error::ZeroCutoff`].
pub fn evaluate_with(
    qrels: &Qrels,
    run: &Run,
    measures: &[Measure],
    options: &EvalOptions,
) -> Result<Evaluation> {
    for measure in measures {
        measure.validate()?;
    }
    let empty = QueryRun::default();
    let jobs: Vec<(&str, &QueryQrels, &QueryRun)> = qrels
        .queries()
        .filter_map(|(id, judged)| match run.query(id) {
            Some(docs) => Some((id, judged, docs)),
            None if options.complete => Some((id, judged, &empty)),
            None => None,
        })
        .collect();
    let n = measures.len();
    let mut values = vec![0.0; jobs.len() * n];
    let work = |scratch: &mut Scratch, out: &mut [f64], job: &(&str, &QueryQrels, &QueryRun)| {
        let num_ret = scratch.rank_relevant(job.1, job.2, options);
        for (slot, &measure) in out.iter_mut().zip(measures) {
            *slot = scratch.value(measure, job.1, num_ret);
        }
    };
    if n > 0 {
        run_jobs(options.parallel, &jobs, &mut values, n, work);
    }
    Ok(Evaluation {
        measures: measures.to_vec(),
        query_ids: jobs.iter().map(|j| j.0.to_owned()).collect(),
        values,
    })
}

#[cfg(feature = "parallel")]
fn run_jobs<J: Sync>(
    parallel: bool,
    jobs: &[J],
    values: &mut [f64],
    n: usize,
    work: impl Fn(&mut Scratch, &mut [f64], &J) + Sync,
) {
    use rayon::prelude::*;
    if parallel {
        values
            .par_chunks_mut(n)
            .zip(jobs.par_iter())
            .for_each_init(Scratch::default, |scratch, (out, job)| {
                work(scratch, out, job)
            });
    } else {
        let mut scratch = Scratch::default();
        for (out, job) in values.chunks_mut(n).zip(jobs) {
            work(&mut scratch, out, job);
        }
    }
}

#[cfg(not(feature = "parallel"))]
fn run_jobs<J>(
    _parallel: bool,
    jobs: &[J],
    values: &mut [f64],
    n: usize,
    work: impl Fn(&mut Scratch, &mut [f64], &J),
) {
    let mut scratch = Scratch::default();
    for (out, job) in values.chunks_mut(n).zip(jobs) {
        work(&mut scratch, out, job);
    }
}

/// A retrieved relevant document.
#[derive(Debug, Clone, Copy)]
struct Relevant {
    index: usize,
    key: f64,
    label: i32,
}

/// A retrieved relevant document's rank and label.
#[derive(Debug, Clone, Copy)]
struct Hit {
    rank: usize,
    label: i32,
}

// Sums use `fold(0.0, ..)`: `Iterator::sum` of no `f64`s is `-0.0`, which prints as `-0.0000`.

/// Reused per-thread buffers.
#[derive(Debug, Default)]
struct Scratch {
    relevant: Vec<Relevant>,
    counts: Vec<usize>,
    /// Ranks (ascending) and labels of the retrieved documents with a positive label (nDCG's
    /// gains).
    hits: Vec<Hit>,
    /// The hits whose label reaches the relevance level, when it is above 1 (the binary
    /// measures' relevant documents; with level 1 they are `hits`).
    binary_hits: Vec<Hit>,
    /// The relevance level of the current query's ranking.
    level: i32,
}

impl Scratch {
    /// Fills `hits` with the ranks of `docs`' relevant documents under the options' tie rule,
    /// among the judged documents only with `judged_only`, cut at `max_docs`; returns the
    /// number of documents retrieved under those rules.
    ///
    /// Instead of sorting all documents, sorts only the relevant ones and then, in one pass over
    /// all documents, counts for each relevant document how many documents precede it (a binary
    /// search among the sorted relevant documents per document, then a prefix sum). The ranks
    /// are exactly those of a full sort.
    fn rank_relevant(
        &mut self,
        judged: &QueryQrels,
        docs: &QueryRun,
        options: &EvalOptions,
    ) -> usize {
        let tie = options.tie_break;
        self.relevant.clear();
        self.hits.clear();
        self.binary_hits.clear();
        self.level = options.relevance_level.max(1);
        // trec_eval reads a negative label as "unjudged" (its own marker is -1).
        let counted = |index: usize| {
            !options.judged_only || judged.label(docs.doc(index)).is_some_and(|l| l >= 0)
        };
        let considered = if options.judged_only {
            (0..docs.len()).filter(|&i| counted(i)).count()
        } else {
            docs.len()
        };
        let num_ret = options.max_docs.map_or(considered, |m| considered.min(m));
        if judged.num_relevant() == 0 {
            return num_ret;
        }
        for index in 0..docs.len() {
            if let Some(label) = judged.label(docs.doc(index))
                && label > 0
            {
                let key = tie.key(docs.score(index));
                self.relevant.push(Relevant { index, key, label });
            }
        }
        let r = self.relevant.len();
        if r == 0 {
            return num_ret;
        }
        self.relevant.sort_unstable_by(|a, b| {
            tie.compare(a.key, docs.doc(a.index), b.key, docs.doc(b.index))
        });
        self.counts.clear();
        self.counts.resize(r + 1, 0);
        let relevant = &self.relevant;
        for index in 0..docs.len() {
            if !counted(index) {
                continue;
            }
            let key = tie.key(docs.score(index));
            let doc = docs.doc(index);
            // Relevant documents ranked before this one.
            let before = relevant
                .partition_point(|rel| tie.precedes(rel.key, docs.doc(rel.index), key, doc));
            // This document precedes relevant[j] for every j >= before (j > before if it is
            // relevant[before] itself).
            if before < r && relevant[before].index == index {
                self.counts[before + 1] += 1;
            } else {
                self.counts[before] += 1;
            }
        }
        let mut preceding = 0;
        for (j, rel) in relevant.iter().enumerate() {
            preceding += self.counts[j];
            let rank = preceding + 1;
            if rank > num_ret {
                // Past `max_docs` (ranks only grow from here).
                break;
            }
            self.hits.push(Hit {
                rank,
                label: rel.label,
            });
        }
        if self.level > 1 {
            let level = self.level;
            self.binary_hits
                .extend(self.hits.iter().filter(|h| h.label >= level));
        }
        num_ret
    }

    /// The retrieved documents that count as relevant for the binary measures.
    fn binary(&self) -> &[Hit] {
        if self.level > 1 {
            &self.binary_hits
        } else {
            &self.hits
        }
    }

    /// Number of relevant hits within the top `k`.
    fn hits_within(&self, k: usize) -> usize {
        self.binary().partition_point(|h| h.rank <= k)
    }

    fn value(&self, measure: Measure, judged: &QueryQrels, num_ret: usize) -> f64 {
        // Relevant at the level: the ideal gains are the positive labels, sorted descending.
        let num_rel = if self.level > 1 {
            let level = self.level;
            judged.ideal_gains().partition_point(|&g| g >= level)
        } else {
            judged.num_relevant()
        };
        let over_rel = |x: f64| {
            if num_rel == 0 {
                0.0
            } else {
                x / num_rel as f64
            }
        };
        match measure {
            Measure::NumRet => num_ret as f64,
            Measure::NumRel => num_rel as f64,
            Measure::NumRelRet => self.binary().len() as f64,
            Measure::Map => over_rel(self.precision_sum(usize::MAX)),
            Measure::MapCut(k) => over_rel(self.precision_sum(k)),
            Measure::P(k) => self.hits_within(k) as f64 / k as f64,
            Measure::Recall(k) => over_rel(self.hits_within(k) as f64),
            Measure::Rprec => over_rel(self.hits_within(num_rel) as f64),
            Measure::RecipRank => self.binary().first().map_or(0.0, |h| 1.0 / h.rank as f64),
            Measure::RecipRankCut(k) => match self.binary().first() {
                Some(h) if h.rank <= k => 1.0 / h.rank as f64,
                _ => 0.0,
            },
            Measure::Success(k) => match self.binary().first() {
                Some(h) if h.rank <= k => 1.0,
                _ => 0.0,
            },
            Measure::Ndcg => ndcg(&self.hits, judged.ideal_gains(), usize::MAX),
            Measure::NdcgCut(k) => ndcg(&self.hits, judged.ideal_gains(), k),
        }
    }

    /// Sum of the precision at each relevant document ranked within the top `k`.
    fn precision_sum(&self, k: usize) -> f64 {
        self.binary()
            .iter()
            .take_while(|h| h.rank <= k)
            .enumerate()
            .map(|(j, h)| (j + 1) as f64 / h.rank as f64)
            .fold(0.0, |acc, x| acc + x)
    }
}

/// nDCG of the top `k` ranks: DCG of `hits` over DCG of the `ideal` gains (both discounted by
/// `log2(rank + 1)`); 0 when the ideal DCG is 0.
fn ndcg(hits: &[Hit], ideal: &[i32], k: usize) -> f64 {
    let dcg: f64 = hits
        .iter()
        .take_while(|h| h.rank <= k)
        .map(|h| f64::from(h.label) / ((h.rank + 1) as f64).log2())
        .fold(0.0, |acc, x| acc + x);
    let ideal_dcg: f64 = ideal
        .iter()
        .take(k)
        .enumerate()
        .map(|(i, &g)| f64::from(g) / ((i + 2) as f64).log2())
        .fold(0.0, |acc, x| acc + x);
    if ideal_dcg > 0.0 {
        dcg / ideal_dcg
    } else {
        0.0
    }
}
