//! Line-oriented reading shared by the qrels and run parsers.

use std::io::BufRead;
use std::path::{Path, PathBuf};

use crate::error::{Error, ParseErrorKind, Result};

/// The most columns we keep; a line with more is reported with its full count.
pub(crate) const MAX_FIELDS: usize = 8;

/// Reads a TREC file line by line, reusing one buffer, and splits lines into whitespace-separated
/// columns.
pub(crate) struct LineReader<R> {
    reader: R,
    buf: Vec<u8>,
    line: usize,
    path: PathBuf,
}

impl<R: BufRead> LineReader<R> {
    pub(crate) fn new(reader: R, path: &Path) -> Self {
        Self {
            reader,
            buf: Vec::with_capacity(256),
            line: 0,
            path: path.to_path_buf(),
        }
    }

    /// The 1-based number of the line last read.
    pub(crate) fn line(&self) -> usize {
        self.line
    }

    /// The path used in error messages.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// A parse error at the current line.
    pub(crate) fn error(&self, kind: ParseErrorKind) -> Error {
        Error::Parse {
            path: self.path.clone(),
            line: self.line,
            kind,
        }
    }

    /// Reads the next non-blank line into the buffer; `false` at the end of the input.
    pub(crate) fn next_line(&mut self) -> Result<bool> {
        loop {
            self.buf.clear();
            let read = self
                .reader
                .read_until(b'\n', &mut self.buf)
                .map_err(|source| Error::Io {
                    path: self.path.clone(),
                    source,
                })?;
            if read == 0 {
                return Ok(false);
            }
            self.line += 1;
            if !self.buf.iter().all(u8::is_ascii_whitespace) {
                return Ok(true);
            }
        }
    }

    /// Splits the current line into whitespace-separated columns stored in `fields`; returns the
    /// number of columns (which may exceed `MAX_FIELDS`; only the first `MAX_FIELDS` are kept).
    pub(crate) fn fields<'a>(&'a self, fields: &mut [&'a str; MAX_FIELDS]) -> Result<usize> {
        let text =
            std::str::from_utf8(&self.buf).map_err(|_| self.error(ParseErrorKind::InvalidUtf8))?;
        let mut count = 0;
        for field in text.split_ascii_whitespace() {
            if count < MAX_FIELDS {
                fields[count] = field;
            }
            count += 1;
        }
        Ok(count)
    }
}

/// The name used in errors for unnamed readers.
pub(crate) const READER_NAME: &str = "<input>";
/// The name used in errors for unnamed writers.
pub(crate) const WRITER_NAME: &str = "<output>";
