#!/usr/bin/env python3
"""Check that a directory saved by infembed-encoder loads in sentence-transformers and gives
the same embeddings as the Rust side (developer-run, not CI).

    cargo run -p infembed-encoder --example save_model -- models/all-MiniLM-L6-v2 /tmp/saved
    /work/venvs/hf/bin/python scripts/encoder/check_saved.py /tmp/saved
"""
import json
import sys

import numpy as np
import torch
from sentence_transformers import SentenceTransformer

torch.set_num_threads(2)
out = sys.argv[1]
ref = json.load(open(f"{out}/rust_embeddings.json"))
model = SentenceTransformer(out, device="cpu")
emb = model.encode(ref["texts"], normalize_embeddings=False, convert_to_numpy=True)
rust = np.asarray(ref["embeddings"], dtype=np.float32)
diff = float(np.abs(emb - rust).max())
cos = float(min((a @ b) / (np.linalg.norm(a) * np.linalg.norm(b)) for a, b in zip(emb, rust)))
print(f"max abs diff {diff:.3e}, min cosine {cos:.8f}")
if diff > 1e-5 or cos < 0.99999:
    sys.exit("MISMATCH")
print("OK: sentence-transformers loads the saved directory and agrees with Rust")
