#!/usr/bin/env python3
"""PyTorch baseline of the GPU check: encode a JSONL file of passages with all-MiniLM-L6-v2.

    python3 scripts/gpu/torch_encode.py --model models/all-MiniLM-L6-v2 --input P.jsonl \
        [--device auto|cuda|cpu] [--dtype fp32|fp16] [--batch-size 32] [--runs 3] \
        [--dump E.npy] [--backend auto|st|torch]

Backends:
- `st`: sentence-transformers, `SentenceTransformer(dir, device).encode(texts, batch_size,
  normalize_embeddings=True)` (used by `auto` when it imports). Its encode includes tokenizing.
- `torch`: this file alone, for machines with torch but without transformers,
  sentence-transformers or tokenizers: a pure-Python BERT uncased WordPiece tokenizer read from
  vocab.txt, the BERT forward in plain torch (config.json), mean pooling over real tokens and L2
  normalization, weights read from model.safetensors (with the `safetensors` package when it
  imports, else a small reader of the format).

Input: JSONL with `id`/`_id` and `text` (optional `title`, joined as "{title} {text}" when not
blank, as `infembed embed` does).

Timing: tokenizing all texts is timed once; then one batch is run as warm-up, and `--runs`
passes over all texts are timed (CUDA synchronized) and the median reported. Prints one JSON
line: passages/s end to end (tokenizing + median forward) and forward only.
`--device cuda` (or `auto`) without CUDA falls back to the CPU and says so in the JSON.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import struct
import sys
import time
import unicodedata

import torch
import torch.nn.functional as F

# --------------------------------------------------------------------------------------------
# Tokenizer: BERT basic tokenization + WordPiece (HF BertTokenizer / tokenizers' BertNormalizer
# with clean_text, handle_chinese_chars, lowercase and strip_accents following lowercase)
# --------------------------------------------------------------------------------------------


def _is_whitespace(ch):
    if ch in (" ", "\t", "\n", "\r"):
        return True
    return unicodedata.category(ch) == "Zs"


def _is_control(ch):
    if ch in ("\t", "\n", "\r"):
        return False
    return unicodedata.category(ch).startswith("C")


def _is_punctuation(ch):
    cp = ord(ch)
    if 33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96 or 123 <= cp <= 126:
        return True
    return unicodedata.category(ch).startswith("P")


def _is_chinese(cp):
    return (0x4E00 <= cp <= 0x9FFF or 0x3400 <= cp <= 0x4DBF or 0x20000 <= cp <= 0x2A6DF
            or 0x2A700 <= cp <= 0x2B73F or 0x2B740 <= cp <= 0x2B81F or 0x2B820 <= cp <= 0x2CEAF
            or 0xF900 <= cp <= 0xFAFF or 0x2F800 <= cp <= 0x2FA1F)


class WordPieceTokenizer:
    """BERT uncased tokenizer: [CLS] wordpieces [SEP], truncated to `max_length` tokens."""

    def __init__(self, vocab_path, lowercase=True, max_chars_per_word=100):
        self.vocab = {}
        with open(vocab_path, encoding="utf-8") as f:
            for i, line in enumerate(f):
                token = line.rstrip("\n")
                if token not in self.vocab:
                    self.vocab[token] = i
        self.lowercase = lowercase
        self.max_chars = max_chars_per_word
        self.unk = self.vocab["[UNK]"]
        self.cls = self.vocab["[CLS]"]
        self.sep = self.vocab["[SEP]"]
        self.pad = self.vocab.get("[PAD]", 0)
        self._cache = {}

    def _normalize(self, text):
        out = []
        for ch in text:
            cp = ord(ch)
            if cp == 0 or cp == 0xFFFD or _is_control(ch):
                continue
            if _is_whitespace(ch):
                out.append(" ")
            elif _is_chinese(cp):
                out.append(" " + ch + " ")
            else:
                out.append(ch)
        text = "".join(out)
        if self.lowercase:
            text = text.lower()
            text = "".join(c for c in unicodedata.normalize("NFD", text)
                           if unicodedata.category(c) != "Mn")
        return text

    def _words(self, text):
        words = []
        for chunk in text.split():
            start = 0
            for i, ch in enumerate(chunk):
                if _is_punctuation(ch):
                    if i > start:
                        words.append(chunk[start:i])
                    words.append(ch)
                    start = i + 1
            if start < len(chunk):
                words.append(chunk[start:])
        return words

    def _wordpiece(self, word):
        cached = self._cache.get(word)
        if cached is not None:
            return cached
        if len(word) > self.max_chars:
            ids = [self.unk]
        else:
            ids = []
            start = 0
            while start < len(word):
                end = len(word)
                found = None
                while start < end:
                    piece = word[start:end] if start == 0 else "##" + word[start:end]
                    found = self.vocab.get(piece)
                    if found is not None:
                        break
                    end -= 1
                if found is None:
                    ids = [self.unk]
                    break
                ids.append(found)
                start = end
        if len(self._cache) < 500_000:
            self._cache[word] = ids
        return ids

    def encode(self, text, max_length):
        ids = []
        budget = max_length - 2
        for word in self._words(self._normalize(text)):
            ids.extend(self._wordpiece(word))
            if len(ids) >= budget:
                break
        truncated = len(ids) > budget
        return [self.cls] + ids[:budget] + [self.sep], truncated


# --------------------------------------------------------------------------------------------
# Weights
# --------------------------------------------------------------------------------------------

_DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
           "I64": torch.int64, "I32": torch.int32, "F64": torch.float64}


def load_safetensors(path):
    try:
        from safetensors.torch import load_file
        return load_file(path), "safetensors"
    except ImportError:
        pass
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n).decode("utf-8"))
        data = bytearray(f.read())
    if sys.byteorder != "little":
        raise SystemExit("the built-in safetensors reader needs a little-endian machine")
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        a, b = info["data_offsets"]
        dtype = _DTYPES[info["dtype"]]
        t = torch.frombuffer(data, dtype=dtype, count=(b - a) // torch.tensor(
            [], dtype=dtype).element_size(), offset=a) if b > a else torch.empty(0, dtype=dtype)
        tensors[name] = t.reshape(info["shape"]).clone()
    return tensors, "built-in"


# --------------------------------------------------------------------------------------------
# BERT
# --------------------------------------------------------------------------------------------


class Bert(torch.nn.Module):
    """BertModel's encoder (absolute positions, post-LN, erf GELU), no pooler."""

    def __init__(self, config, weights):
        super().__init__()
        self.h = config["hidden_size"]
        self.heads = config["num_attention_heads"]
        self.layers = config["num_hidden_layers"]
        self.eps = config.get("layer_norm_eps", 1e-12)
        act = config.get("hidden_act", "gelu")
        if act not in ("gelu", "gelu_python"):
            raise SystemExit(f"hidden_act {act!r} is not supported (gelu only)")
        if config.get("position_embedding_type", "absolute") != "absolute":
            raise SystemExit("only absolute position embeddings are supported")
        prefix = "bert." if "bert.embeddings.word_embeddings.weight" in weights else ""
        self.params = torch.nn.ParameterDict()
        for name, t in weights.items():
            if not name.startswith(prefix) or "position_ids" in name or ".pooler." in name \
                    or name.startswith(prefix + "pooler."):
                continue
            key = name[len(prefix):].replace(".", "__")
            self.params[key] = torch.nn.Parameter(t.float(), requires_grad=False)

    def p(self, name):
        return self.params[name.replace(".", "__")]

    def _ln(self, x, name):
        return F.layer_norm(x, (self.h,), self.p(name + ".weight"), self.p(name + ".bias"),
                            self.eps)

    def _lin(self, x, name):
        return F.linear(x, self.p(name + ".weight"), self.p(name + ".bias"))

    def forward(self, ids, mask):
        b, n = ids.shape
        pos = torch.arange(n, device=ids.device)
        x = (F.embedding(ids, self.p("embeddings.word_embeddings.weight"))
             + self.p("embeddings.position_embeddings.weight")[pos][None]
             + self.p("embeddings.token_type_embeddings.weight")[0][None, None])
        x = self._ln(x, "embeddings.LayerNorm")
        dh = self.h // self.heads
        keep = mask[:, None, None, :].bool()  # (b, 1, 1, n): True where a real token
        sdpa = getattr(F, "scaled_dot_product_attention", None)
        for i in range(self.layers):
            pre = f"encoder.layer.{i}."

            def split(t):
                return t.view(b, n, self.heads, dh).transpose(1, 2)

            q = split(self._lin(x, pre + "attention.self.query"))
            k = split(self._lin(x, pre + "attention.self.key"))
            v = split(self._lin(x, pre + "attention.self.value"))
            if sdpa is not None:
                a = sdpa(q, k, v, attn_mask=keep)
            else:
                s = (q @ k.transpose(-1, -2)) / (dh ** 0.5)
                s = s.masked_fill(~keep, torch.finfo(s.dtype).min)
                a = torch.softmax(s, dim=-1) @ v
            a = a.transpose(1, 2).reshape(b, n, self.h)
            x = self._ln(x + self._lin(a, pre + "attention.output.dense"),
                         pre + "attention.output.LayerNorm")
            f = F.gelu(self._lin(x, pre + "intermediate.dense"))
            x = self._ln(x + self._lin(f, pre + "output.dense"), pre + "output.LayerNorm")
        return x


