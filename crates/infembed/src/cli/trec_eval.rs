//! `infembed trec-eval`: trec_eval-compatible evaluation of a TREC run file, with trec_eval's
//! own command line: `-m` (repeated; `P.5,10`, `ndcg_cut.10`, `all_trec`, `official`), `-q`,
//! `-n`, `-c`, `-l`, `-J`, `-M`.

use std::path::PathBuf;

use anyhow::Result;
use clap::{ArgAction, Args};
use infembed::metrics::{
    DEFAULT_RUN_TAG, EvalOptions, Measure, Qrels, Run, TrecEvalFormat, evaluate_with,
};

#[derive(Args)]
pub struct TrecEvalArgs {
    /// TREC qrels file (query 0 doc label).
    qrels: PathBuf,
    /// TREC run file (query Q0 doc rank score tag).
    run: PathBuf,
    /// A measure or measure set, as trec_eval's `-m`; repeat it for several: `map`,
    /// `ndcg_cut.10`, `P.5,10,20`, `ndcg_cut` (trec_eval's cut-offs), `all_trec`, `official`,
    /// `runid`, `num_q`; this tool's spelling `ndcg_cut_10` and comma lists work too. Without
    /// any: `official` (the subset of it this tool computes).
    #[arg(short, long = "measure", action = ArgAction::Append, value_name = "MEASURE")]
    measures: Vec<String>,
    /// Also print per-query values.
    #[arg(short, long)]
    q: bool,
    /// Print no summary lines, only the per-query ones of `-q` (trec_eval -n, --nosummary).
    #[arg(short = 'n', long = "nosummary")]
    no_summary: bool,
    /// Average over all judged queries (trec_eval -c).
    #[arg(short, long)]
    c: bool,
    /// The lowest label that counts as relevant for the binary measures (trec_eval -l; TREC DL
    /// uses 2); nDCG's gains stay the labels.
    #[arg(short = 'l', value_name = "LEVEL", default_value_t = 1,
          value_parser = clap::value_parser!(i32).range(1..))]
    relevance_level: i32,
    /// Rank only judged documents (trec_eval -J).
    #[arg(short = 'J')]
    judged_only: bool,
    /// Consider only the first N ranked documents of each query (trec_eval -M).
    #[arg(short = 'M', value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    max_docs: Option<u64>,
}

/// What the `-m` arguments select: the measures, in trec_eval's print order, and whether the
/// `runid` and `num_q` lines are asked for.
#[derive(Debug, PartialEq)]
struct Selection {
    measures: Vec<Measure>,
    runid: bool,
    num_q: bool,
}

fn select(args: &[String]) -> infembed::metrics::Result<Selection> {
    if args.is_empty() {
        return select(&["official".to_string()]);
    }
    let mut out = Selection {
        measures: Vec::new(),
        runid: false,
        num_q: false,
    };
    for arg in args {
        // A dotted argument is one trec_eval spec (its cut-offs are comma-separated); any
        // other may be a list of names.
        let parts: Vec<&str> = if arg.contains('.') {
            vec![arg.trim()]
        } else {
            arg.split(|c: char| c == ',' || c.is_whitespace())
                .filter(|s| !s.is_empty())
                .collect()
        };
        for part in parts {
            match part {
                "runid" => out.runid = true,
                "num_q" => out.num_q = true,
                _ => {
                    if matches!(part, "all_trec" | "official") {
                        out.runid = true;
                        out.num_q = true;
                    }
                    for m in Measure::parse_trec_eval(part)? {
                        if !out.measures.contains(&m) {
                            out.measures.push(m);
                        }
                    }
                }
            }
        }
    }
    Measure::sort_trec_eval(&mut out.measures);
    Ok(out)
}

pub fn run(args: &TrecEvalArgs) -> Result<()> {
    let selection = select(&args.measures)?;
    let qrels = Qrels::read(&args.qrels)?;
    let run = Run::read(&args.run)?;
    let options = EvalOptions {
        complete: args.c,
        relevance_level: args.relevance_level,
        judged_only: args.judged_only,
        max_docs: args
            .max_docs
            .map(|m| usize::try_from(m).unwrap_or(usize::MAX)),
        ..EvalOptions::default()
    };
    let evaluation = evaluate_with(&qrels, &run, &selection.measures, &options)?;
    let runid = selection
        .runid
        .then(|| run.tag().unwrap_or(DEFAULT_RUN_TAG).to_string());
    let mut format = TrecEvalFormat::new(args.q, runid, selection.num_q);
    if args.no_summary {
        format = format.without_summary();
    }
    let stdout = std::io::stdout();
    evaluation.write_trec_eval_as(stdout.lock(), &format)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(args: &[&str]) -> Vec<String> {
        let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        select(&args)
            .unwrap()
            .measures
            .iter()
            .map(Measure::to_string)
            .collect()
    }

    #[test]
    fn trec_eval_measure_arguments() {
        // trec_eval's print order, whatever the order asked.
        assert_eq!(names(&["ndcg_cut.10", "map"]), ["map", "ndcg_cut_10"]);
        assert_eq!(names(&["ndcg_cut_10"]), ["ndcg_cut_10"]);
        assert_eq!(names(&["P.5,10", "P.10"]), ["P_5", "P_10"]);
        assert_eq!(names(&["map,recip_rank P_5"]), ["map", "recip_rank", "P_5"]);
        assert_eq!(names(&["ndcg_cut"]).len(), 9, "trec_eval's nine cut-offs");
        let official = select(&[]).unwrap();
        assert!(official.runid && official.num_q);
        assert_eq!(official.measures, Measure::trec_eval_official());
        let plain = select(&["map".to_string()]).unwrap();
        assert!(!plain.runid && !plain.num_q, "only what was asked");
        for bad in ["P.x", "map.5", "nope", "P.0", "ndcg_cut."] {
            assert!(select(&[bad.to_string()]).is_err(), "{bad}");
        }
    }
}
