#!/usr/bin/env python3
"""Check that a dual encoder saved by `infembed train` (Interaction I, shared towers) loads in
sentence-transformers and embeds passages and prompted queries as infembed does.
Developer-run, not CI; a venv with torch and sentence-transformers.

    infembed embed --model RUN/final --input TEXTS.jsonl --output /tmp/p.npy --passages
    infembed embed --model RUN/final --input TEXTS.jsonl --output /tmp/q.npy --queries
    python scripts/encoder/check_trained.py RUN/final TEXTS.jsonl /tmp/p.npy /tmp/q.npy

TEXTS.jsonl holds `id`, `text`, optional `title` and `instruction`, as `infembed embed` reads
it. Python renders each query as infembed does: the template of `infembed_encoder.json` with
the instruction prefix, then sentence-transformers adds the `query` prompt (the saved
`query_prefix`); passages get the `document` prompt (the saved `passage_prefix`), and the
passage maximum length replaces the saved query length. Prints one JSON line with the max abs
differences and exits non-zero above 1e-5.
"""
import json
import sys

import numpy as np
import sentence_transformers
import torch
from sentence_transformers import SentenceTransformer

torch.set_num_threads(2)
model_dir, texts_path, p_npy, q_npy = sys.argv[1:5]
cfg = json.load(open(f"{model_dir}/infembed_encoder.json"))
inter = cfg.get("interaction", {"type": "self_attention"})
if inter.get("type", "self_attention") != "self_attention" or cfg.get("towers", "shared") != "shared":
    sys.exit("only Interaction I with shared towers has a sentence-transformers form (docs/encoder.md)")
template = inter.get("template") or "{query} {instruction}"
template = template.replace("{Q}", "{query}").replace("{I}", "{instruction}")
records = [json.loads(line) for line in open(texts_path) if line.strip()]


def passage_text(r):
    title = (r.get("title") or "").strip()
    return f"{r['title']} {r['text']}" if title else r["text"]


def query_text(r):
    if r.get("instruction") is None:
        return r["text"]  # no instruction: the bare query, as infembed's template rendering
    instruction = cfg.get("instruction_prefix", "") + r["instruction"]
    return template.replace("{query}", r["text"]).replace("{instruction}", instruction)


model = SentenceTransformer(model_dir, device="cpu")
prompts = model.prompts or {}
kw_q = {"prompt_name": "query"} if "query" in prompts else {}
kw_p = {"prompt_name": "document"} if "document" in prompts else {}
q_st = model.encode([query_text(r) for r in records], convert_to_numpy=True, **kw_q)
model.max_seq_length = cfg["passage_max_length"]
p_st = model.encode([passage_text(r) for r in records], convert_to_numpy=True, **kw_p)
p_rs, q_rs = np.load(p_npy), np.load(q_npy)
out = {
    "model": model_dir,
    "sentence_transformers": sentence_transformers.__version__,
    "torch": torch.__version__,
    "texts": len(records),
    "passages_max_abs_diff": float(np.abs(p_st - p_rs).max()),
    "queries_max_abs_diff": float(np.abs(q_st - q_rs).max()),
    "prompts": prompts,
}
print(json.dumps(out))
if max(out["passages_max_abs_diff"], out["queries_max_abs_diff"]) > 1e-5:
    sys.exit("MISMATCH")
