//! Readers for InF-IR record files: JSON Lines (streaming) and Parquet.
//!
//! Both readers are strict by default ([`ReadMode::Strict`]): the first bad record ends the read
//! with an error naming the file, the line (JSONL, 1-based) or row (Parquet, 0-based) and the field.
//! [`ReadMode::Lenient`] skips bad records instead and lists each skipped one with its error in
//! [`RecordSet::skipped`]. I/O errors, and Parquet schema errors (a required column missing or not a
//! string column), end the read in both modes: they are not about one record.
//!
//! JSONL conventions: lines are split on `\n` (a trailing `\r` is JSON whitespace and therefore
//! harmless; a UTF-8 byte-order mark before the first line is dropped); lines that are empty or whitespace-only are skipped silently, as is usual for JSON
//! Lines; every other line must be a UTF-8 JSON object holding the seven InF-IR text fields as
//! non-empty strings (unknown keys are ignored).

use std::fs::File;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};

use serde_json::{Map, Value};

use crate::error::{Error, Location, Problem, Result};
use crate::record::{InfIrRecord, json_type_name};

/// How a reader treats a bad record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ReadMode {
    /// The first bad record is an error (the default).
    #[default]
    Strict,
    /// Bad records are skipped and reported in [`RecordSet::skipped`].
    Lenient,
}

/// A record that a lenient read skipped.
#[derive(Debug)]
pub struct Skipped {
    /// Where it was.
    pub at: Location,
    /// Why it was skipped (the error a strict read would have returned).
    pub error: Error,
}

/// The outcome of reading a record file.
#[derive(Debug, Default)]
pub struct RecordSet {
    /// The good records, in file order.
    pub records: Vec<InfIrRecord>,
    /// Where each good record was in the file (parallel to `records`).
    pub locations: Vec<Location>,
    /// The skipped records, in file order (always empty after a strict read).
    pub skipped: Vec<Skipped>,
}

impl RecordSet {
    /// The lines or rows that were skipped.
    pub fn skipped_locations(&self) -> Vec<Location> {
        self.skipped.iter().map(|s| s.at).collect()
    }

    fn push(&mut self, item: Result<(Location, InfIrRecord)>, mode: ReadMode) -> Result<()> {
        match item {
            Ok((at, record)) => {
                self.records.push(record);
                self.locations.push(at);
                Ok(())
            }
            Err(error) => match (mode, error.location()) {
                (ReadMode::Lenient, Some(at)) => {
                    self.skipped.push(Skipped { at, error });
                    Ok(())
                }
                _ => Err(error),
            },
        }
    }
}

/// The non-blank lines of a JSON Lines source, each parsed as a JSON object: the one JSONL
/// line reader of the workspace (InF-IR records, BEIR/FollowIR files, the `infembed embed`
/// and `infembed synth` inputs all go through it).
///
/// Items are `Ok((line, object))` with the 1-based line number, or a per-line error
/// ([`Error::Utf8`], [`Error::Json`], or [`Error::Record`] with [`Problem::NotAnObject`] for a
/// line that holds JSON but not an object); iteration continues after per-line errors. An I/O
/// error ([`Error::Io`]) is yielded once and ends the iteration. Blank lines are skipped; a
/// UTF-8 byte-order mark before the first line is dropped. Memory use is one line at a time.
pub struct JsonObjects<R> {
    reader: R,
    path: PathBuf,
    line: usize,
    buf: Vec<u8>,
    done: bool,
}

impl<R: BufRead> JsonObjects<R> {
    /// Reads from `reader`; `path` is only used to name the source in errors.
    pub fn new(reader: R, path: impl Into<PathBuf>) -> Self {
        JsonObjects {
            reader,
            path: path.into(),
            line: 0,
            buf: Vec::new(),
            done: false,
        }
    }

    /// The path that errors name.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl JsonObjects<BufReader<File>> {
    /// Opens a JSONL file.
    ///
    /// # Errors
    /// [`Error::Io`] when the file cannot be opened (a directory included).
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        if path.is_dir() {
            return Err(Error::io(
                path,
                std::io::Error::other("is a directory, expected a JSONL file"),
            ));
        }
        let file = File::open(path).map_err(|e| Error::io(path, e))?;
        Ok(Self::new(BufReader::with_capacity(1 << 16, file), path))
    }
}

impl<R: BufRead> Iterator for JsonObjects<R> {
    type Item = Result<(usize, Map<String, Value>)>;

    fn next(&mut self) -> Option<Self::Item> {
        while !self.done {
            self.buf.clear();
            match self.reader.read_until(b'\n', &mut self.buf) {
                Ok(0) => self.done = true,
                Ok(_) => {
                    self.line += 1;
                    // A UTF-8 byte-order mark may precede the first line (a file holding
                    // only the mark is empty).
                    if self.line == 1 && self.buf.starts_with(UTF8_BOM) {
                        self.buf.drain(..UTF8_BOM.len());
                    }
                    if self.buf.iter().all(u8::is_ascii_whitespace) {
                        continue;
                    }
                    return Some(
                        parse_object_line(&self.buf, &self.path, self.line)
                            .map(|object| (self.line, object)),
                    );
                }
                Err(e) => {
                    self.done = true;
                    return Some(Err(Error::io(&self.path, e)));
                }
            }
        }
        None
    }
}

