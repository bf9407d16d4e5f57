#!/usr/bin/env python3
"""Helpers of the GPU check (`scripts/gpu/pack.sh` here, `scripts/gpu/run_on_gpu.sh` there).

Subcommands (each prints JSON on stdout where it has a result):

    narrow SRC DST            f32 safetensors -> f16 (pack.sh; the bundle is capped at 64 MiB)
    widen MODEL_DIR           f16 safetensors -> f32 in place, removes the f16 marker
    passages --source F --n N --out F
                              the first N distinct passages of an InF-IR distractors file (or
                              any JSONL with id/_id/passage_id and text/passage) as the
                              {"id", "text"} JSONL that `infembed embed --input` reads; cycles
                              with suffixed ids when N exceeds what the file has
    compare A.npy B.npy       max abs difference of two embedding matrices (exit 1 over
                              --threshold); checks FILE.ids.txt orders when both exist
    embed-log FILE            parses `infembed embed`'s "embedded N passages ... in X s"
    best-routine FILE...      the fastest routine of the routine sweep's embed-log records
                              whose embeddings agreed with the CPU's (--limit) and none of
                              whose products fell back to burn's matmul; exit 1 if none
    kernel-profile LOG        sums cubecl's profiling log (CUBECL_DEBUG_OPTION=profile) per
                              kernel: launches, device time, share, the matmul kinds used;
                              from a `profile-full` log also the blocked kernel's launches by
                              tile, operand layouts and blocks
    train-log FILE            parses `infembed train`'s "done: N optimizer steps, R rows/s" and
                              its step lines (the rate after --warmup-steps with --rows-per-step)
    torch-train-log FILE      parses scripts/train/bench_torch.py's summary line
    history FILE              dev metrics at the first and last evaluation of history.json
    patch-config SRC --out DST --output-dir DIR [--max-steps N] [--no-dev]
                              a copy of a training TOML with output_dir (and max_steps) set,
                              with --no-dev without its dev file (no evaluation)
    stage --name NAME --rc RC --out FILE ...
                              one stage's record (run_on_gpu.sh writes one per stage)
    report --stages DIR --out FILE ...
                              the results JSON from the stage records; exit 1 if one failed
    bundle-manifest DIR       sizes and sha256 of a bundle's files (pack.sh)

Needs Python 3.7+; numpy when present (`narrow` requires it), else pure-Python fallbacks;
the `safetensors` package when present, else a small reader/writer of the format
(8-byte little-endian header length, JSON header, raw little-endian tensor data).
"""
from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import math
import os
import re
import shutil
import struct
import sys

try:  # optional everywhere except `narrow`
    import numpy as np
except ImportError:  # pragma: no cover - depends on the machine
    np = None

F16_MARKER = "WEIGHTS_ARE_F16.txt"

# --------------------------------------------------------------------------------------------
# safetensors, with or without the package
# --------------------------------------------------------------------------------------------

