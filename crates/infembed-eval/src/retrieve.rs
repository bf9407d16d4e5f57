//! Retrieval: anything that scores query strings against a corpus, and turning its scores into runs.

use std::collections::HashMap;

use infembed_metrics::{Run, TieBreak};

use infembed_data::QueryTemplate;

use crate::error::{Error, Result};
use crate::lexical::{Bm25Config, Bm25Index, Stemmer, StopWords};
use crate::scan::Running;
use crate::topk::top_k;

/// One query as a retriever sees it: the bare query and, separately, its instruction. How the two
/// are combined (one templated string, or encoded apart and combined by cross-attention) is the
/// retriever's business.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueryRequest {
    /// The query id (for runs).
    pub id: String,
    /// The bare query text.
    pub query: String,
    /// The instruction, if any.
    pub instruction: Option<String>,
}

/// A retrieval model seen from the evaluation harness: it indexes corpus texts once, then scores
/// batches of queries against every indexed document.
///
/// Higher scores mean more relevant. Implementations may batch, cache or parallelise internally;
/// the harness calls [`Retriever::score`] with batches of at most [`QUERY_BATCH`] queries.
pub trait Retriever {
    /// A short name for reports and run tags.
    fn name(&self) -> String;
    /// Indexes `corpus` (replacing any previous index); document `i` is `corpus[i]`.
    fn index(&mut self, corpus: &[&str]) -> Result<()>;
    /// Indexes a corpus whose document `i` has id `ids[i]` and text `texts[i]`. The harness calls
    /// this; the default ignores the ids and calls [`Retriever::index`]. A retriever that holds
    /// precomputed document representations (an [`crate::EmbeddingIndex`]) looks them up by id
    /// instead of encoding the texts.
    fn index_documents(&mut self, ids: &[String], texts: &[&str]) -> Result<()> {
        let _ = ids;
        self.index(texts)
    }
    /// Scores each query against every indexed document: one vector of corpus length per query.
    fn score(&mut self, queries: &[QueryRequest]) -> Result<Vec<Vec<f32>>>;
    /// Scores each query against the indexed documents block by block: `visit(first, rows)` gets
    /// the scores of documents `first..first + len` (one row of `len` scores per query), blocks
    /// in corpus order and covering it. The harness uses this when it keeps only the top of each
    /// ranking, so that no `[queries x corpus]` matrix has to exist at once; the default hands
    /// over [`Retriever::score`]'s rows as one block.
    fn score_blocks(
        &mut self,
        queries: &[QueryRequest],
        visit: &mut dyn FnMut(usize, Vec<Vec<f32>>) -> Result<()>,
    ) -> Result<()> {
        let rows = self.score(queries)?;
        visit(0, rows)
    }
}

/// How many queries the harness hands a [`Retriever`] at once.
pub const QUERY_BATCH: usize = 64;

/// BM25 as a [`Retriever`]: an (instruction, query) pair is scored as the one string its
/// [`QueryTemplate`] makes of it.
#[derive(Debug, Clone, Default)]
pub struct Bm25Retriever {
    config: Bm25Config,
    template: QueryTemplate,
    index: Option<Bm25Index>,
}

impl Bm25Retriever {
    /// A BM25 retriever with the given parameters and query template.
    pub fn new(config: Bm25Config, template: QueryTemplate) -> Self {
        Self {
            config,
            template,
            index: None,
        }
    }
}

impl Retriever for Bm25Retriever {
    fn name(&self) -> String {
        let Bm25Config {
            k1,
            b,
            stemmer,
            stopwords,
        } = self.config;
        let mut name = format!("bm25(k1={k1},b={b}");
        if stopwords != StopWords::None {
            name.push_str(&format!(",stopwords={stopwords}"));
        }
        if stemmer != Stemmer::None {
            name.push_str(&format!(",stemmer={stemmer}"));
        }
        name.push(')');
        name
    }

    fn index(&mut self, corpus: &[&str]) -> Result<()> {
        self.index = Some(Bm25Index::new(corpus.iter().copied(), self.config));
        Ok(())
    }

    fn score(&mut self, queries: &[QueryRequest]) -> Result<Vec<Vec<f32>>> {
        let index = self.index.as_ref().ok_or_else(|| Error::Empty {
            what: "the BM25 index (score called before index)".to_string(),
        })?;
        Ok(queries
            .iter()
            .map(|q| index.score_all(&self.template.render(&q.query, q.instruction.as_deref())))
            .collect())
    }
}

