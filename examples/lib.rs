//! # infembed examples
//!
//! Runnable examples of the `infembed` library API, each a short file in this folder written to be
//! copied into your own project. Run them from the repository root:
//!
//! ```text
//! cargo run -p infembed-examples --example embed_search -- [MODEL_DIR] [CORPUS.jsonl]
//! cargo run -p infembed-examples --example eval_beir    -- [MODEL_DIR | --bm25] [BEIR_DIR]
//! cargo run -p infembed-examples --example eval_inf_ir  -- [MODEL_DIR] [FILE.jsonl] [N]
//! cargo xtask examples    # all of them on the tiny inputs in examples/data (what CI runs)
//! ```
//!
//! - `embed_search.rs`: load a model, embed a JSONL corpus, save and reload the embeddings,
//!   search them with an instruction and a query.
//! - `eval_beir.rs`: evaluate a model (or BM25) on a BEIR folder: nDCG@10, MAP, MRR, P@10,
//!   Recall@100.
//! - `eval_inf_ir.rs`: evaluate a model on the held-out instruction-following test built from an
//!   InF-IR file: p-MRR, pairwise instruction accuracy, nDCG.
//!
//! `MODEL_DIR` defaults to `models/all-MiniLM-L6-v2` (`cargo xtask fetch-model` puts it there);
//! when it is absent an example prints a `SKIPPED` line, records the skip (counted by
//! `cargo xtask skips`) and exits 0, except under `CI=true`, where it fails naming the model
//! (`infembed-testkit`, a dev-dependency; in your own project, drop those three lines). This
//! library target holds nothing else: Cargo wants one in every package.
