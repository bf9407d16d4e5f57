//! Counts, per-scenario retention, the run report and progress reporting.

use std::io::{IsTerminal, Write};
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::client::RequestStats;
use crate::judge::Scenario;
use crate::output::{Provenance, Stage, Status};

/// Counts of finished pairs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Counts {
    /// Pairs finished (kept + all rejections).
    pub finished: u64,
    /// Pairs whose seven texts were generated and passed the rules (kept + judge rejections): the
    /// lines of the generated file.
    pub generated: u64,
    /// Records kept.
    pub kept: u64,
    /// Rejected because a generator answer was not the JSON asked for.
    pub rejected_malformed: u64,
    /// Rejected by the rule filter.
    pub rejected_rule: u64,
    /// Rejected by the quality check.
    pub rejected_judge: u64,
}

impl Counts {
    /// All rejections.
    pub fn rejected(&self) -> u64 {
        self.rejected_malformed + self.rejected_rule + self.rejected_judge
    }
}

/// Quality-check results of one scenario.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct ScenarioStats {
    /// The scenario.
    pub scenario: Scenario,
    /// Judgments made.
    pub judged: u64,
    /// Judgments that picked the right passage.
    pub correct: u64,
    /// Judgments whose answer was not one of the offered letters (counted as wrong).
    pub invalid_answers: u64,
    /// `correct / judged` (absent when nothing was judged).
    pub retention: Option<f64>,
}

/// Running totals over finished pairs.
#[derive(Debug, Clone, PartialEq)]
pub struct Tally {
    /// Pair counts.
    pub counts: Counts,
    /// Per scenario, in [`Scenario::ALL`] order.
    pub scenarios: [ScenarioStats; 3],
}

impl Default for Tally {
    fn default() -> Self {
        Tally {
            counts: Counts::default(),
            scenarios: Scenario::ALL.map(|scenario| ScenarioStats {
                scenario,
                judged: 0,
                correct: 0,
                invalid_answers: 0,
                retention: None,
            }),
        }
    }
}

impl Tally {
    /// Adds one finished pair.
    pub fn add(&mut self, p: &Provenance) {
        let c = &mut self.counts;
        c.finished += 1;
        match (p.status, p.stage) {
            (Status::Kept, _) => {
                c.kept += 1;
                c.generated += 1;
            }
            (Status::Rejected, Some(Stage::Judge)) => {
                c.rejected_judge += 1;
                c.generated += 1;
            }
            (Status::Rejected, Some(Stage::Malformed)) => c.rejected_malformed += 1,
            (Status::Rejected, Some(Stage::Rule) | None) => c.rejected_rule += 1,
        }
        for j in &p.judgments {
            let s = &mut self.scenarios[j.scenario.index()];
            s.judged += 1;
            if j.correct {
                s.correct += 1;
            }
            if j.chosen.is_none() {
                s.invalid_answers += 1;
            }
            s.retention = Some(s.correct as f64 / s.judged as f64);
        }
    }
}

/// This run's progress, as shown to the user.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunCounts {
    /// Pairs this run set out to do (input pairs not already done).
    pub to_do: u64,
    /// Pairs finished in this run.
    pub counts: Counts,
    /// Pairs that failed for a transport reason (retries or budget exhausted, a non-retryable
    /// HTTP status); they are not written, so a later run tries them again.
    pub failed: u64,
}

