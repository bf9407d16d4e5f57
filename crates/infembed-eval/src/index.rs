//! [`EmbeddingIndex`]: a corpus's embeddings with their document ids, saved, loaded and mapped as
//! safetensors or NumPy `.npy` (`f32` or `f16`), and exact top-k search by dot product.
//!
//! The file formats and the search rule are documented at [`EmbeddingIndex`].

use std::borrow::Cow;
use std::collections::HashMap;
use std::io::{Seek, Write};
use std::path::{Path, PathBuf};

use infembed_data::AtomicFile;
use infembed_metrics::TieBreak;

use crate::error::{Error, Result};
use crate::scan::{self, Block, Isa, NonFinite};
use crate::store::{IndexDtype, Rows, RowsOf};

/// The name of the embeddings tensor in a safetensors index.
pub const EMBEDDINGS_TENSOR: &str = "embeddings";
/// The value of the `"format"` metadata key in a safetensors index.
pub const FORMAT_TAG: &str = "infembed-index/2";
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

/// Embeddings of `N` documents: an `[N, d]` row-major matrix of `f32` or `f16`
/// ([`IndexDtype`]) and one id per row.
///
/// # File formats (chosen by the extension, see [`IndexFormat`])
/// - **`.safetensors`** (`"format"` = `"infembed-index/2"`): the tensor `"embeddings"`, dtype
///   `F32` or `F16`, shape `[N, d]`, row `i` the embedding of document `i`; the ids as two
///   tensors, `"id_offsets"` (`U64`, `[N + 1]`, starting at 0) and `"id_bytes"` (`U8`, the UTF-8
///   ids end to end): id `i` is `id_bytes[id_offsets[i]..id_offsets[i + 1]]`. Keeping the ids
///   out of the JSON header keeps the header small at any `N` (readers refuse headers over
///   100 MB, which ids in it reached at about 8M documents). The metadata (`__metadata__`) holds
///   `"format"` and `"model"` (the model directory the embeddings came from). In Python:
///   `t = safetensors.numpy.load_file(f)`, then
///   `ids = [t["id_bytes"][a:b].tobytes().decode() for a, b in zip(o[:-1], o[1:])]` with
///   `o = t["id_offsets"]`. Files of the earlier layout (`"infembed-index/1"`: ids as a JSON
///   array in the metadata) still load.
/// - **`.npy`**: NumPy format 1.0, dtype `<f4` or `<f2` (little-endian), C order, shape `(N, d)`,
///   header padded to a multiple of 64 bytes, readable with `numpy.load` (also with
///   `mmap_mode="r"`). The ids go to a side file next to it, [`ids_path`] (`out.npy` ->
///   `out.ids.txt`), one id per line in row order; ids containing a line break are rejected.
///   `.npy` keeps no model name: loading one gives an empty [`EmbeddingIndex::model`].
///
/// Files are written atomically and durably ([`infembed_data::write_atomic`]): to a temporary
/// file beside the target, synced, then renamed.
///
/// # Loading
/// [`EmbeddingIndex::open`] maps the file into memory: opening takes the time of reading the ids,
/// whatever the matrix's size, and the pages are read as the search touches them (and shared with
/// the page cache). [`EmbeddingIndex::load`] reads the matrix into memory instead.
///
/// # Search
/// [`EmbeddingIndex::search_batch`] (and [`EmbeddingIndex::top_k`], one query) scores every row
/// by its dot product with each query (cosine similarity, since infembed's embeddings are
/// L2-normalized) chunk by chunk over the corpus, each query keeping a running top-k: memory
/// holds the index, one chunk and `O(k)` candidates per query, never a `[queries x N]` matrix.
/// Every score is the fused multiply-add chain over the dimensions in order, whatever the batch
/// and the processor's code path (AVX-512, AVX2 or portable), so a query gets the same hits
/// alone as in a batch. Hits are ranked by score descending, ties by document id **descending**
/// (byte order), the evaluation harness's rule ([`TieBreak::DocIdDescending`], as in mteb), so
/// that a search and an evaluation run agree.
#[derive(Debug, Clone, PartialEq)]
pub struct EmbeddingIndex {
    /// Document ids, one per row, unique.
    pub ids: Vec<String>,
    /// The row-major `[N, d]` values.
    rows: Rows,
    /// The embedding dimension `d`.
    pub dim: usize,
    /// The model (directory) that produced the embeddings; empty when unknown.
    pub model: String,
    /// The file it was loaded from or last saved to, named by errors; `None` when only in memory.
    pub source: Option<PathBuf>,
}

