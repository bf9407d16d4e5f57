//! Reading and writing JSON configuration files, and the sentence-transformers ones
//! (`modules.json`, `1_Pooling/config.json`, `sentence_bert_config.json`). The Hugging Face
//! `config.json` of a backbone is read by [`crate::ArchitectureConfig`].

use std::collections::BTreeMap;
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

/// sentence-transformers' `1_Pooling/config.json` (the fields this crate reads and writes):
/// the classic form (`word_embedding_dimension`, one `pooling_mode_*` flag per mode) and
/// sentence-transformers 6's (`embedding_dimension`, `pooling_mode: "mean"` or a list).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct StPoolingConfig {
    /// Width of the embeddings.
    #[serde(alias = "embedding_dimension")]
    pub word_embedding_dimension: usize,
    /// sentence-transformers 6's mode name(s) (`cls`, `mean`, `lasttoken`, ...), which
    /// replace the flags below when present.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pooling_mode: Option<serde_json::Value>,
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
    /// The pooling it selects; exactly one supported mode must be on, and mean pooling must
    /// include the prompt's tokens (`include_prompt`; the other modes do not look at them).
    pub fn pooling(&self, path: &Path) -> Result<Pooling> {
        let pooling = self.mode(path)?;
        if !self.include_prompt && pooling == Pooling::Mean {
            return Err(Error::config(
                path,
                "include_prompt",
                "false (prompt tokens left out of the mean) is not supported",
            ));
        }
        Ok(pooling)
    }

    fn mode(&self, path: &Path) -> Result<Pooling> {
        if let Some(mode) = &self.pooling_mode {
            let names: Vec<&str> = match mode {
                serde_json::Value::String(s) => vec![s.as_str()],
                serde_json::Value::Array(a) => a.iter().filter_map(|v| v.as_str()).collect(),
                _ => Vec::new(),
            };
            return match names.as_slice() {
                ["cls"] => Ok(Pooling::Cls),
                ["mean"] => Ok(Pooling::Mean),
                ["lasttoken"] => Ok(Pooling::Last),
                [other] => Err(Error::config(
                    path,
                    "pooling_mode",
                    format!("`{other}` is not supported (cls, mean, lasttoken)"),
                )),
                _ => Err(Error::config(
                    path,
                    "pooling_mode",
                    "must name one mode (several modes concatenated are not supported)",
                )),
            };
        }
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
            pooling_mode: None,
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

/// sentence-transformers' `sentence_bert_config.json` (sentence-transformers 6 writes no
/// `max_seq_length` there: it keeps it as the tokenizer's `model_max_length`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct StBertConfig {
    /// Maximum number of tokens per input (longer inputs are truncated).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_seq_length: Option<usize>,
    /// Whether to lower-case inputs before tokenizing.
    #[serde(default)]
    pub do_lower_case: bool,
}

/// How a sentence-transformers model scores two embeddings (`similarity_fn_name` in
/// `config_sentence_transformers.json`; sentence-transformers' default is cosine).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Similarity {
    /// Cosine similarity: infembed's embeddings are then unit vectors, scored by their dot
    /// product.
    #[default]
    Cosine,
    /// Dot product of the raw embeddings.
    #[serde(alias = "dot_product")]
    Dot,
}

/// The activation of a sentence-transformers `Dense` module.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum DenseActivation {
    /// `torch.nn.modules.linear.Identity`.
    Identity,
    /// `torch.nn.modules.activation.Tanh` (sentence-transformers' default).
    Tanh,
    /// `torch.nn.modules.activation.ReLU`.
    Relu,
    /// `torch.nn.modules.activation.Sigmoid`.
    Sigmoid,
    /// `torch.nn.modules.activation.GELU` (exact, erf form).
    Gelu,
}

impl DenseActivation {
    /// Parses the Python class name sentence-transformers stores.
    pub fn from_python(name: &str) -> Option<Self> {
        Some(match name.rsplit('.').next()? {
            "Identity" => Self::Identity,
            "Tanh" => Self::Tanh,
            "ReLU" => Self::Relu,
            "Sigmoid" => Self::Sigmoid,
            "GELU" => Self::Gelu,
            _ => return None,
        })
    }

    /// The Python class name sentence-transformers loads.
    pub fn python_name(self) -> &'static str {
        match self {
            Self::Identity => "torch.nn.modules.linear.Identity",
            Self::Tanh => "torch.nn.modules.activation.Tanh",
            Self::Relu => "torch.nn.modules.activation.ReLU",
            Self::Sigmoid => "torch.nn.modules.activation.Sigmoid",
            Self::Gelu => "torch.nn.modules.activation.GELU",
        }
    }
}

