//! [`EmbeddingIndex`]: a corpus's embeddings with their document ids, saved and loaded as
//! safetensors or NumPy `.npy`, and exact top-k search by dot product.
//!
//! The file formats and the search rule are documented at [`EmbeddingIndex`].

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use infembed_metrics::TieBreak;
use safetensors::{Dtype, SafeTensors, tensor::TensorView};

use crate::error::{Error, Result};
use crate::topk::top_k;

/// The name of the embeddings tensor in a safetensors index.
pub const EMBEDDINGS_TENSOR: &str = "embeddings";
/// The value of the `"format"` metadata key in a safetensors index.
pub const FORMAT_TAG: &str = "infembed-index/1";
/// The pseudo path that errors name for an index that was not loaded from a file.
pub const IN_MEMORY: &str = "<in-memory index>";

/// The on-disk formats of an [`EmbeddingIndex`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IndexFormat {
    /// `.safetensors`: embeddings, ids and model in one file.
    Safetensors,
    /// `.npy` plus a `.ids.txt` side file.
    Npy,
}

impl IndexFormat {
    /// The format named by `path`'s extension (`safetensors` or `npy`, case-insensitive).
    ///
    /// # Errors
    /// [`Error::UnknownIndexFormat`] for any other extension, or none.
    pub fn from_path(path: &Path) -> Result<Self> {
        let ext = path
            .extension()
            .map(|e| e.to_string_lossy().to_ascii_lowercase());
        match ext.as_deref() {
            Some("safetensors") => Ok(Self::Safetensors),
            Some("npy") => Ok(Self::Npy),
            _ => Err(Error::UnknownIndexFormat {
                path: path.to_path_buf(),
            }),
        }
    }
}

/// The ids side file of an `.npy` index: the same path with the extension `ids.txt`
/// (`dir/out.npy` -> `dir/out.ids.txt`).
pub fn ids_path(npy: &Path) -> PathBuf {
    npy.with_extension("ids.txt")
}

/// One search result.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct SearchHit {
    /// 1-based rank.
    pub rank: usize,
    /// The document id.
    pub id: String,
    /// The dot product of the query and document embeddings.
    pub score: f32,
    /// The document's row in the index.
    pub row: usize,
}

/// Embeddings of `N` documents: an `[N, d]` row-major `f32` matrix and one id per row.
///
/// # File formats (chosen by the extension, see [`IndexFormat`])
/// - **`.safetensors`**: one tensor `"embeddings"`, dtype `F32`, shape `[N, d]`, row `i` the
///   embedding of document `ids[i]`. The safetensors metadata (`__metadata__`, string to string)
///   holds `"ids"` (a JSON array of the `N` ids, as a string), `"model"` (the model directory the
///   embeddings came from) and `"format"` = `"infembed-index/1"`. Loads back completely.
/// - **`.npy`**: NumPy format 1.0, dtype `<f4` (little-endian `f32`), C order, shape `(N, d)`,
///   header padded to a multiple of 64 bytes, readable with `numpy.load`. The ids go to a side file
///   next to it, [`ids_path`] (`out.npy` -> `out.ids.txt`), one id per line in row order; ids
///   containing a line break are rejected. `.npy` keeps no model name: loading one gives an empty
///   [`EmbeddingIndex::model`].
///
/// Files are written atomically and durably ([`infembed_data::write_atomic`]): to a temporary
/// file beside the target, synced, then renamed.
///
/// # Search
/// [`EmbeddingIndex::top_k`] scores every row by its dot product with the query (cosine
/// similarity, since infembed's embeddings are L2-normalized) and ranks by score descending, ties
/// by document id **descending** (byte order), the evaluation harness's rule
/// ([`TieBreak::DocIdDescending`], as in mteb), so that a search and an evaluation run agree.
#[derive(Debug, Clone, PartialEq)]
pub struct EmbeddingIndex {
    /// Document ids, one per row, unique.
    pub ids: Vec<String>,
    /// Row-major `[N, d]` embeddings: row `i` is `embeddings[i * dim..(i + 1) * dim]`.
    pub embeddings: Vec<f32>,
    /// The embedding dimension `d`.
    pub dim: usize,
    /// The model (directory) that produced the embeddings; empty when unknown.
    pub model: String,
    /// The file it was loaded from or last saved to, named by errors; `None` when only in memory.
    pub source: Option<PathBuf>,
}