impl EmbeddingIndex {
    /// An index over `ids` and their row-major embeddings (stored as `f32`; see
    /// [`EmbeddingIndex::to_dtype`]).
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
            rows: Rows::F32(embeddings),
            dim,
            model: model.into(),
            source: None,
        };
        index
            .validate(true)
            .map_err(|problem| Error::IndexShape { problem })?;
        Ok(index)
    }

    /// Checks the invariants (the values' finiteness only with `values`), returning the problem
    /// in words.
    fn validate(&self, values: bool) -> std::result::Result<(), String> {
        if self.dim == 0 {
            return Err("the embedding dimension is 0".into());
        }
        if self.rows.len() != self.ids.len() * self.dim {
            return Err(format!(
                "{} values for {} ids of dimension {} (expected {})",
                self.rows.len(),
                self.ids.len(),
                self.dim,
                self.ids.len() * self.dim
            ));
        }
        if values && let Some(i) = self.rows.first_non_finite() {
            return Err(format!(
                "non-finite value in row {} (id `{}`)",
                i / self.dim,
                self.ids[i / self.dim]
            ));
        }
        repeated_id(&self.ids).map_or(Ok(()), Err)
    }

    /// Number of documents `N`.
    pub fn len(&self) -> usize {
        self.ids.len()
    }

    /// Whether the index holds no document.
    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    /// The number type the embeddings are stored in.
    pub fn dtype(&self) -> IndexDtype {
        self.rows.dtype()
    }

    /// Whether the embeddings are read from a memory-mapped file ([`EmbeddingIndex::open`]).
    pub fn is_mapped(&self) -> bool {
        self.rows.is_mapped()
    }

    /// The same index with its embeddings stored as `dtype`, in memory (`f16` rounds each value
    /// to the nearest half-precision number). [`EmbeddingIndex::save`] then writes that type.
    ///
    /// # Errors
    /// [`Error::IndexShape`] naming the row and id of a value beyond `f16`'s range (magnitude
    /// over 65504; unit-length embeddings are far inside it).
    pub fn to_dtype(&self, dtype: IndexDtype) -> Result<Self> {
        let rows = self.rows.to_dtype(dtype).map_err(|i| Error::IndexShape {
            problem: f16_range(i / self.dim, Some(&self.ids[i / self.dim])),
        })?;
        Ok(Self {
            ids: self.ids.clone(),
            rows,
            dim: self.dim,
            model: self.model.clone(),
            source: self.source.clone(),
        })
    }

    /// Row `i`'s embedding (`d` values): borrowed when stored as `f32`, widened from `f16`.
    ///
    /// # Panics
    /// When `i >= len()`.
    pub fn row(&self, i: usize) -> Cow<'_, [f32]> {
        assert!(i < self.len(), "row {i} of an index of {} rows", self.len());
        self.rows.f32s(i * self.dim, (i + 1) * self.dim)
    }

    /// The whole `[N, d]` matrix, row-major: borrowed when stored as `f32`, widened from `f16`.
    pub fn embeddings(&self) -> Cow<'_, [f32]> {
        self.rows.f32s(0, self.rows.len())
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

    /// Checks a batch of row-major queries: whole rows of this index's dimension, finite.
    fn check_queries(&self, queries: &[f32]) -> Result<()> {
        if !queries.len().is_multiple_of(self.dim) {
            return Err(Error::IndexShape {
                problem: format!(
                    "{} query values are not whole rows of the index's dimension {} ({})",
                    queries.len(),
                    self.dim,
                    self.source_path().display()
                ),
            });
        }
        if let Some(i) = queries.iter().position(|v| !v.is_finite()) {
            return Err(Error::IndexShape {
                problem: format!("query embedding {} holds a non-finite value", i / self.dim),
            });
        }
        Ok(())
    }

    /// A non-finite stored value found by a search, as an error naming the file and the row.
    fn non_finite(&self, at: NonFinite) -> Error {
        Error::IndexFormat {
            path: self.source_path(),
            problem: format!(
                "non-finite value in row {} (id `{}`)",
                at.row, self.ids[at.row]
            ),
        }
    }

    /// The dot product of `query` with every row, in row order (the fused multiply-add chain
    /// that [`EmbeddingIndex::search_batch`] ranks by).
    ///
    /// # Errors
    /// [`Error::DimensionMismatch`] when `query.len() != dim`; [`Error::IndexShape`] when the
    /// query holds a non-finite value; [`Error::IndexFormat`] for a non-finite stored value (in
    /// a mapped file, which is not checked when opened).
    pub fn scores(&self, query: &[f32]) -> Result<Vec<f32>> {
        self.check_dim(query.len(), "of the query embedding")?;
        self.check_queries(query)?;
        let source = RowsOf {
            rows: &self.rows,
            dim: self.dim,
        };
        let mut out = scan::all_scores(Isa::detect(), &source, self.dim, query)
            .map_err(|at| self.non_finite(at))?;
        Ok(out.pop().unwrap_or_default())
    }

    /// The `k` best documents for `query` (fewer when the index is smaller): score descending,
    /// ties by document id descending ([`TieBreak::DocIdDescending`]); ranks start at 1.
    ///
    /// # Errors
    /// As [`EmbeddingIndex::scores`].
    pub fn top_k(&self, query: &[f32], k: usize) -> Result<Vec<SearchHit>> {
        self.check_dim(query.len(), "of the query embedding")?;
        Ok(self.search_batch(query, k)?.pop().unwrap_or_default())
    }

    /// The `k` best documents for each query of a row-major batch (`queries.len() / dim`
    /// queries), as [`EmbeddingIndex::top_k`] gives them one by one, in one pass over the index.
    ///
    /// # Errors
    /// [`Error::IndexShape`] when `queries` is not whole rows of `dim` or holds a non-finite
    /// value; [`Error::IndexFormat`] for a non-finite stored value.
    pub fn search_batch(&self, queries: &[f32], k: usize) -> Result<Vec<Vec<SearchHit>>> {
        self.check_queries(queries)?;
        let source = RowsOf {
            rows: &self.rows,
            dim: self.dim,
        };
        let isa = Isa::detect();
        log::debug!(
            "searching {} queries over {} rows ({}, {} kernel)",
            queries.len() / self.dim,
            self.len(),
            self.dtype(),
            isa.name()
        );
        let best = scan::search(
            isa,
            &source,
            &self.ids,
            self.dim,
            queries,
            k,
            TieBreak::DocIdDescending,
        )
        .map_err(|at| self.non_finite(at))?;
        Ok(best
            .into_iter()
            .map(|hits| {
                hits.into_iter()
                    .enumerate()
                    .map(|(i, (row, score))| SearchHit {
                        rank: i + 1,
                        id: self.ids[row].clone(),
                        score: score as f32,
                        row,
                    })
                    .collect()
            })
            .collect())
    }

    /// Saves to `path` in the format its extension names ([`IndexFormat::from_path`]) and the
    /// index's [`IndexDtype`]; for `.npy` also writes [`ids_path`]. Records `path` as
    /// [`EmbeddingIndex::source`].
    ///
    /// # Errors
    /// [`Error::UnknownIndexFormat`], [`Error::IndexShape`] (broken invariants, or an id with a
    /// line break for `.npy`), [`Error::Write`].
    pub fn save(&mut self, path: impl AsRef<Path>) -> Result<()> {
        let path = path.as_ref();
        IndexFormat::from_path(path)?;
        self.validate(true)
            .map_err(|problem| Error::IndexShape { problem })?;
        let mut writer = IndexWriter::create(path, &self.ids, self.dim, &self.model, self.dtype())?;
        let total = self.rows.len();
        for a in (0..total).step_by(1 << 16) {
            writer.write_block(self.rows.values(a, (a + (1 << 16)).min(total)))?;
        }
        writer.finish()?;
        self.source = Some(path.to_path_buf());
        Ok(())
    }

    /// Loads an index saved by [`EmbeddingIndex::save`] or `infembed embed` (or any file of the
    /// same layout; `.safetensors` files of the earlier `infembed-index/1` layout, ids in the
    /// header, load too) into memory, in the type it was stored in. The rows are read straight
    /// into the index's matrix, block by block: loading holds the matrix once, not the file and
    /// the matrix.
    ///
    /// # Errors
    /// [`Error::UnknownIndexFormat`], [`Error::Read`] (the file or the ids side file),
    /// [`Error::IndexFormat`] naming what is wrong (a non-finite value among them).
    pub fn load(path: impl AsRef<Path>) -> Result<Self> {
        read_index(path.as_ref(), false)
    }

    /// Opens an index file as [`EmbeddingIndex::load`] does, but maps the matrix into memory
    /// instead of reading it (see the safety note of the crate's `mmap` module): the ids are
    /// read and checked, the values are read by the searches that touch them, which also report
    /// a non-finite value. Where the platform cannot use the stored bytes in place (big-endian,
    /// or a file whose matrix is not aligned to its type), the matrix is read instead.
    ///
    /// # Errors
    /// As [`EmbeddingIndex::load`], but without the scan for non-finite values.
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        read_index(path.as_ref(), true)
    }
}

