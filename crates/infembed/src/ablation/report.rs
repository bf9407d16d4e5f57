//! A grid's report: per row, the mean and sample standard deviation over seeds of every
//! measure, the paper's value beside it, as Markdown, JSON and a chart.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use infembed_train::{GridChartRow, grid_chart};
use serde::Serialize;

use super::run::{RunResult, ZeroShotResult};
use super::{Grid, Measure, Measures, MoreSeeds};
use crate::error::{Error, Result};

/// Mean and spread of one measure over a row's seeds.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[non_exhaustive]
pub struct Stat {
    /// Arithmetic mean.
    pub mean: f64,
    /// Sample standard deviation (`n - 1` in the denominator); `None` for one value.
    pub sd: Option<f64>,
    /// The values, in seed order.
    pub values: Vec<f64>,
}

impl Stat {
    /// The statistics of `values` (`None` when empty).
    pub fn of(values: &[f64]) -> Option<Stat> {
        if values.is_empty() {
            return None;
        }
        let n = values.len() as f64;
        let mean = values.iter().sum::<f64>() / n;
        let sd = (values.len() > 1)
            .then(|| (values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (n - 1.0)).sqrt());
        Some(Stat {
            mean,
            sd,
            values: values.to_vec(),
        })
    }

    fn cell(&self, bold: bool) -> String {
        let v = match self.sd {
            Some(sd) => format!("{:.2} ± {sd:.2}", self.mean),
            None => format!("{:.2}", self.mean),
        };
        if bold { format!("**{v}**") } else { v }
    }
}

/// One row of the report.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[non_exhaustive]
pub struct RowSummary {
    /// The row's label.
    pub label: String,
    /// The seeds of its finished runs, ascending.
    pub seeds: Vec<u64>,
    /// Runs the grid asks of it (its seeds, and `more_seeds` once it is among the best) that
    /// have no result yet: the row is still in progress when this is not zero.
    pub pending: usize,
    /// Each measure over its seeds.
    pub stats: BTreeMap<Measure, Stat>,
    /// Seconds of training over its seeds.
    pub train_seconds: Option<Stat>,
    /// The paper's value, when the grid quotes one.
    pub paper: Option<f64>,
}

/// One summary per row of `grid` from `runs` (the grid's rows' results, deduplicated).
fn summarize(grid: &Grid, runs: &[RunResult]) -> Vec<RowSummary> {
    grid.rows
        .iter()
        .map(|row| {
            let mine: Vec<&RunResult> = runs.iter().filter(|r| r.row == row.label).collect();
            let stats = Measure::ALL
                .iter()
                .filter_map(|&m| {
                    let values: Vec<f64> = mine
                        .iter()
                        .filter_map(|r| r.measures.get(&m).copied())
                        .collect();
                    Stat::of(&values).map(|s| (m, s))
                })
                .collect();
            let seconds: Vec<f64> = mine.iter().filter_map(|r| r.train_seconds).collect();
            let pending = grid
                .seeds
                .iter()
                .filter(|s| !mine.iter().any(|r| r.seed == **s))
                .count();
            RowSummary {
                label: row.label.clone(),
                seeds: mine.iter().map(|r| r.seed).collect(),
                pending,
                stats,
                train_seconds: Stat::of(&seconds),
                paper: grid
                    .paper
                    .as_ref()
                    .and_then(|p| p.values.get(&row.label).copied()),
            }
        })
        .collect()
}

/// The labels of the rows that `more` gives extra seeds: the best `more.top` by `more.by`,
/// ranked on the results of the grid's first seeds alone (`runs` may hold more; one result per
/// row and seed). The runner and the report both ask this.
pub(crate) fn first_pass_top(grid: &Grid, more: &MoreSeeds, runs: &[RunResult]) -> Vec<String> {
    let first: Vec<RunResult> = runs
        .iter()
        .filter(|r| grid.seeds.contains(&r.seed))
        .cloned()
        .collect();
    top_labels(&summarize(grid, &first), more.by, more.top)
}