/// Which documents a query's run keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Depth {
    /// Every corpus document (exact ranks over the whole corpus, as the held-out protocol asks).
    All,
    /// The `k` best documents under the tie rule.
    TopK(usize),
}

/// Scores `queries` against a corpus of `doc_ids` already indexed by `retriever`, and
/// returns a run. With `candidates`, each query is scored only over its listed documents
/// (re-ranking, as FollowIR does with `top_ranked`); queries without a list get the whole corpus.
///
/// Top-k selection is [`top_k`] under `tie` (score descending, ties by document id), so the kept
/// documents are exactly the first `k` of the full ranking.
pub fn run_queries(
    retriever: &mut dyn Retriever,
    doc_ids: &[String],
    queries: &[QueryRequest],
    depth: Depth,
    candidates: Option<&HashMap<String, Vec<String>>>,
    tie: TieBreak,
) -> Result<Run> {
    let position: HashMap<&str, usize> = doc_ids
        .iter()
        .enumerate()
        .map(|(i, d)| (d.as_str(), i))
        .collect();
    let mut run = Run::new();
    run.set_tag(retriever.name());
    for chunk in queries.chunks(QUERY_BATCH) {
        let reranked = candidates.is_some_and(|c| chunk.iter().any(|q| c.contains_key(&q.id)));
        if let Depth::TopK(k) = depth
            && k > 0
            && !reranked
        {
            for (request, entries) in chunk
                .iter()
                .zip(top_in_blocks(retriever, doc_ids, chunk, k, tie)?)
            {
                run.insert_query(
                    request.id.clone(),
                    entries.iter().map(|&(i, s)| (&doc_ids[i], s)),
                )?;
            }
            continue;
        }
        let scores = retriever.score(chunk)?;
        if scores.len() != chunk.len() {
            return Err(Error::ScoreRows {
                retriever: retriever.name(),
                expected: chunk.len(),
                got: scores.len(),
            });
        }
        for (qi, (request, row)) in chunk.iter().zip(scores).enumerate() {
            let qid = &request.id;
            if row.len() != doc_ids.len() {
                return Err(Error::ScoreShape {
                    retriever: retriever.name(),
                    query: qi,
                    expected: doc_ids.len(),
                    got: row.len(),
                });
            }
            let mut entries: Vec<(usize, f64)> = match candidates.and_then(|c| c.get(qid)) {
                Some(list) => list
                    .iter()
                    .map(|d| {
                        position
                            .get(d.as_str())
                            .map(|&i| (i, f64::from(row[i])))
                            .ok_or_else(|| Error::UnknownCandidate {
                                query: qid.clone(),
                                doc: d.clone(),
                            })
                    })
                    .collect::<Result<_>>()?,
                None => row
                    .iter()
                    .enumerate()
                    .map(|(i, &s)| (i, f64::from(s)))
                    .collect(),
            };
            if let Some(&(i, _)) = entries.iter().find(|(_, s)| s.is_nan()) {
                return Err(Error::NanScore {
                    retriever: retriever.name(),
                    query: qid.clone(),
                    doc: doc_ids[i].clone(),
                });
            }
            if let Depth::TopK(k) = depth
                && k < entries.len()
            {
                entries = top_k(entries, doc_ids, k, tie);
            }
            run.insert_query(qid.clone(), entries.iter().map(|&(i, s)| (&doc_ids[i], s)))?;
        }
    }
    Ok(run)
}

