//! [`TextEncoder`]: a tokenizer, a backbone and a pooling, loaded from a local Hugging Face /
//! sentence-transformers directory, turning texts into embeddings.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use burn::prelude::*;

use crate::config::SentenceTransformersConfig;
use crate::error::{Error, Result};
use crate::head::{DenseLayer, apply_dense, load_dense, output_width};
use crate::models::{ArchitectureConfig, Backbone};
use crate::pool::{Pooling, l2_normalize, pool};
use crate::tokenize::{TextTokenizer, TokenBatch};

/// The maximum length of a checkpoint without `max_seq_length` (capped by its position
/// limit).
const DEFAULT_MAX_LENGTH: usize = 512;

/// A tower's maximum length: `explicit`, else the checkpoint's `max_seq_length`, else 512,
/// never more than the model's position limit.
pub(crate) fn max_length(
    explicit: Option<usize>,
    st: &SentenceTransformersConfig,
    arch: &ArchitectureConfig,
) -> usize {
    explicit
        .or(st.max_seq_length)
        .unwrap_or(DEFAULT_MAX_LENGTH)
        .min(arch.max_positions())
}

/// Embeddings of a batch of texts.
#[derive(Debug, Clone)]
pub struct Encoded {
    /// `[B, d]`, one row per input text in input order (L2-normalized when the encoder
    /// normalizes).
    pub embeddings: Tensor<2>,
    /// How many of the texts were cut at the maximum length.
    pub truncated: usize,
}

/// Token-level states of a batch of texts (for the token-level interaction).
#[derive(Debug, Clone)]
pub struct TokenStates {
    /// Last-layer hidden states `[B, L, d]` (`L` = this batch's longest row).
    pub hidden: Tensor<3>,
    /// `[B, L]`, 1.0 on real tokens, 0.0 on padding.
    pub mask: Tensor<2>,
    /// How many of the texts were cut at the maximum length.
    pub truncated: usize,
}

/// Counts truncated inputs and warns (through `log`) the first time any is cut.
#[derive(Debug, Clone, Default)]
pub(crate) struct TruncationCounter {
    total: Arc<AtomicUsize>,
    warned: Arc<AtomicBool>,
}

impl TruncationCounter {
    pub(crate) fn add(&self, n: usize, max_length: usize) {
        if n == 0 {
            return;
        }
        self.total.fetch_add(n, Ordering::Relaxed);
        if !self.warned.swap(true, Ordering::Relaxed) {
            log::warn!(
                "{n} input(s) longer than {max_length} tokens were truncated (further \
                 truncations are counted, see `truncated_total()`)"
            );
        }
    }

    pub(crate) fn total(&self) -> usize {
        self.total.load(Ordering::Relaxed)
    }
}

/// What every model directory holds besides its weights: the architecture (`config.json`), the
/// sentence-transformers settings and the tokenizer. The one reader of a model directory, for
/// [`TextEncoder::from_dir`] and [`DualEncoder::from_dir`](crate::DualEncoder::from_dir).
pub(crate) struct ModelDir {
    pub(crate) arch: ArchitectureConfig,
    pub(crate) st_config: SentenceTransformersConfig,
    pub(crate) tokenizer: TextTokenizer,
}

impl ModelDir {
    /// Reads `dir`'s configs and tokenizer; [`Error::MissingFile`] when `dir` is no directory.
    pub(crate) fn read(dir: &Path) -> Result<Self> {
        if !dir.is_dir() {
            return Err(Error::MissingFile {
                path: dir.to_path_buf(),
                what: "model directory",
            });
        }
        let arch = ArchitectureConfig::from_dir(dir)?;
        let st_config = SentenceTransformersConfig::from_dir(dir)?;
        let tokenizer = TextTokenizer::from_dir(
            dir,
            arch.pad_token_id(),
            arch.pads_left(),
            st_config.do_lower_case,
        )?;
        Ok(Self {
            arch,
            st_config,
            tokenizer,
        })
    }
}

