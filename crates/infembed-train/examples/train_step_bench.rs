//! Training-step throughput and peak memory (developer-run; numbers go to
//! docs/benchmarks.md). Runs optimizer steps of the quickstart recipe on a fixed batch: the
//! first 4 records of the InF-IR sample (12 rows), Interaction I with K = 5 instruction
//! negatives per row chosen by a fixed rule (rows i+1..i+5 mod 12, the same rule as
//! `scripts/train/bench_torch.py`), multivariate (P, I) loss, max lengths 128/256, AdamW.
//!
//!     cargo run --release -p infembed-train --example train_step_bench -- \
//!         [MODEL_DIR] [STEPS] [GRAD_CACHE_CHUNK] [--bf16]
//!
//! `--bf16` trains with bf16 products (`dtype = "bf16"`: a CPU with AVX512-BF16).
//!
//! Prints seconds per step (mean over the steps after a first warm-up step), rows/s, and the
//! process's peak resident memory (VmHWM).

use std::time::Instant;

use anyhow::{Context, Result};
use burn::module::Module;
use burn::tensor::Device;
use infembed_data::{ReadMode, read_records, record_rows};
use infembed_encoder::{DualEncoder, EncoderConfig, Precision};
use infembed_losses::{LossConfig, ObjectiveKind, Variable};
use infembed_train::{TrainBatch, adamw, clip_global_norm, full_batch_step, grad_cache_step};

fn peak_rss_mib() -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb / 1024.0)
}

fn main() -> Result<()> {
    let mut args: Vec<String> = std::env::args().collect();
    let bf16 = args.iter().any(|a| a == "--bf16");
    args.retain(|a| a != "--bf16");
    let model = args
        .get(1)
        .map_or("models/all-MiniLM-L6-v2", String::as_str);
    let steps: usize = args.get(2).map_or(Ok(6), |s| s.parse())?;
    let chunk: Option<usize> = args.get(3).map(|s| s.parse()).transpose()?;
    let records = read_records("data/inf-ir-sample/train.jsonl", ReadMode::Strict)?.records;
    let rows: Vec<_> = (0..4).flat_map(|r| record_rows(r, &records[r])).collect();
    let n = rows.len();
    let k = 5;
    let batch = TrainBatch {
        rows,
        instruction_rows: (0..n)
            .map(|i| (1..=k).map(|j| (i + j) % n).collect())
            .collect(),
        dropout_seed: 0,
        extra_passages: Vec::new(),
        extra_excluded: vec![Vec::new(); n],
    };
    let config = EncoderConfig {
        query_max_length: Some(128),
        passage_max_length: Some(256),
        ..EncoderConfig::default()
    };
    let plain = Device::flex();
    let loaded = DualEncoder::from_dir(model, config, &plain)
        .with_context(|| format!("{model} (run `cargo xtask fetch-model`)"))?;
    let mut encoder = loaded.with_model(loaded.model().clone().train(), &plain.autodiff());
    if bf16 {
        encoder.set_training_precision(Precision::Bf16)?;
    }
    let loss = LossConfig::new(ObjectiveKind::Multivariate, &[Variable::P, Variable::I]).init()?;
    let mut optim = adamw(&Default::default());
    let mut times = Vec::new();
    let mut texts = 0;
    for step in 0..=steps {
        let t = Instant::now();
        let out = match chunk {
            Some(c) => grad_cache_step(&encoder, &batch, &loss, true, 1.0, c)?,
            None => full_batch_step(&encoder, &batch, &loss, true, 1.0)?,
        };
        let t_fb = t.elapsed().as_secs_f64();
        let mut grads = out.grads;
        clip_global_norm(encoder.model(), &mut grads, 1.0);
        let t_clip = t.elapsed().as_secs_f64();
        let model = optim.step(5e-5, encoder.model().clone(), grads);
        encoder.set_model(model);
        let secs = t.elapsed().as_secs_f64();
        texts = out.texts;
        eprintln!(
            "step {step}: loss {:.4}, {secs:.2} s (fwd+bwd {t_fb:.2}, clip {:.2}, optim {:.2})",
            out.loss,
            t_clip - t_fb,
            secs - t_clip
        );
        if step > 0 {
            times.push(secs);
        }
    }
    let mean = times.iter().sum::<f64>() / times.len().max(1) as f64;
    println!(
        "infembed-train step (MiniLM-L6, 12 rows, {texts} distinct texts, {}, {}): {mean:.2} \
         s/step, {:.1} rows/s, peak RSS {:.0} MiB",
        chunk.map_or("full batch".to_string(), |c| format!("GradCache chunk {c}")),
        if bf16 { "bf16 products" } else { "f32" },
        n as f64 / mean,
        peak_rss_mib().unwrap_or(f64::NAN)
    );
    Ok(())
}
