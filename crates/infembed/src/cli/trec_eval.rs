//! `infembed trec-eval`: trec_eval-compatible evaluation of a TREC run file.

use std::path::PathBuf;

use anyhow::Result;
use clap::Args;
use infembed::metrics::{EvalOptions, Measure, Qrels, Run, evaluate_with};

#[derive(Args)]
pub struct TrecEvalArgs {
    /// TREC qrels file (query 0 doc label).
    qrels: PathBuf,
    /// TREC run file (query Q0 doc rank score tag).
    run: PathBuf,
    /// Comma-separated measures in trec_eval names (default: trec_eval's standard set).
    #[arg(short, long)]
    measures: Option<String>,
    /// Also print per-query values.
    #[arg(short, long)]
    q: bool,
    /// Average over all judged queries (trec_eval -c).
    #[arg(short, long)]
    c: bool,
}

pub fn run(args: &TrecEvalArgs) -> Result<()> {
    let qrels = Qrels::read(&args.qrels)?;
    let run = Run::read(&args.run)?;
    let measures = match &args.measures {
        Some(list) => Measure::parse_list(list)?,
        None => Measure::trec_eval_all(),
    };
    let options = EvalOptions {
        complete: args.c,
        ..EvalOptions::default()
    };
    let evaluation = evaluate_with(&qrels, &run, &measures, &options)?;
    let stdout = std::io::stdout();
    evaluation.write_trec_eval(stdout.lock(), args.q)?;
    Ok(())
}
