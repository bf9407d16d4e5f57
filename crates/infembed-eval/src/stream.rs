//! Streaming, resumable embedding of a JSONL file into an index file: what `infembed embed`
//! runs, for corpora too large to hold or to embed in one sitting.
//!
//! Details at [`embed_file`].

use std::collections::HashMap;
use std::io::{BufReader, Read};
use std::path::{Path, PathBuf};

use infembed_encoder::DualEncoder;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::embed::{
    EMBED_CHUNK, Side, TextReader, TextRecord, embed_chunk, encoder_source, note_new_id,
};
use crate::error::{Error, Result};
use crate::index::{IndexFormat, IndexLayout, IndexWriter, read_f32s};
use crate::store::IndexDtype;

/// Records per shard unless told otherwise: 16 chunks of [`EMBED_CHUNK`].
pub const DEFAULT_SHARD_RECORDS: usize = 16 * EMBED_CHUNK;

/// The `format` of a parts folder's `manifest.json`.
pub const PARTS_FORMAT: &str = "infembed-embed-parts/1";

const MANIFEST: &str = "manifest.json";

/// The folder that holds the finished shards of an unfinished [`embed_file`] to `output`:
/// `OUTPUT.parts` beside it (`dir/e.safetensors` -> `dir/e.safetensors.parts`).
pub fn parts_dir(output: &Path) -> PathBuf {
    let mut name = output.file_name().unwrap_or_default().to_os_string();
    name.push(".parts");
    output.with_file_name(name)
}

/// How [`embed_file`] embeds.
#[non_exhaustive]
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EmbedFileOptions {
    /// The tower the records go through. Default [`Side::Passages`].
    pub side: Side,
    /// Records per shard, the unit of resumption. Default [`DEFAULT_SHARD_RECORDS`]; a multiple
    /// of [`EMBED_CHUNK`] gives the values of an in-memory embedding exactly.
    pub shard_records: usize,
    /// Discard the shards of an earlier run instead of resuming. Default `false`.
    pub restart: bool,
    /// The number type of the index file. Default [`IndexDtype::F32`]. The shards are `f32`
    /// either way (a resumed run may change it).
    pub dtype: IndexDtype,
}

impl Default for EmbedFileOptions {
    fn default() -> Self {
        Self {
            side: Side::Passages,
            shard_records: DEFAULT_SHARD_RECORDS,
            restart: false,
            dtype: IndexDtype::F32,
        }
    }
}

impl EmbedFileOptions {
    /// The defaults on `side`.
    pub fn new(side: Side) -> Self {
        Self {
            side,
            ..Self::default()
        }
    }

    /// Records per shard (at least 1).
    pub fn with_shard_records(mut self, records: usize) -> Self {
        self.shard_records = records;
        self
    }

    /// Start over rather than resume.
    pub fn with_restart(mut self, restart: bool) -> Self {
        self.restart = restart;
        self
    }

    /// Store the index file's values as `dtype`.
    pub fn with_dtype(mut self, dtype: IndexDtype) -> Self {
        self.dtype = dtype;
        self
    }
}

/// A JSONL file of texts read once and checked ([`scan_texts`]): its ids and its digest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TextFileScan {
    /// The file.
    pub path: PathBuf,
    /// The records' ids in file order (unique).
    pub ids: Vec<String>,
    /// The file's SHA-256, lowercase hex.
    pub sha256: String,
}

/// How far [`embed_file`] is, reported after every chunk.
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EmbedProgress {
    /// Records embedded, those of resumed shards included.
    pub done: usize,
    /// Records in the input.
    pub total: usize,
    /// Records found embedded by an earlier run.
    pub resumed: usize,
}

/// What [`embed_file`] did.
#[non_exhaustive]
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EmbedFileSummary {
    /// Rows of the index written.
    pub records: usize,
    /// The embedding dimension.
    pub dim: usize,
    /// Records taken from an earlier run's shards.
    pub resumed: usize,
    /// Shards of the run.
    pub shards: usize,
}

