//! The index at corpus scale (issue 15's benchmark; docs/benchmarks.md): a synthetic index of
//! `N` random unit vectors of dimension `d` (seeded), written, opened (memory-mapped) or loaded,
//! and searched exactly with `EmbeddingIndex::search_batch`, each phase in its own process so
//! that its peak memory is its own. `scripts/bench/index_scale.sh` runs the phases and faiss's
//! `IndexFlatIP` on the same vectors and queries, back to back.
//!
//! ```text
//! index_scale write   FILE N D f32|f16      the index, streamed to FILE (.safetensors or .npy)
//! index_scale queries FILE.npy Q D          Q query vectors (another seed)
//! index_scale search  FILE QUERIES.npy K OUT [--load]
//!                                           top-K of every query, written to OUT as TSV
//!                                           (query, rank, doc, score); --load reads the matrix
//!                                           into memory instead of mapping it
//! ```
//!
//! Prints one JSON line per phase: seconds, the process's peak resident memory (VmHWM, which
//! counts the mapped file's pages the search touched), the matrix's size.

use std::io::Write;
use std::time::Instant;

use infembed_eval::{EmbeddingIndex, IndexDtype, IndexWriter};
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

/// `n` rows of `d` values uniform in [-1, 1), each scaled to unit length.
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
    let usage = "usage: index_scale write FILE N D f32|f16 | queries FILE.npy Q D | \
                 search FILE QUERIES.npy K OUT [--load]";
    let arg = |i: usize| args.get(i).ok_or_else(|| anyhow::anyhow!(usage));
    match arg(0)?.as_str() {
        "write" => {
            let (file, n, d): (&String, usize, usize) =
                (arg(1)?, arg(2)?.parse()?, arg(3)?.parse()?);
            let dtype: IndexDtype = arg(4)?.parse().map_err(anyhow::Error::msg)?;
            let start = Instant::now();
            let ids: Vec<String> = (0..n).map(|i| format!("doc{i}")).collect();
            let mut writer = IndexWriter::create(file.as_ref(), &ids, d, "synthetic", dtype)?;
            let mut rng = ChaCha8Rng::seed_from_u64(7);
            let mut done = 0;
            while done < n {
                let rows = (n - done).min(1 << 16);
                writer.write_rows(&unit_rows(&mut rng, rows, d))?;
                done += rows;
            }
            writer.finish()?;
            println!(
                "{{\"phase\": \"write\", \"n\": {n}, \"d\": {d}, \"dtype\": \"{dtype}\", \
                 \"matrix_mib\": {:.0}, \"write_s\": {:.1}, \"peak_rss_mib\": {:.0}}}",
                (n * d * dtype.width()) as f64 / 1048576.0,
                start.elapsed().as_secs_f64(),
                peak_rss_mib()
            );
        }
        "queries" => {
            let (file, q, d): (&String, usize, usize) =
                (arg(1)?, arg(2)?.parse()?, arg(3)?.parse()?);
            let mut rng = ChaCha8Rng::seed_from_u64(11);
            let ids = (0..q).map(|i| format!("q{i}")).collect();
            EmbeddingIndex::new(ids, unit_rows(&mut rng, q, d), d, "synthetic")?.save(file)?;
        }
        "search" => {
            let (file, queries, k, out): (&String, &String, usize, &String) =
                (arg(1)?, arg(2)?, arg(3)?.parse()?, arg(4)?);
            let load = args.iter().any(|a| a == "--load");
            let start = Instant::now();
            let index = if load {
                EmbeddingIndex::load(file)?
            } else {
                EmbeddingIndex::open(file)?
            };
            let open_s = start.elapsed().as_secs_f64();
            let open_rss = peak_rss_mib();
            let queries = EmbeddingIndex::load(queries)?;
            let start = Instant::now();
            let hits = index.search_batch(&queries.embeddings(), k)?;
            let search_s = start.elapsed().as_secs_f64();
            let mut w = std::io::BufWriter::new(std::fs::File::create(out)?);
            for (qid, hits) in queries.ids.iter().zip(&hits) {
                for h in hits {
                    writeln!(w, "{qid}\t{}\t{}\t{}", h.rank, h.id, h.score)?;
                }
            }
            w.flush()?;
            println!(
                "{{\"phase\": \"search\", \"tool\": \"infembed\", \"n\": {}, \"d\": {}, \
                 \"dtype\": \"{}\", \"mode\": \"{}\", \"matrix_mib\": {:.0}, \"open_s\": {open_s:.2}, \
                 \"rss_after_open_mib\": {open_rss:.0}, \"queries\": {}, \"k\": {k}, \
                 \"search_s\": {search_s:.2}, \"peak_rss_mib\": {:.0}, \"threads\": {}}}",
                index.len(),
                index.dim,
                index.dtype(),
                if index.is_mapped() { "mmap" } else { "read" },
                (index.len() * index.dim * index.dtype().width()) as f64 / 1048576.0,
                queries.len(),
                peak_rss_mib(),
                std::thread::available_parallelism().map_or(0, usize::from),
            );
        }
        _ => anyhow::bail!(usage),
    }
    Ok(())
}