/// sentence-transformers' `Dense` module config (`<n>_Dense/config.json`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StDenseConfig {
    /// Input width.
    pub in_features: usize,
    /// Output width.
    pub out_features: usize,
    /// Whether the layer has a bias.
    #[serde(default = "yes")]
    pub bias: bool,
    /// The activation's Python class.
    #[serde(default = "default_dense_activation")]
    pub activation_function: String,
}

fn default_dense_activation() -> String {
    DenseActivation::Tanh.python_name().to_string()
}

/// One `Dense` module of a sentence-transformers pipeline: its directory and config.
#[derive(Debug, Clone, PartialEq)]
pub struct StDense {
    /// The module's directory (its weights are `model.safetensors` there).
    pub dir: PathBuf,
    /// Its config.
    pub config: StDenseConfig,
    /// Its activation.
    pub activation: DenseActivation,
}

/// `config_sentence_transformers.json` (the fields this crate reads and writes).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub(crate) struct StModelConfig {
    /// Named prompts, prepended to the text when `encode(.., prompt_name=..)` names one.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub prompts: BTreeMap<String, String>,
    /// The prompt used when none is named.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_prompt_name: Option<String>,
    /// `cosine`, `dot`, `euclidean` or `manhattan` (the first two are supported).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub similarity_fn_name: Option<String>,
    /// Every other field, kept as is when the file is rewritten.
    #[serde(flatten)]
    pub other: BTreeMap<String, serde_json::Value>,
}

/// What the sentence-transformers files of a model directory say, when present.
///
/// The pipeline of `modules.json` must be `Transformer` (the model directory itself),
/// optionally `Pooling`, any number of `Dense`, optionally `Normalize`, in that order; any
/// other module is an error naming it.
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
    /// The `Dense` modules after pooling, in pipeline order.
    pub dense: Vec<StDense>,
    /// The similarity function (`None` when the file does not name one: cosine).
    pub similarity: Option<Similarity>,
    /// Named prompts and the default prompt name.
    pub prompts: BTreeMap<String, String>,
    /// The prompt applied when none is named.
    pub default_prompt_name: Option<String>,
}

const TRANSFORMER: &str = "Transformer";
const POOLING: &str = "Pooling";
const DENSE: &str = "Dense";
const NORMALIZE: &str = "Normalize";

impl SentenceTransformersConfig {
    /// Reads whichever of the sentence-transformers files exist in `dir` (all are optional).
    pub fn from_dir(dir: &Path) -> Result<Self> {
        let mut out = Self::default();
        let modules_path = dir.join("modules.json");
        if modules_path.exists() {
            let mut modules: Vec<StModule> =
                read_json(&modules_path, "sentence-transformers modules")?;
            modules.sort_by_key(|m| m.idx);
            out.read_pipeline(dir, &modules_path, &modules)?;
        }
        let sb_path = dir.join("sentence_bert_config.json");
        if sb_path.exists() {
            let cfg: StBertConfig = read_json(&sb_path, "sentence-transformers model config")?;
            if cfg.max_seq_length == Some(0) {
                return Err(Error::config(
                    &sb_path,
                    "max_seq_length",
                    "must be positive",
                ));
            }
            out.max_seq_length = cfg.max_seq_length;
            out.do_lower_case = cfg.do_lower_case;
        }
        // sentence-transformers 6 keeps the length as the tokenizer's `model_max_length`
        // (a huge placeholder there means "no limit": the default then applies).
        let tok_path = dir.join("tokenizer_config.json");
        if out.max_seq_length.is_none() && modules_path.exists() && tok_path.exists() {
            let tok: serde_json::Value = read_json(&tok_path, "tokenizer config")?;
            out.max_seq_length = tok
                .get("model_max_length")
                .and_then(serde_json::Value::as_u64)
                .filter(|&n| n > 0 && n < 1 << 40)
                .map(|n| n as usize);
        }
        let st_path = dir.join(ST_MODEL_CONFIG);
        if st_path.exists() {
            let cfg: StModelConfig = read_json(&st_path, "sentence-transformers settings")?;
            out.similarity = match &cfg.similarity_fn_name {
                None => None,
                Some(name) => Some(
                    serde_json::from_value(serde_json::Value::String(name.clone())).map_err(
                        |_| {
                            Error::config(
                                &st_path,
                                "similarity_fn_name",
                                format!("`{name}` is not supported (only `cosine` and `dot`)"),
                            )
                        },
                    )?,
                ),
            };
            if let Some(name) = &cfg.default_prompt_name
                && !cfg.prompts.contains_key(name)
            {
                return Err(Error::config(
                    &st_path,
                    "default_prompt_name",
                    format!("`{name}` is not one of `prompts`"),
                ));
            }
            out.prompts = cfg.prompts;
            out.default_prompt_name = cfg.default_prompt_name;
        }
        Ok(out)
    }