/// A complete text-to-vector pipeline loaded from a local model directory.
///
/// The directory must hold `config.json`, `tokenizer.json` and `model.safetensors`; when it
/// also holds sentence-transformers files (`modules.json`, the pooling module's
/// `config.json`, `sentence_bert_config.json`) they choose pooling, normalization and the
/// maximum length. Nothing is downloaded: a missing file is [`Error::MissingFile`].
#[derive(Debug, Clone)]
pub struct TextEncoder {
    /// The transformer.
    pub backbone: Backbone,
    /// The pipeline's `Dense` modules after pooling (usually none).
    pub dense: Vec<DenseLayer>,
    /// The tokenizer (with the backbone's padding side).
    pub tokenizer: TextTokenizer,
    /// The architecture and its hyper-parameters (`config.json`).
    pub arch: ArchitectureConfig,
    /// What the sentence-transformers files said.
    pub st_config: SentenceTransformersConfig,
    /// The pooling in use.
    pub pooling: Pooling,
    /// Whether embeddings are L2-normalized ([`SentenceTransformersConfig::unit_vectors`]).
    pub normalize: bool,
    /// Maximum tokens per text (special tokens included); longer texts are truncated.
    pub max_length: usize,
    /// Prepended to every text: the checkpoint's default prompt (`default_prompt_name` in
    /// `config_sentence_transformers.json`), as sentence-transformers' `encode` does; empty
    /// when there is none.
    pub prompt: String,
    /// The directory the model came from.
    pub source_dir: PathBuf,
    device: Device,
    truncations: TruncationCounter,
}

impl TextEncoder {
    /// Loads a model directory on `device`.
    ///
    /// Pooling defaults (without sentence-transformers files) to `mean` for encoders and
    /// `last` for decoders, normalization to on, the maximum length to the checkpoint's
    /// `max_seq_length`, else 512; either is capped by the model's position limit.
    pub fn from_dir(dir: impl AsRef<Path>, device: &Device) -> Result<Self> {
        let dir = dir.as_ref();
        let ModelDir {
            arch,
            st_config,
            tokenizer,
        } = ModelDir::read(dir)?;
        let backbone = Backbone::load(&arch, dir, device)?;
        let dense = load_dense(&st_config.dense, arch.hidden_size(), device)?;
        let pooling = st_config.pooling.unwrap_or_else(|| arch.default_pooling());
        let normalize = st_config.unit_vectors();
        let max_length = max_length(None, &st_config, &arch);
        let prompt = st_config
            .default_prompt_name
            .as_ref()
            .and_then(|n| st_config.prompts.get(n))
            .cloned()
            .unwrap_or_default();
        Ok(Self {
            backbone,
            dense,
            prompt,
            tokenizer,
            arch,
            st_config,
            pooling,
            normalize,
            max_length,
            source_dir: dir.to_path_buf(),
            device: device.clone(),
            truncations: TruncationCounter::default(),
        })
    }

    /// The device the weights live on.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// Width `d` of the embeddings (the last `Dense` module's output, else the backbone's).
    pub fn dim(&self) -> usize {
        output_width(&self.dense, &self.arch)
    }

    /// Total number of texts truncated by this encoder (and its clones) so far.
    pub fn truncated_total(&self) -> usize {
        self.truncations.total()
    }