/// A grid's report (`report.md`, `results.json`, `p_mrr.svg` / `.png` in its output folder).
#[derive(Debug, Clone, Serialize)]
#[non_exhaustive]
pub struct GridReport {
    /// The grid's name.
    pub name: String,
    /// The grid file.
    pub grid: String,
    /// The base config.
    pub base: String,
    /// The base model's measures before training.
    pub zero_shot: Option<Measures>,
    /// The rows, in the grid's order.
    pub rows: Vec<RowSummary>,
    /// What the paper's values are, when the grid quotes them.
    pub paper_measure: Option<String>,
    /// Every finished run.
    pub runs: Vec<RunResult>,
}

impl GridReport {
    /// The report of `runs` (finished runs of `grid`; runs of other rows are left out).
    pub fn build(grid: &Grid, zero_shot: Option<ZeroShotResult>, mut runs: Vec<RunResult>) -> Self {
        runs.retain(|r| grid.rows.iter().any(|row| row.label == r.row));
        runs.sort_by(|a, b| {
            let pos = |r: &RunResult| grid.rows.iter().position(|row| row.label == r.row);
            pos(a).cmp(&pos(b)).then(a.seed.cmp(&b.seed))
        });
        runs.dedup_by(|a, b| a.row == b.row && a.seed == b.seed);
        let mut rows = summarize(grid, &runs);
        // `more_seeds`: once every row has its first seeds, the best rows of that first pass
        // (ranked on the first seeds alone, as the runner picks them) owe their extra seeds too.
        if let Some(more) = &grid.more_seeds
            && rows.iter().all(|r| r.pending == 0)
        {
            let top = first_pass_top(grid, more, &runs);
            for row in rows.iter_mut().filter(|r| top.contains(&r.label)) {
                row.pending += more.seeds.iter().filter(|s| !row.seeds.contains(s)).count();
            }
        }
        GridReport {
            name: grid.name.clone(),
            grid: grid.path.display().to_string(),
            base: grid.base.display().to_string(),
            zero_shot: zero_shot.map(|z| z.measures),
            rows,
            paper_measure: grid.paper.as_ref().map(|p| p.measure.clone()),
            runs,
        }
    }

    /// The labels of the `top` rows with the highest mean of `by` (rows without it last; ties
    /// in the grid's order).
    pub fn top_rows(&self, by: Measure, top: usize) -> Vec<String> {
        top_labels(&self.rows, by, top)
    }

    /// Runs the grid still owes.
    pub fn pending(&self) -> usize {
        self.rows.iter().map(|r| r.pending).sum()
    }

    /// The largest sample standard deviation of `measure` among rows with at least two seeds,
    /// with its row.
    pub fn largest_spread(&self, measure: Measure) -> Option<(&str, f64)> {
        self.rows
            .iter()
            .filter_map(|r| {
                r.stats
                    .get(&measure)
                    .and_then(|s| s.sd)
                    .map(|sd| (r.label.as_str(), sd))
            })
            .max_by(|a, b| a.1.total_cmp(&b.1))
    }

    /// Spearman's rank correlation between the rows' mean dev p-MRR and the paper's values,
    /// over the rows that have both (`None` for fewer than three), with their count.
    pub fn paper_rank_correlation(&self) -> Option<(f64, usize)> {
        let pairs: Vec<(f64, f64)> = self
            .rows
            .iter()
            .filter_map(|r| Some((r.stats.get(&Measure::PMrr)?.mean, r.paper?)))
            .collect();
        if pairs.len() < 3 {
            return None;
        }
        let a = ranks(&pairs.iter().map(|p| p.0).collect::<Vec<_>>());
        let b = ranks(&pairs.iter().map(|p| p.1).collect::<Vec<_>>());
        Some((pearson(&a, &b), pairs.len()))
    }

