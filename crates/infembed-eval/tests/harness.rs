//! The evaluation harness against a naive recomputation of the held-out protocol
//! (data/inf-ir-sample/README.md) from raw BM25 scores: ranks over the whole corpus with ties by
//! document id descending, p-MRR, MRR@10 and pairwise instruction accuracy.

use std::path::PathBuf;

use infembed_data::{QueryTemplate, ReadMode, build_heldout, read_distractors, read_records};
use infembed_eval::{Bm25Config, Bm25Index};
use infembed_eval::{Bm25Retriever, EvalConfig, evaluate_followir};

fn sample(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../data/inf-ir-sample")
        .join(name)
}

/// 1-based rank of `target` among `scores`: documents with a higher score, or an equal score and a
/// larger id, come first.
fn naive_rank(scores: &[f32], ids: &[String], target: usize) -> usize {
    1 + (0..scores.len())
        .filter(|&j| {
            scores[j] > scores[target] || (scores[j] == scores[target] && ids[j] > ids[target])
        })
        .count()
}

#[test]
fn followir_report_matches_a_naive_recomputation() {
    let records = read_records(sample("dev.jsonl"), ReadMode::Strict)
        .unwrap()
        .records;
    let distractors = read_distractors(sample("distractors.jsonl")).unwrap();
    let distractors = &distractors[..200];
    let set = build_heldout("dev", &records, distractors).unwrap();
    let template = QueryTemplate::default();

    let mut retriever = Bm25Retriever::new(Bm25Config::default(), template.clone());
    let report = evaluate_followir(&set, &mut retriever, &EvalConfig::default())
        .unwrap()
        .report;

    let ids: Vec<String> = set.corpus.iter().map(|d| d.id.clone()).collect();
    let index = Bm25Index::new(
        set.corpus.iter().map(|d| d.text.as_str()),
        Bm25Config::default(),
    );
    let (mut pmrr, mut mrr10, mut pairwise) = (0.0, 0.0, 0usize);
    for (r, rec) in records.iter().enumerate() {
        let pos = ids.iter().position(|d| *d == format!("r{r}-pos")).unwrap();
        let n1 = ids.iter().position(|d| *d == format!("r{r}-n1")).unwrap();
        let og = index.score_all(&format!(
            "{} {}",
            rec.query_positive, rec.instruction_positive
        ));
        let ch = index.score_all(&format!(
            "{} {}",
            rec.query_positive, rec.instruction_negative
        ));
        let (o, n) = (
            naive_rank(&og, &ids, pos) as f64,
            naive_rank(&ch, &ids, pos) as f64,
        );
        pmrr += if o >= n { n / o - 1.0 } else { 1.0 - o / n };
        if o <= 10.0 {
            mrr10 += 1.0 / o;
        }
        pairwise += usize::from(og[pos] > og[n1] && ch[n1] > ch[pos]);
    }
    let n = records.len() as f64;
    assert_eq!(report.n_queries, records.len());
    assert_eq!(report.n_docs, 3 * records.len() + distractors.len());
    assert!(
        (report.p_mrr - 100.0 * pmrr / n).abs() < 1e-9,
        "{} vs {}",
        report.p_mrr,
        pmrr / n
    );
    assert!((report.mrr_at_10 - 100.0 * mrr10 / n).abs() < 1e-9);
    let acc = report
        .pairwise_accuracy
        .expect("held-out sets have the pairwise shape");
    assert!((acc - 100.0 * pairwise as f64 / n).abs() < 1e-9);
    // With one relevant document, MAP equals the reciprocal rank of that document.
    assert!(report.map_at_1000 >= report.mrr_at_10 - 1e-9);
}
