//! Dense retrieval with an [`infembed_encoder::DualEncoder`]: passages and instruction-aware queries
//! are embedded (L2-normalised) and scored by their dot product, i.e. cosine similarity.

use std::path::Path;

use burn::tensor::{Device, Tensor};
use infembed_encoder::{DualEncoder, EncoderConfig, tensor_rows};

use crate::error::{Error, Result};
use crate::retrieve::{QueryRequest, Retriever};

/// A [`Retriever`] over a dual encoder. The corpus embeddings stay on the encoder's device;
/// each batch of queries is scored against all of them with one matrix product.
pub struct EncoderRetriever {
    encoder: DualEncoder,
    name: String,
    corpus: Option<Tensor<2>>,
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
        }
    }

    /// Loads a model directory (a Hugging Face / sentence-transformers checkpoint, or one saved by
    /// infembed) onto `device`. The report name is the directory's last component.
    ///
    /// # Errors
    /// The encoder's: a missing file (named), a bad config, unsupported architecture.
    pub fn from_dir(dir: &Path, config: EncoderConfig, device: &Device) -> Result<Self> {
        let encoder = DualEncoder::from_dir(dir, config, device)?;
        let name = dir.file_name().map_or_else(
            || dir.display().to_string(),
            |n| n.to_string_lossy().into_owned(),
        );
        Ok(Self::new(encoder, name))
    }

    /// The wrapped encoder.
    pub fn encoder(&self) -> &DualEncoder {
        &self.encoder
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

    fn score(&mut self, queries: &[QueryRequest]) -> Result<Vec<Vec<f32>>> {
        let corpus = self.corpus.as_ref().ok_or_else(|| Error::Empty {
            what: "the dense index (score called before index)".to_string(),
        })?;
        if queries.is_empty() {
            return Ok(Vec::new());
        }
        let pairs: Vec<(&str, &str)> = queries
            .iter()
            .map(|q| (q.instruction.as_deref().unwrap_or(""), q.query.as_str()))
            .collect();
        let q = self.encoder.encode_queries(&pairs)?.embeddings;
        Ok(tensor_rows(q.matmul(corpus.clone().transpose()))?)
    }
}