/// Reads (or, with `map`, maps) an index file and checks it.
fn read_index(path: &Path, map: bool) -> Result<EmbeddingIndex> {
    let format = IndexFormat::from_path(path)?;
    let rerr = |source| Error::Read {
        path: path.to_path_buf(),
        source,
    };
    let file = std::fs::File::open(path).map_err(rerr)?;
    let file_len = file.metadata().map_err(rerr)?.len();
    let mapped = if map {
        Some(std::sync::Arc::new(
            crate::mmap::map_read_only(&file).map_err(rerr)?,
        ))
    } else {
        None
    };
    let mut reader = std::io::BufReader::with_capacity(1 << 20, file);
    let mut index = match format {
        IndexFormat::Safetensors => read_safetensors(path, &mut reader, file_len, mapped)?,
        IndexFormat::Npy => read_npy(path, &mut reader, file_len, mapped)?,
    };
    let scanned = !index.rows.is_mapped();
    index
        .validate(scanned)
        .map_err(|problem| Error::IndexFormat {
            path: path.to_path_buf(),
            problem,
        })?;
    index.source = Some(path.to_path_buf());
    Ok(index)
}

/// The matrix of `count` values of `dtype` that starts at byte `start` of the file `reader`
/// reads (positioned there): mapped in place when `mapped` allows it (the reader then skips the
/// bytes), read otherwise.
fn read_rows(
    reader: &mut (impl std::io::Read + std::io::Seek),
    mapped: Option<&std::sync::Arc<memmap2::Mmap>>,
    start: u64,
    count: usize,
    dtype: IndexDtype,
) -> std::io::Result<Rows> {
    if let Some(map) = mapped
        && let Some(rows) = usize::try_from(start)
            .ok()
            .and_then(|start| Rows::map(map.clone(), start, count, dtype))
    {
        reader.seek(std::io::SeekFrom::Current((count * dtype.width()) as i64))?;
        return Ok(rows);
    }
    Ok(match dtype {
        IndexDtype::F32 => Rows::F32(read_f32s(reader, count)?),
        IndexDtype::F16 => Rows::F16(read_le(reader, count, |b| {
            half::f16::from_bits(u16::from_le_bytes(b))
        })?),
    })
}

