//! Moving weights between burn modules and Hugging Face safetensors files with `burn-store`.
//!
//! Module fields are named after the Hugging Face keys, so the only renames needed are a few
//! regular-expression rewrites per architecture (e.g. `LayerNorm` <-> `layer_norm`,
//! `attention.self.` <-> `attention.self_attn.`). Linear weights are transposed and norm
//! parameters renamed (`weight`/`bias` <-> `gamma`/`beta`) by burn-store's PyTorch adapters.

use std::path::Path;

use burn::store::{
    BurnToPyTorchAdapter, ModuleSnapshot, ModuleStore, PyTorchToBurnAdapter, SafetensorsStore,
};

use crate::error::{Error, Result};

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

/// Loads `path` into `module`, rewriting file keys with `remaps` (regex, replacement) first.
///
/// Every parameter of the module must be found with the right shape; tensors in the file that
/// the module does not use (e.g. `embeddings.position_ids`, an LM head) are ignored.
pub(crate) fn load_into<M: ModuleSnapshot>(
    module: &mut M,
    path: &Path,
    remaps: &[(&str, &str)],
) -> Result<()> {
    if !path.exists() {
        return Err(Error::MissingFile {
            path: path.to_path_buf(),
            what: "model weights (safetensors)",
        });
    }
    let mut store = SafetensorsStore::from_file(path)
        .with_from_adapter(PyTorchToBurnAdapter)
        .allow_partial(true)
        .validate(true);
    for (from, to) in remaps {
        store = store.with_key_remapping(*from, *to);
    }
    let result = store.apply_to(module).map_err(|e| Error::WeightsMismatch {
        path: path.to_path_buf(),
        problem: e.to_string(),
    })?;
    if !result.missing.is_empty() {
        let names: Vec<&str> = result.missing.iter().map(|(p, _)| p.as_str()).collect();
        return Err(Error::WeightsMismatch {
            path: path.to_path_buf(),
            problem: format!("tensors missing from the file: {}", names.join(", ")),
        });
    }
    Ok(())
}

/// Saves `module` to `path` as safetensors in PyTorch layout, rewriting module paths with
/// `remaps` (regex, replacement) so that the file carries the original Hugging Face names.
pub(crate) fn save_from<M: ModuleSnapshot>(
    module: &M,
    path: &Path,
    remaps: &[(&str, &str)],
) -> Result<()> {
    let mut store = SafetensorsStore::from_file(path)
        .with_to_adapter(BurnToPyTorchAdapter)
        .overwrite(true)
        .metadata("format", "pt");
    for (from, to) in remaps {
        store = store.with_key_remapping(*from, *to);
    }
    store.collect_from(module).map_err(|e| Error::Safetensors {
        path: path.to_path_buf(),
        message: e.to_string(),
    })
}
