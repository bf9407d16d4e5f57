//! Hard negatives mined for a training file with a (zero-shot) model: `infembed mine` and
//! [`mine_hard_negatives`].
//!
//! Every distinct passage of the training records is a candidate
//! ([`infembed_data::mining_candidates`]); each record's (I+, Q+) is embedded on the query side
//! as training embeds it, the candidates on the passage side, both as unit vectors (cosine).
//! An exact search takes each record's best `2 * per_record + 16` candidates; the filter of
//! [`infembed_data::mined`] (never a passage labelled relevant to the pair, never the record's
//! own P1- / P2-, never above `max_relative` times the positive's score) keeps the best
//! `per_record`. A record whose top hits the filter thins below `per_record`, or whose last
//! kept score ties the search's cut-off (the search breaks ties by id, the filter by candidate
//! order), is scored against every candidate instead, so the result is the same as scoring
//! every pair.
//!
//! The file it writes is read by training (`data.mined_negatives`, `batch.mined_per_record`).

use std::collections::HashMap;

use infembed_data::{
    HardNegativeFilter, InfIrRecord, MinedPassage, MiningOptions, mining_candidates,
};
use infembed_encoder::DualEncoder;
use infembed_eval::{TextRecord, embed_passages, embed_queries};

use crate::error::Result;

/// What [`mine_hard_negatives`] found.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct MinedNegatives {
    /// Per record, its negatives (best first).
    pub lists: Vec<Vec<MinedPassage>>,
    /// Distinct candidate passages.
    pub candidates: usize,
    /// Per record, the mining model's score of its positive (cosine of (I+, Q+) and P+).
    pub positive_scores: Vec<f32>,
    /// Records scored against every candidate because their top hits were filtered away.
    pub full_scans: usize,
}

/// Mines `options.per_record` hard negatives for each of `records` with `encoder` (see the
/// [module docs](self)).
///
/// # Errors
/// The encoder's and the index's errors (e.g. no records).
pub fn mine_hard_negatives(
    encoder: &DualEncoder,
    records: &[InfIrRecord],
    options: MiningOptions,
) -> Result<MinedNegatives> {
    let encoder = encoder.clone().with_cosine_scoring();
    let candidates = mining_candidates(records);
    let passages: Vec<TextRecord> = candidates
        .iter()
        .map(|c| TextRecord {
            id: c.id.clone(),
            title: String::new(),
            text: c.text.to_string(),
            instruction: None,
        })
        .collect();
    log::info!(
        "mining: embedding {} candidate passages and {} queries",
        passages.len(),
        records.len()
    );
    let index = embed_passages(&encoder, &passages)?;
    let queries: Vec<TextRecord> = records
        .iter()
        .enumerate()
        .map(|(r, rec)| TextRecord {
            id: format!("r{r}"),
            title: String::new(),
            text: rec.query_positive.to_string(),
            instruction: Some(rec.instruction_positive.to_string()),
        })
        .collect();
    let queries = embed_queries(&encoder, &queries)?;
    let dim = queries.dim;
    let query_values = queries.embeddings();
    let position: HashMap<&str, usize> = candidates
        .iter()
        .enumerate()
        .map(|(i, c)| (&*c.text, i))
        .collect();
    let dot = |a: &[f32], b: &[f32]| a.iter().zip(b).map(|(x, y)| x * y).sum::<f32>();
    let positive_scores: Vec<f32> = records
        .iter()
        .enumerate()
        .map(|(r, rec)| {
            let row = position[&*rec.document_positive];
            dot(&query_values[r * dim..(r + 1) * dim], &index.row(row))
        })
        .collect();

    let filter = HardNegativeFilter::new(records, &candidates, options);
    let k = options
        .per_record
        .saturating_mul(2)
        .saturating_add(16)
        .min(candidates.len());
    let top = index.search_batch(&query_values, k)?;
    let mut full_scans = 0;
    let mut lists = Vec::with_capacity(records.len());
    for (r, hits) in top.iter().enumerate() {
        let hits: Vec<(usize, f32)> = hits.iter().map(|h| (h.row, h.score)).collect();
        let mut list = filter.select(r, &hits, positive_scores[r]);
        let cut = hits.last().map(|h| h.1);
        let tied = list.last().is_some_and(|m| Some(m.score) == cut);
        if (list.len() < options.per_record || tied) && k < candidates.len() {
            full_scans += 1;
            let all: Vec<(usize, f32)> = index
                .scores(&query_values[r * dim..(r + 1) * dim])?
                .into_iter()
                .enumerate()
                .collect();
            list = filter.select(r, &all, positive_scores[r]);
        }
        lists.push(list);
    }
    Ok(MinedNegatives {
        lists,
        candidates: candidates.len(),
        positive_scores,
        full_scans,
    })
}
