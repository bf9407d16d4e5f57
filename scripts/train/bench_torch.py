#!/usr/bin/env python3
"""PyTorch baseline for the training-step benchmark (developer-run, not CI).

The same step as `crates/infembed-train/examples/train_step_bench.rs`: all-MiniLM-L6-v2 via
transformers (mean pooling, L2 normalization), the first 4 records of the InF-IR sample
(12 rows), Interaction I ("{query} {instruction}") with K = 5 instruction negatives per row
(rows i+1..i+5 mod 12), the multivariate (P, I) loss written in torch (paper convention:
each marginal sum includes the positive; temperature 0.05; duplicates masked), global-norm
clipping 1.0 and AdamW(5e-5), on CPU torch with 2 threads (`--threads`), max lengths 128 / 256.
`--device cuda` runs the step on a GPU (timed with `torch.cuda.synchronize()`), the comparison
for `infembed train --device wgpu` on a GPU machine (scripts/gpu/README.md). `--bf16` runs the
forward pass under `torch.autocast(dtype=torch.bfloat16)` (PyTorch's mixed precision: bf16
matrix products, f32 weights), the peer of `dtype = "bf16"` / `train_step_bench --bf16`.

    /work/venvs/hf/bin/python scripts/train/bench_torch.py [MODEL_DIR] [--steps N]
        [--device cpu|cuda] [--threads N] [--bf16]

Prints seconds per step (mean after one warm-up step), rows/s and peak RSS.
"""
import argparse
import json
import resource
import time

import torch
import torch.nn.functional as F
from transformers import AutoModel, AutoTokenizer


def rows_of(record):
    i_pos, i_neg = record["instruction_positive"], record["instruction_negative"]
    q_pos, q_neg = record["query_positive"], record["query_negative"]
    p = record.get("document_positive") or record["document"]
    return [
        (i_pos, q_pos, p),
        (i_neg, q_pos, record["hard_negative_document_1"]),
        (i_pos, q_neg, record["hard_negative_document_2"]),
    ]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model", nargs="?", default="models/all-MiniLM-L6-v2")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--bf16", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    dev = torch.device(args.device)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    torch.manual_seed(0)
    with open("data/inf-ir-sample/train.jsonl") as f:
        records = [json.loads(line) for line in f][:4]
    rows = [r for rec in records for r in rows_of(rec)]
    n, k = len(rows), 5
    negs = [[(i + j) % n for j in range(1, k + 1)] for i in range(n)]
    render = lambda ins, q: f"{q} {ins}"
    passages = sorted({r[2] for r in rows})
    queries = sorted({render(rows[i][0], rows[i][1]) for i in range(n)}
                     | {render(rows[j][0], rows[i][1]) for i in range(n) for j in negs[i]})
    p_idx = torch.tensor([passages.index(r[2]) for r in rows])
    iq_idx = torch.tensor([queries.index(render(r[0], r[1])) for r in rows])
    instr_idx = torch.tensor([[queries.index(render(rows[j][0], rows[i][1])) for j in negs[i]]
                              for i in range(n)])
    same_p = torch.tensor([[rows[a][2] == rows[b][2] for b in range(n)] for a in range(n)])
    same_i = torch.tensor([[rows[negs[i][c]][0] == rows[i][0] for c in range(k)] for i in range(n)])

    tok = AutoTokenizer.from_pretrained(args.model)
    model = AutoModel.from_pretrained(args.model, dtype=torch.float32).to(dev)
    model.train()
    p_idx, iq_idx, instr_idx = p_idx.to(dev), iq_idx.to(dev), instr_idx.to(dev)
    same_p, same_i = same_p.to(dev), same_i.to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=5e-5)

    def embed(texts, max_len):
        b = tok(texts, padding=True, truncation=True, max_length=max_len,
                return_tensors="pt").to(dev)
        h = model(**b).last_hidden_state
        m = b["attention_mask"].unsqueeze(-1).float()
        return F.normalize((h * m).sum(1) / m.sum(1).clamp(min=1e-9), dim=-1)

    scale = 1 / 0.05
    times = []
    for step in range(args.steps + 1):
        sync()
        t = time.perf_counter()
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=args.bf16):
            ep = embed(passages, 256).float()
            eq = embed(queries, 128).float()
        p, iq, iq_instr = ep[p_idx], eq[iq_idx], eq[instr_idx]
        pos = (iq * p).sum(-1) * scale                       # [n]
        lp = (iq @ p.T) * scale                              # P-marginal: [n, n]
        lp = lp.masked_fill(same_p & ~torch.eye(n, dtype=torch.bool, device=dev),
                            float("-inf"))
        li = torch.einsum("nkd,nd->nk", iq_instr, p) * scale  # I-marginal: [n, k]
        li = li.masked_fill(same_i, float("-inf"))
        # Multivariate, positive per marginal: the P row holds the positive on its diagonal;
        # the I marginal adds it once more.
        denom = torch.logsumexp(torch.cat([lp, li, pos.unsqueeze(1)], 1), dim=1)
        loss = (denom - pos).mean()
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sync()
        secs = time.perf_counter() - t
        print(f"step {step}: loss {loss.item():.4f}, {secs:.2f} s", flush=True)
        if step > 0:
            times.append(secs)
    mean = sum(times) / len(times)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    where = torch.cuda.get_device_name(dev) if dev.type == "cuda" else f"CPU, {args.threads} threads"
    kind = "autocast bf16" if args.bf16 else "f32"
    print(f"PyTorch {torch.__version__} on {where}, {kind}: step (MiniLM-L6, 12 rows, {len(passages) + len(queries)} "
          f"distinct texts): {mean:.4f} s/step, {n / mean:.1f} rows/s, peak RSS {peak:.0f} MiB")


if __name__ == "__main__":
    main()