const NPY_MAGIC: &[u8] = b"\x93NUMPY";

/// The name of the tensor of a safetensors index holding the ids' byte offsets (`U64`, `[N + 1]`:
/// id `i` is `id_bytes[id_offsets[i]..id_offsets[i + 1]]`, UTF-8).
pub const ID_OFFSETS_TENSOR: &str = "id_offsets";
/// The name of the tensor of a safetensors index holding the ids' UTF-8 bytes (`U8`), end to end.
pub const ID_BYTES_TENSOR: &str = "id_bytes";
/// The `"format"` of the earlier safetensors layout, whose ids were a JSON array in the header
/// (read, no longer written: the header's 100 MB limit stopped at about 8M ids).
pub const FORMAT_TAG_V1: &str = "infembed-index/1";

/// Writes an index file row block by row block, without holding the matrix: the header (which
/// needs the row count and the dimension) first, then the rows in order, then (safetensors) the
/// ids, to a temporary file that [`IndexWriter::finish`] syncs and renames over the target (for
/// `.npy` after writing the ids side file). [`EmbeddingIndex::save`] and the streaming embedder
/// ([`crate::embed_file`]) both write through it, so their files are the same bytes; use it to
/// build an index larger than memory from embeddings computed elsewhere. A writer dropped before
/// [`IndexWriter::finish`] leaves the target untouched.
///
/// ```no_run
/// # fn main() -> infembed_eval::Result<()> {
/// use infembed_eval::{IndexDtype, IndexWriter};
/// let ids: Vec<String> = (0..3).map(|i| format!("doc{i}")).collect();
/// let mut writer = IndexWriter::create("out.safetensors".as_ref(), &ids, 2, "my-model", IndexDtype::F16)?;
/// writer.write_rows(&[1.0, 0.0, 0.0, 1.0])?; // rows 0 and 1
/// writer.write_rows(&[0.6, 0.8])?; // row 2
/// writer.finish()?;
/// # Ok(()) }
/// ```
pub struct IndexWriter {
    file: AtomicFile,
    path: PathBuf,
    layout: IndexLayout,
    expected: usize,
    written: usize,
    dtype: IndexDtype,
    dim: usize,
}

impl IndexWriter {
    /// Checks that `ids` are unique and fit the format of `path` (an extension of
    /// [`IndexFormat`]) and opens the temporary file with the header written; the rows are
    /// stored as `dtype`.
    ///
    /// # Errors
    /// [`Error::UnknownIndexFormat`], [`Error::IndexShape`] (dimension 0, a repeated id, an id
    /// with a line break for `.npy`), [`Error::Write`].
    pub fn create(
        path: &Path,
        ids: &[String],
        dim: usize,
        model: &str,
        dtype: IndexDtype,
    ) -> Result<Self> {
        let format = IndexFormat::from_path(path)?;
        if dim == 0 {
            return Err(Error::IndexShape {
                problem: "the embedding dimension is 0".into(),
            });
        }
        if let Some(problem) = repeated_id(ids) {
            return Err(Error::IndexShape { problem });
        }
        let layout = IndexLayout::new(path, format, ids, dim, model, dtype)?;
        let werr = |source| Error::Write {
            path: path.to_path_buf(),
            source,
        };
        let mut file = AtomicFile::create(path).map_err(werr)?;
        file.write_all(&layout.header).map_err(werr)?;
        Ok(Self {
            file,
            path: path.to_path_buf(),
            layout,
            expected: ids.len() * dim,
            written: 0,
            dtype,
            dim,
        })
    }

    /// Appends row-major `f32` values, the next rows in order, stored as the writer's type.
    ///
    /// # Errors
    /// [`Error::IndexShape`] for a non-finite value (naming its row) or more values than the
    /// ids declare; [`Error::Write`].
    pub fn write_rows(&mut self, values: &[f32]) -> Result<()> {
        if let Some(i) = values.iter().position(|v| !v.is_finite()) {
            return Err(Error::IndexShape {
                problem: format!(
                    "non-finite value in row {} written to {}",
                    (self.written + i) / self.dim,
                    self.path.display()
                ),
            });
        }
        self.write_block(Block::F32(values))
    }

