//! Evaluate a retriever on a folder in the BEIR layout (`corpus.jsonl`, `queries.jsonl`,
//! `qrels/test.tsv`): nDCG@10, MAP@1000, MRR@10, P@10 and Recall@100, as percentages.
//!
//! ```text
//! cargo run -p infembed-examples --example eval_beir -- [MODEL_DIR | --bm25] [BEIR_DIR]
//! ```
//!
//! Defaults: `models/all-MiniLM-L6-v2` and the tiny `examples/data/beir-tiny`.

use std::path::{Path, PathBuf};

use anyhow::Result;
use infembed::encoder::EncoderConfig;
use infembed::{Bm25Retriever, Device, EncoderRetriever, EvalConfig, Retriever};

fn main() -> Result<()> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut args = std::env::args().skip(1);
    let first = args.next();
    let folder = args
        .next()
        .map_or_else(|| root.join("examples/data/beir-tiny"), PathBuf::from);

    // A retriever is anything that indexes corpus texts and scores queries against them.
    let mut retriever: Box<dyn Retriever> = if first.as_deref() == Some("--bm25") {
        Box::new(Bm25Retriever::default())
    } else {
        let model = first.map_or_else(|| root.join("models/all-MiniLM-L6-v2"), PathBuf::from);
        // Without the model the example skips (recorded for `cargo xtask skips`); under CI=true
        // it fails naming the model instead.
        if infembed_testkit::require_model("eval_beir", &model).is_none() {
            return Ok(());
        }
        let config = EncoderConfig::default();
        Box::new(EncoderRetriever::from_dir(
            &model,
            Some(config),
            &Device::flex(),
        )?)
    };

    // Load the test split and run every judged query against the whole corpus.
    let set = infembed::data::load_beir(&folder, "test")?;
    let outcome = infembed::evaluate_retrieval(&set, retriever.as_mut(), &EvalConfig::default())?;
    let r = &outcome.report;
    println!(
        "{} | {} | {} queries, {} documents",
        r.name, r.retriever, r.n_queries, r.n_docs
    );
    println!("  nDCG@10     {:6.2}", r.ndcg_at_10);
    println!("  MAP@1000    {:6.2}", r.map_at_1000);
    println!("  MRR@10      {:6.2}", r.mrr_at_10);
    println!("  P@10        {:6.2}", r.p_at_10);
    println!("  Recall@100  {:6.2}", r.recall_at_100);
    Ok(())
}