impl EmbeddingIndex {
    /// An index over `ids` and their row-major embeddings.
    ///
    /// # Errors
    /// [`Error::IndexShape`] when `dim` is 0, the matrix does not hold `ids.len() * dim` values,
    /// a value is not finite, or an id repeats.
    pub fn new(
        ids: Vec<String>,
        embeddings: Vec<f32>,
        dim: usize,
        model: impl Into<String>,
    ) -> Result<Self> {
        let index = Self {
            ids,
            embeddings,
            dim,
            model: model.into(),
            source: None,
        };
        index
            .validate()
            .map_err(|problem| Error::IndexShape { problem })?;
        Ok(index)
    }

    /// Checks the invariants, returning the problem in words.
    fn validate(&self) -> std::result::Result<(), String> {
        if self.dim == 0 {
            return Err("the embedding dimension is 0".into());
        }
        if self.embeddings.len() != self.ids.len() * self.dim {
            return Err(format!(
                "{} values for {} ids of dimension {} (expected {})",
                self.embeddings.len(),
                self.ids.len(),
                self.dim,
                self.ids.len() * self.dim
            ));
        }
        if let Some(i) = self.embeddings.iter().position(|v| !v.is_finite()) {
            return Err(format!(
                "non-finite value in row {} (id `{}`)",
                i / self.dim,
                self.ids[i / self.dim]
            ));
        }
        let mut seen = HashMap::with_capacity(self.ids.len());
        for (row, id) in self.ids.iter().enumerate() {
            if let Some(first) = seen.insert(id.as_str(), row) {
                return Err(format!("id `{id}` appears in rows {first} and {row}"));
            }
        }
        Ok(())
    }

    /// Number of documents `N`.
    pub fn len(&self) -> usize {
        self.ids.len()
    }

    /// Whether the index holds no document.
    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    /// Row `i`'s embedding (`d` values).
    ///
    /// # Panics
    /// When `i >= len()`.
    pub fn row(&self, i: usize) -> &[f32] {
        &self.embeddings[i * self.dim..(i + 1) * self.dim]
    }

    /// The path errors name for this index: its file, or [`IN_MEMORY`].
    pub fn source_path(&self) -> PathBuf {
        self.source
            .clone()
            .unwrap_or_else(|| PathBuf::from(IN_MEMORY))
    }

    /// Errors unless a model producing `model_dim`-dimensional embeddings can search this index.
    ///
    /// # Errors
    /// [`Error::DimensionMismatch`] naming the index file, both dimensions and `model`.
    pub fn check_dim(&self, model_dim: usize, model: &str) -> Result<()> {
        if model_dim == self.dim {
            return Ok(());
        }
        Err(Error::DimensionMismatch {
            index: self.source_path(),
            index_dim: self.dim,
            model: model.to_string(),
            model_dim,
        })
    }

    /// The dot product of `query` with every row, in row order (summed in `f32`, left to right).
    ///
    /// # Errors
    /// [`Error::DimensionMismatch`] when `query.len() != dim`; [`Error::IndexShape`] when the
    /// query holds a non-finite value.
    pub fn scores(&self, query: &[f32]) -> Result<Vec<f32>> {
        self.check_dim(query.len(), "of the query embedding")?;
        if query.iter().any(|v| !v.is_finite()) {
            return Err(Error::IndexShape {
                problem: "the query embedding holds a non-finite value".into(),
            });
        }
        Ok(self
            .embeddings
            .chunks_exact(self.dim)
            .map(|row| row.iter().zip(query).map(|(a, b)| a * b).sum())
            .collect())
    }

    /// The `k` best documents for `query` (fewer when the index is smaller): score descending,
    /// ties by document id descending ([`TieBreak::DocIdDescending`]); ranks start at 1.
    ///
    /// # Errors
    /// As [`EmbeddingIndex::scores`].
    pub fn top_k(&self, query: &[f32], k: usize) -> Result<Vec<SearchHit>> {
        let scores = self.scores(query)?;
        let entries = scores
            .iter()
            .enumerate()
            .map(|(row, &s)| (row, f64::from(s)))
            .collect();
        Ok(top_k(entries, &self.ids, k, TieBreak::DocIdDescending)
            .into_iter()
            .enumerate()
            .map(|(i, (row, _))| SearchHit {
                rank: i + 1,
                id: self.ids[row].clone(),
                score: scores[row],
                row,
            })
            .collect())
    }