/// Reads a JSONL file of texts ([`read_texts`](crate::read_texts)' format) record by record:
/// checks every record, keeps the ids and hashes the bytes, holding no text.
///
/// # Errors
/// As [`read_texts`](crate::read_texts): [`Error::Read`], [`Error::InputField`],
/// [`Error::DuplicateId`], [`Error::EmptyInput`].
pub fn scan_texts(path: impl AsRef<Path>) -> Result<TextFileScan> {
    let path = path.as_ref();
    // Opening through the reader first gives its error for a directory or a missing file.
    drop(TextReader::open(path)?);
    let file = std::fs::File::open(path).map_err(|source| Error::Read {
        path: path.to_path_buf(),
        source,
    })?;
    let mut hashing = HashingReader {
        inner: file,
        hasher: Sha256::new(),
    };
    let mut ids = Vec::new();
    {
        let mut first_line: HashMap<String, usize> = HashMap::new();
        let reader = BufReader::with_capacity(1 << 16, &mut hashing);
        for item in TextReader::new(reader, path) {
            let (line, record) = item?;
            note_new_id(&mut first_line, path, line, &record.id)?;
            ids.push(record.id);
        }
    }
    if ids.is_empty() {
        return Err(Error::EmptyInput {
            path: path.to_path_buf(),
        });
    }
    let sha256 = hex(&hashing.hasher.finalize());
    Ok(TextFileScan {
        path: path.to_path_buf(),
        ids,
        sha256,
    })
}

struct HashingReader<R> {
    inner: R,
    hasher: Sha256,
}

impl<R: Read> Read for &mut HashingReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hasher.update(&buf[..n]);
        Ok(n)
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// What a parts folder was made from; a run resumes only from the same.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Manifest {
    format: String,
    input: String,
    input_sha256: String,
    records: usize,
    side: String,
    shard_records: usize,
    chunk_records: usize,
    model: String,
    model_files: Vec<String>,
    encoder_config: serde_json::Value,
}

impl Manifest {
    fn new(encoder: &DualEncoder, scan: &TextFileScan, options: &EmbedFileOptions) -> Self {
        let side = match options.side {
            Side::Passages => "passages",
            Side::Queries => "queries",
        };
        Self {
            format: PARTS_FORMAT.to_string(),
            input: scan.path.display().to_string(),
            input_sha256: scan.sha256.clone(),
            records: scan.ids.len(),
            side: side.to_string(),
            shard_records: options.shard_records,
            chunk_records: EMBED_CHUNK,
            model: encoder_source(encoder),
            model_files: model_files(encoder.source_dir()),
            encoder_config: serde_json::to_value(encoder.config()).unwrap_or_default(),
        }
    }

    /// The first field (other than the input's path, which may move) where `self` and `now`
    /// differ, with both values.
    fn difference(&self, now: &Self) -> Option<(String, String, String)> {
        let (Ok(serde_json::Value::Object(was)), Ok(serde_json::Value::Object(is))) =
            (serde_json::to_value(self), serde_json::to_value(now))
        else {
            return None;
        };
        was.iter()
            .filter(|(key, _)| key.as_str() != "input")
            .find(|(key, value)| is.get(key.as_str()) != Some(value))
            .map(|(key, value)| {
                let shown = |v: Option<&serde_json::Value>| {
                    let mut s = v.map(ToString::to_string).unwrap_or_default();
                    if s.len() > 200 {
                        let mut end = 200;
                        while !s.is_char_boundary(end) {
                            end -= 1;
                        }
                        s.truncate(end);
                        s.push_str("...");
                    }
                    s
                };
                (key.clone(), shown(Some(value)), shown(is.get(key.as_str())))
            })
    }
}

/// `name size mtime` of each file directly in `dir`, sorted: a model changed in place (weights
/// retrained into the same folder) does not resume from the old model's shards.
fn model_files(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    if let Ok(entries) = std::fs::read_dir(dir) {
        for entry in entries.flatten() {
            let Ok(meta) = entry.metadata() else { continue };
            if !meta.is_file() {
                continue;
            }
            let mtime = meta
                .modified()
                .ok()
                .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                .map_or(0, |d| d.as_nanos());
            out.push(format!(
                "{} {} {mtime}",
                entry.file_name().to_string_lossy(),
                meta.len()
            ));
        }
    }
    out.sort();
    out
}

fn shard_path(parts: &Path, shard: usize) -> PathBuf {
    parts.join(format!("shard-{shard:06}.f32"))
}

