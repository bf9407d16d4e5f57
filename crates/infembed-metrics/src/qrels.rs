//! Relevance judgements (qrels) and the TREC qrels file format.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufRead, BufReader, BufWriter, Write};
use std::path::{Path, PathBuf};

use crate::error::{Error, ParseErrorKind, Result};
use crate::fast_hash::FastMap;
use crate::trec_file::{LineReader, MAX_FIELDS, READER_NAME, WRITER_NAME};

/// One query's judgements: document id -> relevance label.
///
/// A document is relevant when its label is at least 1; its gain in nDCG is its label.
/// Labels of 0 or below mark judged non-relevant documents (gain 0).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct QueryQrels {
    labels: FastMap<String, i32>,
    /// The positive labels, sorted descending: the ideal ranking's gains.
    ideal: Vec<i32>,
}

impl QueryQrels {
    /// The label of `doc`, if it was judged.
    #[inline]
    pub fn label(&self, doc: &str) -> Option<i32> {
        self.labels.get(doc).copied()
    }

    /// Number of judged documents.
    pub fn len(&self) -> usize {
        self.labels.len()
    }

    /// Whether no document is judged.
    pub fn is_empty(&self) -> bool {
        self.labels.is_empty()
    }

    /// Number of relevant documents (label >= 1).
    pub fn num_relevant(&self) -> usize {
        self.ideal.len()
    }

    /// The positive labels sorted descending: the gains of the ideal ranking used by nDCG.
    pub fn ideal_gains(&self) -> &[i32] {
        &self.ideal
    }

    /// `(doc, label)` pairs in no particular order.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = (&str, i32)> + '_ {
        self.labels.iter().map(|(d, &l)| (d.as_str(), l))
    }

    /// Adds a judgement; `false` (and no change) if `doc` is already judged.
    fn insert(&mut self, doc: &str, label: i32) -> bool {
        if self.labels.contains_key(doc) {
            return false;
        }
        self.labels.insert(doc.to_owned(), label);
        if label > 0 {
            let at = self.ideal.partition_point(|&g| g >= label);
            self.ideal.insert(at, label);
        }
        true
    }
}

/// Relevance judgements for a set of queries: query id -> document id -> label.
///
/// Queries iterate in byte order of their ids.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Qrels {
    queries: BTreeMap<String, QueryQrels>,
}

impl Qrels {
    /// No judgements.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds one judgement. Errors with [`Error::DuplicateDocument`] (leaving `self` unchanged)
    /// when (query, doc) is already judged.
    pub fn insert(&mut self, query: &str, doc: &str, label: i32) -> Result<()> {
        let judged = match self.queries.get_mut(query) {
            Some(q) => q,
            None => self.queries.entry(query.to_owned()).or_default(),
        };
        if judged.insert(doc, label) {
            Ok(())
        } else {
            Err(Error::DuplicateDocument {
                query: query.to_owned(),
                doc: doc.to_owned(),
            })
        }
    }

    /// Builds qrels from `(query, doc, label)` triples. Errors as [`Qrels::insert`].
    pub fn from_entries<Q, D, I>(entries: I) -> Result<Self>
    where
        Q: AsRef<str>,
        D: AsRef<str>,
        I: IntoIterator<Item = (Q, D, i32)>,
    {
        let mut qrels = Self::new();
        for (query, doc, label) in entries {
            qrels.insert(query.as_ref(), doc.as_ref(), label)?;
        }
        Ok(qrels)
    }

    /// Builds qrels from nested maps or iterators: query -> (doc, label) pairs, e.g. a
    /// `HashMap<String, HashMap<String, i32>>`. Errors as [`Qrels::insert`].
    pub fn from_nested<Q, D, I, J>(queries: I) -> Result<Self>
    where
        Q: AsRef<str>,
        D: AsRef<str>,
        I: IntoIterator<Item = (Q, J)>,
        J: IntoIterator<Item = (D, i32)>,
    {
        let mut qrels = Self::new();
        for (query, docs) in queries {
            let query = query.as_ref();
            // A query with no judgements still counts as judged (trec_eval averages over it).
            qrels.queries.entry(query.to_owned()).or_default();
            for (doc, label) in docs {
                qrels.insert(query, doc.as_ref(), label)?;
            }
        }
        Ok(qrels)
    }