    /// Saves to `path` in the format its extension names ([`IndexFormat::from_path`]); for `.npy`
    /// also writes [`ids_path`]. Records `path` as [`EmbeddingIndex::source`].
    ///
    /// # Errors
    /// [`Error::UnknownIndexFormat`], [`Error::IndexShape`] (broken invariants, or an id with a
    /// line break for `.npy`), [`Error::Write`].
    pub fn save(&mut self, path: impl AsRef<Path>) -> Result<()> {
        let path = path.as_ref();
        let format = IndexFormat::from_path(path)?;
        self.validate()
            .map_err(|problem| Error::IndexShape { problem })?;
        match format {
            IndexFormat::Safetensors => write_atomic(path, &self.safetensors_bytes(path)?)?,
            IndexFormat::Npy => {
                if let Some(id) = self.ids.iter().find(|id| id.contains(['\n', '\r'])) {
                    return Err(Error::IndexShape {
                        problem: format!(
                            "id {id:?} contains a line break, which {} cannot hold; save as \
                             .safetensors instead",
                            ids_path(path).display()
                        ),
                    });
                }
                write_atomic(path, &self.npy_bytes())?;
                let mut ids = self.ids.join("\n");
                ids.push('\n');
                write_atomic(&ids_path(path), ids.as_bytes())?;
            }
        }
        self.source = Some(path.to_path_buf());
        Ok(())
    }

    /// Loads an index saved by [`EmbeddingIndex::save`] (or any file of the same layout).
    ///
    /// # Errors
    /// [`Error::UnknownIndexFormat`], [`Error::Read`] (the file or the ids side file),
    /// [`Error::Safetensors`], [`Error::IndexFormat`] naming what is wrong.
    pub fn load(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let format = IndexFormat::from_path(path)?;
        let bytes = std::fs::read(path).map_err(|source| Error::Read {
            path: path.to_path_buf(),
            source,
        })?;
        let mut index = match format {
            IndexFormat::Safetensors => Self::from_safetensors(path, &bytes)?,
            IndexFormat::Npy => Self::from_npy(path, &bytes)?,
        };
        index.validate().map_err(|problem| Error::IndexFormat {
            path: path.to_path_buf(),
            problem,
        })?;
        index.source = Some(path.to_path_buf());
        Ok(index)
    }

    fn le_bytes(&self) -> Vec<u8> {
        self.embeddings
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect()
    }

    fn safetensors_bytes(&self, path: &Path) -> Result<Vec<u8>> {
        let data = self.le_bytes();
        let wrap = |source| Error::Safetensors {
            path: path.to_path_buf(),
            source,
        };
        let view = TensorView::new(Dtype::F32, vec![self.len(), self.dim], &data).map_err(wrap)?;
        let ids = serde_json::to_string(&self.ids).map_err(|e| Error::IndexShape {
            problem: format!("ids cannot be written as JSON: {e}"),
        })?;
        let metadata = HashMap::from([
            ("format".to_string(), FORMAT_TAG.to_string()),
            ("ids".to_string(), ids),
            ("model".to_string(), self.model.clone()),
        ]);
        safetensors::serialize([(EMBEDDINGS_TENSOR, view)], Some(metadata)).map_err(wrap)
    }

    fn from_safetensors(path: &Path, bytes: &[u8]) -> Result<Self> {
        let bad = |problem: String| Error::IndexFormat {
            path: path.to_path_buf(),
            problem,
        };
        let wrap = |source| Error::Safetensors {
            path: path.to_path_buf(),
            source,
        };
        let (_, metadata) = SafeTensors::read_metadata(bytes).map_err(wrap)?;
        let tensors = SafeTensors::deserialize(bytes).map_err(wrap)?;
        let view = tensors.tensor(EMBEDDINGS_TENSOR).map_err(|_| {
            bad(format!(
                "no tensor named `{EMBEDDINGS_TENSOR}` (was it written by `infembed embed`?)"
            ))
        })?;
        if view.dtype() != Dtype::F32 {
            return Err(bad(format!(
                "tensor `{EMBEDDINGS_TENSOR}` has dtype {:?}, expected F32",
                view.dtype()
            )));
        }
        let &[n, dim] = view.shape() else {
            return Err(bad(format!(
                "tensor `{EMBEDDINGS_TENSOR}` has shape {:?}, expected [N, d]",
                view.shape()
            )));
        };
        let info = metadata.metadata().clone().unwrap_or_default();
        let ids_json = info
            .get("ids")
            .ok_or_else(|| bad("no `ids` entry in the safetensors metadata".into()))?;
        let ids: Vec<String> = serde_json::from_str(ids_json).map_err(|e| {
            bad(format!(
                "metadata `ids` is not a JSON array of strings: {e}"
            ))
        })?;
        if ids.len() != n {
            return Err(bad(format!(
                "metadata lists {} ids for {n} embedding rows",
                ids.len()
            )));
        }
        Ok(Self {
            ids,
            embeddings: f32s(view.data()),
            dim,
            model: info.get("model").cloned().unwrap_or_default(),
            source: None,
        })
    }