    /// Appends row-major values (whole rows), converted to the writer's type (`f32` to `f16`
    /// rounds to nearest).
    ///
    /// # Errors
    /// [`Error::IndexShape`] past the declared size; [`Error::Write`].
    pub(crate) fn write_block(&mut self, values: Block<'_>) -> Result<()> {
        use half::slice::HalfFloatSliceExt;
        let len = values.len();
        if self.written + len > self.expected {
            return Err(Error::IndexShape {
                problem: format!(
                    "{} values written to {}, which declares {}",
                    self.written + len,
                    self.path.display(),
                    self.expected
                ),
            });
        }
        // In blocks, so that saving a large index does not hold a second copy of it.
        const BLOCK: usize = 1 << 16;
        let mut bytes = Vec::with_capacity(len.min(BLOCK) * self.dtype.width());
        // Conversion buffers, sized by the one branch that needs each.
        let (mut wide, mut narrow) = (Vec::new(), Vec::new());
        for a in (0..len).step_by(BLOCK) {
            let b = (a + BLOCK).min(len);
            bytes.clear();
            match (values, self.dtype) {
                (Block::F32(v), IndexDtype::F32) => {
                    bytes.extend(v[a..b].iter().flat_map(|x| x.to_le_bytes()));
                }
                (Block::F16(v), IndexDtype::F16) => {
                    bytes.extend(v[a..b].iter().flat_map(|x| x.to_bits().to_le_bytes()));
                }
                (Block::F32(v), IndexDtype::F16) => {
                    narrow.resize(b - a, half::f16::ZERO);
                    narrow.convert_from_f32_slice(&v[a..b]);
                    if let Some(i) = crate::store::overflow(&v[a..b], &narrow) {
                        let row = (self.written + a + i) / self.dim;
                        return Err(Error::IndexShape {
                            problem: format!(
                                "{} (writing {})",
                                f16_range(row, None),
                                self.path.display()
                            ),
                        });
                    }
                    bytes.extend(narrow.iter().flat_map(|x| x.to_bits().to_le_bytes()));
                }
                (block @ Block::F16(_), IndexDtype::F32) => {
                    wide.resize(b - a, 0f32);
                    block.copy_to_f32(a, b, &mut wide);
                    bytes.extend(wide.iter().flat_map(|x| x.to_le_bytes()));
                }
            }
            self.file.write_all(&bytes).map_err(|source| Error::Write {
                path: self.path.clone(),
                source,
            })?;
        }
        self.written += len;
        Ok(())
    }

    /// Checks that every row was written, writes what follows the rows (safetensors: the ids;
    /// `.npy`: the ids side file), then syncs and renames the index file into place.
    ///
    /// # Errors
    /// [`Error::IndexShape`] for missing rows or a partial last row; [`Error::Write`].
    pub fn finish(mut self) -> Result<()> {
        if self.written != self.expected {
            return Err(Error::IndexShape {
                problem: format!(
                    "{} of the {} values of {} were written",
                    self.written,
                    self.expected,
                    self.path.display()
                ),
            });
        }
        let werr = |path: &Path| {
            let path = path.to_path_buf();
            move |source| Error::Write { path, source }
        };
        self.file
            .write_all(&self.layout.trailer)
            .map_err(werr(&self.path))?;
        if let Some(ids) = &self.layout.ids_text {
            write_atomic(&ids_path(&self.path), ids.as_bytes())?;
        }
        self.file.commit().map_err(werr(&self.path))
    }
}

/// The bytes around the rows of an index file of `ids.len()` rows of dimension `dim`.
pub(crate) struct IndexLayout {
    /// Before the rows.
    pub(crate) header: Vec<u8>,
    /// After the rows (safetensors: the `id_offsets` and `id_bytes` tensors).
    trailer: Vec<u8>,
    /// The `.npy` ids side file's text.
    ids_text: Option<String>,
}

