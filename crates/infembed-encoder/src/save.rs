//! Saving encoders back as Hugging Face / sentence-transformers directories.
//!
//! A saved tower is a complete sentence-transformers model directory: `model.safetensors`
//! with the original Hugging Face key names and PyTorch layouts, the checkpoint's
//! `config.json` and tokenizer files (copied from the source directory), and
//! `modules.json`, `1_Pooling/config.json`, the `Dense` modules (`<n>_Dense/`),
//! `sentence_bert_config.json` and `config_sentence_transformers.json` describing the
//! current pooling, layers, normalization, maximum length and prompts (a dual encoder's
//! query and passage prefixes become the prompts `query` and `document`). The weights file
//! depends on the weights alone (equal weights, equal bytes). Python `sentence-transformers`
//! loads it as is (`scripts/encoder/check_saved.py` checks that).
//!
//! A [`DualEncoder`] adds `infembed_encoder.json` (its [`EncoderConfig`]), a
//! `passage_tower/` sub-directory (a complete model) when the towers are separate, and
//! `interaction.safetensors` (`w_i.weight`, `w_q1.weight`, `w_q2.weight`, PyTorch
//! `[out, in]` layout) for a learnable Interaction II.

use std::path::Path;

use burn::prelude::*;

use crate::config::{
    ST_MODEL_CONFIG, Similarity, StBertConfig, StModelConfig, StModule, StPoolingConfig, read_json,
    write_json,
};
use crate::dual::{DualEncoder, EncoderConfig, PASSAGE_PROMPTS, QUERY_PROMPT, Towers};
use crate::encoder::TextEncoder;
use crate::error::{Error, Result};
use crate::head::DenseLayer;
use crate::models::Backbone;
use crate::pool::Pooling;
use crate::weights;

/// Files copied verbatim from the source checkpoint when present (the tokenizer and the
/// model config; the weights and sentence-transformers files are written afresh).
const COPIED: [&str; 8] = [
    "config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.txt",
    "merges.txt",
    "vocab.json",
    "added_tokens.json",
];

/// File name of the dual encoder's own configuration in a saved directory.
pub const ENCODER_CONFIG_FILE: &str = "infembed_encoder.json";
/// File name of the Interaction II weights in a saved directory.
pub const INTERACTION_FILE: &str = "interaction.safetensors";
/// Sub-directory of a separate passage tower in a saved directory.
pub const PASSAGE_TOWER_DIR: &str = "passage_tower";

/// What a saved tower's sentence-transformers files say besides its weights.
struct TowerFiles<'a> {
    pooling: Pooling,
    dense: &'a [DenseLayer],
    normalize: bool,
    max_length: usize,
    /// Width of the backbone's states (the pooling module's input).
    hidden: usize,
    /// Prompts to set (name, text); the source's other prompts are kept.
    prompts: Vec<(&'static str, String)>,
    /// The similarity to record, if it must be set.
    similarity: Option<Similarity>,
}

/// Writes one tower as a sentence-transformers directory.
fn save_tower(
    backbone: &Backbone,
    source_dir: &Path,
    dir: &Path,
    files: &TowerFiles<'_>,
) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
    let same = match (source_dir.canonicalize(), dir.canonicalize()) {
        (Ok(a), Ok(b)) => a == b,
        _ => false,
    };
    if !same {
        for name in COPIED {
            let from = source_dir.join(name);
            if from.exists() {
                std::fs::copy(&from, dir.join(name)).map_err(|e| Error::io(&from, e))?;
            }
        }
    }
    // A sharded source's index would point at shards this directory does not hold.
    let stale_index = dir.join(weights::INDEX_FILE);
    if stale_index.exists() && !same {
        std::fs::remove_file(&stale_index).map_err(|e| Error::io(&stale_index, e))?;
    }
    backbone.save_safetensors(&dir.join(weights::WEIGHTS_FILE))?;

    let mut modules = vec![
        StModule {
            idx: 0,
            name: "0".into(),
            path: String::new(),
            kind: "sentence_transformers.models.Transformer".into(),
        },
        StModule {
            idx: 1,
            name: "1".into(),
            path: "1_Pooling".into(),
            kind: "sentence_transformers.models.Pooling".into(),
        },
    ];
    for layer in files.dense {
        let idx = modules.len();
        let path = format!("{idx}_Dense");
        layer.save(&dir.join(&path))?;
        modules.push(StModule {
            idx,
            name: idx.to_string(),
            path,
            kind: "sentence_transformers.models.Dense".into(),
        });
    }
    if files.normalize {
        let idx = modules.len();
        modules.push(StModule {
            idx,
            name: idx.to_string(),
            path: format!("{idx}_Normalize"),
            kind: "sentence_transformers.models.Normalize".into(),
        });
    }
    write_json(&dir.join("modules.json"), &modules)?;
    let pool_dir = dir.join("1_Pooling");
    std::fs::create_dir_all(&pool_dir).map_err(|e| Error::io(&pool_dir, e))?;
    write_json(
        &pool_dir.join("config.json"),
        &StPoolingConfig::for_pooling(files.pooling, files.hidden),
    )?;
    // config_sentence_transformers.json: the source's, with the prompts and similarity set.
    let st_src = source_dir.join(ST_MODEL_CONFIG);
    let mut st: StModelConfig = if st_src.exists() {
        read_json(&st_src, "sentence-transformers settings")?
    } else {
        StModelConfig::default()
    };
    for (name, text) in &files.prompts {
        st.prompts.insert((*name).to_string(), text.clone());
    }
    if let Some(sim) = files.similarity {
        st.similarity_fn_name = serde_json::to_value(sim)
            .ok()
            .and_then(|v| v.as_str().map(str::to_string));
    }
    if st != StModelConfig::default() || st_src.exists() {
        write_json(&dir.join(ST_MODEL_CONFIG), &st)?;
    }
    // Keep `do_lower_case` (and any future field) from the source when it has the file.
    let sb_src = source_dir.join("sentence_bert_config.json");
    let do_lower_case = if sb_src.exists() {
        read_json::<StBertConfig>(&sb_src, "sentence-transformers model config")?.do_lower_case
    } else {
        false
    };
    write_json(
        &dir.join("sentence_bert_config.json"),
        &StBertConfig {
            max_seq_length: Some(files.max_length),
            do_lower_case,
        },
    )
}

