//! Dense retrieval with an [`infembed_encoder::DualEncoder`]: passages and instruction-aware queries
//! are embedded and scored by their dot product: cosine similarity for unit vectors (every model
//! but a dot-product one without `Normalize`), the model's own dot product otherwise.

use std::path::Path;

use std::collections::HashMap;

use burn::tensor::{Device, Tensor, TensorData};
use infembed_encoder::{DualEncoder, EncoderConfig, tensor_rows};

use crate::error::{Error, Result};
use crate::index::EmbeddingIndex;
use crate::load::{load_encoder, model_name};
use crate::retrieve::{QueryRequest, Retriever};

/// A [`Retriever`] over a dual encoder. The corpus embeddings stay on the encoder's device;
/// each batch of queries is scored against all of them with one matrix product.
pub struct EncoderRetriever {
    encoder: DualEncoder,
    name: String,
    corpus: Option<Tensor<2>>,
    /// Precomputed passage embeddings, looked up by id instead of encoding the corpus.
    precomputed: Option<EmbeddingIndex>,
    /// Documents per block of [`Retriever::score_blocks`] ([`CORPUS_BLOCK`]; smaller in tests).
    block: usize,
}

impl std::fmt::Debug for EncoderRetriever {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EncoderRetriever")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl EncoderRetriever {
    /// Wraps a loaded encoder; `name` appears in reports.
    pub fn new(encoder: DualEncoder, name: impl Into<String>) -> Self {
        Self {
            encoder,
            name: name.into(),
            corpus: None,
            precomputed: None,
            block: CORPUS_BLOCK,
        }
    }

    /// Takes the corpus side from `index` (written by `infembed embed` from the same corpus with
    /// this model) instead of encoding the corpus: [`Retriever::index_documents`] then looks each
    /// document up by id, in the corpus's order. The queries are still encoded.
    ///
    /// # Errors
    /// [`Error::DimensionMismatch`] when the index's dimension is not the encoder's.
    pub fn with_index(mut self, index: EmbeddingIndex) -> Result<Self> {
        index.check_dim(self.encoder.dim(), &self.name)?;
        self.precomputed = Some(index);
        Ok(self)
    }

    /// Loads a model directory (a Hugging Face / sentence-transformers checkpoint, or one saved by
    /// infembed) onto `device` with [`load_encoder`]: with `config` as given, or, with `None`, the
    /// directory's own config when it carries one. The report name is [`model_name`].
    ///
    /// # Errors
    /// As [`load_encoder`]: a missing directory or file (named), a bad config, an unsupported
    /// architecture.
    pub fn from_dir(dir: &Path, config: Option<EncoderConfig>, device: &Device) -> Result<Self> {
        let encoder = load_encoder(dir, config, device)?;
        Ok(Self::new(encoder, model_name(dir)))
    }

    /// The wrapped encoder.
    pub fn encoder(&self) -> &DualEncoder {
        &self.encoder
    }

    /// The queries' embeddings `[queries, d]` (an absent instruction is the empty one).
    fn encode(&self, queries: &[QueryRequest]) -> Result<Tensor<2>> {
        let pairs: Vec<(&str, &str)> = queries
            .iter()
            .map(|q| (q.instruction.as_deref().unwrap_or(""), q.query.as_str()))
            .collect();
        Ok(self.encoder.encode_queries(&pairs)?.embeddings)
    }
}

impl Retriever for EncoderRetriever {
    fn name(&self) -> String {
        self.name.clone()
    }

    fn index(&mut self, corpus: &[&str]) -> Result<()> {
        self.corpus = Some(self.encoder.encode_passages(corpus)?.embeddings);
        Ok(())
    }

