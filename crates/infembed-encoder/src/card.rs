//! Which model a directory holds: its name and revision, for result files and reports.
//!
//! A Hugging Face `config.json` cannot say: its `_name_or_path` is the checkpoint a model was
//! trained *from* (all-MiniLM-L6-v2's says `nreimers/MiniLM-L6-H384-uncased`), and a folder
//! name such as `final` says nothing. So [`ModelInfo::of_dir`] looks, in order, at:
//!
//! 1. `infembed_model.json` ([`MODEL_INFO_FILE`]), written by `cargo xtask fetch-model` and by
//!    training (the trained model's name, the revision of its weights, and the base model it
//!    was fine-tuned from);
//! 2. a Hugging Face cache path (`.../models--ORG--NAME/snapshots/REVISION`): `ORG/NAME` at that
//!    revision;
//! 3. otherwise the folder's name, at the revision `sha256:` + the first 16 hex digits of the
//!    SHA-256 of its weight files ([`weights_revision`]).

use std::path::Path;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::error::{Error, Result};

/// File name of a model directory's name and revision.
pub const MODEL_INFO_FILE: &str = "infembed_model.json";

/// Where a [`ModelInfo`]'s name came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum NameSource {
    /// The directory's `infembed_model.json`.
    ModelInfoFile,
    /// A Hugging Face cache path (`models--ORG--NAME/snapshots/REVISION`).
    HubCachePath,
    /// The folder's name (nothing better was found).
    Folder,
}

/// A model that another was fine-tuned from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BaseModel {
    /// Its name.
    pub name: String,
    /// Its revision.
    pub revision: String,
}

/// A model's name and revision (the fields mteb's result files carry), and the base model of a
/// fine-tuned one.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct ModelInfo {
    /// e.g. `sentence-transformers/all-MiniLM-L6-v2`.
    pub name: String,
    /// A hub revision (commit hash) or `sha256:` + 16 hex digits of the weights.
    pub revision: String,
    /// The model it was fine-tuned from, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base_model: Option<BaseModel>,
    /// What wrote the file (e.g. `infembed 0.1.0`), when infembed trained the model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trained_with: Option<String>,
    /// Where the name came from (not stored in the file).
    #[serde(skip, default = "default_source")]
    pub source: NameSource,
}

fn default_source() -> NameSource {
    NameSource::ModelInfoFile
}

impl ModelInfo {
    /// A model's info as it will be written to [`MODEL_INFO_FILE`].
    pub fn new(name: impl Into<String>, revision: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            revision: revision.into(),
            base_model: None,
            trained_with: None,
            source: NameSource::ModelInfoFile,
        }
    }

    /// Sets the base model.
    #[must_use]
    pub fn with_base(mut self, base: &ModelInfo) -> Self {
        self.base_model = Some(BaseModel {
            name: base.name.clone(),
            revision: base.revision.clone(),
        });
        self
    }

    /// Sets what trained the model.
    #[must_use]
    pub fn with_trained_with(mut self, tool: impl Into<String>) -> Self {
        self.trained_with = Some(tool.into());
        self
    }

    /// The info of the model in `dir` (see the module docs for the order of sources).
    ///
    /// # Errors
    /// A `infembed_model.json` that is not valid JSON or lacks a field ([`Error::Json`], naming
    /// the file and line); an unreadable weight file ([`Error::Io`]) when the revision must be
    /// hashed.
    pub fn of_dir(dir: &Path) -> Result<Self> {
        let file = dir.join(MODEL_INFO_FILE);
        if file.is_file() {
            let text = std::fs::read_to_string(&file).map_err(|e| Error::io(&file, e))?;
            let info: ModelInfo = serde_json::from_str(&text).map_err(|source| Error::Json {
                path: file.clone(),
                source,
            })?;
            if info.name.trim().is_empty() || info.revision.trim().is_empty() {
                return Err(Error::InvalidConfig {
                    path: file,
                    field: "name".into(),
                    problem: "the name and the revision must not be empty".into(),
                });
            }
            return Ok(info);
        }
        if let Some((name, revision)) = hub_cache_name(dir) {
            let mut info = Self::new(name, revision);
            info.source = NameSource::HubCachePath;
            return Ok(info);
        }
        let name = dir
            .canonicalize()
            .ok()
            .and_then(|d| d.file_name().map(|n| n.to_string_lossy().into_owned()))
            .or_else(|| dir.file_name().map(|n| n.to_string_lossy().into_owned()))
            .unwrap_or_else(|| dir.display().to_string());
        let mut info = Self::new(name, weights_revision(dir)?);
        info.source = NameSource::Folder;
        Ok(info)
    }

    /// Writes `dir/infembed_model.json`.
    ///
    /// # Errors
    /// [`Error::Io`] naming the file.
    pub fn write(&self, dir: &Path) -> Result<()> {
        crate::config::write_json(&dir.join(MODEL_INFO_FILE), self)
    }
}