/// The report of a run (also written as pretty JSON to `output.report`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SynthReport {
    /// The kept-records file.
    pub records_path: PathBuf,
    /// The rejected-pairs file (pairs without a record: malformed answers, rule rejections).
    pub rejected_path: PathBuf,
    /// The generated-records file (every record, kept or not, with the judge's verdicts).
    pub generated_path: PathBuf,
    /// Lines copied between the records and generated files when resuming (a crash between the
    /// two writes of a kept record).
    pub repaired_lines: u64,
    /// Generator model name.
    pub generator_model: String,
    /// Judge model name (absent when the quality check is off).
    pub judge_model: Option<String>,
    /// Distractors per judgment.
    pub distractors: usize,
    /// The run seed.
    pub seed: u64,
    /// Pairs in the input (after offset/limit, duplicates removed).
    pub input_pairs: u64,
    /// Relevance judgments skipped because their passage is absent or blank.
    pub missing_passages: u64,
    /// Pairs already finished by earlier runs when this run started.
    pub already_done: u64,
    /// This run's counts.
    pub this_run: RunCounts,
    /// Counts over everything in the output files (earlier runs included).
    pub total: Counts,
    /// Per-scenario quality-check results over everything in the output files.
    pub scenarios: Vec<ScenarioStats>,
    /// `total.kept / total.generated`: the share of generated records the quality check kept
    /// (the paper kept about 39%).
    pub retention: Option<f64>,
    /// Pairs of the input still not finished after this run.
    pub remaining: u64,
    /// Generator HTTP traffic of this run.
    pub generator_requests: RequestStats,
    /// Judge HTTP traffic of this run.
    pub judge_requests: RequestStats,
    /// The request budget, if any.
    pub request_budget: Option<u64>,
    /// Whether the budget ran out.
    pub budget_exhausted: bool,
    /// Whether the run stopped early because of `stop_after`.
    pub stopped_early: bool,
    /// Partial last lines (crash mid-write) cut off the output files when resuming.
    pub partial_lines_dropped: u64,
    /// The first few failure messages of this run.
    pub failure_samples: Vec<String>,
    /// Wall time of the run, seconds.
    pub elapsed_secs: f64,
}

/// Receives progress from [`crate::run`] (called on the calling thread only).
pub trait Progress {
    /// The run starts with `to_do` pairs; `already_done` were finished by earlier runs.
    fn start(&mut self, to_do: u64, already_done: u64) {
        let _ = (to_do, already_done);
    }
    /// A pair finished or failed.
    fn update(&mut self, counts: &RunCounts) {
        let _ = counts;
    }
    /// The run ended.
    fn finish(&mut self, report: &SynthReport) {
        let _ = report;
    }
}

/// Progress that reports nothing.
#[derive(Debug, Default, Clone, Copy)]
pub struct NoProgress;

impl Progress for NoProgress {}

/// Progress on standard error: a line redrawn in place when stderr is a terminal, otherwise one
/// plain line per finished pair. Shows done/to-do and the generated / kept / rejected / failed
/// counts.
#[derive(Debug)]
pub struct StderrProgress {
    terminal: bool,
    started: std::time::Instant,
}

impl Default for StderrProgress {
    fn default() -> Self {
        StderrProgress {
            terminal: std::io::stderr().is_terminal(),
            started: std::time::Instant::now(),
        }
    }
}

impl StderrProgress {
    /// One status line.
    pub fn line(counts: &RunCounts, elapsed_secs: f64) -> String {
        let c = &counts.counts;
        let done = c.finished + counts.failed;
        format!(
            "synth: {done}/{} pairs | generated {} | kept {} | rejected {} | failed {} | {:.0}s",
            counts.to_do,
            c.generated,
            c.kept,
            c.rejected(),
            counts.failed,
            elapsed_secs
        )
    }
}

impl Progress for StderrProgress {
    fn start(&mut self, to_do: u64, already_done: u64) {
        self.started = std::time::Instant::now();
        eprintln!("synth: {to_do} pairs to do ({already_done} already done by earlier runs)");
    }

    fn update(&mut self, counts: &RunCounts) {
        let line = Self::line(counts, self.started.elapsed().as_secs_f64());
        let mut err = std::io::stderr().lock();
        if self.terminal {
            let _ = write!(err, "\r\x1b[2K{line}");
            let _ = err.flush();
        } else {
            let _ = writeln!(err, "{line}");
        }
    }

    fn finish(&mut self, report: &SynthReport) {
        if self.terminal {
            eprintln!();
        }
        let pct = |r: Option<f64>| r.map_or("-".to_string(), |r| format!("{:.1}%", 100.0 * r));
        for s in &report.scenarios {
            eprintln!(
                "synth: {:?}: {}/{} judged right ({}), {} invalid answers",
                s.scenario,
                s.correct,
                s.judged,
                pct(s.retention),
                s.invalid_answers
            );
        }
        eprintln!(
            "synth: {} generated records in {}; kept records in {}",
            report.total.generated,
            report.generated_path.display(),
            report.records_path.display()
        );
        eprintln!(
            "synth: kept {} of {} generated ({}); {} remaining; {} requests this run",
            report.total.kept,
            report.total.generated,
            pct(report.retention),
            report.remaining,
            report.generator_requests.attempts + report.judge_requests.attempts
        );
    }
}
