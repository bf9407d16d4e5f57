#!/usr/bin/env python3
"""int8 against the CPU runtimes people deploy (issue 16; docs/benchmarks.md, docs/int8.md).

Embeds the same passages (a JSONL corpus, "{title} {text}" as `infembed embed` reads it) with
all-MiniLM-L6-v2, batch 32, the model's max_seq_length, N threads, one implementation after
the other in this order:

1. sentence-transformers, fp32 (PyTorch);
2. ONNX Runtime, fp32: a `torch.onnx` export of the same transformer, all graph optimizations;
3. ONNX Runtime, int8: `onnxruntime.quantization.quantize_dynamic` of that export (its
   defaults: signed int8 weights per tensor, u8 activations; `--ort-per-channel` for per
   channel);
4. `infembed embed` fp32, `--quantize int8` and, where the processor has AVX512-BF16,
   `--quantize bf16` (a subprocess: model load included).

ONNX Runtime gets the texts sorted by length and padded per batch, as sentence-transformers and
infembed batch them; its mean pooling and normalization run in numpy (outside the timing of
nothing: they are timed too). Every timing is the best of `--runs`. Then the quality: the
cosine of each int8 embedding to the fp32 embedding of the same implementation (min, 1st
percentile, median), and the largest difference between implementations' fp32 embeddings.

    /work/venvs/st/bin/python scripts/bench/int8_compare.py \\
        --infembed target/release/infembed --input data/msmarco-subset/corpus.jsonl

Needs: torch, sentence-transformers, transformers, onnx, onnxruntime (a venv; PyPI).
"""

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time

import numpy as np


def cpu_info():
    """The processor's model name and its flags, from /proc/cpuinfo (empty where unreadable)."""
    model, flags = "?", set()
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name") and model == "?":
                model = line.split(":", 1)[1].strip()
            if line.startswith("flags") and not flags:
                flags = set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return model, flags


def cpu_line():
    model, have = cpu_info()
    flags = [f for f in ("avx2", "fma", "avx512f", "avx512bw", "avx512_vnni",
                         "avx_vnni", "avx512_bf16", "amx_int8") if f in have]
    return f"{model} ({os.cpu_count()} CPUs; {' '.join(flags)})"


def has_bf16():
    """Whether the processor has AVX512-BF16 (and the AVX-512 it builds on)."""
    return {"avx512f", "avx512bw", "avx512vl", "avx512_bf16"} <= cpu_info()[1]


def read_texts(path):
    texts = []
    for line in open(path):
        if line.strip():
            o = json.loads(line)
            title = (o.get("title") or "").strip()
            texts.append(f"{o['title']} {o['text']}" if title else o["text"])
    return texts


def cosines(a, b):
    a = a / np.linalg.norm(a, axis=1, keepdims=True)
    b = b / np.linalg.norm(b, axis=1, keepdims=True)
    return (a * b).sum(1)


def best(runs, f):
    times, out = [], None
    for _ in range(runs):
        t0 = time.perf_counter()
        out = f()
        times.append(time.perf_counter() - t0)
    return min(times), out