/// `ORG/NAME` and the revision of a Hugging Face cache snapshot path
/// (`.../models--ORG--NAME/snapshots/REVISION`).
fn hub_cache_name(dir: &Path) -> Option<(String, String)> {
    let dir = dir.canonicalize().unwrap_or_else(|_| dir.to_path_buf());
    let revision = dir.file_name()?.to_str()?;
    let snapshots = dir.parent()?;
    if snapshots.file_name()?.to_str()? != "snapshots" {
        return None;
    }
    let repo = snapshots.parent()?.file_name()?.to_str()?;
    let name = repo.strip_prefix("models--")?.replace("--", "/");
    (!name.is_empty() && !revision.is_empty()).then(|| (name, revision.to_string()))
}

/// `sha256:` + the first 16 hex digits of the SHA-256 over the directory's weight files: every
/// `*.safetensors` file in it and in its `passage_tower/` sub-directory, in byte order of their
/// relative paths, each as its path, a NUL byte and its contents.
///
/// # Errors
/// [`Error::Io`] naming an unreadable file; [`Error::MissingFile`] when there is no weight file.
pub fn weights_revision(dir: &Path) -> Result<String> {
    let mut files = Vec::new();
    for sub in ["", crate::save::PASSAGE_TOWER_DIR] {
        let d = if sub.is_empty() {
            dir.to_path_buf()
        } else {
            dir.join(sub)
        };
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for entry in entries {
            let entry = entry.map_err(|e| Error::io(&d, e))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.ends_with(".safetensors") && entry.path().is_file() {
                let rel = if sub.is_empty() {
                    name
                } else {
                    format!("{sub}/{name}")
                };
                files.push(rel);
            }
        }
    }
    if files.is_empty() {
        return Err(Error::MissingFile {
            path: dir.join("model.safetensors"),
            what: "model weights (to compute the model's revision)",
        });
    }
    files.sort();
    let mut hasher = Sha256::new();
    for rel in &files {
        let path = dir.join(rel);
        hasher.update(rel.as_bytes());
        hasher.update([0u8]);
        let mut f = std::fs::File::open(&path).map_err(|e| Error::io(&path, e))?;
        std::io::copy(&mut f, &mut hasher).map_err(|e| Error::io(&path, e))?;
    }
    let digest = hasher.finalize();
    let hex: String = digest.iter().take(8).map(|b| format!("{b:02x}")).collect();
    Ok(format!("sha256:{hex}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_revision_is_the_sha256_of_the_weight_files() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("model.safetensors"), b"abc").unwrap();
        std::fs::write(dir.path().join("vocab.txt"), b"not hashed").unwrap();
        // Independent reference: the same bytes through sha2 by hand.
        let mut h = Sha256::new();
        h.update(b"model.safetensors\0abc");
        let want: String = h.finalize()[..8]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        assert_eq!(
            weights_revision(dir.path()).unwrap(),
            format!("sha256:{want}")
        );
        // Any change of a weight file changes it; other files do not.
        std::fs::write(dir.path().join("vocab.txt"), b"changed").unwrap();
        assert_eq!(
            weights_revision(dir.path()).unwrap(),
            format!("sha256:{want}")
        );
        std::fs::create_dir(dir.path().join("passage_tower")).unwrap();
        std::fs::write(dir.path().join("passage_tower/model.safetensors"), b"x").unwrap();
        assert_ne!(
            weights_revision(dir.path()).unwrap(),
            format!("sha256:{want}")
        );
    }

    #[test]
    fn names_come_from_the_file_then_the_hub_cache_then_the_folder() {
        let root = tempfile::tempdir().unwrap();
        let snap = root
            .path()
            .join("models--sentence-transformers--all-MiniLM-L6-v2/snapshots/8b3219a9");
        std::fs::create_dir_all(&snap).unwrap();
        let info = ModelInfo::of_dir(&snap).unwrap();
        assert_eq!(info.name, "sentence-transformers/all-MiniLM-L6-v2");
        assert_eq!(info.revision, "8b3219a9");
        assert_eq!(info.source, NameSource::HubCachePath);

        let folder = root.path().join("final");
        std::fs::create_dir(&folder).unwrap();
        std::fs::write(folder.join("model.safetensors"), b"w").unwrap();
        let info = ModelInfo::of_dir(&folder).unwrap();
        assert_eq!(
            (info.name.as_str(), info.source),
            ("final", NameSource::Folder)
        );
        assert!(info.revision.starts_with("sha256:") && info.revision.len() == 7 + 16);

        let base = ModelInfo::new("org/base", "abc");
        ModelInfo::new("org/tuned", "sha256:0123")
            .with_base(&base)
            .with_trained_with("infembed 0.1.0")
            .write(&folder)
            .unwrap();
        let info = ModelInfo::of_dir(&folder).unwrap();
        assert_eq!(info.name, "org/tuned");
        assert_eq!(info.base_model.unwrap().name, "org/base");
        assert_eq!(info.source, NameSource::ModelInfoFile);

        // A broken file is an error naming it, not a silent fallback.
        std::fs::write(folder.join(MODEL_INFO_FILE), "{\"name\": 3}").unwrap();
        let err = ModelInfo::of_dir(&folder).unwrap_err().to_string();
        assert!(err.contains(MODEL_INFO_FILE), "{err}");
        // No weights: the revision cannot be computed, and the error says which file is missing.
        let empty = root.path().join("empty");
        std::fs::create_dir(&empty).unwrap();
        let err = ModelInfo::of_dir(&empty).unwrap_err().to_string();
        assert!(err.contains("model.safetensors"), "{err}");
    }
}