    /// The text-to-vector pipeline of this encoder at its maximum length.
    pub(crate) fn embedder(&self) -> Embedder<'_> {
        Embedder {
            backbone: &self.backbone,
            dense: &self.dense,
            tokenizer: &self.tokenizer,
            device: &self.device,
            pooling: self.pooling,
            max_length: self.max_length,
            counter: &self.truncations,
        }
    }

    /// The texts with the default prompt in front.
    fn prompted(&self, texts: &[&str]) -> Vec<String> {
        texts
            .iter()
            .map(|t| format!("{}{t}", self.prompt))
            .collect()
    }

    /// Token-level last-layer states of `texts` (one forward pass for the whole slice).
    pub fn token_states(&self, texts: &[&str]) -> Result<TokenStates> {
        let texts = self.prompted(texts);
        let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
        self.embedder().token_states(&refs)
    }

    /// Embeds `texts` in one forward pass (padded to the longest of them).
    pub fn encode(&self, texts: &[&str]) -> Result<Encoded> {
        let texts = self.prompted(texts);
        let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
        let (pooled, truncated) = self.embedder().pooled_batch(&refs)?;
        let embeddings = if self.normalize {
            l2_normalize(pooled)
        } else {
            pooled
        };
        Ok(Encoded {
            embeddings,
            truncated,
        })
    }

    /// Embeds any number of texts, `batch_size` at a time after sorting them by token
    /// length (so each batch pads little), and returns `[texts.len(), d]` in input order.
    pub fn encode_sorted(&self, texts: &[&str], batch_size: usize) -> Result<Encoded> {
        let texts = self.prompted(texts);
        let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
        let (pooled, truncated) = self.embedder().pooled_sorted(&refs, batch_size)?;
        let embeddings = if self.normalize {
            l2_normalize(pooled)
        } else {
            pooled
        };
        Ok(Encoded {
            embeddings,
            truncated,
        })
    }

    /// Like [`encode_sorted`](Self::encode_sorted), returning host vectors in input order.
    pub fn encode_to_vecs(&self, texts: &[&str], batch_size: usize) -> Result<Vec<Vec<f32>>> {
        let e = self.encode_sorted(texts, batch_size)?.embeddings;
        tensor_rows(e)
    }
}

/// Reads a `[N, d]` tensor back as `N` host vectors.
pub fn tensor_rows(t: Tensor<2>) -> Result<Vec<Vec<f32>>> {
    let [_, d] = t.dims();
    let flat = t
        .into_data()
        .convert::<f32>()
        .try_into_vec::<f32>()
        .map_err(|e| Error::Readback(format!("{e:?}")))?;
    Ok(flat.chunks(d.max(1)).map(<[f32]>::to_vec).collect())
}

/// Borrowed pieces of one tower: what turns texts into token states or pooled vectors.
pub(crate) struct Embedder<'a> {
    pub(crate) backbone: &'a Backbone,
    /// Applied to the pooled vectors (`pooled_*`), not to token states.
    pub(crate) dense: &'a [DenseLayer],
    pub(crate) tokenizer: &'a TextTokenizer,
    pub(crate) device: &'a Device,
    pub(crate) pooling: Pooling,
    pub(crate) max_length: usize,
    pub(crate) counter: &'a TruncationCounter,
}