impl<R: BufRead> std::iter::FusedIterator for JsonObjects<R> {}

/// The UTF-8 encoding of U+FEFF.
const UTF8_BOM: &[u8] = &[0xef, 0xbb, 0xbf];

/// Parses one non-blank JSONL line (byte-order mark already removed) into a JSON object.
fn parse_object_line(bytes: &[u8], path: &Path, line: usize) -> Result<Map<String, Value>> {
    let text = std::str::from_utf8(bytes).map_err(|source| Error::Utf8 {
        path: path.to_path_buf(),
        line,
        source,
    })?;
    let value: Value = serde_json::from_str(text).map_err(|source| Error::Json {
        path: path.to_path_buf(),
        line,
        source,
    })?;
    match value {
        Value::Object(object) => Ok(object),
        other => Err(Error::Record {
            path: path.to_path_buf(),
            at: Location::Line(line),
            field: "(record)".to_string(),
            problem: Problem::NotAnObject {
                found: json_type_name(&other),
            },
        }),
    }
}

/// Streaming reader of InF-IR records over any buffered byte source ([`JsonObjects`] plus the
/// record's field checks): yields one item per non-blank line.
///
/// Items are `Ok((line, record))` or a per-line error (invalid UTF-8, invalid JSON, or a bad
/// field); iteration continues after per-line errors. An I/O error is yielded once and ends the
/// iteration. Memory use is one line at a time.
pub struct JsonlRecords<R> {
    objects: JsonObjects<R>,
}

impl<R: BufRead> JsonlRecords<R> {
    /// Reads from `reader`; `path` is only used to name the source in errors.
    pub fn new(reader: R, path: impl Into<PathBuf>) -> Self {
        JsonlRecords {
            objects: JsonObjects::new(reader, path),
        }
    }
}

impl JsonlRecords<BufReader<File>> {
    /// Opens a JSONL file.
    ///
    /// # Errors
    /// [`Error::Io`] when the file cannot be opened.
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        Ok(JsonlRecords {
            objects: JsonObjects::open(path)?,
        })
    }
}

impl<R: BufRead> Iterator for JsonlRecords<R> {
    type Item = Result<(Location, InfIrRecord)>;

    fn next(&mut self) -> Option<Self::Item> {
        let (line, object) = match self.objects.next()? {
            Ok(item) => item,
            Err(e) => return Some(Err(e)),
        };
        let at = Location::Line(line);
        Some(
            InfIrRecord::from_json_object(&object)
                .map(|r| (at, r))
                .map_err(|(field, problem)| Error::Record {
                    path: self.objects.path().to_path_buf(),
                    at,
                    field: field.name().to_string(),
                    problem,
                }),
        )
    }
}

impl<R: BufRead> std::iter::FusedIterator for JsonlRecords<R> {}

/// Reads InF-IR records from JSONL bytes in memory (`path` only names the source in errors).
///
/// # Errors
/// See [`read_jsonl`].
pub fn read_jsonl_from<R: BufRead>(
    reader: R,
    path: impl Into<PathBuf>,
    mode: ReadMode,
) -> Result<RecordSet> {
    let mut set = RecordSet::default();
    for item in JsonlRecords::new(reader, path) {
        set.push(item, mode)?;
    }
    Ok(set)
}

/// Reads an InF-IR JSONL file.
///
/// # Errors
/// [`Error::Io`] always; in strict mode also the first bad line's [`Error::Utf8`],
/// [`Error::Json`] or [`Error::Record`].
pub fn read_jsonl(path: impl AsRef<Path>, mode: ReadMode) -> Result<RecordSet> {
    let mut set = RecordSet::default();
    for item in JsonlRecords::open(path)? {
        set.push(item, mode)?;
    }
    Ok(set)
}

/// Reads an InF-IR record file, choosing the reader by extension: `.jsonl`/`.json`/`.ndjson` (JSON
/// Lines) or `.parquet`.
///
/// # Errors
/// [`Error::UnknownFormat`] for other extensions, else as [`read_jsonl`] / [`read_parquet`].
pub fn read_records(path: impl AsRef<Path>, mode: ReadMode) -> Result<RecordSet> {
    let path = path.as_ref();
    match path.extension().and_then(|e| e.to_str()) {
        Some("jsonl" | "json" | "ndjson") => read_jsonl(path, mode),
        Some("parquet") => read_parquet(path, mode),
        _ => Err(Error::UnknownFormat {
            path: path.to_path_buf(),
        }),
    }
}

