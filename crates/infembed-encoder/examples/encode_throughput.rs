//! Quick throughput check outside criterion: embeds the encoder bench's 256 passages
//! (~130 tokens each, generator shared with `benches/src/encoder_data.rs`) with a model
//! directory, 32 per forward pass, and prints passages/second (median of runs).
//!
//! `cargo run --release -p infembed-encoder --example encode_throughput -- [MODEL_DIR] [RUNS]`

#[path = "../../../benches/src/encoder_data.rs"]
mod encoder_data;

use std::time::Instant;

use burn::prelude::*;
use infembed_encoder::TextEncoder;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let dir = args
        .get(1)
        .cloned()
        .unwrap_or_else(|| "models/all-MiniLM-L6-v2".into());
    let runs: usize = args.get(2).map(|r| r.parse()).transpose()?.unwrap_or(5);
    let enc = TextEncoder::from_dir(&dir, &Device::flex())?;
    let texts = encoder_data::passages(256);
    let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
    let tokens = enc.tokenizer.tokenize(&refs, enc.max_length)?;
    let mean = tokens.ids.iter().map(Vec::len).sum::<usize>() as f64 / refs.len() as f64;
    println!("256 passages, mean {mean:.1} tokens, batch 32");
    let _ = enc.encode_sorted(&refs[..32], 32)?.embeddings.into_data();
    let mut times = Vec::new();
    for _ in 0..runs {
        let t = Instant::now();
        let _ = enc.encode_sorted(&refs, 32)?.embeddings.into_data();
        times.push(t.elapsed().as_secs_f64());
    }
    times.sort_by(f64::total_cmp);
    let med = times[times.len() / 2];
    println!(
        "infembed-encoder (flex): median {:.0} ms for 256 passages = {:.1} passages/s (runs: {:?} ms)",
        med * 1e3,
        256.0 / med,
        times.iter().map(|t| (t * 1e3).round()).collect::<Vec<_>>()
    );
    Ok(())
}