impl Embedder<'_> {
    /// Tokenizes (counting truncations) without padding.
    pub(crate) fn tokenize(&self, texts: &[&str]) -> Result<TokenBatch> {
        if texts.is_empty() {
            return Err(Error::InvalidBatch("no texts to encode".into()));
        }
        let batch = self.tokenizer.tokenize(texts, self.max_length)?;
        self.counter.add(batch.truncated, self.max_length);
        Ok(batch)
    }

    /// Last-layer states for `texts` in one forward pass.
    pub(crate) fn token_states(&self, texts: &[&str]) -> Result<TokenStates> {
        let batch = self.tokenize(texts)?;
        let input = self.tokenizer.to_input(&batch, self.device);
        let hidden = self.backbone.forward(&input);
        Ok(TokenStates {
            hidden,
            mask: input.attention_mask,
            truncated: batch.truncated,
        })
    }

    /// Pooled (not normalized) vectors `[B, d]` for `texts` in one forward pass, through the
    /// `Dense` modules when there are any.
    pub(crate) fn pooled_batch(&self, texts: &[&str]) -> Result<(Tensor<2>, usize)> {
        let s = self.token_states(texts)?;
        let pooled = pool(s.hidden, s.mask, self.pooling);
        Ok((apply_dense(self.dense, pooled), s.truncated))
    }

    /// Pooled (not normalized) vectors `[N, d]` in input order, computed `batch_size` texts
    /// at a time in order of token length.
    pub(crate) fn pooled_sorted(
        &self,
        texts: &[&str],
        batch_size: usize,
    ) -> Result<(Tensor<2>, usize)> {
        let start = std::time::Instant::now();
        let batch = self.tokenize(texts)?;
        Ok((
            self.pooled_tokens(&batch, batch_size, start),
            batch.truncated,
        ))
    }

    /// Pooled vectors of texts tokenized by [`tokenize`](Self::tokenize) (with this tower's
    /// maximum length, or another tower's that shares this one's backbone, tokenizer and
    /// dense layers), as [`pooled_sorted`](Self::pooled_sorted). `start`: when the work
    /// began, for the debug timing line.
    pub(crate) fn pooled_tokens(
        &self,
        batch: &TokenBatch,
        batch_size: usize,
        start: std::time::Instant,
    ) -> Tensor<2> {
        let tokenized = start.elapsed();
        let n = batch.ids.len();
        let mut order: Vec<usize> = (0..n).collect();
        order.sort_by_key(|&i| std::cmp::Reverse(batch.ids[i].len()));
        let forward = |chunk: &[usize]| {
            let ids: Vec<Vec<u32>> = chunk.iter().map(|&i| batch.ids[i].clone()).collect();
            let types: Vec<Vec<u32>> = chunk.iter().map(|&i| batch.type_ids[i].clone()).collect();
            let sub = TokenBatch {
                ids,
                type_ids: types,
                truncated: 0,
            };
            let input = self.tokenizer.to_input(&sub, self.device);
            let hidden = self.backbone.forward(&input);
            apply_dense(self.dense, pool(hidden, input.attention_mask, self.pooling))
        };
        let chunks: Vec<&[usize]> = order.chunks(batch_size.max(1)).collect();
        let mut parts = Vec::with_capacity(chunks.len());
        if self.device.is_autodiff() {
            // Training: one pass after another, so dropout draws stay in a fixed order.
            parts.extend(chunks.iter().map(|c| forward(c)));
        } else {
            let mut progress = EncodeProgress::new(n);
            // Inference: two batches in flight. The CPU backend runs element-wise ops on
            // the calling thread and matrix products on all threads, so a second batch
            // fills the core the first leaves idle.
            for pair in chunks.chunks(2) {
                match pair {
                    [a, b] => {
                        let (x, y) = rayon::join(|| forward(a), || forward(b));
                        parts.push(x);
                        parts.push(y);
                    }
                    _ => parts.extend(pair.iter().map(|c| forward(c))),
                }
                progress.advance(pair.iter().map(|c| c.len()).sum());
            }
            // where the host's time goes (a GPU device computes after this returns)
            log::debug!(
                "encoded {n} texts in {} batches: tokenized in {:.1} ms, inputs made and \
                 forward passes issued in {:.1} ms",
                chunks.len(),
                tokenized.as_secs_f64() * 1e3,
                (start.elapsed() - tokenized).as_secs_f64() * 1e3
            );
        }
        let sorted = if parts.len() == 1 {
            parts.pop().expect("one part")
        } else {
            Tensor::cat(parts, 0)
        };
        // Row `order[k]` of the input sits at position k of `sorted`; invert.
        let mut inverse = vec![0i64; n];
        for (k, &i) in order.iter().enumerate() {
            inverse[i] = k as i64;
        }
        let inverse = Tensor::<1, Int>::from_data(TensorData::new(inverse, [n]), self.device);
        sorted.select(0, inverse)
    }
}

/// Progress of a long encoding pass, logged (`info`) at most every [`EncodeProgress::EVERY`]
/// with the rate and the time left; short passes log nothing.
struct EncodeProgress {
    total: usize,
    done: usize,
    start: std::time::Instant,
    last: std::time::Instant,
}

impl EncodeProgress {
    const EVERY: std::time::Duration = std::time::Duration::from_secs(10);

    fn new(total: usize) -> Self {
        let now = std::time::Instant::now();
        Self {
            total,
            done: 0,
            start: now,
            last: now,
        }
    }

    fn advance(&mut self, n: usize) {
        self.done += n;
        let now = std::time::Instant::now();
        if now - self.last < Self::EVERY || self.done >= self.total {
            return;
        }
        self.last = now;
        let secs = (now - self.start).as_secs_f64();
        let rate = self.done as f64 / secs.max(1e-9);
        let left = (self.total - self.done) as f64 / rate.max(1e-9);
        log::info!(
            "encoded {}/{} texts ({:.0}/s, about {:.0} s left)",
            self.done,
            self.total,
            rate,
            left
        );
    }
}
