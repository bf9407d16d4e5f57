"""sentence-transformers' side of the `infembed embed` benchmark (docs/benchmarks.md).

Encodes the passages of a JSONL corpus ("{title} {text}" when the title is not blank, as
`infembed embed` does) with SentenceTransformer(model).encode at its defaults (batch 32,
the model's max_seq_length), on the CPU, and prints one JSON line: passages, seconds,
passages/s, peak RSS (MiB), and, with --compare FILE.npy, the largest absolute difference from
infembed's embeddings.

    python3 scripts/bench/embed_st.py --model models/all-MiniLM-L6-v2 --input corpus.jsonl \
        [--compare infembed.npy]
"""

import argparse
import json
import resource
import time

import numpy as np
import torch
from sentence_transformers import SentenceTransformer


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--input", required=True)
    ap.add_argument("--compare")
    args = ap.parse_args()
    texts = []
    for line in open(args.input):
        if line.strip():
            o = json.loads(line)
            title = (o.get("title") or "").strip()
            texts.append(f"{o['title']} {o['text']}" if title else o["text"])
    model = SentenceTransformer(args.model, device="cpu")
    start = time.perf_counter()
    emb = model.encode(texts, convert_to_numpy=True)
    seconds = time.perf_counter() - start
    out = {
        "tool": "sentence-transformers",
        "passages": len(texts),
        "seconds": round(seconds, 2),
        "passages_per_s": round(len(texts) / seconds, 1),
        "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "threads": torch.get_num_threads(),
    }
    if args.compare:
        theirs = np.load(args.compare)
        out["max_abs_diff_vs_infembed"] = float(np.abs(theirs - emb).max())
    print(json.dumps(out))


if __name__ == "__main__":
    main()