/// Reads an InF-IR Parquet file (the format the public dataset is published in).
///
/// Required columns: the seven InF-IR fields (`document` is accepted when `document_positive` is
/// absent), each a string column (`Utf8`, `LargeUtf8`, `Utf8View` or a dictionary of strings);
/// other columns are ignored. Rows are numbered from 0 over the whole file.
///
/// # Errors
/// [`Error::Io`], [`Error::Parquet`], [`Error::Arrow`] and [`Error::Column`] (missing or non-string
/// column) in both modes; in strict mode the first row with a null or empty field as
/// [`Error::Record`] with [`Location::Row`].
#[cfg(feature = "parquet")]
pub fn read_parquet(path: impl AsRef<Path>, mode: ReadMode) -> Result<RecordSet> {
    parquet_reader::read(path.as_ref(), mode)
}

/// Reads an InF-IR Parquet file. This build has no Parquet support.
///
/// # Errors
/// Always [`Error::ParquetDisabled`].
#[cfg(not(feature = "parquet"))]
pub fn read_parquet(path: impl AsRef<Path>, _mode: ReadMode) -> Result<RecordSet> {
    Err(Error::ParquetDisabled {
        path: path.as_ref().to_path_buf(),
    })
}

#[cfg(feature = "parquet")]
mod parquet_reader {
    use std::fs::File;
    use std::path::Path;

    use arrow::array::{Array, AsArray, StringArray};
    use arrow::datatypes::{DataType, Schema};
    use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;

    use super::{ReadMode, RecordSet};
    use crate::error::{Error, Location, Problem, Result};
    use crate::record::{InfIrRecord, RecordField};

    fn is_string_type(dt: &DataType) -> bool {
        match dt {
            DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => true,
            DataType::Dictionary(_, value) => is_string_type(value),
            _ => false,
        }
    }

    /// For each field, the column name to read (main name or alias); checks types.
    fn resolve_columns(schema: &Schema, path: &Path) -> Result<[String; 7]> {
        let mut names: [String; 7] = Default::default();
        for (slot, field) in names.iter_mut().zip(RecordField::ALL) {
            let found = schema
                .field_with_name(field.name())
                .ok()
                .or_else(|| field.alias().and_then(|a| schema.field_with_name(a).ok()));
            let Some(column) = found else {
                return Err(Error::Column {
                    path: path.to_path_buf(),
                    column: field.name().to_string(),
                    problem: Problem::Missing,
                });
            };
            if !is_string_type(column.data_type()) {
                return Err(Error::Column {
                    path: path.to_path_buf(),
                    column: column.name().clone(),
                    problem: Problem::WrongType {
                        found: column.data_type().to_string(),
                        expected: "string",
                    },
                });
            }
            *slot = column.name().clone();
        }
        Ok(names)
    }

    pub(super) fn read(path: &Path, mode: ReadMode) -> Result<RecordSet> {
        let file = File::open(path).map_err(|e| Error::io(path, e))?;
        let parquet_err = |source| Error::Parquet {
            path: path.to_path_buf(),
            source,
        };
        let builder = ParquetRecordBatchReaderBuilder::try_new(file).map_err(parquet_err)?;
        let names = resolve_columns(builder.schema(), path)?;
        let reader = builder.build().map_err(parquet_err)?;

        let mut set = RecordSet::default();
        let mut row0 = 0usize;
        for batch in reader {
            let batch = batch.map_err(|source| Error::Arrow {
                path: path.to_path_buf(),
                source,
            })?;
            let mut columns: Vec<StringArray> = Vec::with_capacity(7);
            for name in &names {
                let column = batch.column_by_name(name).ok_or_else(|| Error::Column {
                    path: path.to_path_buf(),
                    column: name.clone(),
                    problem: Problem::Missing,
                })?;
                let column = arrow::compute::cast(column, &DataType::Utf8).map_err(|source| {
                    Error::Arrow {
                        path: path.to_path_buf(),
                        source,
                    }
                })?;
                columns.push(column.as_string::<i32>().clone());
            }
            for i in 0..batch.num_rows() {
                let at = Location::Row(row0 + i);
                let item = row_record(&columns, i).map_err(|(field, problem)| Error::Record {
                    path: path.to_path_buf(),
                    at,
                    field: field.name().to_string(),
                    problem,
                });
                set.push(item.map(|r| (at, r)), mode)?;
            }
            row0 += batch.num_rows();
        }
        Ok(set)
    }

    fn row_record(
        columns: &[StringArray],
        i: usize,
    ) -> std::result::Result<InfIrRecord, (RecordField, Problem)> {
        let mut texts: [&str; 7] = [""; 7];
        for ((slot, column), field) in texts.iter_mut().zip(columns).zip(RecordField::ALL) {
            if column.is_null(i) {
                return Err((field, Problem::Null));
            }
            *slot = column.value(i);
        }
        InfIrRecord::from_texts(texts)
    }
}