    /// The report as Markdown: a header, the table (means ± sample standard deviations over
    /// seeds, best mean of each column in bold) and notes.
    pub fn markdown(&self) -> String {
        let mut s = String::new();
        let done = self.runs.len();
        let _ = writeln!(s, "# Ablation grid `{}`\n", self.name);
        let _ = writeln!(
            s,
            "Grid `{}` over `{}`: {done} run(s) finished, {} pending. Each cell is the mean over \
             the row's seeds ± their sample standard deviation (x100; no ± for one seed); the \
             best mean of each column is in bold.\n",
            self.grid,
            self.base,
            self.pending()
        );
        let mut header = String::from("| row | seeds |");
        let mut rule = String::from("|---|---|");
        for m in Measure::ALL {
            let _ = write!(header, " {} |", m.header());
            rule.push_str("---:|");
        }
        header.push_str(" training (s) |");
        rule.push_str("---:|");
        if let Some(p) = &self.paper_measure {
            let _ = write!(header, " paper: {p} |");
            rule.push_str("---:|");
        }
        let _ = writeln!(s, "{header}\n{rule}");
        let best: BTreeMap<Measure, f64> = Measure::ALL
            .iter()
            .filter_map(|&m| {
                self.rows
                    .iter()
                    .filter_map(|r| r.stats.get(&m).map(|s| s.mean))
                    .max_by(f64::total_cmp)
                    .map(|v| (m, v))
            })
            .collect();
        if let Some(z) = &self.zero_shot {
            let mut line = String::from("| zero-shot (base model) | – |");
            for m in Measure::ALL {
                let _ = write!(
                    line,
                    " {} |",
                    z.get(&m).map_or("–".into(), |v| format!("{v:.2}"))
                );
            }
            line.push_str(" – |");
            if self.paper_measure.is_some() {
                line.push_str(" – |");
            }
            let _ = writeln!(s, "{line}");
        }
        for r in &self.rows {
            let seeds = if r.seeds.is_empty() {
                "pending".to_string()
            } else {
                let list = r
                    .seeds
                    .iter()
                    .map(u64::to_string)
                    .collect::<Vec<_>>()
                    .join(", ");
                if r.pending > 0 {
                    format!("{list} (+{} pending)", r.pending)
                } else {
                    list
                }
            };
            let mut line = format!("| {} | {seeds} |", r.label);
            for m in Measure::ALL {
                let cell = r.stats.get(&m).map_or("–".into(), |st| {
                    st.cell(best.get(&m).is_some_and(|b| *b == st.mean))
                });
                let _ = write!(line, " {cell} |");
            }
            let secs = r
                .train_seconds
                .as_ref()
                .map_or("–".into(), |t| format!("{:.1}", t.mean));
            let _ = write!(line, " {secs} |");
            if self.paper_measure.is_some() {
                let _ = write!(
                    line,
                    " {} |",
                    r.paper.map_or("–".into(), |v| format!("{v:.1}"))
                );
            }
            let _ = writeln!(s, "{line}");
        }
        s.push('\n');
        if let Some((row, sd)) = self.largest_spread(Measure::PMrr) {
            let _ = writeln!(
                s,
                "Largest seed spread of dev p-MRR: {sd:.2} (sample standard deviation, row `{row}`).\n"
            );
        }
        if let Some((rho, n)) = self.paper_rank_correlation() {
            let _ = writeln!(
                s,
                "Spearman's rank correlation of the rows' mean dev p-MRR with the paper's values: \
                 {rho:.2} over {n} rows.\n"
            );
        }
        s
    }