    /// NumPy format 1.0: magic, version, u16 header length, a Python dict literal padded with
    /// spaces to end in `\n` at a multiple of 64 bytes, then the data.
    fn npy_bytes(&self) -> Vec<u8> {
        let mut header = format!(
            "{{'descr': '<f4', 'fortran_order': False, 'shape': ({}, {}), }}",
            self.len(),
            self.dim
        );
        let unpadded = NPY_MAGIC.len() + 2 + 2 + header.len() + 1;
        header.push_str(&" ".repeat(unpadded.next_multiple_of(64) - unpadded));
        header.push('\n');
        let header_len =
            u16::try_from(header.len()).expect("an npy header of two numbers is short");
        let mut out = Vec::with_capacity(unpadded + 64 + self.embeddings.len() * 4);
        out.extend_from_slice(NPY_MAGIC);
        out.extend_from_slice(&[1, 0]);
        out.extend_from_slice(&header_len.to_le_bytes());
        out.extend_from_slice(header.as_bytes());
        out.extend(self.le_bytes());
        out
    }

    fn from_npy(path: &Path, bytes: &[u8]) -> Result<Self> {
        let bad = |problem: String| Error::IndexFormat {
            path: path.to_path_buf(),
            problem,
        };
        let (header, data) = npy_header(bytes).map_err(bad)?;
        let field = |key: &str| {
            header
                .split_once(&format!("'{key}':"))
                .map(|(_, rest)| rest.trim_start())
                .ok_or_else(|| bad(format!("header has no `{key}`: {header}")))
        };
        let descr = field("descr")?;
        if !descr.starts_with("'<f4'") {
            return Err(bad(format!(
                "dtype must be '<f4' (little-endian float32), header says {header}"
            )));
        }
        if !field("fortran_order")?.starts_with("False") {
            return Err(bad("Fortran order is not supported; save in C order".into()));
        }
        let shape = field("shape")?;
        let inside = shape
            .strip_prefix('(')
            .and_then(|s| s.split_once(')'))
            .map(|(s, _)| s)
            .ok_or_else(|| bad(format!("cannot read the shape in {header}")))?;
        let dims: Vec<usize> = inside
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(|s| s.parse::<usize>())
            .collect::<std::result::Result<_, _>>()
            .map_err(|e| bad(format!("shape {inside:?}: {e}")))?;
        let &[n, dim] = dims.as_slice() else {
            return Err(bad(format!("shape ({inside}) is not 2-dimensional (N, d)")));
        };
        if data.len() != n * dim * 4 {
            return Err(bad(format!(
                "{} data bytes for shape ({n}, {dim}) of float32 (expected {})",
                data.len(),
                n * dim * 4
            )));
        }
        let ids_file = ids_path(path);
        let ids_text = std::fs::read_to_string(&ids_file).map_err(|source| Error::Read {
            path: ids_file.clone(),
            source,
        })?;
        let ids: Vec<String> = ids_text.lines().map(str::to_string).collect();
        if ids.len() != n {
            return Err(Error::IndexFormat {
                path: ids_file,
                problem: format!("{} ids for the {n} rows of {}", ids.len(), path.display()),
            });
        }
        Ok(Self {
            ids,
            embeddings: f32s(data),
            dim,
            model: String::new(),
            source: None,
        })
    }
}

const NPY_MAGIC: &[u8] = b"\x93NUMPY";

/// Splits an `.npy` file into its header dict text and its data (versions 1.0, 2.0, 3.0).
fn npy_header(bytes: &[u8]) -> std::result::Result<(&str, &[u8]), String> {
    if !bytes.starts_with(NPY_MAGIC) || bytes.len() < 10 {
        return Err("not a NumPy .npy file (bad magic)".into());
    }
    let (len, start) = match bytes[6] {
        1 => (usize::from(u16::from_le_bytes([bytes[8], bytes[9]])), 10),
        2 | 3 if bytes.len() >= 12 => (
            u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]) as usize,
            12,
        ),
        v => return Err(format!("unsupported .npy version {v}")),
    };
    let header = bytes
        .get(start..start + len)
        .ok_or_else(|| "truncated header".to_string())?;
    let header = std::str::from_utf8(header).map_err(|e| format!("header is not text: {e}"))?;
    Ok((header, &bytes[start + len..]))
}

fn f32s(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

/// [`infembed_data::write_atomic`], its error naming `path`.
fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    infembed_data::write_atomic(path, bytes).map_err(|source| Error::Write {
        path: path.to_path_buf(),
        source,
    })
}