impl TextEncoder {
    /// Saves the encoder as a sentence-transformers directory at `dir` (created if needed;
    /// existing files of the same names are replaced).
    pub fn save(&self, dir: impl AsRef<Path>) -> Result<()> {
        save_tower(
            &self.backbone,
            &self.source_dir,
            dir.as_ref(),
            &TowerFiles {
                pooling: self.pooling,
                dense: &self.dense,
                normalize: self.normalize,
                max_length: self.max_length,
                hidden: self.arch.hidden_size(),
                prompts: Vec::new(),
                similarity: None,
            },
        )
    }
}

impl DualEncoder {
    /// Saves the dual encoder at `dir`: the query tower as a sentence-transformers model
    /// (normalized, query maximum length), plus `infembed_encoder.json` (its [`EncoderConfig`]),
    /// a `passage_tower/` sub-directory (a complete model) when the towers are separate, and
    /// `interaction.safetensors` (PyTorch `[out, in]` layout) for a learnable Interaction II.
    pub fn save(&self, dir: impl AsRef<Path>) -> Result<()> {
        let dir = dir.as_ref();
        let max_q = self.query_max_length();
        let max_p = self.passage_max_length();
        let cfg = self.config();
        let mut query_prompts = Vec::new();
        if !cfg.query_prefix.is_empty() {
            query_prompts.push((QUERY_PROMPT, cfg.query_prefix.clone()));
        }
        if !cfg.passage_prefix.is_empty() {
            query_prompts.push((PASSAGE_PROMPTS[0], cfg.passage_prefix.clone()));
        }
        // Training scores by cosine on unit vectors, so a saved dual encoder normalizes; a
        // dot-product source is recorded as cosine so the files agree with each other.
        let similarity =
            (self.st_config().similarity == Some(Similarity::Dot)).then_some(Similarity::Cosine);
        let hidden = self.arch().hidden_size();
        save_tower(
            &self.model().query_tower,
            self.source_dir(),
            dir,
            &TowerFiles {
                pooling: self.pooling(),
                dense: &self.model().dense,
                normalize: true,
                max_length: max_q,
                hidden,
                prompts: query_prompts.clone(),
                similarity,
            },
        )?;
        let passage_dir = dir.join(PASSAGE_TOWER_DIR);
        if let Some(p) = &self.model().passage_tower {
            save_tower(
                p,
                self.source_dir(),
                &passage_dir,
                &TowerFiles {
                    pooling: self.pooling(),
                    dense: &self.model().dense,
                    normalize: true,
                    max_length: max_p,
                    hidden,
                    prompts: query_prompts,
                    similarity,
                },
            )?;
        } else if passage_dir.exists() {
            std::fs::remove_dir_all(&passage_dir).map_err(|e| Error::io(&passage_dir, e))?;
        }
        let inter = dir.join(INTERACTION_FILE);
        if let Some(c) = &self.model().cross {
            weights::save_from(c, &inter, &[])?;
        } else if inter.exists() {
            std::fs::remove_file(&inter).map_err(|e| Error::io(&inter, e))?;
        }
        // The lengths are written as explicit values: the directory's own
        // `max_seq_length` is the query tower's, which must not become the passages'.
        let mut config = cfg.clone();
        config.pooling = Some(self.pooling());
        config.query_max_length = Some(max_q);
        config.passage_max_length = Some(max_p);
        write_json(&dir.join(ENCODER_CONFIG_FILE), &config)
    }

    /// Loads a directory written by [`save`](Self::save) (its `infembed_encoder.json`
    /// supplies the configuration). A plain checkpoint directory without that file loads
    /// with `EncoderConfig::default()`.
    pub fn load_saved(dir: impl AsRef<Path>, device: &Device) -> Result<Self> {
        let dir = dir.as_ref();
        let cfg_path = dir.join(ENCODER_CONFIG_FILE);
        let config = if cfg_path.exists() {
            EncoderConfig::from_file(&cfg_path)?
        } else {
            EncoderConfig::default()
        };
        let mut shared = config.clone();
        shared.towers = Towers::Shared;
        let mut enc = DualEncoder::from_dir(dir, shared, device)?.with_config(config.clone());
        if config.towers == Towers::Separate {
            let pdir = dir.join(PASSAGE_TOWER_DIR);
            if !pdir.is_dir() {
                return Err(Error::MissingFile {
                    path: pdir,
                    what: "separate passage tower of a saved dual encoder",
                });
            }
            let arch = crate::models::ArchitectureConfig::from_dir(&pdir)?;
            enc.model_mut().passage_tower = Some(Backbone::load(&arch, &pdir, device)?);
        }
        if let Some(cross) = enc.model_mut().cross.as_mut() {
            let path = dir.join(INTERACTION_FILE);
            weights::load_into(cross, &path, &[])?;
        }
        Ok(enc)
    }
}

/// Names of the tensors a safetensors file holds (for checks and tools).
pub fn safetensors_keys(path: &Path) -> Result<Vec<String>> {
    weights::tensor_names(path)
}
