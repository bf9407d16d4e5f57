#!/usr/bin/env python3
"""Time ranx (numba) on the metrics benchmark's data and compare its values with ours.

Usage (from the repository root; needs a venv with ranx, e.g.
`python3 -m venv /work/venvs/bench && /work/venvs/bench/bin/pip install ranx pytrec-eval-terrier`):

    cargo run --release -p infembed-benches --example metrics_trec_files -- write /tmp/metrics-bench
    /work/venvs/bench/bin/python benches/compare/ranx_metrics.py /tmp/metrics-bench [REPEATS]

It reads DIR/qrels.txt and DIR/run.txt with ranx's TREC readers (timed), warms numba up on the
first 10 queries (its compilation is not counted), then times `ranx.evaluate` on the whole run
for the measures ranx shares with trec_eval (best of REPEATS, default 3; ranx runs its metrics
in parallel over the queries with numba, on every core). The measures and their trec_eval names:

    map -> map          r-precision -> Rprec     mrr -> recip_rank    ndcg -> ndcg
    precision@k -> P_k  recall@k -> recall_k     ndcg@k -> ndcg_cut_k map@k -> map_cut_k
    hit_rate@k -> success_k

at trec_eval's cut-offs (5, 10, 15, 20, 30, 100, 200, 500, 1000; success at 1, 5, 10): 41 ranx
metrics for 43 of the 46 measures the Rust benchmark times (ranx has no num_ret / num_rel /
num_rel_ret; map and ndcg over a run of 1,000 documents are ranx's map@1000 and ndcg@1000, which
also stand for map_cut_1000 and ndcg_cut_1000). Then it prints the largest
difference between ranx's means and DIR/rust_summary.txt. ranx orders tied scores its own way
(trec_eval, and infembed, order them by document id), and the benchmark's scores are rounded to 4
decimals so that ties are common: small differences are expected, and reported, not failed on.
"""
import sys
import time

import ranx

CUTS = [5, 10, 15, 20, 30, 100, 200, 500, 1000]
PAIRS = (
    [("map@1000", "map"), ("r-precision", "Rprec"), ("mrr", "recip_rank"), ("ndcg@1000", "ndcg")]
    + [(f"precision@{k}", f"P_{k}") for k in CUTS]
    + [(f"recall@{k}", f"recall_{k}") for k in CUTS]
    + [(f"ndcg@{k}", f"ndcg_cut_{k}") for k in CUTS]
    + [(f"map@{k}", f"map_cut_{k}") for k in CUTS]
    + [(f"hit_rate@{k}", f"success_{k}") for k in (1, 5, 10)]
)


def best_of(repeats, f):
    best, out = float("inf"), None
    for _ in range(repeats):
        start = time.perf_counter()
        out = f()
        best = min(best, time.perf_counter() - start)
    return best, out


def main():
    directory = sys.argv[1]
    repeats = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    start = time.perf_counter()
    qrels = ranx.Qrels.from_file(f"{directory}/qrels.txt", kind="trec")
    run = ranx.Run.from_file(f"{directory}/run.txt", kind="trec")
    t_read = time.perf_counter() - start
    metrics = list(dict.fromkeys(m for m, _ in PAIRS))

    # numba compiles each metric at its first call: warm up on a few queries.
    few = sorted(run.keys())[:10]
    ranx.evaluate(
        ranx.Qrels({q: qrels.qrels[q] for q in few if q in qrels.qrels}),
        ranx.Run({q: run.run[q] for q in few}),
        metrics,
    )
    t_eval, means = best_of(repeats, lambda: ranx.evaluate(qrels, run, metrics))
    print(f"ranx {getattr(ranx, '__version__', '')}")
    print(f"queries\t{len(run.keys())}\tmetrics\t{len(metrics)}")
    print(f"read_trec_files (Qrels.from_file + Run.from_file)\t{t_read:.3f} s")
    print(f"evaluate(qrels, run, {len(metrics)} metrics), best of {repeats}\t{t_eval:.3f} s")

    ours = {}
    for line in open(f"{directory}/rust_summary.txt"):
        name, _, value = [c.strip() for c in line.split("\t")]
        ours[name] = float(value)
    worst, worst_name = 0.0, None
    for ranx_name, trec_name in PAIRS:
        if trec_name not in ours:
            continue
        diff = abs(ours[trec_name] - means[ranx_name])
        if diff > worst:
            worst, worst_name = diff, f"{trec_name} (ranx {means[ranx_name]:.4f}, ours {ours[trec_name]:.4f})"
    print(f"largest difference from infembed-metrics' summary: {worst:.1e} at {worst_name}")


if __name__ == "__main__":
    main()
