//! Synthetic qrels and runs for the metrics benchmarks and the pytrec_eval comparison.
//!
//! Algorithm (deterministic for a seed; ChaCha8 generator):
//! - Documents are `D0000000`..`D0999999` (a corpus of 1,000,000), queries `Q00000`, `Q00001`, ...
//! - Per query, in query order: `docs_per_query` distinct documents drawn uniformly from the
//!   corpus, each with a score uniform in [0, 1) rounded to 4 decimals (so ties are common and the
//!   tie rule matters); then `judged_per_query` distinct judged documents, each drawn from the
//!   query's ranked documents with probability 2/3 and from the whole corpus otherwise, labelled
//!   0 (p = 0.5), 1 (0.3), 2 (0.15) or 3 (0.05).

use std::collections::HashSet;

use infembed_metrics::{Qrels, Run};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// Queries in the benchmark's data set.
pub const NUM_QUERIES: usize = 10_000;
/// Ranked documents per query.
pub const DOCS_PER_QUERY: usize = 1_000;
/// Judged documents per query.
pub const JUDGED_PER_QUERY: usize = 30;
/// The benchmark's seed.
pub const SEED: u64 = 0x7ec_e7a1;

const CORPUS: u32 = 1_000_000;

/// A generated qrels/run pair.
#[derive(Debug, Clone)]
pub struct MetricsData {
    /// The judgements.
    pub qrels: Qrels,
    /// The run.
    pub run: Run,
}

/// Generates the data set described in the module docs.
pub fn generate(
    num_queries: usize,
    docs_per_query: usize,
    judged_per_query: usize,
    seed: u64,
) -> MetricsData {
    assert!(docs_per_query as u32 <= CORPUS && judged_per_query as u32 <= CORPUS);
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut run = Run::new();
    let mut qrels_entries: Vec<(String, String, i32)> = Vec::new();
    let mut seen = HashSet::new();
    for q in 0..num_queries {
        let query = format!("Q{q:05}");
        seen.clear();
        let mut docs: Vec<(u32, f64)> = Vec::with_capacity(docs_per_query);
        while docs.len() < docs_per_query {
            let d = rng.random_range(0..CORPUS);
            if seen.insert(d) {
                let score = (rng.random::<f64>() * 10_000.0).round() / 10_000.0;
                docs.push((d, score));
            }
        }
        seen.clear();
        let mut judged = 0;
        while judged < judged_per_query {
            let d = if !docs.is_empty() && rng.random_range(0..3) < 2 {
                docs[rng.random_range(0..docs.len())].0
            } else {
                rng.random_range(0..CORPUS)
            };
            if !seen.insert(d) {
                continue;
            }
            let u: f64 = rng.random();
            let label = if u < 0.5 {
                0
            } else if u < 0.8 {
                1
            } else if u < 0.95 {
                2
            } else {
                3
            };
            qrels_entries.push((query.clone(), doc_id(d), label));
            judged += 1;
        }
        run.insert_query(query, docs.iter().map(|&(d, s)| (doc_id(d), s)))
            .expect("generated documents are distinct");
    }
    let qrels = Qrels::from_entries(qrels_entries).expect("generated judgements are distinct");
    MetricsData { qrels, run }
}

/// The benchmark's data set: [`NUM_QUERIES`] x [`DOCS_PER_QUERY`], [`JUDGED_PER_QUERY`] judged.
pub fn benchmark_data() -> MetricsData {
    generate(NUM_QUERIES, DOCS_PER_QUERY, JUDGED_PER_QUERY, SEED)
}

fn doc_id(d: u32) -> String {
    format!("D{d:07}")
}
