//! Moving weights between burn modules and Hugging Face safetensors files with `burn-store`.
//!
//! Module fields are named after the Hugging Face keys, so the only renames needed are a few
//! regular-expression rewrites per architecture (e.g. `LayerNorm` <-> `layer_norm`,
//! `attention.self.` <-> `attention.self_attn.`). Linear weights are transposed and norm
//! parameters renamed (`weight`/`bias` <-> `gamma`/`beta`) by burn-store's PyTorch adapters.
//!
//! Checkpoints as they ship: one `model.safetensors`, or shards listed by
//! `model.safetensors.index.json` (its `weight_map`); any float dtype (f32, bf16, f16) is cast
//! on load to the float type of the device the module lives on (f32 on the CPU; a GPU device
//! configured for `bf16` / `f16` gets its weights in that type, cast once here).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use burn::store::{
    BurnToPyTorchAdapter, FloatCastAdapter, ModuleAdapter, ModuleSnapshot, ModuleStore,
    PyTorchToBurnAdapter, SafetensorsStore,
};
use burn::tensor::DType;
use serde::Deserialize;

use crate::error::{Error, Result};

/// File name of an unsharded checkpoint's weights.
pub(crate) const WEIGHTS_FILE: &str = "model.safetensors";
/// File name of the index of a sharded checkpoint.
pub(crate) const INDEX_FILE: &str = "model.safetensors.index.json";

/// The weight files of a checkpoint directory: `model.safetensors`, or the shards named by
/// `model.safetensors.index.json` (in name order, each once). [`Error::MissingFile`] names what
/// is missing: the weights, the index, or one of the shards it lists.
pub(crate) fn weight_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let single = dir.join(WEIGHTS_FILE);
    if single.exists() {
        return Ok(vec![single]);
    }
    let index_path = dir.join(INDEX_FILE);
    if !index_path.exists() {
        return Err(Error::MissingFile {
            path: single,
            what: "model weights (model.safetensors, or model.safetensors.index.json with its shards)",
        });
    }
    #[derive(Deserialize)]
    struct Index {
        weight_map: BTreeMap<String, String>,
    }
    let index: Index = crate::config::read_json(&index_path, "sharded weights index")?;
    let shards: BTreeSet<&String> = index.weight_map.values().collect();
    if shards.is_empty() {
        return Err(Error::config(&index_path, "weight_map", "lists no shard"));
    }
    let mut files = Vec::with_capacity(shards.len());
    for shard in shards {
        // A shard is a file beside the index, never a path elsewhere.
        if shard.contains('/') || shard.contains('\\') || shard.starts_with('.') {
            return Err(Error::config(
                &index_path,
                "weight_map",
                format!("shard `{shard}` is not a file name in the model directory"),
            ));
        }
        let path = dir.join(shard);
        if !path.exists() {
            return Err(Error::MissingFile {
                path,
                what: "weights shard listed in model.safetensors.index.json",
            });
        }
        files.push(path);
    }
    Ok(files)
}

/// The names of all tensors stored in the checkpoint's weight files (after no remapping).
pub(crate) fn checkpoint_tensor_names(dir: &Path) -> Result<Vec<String>> {
    let mut names = Vec::new();
    for file in weight_files(dir)? {
        names.extend(tensor_names(&file)?);
    }
    Ok(names)
}

/// The names of all tensors stored in a safetensors file (after no remapping).
pub(crate) fn tensor_names(path: &Path) -> Result<Vec<String>> {
    if !path.exists() {
        return Err(Error::MissingFile {
            path: path.to_path_buf(),
            what: "model weights (safetensors)",
        });
    }
    let mut store = SafetensorsStore::from_file(path);
    store.keys().map_err(|e| Error::Safetensors {
        path: path.to_path_buf(),
        message: e.to_string(),
    })
}

/// Loads the checkpoint in `dir` (one file or its shards, see [`weight_files`]) into `module`.
pub(crate) fn load_checkpoint<M: ModuleSnapshot>(
    module: &mut M,
    dir: &Path,
    remaps: &[(&str, &str)],
) -> Result<()> {
    let files = weight_files(dir)?;
    load_files(module, &files, remaps)
}

/// Loads `path` into `module`, rewriting file keys with `remaps` (regex, replacement) first.
///
/// Every parameter of the module must be found with the right shape; tensors in the file that
/// the module does not use (e.g. `embeddings.position_ids`, an LM head) are ignored.
pub(crate) fn load_into<M: ModuleSnapshot>(
    module: &mut M,
    path: &Path,
    remaps: &[(&str, &str)],
) -> Result<()> {
    load_files(module, &[path.to_path_buf()], remaps)
}

/// Loads every file of `files` into `module`; each parameter must come from one of them.
/// Float tensors of any dtype are cast to the float type of the module's device.
fn load_files<M: ModuleSnapshot>(
    module: &mut M,
    files: &[PathBuf],
    remaps: &[(&str, &str)],
) -> Result<()> {
    let target: DType = module
        .devices()
        .first()
        .map_or(DType::F32, |device| device.settings().float_dtype.into());
    // Parameters not found in any file so far (None before the first file).
    let mut missing: Option<BTreeSet<String>> = None;
    for path in files {
        if !path.exists() {
            return Err(Error::MissingFile {
                path: path.clone(),
                what: "model weights (safetensors)",
            });
        }
        let adapter = PyTorchToBurnAdapter.chain(FloatCastAdapter::to(target));
        let mut store = SafetensorsStore::from_file(path)
            .with_from_adapter(adapter)
            .allow_partial(true)
            .validate(true);
        for (from, to) in remaps {
            store = store.with_key_remapping(*from, *to);
        }
        let result = store.apply_to(module).map_err(|e| Error::WeightsMismatch {
            path: path.clone(),
            problem: e.to_string(),
        })?;
        let here: BTreeSet<String> = result.missing.iter().map(|(p, _)| p.clone()).collect();
        missing = Some(match missing {
            None => here,
            Some(before) => before.intersection(&here).cloned().collect(),
        });
    }
    if let Some(missing) = missing
        && !missing.is_empty()
    {
        let names: Vec<&str> = missing.iter().map(String::as_str).collect();
        let path = if files.len() == 1 {
            files[0].clone()
        } else {
            files[0].with_file_name(INDEX_FILE)
        };
        return Err(Error::WeightsMismatch {
            path,
            problem: format!("tensors missing from the weights: {}", names.join(", ")),
        });
    }
    Ok(())
}

/// Saves `module` to `path` as safetensors in PyTorch layout, rewriting module paths with
/// `remaps` (regex, replacement) so that the file carries the original Hugging Face names.
///
/// The file depends on the weights alone: its header holds the tensors in safetensors' own
/// order and one metadata entry (`format: pt`, what `transformers` writes), so equal weights
/// give equal bytes and a model can be checksummed.
pub(crate) fn save_from<M: ModuleSnapshot>(
    module: &M,
    path: &Path,
    remaps: &[(&str, &str)],
) -> Result<()> {
    // burn-store's default metadata is a hash map of three entries, written in the map's
    // (random) order: cleared, and one entry put back.
    let mut store = SafetensorsStore::from_file(path)
        .with_to_adapter(BurnToPyTorchAdapter)
        .overwrite(true)
        .clear_metadata()
        .metadata("format", "pt");
    for (from, to) in remaps {
        store = store.with_key_remapping(*from, *to);
    }
    store.collect_from(module).map_err(|e| Error::Safetensors {
        path: path.to_path_buf(),
        message: e.to_string(),
    })
}
