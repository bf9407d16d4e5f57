//! The index at corpus scale (issue 15's benchmark; docs/benchmarks.md): a synthetic index of
//! `N` random unit vectors of dimension `d` (seeded), written, loaded and searched with
//! `EmbeddingIndex`, each phase in its own process so that its peak memory is its own.
//!
//! ```text
//! cargo run --release -p infembed-benches --example index_scale -- write  FILE N D
//! cargo run --release -p infembed-benches --example index_scale -- search FILE QUERIES K
//! ```
//!
//! Prints one JSON line per phase: seconds, the process's peak resident memory (VmHWM), the
//! matrix's size.

use std::time::Instant;

use infembed_eval::EmbeddingIndex;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

fn peak_rss_mib() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<f64>().ok())
        })
        .map_or(f64::NAN, |kb| kb / 1024.0)
}

fn unit_rows(rng: &mut ChaCha8Rng, n: usize, d: usize) -> Vec<f32> {
    let mut out = Vec::with_capacity(n * d);
    for _ in 0..n {
        let start = out.len();
        out.extend((0..d).map(|_| rng.random::<f32>() * 2.0 - 1.0));
        let norm = out[start..].iter().map(|v| v * v).sum::<f32>().sqrt();
        for v in &mut out[start..] {
            *v /= norm;
        }
    }
    out
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let usage = "usage: index_scale write FILE N D | search FILE QUERIES K";
    let arg = |i: usize| args.get(i).ok_or_else(|| anyhow::anyhow!(usage));
    match arg(0)?.as_str() {
        "write" => {
            let (file, n, d): (&String, usize, usize) =
                (arg(1)?, arg(2)?.parse()?, arg(3)?.parse()?);
            let start = Instant::now();
            let mut rng = ChaCha8Rng::seed_from_u64(7);
            let rows = unit_rows(&mut rng, n, d);
            let ids = (0..n).map(|i| format!("doc{i}")).collect();
            let mut index = EmbeddingIndex::new(ids, rows, d, "synthetic")?;
            let generated = start.elapsed().as_secs_f64();
            let start = Instant::now();
            index.save(file)?;
            println!(
                "{{\"phase\": \"write\", \"n\": {n}, \"d\": {d}, \"matrix_mib\": {:.0}, \
                 \"generate_s\": {generated:.1}, \"save_s\": {:.1}, \"peak_rss_mib\": {:.0}}}",
                (n * d * 4) as f64 / 1048576.0,
                start.elapsed().as_secs_f64(),
                peak_rss_mib()
            );
        }
        "search" => {
            let (file, queries, k): (&String, usize, usize) =
                (arg(1)?, arg(2)?.parse()?, arg(3)?.parse()?);
            let start = Instant::now();
            let index = EmbeddingIndex::load(file)?;
            let load_s = start.elapsed().as_secs_f64();
            let load_rss = peak_rss_mib();
            let mut rng = ChaCha8Rng::seed_from_u64(11);
            let qs = unit_rows(&mut rng, queries, index.dim);
            let start = Instant::now();
            let mut checksum = 0.0f64;
            for q in qs.chunks_exact(index.dim) {
                let hits = index.top_k(q, k)?;
                checksum += f64::from(hits[0].score);
            }
            let search_s = start.elapsed().as_secs_f64();
            println!(
                "{{\"phase\": \"load+search\", \"n\": {}, \"d\": {}, \"load_s\": {load_s:.1}, \
                 \"peak_rss_after_load_mib\": {load_rss:.0}, \"queries\": {queries}, \"k\": {k}, \
                 \"search_s\": {search_s:.2}, \"ms_per_query\": {:.1}, \
                 \"peak_rss_mib\": {:.0}, \"checksum\": {checksum:.6}}}",
                index.len(),
                index.dim,
                1000.0 * search_s / queries as f64,
                peak_rss_mib()
            );
        }
        _ => anyhow::bail!(usage),
    }
    Ok(())
}