def read_header(path):
    """(header dict, data offset) of a safetensors file."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n).decode("utf-8"))
    return header, 8 + n


def write_safetensors_raw(path, tensors, metadata=None):
    """Writes {name: (dtype, shape, bytes)} as safetensors (names sorted, 8-byte aligned
    header, as the reference implementation does)."""
    header = {}
    if metadata:
        header["__metadata__"] = metadata
    offset = 0
    order = sorted(tensors)
    for name in order:
        dtype, shape, data = tensors[name]
        header[name] = {"dtype": dtype, "shape": list(shape),
                        "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
    blob = json.dumps(header, separators=(",", ":")).encode("utf-8")
    blob += b" " * ((8 - len(blob) % 8) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(blob)))
        f.write(blob)
        for name in order:
            f.write(tensors[name][2])
    os.replace(tmp, path)


def read_safetensors_raw(path):
    """{name: (dtype, shape, bytes)} and the metadata of a safetensors file."""
    header, start = read_header(path)
    metadata = header.pop("__metadata__", None)
    out = {}
    with open(path, "rb") as f:
        for name, info in header.items():
            a, b = info["data_offsets"]
            f.seek(start + a)
            out[name] = (info["dtype"], tuple(info["shape"]), f.read(b - a))
    return out, metadata


def _convert_floats(src, dst, from_dtype, to_dtype, marker_text=None):
    """Converts every `from_dtype` tensor of `src` to `to_dtype` (other tensors unchanged),
    writes `dst`. Returns a summary dict."""
    tensors, metadata = read_safetensors_raw(src)
    converted = 0
    worst = 0.0
    for name, (dtype, shape, data) in list(tensors.items()):
        if dtype != from_dtype:
            continue
        if np is not None:
            arr = np.frombuffer(data, dtype="<f4" if from_dtype == "F32" else "<f2")
            new = arr.astype("<f2" if to_dtype == "F16" else "<f4")
            if to_dtype == "F16":
                if not np.all(np.isfinite(new)):
                    raise SystemExit(f"{name}: values outside the float16 range")
                worst = max(worst, float(np.max(np.abs(new.astype("<f4") - arr), initial=0.0)))
            out = new.tobytes()
        elif from_dtype == "F16" and to_dtype == "F32":
            out = _f16_to_f32_bytes(data)
        else:
            raise SystemExit("numpy is needed to narrow weights to float16")
        tensors[name] = (to_dtype, shape, out)
        converted += 1
    write_safetensors_raw(dst, tensors, metadata)
    return {"tensors": len(tensors), "converted": converted, "from": from_dtype,
            "to": to_dtype, "bytes": os.path.getsize(dst),
            "max_abs_rounding_error": worst if to_dtype == "F16" else None}


def _f16_to_f32_bytes(data):
    """float16 -> float32 bytes without numpy (struct's "e" format; exact), in chunks."""
    out = bytearray()
    step = 1 << 20
    for i in range(0, len(data) // 2, step):
        chunk = data[2 * i: 2 * min(i + step, len(data) // 2)]
        n = len(chunk) // 2
        out += struct.pack("<%df" % n, *struct.unpack("<%de" % n, chunk))
    return bytes(out)


def cmd_narrow(args):
    if np is None:
        raise SystemExit("narrow needs numpy (pip install numpy safetensors)")
    try:
        from safetensors import safe_open
        from safetensors.numpy import save_file
    except ImportError:
        safe_open = None
    if safe_open is not None:
        tensors = {}
        with safe_open(args.src, framework="np") as f:
            metadata = f.metadata()
            for name in f.keys():
                tensors[name] = f.get_tensor(name)
        worst = 0.0
        converted = 0
        for name, arr in tensors.items():
            if arr.dtype == np.float32:
                new = arr.astype(np.float16)
                if not np.all(np.isfinite(new)):
                    raise SystemExit(f"{name}: values outside the float16 range")
                worst = max(worst, float(np.max(np.abs(new.astype(np.float32) - arr),
                                                initial=0.0)))
                tensors[name] = new
                converted += 1
        save_file(tensors, args.dst, metadata=metadata)
        os.chmod(args.dst, 0o644)
        summary = {"tensors": len(tensors), "converted": converted, "from": "F32",
                   "to": "F16", "bytes": os.path.getsize(args.dst),
                   "max_abs_rounding_error": worst, "writer": "safetensors"}
    else:
        summary = _convert_floats(args.src, args.dst, "F32", "F16")
        summary["writer"] = "built-in"
    marker = os.path.join(os.path.dirname(os.path.abspath(args.dst)), F16_MARKER)
    with open(marker, "w") as f:
        f.write(
            "model.safetensors in this folder holds float16 weights (narrowed from float32 by\n"
            "scripts/gpu/gpu_check.py narrow so that the GPU bundle fits in 64 MiB).\n"
            "infembed reads float32: widen them back before use with\n"
            "    python3 scripts/gpu/gpu_check.py widen <this folder>\n"
            "(run_on_gpu.sh does it). Widening is exact, but the values are the float16\n"
            "roundings of the original weights (largest rounding error: %.3g).\n"
            % summary["max_abs_rounding_error"])
    print(json.dumps(summary))


def cmd_widen(args):
    path = os.path.join(args.model_dir, "model.safetensors")
    packed = path + ".xz"  # pack.sh compresses the float16 file when xz is there
    unpacked = False
    if not os.path.exists(path) and os.path.exists(packed):
        import lzma
        tmp = path + ".tmp"
        with lzma.open(packed) as src, open(tmp, "wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
        os.replace(tmp, path)
        os.remove(packed)
        unpacked = True
    header, _ = read_header(path)
    halves = [k for k, v in header.items() if k != "__metadata__" and v["dtype"] == "F16"]
    marker = os.path.join(args.model_dir, F16_MARKER)
    if not halves:
        summary = {"converted": 0, "note": "no float16 tensor: already widened"}
    else:
        try:
            from safetensors import safe_open
            from safetensors.numpy import save_file
            have_st = np is not None
        except ImportError:
            have_st = False
        if have_st:
            tensors = {}
            with safe_open(path, framework="np") as f:
                metadata = f.metadata()
                for name in f.keys():
                    arr = f.get_tensor(name)
                    tensors[name] = arr.astype(np.float32) if arr.dtype == np.float16 else arr
            tmp = path + ".tmp"
            save_file(tensors, tmp, metadata=metadata)
            os.chmod(tmp, 0o644)
            os.replace(tmp, path)
            summary = {"converted": len(halves), "writer": "safetensors"}
        else:
            summary = _convert_floats(path, path, "F16", "F32")
            summary["writer"] = "built-in"
    if os.path.exists(marker):
        os.remove(marker)
    summary["bytes"] = os.path.getsize(path)
    summary["unpacked_xz"] = unpacked
    print(json.dumps(summary))


# --------------------------------------------------------------------------------------------
# .npy, with or without numpy
# --------------------------------------------------------------------------------------------

def load_npy(path):
    """A 2-D float32 matrix as (rows, cols, flat list or numpy array)."""
    if np is not None:
        arr = np.load(path).astype(np.float32)
        if arr.ndim == 1:
            arr = arr[None, :]
        return arr.shape[0], arr.shape[1], arr
    with open(path, "rb") as f:
        if f.read(6) != b"\x93NUMPY":
            raise SystemExit(f"{path}: not a .npy file")
        major = f.read(2)[0]
        (hlen,) = struct.unpack("<H" if major == 1 else "<I", f.read(2 if major == 1 else 4))
        header = f.read(hlen).decode("latin1")
        descr = re.search(r"'descr':\s*'([^']+)'", header).group(1)
        shape = tuple(int(x) for x in re.search(r"'shape':\s*\(([^)]*)\)", header)
                      .group(1).split(",") if x.strip())
        if "True" in re.search(r"'fortran_order':\s*(\w+)", header).group(1):
            raise SystemExit(f"{path}: Fortran order is not supported without numpy")
        code = {"<f4": "f", "<f8": "d", "<f2": "e"}[descr]
        data = f.read()
    n = len(data) // struct.calcsize(code)
    flat = list(struct.unpack("<%d%s" % (n, code), data))
    rows, cols = (1, shape[0]) if len(shape) == 1 else shape
    return rows, cols, flat


def save_npy_f32(path, rows, cols, flat_bytes):
    """Writes row-major little-endian float32 bytes as a (rows, cols) .npy (no numpy)."""
    header = "{'descr': '<f4', 'fortran_order': False, 'shape': (%d, %d), }" % (rows, cols)
    pad = 64 - (10 + len(header) + 1) % 64
    header = header + " " * pad + "\n"
    with open(path, "wb") as f:
        f.write(b"\x93NUMPY\x01\x00")
        f.write(struct.pack("<H", len(header)))
        f.write(header.encode("latin1"))
        f.write(flat_bytes)


def read_ids(npy_path):
    ids_path = npy_path + ".ids.txt"
    if not os.path.exists(ids_path):
        base, _ = os.path.splitext(npy_path)
        ids_path = base + ".ids.txt"
    if not os.path.exists(ids_path):
        return None
    with open(ids_path, encoding="utf-8") as f:
        return [line.rstrip("\n") for line in f]


def cmd_compare(args):
    ra, ca, a = load_npy(args.a)
    rb, cb, b = load_npy(args.b)
    out = {"a": args.a, "b": args.b, "shape_a": [ra, ca], "shape_b": [rb, cb],
           "threshold": args.threshold}
    if (ra, ca) != (rb, cb):
        out.update(max_abs_diff=None, passed=False, problem="shapes differ")
        print(json.dumps(out))
        return 1
    ids_a, ids_b = read_ids(args.a), read_ids(args.b)
    if ids_a is not None and ids_b is not None:
        out["ids_match"] = ids_a == ids_b
    if np is not None:
        diff = np.abs(a - b)
        worst = float(diff.max())
        worst_row = int(diff.max(axis=1).argmax())
        cos = np.sum(a * b, axis=1) / np.maximum(
            np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1), 1e-12)
        out["min_cosine"] = float(cos.min())
        out["mean_abs_diff"] = float(diff.mean())
        finite = bool(np.all(np.isfinite(a)) and np.all(np.isfinite(b)))
    else:
        worst, worst_i = -1.0, 0
        for i, (x, y) in enumerate(zip(a, b)):
            d = abs(x - y)
            if d > worst:
                worst, worst_i = d, i
        worst_row = worst_i // ca
        finite = all(math.isfinite(x) for x in a) and all(math.isfinite(y) for y in b)
    out["max_abs_diff"] = worst
    out["worst_row"] = worst_row
    out["finite"] = finite
    out["passed"] = bool(finite and worst <= args.threshold and out.get("ids_match", True))
    print(json.dumps(out))
    return 0 if out["passed"] else 1


# --------------------------------------------------------------------------------------------
# inputs, logs, configs
# --------------------------------------------------------------------------------------------

def _first(obj, keys):
    for k in keys:
        v = obj.get(k)
        if v is not None:
            return v
    return None


def cmd_passages(args):
    seen = set()
    items = []
    with open(args.source, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            obj = json.loads(line)
            pid = _first(obj, ["passage_id", "_id", "id", "doc_id"])
            text = _first(obj, ["passage", "text", "document"])
            if pid is None or not text:
                continue
            title = obj.get("title") or ""
            if title.strip():
                text = f"{title} {text}"
            pid = str(pid)
            if pid in seen:
                continue
            seen.add(pid)
            items.append((pid, text))
    if not items:
        raise SystemExit(f"{args.source}: no passage found")
    n = args.n
    with open(args.out, "w", encoding="utf-8") as f:
        for i in range(n):
            pid, text = items[i % len(items)]
            if i >= len(items):
                pid = f"{pid}~{i // len(items)}"
            f.write(json.dumps({"id": pid, "text": text}, ensure_ascii=False) + "\n")
    chars = sum(len(items[i % len(items)][1]) for i in range(n))
    print(json.dumps({"passages": n, "distinct": min(n, len(items)), "source": args.source,
                      "mean_chars": chars / n}))


EMBED_RE = re.compile(
    r"embedded (\d+) (passages|queries)(?: \(\d+ resumed from .*?\))? \(d = (\d+)\) in ([0-9.]+) s"
    r"(?: \(([0-9.]+)/s\))?")
TRAIN_RE = re.compile(r"done: (\d+) optimizer steps, ([0-9.]+) rows/s")
STEP_RE = re.compile(r"train step\s+(\d+)/(\d+) .*rows/s ([0-9.]+)")
TORCH_TRAIN_RE = re.compile(
    r"PyTorch \S+ on (.+?): step .*?: ([0-9.]+) s/step, ([0-9.]+) rows/s, peak RSS ([0-9.]+) MiB")


def cmd_embed_log(args):
    text = open(args.file, encoding="utf-8", errors="replace").read()
    m = EMBED_RE.findall(text)
    if not m:
        out = {"encode_seconds": None, "wall_seconds": args.wall}
        _apply_sets(out, args.set)  # a failed run keeps its labels (a routine, a batch size)
        print(json.dumps(out))
        return 1
    n, _, d, s, rate = m[-1]
    s = float(s)
    # The printed time is rounded (to 0.1 s before 2026-11-28, 0.01 s since); the printed
    # rate comes from the unrounded time, so it is the rate reported when the line has it.
    if rate and float(rate) > 0:
        per_s = float(rate)
        s = int(n) / per_s
    else:
        per_s = int(n) / s if s > 0 else None
    out = {"encoded": int(n), "dim": int(d), "encode_seconds": s, "passages_per_s": per_s}
    if args.wall is not None:
        out["wall_seconds"] = args.wall
        out["passages_per_s_wall"] = int(n) / args.wall if args.wall > 0 else None
    _apply_sets(out, args.set)
    for kv in args.json or []:
        key, path = kv.split("=", 1)
        out[key] = json.loads(open(path, encoding="utf-8").read())
    print(json.dumps(out))
    return 0


# cubecl's profiling log (CUBECL_DEBUG_OPTION=profile): one line per timed kernel launch,
# "| 616.608µs  | SliceAssignKernel_19b3bebf" or "| 2.3ms | MatmulEntry | ... | Family_5a9f".
PROFILE_LINE_RE = re.compile(r"^\|\s*([0-9.]+)\s*(ns|µs|us|ms|s)\s*\|\s*(.+?)\s*$")
PROFILE_UNIT_MS = {"ns": 1e-6, "µs": 1e-3, "us": 1e-3, "ms": 1.0, "s": 1e3}
PROFILE_HASH_RE = re.compile(r"_[0-9a-f]{8}$")


PROFILE_FULL_COUNT_RE = re.compile(r"^\}\s*CubeCount\s*\((\d+),\s*(\d+),\s*(\d+)\)")
PROFILE_FIELD_RE = re.compile(r"^\s*(bm|bn|lhs_k_major|rhs_n_major|split):\s*(\w+),?\s*$")


def profile_kernel_name(label):
    """A launch's label without its hash; matmuls keep their family and partitioner. A label
    of the `profile-full` level (the kernel's type path, its generics and settings on the
    lines below) is named by its type's last path segment."""
    if "::" in label:
        path = re.match(r"[\w:]+", label).group(0).rstrip(":")
        return path.split("::")[-1]
    parts = [PROFILE_HASH_RE.sub("", x.strip()) for x in label.split("|")]
    if parts[0] == "MatmulEntry":
        family = [x for x in parts if x.endswith("Family") or x.endswith("Partitioner")]
        return " | ".join(["MatmulEntry"] + family[:3])
    return " | ".join(x for x in parts if x)


def summarize_profile(lines, top=15):
    groups = {}
    total = 0.0
    launches = 0
    # `profile-full` logs: each BlockedMatmul launch's tile, operand layouts, whether its depth
    # is split, and cube count (blocks along N, M and the batch times the depth's parts), which
    # name its product's shape
    shapes = {}
    pending = None  # (ms, fields) of a BlockedMatmul launch whose settings follow
    for line in lines:
        if pending is not None:
            f = PROFILE_FIELD_RE.match(line)
            if f:
                pending[1][f.group(1)] = f.group(2)
                continue
            c = PROFILE_FULL_COUNT_RE.match(line)
            if c:
                ms, fields = pending
                key = "tile {}x{} blocks {}x{}x{} lhs_k_major {} rhs_n_major {} split {}".format(
                    fields.get("bm"), fields.get("bn"), c.group(1), c.group(2), c.group(3),
                    fields.get("lhs_k_major"), fields.get("rhs_n_major"),
                    fields.get("split", "false"))
                g = shapes.setdefault(key, {"launch": key, "launches": 0, "total_ms": 0.0})
                g["launches"] += 1
                g["total_ms"] += ms
                pending = None
                continue
        m = PROFILE_LINE_RE.match(line)
        if not m:
            continue
        pending = None
        ms = float(m.group(1)) * PROFILE_UNIT_MS[m.group(2)]
        name = profile_kernel_name(m.group(3))
        if name == "BlockedMatmul" and "::" in m.group(3):
            pending = (ms, {})
        g = groups.setdefault(name, {"kernel": name, "launches": 0, "total_ms": 0.0})
        g["launches"] += 1
        g["total_ms"] += ms
        total += ms
        launches += 1
    ranked = sorted(groups.values(), key=lambda g: -g["total_ms"])
    for g in ranked:
        g["share"] = g["total_ms"] / total if total > 0 else None
        g["mean_us"] = 1e3 * g["total_ms"] / g["launches"]
    # cubek's products (`MatmulEntry | ...`) and this project's `--matmul blocked` kernel, with
    # the launches that add the parts of a split product (`blocked_split`'s `SumParts`)
    matmuls = [g for g in ranked
               if g["kernel"].startswith("MatmulEntry")
               or g["kernel"] in ("BlockedMatmul", "SumParts")]
    return {
        "launches": launches,
        "kernels": len(groups),
        "total_ms": total,
        "mean_launch_us": 1e3 * total / launches if launches else None,
        "matmul_share": (sum(g["total_ms"] for g in matmuls) / total) if total > 0 else None,
        "matmul_kinds": [g["kernel"] for g in matmuls],
        "top": ranked[:top],
        # the blocked kernel's launches by tile, layouts and blocks (`profile-full` logs only)
        "blocked_by_launch": [
            dict(g, mean_us=1e3 * g["total_ms"] / g["launches"])
            for g in sorted(shapes.values(), key=lambda g: -g["total_ms"])[:25]
        ],
    }


def cmd_kernel_profile(args):
    with open(args.file, encoding="utf-8", errors="replace") as f:
        out = summarize_profile(f, top=args.top)
    print(json.dumps(out, indent=1))
    # no timed launch in the log: profiling was off, or nothing ran on the device
    return 0 if out["launches"] else 1


def cmd_train_log(args):
    text = open(args.file, encoding="utf-8", errors="replace").read()
    out = {"steps": None, "rows_per_s": None}
    m = TRAIN_RE.findall(text)
    if m:
        steps, rate = m[-1]
        # the whole process's training loop, evaluations and checkpoints included
        out = {"steps": int(steps), "rows_per_s": float(rate)}
    steps = STEP_RE.findall(text)
    if steps:
        # the last progress line: rows/s of the optimizer steps so far
        out["step_rows_per_s"] = float(steps[-1][2])
        out["steps_logged"] = int(steps[-1][0])
        out["total_steps"] = int(steps[-1][1])
        rows_per_step = args.rows_per_step
        if rows_per_step is None:
            # "... 12 row(s) per batch x 1 accumulation ..." (the trainer's opening line)
            b = re.search(r"(\d+) row\(s\) per batch x (\d+) accumulation", text)
            rows_per_step = int(b.group(1)) * int(b.group(2)) if b else None
        out["step_rows_per_s_after_warmup"] = steady_rate(
            [(int(k), float(r)) for k, _, r in steps], rows_per_step, args.warmup_steps)
        out["rows_per_step"] = rows_per_step
        out["warmup_steps"] = args.warmup_steps
    print(json.dumps(out))
    return 0


def steady_rate(points, rows_per_step, warmup):
    """Rows/s of the optimizer steps after the first `warmup` ones.

    Each progress line gives the running rate r_k = rows / seconds over steps 1..k, so the
    time to step k is T_k = rows_per_step * k / r_k and the rate over steps w+1..n is
    rows_per_step * (n - w) / (T_n - T_w): the first steps (shader compilation, autotuning)
    drop out. None when the run is too short or a rate is zero."""
    if not points or rows_per_step is None:
        return None
    by_step = dict(points)
    n = max(by_step)
    w = max((k for k in by_step if k <= warmup), default=None)
    if w is None or n <= w or by_step[n] <= 0 or by_step[w] <= 0:
        return None
    t_n = rows_per_step * n / by_step[n]
    t_w = rows_per_step * w / by_step[w]
    if t_n <= t_w:
        return None
    return rows_per_step * (n - w) / (t_n - t_w)


def cmd_torch_train_log(args):
    """Parses scripts/train/bench_torch.py's summary line."""
    text = open(args.file, encoding="utf-8", errors="replace").read()
    m = TORCH_TRAIN_RE.findall(text)
    if not m:
        print(json.dumps({"seconds_per_step": None, "rows_per_s": None}))
        return 1
    where, per_step, rate, rss = m[-1]
    print(json.dumps({"where": where, "seconds_per_step": float(per_step),
                      "rows_per_s": float(rate), "peak_rss_mib": float(rss)}))
    return 0


def cmd_history(args):
    with open(args.file, encoding="utf-8") as f:
        hist = json.load(f)
    evals = [e for e in hist if e.get("metrics")]

    def metrics(e):
        # HistoryEntry.metrics is a Vec<(String, f64)>: a JSON list of [name, value] pairs.
        m = e.get("metrics") or []
        return dict(m) if isinstance(m, list) else dict(m.items())

    out = {"entries": len(hist), "evaluations": len(evals),
           "final_step": hist[-1]["step"] if hist else None,
           "dev_before": metrics(evals[0]) if evals else None,
           "dev_before_step": evals[0]["step"] if evals else None,
           "dev_after": metrics(evals[-1]) if evals else None,
           "dev_after_step": evals[-1]["step"] if evals else None,
           "losses": [[e["step"], e.get("loss")] for e in hist if e.get("loss") is not None]}
    print(json.dumps(out))
    return 0 if evals else 1


def cmd_patch_config(args):
    """Rewrites the top-level `output_dir` (and `max_steps`) of a TOML file, and with --no-dev
    drops `[data] dev`, leaving every other line as it is. Top-level keys are those before the
    first [table] header."""
    with open(args.src, encoding="utf-8") as f:
        lines = f.read().splitlines()
    first_table = next((i for i, l in enumerate(lines) if l.lstrip().startswith("[")),
                       len(lines))
    top, rest = lines[:first_table], lines[first_table:]
    out_dir = json.dumps(args.output_dir)  # a TOML basic string is a JSON string here
    top = [l for l in top if not re.match(r"\s*(output_dir|max_steps)\s*=", l)]
    while top and not top[-1].strip():
        top.pop()
    top.append(f"output_dir = {out_dir}  # patched by scripts/gpu/gpu_check.py")
    if args.max_steps is not None:
        top.append(f"max_steps = {args.max_steps}  # patched: a short local test")
    if args.no_dev:
        # no dev evaluation at all: drop `dev = ...` from the [data] table
        table = None
        kept = []
        for l in rest:
            h = re.match(r"\s*\[([^\]]+)\]", l)
            if h:
                table = h.group(1).strip()
            if table == "data" and re.match(r"\s*dev\s*=", l):
                kept.append("# dev: dropped by scripts/gpu/gpu_check.py (no evaluation)")
                continue
            kept.append(l)
        rest = kept
    text = "\n".join(top + [""] + rest) + "\n"
    with open(args.out, "w", encoding="utf-8") as f:
        f.write(text)
    print(json.dumps({"config": args.out, "output_dir": args.output_dir,
                      "max_steps": args.max_steps, "dev": not args.no_dev}))
    return 0


# --------------------------------------------------------------------------------------------
# stage records and the report
# --------------------------------------------------------------------------------------------

def _value(text):
    try:
        return json.loads(text)
    except ValueError:
        return text


def _apply_sets(record, items):
    """`--set KEY=VALUE` options into `record` (the value as JSON when it parses)."""
    for kv in items or []:
        k, v = kv.split("=", 1)
        record[k] = _value(v)


def _tail(path, lines):
    if not path or not os.path.exists(path):
        return None
    with open(path, encoding="utf-8", errors="replace") as f:
        content = f.read().splitlines()
    return "\n".join(content[-lines:])


def cmd_stage(args):
    rec = {"name": args.name, "ok": args.rc == 0 and not args.skipped,
           "skipped": bool(args.skipped), "rc": args.rc}
    if args.skipped:
        rec["ok"] = None
        rec["reason"] = args.skipped
    if args.informational:
        rec["informational"] = True  # its failure is reported, not counted
    if args.seconds is not None:
        rec["seconds"] = args.seconds
    for path in args.json or []:
        key = None
        if "=" in path and not os.path.exists(path):
            key, path = path.split("=", 1)
        data = None
        if os.path.exists(path):
            text = open(path, encoding="utf-8", errors="replace").read().strip()
            # the last JSON line (torch_encode.py may print warnings before it)
            for line in reversed(text.splitlines()):
                line = line.strip()
                if line.startswith("{"):
                    try:
                        data = json.loads(line)
                        break
                    except ValueError:
                        pass
            if data is None:
                try:
                    data = json.loads(text)
                except ValueError:
                    data = None
        if key:
            rec[key] = data
        elif isinstance(data, dict):
            rec.update(data)
    for kv in args.append or []:
        k, path = kv.split("=", 1)
        item = None
        if os.path.exists(path):
            try:
                item = json.loads(open(path, encoding="utf-8").read())
            except ValueError:
                item = None
        rec.setdefault(k, []).append(item)
    _apply_sets(rec, args.set)
    for kv in args.text or []:
        k, path = kv.split("=", 1)
        rec[k] = open(path, encoding="utf-8", errors="replace").read().rstrip("\n") \
            if os.path.exists(path) else None
    if rec["ok"] is False:
        rec["stderr_tail"] = _tail(args.stderr, args.tail)
        if args.stdout:
            rec["stdout_tail"] = _tail(args.stdout, 20)
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(rec, f, indent=2)
    status = "skipped" if args.skipped else ("ok" if rec["ok"] else f"FAILED (rc {args.rc})")
    if args.informational and rec["ok"] is False:
        status += ", informational: not counted"
    print(f"[gpu-check] stage {args.name}: {status}", file=sys.stderr)
    return 0


def _last_rate(rec):
    runs = [r for r in ((rec or {}).get("runs") or []) if isinstance(r, dict)]
    return runs[-1].get("passages_per_s") if runs else None


def _profile_digest(summary):
    """The headline of a kernel-profile summary: matmul share, launches, the top 5 kernels."""
    if not isinstance(summary, dict):
        return None
    return {
        "launches": summary.get("launches"),
        "device_ms": summary.get("total_ms"),
        "matmul_share": summary.get("matmul_share"),
        "matmul_kinds": summary.get("matmul_kinds"),
        "top": [{k: g.get(k) for k in ("kernel", "launches", "share")}
                for g in (summary.get("top") or [])[:5]],
    }


def _sweep_digest(rec):
    """The batch sweep's headline: per batch size, infembed's and the torch baseline's rates."""
    if not isinstance(rec, dict):
        return None
    rows = {}
    for key in ("infembed", "infembed_f16"):
        for r in rec.get(key) or []:
            if isinstance(r, dict) and r.get("batch_size") is not None:
                rows.setdefault(r["batch_size"], {})[key] = r.get("passages_per_s")
    for r in rec.get("torch_fp32") or []:
        if isinstance(r, dict) and r.get("batch_size") is not None:
            row = rows.setdefault(r["batch_size"], {})
            row["torch_fp32"] = r.get("passages_per_s")
            row["torch_fp32_forward_only"] = r.get("passages_per_s_forward_only")
    return [{"batch_size": b, **rows[b]} for b in sorted(rows)] or None


def _routine_digest(rec):
    """The routine sweep's headline: per routine and precision infembed's passages/s and its
    embeddings' largest difference from the CPU's, fastest first."""
    if not isinstance(rec, dict):
        return None
    rows = []
    for r in rec.get("runs") or []:
        if isinstance(r, dict) and r.get("routine"):
            vs = r.get("vs_cpu") if isinstance(r.get("vs_cpu"), dict) else {}
            rows.append({"routine": r["routine"], "dtype": r.get("dtype"),
                         "passages_per_s": r.get("passages_per_s"),
                         "max_abs_diff_vs_cpu": vs.get("max_abs_diff"),
                         "fell_back": r.get("fell_back")})
    rows.sort(key=lambda r: -(r["passages_per_s"] or 0))
    return rows or None


def cmd_best_routine(args):
    best = None
    for path in args.files:
        try:
            r = json.loads(open(path, encoding="utf-8").read())
        except (OSError, ValueError):
            continue
        vs = r.get("vs_cpu") if isinstance(r.get("vs_cpu"), dict) else {}
        diff, rate = vs.get("max_abs_diff"), r.get("passages_per_s")
        # a fast wrong answer is not a candidate, nor one whose agreement was not checked, nor
        # one whose products fell back to burn's matmul (its rate is burn's)
        if not r.get("routine") or not isinstance(rate, (int, float)) or \
                not isinstance(diff, (int, float)) or diff > args.limit or r.get("fell_back"):
            continue
        if best is None or rate > best[1]:
            best = (r["routine"], rate)
    if best is None:
        return 1
    print(best[0])
    return 0


def _probe_digest(probe):
    """The matmul probe's headline: the device's tensor-core configurations, the tensor-core
    routines that ran, and per product and precision burn's time and the fastest routine whose
    result agreed with the host's (routines that ran but did not are listed as `inexact`)."""
    if not isinstance(probe, dict):
        return None
    rows = [r for r in (probe.get("rows") or []) if isinstance(r, dict)]
    best = {}
    ran_mma = set()
    for r in rows:
        out = r.get("outcome") or {}
        if out.get("status") != "ran" or not isinstance(out.get("ms"), (int, float)):
            continue
        # a fast wrong answer is not a candidate: the precision's rounding, no more
        limit = 1e-4 if r.get("precision") == "f32" else 1e-2
        err = out.get("rel_err")
        if not isinstance(err, (int, float)) or err > limit:
            entry = best.setdefault((r.get("case"), r.get("precision")),
                                    {"case": r.get("case"), "precision": r.get("precision"),
                                     "shape": r.get("shape")})
            entry.setdefault("inexact", []).append(r.get("routine"))
            continue
        routine = r.get("routine") or ""
        if "mma" in routine:
            ran_mma.add(routine)
        key = (r.get("case"), r.get("precision"))
        entry = best.setdefault(key, {"case": key[0], "precision": key[1], "shape": r.get("shape")})
        if routine == "burn":
            entry["burn_ms"] = out["ms"]
        if "best_ms" not in entry or out["ms"] < entry["best_ms"]:
            entry.update(best_routine=routine, best_ms=out["ms"], best_tflops=out.get("tflops"),
                         best_rel_err=out.get("rel_err"))
    return {"cmma_configs": probe.get("cmma_configs"),
            "tensor_core_routines_ran": sorted(ran_mma), "best": list(best.values())}


def _profile_digests(get):
    """The profile stage's digests: `embed` and `train` always (None when missing), `embed_f16`
    when that run was made (`--infembed-f16`)."""
    digests = {part: _profile_digest(get("profile_kernels", part)) for part in ("embed", "train")}
    if get("profile_kernels", "embed_f16") is not None:
        digests["embed_f16"] = _profile_digest(get("profile_kernels", "embed_f16"))
    return digests


def cmd_report(args):
    stages = {}
    for name in sorted(os.listdir(args.stages)):
        if name.endswith(".json"):
            with open(os.path.join(args.stages, name), encoding="utf-8") as f:
                rec = json.load(f)
            stages[rec["name"]] = rec

    def get(stage, key):
        rec = stages.get(stage)
        return None if rec is None else rec.get(key)

    failed = [n for n, r in stages.items()
              if r.get("ok") is False and not r.get("informational")]
    informational = [n for n, r in stages.items()
                     if r.get("ok") is False and r.get("informational")]
    skipped = {n: r.get("reason") for n, r in stages.items() if r.get("skipped")}
    dev = args.device
    thr = stages.get("throughput_infembed") or {}
    runs = [r for r in (thr.get("runs") or []) if isinstance(r, dict)]
    last = runs[-1] if runs else {}  # the last run: the first one compiles the shaders
    report = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "host": os.uname().nodename if hasattr(os, "uname") else None,
        "device": dev,
        "nvidia_smi": get("environment", "nvidia_smi"),
        "infembed_devices": get("devices", "output"),
        "parity": {
            "passages": get("parity", "passages"),
            "max_abs_diff": get("parity", "max_abs_diff"),
            "threshold": get("parity", "threshold"),
            "passed": get("parity", "passed"),
            "f16_max_abs_diff": ((stages.get("throughput_infembed_f16") or {}).get("vs_cpu")
                                 or {}).get("max_abs_diff"),
        },
        "torch_vs_infembed_cpu": {
            "backend": get("torch_parity", "backend"),
            "device": get("torch_parity", "device"),
            "max_abs_diff": get("torch_parity", "max_abs_diff"),
            "threshold": get("torch_parity", "threshold"),
            "passed": get("torch_parity", "passed"),
        },
        "throughput_passages_per_s": {
            "passages": thr.get("passages"),
            f"infembed_{dev}": last.get("passages_per_s"),
            f"infembed_{dev}_wall": last.get("passages_per_s_wall"),
            f"infembed_{dev}_first_run": runs[0].get("passages_per_s") if runs else None,
            f"infembed_{dev}_f16": _last_rate(stages.get("throughput_infembed_f16")),
            "torch_fp32": get("torch_fp32", "passages_per_s"),
            "torch_fp32_forward_only": get("torch_fp32", "passages_per_s_forward_only"),
            "torch_fp16": get("torch_fp16", "passages_per_s"),
            "torch_fp16_forward_only": get("torch_fp16", "passages_per_s_forward_only"),
            "torch_device": get("torch_fp32", "device"),
            "torch_device_fallback": get("torch_fp32", "device_fallback"),
            "torch_backend": get("torch_fp32", "backend"),
        },
        "train": {
            "device": get("train", "device"),
            "seconds": get("train", "seconds"),
            "steps": get("train", "steps"),
            "max_steps": get("train", "max_steps"),
            "rows_per_s": get("train", "rows_per_s"),
            "step_rows_per_s": get("train", "step_rows_per_s"),
            "step_rows_per_s_after_warmup": get("train", "step_rows_per_s_after_warmup"),
            "torch_step_rows_per_s": get("torch_train", "rows_per_s"),
            "torch_seconds_per_step": get("torch_train", "seconds_per_step"),
            "torch_where": get("torch_train", "where"),
            "dev_before": get("train", "dev_before"),
            "dev_after": get("train", "dev_after"),
        },
        "batch_sweep_passages_per_s": _sweep_digest(stages.get("batch_sweep")),
        "routine_sweep": _routine_digest(stages.get("routine_sweep")),
        "routine_train": {
            "routine": get("routine_train", "routine"),
            "seconds": get("routine_train", "seconds"),
            "rows_per_s": get("routine_train", "rows_per_s"),
            "step_rows_per_s_after_warmup": get("routine_train", "step_rows_per_s_after_warmup"),
            "dev_before": get("routine_train", "dev_before"),
            "dev_after": get("routine_train", "dev_after"),
        } if get("routine_train", "routine") else None,
        "kernel_profile": _profile_digests(get),
        "matmul_probe": _probe_digest(get("matmul_probe", "probe")),
        "failed_stages": failed,
        "informational_failures": informational,
        "skipped_stages": skipped,
        "ok": not failed,
        "options": _value(args.options) if args.options else None,
        "stages": stages,
    }
    tmp = args.out + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(report, f, indent=2)
        f.write("\n")
    os.replace(tmp, args.out)
    return 1 if failed else 0


def cmd_bundle_manifest(args):
    files = []
    for root, _, names in os.walk(args.dir):
        for n in names:
            p = os.path.join(root, n)
            rel = os.path.relpath(p, args.dir)
            if rel == "bundle.json":
                continue
            h = hashlib.sha256()
            with open(p, "rb") as f:
                for chunk in iter(lambda: f.read(1 << 20), b""):
                    h.update(chunk)
            files.append({"path": rel, "bytes": os.path.getsize(p), "sha256": h.hexdigest()})
    files.sort(key=lambda x: x["path"])
    out = {"created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "files": files, "total_bytes": sum(x["bytes"] for x in files)}
    _apply_sets(out, args.set)
    with open(os.path.join(args.dir, "bundle.json"), "w", encoding="utf-8") as f:
        json.dump(out, f, indent=2)
        f.write("\n")
    return 0


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)

    p = sub.add_parser("narrow")
    p.add_argument("src")
    p.add_argument("dst")
    p = sub.add_parser("widen")
    p.add_argument("model_dir")
    p = sub.add_parser("passages")
    p.add_argument("--source", required=True)
    p.add_argument("--n", type=int, required=True)
    p.add_argument("--out", required=True)
    p = sub.add_parser("compare")
    p.add_argument("a")
    p.add_argument("b")
    p.add_argument("--threshold", type=float, default=1e-3)
    p = sub.add_parser("kernel-profile")
    p.add_argument("file")
    p.add_argument("--top", type=int, default=15)

    p = sub.add_parser("embed-log")
    p.add_argument("file")
    p.add_argument("--wall", type=float, help="the process's wall seconds")
    p.add_argument("--set", action="append", help="KEY=VALUE added to the record (JSON if it parses)")
    p.add_argument("--json", action="append", help="KEY=FILE: the file's JSON added under KEY")
    p = sub.add_parser("best-routine")
    p.add_argument("files", nargs="+")
    p.add_argument("--limit", type=float, default=1e-3,
                   help="largest difference from the CPU's embeddings (default 1e-3)")
    p = sub.add_parser("train-log")
    p.add_argument("file")
    p.add_argument("--rows-per-step", type=int, help="rows of one optimizer step (default: read from the log)")
    p.add_argument("--warmup-steps", type=int, default=20,
                   help="steps left out of step_rows_per_s_after_warmup (default 20)")
    p = sub.add_parser("torch-train-log")
    p.add_argument("file")
    p = sub.add_parser("history")
    p.add_argument("file")
    p = sub.add_parser("patch-config")
    p.add_argument("src")
    p.add_argument("--out", required=True)
    p.add_argument("--output-dir", required=True)
    p.add_argument("--max-steps", type=int)
    p.add_argument("--no-dev", action="store_true")
    p = sub.add_parser("stage")
    p.add_argument("--name", required=True)
    p.add_argument("--rc", type=int, default=0)
    p.add_argument("--seconds", type=float)
    p.add_argument("--stderr")
    p.add_argument("--stdout")
    p.add_argument("--tail", type=int, default=30)
    p.add_argument("--skipped")
    p.add_argument("--informational", action="store_true")
    p.add_argument("--json", action="append", help="FILE or KEY=FILE: merge a JSON result")
    p.add_argument("--append", action="append", help="KEY=FILE: append a JSON object to a list")
    p.add_argument("--set", action="append", help="KEY=VALUE (JSON if it parses)")
    p.add_argument("--text", action="append", help="KEY=FILE: a file's text")
    p.add_argument("--out", required=True)
    p = sub.add_parser("report")
    p.add_argument("--stages", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--device", default="wgpu")
    p.add_argument("--options")
    p = sub.add_parser("bundle-manifest")
    p.add_argument("dir")
    p.add_argument("--set", action="append")

    args = ap.parse_args(argv)
    fn = {"narrow": cmd_narrow, "widen": cmd_widen, "passages": cmd_passages,
          "compare": cmd_compare, "kernel-profile": cmd_kernel_profile, "embed-log": cmd_embed_log, "train-log": cmd_train_log,
          "best-routine": cmd_best_routine,
          "torch-train-log": cmd_torch_train_log,
          "history": cmd_history, "patch-config": cmd_patch_config, "stage": cmd_stage,
          "report": cmd_report, "bundle-manifest": cmd_bundle_manifest}[args.cmd]
    return fn(args) or 0


if __name__ == "__main__":
    sys.exit(main())
