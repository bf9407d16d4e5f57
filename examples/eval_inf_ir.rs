//! Evaluate a model on the held-out instruction-following test built from an InF-IR-format file
//! (`data/inf-ir-sample/README.md` describes the protocol): every record's positive query is run
//! with its original and with its negative instruction over the corpus of all the records'
//! passages; p-MRR measures whether the changed instruction pushes the no-longer-relevant
//! passage down.
//!
//! ```text
//! cargo run -p infembed-examples --example eval_inf_ir -- [MODEL_DIR] [FILE.jsonl] [N]
//! ```
//!
//! Defaults: `models/all-MiniLM-L6-v2`, `data/inf-ir-sample/dev.jsonl`, the first N = 8 records.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use infembed::data::{ReadMode, build_heldout, read_records};
use infembed::encoder::EncoderConfig;
use infembed::{Device, EncoderRetriever, EvalConfig};

fn main() -> Result<()> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut args = std::env::args().skip(1);
    let model = args
        .next()
        .map_or_else(|| root.join("models/all-MiniLM-L6-v2"), PathBuf::from);
    let file = args
        .next()
        .map_or_else(|| root.join("data/inf-ir-sample/dev.jsonl"), PathBuf::from);
    let n: usize = match args.next() {
        Some(n) => n.parse().context("N must be a number of records")?,
        None => 8,
    };
    // Without the model the example skips (recorded for `cargo xtask skips`); under CI=true
    // it fails naming the model instead.
    if infembed_testkit::require_model("eval_inf_ir", &model).is_none() {
        return Ok(());
    }

    // Read the records (strict: the first bad record is an error naming its line and field)
    // and build the FollowIR-style test from the first n of them, without distractors.
    let mut records = read_records(&file, ReadMode::Strict)?.records;
    records.truncate(n);
    let set = build_heldout("inf-ir", &records, &[])?;

    let mut retriever =
        EncoderRetriever::from_dir(&model, Some(EncoderConfig::default()), &Device::flex())?;
    let report = infembed::evaluate_followir(&set, &mut retriever, &EvalConfig::default())?.report;
    println!(
        "{} | {} | {} queries, {} documents",
        report.name, report.retriever, report.n_queries, report.n_docs
    );
    println!("  p-MRR               {:7.2}", report.p_mrr);
    if let Some(acc) = report.pairwise_accuracy {
        println!("  pairwise accuracy   {acc:7.2}");
    }
    println!("  nDCG@10 (original)  {:7.2}", report.ndcg_at_10);
    println!("  MRR@10  (original)  {:7.2}", report.mrr_at_10);
    Ok(())
}