def mean_pool_normalize(hidden, mask):
    m = mask.to(torch.float32).unsqueeze(-1)
    summed = (hidden.float() * m).sum(dim=1)
    pooled = summed / m.sum(dim=1).clamp(min=1e-9)
    return F.normalize(pooled, p=2, dim=1)


# --------------------------------------------------------------------------------------------
# Main
# --------------------------------------------------------------------------------------------


def read_texts(path, limit=None):
    texts = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            obj = json.loads(line)
            text = obj.get("text")
            if text is None:
                text = obj.get("passage", "")
            title = obj.get("title") or ""
            texts.append(f"{title} {text}" if title.strip() else text)
            if limit is not None and len(texts) >= limit:
                break
    return texts


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def save_npy(path, emb):
    emb = emb.detach().to("cpu", torch.float32).contiguous()
    try:
        import numpy as np
        np.save(path, emb.numpy())
        return
    except ImportError:
        pass
    rows, cols = emb.shape
    header = "{'descr': '<f4', 'fortran_order': False, 'shape': (%d, %d), }" % (rows, cols)
    header += " " * (64 - (10 + len(header) + 1) % 64) + "\n"
    flat = emb.reshape(-1).tolist()
    with open(path, "wb") as f:
        f.write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header.encode("latin1"))
        f.write(struct.pack("<%df" % len(flat), *flat))