impl IndexLayout {
    /// - safetensors (`infembed-index/2`): u64 LE header length, then a JSON header (keys
    ///   sorted: `__metadata__` with `format` and `model`; the tensors `embeddings` F32 or F16
    ///   `[N, d]`,
    ///   `id_bytes` U8 `[B]`, `id_offsets` U64 `[N + 1]`), padded with spaces to a multiple of 8
    ///   bytes as the format recommends; the data holds the embeddings, then the offsets, then the
    ///   ids' bytes.
    /// - NumPy format 1.0: magic, version, u16 header length, a Python dict literal padded with
    ///   spaces to end in `\n` at a multiple of 64 bytes; the ids go to the side file.
    ///
    /// # Errors
    /// [`Error::IndexShape`] for an id with a line break in `.npy`.
    pub(crate) fn new(
        path: &Path,
        format: IndexFormat,
        ids: &[String],
        dim: usize,
        model: &str,
        dtype: IndexDtype,
    ) -> Result<Self> {
        let n = ids.len();
        match format {
            IndexFormat::Safetensors => {
                let id_bytes: usize = ids.iter().map(String::len).sum();
                let rows = n * dim * dtype.width();
                let offsets = (n + 1) * 8;
                let header = serde_json::json!({
                    "__metadata__": { "format": FORMAT_TAG, "model": model },
                    EMBEDDINGS_TENSOR: {
                        "dtype": dtype.safetensors_name(), "shape": [n, dim],
                        "data_offsets": [0, rows],
                    },
                    ID_OFFSETS_TENSOR: {
                        "dtype": "U64", "shape": [n + 1],
                        "data_offsets": [rows, rows + offsets],
                    },
                    ID_BYTES_TENSOR: {
                        "dtype": "U8", "shape": [id_bytes],
                        "data_offsets": [rows + offsets, rows + offsets + id_bytes],
                    },
                });
                let mut text = header.to_string();
                text.push_str(&" ".repeat(text.len().next_multiple_of(8) - text.len()));
                let mut out = Vec::with_capacity(8 + text.len());
                out.extend_from_slice(&(text.len() as u64).to_le_bytes());
                out.extend_from_slice(text.as_bytes());
                let mut trailer = Vec::with_capacity(offsets + id_bytes);
                let mut at = 0u64;
                trailer.extend_from_slice(&at.to_le_bytes());
                for id in ids {
                    at += id.len() as u64;
                    trailer.extend_from_slice(&at.to_le_bytes());
                }
                for id in ids {
                    trailer.extend_from_slice(id.as_bytes());
                }
                Ok(Self {
                    header: out,
                    trailer,
                    ids_text: None,
                })
            }
            IndexFormat::Npy => {
                if let Some(id) = ids.iter().find(|id| id.contains(['\n', '\r'])) {
                    return Err(Error::IndexShape {
                        problem: format!(
                            "id {id:?} contains a line break, which {} cannot hold; save as \
                             .safetensors instead",
                            ids_path(path).display()
                        ),
                    });
                }
                let mut header = format!(
                    "{{'descr': '{}', 'fortran_order': False, 'shape': ({n}, {dim}), }}",
                    dtype.npy_descr()
                );
                let unpadded = NPY_MAGIC.len() + 2 + 2 + header.len() + 1;
                header.push_str(&" ".repeat(unpadded.next_multiple_of(64) - unpadded));
                header.push('\n');
                let header_len =
                    u16::try_from(header.len()).expect("an npy header of two numbers is short");
                let mut out = Vec::with_capacity(header.len() + 10);
                out.extend_from_slice(NPY_MAGIC);
                out.extend_from_slice(&[1, 0]);
                out.extend_from_slice(&header_len.to_le_bytes());
                out.extend_from_slice(header.as_bytes());
                let mut text = ids.join("\n");
                text.push('\n');
                Ok(Self {
                    header: out,
                    trailer: Vec::new(),
                    ids_text: Some(text),
                })
            }
        }
    }
}

/// One tensor entry of a safetensors header.
#[derive(serde::Deserialize)]
struct TensorEntry {
    dtype: String,
    shape: Vec<usize>,
    data_offsets: [usize; 2],
}

