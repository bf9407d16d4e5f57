#!/usr/bin/env python3
"""Time pytrec_eval on the metrics benchmark's data and check its values against ours.

Usage (from the repository root; needs a venv with pytrec-eval-terrier, e.g.
`python3 -m venv /work/venvs/bench && /work/venvs/bench/bin/pip install pytrec-eval-terrier`):

    cargo run --release -p infembed-benches --example metrics_trec_files -- write /tmp/metrics-bench
    /work/venvs/bench/bin/python benches/compare/pytrec_eval_metrics.py /tmp/metrics-bench [REPEATS]

It reads DIR/qrels.txt and DIR/run.txt with pytrec_eval's own parsers (timed), builds a
RelevanceEvaluator for the same 46 measures as the Rust benchmark (map, Rprec, recip_rank,
P/recall/ndcg_cut/map_cut at the default cut-offs, ndcg, success, num_ret/num_rel/num_rel_ret)
and times `evaluate` (best of REPEATS, default 3; pytrec_eval is single-threaded). Then it
compares pytrec_eval's summary (counts summed, the rest averaged) with DIR/rust_summary.txt,
written by the Rust example, and fails if any value differs by more than 1e-4 (the summary file
prints 4 decimals).
"""
import sys
import time

import pytrec_eval

MEASURES = {"map", "Rprec", "recip_rank", "P", "recall", "ndcg", "ndcg_cut", "map_cut",
            "success", "num_ret", "num_rel", "num_rel_ret"}
COUNTS = {"num_ret", "num_rel", "num_rel_ret"}


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
    t_read, (qrels, run) = best_of(1, lambda: (
        pytrec_eval.parse_qrel(open(f"{directory}/qrels.txt")),
        pytrec_eval.parse_run(open(f"{directory}/run.txt"))))
    t_init, evaluator = best_of(repeats, lambda: pytrec_eval.RelevanceEvaluator(qrels, MEASURES))
    t_eval, per_query = best_of(repeats, lambda: evaluator.evaluate(run))
    print(f"pytrec_eval {pytrec_eval.__version__ if hasattr(pytrec_eval, '__version__') else ''}")
    print(f"queries\t{len(per_query)}\trun entries\t{sum(len(d) for d in run.values())}")
    print(f"read_trec_files (parse_qrel + parse_run)\t{t_read:.3f} s")
    print(f"RelevanceEvaluator(qrels, measures)\t{t_init:.3f} s")
    print(f"evaluate(run)\t{t_eval:.3f} s")

    names = next(iter(per_query.values())).keys()
    summary = {}
    for name in names:
        values = [per_query[q][name] for q in sorted(per_query)]
        summary[name] = sum(values) if name in COUNTS else sum(values) / len(values)
    ours = {}
    for line in open(f"{directory}/rust_summary.txt"):
        name, _, value = [c.strip() for c in line.split("\t")]
        ours[name] = float(value)
    if ours.get("num_q") != len(per_query):
        sys.exit(f"num_q differs: ours {ours.get('num_q')}, pytrec_eval {len(per_query)}")
    compared, worst = 0, 0.0
    for name, value in summary.items():
        if name not in ours:
            continue
        diff = abs(ours[name] - value)
        worst = max(worst, diff)
        if diff > 1e-4 + 1e-9 * abs(value):
            sys.exit(f"{name}: ours {ours[name]}, pytrec_eval {value}")
        compared += 1
    print(f"agreement: {compared} summary measures equal to 4 decimals (largest difference {worst:.1e})")


if __name__ == "__main__":
    main()