def pick_device(requested):
    cuda = torch.cuda.is_available()
    if requested == "cpu":
        return torch.device("cpu"), None
    if cuda:
        return torch.device("cuda"), None
    why = "torch.cuda.is_available() is False"
    if requested == "cuda":
        print(f"torch_encode: CUDA requested but {why}: falling back to the CPU",
              file=sys.stderr)
    return torch.device("cpu"), why


def run_st(args, texts, device, dtype):
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(args.model, device=str(device))
    if args.max_length:
        model.max_seq_length = args.max_length
    if dtype == torch.float16:
        model.half()
    tokenize = getattr(model, "preprocess", None) or model.tokenize  # v6 renamed it
    t0 = time.perf_counter()
    features = tokenize(texts)
    tok_s = time.perf_counter() - t0
    ntok = int(features["attention_mask"].sum()) if "attention_mask" in features else None
    model.encode(texts[: args.batch_size], batch_size=args.batch_size,
                 normalize_embeddings=True)  # warm-up
    times, emb = [], None
    for _ in range(args.runs):
        sync(device)
        t0 = time.perf_counter()
        emb = model.encode(texts, batch_size=args.batch_size, normalize_embeddings=True,
                           convert_to_tensor=True)
        sync(device)
        times.append(time.perf_counter() - t0)
    med = statistics.median(times)
    # Forward passes alone: the batches `encode` forms (texts sorted by length, longest
    # first), tokenized and moved to the device beforehand, then the model's forward pass and
    # the normalization timed, median of the runs. (Subtracting one tokenizing pass over all
    # texts from `encode`'s time is no estimate of this: padded to the longest text, that pass
    # can take as long as `encode` itself.)
    order = sorted(range(len(texts)), key=lambda i: -len(texts[i]))
    batches = []
    for start in range(0, len(order), args.batch_size):
        chunk = [texts[i] for i in order[start:start + args.batch_size]]
        feats = tokenize(chunk)
        batches.append({k: v.to(device) if hasattr(v, "to") else v for k, v in feats.items()})
    fwd_times = []
    with torch.inference_mode():
        for _ in range(args.runs + 1):  # the first pass is a warm-up
            sync(device)
            t0 = time.perf_counter()
            for feats in batches:
                out = model(dict(feats))["sentence_embedding"]
                torch.nn.functional.normalize(out, p=2, dim=1)
            sync(device)
            fwd_times.append(time.perf_counter() - t0)
    fwd = statistics.median(fwd_times[1:])
    return emb, {"backend": "sentence-transformers", "tokenize_seconds": tok_s,
                 "encode_seconds_median": med, "encode_seconds_all": times,
                 "forward_seconds_median": fwd, "forward_seconds_all": fwd_times[1:],
                 "max_length": model.max_seq_length, "tokens": ntok,
                 # encode includes tokenizing: end-to-end is encode alone
                 "passages_per_s": len(texts) / med,
                 "passages_per_s_forward_only": len(texts) / fwd}


