//! Encoder throughput: embed 256 synthetic passages of ~128 tokens with all-MiniLM-L6-v2 on
//! the CPU (`flex`) backend, 32 per forward pass. Needs the model in
//! `models/all-MiniLM-L6-v2` (`cargo xtask fetch-model`) or `INFEMBED_MINILM_DIR`; prints a
//! SKIPPED line and measures nothing without it. Compare with
//! `scripts/encoder/bench_st.py` (sentence-transformers, CPU torch, 2 threads).
// criterion's macros generate undocumented functions.
#![allow(missing_docs)]

use std::path::PathBuf;

use burn::prelude::*;
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use infembed_benches::encoder_data::passages;
use infembed_encoder::TextEncoder;

fn model_dir() -> PathBuf {
    std::env::var_os("INFEMBED_MINILM_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../models/all-MiniLM-L6-v2")
        })
}

fn bench_encoder(c: &mut Criterion) {
    let dir = model_dir();
    if !dir.join("model.safetensors").exists() {
        eprintln!(
            "SKIPPED: encoder bench: all-MiniLM-L6-v2 not found at {} (cargo xtask fetch-model)",
            dir.display()
        );
        return;
    }
    let enc = TextEncoder::from_dir(&dir, &Device::flex()).expect("load MiniLM");
    let texts = passages(256);
    let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
    let tokens = enc
        .tokenizer
        .tokenize(&refs, enc.max_length)
        .expect("tokenize");
    let mean_len = tokens.ids.iter().map(Vec::len).sum::<usize>() as f64 / refs.len() as f64;
    eprintln!("encoder bench: 256 passages, mean {mean_len:.1} tokens, batch 32");

    let mut group = c.benchmark_group("encoder");
    group.sample_size(10);
    group.throughput(Throughput::Elements(refs.len() as u64));
    group.bench_function("minilm_l6_256x128_batch32", |b| {
        b.iter(|| {
            let e = enc.encode_sorted(&refs, 32).expect("encode").embeddings;
            // Force the computation and the read back, as a caller would.
            e.into_data()
        })
    });
    group.finish();
}

criterion_group!(benches, bench_encoder);
criterion_main!(benches);