    /// Reads the modules of `modules.json` (sorted by `idx`) in pipeline order.
    fn read_pipeline(&mut self, dir: &Path, path: &Path, modules: &[StModule]) -> Result<()> {
        // Stage reached so far: 0 transformer, 1 pooling, 2 dense, 3 normalize.
        let mut stage = 0;
        self.normalize = Some(false);
        for (pos, m) in modules.iter().enumerate() {
            let short = m.kind.rsplit('.').next().unwrap_or(&m.kind);
            // Errors name the entry as `modules.json` numbers it (`idx`).
            let i = m.idx;
            let (at, known) = match short {
                TRANSFORMER => (0, true),
                POOLING => (1, true),
                DENSE => (2, true),
                NORMALIZE => (3, true),
                _ => (0, false),
            };
            if !known || !m.kind.starts_with("sentence_transformers.") {
                return Err(Error::config(
                    path,
                    format!("[{i}].type"),
                    format!(
                        "module `{}` is not supported (supported: Transformer, Pooling, Dense, \
                         Normalize)",
                        m.kind
                    ),
                ));
            }
            let order_ok = match short {
                TRANSFORMER => pos == 0,
                _ => pos > 0 && at >= stage && !(at == stage && at != 2),
            };
            if !order_ok {
                return Err(Error::config(
                    path,
                    format!("[{i}].type"),
                    format!(
                        "module `{short}` out of order (supported: Transformer, then Pooling, \
                         Dense modules and Normalize in that order, each once except Dense)"
                    ),
                ));
            }
            stage = at;
            match short {
                TRANSFORMER => {
                    if !m.path.is_empty() {
                        return Err(Error::config(
                            path,
                            format!("[{i}].path"),
                            format!(
                                "the transformer lives in the sub-directory `{}`: use that \
                                 directory as the model",
                                m.path
                            ),
                        ));
                    }
                }
                POOLING => {
                    let cfg_path = dir.join(&m.path).join("config.json");
                    let cfg: StPoolingConfig =
                        read_json(&cfg_path, "sentence-transformers pooling config")?;
                    self.pooling = Some(cfg.pooling(&cfg_path)?);
                }
                DENSE => {
                    let module_dir = dir.join(&m.path);
                    let cfg_path = module_dir.join("config.json");
                    let config: StDenseConfig =
                        read_json(&cfg_path, "sentence-transformers Dense config")?;
                    let activation = DenseActivation::from_python(&config.activation_function)
                        .ok_or_else(|| {
                            Error::config(
                                &cfg_path,
                                "activation_function",
                                format!(
                                    "`{}` is not supported (Identity, Tanh, ReLU, Sigmoid, GELU)",
                                    config.activation_function
                                ),
                            )
                        })?;
                    if config.in_features == 0 || config.out_features == 0 {
                        return Err(Error::config(
                            &cfg_path,
                            "in_features / out_features",
                            "must be positive",
                        ));
                    }
                    self.dense.push(StDense {
                        dir: module_dir,
                        config,
                        activation,
                    });
                }
                _ => self.normalize = Some(true),
            }
        }
        if modules.is_empty() {
            return Err(Error::config(path, "modules", "lists no module"));
        }
        Ok(())
    }

    /// Whether embeddings come out as unit vectors: when the pipeline ends in `Normalize`, or
    /// the similarity is cosine (the default), or there is no `modules.json` (infembed's
    /// default). Only a dot-product model without `Normalize` gives raw vectors.
    pub fn unit_vectors(&self) -> bool {
        self.normalize.unwrap_or(true) || self.similarity.unwrap_or_default() == Similarity::Cosine
    }
}

/// File name of sentence-transformers' model settings (prompts, similarity).
pub const ST_MODEL_CONFIG: &str = "config_sentence_transformers.json";
