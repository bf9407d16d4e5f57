//! Embed a small corpus and search it with an instruction and a query.
//!
//! ```text
//! cargo run -p infembed-examples --example embed_search -- [MODEL_DIR] [CORPUS.jsonl]
//! ```
//!
//! The corpus is JSON Lines, one `{"id": ..., "title": ..., "text": ...}` object per line
//! (`title` optional). Defaults: `models/all-MiniLM-L6-v2` and `examples/data/corpus.jsonl`.

use std::path::{Path, PathBuf};

use anyhow::Result;
use infembed::encoder::{DualEncoder, EncoderConfig};
use infembed::{Device, EmbeddingIndex};

fn main() -> Result<()> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut args = std::env::args().skip(1);
    let model = args
        .next()
        .map_or_else(|| root.join("models/all-MiniLM-L6-v2"), PathBuf::from);
    let corpus = args
        .next()
        .map_or_else(|| root.join("examples/data/corpus.jsonl"), PathBuf::from);
    // Without the model the example skips (recorded for `cargo xtask skips`); under CI=true
    // it fails naming the model instead.
    if infembed_testkit::require_model("embed_search", &model).is_none() {
        return Ok(());
    }

    // 1. Load the model. The default encoder config joins instruction and query into one
    //    text ("{query} {instruction}") and encodes passages on the same backbone.
    let encoder = DualEncoder::from_dir(&model, EncoderConfig::default(), &Device::flex())?;

    // 2. Read the corpus and embed it: one L2-normalized row per document.
    let records = infembed::read_texts(&corpus)?;
    let mut index = infembed::embed_passages(&encoder, &records)?;
    println!(
        "embedded {} documents of {} into {} dimensions",
        index.len(),
        corpus.display(),
        index.dim
    );

    // 3. Save the embeddings (the extension picks the format: .safetensors or .npy) and load
    //    them back, as a later program would.
    let saved = std::env::temp_dir().join(format!(
        "infembed-example-{}.safetensors",
        std::process::id()
    ));
    index.save(&saved)?;
    let index = EmbeddingIndex::load(&saved)?;
    std::fs::remove_file(&saved)?;

    // 4. Search: the same query under two instructions. The scores are dot products of
    //    normalized embeddings (cosine similarities); ties rank by document id, descending.
    let query = "how should I brew it";
    for instruction in [
        "I want to know about making tea, not coffee.",
        "I want to know about making coffee, not tea.",
    ] {
        println!("\nquery: {query:?}\ninstruction: {instruction:?}");
        for hit in infembed::search(&encoder, &index, instruction, query, 3)? {
            println!("  {}. {:<10} {:.4}", hit.rank, hit.id, hit.score);
        }
    }
    Ok(())
}
