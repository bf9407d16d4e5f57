"""Compares top-k runs written by scripts/bench/index_scale.sh (TSV: query, rank, doc, score):
each run against the first, the reference.

    python compare_runs.py REFERENCE.tsv RUN.tsv [RUN.tsv ...]

Prints one JSON line per run: the mean overlap of the top-k id sets with the reference's, the
share of queries whose ranked lists are identical, and the largest score difference on the
documents both runs return.
"""

import json
import sys
from collections import defaultdict


def read(path):
    runs = defaultdict(list)
    with open(path) as f:
        for line in f:
            q, rank, doc, score = line.rstrip("\n").split("\t")
            runs[q].append((int(rank), doc, float(score)))
    return {q: sorted(hits) for q, hits in runs.items()}


def main() -> None:
    ref_path, *others = sys.argv[1:]
    ref = read(ref_path)
    for path in others:
        run = read(path)
        assert run.keys() == ref.keys(), f"{path} and {ref_path} hold different queries"
        overlap, identical, max_diff = 0.0, 0, 0.0
        for q, hits in ref.items():
            mine = run[q]
            ref_docs = [d for _, d, _ in hits]
            my_docs = [d for _, d, _ in mine]
            overlap += len(set(ref_docs) & set(my_docs)) / len(ref_docs)
            identical += ref_docs == my_docs
            ref_score = {d: s for _, d, s in hits}
            for _, d, s in mine:
                if d in ref_score:
                    max_diff = max(max_diff, abs(s - ref_score[d]))
        print(
            json.dumps(
                {
                    "run": path,
                    "reference": ref_path,
                    "queries": len(ref),
                    "mean_overlap": round(overlap / len(ref), 6),
                    "identical_lists": identical,
                    "max_score_diff": max_diff,
                }
            )
        )


if __name__ == "__main__":
    main()