    fn index_documents(&mut self, ids: &[String], texts: &[&str]) -> Result<()> {
        let Some(index) = &self.precomputed else {
            return self.index(texts);
        };
        let row_of: HashMap<&str, usize> = index
            .ids
            .iter()
            .enumerate()
            .map(|(row, id)| (id.as_str(), row))
            .collect();
        let missing: Vec<&String> = ids
            .iter()
            .filter(|id| !row_of.contains_key(id.as_str()))
            .collect();
        if let Some(first) = missing.first() {
            return Err(Error::IndexMissingDocument {
                index: index.source_path(),
                id: first.to_string(),
                missing: missing.len(),
                total: ids.len(),
            });
        }
        let dim = index.dim;
        let mut rows = Vec::with_capacity(ids.len() * dim);
        for id in ids {
            let row = row_of[id.as_str()];
            let values = index.row(row);
            // A mapped index is not scanned when opened: its rows are checked as they are used.
            if values.iter().any(|v| !v.is_finite()) {
                return Err(Error::IndexFormat {
                    path: index.source_path(),
                    problem: format!("non-finite value in row {row} (id `{id}`)"),
                });
            }
            rows.extend_from_slice(&values);
        }
        let data = TensorData::new(rows, [ids.len(), dim]);
        self.corpus = Some(Tensor::<2>::from_data(data, self.encoder.device()));
        Ok(())
    }

    fn score(&mut self, queries: &[QueryRequest]) -> Result<Vec<Vec<f32>>> {
        let corpus = self.corpus.as_ref().ok_or_else(|| Error::Empty {
            what: "the dense index (score called before index)".to_string(),
        })?;
        if queries.is_empty() {
            return Ok(Vec::new());
        }
        let q = self.encode(queries)?;
        Ok(tensor_rows(q.matmul(corpus.clone().transpose()))?)
    }

    /// The scores of blocks of [`CORPUS_BLOCK`] documents, each one matrix product on the
    /// device: at most `queries x CORPUS_BLOCK` scores come to the host at once. A corpus of
    /// one block is scored exactly as [`Retriever::score`] scores it.
    fn score_blocks(
        &mut self,
        queries: &[QueryRequest],
        visit: &mut dyn FnMut(usize, Vec<Vec<f32>>) -> Result<()>,
    ) -> Result<()> {
        let corpus = self.corpus.as_ref().ok_or_else(|| Error::Empty {
            what: "the dense index (score called before index)".to_string(),
        })?;
        if queries.is_empty() {
            return Ok(());
        }
        let n = corpus.dims()[0];
        if n <= self.block {
            return visit(0, self.score(queries)?);
        }
        let q = self.encode(queries)?;
        let mut first = 0;
        while first < n {
            let end = (first + self.block).min(n);
            let block = corpus.clone().narrow(0, first, end - first);
            visit(first, tensor_rows(q.clone().matmul(block.transpose()))?)?;
            first = end;
        }
        Ok(())
    }
}

/// Documents per block when [`EncoderRetriever`] scores a large corpus block by block
/// ([`Retriever::score_blocks`]): 64 queries x 32,768 documents are 8 MiB of scores.
pub const CORPUS_BLOCK: usize = 32_768;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::retrieve::{Depth, run_queries};
    use infembed_metrics::TieBreak;

    /// Blocks of 7 documents give the run that one block gives: the same documents, the same
    /// scores, bit for bit.
    #[test]
    fn scoring_in_blocks_gives_the_run_of_one_block() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../infembed-encoder/tests/fixtures/tiny-bert");
        let encoder =
            DualEncoder::from_dir(&dir, EncoderConfig::default(), &Device::flex()).unwrap();
        let texts: Vec<String> = (0..30)
            .map(|i| format!("passage {i} about topic {} and {}", i % 4, i % 3))
            .collect();
        let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
        let ids: Vec<String> = (0..30).map(|i| format!("d{i:02}")).collect();
        let queries: Vec<QueryRequest> = (0..5)
            .map(|i| QueryRequest {
                id: format!("q{i}"),
                query: format!("topic {i}"),
                instruction: Some("find passages".into()),
            })
            .collect();
        let run = |block: usize| {
            let mut r = EncoderRetriever::new(encoder.clone(), "tiny");
            r.block = block;
            r.index(&refs).unwrap();
            run_queries(
                &mut r,
                &ids,
                &queries,
                Depth::TopK(6),
                None,
                TieBreak::TrecEval,
            )
            .unwrap()
        };
        let (one, blocks) = (run(usize::MAX), run(7));
        for q in &queries {
            let list = |r: &infembed_metrics::Run| -> Vec<(String, u64)> {
                r.query(&q.id)
                    .unwrap()
                    .ranking(TieBreak::TrecEval)
                    .iter()
                    .map(|d| (d.doc.to_string(), d.score.to_bits()))
                    .collect()
            };
            assert_eq!(list(&one).len(), 6);
            assert_eq!(list(&one), list(&blocks), "{}", q.id);
        }
    }
}
