#!/usr/bin/env python3
"""sentence-transformers baseline for the encoder bench (developer-run, not CI).

Embeds the same 256 synthetic passages as `benches/benches/encoder.rs` (the generator of
`benches/src/encoder_data.rs`, re-implemented below) with all-MiniLM-L6-v2 on CPU torch
with 2 threads, batch 32, and prints passages/second (median of several runs).

    /work/venvs/hf/bin/python scripts/encoder/bench_st.py [MODEL_DIR] [--runs N] [--dump FILE]

`--dump FILE` also writes the texts and embeddings as JSON (to compare with Rust output).
"""
import argparse
import json
import os
import statistics
import time

import torch
from sentence_transformers import SentenceTransformer

WORDS = ("the of and to in is was for on are with as by at from this that which water system people "
         "time year city world school house music river market energy health study history game team "
         "power light field model data paper black small large early public local human social united "
         "national general found known used made called between during after before under over").split()
assert len(WORDS) == 64
MASK = (1 << 64) - 1


def passage(i, words_per_passage=120):
    x = i + 1
    out = []
    for w in range(words_per_passage):
        x = (x * 6364136223846793005 + 1442695040888963407) & MASK
        word = WORDS[(x >> 33) % len(WORDS)]
        out.append(word + ("." if w % 12 == 11 else ""))
    return " ".join(out)


def main():
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    ap = argparse.ArgumentParser()
    ap.add_argument("model_dir", nargs="?", default=os.path.join(root, "models", "all-MiniLM-L6-v2"))
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--dump")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    texts = [passage(i) for i in range(256)]
    model = SentenceTransformer(args.model_dir, device="cpu")
    lens = [len(x) for x in model.tokenizer(texts, truncation=True, max_length=model.max_seq_length)["input_ids"]]
    print(f"256 passages, mean {sum(lens) / len(lens):.1f} tokens; torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads")
    model.encode(texts[:32], batch_size=32)  # warm-up
    times = []
    for _ in range(args.runs):
        t0 = time.perf_counter()
        emb = model.encode(texts, batch_size=32, normalize_embeddings=True, convert_to_numpy=True)
        times.append(time.perf_counter() - t0)
    med = statistics.median(times)
    print(f"sentence-transformers: median {med * 1000:.0f} ms for 256 passages = {256 / med:.1f} passages/s "
          f"(runs: {', '.join(f'{t * 1000:.0f}' for t in times)} ms)")
    if args.dump:
        json.dump({"texts": texts, "embeddings": emb.round(7).tolist()}, open(args.dump, "w"))


if __name__ == "__main__":
    main()