/// The best `k` documents of each query of `chunk` (exactly the head of the full ranking under
/// `tie`), kept while the retriever hands over its scores block by block.
fn top_in_blocks(
    retriever: &mut dyn Retriever,
    doc_ids: &[String],
    chunk: &[QueryRequest],
    k: usize,
    tie: TieBreak,
) -> Result<Vec<Vec<(usize, f64)>>> {
    let name = retriever.name();
    let mut running: Vec<Running> = chunk.iter().map(|_| Running::new()).collect();
    let mut next = 0usize;
    retriever.score_blocks(chunk, &mut |first, rows| {
        if rows.len() != chunk.len() {
            return Err(Error::ScoreRows {
                retriever: name.clone(),
                expected: chunk.len(),
                got: rows.len(),
            });
        }
        for (qi, row) in rows.iter().enumerate() {
            // Blocks must tile the corpus in order: anything else is a wrong-length row.
            if first != next || first + row.len() > doc_ids.len() {
                return Err(Error::ScoreShape {
                    retriever: name.clone(),
                    query: qi,
                    expected: doc_ids.len(),
                    got: first + row.len(),
                });
            }
            if let Some(j) = row.iter().position(|s| s.is_nan()) {
                return Err(Error::NanScore {
                    retriever: name.clone(),
                    query: chunk[qi].id.clone(),
                    doc: doc_ids[first + j].clone(),
                });
            }
            running[qi].offer(first, row, k, doc_ids, tie);
        }
        next = first + rows.first().map_or(0, Vec::len);
        Ok(())
    })?;
    if next != doc_ids.len() {
        return Err(Error::ScoreShape {
            retriever: name,
            query: 0,
            expected: doc_ids.len(),
            got: next,
        });
    }
    Ok(running
        .into_iter()
        .map(|r| r.finish(k, doc_ids, tie))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Scores document i as `table[query][i]`, where the query text is its index.
    struct Table(Vec<Vec<f32>>);

    impl Retriever for Table {
        fn name(&self) -> String {
            "table".into()
        }
        fn index(&mut self, _: &[&str]) -> Result<()> {
            Ok(())
        }
        fn score(&mut self, queries: &[QueryRequest]) -> Result<Vec<Vec<f32>>> {
            Ok(queries
                .iter()
                .map(|q| self.0[q.query.parse::<usize>().unwrap()].clone())
                .collect())
        }
    }

    fn ids(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("d{i}")).collect()
    }

    #[test]
    fn top_k_keeps_exactly_the_head_of_the_full_ranking() {
        let scores = vec![vec![0.5, 0.9, 0.5, 0.1, 0.5, 0.7]];
        let docs = ids(6);
        let q = vec![QueryRequest {
            id: "q".into(),
            query: "0".into(),
            instruction: None,
        }];
        let full = run_queries(
            &mut Table(scores.clone()),
            &docs,
            &q,
            Depth::All,
            None,
            TieBreak::TrecEval,
        )
        .unwrap();
        let full_rank: Vec<String> = full
            .query("q")
            .unwrap()
            .ranking(TieBreak::TrecEval)
            .iter()
            .map(|r| r.doc.to_string())
            .collect();
        for k in 0..=6 {
            let top = run_queries(
                &mut Table(scores.clone()),
                &docs,
                &q,
                Depth::TopK(k),
                None,
                TieBreak::TrecEval,
            )
            .unwrap();
            let mut kept: Vec<String> = top
                .query("q")
                .unwrap()
                .iter()
                .map(|(d, _)| d.to_string())
                .collect();
            kept.sort();
            let mut want = full_rank[..k].to_vec();
            want.sort();
            assert_eq!(kept, want, "k = {k}");
        }
    }

    #[test]
    fn candidates_restrict_and_unknown_candidates_are_errors() {
        let docs = ids(3);
        let q = vec![QueryRequest {
            id: "q".into(),
            query: "0".into(),
            instruction: None,
        }];
        let cands = HashMap::from([("q".to_string(), vec!["d2".to_string(), "d0".to_string()])]);
        let run = run_queries(
            &mut Table(vec![vec![1.0, 2.0, 3.0]]),
            &docs,
            &q,
            Depth::All,
            Some(&cands),
            TieBreak::TrecEval,
        )
        .unwrap();
        assert_eq!(run.query("q").unwrap().len(), 2);
        assert_eq!(run.query("q").unwrap().score_of("d1"), None);
        let bad = HashMap::from([("q".to_string(), vec!["d9".to_string()])]);
        let err = run_queries(
            &mut Table(vec![vec![1.0, 2.0, 3.0]]),
            &docs,
            &q,
            Depth::All,
            Some(&bad),
            TieBreak::TrecEval,
        )
        .unwrap_err();
        assert!(matches!(err, Error::UnknownCandidate { .. }), "{err}");
    }

    #[test]
    fn wrong_score_shapes_and_nan_are_errors() {
        let q = vec![QueryRequest {
            id: "q".into(),
            query: "0".into(),
            instruction: None,
        }];
        let err = run_queries(
            &mut Table(vec![vec![1.0]]),
            &ids(2),
            &q,
            Depth::All,
            None,
            TieBreak::TrecEval,
        )
        .unwrap_err();
        assert!(
            matches!(
                err,
                Error::ScoreShape {
                    expected: 2,
                    got: 1,
                    ..
                }
            ),
            "{err}"
        );
        let err = run_queries(
            &mut Table(vec![vec![f32::NAN]]),
            &ids(1),
            &q,
            Depth::All,
            None,
            TieBreak::TrecEval,
        )
        .unwrap_err();
        assert!(matches!(err, Error::NanScore { .. }), "{err}");
    }

    /// [`Table`] handing its scores over in blocks of `.1` documents (`.2` shifts the second
    /// block's start, to test the tiling check).
    struct Blocks(Vec<Vec<f32>>, usize, usize);

    impl Retriever for Blocks {
        fn name(&self) -> String {
            "blocks".into()
        }
        fn index(&mut self, _: &[&str]) -> Result<()> {
            Ok(())
        }
        fn score(&mut self, queries: &[QueryRequest]) -> Result<Vec<Vec<f32>>> {
            Table(self.0.clone()).score(queries)
        }
        fn score_blocks(
            &mut self,
            queries: &[QueryRequest],
            visit: &mut dyn FnMut(usize, Vec<Vec<f32>>) -> Result<()>,
        ) -> Result<()> {
            let rows = self.score(queries)?;
            let n = rows[0].len();
            let mut first = 0;
            while first < n {
                let end = (first + self.1).min(n);
                let at = if first > 0 { first + self.2 } else { first };
                visit(at, rows.iter().map(|r| r[first..end].to_vec()).collect())?;
                first = end;
            }
            Ok(())
        }
    }

    use proptest::strategy::Strategy;

    proptest::proptest! {
        /// Scores handed over in blocks give exactly the run of the whole rows: the same
        /// documents with the same scores, ties included (scores from a small set, so many tie).
        #[test]
        fn blocks_give_the_run_of_whole_rows(
            rows in (1usize..40).prop_flat_map(|n| {
                proptest::collection::vec(proptest::collection::vec(0u8..6, n), 1..4)
            }),
            block in 1usize..9,
            k in 1usize..12,
            trec in proptest::bool::ANY,
        ) {
            let tie = if trec { TieBreak::TrecEval } else { TieBreak::DocIdDescending };
            let scores: Vec<Vec<f32>> =
                rows.iter().map(|r| r.iter().map(|&v| f32::from(v) / 4.0).collect()).collect();
            let docs = ids(scores[0].len());
            let queries: Vec<QueryRequest> = (0..scores.len())
                .map(|i| QueryRequest { id: format!("q{i}"), query: i.to_string(), instruction: None })
                .collect();
            let whole = {
                // The reference: every score, then the one top-k routine.
                let mut run = Run::new();
                for (q, row) in queries.iter().zip(&scores) {
                    let entries = top_k(
                        row.iter().enumerate().map(|(i, &s)| (i, f64::from(s))).collect(),
                        &docs,
                        k,
                        tie,
                    );
                    run.insert_query(q.id.clone(), entries.iter().map(|&(i, s)| (&docs[i], s))).unwrap();
                }
                run
            };
            let blocked = run_queries(&mut Blocks(scores.clone(), block, 0), &docs, &queries, Depth::TopK(k), None, tie).unwrap();
            for q in &queries {
                let a: Vec<(String, f64)> = whole.query(&q.id).unwrap().ranking(tie).iter().map(|r| (r.doc.to_string(), r.score)).collect();
                let b: Vec<(String, f64)> = blocked.query(&q.id).unwrap().ranking(tie).iter().map(|r| (r.doc.to_string(), r.score)).collect();
                proptest::prop_assert_eq!(a, b);
            }
        }
    }

    #[test]
    fn blocks_that_skip_or_hold_nan_are_errors() {
        let q = vec![QueryRequest {
            id: "q".into(),
            query: "0".into(),
            instruction: None,
        }];
        let mut scores = vec![(0..10).map(|i| i as f32).collect::<Vec<f32>>()];
        let err = run_queries(
            &mut Blocks(scores.clone(), 4, 1),
            &ids(10),
            &q,
            Depth::TopK(3),
            None,
            TieBreak::TrecEval,
        )
        .unwrap_err();
        assert!(matches!(err, Error::ScoreShape { .. }), "{err}");
        scores[0][7] = f32::NAN;
        let err = run_queries(
            &mut Blocks(scores, 4, 0),
            &ids(10),
            &q,
            Depth::TopK(3),
            None,
            TieBreak::TrecEval,
        )
        .unwrap_err();
        assert!(
            matches!(&err, Error::NanScore { doc, .. } if doc == "d7"),
            "{err}"
        );
    }
}