/// Reads a safetensors index: the header checked as the format requires (tensors that tile the
/// data exactly, sizes that match dtype and shape), the embeddings read straight into the matrix.
fn read_safetensors(
    path: &Path,
    reader: &mut (impl std::io::Read + Seek),
    file_len: u64,
    mapped: Option<std::sync::Arc<memmap2::Mmap>>,
) -> Result<EmbeddingIndex> {
    let bad = |problem: String| Error::IndexFormat {
        path: path.to_path_buf(),
        problem,
    };
    let rerr = |source| Error::Read {
        path: path.to_path_buf(),
        source,
    };
    let mut len = [0u8; 8];
    reader
        .read_exact(&mut len)
        .map_err(|_| bad("not a safetensors file (shorter than 8 bytes)".into()))?;
    let header_len = u64::from_le_bytes(len);
    if header_len > file_len.saturating_sub(8) {
        return Err(bad(format!(
            "not a safetensors file (its header length {header_len} exceeds the file)"
        )));
    }
    let mut header = vec![0u8; header_len as usize];
    reader.read_exact(&mut header).map_err(rerr)?;
    let mut entries: serde_json::Map<String, serde_json::Value> = serde_json::from_slice(&header)
        .map_err(|e| {
        bad(format!(
            "not a safetensors file (header is not a JSON object: {e})"
        ))
    })?;
    let metadata: HashMap<String, String> = match entries.remove("__metadata__") {
        Some(m) => serde_json::from_value(m)
            .map_err(|e| bad(format!("`__metadata__` is not a map of strings: {e}")))?,
        None => HashMap::new(),
    };
    let mut tensors = HashMap::new();
    for (name, value) in entries {
        let entry: TensorEntry =
            serde_json::from_value(value).map_err(|e| bad(format!("tensor `{name}`: {e}")))?;
        tensors.insert(name, entry);
    }
    // The tensors must tile the data from 0 to its end, each the size its dtype and shape say.
    let mut spans: Vec<(&String, &TensorEntry)> = tensors.iter().collect();
    spans.sort_by_key(|(_, t)| t.data_offsets);
    let mut end = 0usize;
    for (name, t) in &spans {
        let [start, stop] = t.data_offsets;
        let width = match t.dtype.as_str() {
            "F64" | "I64" | "U64" => 8,
            "F32" | "I32" | "U32" => 4,
            "F16" | "BF16" | "I16" | "U16" => 2,
            "U8" | "I8" | "BOOL" => 1,
            other => return Err(bad(format!("tensor `{name}` has unknown dtype {other}"))),
        };
        let size = t
            .shape
            .iter()
            .try_fold(width, |acc: usize, &d| acc.checked_mul(d));
        if start != end || stop < start || Some(stop - start) != size {
            return Err(bad(format!(
                "tensor `{name}` has data offsets [{start}, {stop}] for dtype {} and shape {:?}; \
                 the tensors must tile the data",
                t.dtype, t.shape
            )));
        }
        end = stop;
    }
    if end as u64 != file_len - 8 - header_len {
        return Err(bad(format!(
            "the tensors cover {end} bytes of data, the file holds {}",
            file_len - 8 - header_len
        )));
    }
    let view = tensors.get(EMBEDDINGS_TENSOR).ok_or_else(|| {
        bad(format!(
            "no tensor named `{EMBEDDINGS_TENSOR}` (was it written by `infembed embed`?)"
        ))
    })?;
    let dtype = IndexDtype::from_name(&view.dtype).ok_or_else(|| {
        bad(format!(
            "tensor `{EMBEDDINGS_TENSOR}` has dtype {}, expected F32 or F16",
            view.dtype
        ))
    })?;
    let &[n, dim] = view.shape.as_slice() else {
        return Err(bad(format!(
            "tensor `{EMBEDDINGS_TENSOR}` has shape {:?}, expected [N, d]",
            view.shape
        )));
    };
    // Read the data in offset order: the embeddings into the matrix (or mapped), the rest as
    // bytes.
    let mut rows = Rows::F32(Vec::new());
    let mut others: HashMap<&str, Vec<u8>> = HashMap::new();
    for (name, t) in &spans {
        let bytes = t.data_offsets[1] - t.data_offsets[0];
        if name.as_str() == EMBEDDINGS_TENSOR {
            let start = 8 + header_len + t.data_offsets[0] as u64;
            rows = read_rows(reader, mapped.as_ref(), start, n * dim, dtype).map_err(rerr)?;
        } else {
            let mut buf = vec![0u8; bytes];
            reader.read_exact(&mut buf).map_err(rerr)?;
            others.insert(name.as_str(), buf);
        }
    }
    let ids = match (
        others.get(ID_OFFSETS_TENSOR),
        others.get(ID_BYTES_TENSOR),
        metadata.get("ids"),
    ) {
        (Some(offsets), Some(bytes), _) => {
            let offsets: Vec<u64> = offsets
                .chunks_exact(8)
                .map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")))
                .collect();
            if offsets.len() != n + 1 || offsets[0] != 0 {
                return Err(bad(format!(
                    "tensor `{ID_OFFSETS_TENSOR}` holds {} offsets for {n} rows (expected {}, \
                     starting at 0)",
                    offsets.len(),
                    n + 1
                )));
            }
            let mut ids = Vec::with_capacity(n);
            for (row, w) in offsets.windows(2).enumerate() {
                let (a, b) = (w[0] as usize, w[1] as usize);
                let id = bytes.get(a..b).filter(|_| a <= b).ok_or_else(|| {
                    bad(format!(
                        "the id of row {row} lies outside `{ID_BYTES_TENSOR}`"
                    ))
                })?;
                let id = std::str::from_utf8(id)
                    .map_err(|e| bad(format!("the id of row {row} is not UTF-8: {e}")))?;
                ids.push(id.to_string());
            }
            ids
        }
        (None, None, Some(ids_json)) => {
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
            ids
        }
        _ => {
            return Err(bad(format!(
                "no ids: expected the tensors `{ID_OFFSETS_TENSOR}` and `{ID_BYTES_TENSOR}` (or, \
                 in the `{FORMAT_TAG_V1}` layout, an `ids` entry in the metadata)"
            )));
        }
    };
    Ok(EmbeddingIndex {
        ids,
        rows,
        dim,
        model: metadata.get("model").cloned().unwrap_or_default(),
        source: None,
    })
}

/// Reads `count` little-endian `f32` values, block by block, into a vector of exactly that size.
pub(crate) fn read_f32s(
    reader: &mut impl std::io::Read,
    count: usize,
) -> std::io::Result<Vec<f32>> {
    read_le(reader, count, f32::from_le_bytes)
}

