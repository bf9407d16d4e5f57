//! The one top-k routine: runs ([`crate::run_queries`]) and index searches
//! ([`crate::EmbeddingIndex::top_k`]) both rank with it.

use infembed_metrics::TieBreak;

/// The `k` best of `entries` (`(document index, score)` pairs, scores not NaN), best first:
/// score descending after [`TieBreak::key`], ties broken by `tie` on the documents' ids
/// (`ids[index]`), exactly as [`infembed_metrics::Ranking`] orders a run. Fewer than `k` when
/// there are fewer entries.
///
/// # Panics
/// When an entry's index is out of `ids`' bounds.
pub fn top_k(
    mut entries: Vec<(usize, f64)>,
    ids: &[String],
    k: usize,
    tie: TieBreak,
) -> Vec<(usize, f64)> {
    let cmp = |a: &(usize, f64), b: &(usize, f64)| {
        tie.compare(tie.key(a.1), &ids[a.0], tie.key(b.1), &ids[b.0])
    };
    if k == 0 {
        entries.clear();
        return entries;
    }
    if k < entries.len() {
        entries.select_nth_unstable_by(k - 1, cmp);
        entries.truncate(k);
    }
    entries.sort_by(cmp);
    entries
}