/// Embeds the records of `scan` (a file read by [`scan_texts`]) with `encoder` into the index
/// file `output` (its extension picks the format, as for
/// [`EmbeddingIndex::save`](crate::EmbeddingIndex::save)), in shards that survive a crash.
/// `progress` is called once at the start and after every chunk of [`EMBED_CHUNK`] records.
///
/// # How it works
/// 1. [`scan_texts`] reads the input once: every record is checked (errors name the line and the
///    field, before any model work), the ids are kept (unique), the file's SHA-256 is taken.
/// 2. It cuts the records into shards of [`EmbedFileOptions::shard_records`]
///    records, in file order, and embeds each shard in chunks of [`EMBED_CHUNK`] records (the
///    chunks of [`embed_records`](crate::embed_records), so a shard size that is a multiple of it
///    gives the same values as embedding the whole file in memory). Each finished shard is
///    written atomically to `OUTPUT.parts/shard-NNNNNN.f32` (raw little-endian `f32` rows).
///    Memory holds the ids and one shard, whatever the corpus size.
/// 3. When every shard is there, the index file is assembled from them in one pass (header,
///    then the shards' rows; written to a temporary file, synced and renamed) and the parts
///    folder is removed.
///
/// # Resuming
/// The parts folder starts with `manifest.json`: the input's SHA-256 and record count, the side,
/// the shard and chunk sizes, the model directory with its files' sizes and modification times,
/// and the encoder config. A run that finds a parts folder with the same manifest (killed, even
/// with `kill -9`, or stopped by an error) keeps its complete shards and embeds only the rest; the
/// index it writes is the same bytes as an uninterrupted run's. A folder whose manifest differs
/// is an error naming what differs, unless [`EmbedFileOptions::restart`] asks to start over.
///
/// The index is the one that [`embed_records`](crate::embed_records) and `save` give for the
/// same records (byte for byte when `shard_records` is a multiple of [`EMBED_CHUNK`]; otherwise
/// the chunks differ, and so may the last bits of a padded batch).
///
/// # Errors
/// [`Error::UnknownIndexFormat`]; [`Error::IndexShape`] when the ids cannot be written in the
/// output's format (checked before embedding); [`Error::ResumeMismatch`] when the parts folder
/// is another run's; [`Error::PartsDir`] when it is not one; [`Error::InputChanged`] when the
/// input no longer holds the scanned records; [`Error::Read`] / [`Error::Write`]; the encoder's
/// errors.
pub fn embed_file(
    encoder: &DualEncoder,
    scan: &TextFileScan,
    output: &Path,
    options: &EmbedFileOptions,
    progress: &mut dyn FnMut(&EmbedProgress),
) -> Result<EmbedFileSummary> {
    let format = IndexFormat::from_path(output)?;
    if options.shard_records == 0 {
        return Err(Error::IndexShape {
            problem: "shards of 0 records".into(),
        });
    }
    let total = scan.ids.len();
    let dim = encoder.dim();
    let model = encoder_source(encoder);
    // The ids must fit the output's format before anything is embedded.
    IndexLayout::new(output, format, &scan.ids, dim, &model, options.dtype)?;

    let parts = parts_dir(output);
    let manifest = Manifest::new(encoder, scan, options);
    if options.restart && parts.exists() {
        std::fs::remove_dir_all(&parts).map_err(|source| Error::Write {
            path: parts.clone(),
            source,
        })?;
    }
    if parts.exists() {
        let found = read_manifest(&parts)?;
        if let Some((field, recorded, now)) = found.difference(&manifest) {
            return Err(Error::ResumeMismatch {
                dir: parts,
                field,
                recorded,
                now,
            });
        }
    } else {
        std::fs::create_dir_all(&parts).map_err(|source| Error::Write {
            path: parts.clone(),
            source,
        })?;
        let text = serde_json::to_string_pretty(&manifest).unwrap_or_default();
        infembed_data::write_atomic(&parts.join(MANIFEST), text.as_bytes()).map_err(|source| {
            Error::Write {
                path: parts.join(MANIFEST),
                source,
            }
        })?;
    }

    let shard_rows = |s: usize| options.shard_records.min(total - s * options.shard_records);
    let shards = total.div_ceil(options.shard_records);
    let mut complete = vec![false; shards];
    let mut resumed = 0;
    for (s, done) in complete.iter_mut().enumerate() {
        let path = shard_path(&parts, s);
        if let Ok(meta) = std::fs::metadata(&path) {
            if meta.len() == (shard_rows(s) * dim * 4) as u64 {
                *done = true;
                resumed += shard_rows(s);
            } else {
                log::warn!(
                    "{}: {} bytes, expected {}; embedding it again",
                    path.display(),
                    meta.len(),
                    shard_rows(s) * dim * 4
                );
            }
        }
    }
    if resumed > 0 {
        log::info!(
            "resuming {}: {resumed} of {total} records already embedded",
            parts.display()
        );
    }
    let mut done = resumed;
    progress(&EmbedProgress {
        done,
        total,
        resumed,
    });

    if done < total {
        let mut reader = TextReader::open(&scan.path)?;
        let mut shard: Vec<TextRecord> = Vec::with_capacity(options.shard_records.min(total));
        for (s, &is_complete) in complete.iter().enumerate() {
            shard.clear();
            for row in s * options.shard_records..s * options.shard_records + shard_rows(s) {
                let (line, record) = match reader.next() {
                    Some(item) => item?,
                    None => {
                        return Err(Error::InputChanged {
                            path: scan.path.clone(),
                            problem: format!("it ends before record {}", row + 1),
                        });
                    }
                };
                if record.id != scan.ids[row] {
                    return Err(Error::InputChanged {
                        path: scan.path.clone(),
                        problem: format!(
                            "line {line} holds id `{}` where the first reading had `{}`",
                            record.id, scan.ids[row]
                        ),
                    });
                }
                if !is_complete {
                    shard.push(record);
                }
            }
            if is_complete {
                continue;
            }
            let mut values = Vec::with_capacity(shard.len() * dim);
            for chunk in shard.chunks(EMBED_CHUNK) {
                let (rows, d) = embed_chunk(encoder, chunk, options.side)?;
                if d != dim {
                    return Err(Error::IndexShape {
                        problem: format!(
                            "the encoder gave {d}-dimensional embeddings, it declares {dim}"
                        ),
                    });
                }
                values.extend(rows);
                done += chunk.len();
                progress(&EmbedProgress {
                    done,
                    total,
                    resumed,
                });
            }
            let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
            let path = shard_path(&parts, s);
            infembed_data::write_atomic(&path, &bytes)
                .map_err(|source| Error::Write { path, source })?;
        }
    }

    let mut writer = IndexWriter::create(output, &scan.ids, dim, &model, options.dtype)?;
    for s in 0..shards {
        let path = shard_path(&parts, s);
        let rerr = |source| Error::Read {
            path: path.clone(),
            source,
        };
        let mut file = std::fs::File::open(&path).map_err(rerr)?;
        let len = file.metadata().map_err(rerr)?.len();
        if len != (shard_rows(s) * dim * 4) as u64 {
            return Err(Error::PartsDir {
                dir: parts,
                problem: format!(
                    "{} holds {len} bytes, expected {}",
                    path.display(),
                    shard_rows(s) * dim * 4
                ),
            });
        }
        let values =
            read_f32s(&mut BufReader::new(&mut file), shard_rows(s) * dim).map_err(rerr)?;
        if let Some(i) = values.iter().position(|v| !v.is_finite()) {
            return Err(Error::IndexShape {
                problem: format!(
                    "non-finite value in row {} (id `{}`)",
                    s * options.shard_records + i / dim,
                    scan.ids[s * options.shard_records + i / dim]
                ),
            });
        }
        writer.write_rows(&values)?;
    }
    writer.finish()?;
    std::fs::remove_dir_all(&parts).map_err(|source| Error::Write {
        path: parts.clone(),
        source,
    })?;
    Ok(EmbedFileSummary {
        records: total,
        dim,
        resumed,
        shards,
    })
}

fn read_manifest(parts: &Path) -> Result<Manifest> {
    let path = parts.join(MANIFEST);
    let text = std::fs::read_to_string(&path).map_err(|e| Error::PartsDir {
        dir: parts.to_path_buf(),
        problem: format!(
            "no readable {MANIFEST} ({e}): not the shards of `infembed embed`; move the folder \
             away or pass --restart"
        ),
    })?;
    let manifest: Manifest = serde_json::from_str(&text).map_err(|e| Error::PartsDir {
        dir: parts.to_path_buf(),
        problem: format!("{MANIFEST} cannot be read ({e}); pass --restart to start over"),
    })?;
    if manifest.format != PARTS_FORMAT {
        return Err(Error::PartsDir {
            dir: parts.to_path_buf(),
            problem: format!(
                "{MANIFEST} has format `{}`, expected `{PARTS_FORMAT}`; pass --restart to start \
                 over",
                manifest.format
            ),
        });
    }
    Ok(manifest)
}
