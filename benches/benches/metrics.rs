//! Cost of evaluating every measure trec_eval's `all_trec` shares with this crate (map, Rprec,
//! recip_rank, P/recall/ndcg_cut/map_cut at the 9 default cut-offs, ndcg, success_1/5/10 and the
//! counts: 46 measures) over 10,000 queries x 1,000 ranked documents with 30 judged documents
//! each (`infembed_benches::metrics_data`), on one thread and on all threads (rayon), plus
//! reading the same data from TREC files.
//!
//! Benchmark ids are `metrics/<what>`; `docs/benchmarks.md` records the results
//! and the comparison with pytrec_eval.

// `criterion_group!` generates an undocumented public function.
#![allow(missing_docs)]

use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use infembed_benches::metrics_data;
use infembed_metrics::{EvalOptions, Measure, Qrels, Run, TieBreak, evaluate_with};

fn bench(c: &mut Criterion) {
    let data = metrics_data::benchmark_data();
    let measures = Measure::trec_eval_all();
    let mut group = c.benchmark_group("metrics");
    group
        .sample_size(10)
        .measurement_time(Duration::from_secs(20));
    for (name, parallel) in [
        ("evaluate_all/1_thread", false),
        ("evaluate_all/all_threads", true),
    ] {
        let options = EvalOptions {
            parallel,
            ..EvalOptions::default()
        };
        group.bench_function(name, |b| {
            b.iter(|| evaluate_with(&data.qrels, &data.run, &measures, &options).unwrap())
        });
    }
    let dir = std::env::temp_dir().join(format!("infembed-metrics-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (qrels_path, run_path) = (dir.join("qrels.txt"), dir.join("run.txt"));
    data.qrels.write(&qrels_path).unwrap();
    data.run.write(&run_path, TieBreak::TrecEval).unwrap();
    group.bench_function("read_trec_files", |b| {
        b.iter(|| {
            (
                Qrels::read(&qrels_path).unwrap(),
                Run::read(&run_path).unwrap(),
            )
        })
    });
    group.finish();
    std::fs::remove_dir_all(&dir).ok();
}

criterion_group!(benches, bench);
criterion_main!(benches);