def run_torch(args, texts, device, dtype):
    d = args.model
    with open(os.path.join(d, "config.json")) as f:
        config = json.load(f)
    max_length = args.max_length
    st_cfg = os.path.join(d, "sentence_bert_config.json")
    if max_length is None and os.path.exists(st_cfg):
        with open(st_cfg) as f:
            max_length = json.load(f).get("max_seq_length")
    max_length = min(max_length or 512, config.get("max_position_embeddings", 512))
    lowercase = True
    tok_cfg = os.path.join(d, "tokenizer_config.json")
    if os.path.exists(tok_cfg):
        with open(tok_cfg) as f:
            lowercase = json.load(f).get("do_lower_case", True)
    tokenizer = WordPieceTokenizer(os.path.join(d, "vocab.txt"), lowercase=lowercase)

    weights, reader = load_safetensors(os.path.join(d, "model.safetensors"))
    model = Bert(config, weights).to(device)
    if dtype == torch.float16:
        model.half()
    model.eval()

    t0 = time.perf_counter()
    encoded = [tokenizer.encode(t, max_length) for t in texts]
    tok_s = time.perf_counter() - t0
    seqs = [e[0] for e in encoded]
    truncated = sum(1 for e in encoded if e[1])

    # Batches of similar length (sentence-transformers sorts by length too).
    order = sorted(range(len(seqs)), key=lambda i: -len(seqs[i]))
    batches = []
    for s in range(0, len(order), args.batch_size):
        idx = order[s: s + args.batch_size]
        n = max(len(seqs[i]) for i in idx)
        ids = torch.full((len(idx), n), tokenizer.pad, dtype=torch.long)
        mask = torch.zeros((len(idx), n), dtype=torch.long)
        for r, i in enumerate(idx):
            ids[r, : len(seqs[i])] = torch.tensor(seqs[i])
            mask[r, : len(seqs[i])] = 1
        batches.append((idx, ids, mask))

    def forward_all():
        out = torch.empty((len(seqs), config["hidden_size"]), dtype=torch.float32,
                          device=device)
        for idx, ids, mask in batches:
            ids_d, mask_d = ids.to(device, non_blocking=True), mask.to(device,
                                                                       non_blocking=True)
            emb = mean_pool_normalize(model(ids_d, mask_d), mask_d)
            out[torch.tensor(idx, device=device)] = emb
        return out

    with torch.inference_mode():
        _, ids, mask = batches[0]  # warm-up: the first (longest) batch
        model(ids.to(device), mask.to(device))
        sync(device)
        times, emb = [], None
        for _ in range(args.runs):
            sync(device)
            t0 = time.perf_counter()
            emb = forward_all()
            sync(device)
            times.append(time.perf_counter() - t0)
    med = statistics.median(times)
    return emb, {"backend": "pure-torch", "weights_reader": reader,
                 "tokenize_seconds": tok_s, "forward_seconds_median": med,
                 "forward_seconds_all": times, "max_length": max_length,
                 "tokens": sum(len(s) for s in seqs), "truncated": truncated,
                 "passages_per_s": len(texts) / (tok_s + med),
                 "passages_per_s_forward_only": len(texts) / med}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="models/all-MiniLM-L6-v2")
    ap.add_argument("--input", required=True)
    ap.add_argument("--device", choices=["auto", "cuda", "cpu"], default="auto")
    ap.add_argument("--dtype", choices=["fp32", "fp16"], default="fp32")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--dump", help="save the embeddings (.npy, input order)")
    ap.add_argument("--backend", choices=["auto", "st", "torch"], default="auto")
    ap.add_argument("--max-length", type=int, help="override max_seq_length")
    ap.add_argument("--limit", type=int, help="only the first N texts")
    ap.add_argument("--threads", type=int, help="torch.set_num_threads on the CPU")
    args = ap.parse_args()
    if args.runs < 1 or args.batch_size < 1:
        raise SystemExit("--runs and --batch-size must be at least 1")
    if args.threads:
        torch.set_num_threads(args.threads)

    device, fallback = pick_device(args.device)
    dtype = torch.float16 if args.dtype == "fp16" else torch.float32
    texts = read_texts(args.input, args.limit)
    if not texts:
        raise SystemExit(f"{args.input}: no text")

    backend = args.backend
    st_problem = None
    if backend in ("auto", "st"):
        try:
            import sentence_transformers  # noqa: F401
            backend = "st"
        except ImportError as e:
            st_problem = str(e)
            if backend == "st":
                raise SystemExit(f"sentence-transformers does not import: {e}")
            backend = "torch"
    st_error = None
    if backend == "st":
        try:
            emb, result = run_st(args, texts, device, dtype)
        except Exception as e:  # noqa: BLE001 - auto falls back to the pure-torch model
            if args.backend == "st":
                raise
            st_error = f"{type(e).__name__}: {e}"
            print(f"torch_encode: sentence-transformers failed ({st_error}); using the "
                  "pure-torch model", file=sys.stderr)
            backend = "torch"
    if backend == "torch":
        emb, result = run_torch(args, texts, device, dtype)
    if args.dump:
        save_npy(args.dump, emb)
    info = {
        "passages": len(texts), "device": device.type, "device_requested": args.device,
        "device_fallback": fallback, "dtype": args.dtype, "batch_size": args.batch_size,
        "runs": args.runs, "torch": torch.__version__,
        "threads": torch.get_num_threads() if device.type == "cpu" else None,
        "gpu_name": torch.cuda.get_device_name(0) if device.type == "cuda" else None,
        "sentence_transformers_missing": st_problem, "sentence_transformers_error": st_error,
        "dump": args.dump,
    }
    info.update(result)
    print(json.dumps(info))


if __name__ == "__main__":
    main()
