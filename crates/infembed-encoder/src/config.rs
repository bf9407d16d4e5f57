//! Reading and writing JSON configuration files, and the sentence-transformers ones
//! (`modules.json`, `1_Pooling/config.json`, `sentence_bert_config.json`). The Hugging Face
//! `config.json` of a backbone is read by [`crate::ArchitectureConfig`].

use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::pool::Pooling;

/// Reads and parses a JSON file; a missing file is [`Error::MissingFile`] naming it.
pub(crate) fn read_json<T: DeserializeOwned>(path: &Path, what: &'static str) -> Result<T> {
    if !path.exists() {
        return Err(Error::MissingFile {
            path: path.to_path_buf(),
            what,
        });
    }
    let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
    serde_json::from_str(&text).map_err(|source| Error::Json {
        path: path.to_path_buf(),
        source,
    })
}

/// Serializes `value` as pretty JSON into `path`.
pub(crate) fn write_json<T: Serialize>(path: &Path, value: &T) -> Result<()> {
    let text = serde_json::to_string_pretty(value).map_err(|source| Error::Json {
        path: path.to_path_buf(),
        source,
    })?;
    std::fs::write(path, text).map_err(|e| Error::io(path, e))
}

/// One entry of sentence-transformers' `modules.json`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct StModule {
    /// Position of the module in the pipeline.
    pub idx: usize,
    /// Its name.
    pub name: String,
    /// Its sub-directory (empty for the transformer itself).
    pub path: String,
    /// Its Python class, e.g. `sentence_transformers.models.Pooling`.
    #[serde(rename = "type")]
    pub kind: String,
}

/// sentence-transformers' `1_Pooling/config.json` (the fields this crate reads and writes).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct StPoolingConfig {
    /// Width of the embeddings.
    pub word_embedding_dimension: usize,
    /// CLS pooling.
    #[serde(default)]
    pub pooling_mode_cls_token: bool,
    /// Masked mean pooling.
    #[serde(default)]
    pub pooling_mode_mean_tokens: bool,
    /// Max pooling (not supported here).
    #[serde(default)]
    pub pooling_mode_max_tokens: bool,
    /// Mean times sqrt(len) (not supported here).
    #[serde(default)]
    pub pooling_mode_mean_sqrt_len_tokens: bool,
    /// Weighted mean (not supported here).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub pooling_mode_weightedmean_tokens: bool,
    /// Last-token pooling.
    #[serde(default)]
    pub pooling_mode_lasttoken: bool,
    /// Whether the prompt tokens are included (always true here).
    #[serde(default = "yes")]
    pub include_prompt: bool,
}

fn yes() -> bool {
    true
}

impl StPoolingConfig {
    /// The pooling it selects; exactly one supported mode must be on.
    pub fn pooling(&self, path: &Path) -> Result<Pooling> {
        if self.pooling_mode_max_tokens
            || self.pooling_mode_mean_sqrt_len_tokens
            || self.pooling_mode_weightedmean_tokens
        {
            return Err(Error::config(
                path,
                "pooling_mode_*",
                "only cls, mean and lasttoken pooling are supported",
            ));
        }
        let on: Vec<Pooling> = [
            (self.pooling_mode_cls_token, Pooling::Cls),
            (self.pooling_mode_mean_tokens, Pooling::Mean),
            (self.pooling_mode_lasttoken, Pooling::Last),
        ]
        .into_iter()
        .filter_map(|(on, p)| on.then_some(p))
        .collect();
        match on.as_slice() {
            [p] => Ok(*p),
            [] => Err(Error::config(
                path,
                "pooling_mode_*",
                "no pooling mode is set",
            )),
            _ => Err(Error::config(
                path,
                "pooling_mode_*",
                "several pooling modes are set (their concatenation is not supported)",
            )),
        }
    }

    /// The config for `pooling` at width `dim`.
    pub fn for_pooling(pooling: Pooling, dim: usize) -> Self {
        Self {
            word_embedding_dimension: dim,
            pooling_mode_cls_token: pooling == Pooling::Cls,
            pooling_mode_mean_tokens: pooling == Pooling::Mean,
            pooling_mode_max_tokens: false,
            pooling_mode_mean_sqrt_len_tokens: false,
            pooling_mode_weightedmean_tokens: false,
            pooling_mode_lasttoken: pooling == Pooling::Last,
            include_prompt: true,
        }
    }
}

/// sentence-transformers' `sentence_bert_config.json`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct StBertConfig {
    /// Maximum number of tokens per input (longer inputs are truncated).
    pub max_seq_length: usize,
    /// Whether to lower-case inputs before tokenizing.
    #[serde(default)]
    pub do_lower_case: bool,
}

/// What the sentence-transformers files of a model directory say, when present.
#[derive(Debug, Clone, PartialEq, Default)]
#[non_exhaustive]
pub struct SentenceTransformersConfig {
    /// Pooling from the `Pooling` module's config, if there is one.
    pub pooling: Option<Pooling>,
    /// Whether `modules.json` lists a `Normalize` module (`None` without `modules.json`).
    pub normalize: Option<bool>,
    /// `max_seq_length` from `sentence_bert_config.json`.
    pub max_seq_length: Option<usize>,
    /// `do_lower_case` from `sentence_bert_config.json`.
    pub do_lower_case: bool,
}

impl SentenceTransformersConfig {
    /// Reads whichever of the three files exist in `dir` (all are optional).
    pub fn from_dir(dir: &Path) -> Result<Self> {
        let mut out = Self::default();
        let modules_path = dir.join("modules.json");
        if modules_path.exists() {
            let modules: Vec<StModule> = read_json(&modules_path, "sentence-transformers modules")?;
            out.normalize = Some(modules.iter().any(|m| m.kind.ends_with(".Normalize")));
            if let Some(pool) = modules.iter().find(|m| m.kind.ends_with(".Pooling")) {
                let path: PathBuf = dir.join(&pool.path).join("config.json");
                let cfg: StPoolingConfig =
                    read_json(&path, "sentence-transformers pooling config")?;
                out.pooling = Some(cfg.pooling(&path)?);
            }
        }
        let sb_path = dir.join("sentence_bert_config.json");
        if sb_path.exists() {
            let cfg: StBertConfig = read_json(&sb_path, "sentence-transformers model config")?;
            if cfg.max_seq_length == 0 {
                return Err(Error::config(
                    &sb_path,
                    "max_seq_length",
                    "must be positive",
                ));
            }
            out.max_seq_length = Some(cfg.max_seq_length);
            out.do_lower_case = cfg.do_lower_case;
        }
        Ok(out)
    }
}
