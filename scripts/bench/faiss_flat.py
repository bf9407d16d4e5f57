"""faiss's exact inner-product search (IndexFlatIP) on an infembed index file, for
scripts/bench/index_scale.sh: the same vectors and queries as `index_scale search`.

    python faiss_flat.py INDEX.safetensors QUERIES.npy K OUT.tsv

The matrix is read from the safetensors file block by block (np.fromfile at its offset) into
faiss's codes, sized once, so faiss's peak memory is its own copy of the index plus a block. Prints one JSON line:
seconds to build the index (read + add), to search, and the peak RSS (ru_maxrss).
"""

import json
import resource
import struct
import sys
import time

import faiss
import numpy as np


def main() -> None:
    index_path, queries_path, k, out = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    start = time.perf_counter()
    with open(index_path, "rb") as f:
        (hlen,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(hlen))
    emb = header["embeddings"]
    assert emb["dtype"] == "F32", "faiss's IndexFlatIP takes float32: give the f32 file"
    n, d = emb["shape"]
    base = 8 + hlen + emb["data_offsets"][0]
    index = faiss.IndexFlatIP(d)
    # The codes sized once and filled in place (faiss's `add` grows its buffer by doubling,
    # which needs 2x the index at 8.8M x 384 and fails on a 24 GiB machine).
    index.codes.resize(n * d * 4)
    view = faiss.rev_swig_ptr(index.codes.data(), n * d * 4).view("<f4").reshape(n, d)
    block = 1 << 16
    with open(index_path, "rb") as f:
        f.seek(base)
        for a in range(0, n, block):
            rows = min(block, n - a)
            view[a : a + rows] = np.fromfile(f, dtype="<f4", count=rows * d).reshape(rows, d)
    index.ntotal = n
    build_s = time.perf_counter() - start
    queries = np.load(queries_path).astype(np.float32)
    qids = [line.rstrip("\n") for line in open(queries_path[: -len(".npy")] + ".ids.txt")]
    start = time.perf_counter()
    scores, rows = index.search(queries, k)
    search_s = time.perf_counter() - start
    # The ids are `doc{row}` (index_scale write).
    with open(out, "w") as w:
        for qid, s, r in zip(qids, scores, rows):
            for rank, (score, row) in enumerate(zip(s, r), 1):
                w.write(f"{qid}\t{rank}\tdoc{row}\t{score}\n")
    print(
        json.dumps(
            {
                "phase": "search",
                "tool": f"faiss {faiss.__version__} IndexFlatIP",
                "n": n,
                "d": d,
                "matrix_mib": round(n * d * 4 / 1048576),
                "build_s": round(build_s, 2),
                "queries": len(queries),
                "k": k,
                "search_s": round(search_s, 2),
                "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
                "threads": faiss.omp_get_max_threads(),
            }
        )
    )


if __name__ == "__main__":
    main()
