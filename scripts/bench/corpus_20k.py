"""Writes the shipped classic collections as one JSONL corpus for `infembed embed` benchmarks.

Reads ../shared/data/collections (or $INFEMBED_SHARED_DATA/collections): CACM (jsonl), CISI and
Cranfield (SMART .I/.T/.W files), NPL/Vaswani (TREC <DOC> file), the MS MARCO subset (jsonl),
plus the InF-IR sample's distractors from the repo: 20,247 passages in all. Ids are prefixed by
the collection. With `--repeat N --out F`, the corpus is written N times with ids suffixed by the
repetition (the 1M-passage resumption check).

    python3 scripts/bench/corpus_20k.py --out /tmp/corpus20k.jsonl
"""

import argparse
import json
import os
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def shared() -> Path:
    env = os.environ.get("INFEMBED_SHARED_DATA")
    return Path(env) if env else ROOT.parent / "shared" / "data"


def smart(path: Path, prefix: str):
    """SMART format: `.I id`, then fields `.T` (title), `.W` (text) among others."""
    docs, cur, field = [], None, None
    for line in path.read_text(errors="replace").splitlines():
        if line.startswith(".I "):
            if cur:
                docs.append(cur)
            cur = {"id": f"{prefix}-{line[3:].strip()}", "title": "", "text": ""}
            field = None
        elif len(line) == 2 and line.startswith("."):
            field = {".T": "title", ".W": "text"}.get(line)
        elif cur is not None and field:
            cur[field] = (cur[field] + " " + line.strip()).strip()
    if cur:
        docs.append(cur)
    return docs


def trec(path: Path, prefix: str):
    text = path.read_text(errors="replace")
    docs = []
    for m in re.finditer(r"<DOC>\s*<DOCNO>\s*(\S+?)\s*</DOCNO>(.*?)</DOC>", text, re.S):
        docs.append({"id": f"{prefix}-{m.group(1)}", "text": " ".join(m.group(2).split())})
    return docs


def jsonl(path: Path, prefix: str, text_key: str, id_key: str = "id"):
    docs = []
    for line in path.read_text().splitlines():
        if line.strip():
            o = json.loads(line)
            doc_id = o.get("_id", o.get(id_key))
            docs.append(
                {"id": f"{prefix}-{doc_id}", "title": o.get("title") or "", "text": o[text_key]}
            )
    return docs


def corpus():
    c = shared() / "collections"
    docs = []
    docs += jsonl(c / "cacm" / "cacm.jsonl", "cacm", "contents")
    docs += smart(c / "cisi" / "CISI.ALL", "cisi")
    docs += smart(c / "cranfield" / "cran.all.1400", "cran")
    docs += trec(c / "vaswani" / "corpus" / "doc-text.trec", "npl")
    docs += jsonl(c / "msmarco-subset" / "corpus.jsonl", "msmarco", "text")
    docs += jsonl(ROOT / "data" / "inf-ir-sample" / "distractors.jsonl", "infir", "passage", "passage_id")
    return [d for d in docs if d["text"].strip()]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--limit", type=int, default=0, help="at most this many records")
    args = ap.parse_args()
    docs = corpus()
    n = 0
    with open(args.out, "w") as f:
        for r in range(args.repeat):
            for d in docs:
                if args.limit and n >= args.limit:
                    break
                rec = dict(d)
                if args.repeat > 1:
                    rec["id"] = f"{d['id']}#{r}"
                f.write(json.dumps(rec) + "\n")
                n += 1
    print(f"{n} records ({len(docs)} distinct) -> {args.out}")


if __name__ == "__main__":
    main()