def main():
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=os.path.join(root, "models", "all-MiniLM-L6-v2"))
    ap.add_argument("--input", default=os.path.join(root, "data", "msmarco-subset", "corpus.jsonl"))
    ap.add_argument("--infembed", default=os.path.join(root, "target", "release", "infembed"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--ort-per-channel", action="store_true")
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args()

    import torch
    import onnxruntime as ort
    from onnxruntime.quantization import QuantType, quantize_dynamic
    from sentence_transformers import SentenceTransformer
    from transformers import AutoModel, AutoTokenizer

    torch.set_num_threads(args.threads)
    texts = read_texts(args.input)
    print(f"CPU: {cpu_line()}")
    print(f"{len(texts)} passages from {args.input}; batch {args.batch}, {args.threads} threads; "
          f"torch {torch.__version__}, onnxruntime {ort.__version__}, python {platform.python_version()}")
    results = {}
    embeddings = {}

    # 1. sentence-transformers
    st = SentenceTransformer(args.model, device="cpu")
    max_len = st.max_seq_length
    st.encode(texts[:args.batch], batch_size=args.batch)
    secs, emb = best(args.runs, lambda: st.encode(texts, batch_size=args.batch,
                                                  convert_to_numpy=True))
    results["sentence-transformers fp32"] = secs
    embeddings["st"] = emb
    del st

    # 2-3. ONNX Runtime
    tok = AutoTokenizer.from_pretrained(args.model)
    work = tempfile.mkdtemp(prefix="int8_compare_")
    fp32_path = os.path.join(work, "model.onnx")
    int8_path = os.path.join(work, "model.int8.onnx")
    hf = AutoModel.from_pretrained(args.model).eval()

    class Transformer(torch.nn.Module):
        # keyword arguments: transformers 5 reordered BertModel.forward's positional ones
        def __init__(self, model):
            super().__init__()
            self.model = model

        def forward(self, input_ids, attention_mask, token_type_ids):
            return self.model(input_ids=input_ids, attention_mask=attention_mask,
                              token_type_ids=token_type_ids).last_hidden_state

    sample = tok(["a sample passage", "another"], padding=True, return_tensors="pt")
    with torch.no_grad():
        torch.onnx.export(
            Transformer(hf), (sample["input_ids"], sample["attention_mask"], sample["token_type_ids"]),
            fp32_path, input_names=["input_ids", "attention_mask", "token_type_ids"],
            output_names=["last_hidden_state"], opset_version=17, dynamo=False,
            dynamic_axes={n: {0: "batch", 1: "seq"} for n in
                          ("input_ids", "attention_mask", "token_type_ids", "last_hidden_state")})
    quantize_dynamic(fp32_path, int8_path, weight_type=QuantType.QInt8,
                     per_channel=args.ort_per_channel)
    order = sorted(range(len(texts)), key=lambda i: -len(texts[i]))
    batches = []
    for start in range(0, len(order), args.batch):
        idx = order[start:start + args.batch]
        enc = tok([texts[i] for i in idx], padding=True, truncation=True, max_length=max_len,
                  return_tensors="np")
        batches.append((idx, {k: enc[k].astype(np.int64) for k in
                              ("input_ids", "attention_mask", "token_type_ids")}))

    def ort_encode(session):
        out = np.zeros((len(texts), hf.config.hidden_size), dtype=np.float32)
        for idx, feed in batches:
            h = session.run(None, feed)[0]
            m = feed["attention_mask"][..., None].astype(np.float32)
            pooled = (h * m).sum(1) / np.clip(m.sum(1), 1e-9, None)
            out[idx] = pooled / np.linalg.norm(pooled, axis=1, keepdims=True)
        return out

    for name, path in (("fp32", fp32_path), ("int8", int8_path)):
        so = ort.SessionOptions()
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        so.intra_op_num_threads = args.threads
        so.inter_op_num_threads = 1
        session = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
        session.run(None, batches[-1][1])
        secs, emb = best(args.runs, lambda: ort_encode(session))
        results[f"ONNX Runtime {name}"] = secs
        embeddings[f"ort-{name}"] = emb

    # 4. infembed (bf16 only where the processor has AVX512-BF16; infembed refuses it elsewhere)
    variants = [("fp32", "none"), ("int8", "int8")]
    if has_bf16():
        variants.append(("bf16", "bf16"))
    else:
        print("no AVX512-BF16 on this processor: infembed bf16 not run")
    for name, flag in variants:
        out = os.path.join(work, f"infembed-{name}.npy")
        cmd = [args.infembed, "embed", "--model", args.model, "--input", args.input,
               "--output", out, "--quiet", "--restart", "--quantize", flag]
        env = dict(os.environ, RAYON_NUM_THREADS=str(args.threads))
        secs, _ = best(args.runs, lambda: subprocess.run(cmd, check=True, env=env,
                                                          capture_output=True))
        results[f"infembed {name} (model load included)"] = secs
        embeddings[f"infembed-{name}"] = np.load(out)

    print()
    print("| implementation | time (s) | passages/s |")
    print("|---|---:|---:|")
    for name, secs in results.items():
        print(f"| {name} | {secs:.2f} | {len(texts) / secs:.1f} |")
    ort8 = results["ONNX Runtime int8"]
    ours8 = results["infembed int8 (model load included)"]
    ours32 = results["infembed fp32 (model load included)"]
    print()
    print(f"infembed int8 vs ONNX Runtime int8: {ort8 / ours8:.2f}x; "
          f"infembed fp32 vs sentence-transformers: {results['sentence-transformers fp32'] / ours32:.2f}x")
    quality = {}
    print()
    print("| int8 vs fp32 of the same implementation | cosine min | 1st percentile | median |")
    print("|---|---:|---:|---:|")
    pairs = {"infembed": ("infembed-fp32", "infembed-int8"),
             "ONNX Runtime": ("ort-fp32", "ort-int8")}
    if "infembed-bf16" in embeddings:
        pairs["infembed bf16 (vs its fp32)"] = ("infembed-fp32", "infembed-bf16")
    for name, (a, b) in pairs.items():
        c = cosines(embeddings[a], embeddings[b])
        quality[name] = [float(c.min()), float(np.percentile(c, 1)), float(np.median(c))]
        print(f"| {name} | {c.min():.5f} | {np.percentile(c, 1):.5f} | {np.median(c):.5f} |")
    fp32_diff = float(np.abs(embeddings["st"] - embeddings["infembed-fp32"]).max())
    print(f"\nfp32 agreement: max |sentence-transformers - infembed| = {fp32_diff:.2e}, "
          f"max |sentence-transformers - ONNX Runtime| = "
          f"{float(np.abs(embeddings['st'] - embeddings['ort-fp32']).max()):.2e}")
    if args.json:
        json.dump({"cpu": cpu_line(), "passages": len(texts), "seconds": results,
                   "cosine_int8_vs_fp32": quality, "fp32_max_abs_diff_st": fp32_diff},
                  open(args.json, "w"), indent=1)


if __name__ == "__main__":
    sys.exit(main())