    /// One query's judgements.
    pub fn query(&self, query: &str) -> Option<&QueryQrels> {
        self.queries.get(query)
    }

    /// `(query id, judgements)` in byte order of the ids.
    pub fn queries(&self) -> impl ExactSizeIterator<Item = (&str, &QueryQrels)> + '_ {
        self.queries.iter().map(|(q, j)| (q.as_str(), j))
    }

    /// Number of judged queries.
    pub fn len(&self) -> usize {
        self.queries.len()
    }

    /// Whether there are no judged queries.
    pub fn is_empty(&self) -> bool {
        self.queries.is_empty()
    }

    /// Total number of judgements.
    pub fn num_judgements(&self) -> usize {
        self.queries.values().map(QueryQrels::len).sum()
    }

    /// Reads a TREC qrels file: four whitespace-separated columns per line,
    /// `query iteration doc label`, with an integer label; the second column is ignored and
    /// blank lines are skipped.
    ///
    /// Errors name the file and line: [`ParseErrorKind::WrongColumnCount`],
    /// [`ParseErrorKind::InvalidLabel`], [`ParseErrorKind::DuplicateDocument`],
    /// [`ParseErrorKind::EmptyFile`], [`ParseErrorKind::InvalidUtf8`]; and [`Error::Io`].
    pub fn read(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let file = File::open(path).map_err(|source| Error::Io {
            path: path.to_path_buf(),
            source,
        })?;
        Self::parse(BufReader::with_capacity(1 << 16, file), path)
    }

    /// Reads TREC qrels from any reader, as [`Qrels::read`]; errors name the input `<input>`.
    pub fn from_reader(reader: impl BufRead) -> Result<Self> {
        Self::parse(reader, Path::new(READER_NAME))
    }

    fn parse(reader: impl BufRead, path: &Path) -> Result<Self> {
        let mut lines = LineReader::new(reader, path);
        let mut qrels = Self::new();
        // Line of each judgement, to name the first occurrence of a duplicate.
        let mut first_lines: FastMap<(String, String), usize> = FastMap::default();
        while lines.next_line()? {
            let mut fields = [""; MAX_FIELDS];
            let found = lines.fields(&mut fields)?;
            if found != 4 {
                return Err(lines.error(ParseErrorKind::WrongColumnCount { expected: 4, found }));
            }
            let [query, _, doc, label_text, ..] = fields;
            let label: i32 = label_text.parse().map_err(|_| {
                lines.error(ParseErrorKind::InvalidLabel {
                    value: label_text.to_owned(),
                })
            })?;
            if qrels.insert(query, doc, label).is_err() {
                let first_line = first_lines
                    .get(&(query.to_owned(), doc.to_owned()))
                    .copied()
                    .unwrap_or_default();
                return Err(lines.error(ParseErrorKind::DuplicateDocument {
                    query: query.to_owned(),
                    doc: doc.to_owned(),
                    first_line,
                }));
            }
            first_lines.insert((query.to_owned(), doc.to_owned()), lines.line());
        }
        if qrels.is_empty() {
            return Err(lines.error(ParseErrorKind::EmptyFile));
        }
        Ok(qrels)
    }

    /// Writes TREC qrels (`query 0 doc label`), queries in byte order and documents sorted by id.
    pub fn write(&self, path: impl AsRef<Path>) -> Result<()> {
        let path = path.as_ref();
        let io = |source| Error::Io {
            path: path.to_path_buf(),
            source,
        };
        let file = File::create(path).map_err(io)?;
        let mut writer = BufWriter::new(file);
        self.write_lines(&mut writer).map_err(io)?;
        writer.flush().map_err(io)
    }

    /// Writes TREC qrels to any writer, as [`Qrels::write`].
    pub fn to_writer(&self, mut writer: impl Write) -> Result<()> {
        self.write_lines(&mut writer).map_err(|source| Error::Io {
            path: PathBuf::from(WRITER_NAME),
            source,
        })
    }

    fn write_lines(&self, writer: &mut impl Write) -> std::io::Result<()> {
        for (query, judged) in &self.queries {
            let mut docs: Vec<(&str, i32)> = judged.iter().collect();
            docs.sort_unstable();
            for (doc, label) in docs {
                writeln!(writer, "{query} 0 {doc} {label}")?;
            }
        }
        Ok(())
    }
}
