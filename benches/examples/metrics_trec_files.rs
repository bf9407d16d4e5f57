//! Writes the metrics benchmark's data set as TREC files, and times this crate on those files,
//! for the pytrec_eval comparison (`benches/compare/pytrec_eval_metrics.py`).
//!
//! ```text
//! cargo run --release -p infembed-benches --example metrics_trec_files -- write DIR
//! cargo run --release -p infembed-benches --example metrics_trec_files -- time DIR [REPEATS]
//! ```
//! `write` creates `DIR/qrels.txt`, `DIR/run.txt` and `DIR/rust_summary.txt` (this crate's
//! trec_eval-style summary of all measures). `time` reads the files and evaluates them, printing
//! wall-clock seconds (best of REPEATS, default 5) for reading, and for evaluating on one thread
//! and on all threads.

use std::path::PathBuf;
use std::time::Instant;

use infembed_benches::metrics_data;
use infembed_metrics::{EvalOptions, Measure, Qrels, Run, TieBreak, evaluate_with};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let usage = "usage: metrics_trec_files (write DIR | time DIR [REPEATS])";
    let (command, dir) = match (args.first(), args.get(1)) {
        (Some(c), Some(d)) => (c.as_str(), PathBuf::from(d)),
        _ => return Err(usage.into()),
    };
    let measures = Measure::trec_eval_all();
    match command {
        "write" => {
            std::fs::create_dir_all(&dir)?;
            let data = metrics_data::benchmark_data();
            data.qrels.write(dir.join("qrels.txt"))?;
            data.run.write(dir.join("run.txt"), TieBreak::TrecEval)?;
            let eval = evaluate_with(&data.qrels, &data.run, &measures, &EvalOptions::default())?;
            let file = std::fs::File::create(dir.join("rust_summary.txt"))?;
            eval.write_trec_eval(std::io::BufWriter::new(file), false)?;
            println!(
                "wrote {} queries, {} run entries, {} judgements to {}",
                data.run.len(),
                data.run.num_entries(),
                data.qrels.num_judgements(),
                dir.display()
            );
        }
        "time" => {
            let repeats: usize = args.get(2).map(|r| r.parse()).transpose()?.unwrap_or(5);
            let best = |f: &mut dyn FnMut()| {
                (0..repeats.max(1))
                    .map(|_| {
                        let start = Instant::now();
                        f();
                        start.elapsed().as_secs_f64()
                    })
                    .fold(f64::INFINITY, f64::min)
            };
            let mut loaded = None;
            let read = best(&mut || {
                loaded = Some((
                    Qrels::read(dir.join("qrels.txt")).unwrap(),
                    Run::read(dir.join("run.txt")).unwrap(),
                ))
            });
            let (qrels, run) = loaded.expect("read at least once");
            for (name, parallel) in [("evaluate_1_thread", false), ("evaluate_all_threads", true)] {
                let options = EvalOptions {
                    parallel,
                    ..EvalOptions::default()
                };
                let t = best(&mut || {
                    evaluate_with(&qrels, &run, &measures, &options).unwrap();
                });
                println!("{name}\t{t:.3} s");
            }
            println!("read_trec_files\t{read:.3} s");
        }
        _ => return Err(usage.into()),
    }
    Ok(())
}