/// Reads `count` values of `W` bytes each, decoded by `decode`, block by block (a block of at
/// most 1 MiB at a time), into a vector of exactly that size.
fn read_le<T, const W: usize>(
    reader: &mut impl std::io::Read,
    count: usize,
    decode: impl Fn([u8; W]) -> T,
) -> std::io::Result<Vec<T>> {
    const BLOCK: usize = 1 << 20;
    let mut out = Vec::with_capacity(count);
    let mut block = vec![0u8; (count * W).min(BLOCK)];
    while out.len() < count {
        let take = ((count - out.len()) * W).min(BLOCK / W * W);
        reader.read_exact(&mut block[..take])?;
        out.extend(
            block[..take]
                .chunks_exact(W)
                .map(|b| decode(b.try_into().expect("W bytes"))),
        );
    }
    Ok(out)
}

/// Reads an `.npy` index (versions 1.0, 2.0, 3.0 of the header; `<f4` or `<f2`, C order,
/// `(N, d)`) and its ids side file.
fn read_npy(
    path: &Path,
    reader: &mut (impl std::io::Read + Seek),
    file_len: u64,
    mapped: Option<std::sync::Arc<memmap2::Mmap>>,
) -> Result<EmbeddingIndex> {
    let bad = |problem: String| Error::IndexFormat {
        path: path.to_path_buf(),
        problem,
    };
    let rerr = |source| Error::Read {
        path: path.to_path_buf(),
        source,
    };
    let mut start = [0u8; 10];
    if reader.read_exact(&mut start).is_err() || !start.starts_with(NPY_MAGIC) {
        return Err(bad("not a NumPy .npy file (bad magic)".into()));
    }
    let (header_len, prefix) = match start[6] {
        1 => (usize::from(u16::from_le_bytes([start[8], start[9]])), 10),
        2 | 3 => {
            let mut more = [0u8; 2];
            reader.read_exact(&mut more).map_err(rerr)?;
            (
                u32::from_le_bytes([start[8], start[9], more[0], more[1]]) as usize,
                12,
            )
        }
        v => return Err(bad(format!("unsupported .npy version {v}"))),
    };
    if (prefix + header_len) as u64 > file_len {
        return Err(bad("truncated header".into()));
    }
    let mut header = vec![0u8; header_len];
    reader.read_exact(&mut header).map_err(rerr)?;
    let header = String::from_utf8(header).map_err(|e| bad(format!("header is not text: {e}")))?;
    let field = |key: &str| {
        header
            .split_once(&format!("'{key}':"))
            .map(|(_, rest)| rest.trim_start())
            .ok_or_else(|| bad(format!("header has no `{key}`: {header}")))
    };
    let descr = field("descr")?;
    let dtype = descr
        .strip_prefix('\'')
        .and_then(|d| d.split_once('\''))
        .and_then(|(d, _)| IndexDtype::from_name(d))
        .ok_or_else(|| {
            bad(format!(
                "dtype must be '<f4' or '<f2' (little-endian float32 or float16), header says \
                 {header}"
            ))
        })?;
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
    let data_len = file_len - (prefix + header_len) as u64;
    // The data must hold exactly the shape's bytes (checked without overflow).
    n.checked_mul(dim)
        .and_then(|v| v.checked_mul(dtype.width()))
        .filter(|&bytes| bytes as u64 == data_len)
        .ok_or_else(|| {
            bad(format!(
                "{data_len} data bytes for shape ({n}, {dim}) of {} (expected {} bytes)",
                dtype.npy_descr(),
                n.checked_mul(dim)
                    .and_then(|v| v.checked_mul(dtype.width()))
                    .map_or("more than 2^64".to_string(), |b| b.to_string())
            ))
        })?;
    let start = (prefix + header_len) as u64;
    let rows = read_rows(reader, mapped.as_ref(), start, n * dim, dtype).map_err(rerr)?;
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
    Ok(EmbeddingIndex {
        ids,
        rows,
        dim,
        model: String::new(),
        source: None,
    })
}

/// The first id of `ids` that repeats an earlier one, as the problem in words.
fn repeated_id(ids: &[String]) -> Option<String> {
    let mut seen = HashMap::with_capacity(ids.len());
    ids.iter().enumerate().find_map(|(row, id)| {
        seen.insert(id.as_str(), row)
            .map(|first| format!("id `{id}` appears in rows {first} and {row}"))
    })
}

/// The problem of a value beyond `f16`'s range in row `row`.
fn f16_range(row: usize, id: Option<&str>) -> String {
    let id = id.map(|id| format!(" (id `{id}`)")).unwrap_or_default();
    format!(
        "row {row}{id} holds a value beyond f16's range (magnitude over 65504); store the index \
         as f32"
    )
}

/// [`infembed_data::write_atomic`], its error naming `path`.
fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    infembed_data::write_atomic(path, bytes).map_err(|source| Error::Write {
        path: path.to_path_buf(),
        source,
    })
}