    /// Writes `report.md`, `results.json` and the chart (`p_mrr.svg`, `p_mrr.png`) into `dir`.
    ///
    /// # Errors
    /// [`Error::Write`] naming the file; a chart that cannot be drawn.
    pub fn write(&self, dir: &Path) -> Result<()> {
        std::fs::create_dir_all(dir).map_err(|source| Error::Write {
            path: dir.to_path_buf(),
            source,
        })?;
        let md = dir.join("report.md");
        infembed_data::write_atomic(&md, self.markdown().as_bytes())
            .map_err(|source| Error::Write { path: md, source })?;
        let json_path = dir.join("results.json");
        let json = serde_json::to_vec_pretty(self).map_err(|e| Error::Write {
            path: json_path.clone(),
            source: std::io::Error::other(e),
        })?;
        infembed_data::write_atomic(&json_path, &json).map_err(|source| Error::Write {
            path: json_path,
            source,
        })?;
        let rows: Vec<GridChartRow> = self
            .rows
            .iter()
            .map(|r| GridChartRow {
                label: r.label.clone(),
                values: r
                    .stats
                    .get(&Measure::PMrr)
                    .map(|s| s.values.clone())
                    .unwrap_or_default(),
                paper: r.paper,
            })
            .collect();
        let baseline = self
            .zero_shot
            .as_ref()
            .and_then(|z| z.get(&Measure::PMrr).copied());
        grid_chart(
            &format!("{}: dev p-MRR over seeds", self.name),
            &rows,
            baseline,
            self.paper_measure.as_deref(),
        )?
        .write(&dir.join("p_mrr"))?;
        Ok(())
    }
}

fn top_labels(rows: &[RowSummary], by: Measure, top: usize) -> Vec<String> {
    let mut scored: Vec<(usize, f64)> = rows
        .iter()
        .enumerate()
        .filter_map(|(i, r)| r.stats.get(&by).map(|s| (i, s.mean)))
        .collect();
    // Highest first; equal means keep the grid's order (the sort is stable).
    scored.sort_by(|a, b| b.1.total_cmp(&a.1));
    scored
        .into_iter()
        .take(top)
        .map(|(i, _)| rows[i].label.clone())
        .collect()
}

/// Ranks 1..=n, ties given their mean rank.
fn ranks(v: &[f64]) -> Vec<f64> {
    let mut idx: Vec<usize> = (0..v.len()).collect();
    idx.sort_by(|&a, &b| v[a].total_cmp(&v[b]));
    let mut out = vec![0.0; v.len()];
    let mut i = 0;
    while i < idx.len() {
        let mut j = i;
        while j + 1 < idx.len() && v[idx[j + 1]] == v[idx[i]] {
            j += 1;
        }
        let rank = (i + j) as f64 / 2.0 + 1.0;
        for &k in &idx[i..=j] {
            out[k] = rank;
        }
        i = j + 1;
    }
    out
}

fn pearson(a: &[f64], b: &[f64]) -> f64 {
    let n = a.len() as f64;
    let (ma, mb) = (a.iter().sum::<f64>() / n, b.iter().sum::<f64>() / n);
    let cov: f64 = a.iter().zip(b).map(|(x, y)| (x - ma) * (y - mb)).sum();
    let va: f64 = a.iter().map(|x| (x - ma).powi(2)).sum();
    let vb: f64 = b.iter().map(|y| (y - mb).powi(2)).sum();
    if va == 0.0 || vb == 0.0 {
        return f64::NAN;
    }
    cov / (va * vb).sqrt()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_is_the_mean_and_the_sample_standard_deviation() {
        let s = Stat::of(&[2.0, 4.0, 4.0, 4.0, 5.0, 5.0, 7.0, 9.0]).unwrap();
        assert_eq!(s.mean, 5.0);
        // Sum of squared deviations 32 over n - 1 = 7.
        assert!((s.sd.unwrap() - (32.0f64 / 7.0).sqrt()).abs() < 1e-12);
        assert_eq!(Stat::of(&[3.5]).unwrap().sd, None);
        assert!(Stat::of(&[]).is_none());
    }

    #[test]
    fn ranks_average_ties_and_spearman_of_a_reversal_is_minus_one() {
        assert_eq!(ranks(&[10.0, 30.0, 20.0, 20.0]), vec![1.0, 4.0, 2.5, 2.5]);
        let a = ranks(&[1.0, 2.0, 3.0, 4.0]);
        let b = ranks(&[9.0, 7.0, 5.0, 1.0]);
        assert!((pearson(&a, &b) + 1.0).abs() < 1e-12);
    }
}
