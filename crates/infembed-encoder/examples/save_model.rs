//! Loads a model directory, saves it back with `TextEncoder::save`, and writes the Rust
//! embeddings of a few texts next to it (`rust_embeddings.json`) so that
//! `scripts/encoder/check_saved.py OUT` can compare them with sentence-transformers.
//!
//! `cargo run -p infembed-encoder --example save_model -- SRC_DIR OUT_DIR`

use burn::prelude::*;
use infembed_encoder::TextEncoder;

const TEXTS: [&str; 5] = [
    "the cat sat on the mat",
    "What is the capital of France?",
    "a",
    "Ünïcödé text — with dashes and CJK 検索",
    "find documents about the ocean and ships",
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let (src, out) = match args.as_slice() {
        [_, src, out] => (src, out),
        _ => return Err("usage: save_model SRC_DIR OUT_DIR".into()),
    };
    let enc = TextEncoder::from_dir(src, &Device::flex())?;
    enc.save(out)?;
    let saved = TextEncoder::from_dir(out, &Device::flex())?;
    let emb = saved.encode_to_vecs(&TEXTS, 8)?;
    let doc = serde_json::json!({ "texts": TEXTS, "embeddings": emb });
    std::fs::write(
        std::path::Path::new(out).join("rust_embeddings.json"),
        serde_json::to_string(&doc)?,
    )?;
    println!("saved {src} -> {out} (+ rust_embeddings.json)");
    Ok(())
}
