//! Tokenization with Hugging Face `tokenizers` (pure Rust), truncation with a count, and
//! padding to the batch's own longest row.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use burn::prelude::*;
use rayon::prelude::*;
use tokenizers::{Tokenizer, TruncationDirection, TruncationParams, TruncationStrategy};

use crate::error::{Error, Result};
use crate::models::BackboneInput;

/// Truncating copies of a tokenizer keyed by maximum length, shared between clones.
type TruncatingCache = Arc<Mutex<Vec<(usize, Arc<Tokenizer>)>>>;

/// A `tokenizer.json` tokenizer with the padding conventions of its backbone.
#[derive(Clone, Debug)]
pub struct TextTokenizer {
    inner: Tokenizer,
    /// Copies of `inner` with truncation set, one per maximum length used so far.
    truncating: TruncatingCache,
    path: PathBuf,
    pad_id: u32,
    pad_left: bool,
    lower_case: bool,
}

/// Token ids of a batch of texts, before padding.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenBatch {
    /// Token ids per text (special tokens included).
    pub ids: Vec<Vec<u32>>,
    /// Token type (segment) ids per text.
    pub type_ids: Vec<Vec<u32>>,
    /// How many texts were longer than the maximum length and were cut.
    pub truncated: usize,
}

impl TextTokenizer {
    /// Loads `dir/tokenizer.json`.
    ///
    /// `pad_id` is used for padding positions (their value never matters: they are masked);
    /// `pad_left` pads on the left (decoders); `lower_case` lower-cases texts first
    /// (sentence-transformers' `do_lower_case`).
    pub fn from_dir(dir: &Path, pad_id: u32, pad_left: bool, lower_case: bool) -> Result<Self> {
        let path = dir.join("tokenizer.json");
        if !path.exists() {
            return Err(Error::MissingFile {
                path,
                what: "Hugging Face tokenizer (tokenizer.json)",
            });
        }
        let mut inner = Tokenizer::from_file(&path).map_err(|source| Error::Tokenizer {
            context: format!("loading {}", path.display()),
            source,
        })?;
        inner.with_padding(None);
        Ok(Self {
            inner,
            truncating: Arc::default(),
            path,
            pad_id,
            pad_left,
            lower_case,
        })
    }

    /// The file this tokenizer was loaded from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether batches are padded on the left.
    pub fn pads_left(&self) -> bool {
        self.pad_left
    }

    /// The underlying Hugging Face tokenizer.
    pub fn inner(&self) -> &Tokenizer {
        &self.inner
    }

    /// Tokenizes `texts` (special tokens added), cutting each to at most `max_length`
    /// tokens (special tokens included, the end of the text is dropped, as
    /// sentence-transformers does) and counting the texts that were cut.
    pub fn tokenize(&self, texts: &[&str], max_length: usize) -> Result<TokenBatch> {
        let tok = self.truncating_at(max_length)?;
        let one = |text: &&str| -> Result<(Vec<u32>, Vec<u32>, bool)> {
            let lowered;
            let text: &str = if self.lower_case {
                lowered = text.to_lowercase();
                &lowered
            } else {
                text
            };
            let enc = tok.encode(text, true).map_err(|source| Error::Tokenizer {
                context: format!("encoding a text of {} bytes", text.len()),
                source,
            })?;
            Ok((
                enc.get_ids().to_vec(),
                enc.get_type_ids().to_vec(),
                !enc.get_overflowing().is_empty(),
            ))
        };
        // Each text is tokenized on its own, so the rows are the same however they are split
        // among threads; large batches (a corpus shard) use all of rayon's threads, which
        // matters most where the forward pass runs on a GPU and tokenizing is the host's
        // share of the work.
        let encoded: Vec<Result<_>> = if texts.len() >= Self::PARALLEL_FROM {
            texts
                .par_iter()
                .with_min_len(Self::PARALLEL_FROM / 4)
                .map(one)
                .collect()
        } else {
            texts.iter().map(one).collect()
        };
        let mut out = TokenBatch {
            ids: Vec::with_capacity(texts.len()),
            type_ids: Vec::with_capacity(texts.len()),
            truncated: 0,
        };
        // In input order, so that the error reported is the first text's that failed.
        for e in encoded {
            let (ids, type_ids, cut) = e?;
            out.truncated += usize::from(cut);
            out.ids.push(ids);
            out.type_ids.push(type_ids);
        }
        Ok(out)
    }

    /// Batches of at least this many texts are tokenized on rayon's threads.
    const PARALLEL_FROM: usize = 64;

    /// The tokenizer truncating at `max_length`, made once and cached.
    fn truncating_at(&self, max_length: usize) -> Result<Arc<Tokenizer>> {
        let mut cache = self
            .truncating
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some((_, t)) = cache.iter().find(|(m, _)| *m == max_length) {
            return Ok(Arc::clone(t));
        }
        let mut tok = self.inner.clone();
        tok.with_truncation(Some(TruncationParams {
            max_length,
            strategy: TruncationStrategy::LongestFirst,
            stride: 0,
            direction: TruncationDirection::Right,
        }))
        .map_err(|source| Error::Tokenizer {
            context: format!("setting max length {max_length}"),
            source,
        })?;
        let tok = Arc::new(tok);
        cache.push((max_length, Arc::clone(&tok)));
        Ok(tok)
    }

    /// Pads a batch to its own longest row and moves it to `device`.
    pub fn to_input(&self, batch: &TokenBatch, device: &Device) -> BackboneInput {
        BackboneInput::from_ids(
            &batch.ids,
            &batch.type_ids,
            self.pad_id,
            self.pad_left,
            device,
        )
    }
}
