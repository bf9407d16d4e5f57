//! Runs: the scores a system gave to documents for each query, and the TREC run file format.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufRead, BufReader, BufWriter, Write};
use std::path::{Path, PathBuf};

use crate::error::{Error, ParseErrorKind, Result};
use crate::fast_hash::FastMap;
use crate::tie::TieBreak;
use crate::trec_file::{LineReader, MAX_FIELDS, READER_NAME, WRITER_NAME};

/// The run tag written when a [`Run`] has none.
pub const DEFAULT_RUN_TAG: &str = "infembed";

/// One query's scored documents, in the order they were given.
///
/// Document ids are unique within a query and scores are never NaN (both are checked when the
/// run is built). Ids are stored packed in one buffer, so a run of millions of documents costs
/// no per-document allocation.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct QueryRun {
    ids: String,
    /// `bounds[i]..bounds[i + 1]` is document `i`'s id in `ids`; `bounds[0] == 0`.
    bounds: Vec<usize>,
    scores: Vec<f64>,
}

impl QueryRun {
    fn new() -> Self {
        Self {
            ids: String::new(),
            bounds: vec![0],
            scores: Vec::new(),
        }
    }

    /// Number of documents.
    pub fn len(&self) -> usize {
        self.scores.len()
    }

    /// Whether the query has no documents.
    pub fn is_empty(&self) -> bool {
        self.scores.is_empty()
    }

    /// Id of document `index` (input order). Panics if `index >= self.len()`.
    #[inline]
    pub fn doc(&self, index: usize) -> &str {
        &self.ids[self.bounds[index]..self.bounds[index + 1]]
    }

    /// Score of document `index` (input order). Panics if `index >= self.len()`.
    #[inline]
    pub fn score(&self, index: usize) -> f64 {
        self.scores[index]
    }

    /// All scores, in input order.
    pub fn scores(&self) -> &[f64] {
        &self.scores
    }

    /// `(doc, score)` pairs in input order.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = (&str, f64)> + '_ {
        (0..self.len()).map(|i| (self.doc(i), self.scores[i]))
    }

    /// The input-order index of `doc` (a linear scan).
    pub fn position(&self, doc: &str) -> Option<usize> {
        (0..self.len()).find(|&i| self.doc(i) == doc)
    }

    /// The score of `doc` (a linear scan).
    pub fn score_of(&self, doc: &str) -> Option<f64> {
        self.position(doc).map(|i| self.scores[i])
    }

    /// The 1-based rank of `doc` under `tie`, without sorting: one pass over the documents.
    /// `None` when the query has no such document.
    pub fn rank_of(&self, doc: &str, tie: TieBreak) -> Option<usize> {
        let index = self.position(doc)?;
        let key = tie.key(self.scores[index]);
        let before = (0..self.len())
            .filter(|&i| tie.precedes(tie.key(self.scores[i]), self.doc(i), key, doc))
            .count();
        Some(before + 1)
    }

    fn push(&mut self, doc: &str, score: f64) {
        self.ids.push_str(doc);
        self.bounds.push(self.ids.len());
        self.scores.push(score);
    }

    fn append(&mut self, other: &QueryRun) {
        for (doc, score) in other.iter() {
            self.push(doc, score);
        }
    }

    /// The input-order indices `(first, second)` of the earliest repeated document id.
    fn find_duplicate(&self) -> Option<(usize, usize)> {
        let mut seen: FastMap<&str, usize> = FastMap::default();
        seen.reserve(self.len());
        for i in 0..self.len() {
            if let Some(&first) = seen.get(self.doc(i)) {
                return Some((first, i));
            }
            seen.insert(self.doc(i), i);
        }
        None
    }
}

/// A retrieval run: for each query id, scored documents.
///
/// Queries iterate in byte order of their ids (as trec_eval sorts them).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Run {
    queries: BTreeMap<String, QueryRun>,
    tag: Option<String>,
}

impl Run {
    /// An empty run.
    pub fn new() -> Self {
        Self::default()
    }

    /// Builds a run from `(query, doc, score)` triples in any order.
    ///
    /// Errors: [`Error::DuplicateDocument`] for a repeated (query, doc) pair,
    /// [`Error::NanScore`] for a NaN score.
    pub fn from_entries<Q, D, I>(entries: I) -> Result<Self>
    where
        Q: AsRef<str>,
        D: AsRef<str>,
        I: IntoIterator<Item = (Q, D, f64)>,
    {
        let mut queries: BTreeMap<String, QueryRun> = BTreeMap::new();
        for (query, doc, score) in entries {
            let (query, doc) = (query.as_ref(), doc.as_ref());
            if score.is_nan() {
                return Err(Error::NanScore {
                    query: query.to_owned(),
                    doc: doc.to_owned(),
                });
            }
            match queries.get_mut(query) {
                Some(run) => run.push(doc, score),
                None => {
                    let mut run = QueryRun::new();
                    run.push(doc, score);
                    queries.insert(query.to_owned(), run);
                }
            }
        }
        for (query, run) in &queries {
            if let Some((_, second)) = run.find_duplicate() {
                return Err(Error::DuplicateDocument {
                    query: query.clone(),
                    doc: run.doc(second).to_owned(),
                });
            }
        }
        Ok(Self { queries, tag: None })
    }

    /// Builds a run from nested maps or iterators: query -> (doc, score) pairs, e.g. a
    /// `HashMap<String, HashMap<String, f64>>`. A query given twice is merged.
    ///
    /// Errors as [`Run::from_entries`].
    pub fn from_nested<Q, D, I, J>(queries: I) -> Result<Self>
    where
        Q: AsRef<str>,
        D: AsRef<str>,
        I: IntoIterator<Item = (Q, J)>,
        J: IntoIterator<Item = (D, f64)>,
    {
        let mut run = Self::new();
        for (query, docs) in queries {
            let query = query.as_ref();
            let mut built = QueryRun::new();
            for (doc, score) in docs {
                let doc = doc.as_ref();
                if score.is_nan() {
                    return Err(Error::NanScore {
                        query: query.to_owned(),
                        doc: doc.to_owned(),
                    });
                }
                built.push(doc, score);
            }
            match run.queries.get_mut(query) {
                Some(existing) => existing.append(&built),
                None => {
                    run.queries.insert(query.to_owned(), built);
                }
            }
        }
        for (query, docs) in &run.queries {
            if let Some((_, second)) = docs.find_duplicate() {
                return Err(Error::DuplicateDocument {
                    query: query.clone(),
                    doc: docs.doc(second).to_owned(),
                });
            }
        }
        Ok(run)
    }

    /// Adds one query's scored documents (for example a retriever's top-k for it).
    ///
    /// Errors: [`Error::DuplicateQuery`] if the run already has `query`, and the errors of
    /// [`Run::from_entries`]. On error the run is unchanged.
    pub fn insert_query<Q, D, J>(&mut self, query: Q, docs: J) -> Result<()>
    where
        Q: Into<String>,
        D: AsRef<str>,
        J: IntoIterator<Item = (D, f64)>,
    {
        let query = query.into();
        if self.queries.contains_key(&query) {
            return Err(Error::DuplicateQuery { query });
        }
        let mut built = QueryRun::new();
        for (doc, score) in docs {
            let doc = doc.as_ref();
            if score.is_nan() {
                return Err(Error::NanScore {
                    query,
                    doc: doc.to_owned(),
                });
            }
            built.push(doc, score);
        }
        if let Some((_, second)) = built.find_duplicate() {
            return Err(Error::DuplicateDocument {
                query,
                doc: built.doc(second).to_owned(),
            });
        }
        self.queries.insert(query, built);
        Ok(())
    }

    /// The run tag (last column of a TREC run file; the first line's tag when read from a file).
    pub fn tag(&self) -> Option<&str> {
        self.tag.as_deref()
    }

    /// Sets the run tag written by [`Run::write`]. It must not contain whitespace to survive a
    /// round trip through a TREC file.
    pub fn set_tag(&mut self, tag: impl Into<String>) {
        self.tag = Some(tag.into());
    }

    /// One query's documents.
    pub fn query(&self, query: &str) -> Option<&QueryRun> {
        self.queries.get(query)
    }

    /// `(query id, documents)` in byte order of the ids.
    pub fn queries(&self) -> impl ExactSizeIterator<Item = (&str, &QueryRun)> + '_ {
        self.queries.iter().map(|(q, r)| (q.as_str(), r))
    }

    /// Number of queries.
    pub fn len(&self) -> usize {
        self.queries.len()
    }

    /// Whether the run has no queries.
    pub fn is_empty(&self) -> bool {
        self.queries.is_empty()
    }

    /// Total number of (query, document) entries.
    pub fn num_entries(&self) -> usize {
        self.queries.values().map(QueryRun::len).sum()
    }

    /// Reads a TREC run file: six whitespace-separated columns per line,
    /// `query Q0 doc rank score tag`. The second and fourth columns are ignored (documents are
    /// ranked by score, as trec_eval does); blank lines are skipped.
    ///
    /// Errors name the file and line: [`ParseErrorKind::WrongColumnCount`],
    /// [`ParseErrorKind::InvalidScore`] (not a number, or NaN),
    /// [`ParseErrorKind::DuplicateDocument`] (reported at the second occurrence),
    /// [`ParseErrorKind::EmptyFile`], [`ParseErrorKind::InvalidUtf8`]; and [`Error::Io`].
    pub fn read(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let file = File::open(path).map_err(|source| Error::Io {
            path: path.to_path_buf(),
            source,
        })?;
        Self::parse(BufReader::with_capacity(1 << 16, file), path)
    }

    /// Reads a TREC run from any reader, as [`Run::read`]; errors name the input `<input>`.
    pub fn from_reader(reader: impl BufRead) -> Result<Self> {
        Self::parse(reader, Path::new(READER_NAME))
    }

    fn parse(reader: impl BufRead, path: &Path) -> Result<Self> {
        let mut lines = LineReader::new(reader, path);
        // Per query: documents and the line each came from. Lines of one query are usually
        // contiguous, so the current query is accumulated apart and merged when the query changes.
        let mut queries: BTreeMap<String, (QueryRun, Vec<usize>)> = BTreeMap::new();
        let mut current_query = String::new();
        let mut current = (QueryRun::new(), Vec::new());
        let mut tag: Option<String> = None;
        while lines.next_line()? {
            let mut fields = [""; MAX_FIELDS];
            let found = lines.fields(&mut fields)?;
            if found != 6 {
                return Err(lines.error(ParseErrorKind::WrongColumnCount { expected: 6, found }));
            }
            let [query, _, doc, _, score_text, run_tag, ..] = fields;
            let score: f64 = match score_text.parse() {
                Ok(s) if !f64::is_nan(s) => s,
                _ => {
                    return Err(lines.error(ParseErrorKind::InvalidScore {
                        value: score_text.to_owned(),
                    }));
                }
            };
            if tag.is_none() {
                tag = Some(run_tag.to_owned());
            }
            if query != current_query {
                flush(&mut queries, &current_query, &mut current);
                current_query.clear();
                current_query.push_str(query);
            }
            current.0.push(doc, score);
            current.1.push(lines.line());
        }
        flush(&mut queries, &current_query, &mut current);
        if queries.is_empty() {
            return Err(lines.error(ParseErrorKind::EmptyFile));
        }
        // Report the duplicate whose second occurrence comes first in the file.
        let mut worst: Option<(usize, usize, &str, &str)> = None;
        for (query, (docs, doc_lines)) in &queries {
            if let Some((first, second)) = docs.find_duplicate() {
                let (first_line, line) = (doc_lines[first], doc_lines[second]);
                if worst.is_none_or(|w| line < w.1) {
                    worst = Some((first_line, line, query, docs.doc(second)));
                }
            }
        }
        if let Some((first_line, line, query, doc)) = worst {
            return Err(Error::Parse {
                path: lines.path().to_path_buf(),
                line,
                kind: ParseErrorKind::DuplicateDocument {
                    query: query.to_owned(),
                    doc: doc.to_owned(),
                    first_line,
                },
            });
        }
        let queries = queries
            .into_iter()
            .map(|(q, (docs, _))| (q, docs))
            .collect();
        Ok(Self { queries, tag })
    }

    /// Writes the run as a TREC run file, queries in byte order of their ids and each query's
    /// documents in rank order under `tie`, ranks from 1, scores in Rust's shortest
    /// round-trip decimal form, the tag from [`Run::tag`] or [`DEFAULT_RUN_TAG`].
    pub fn write(&self, path: impl AsRef<Path>, tie: TieBreak) -> Result<()> {
        let path = path.as_ref();
        let io = |source| Error::Io {
            path: path.to_path_buf(),
            source,
        };
        let file = File::create(path).map_err(io)?;
        let mut writer = BufWriter::with_capacity(1 << 16, file);
        self.write_lines(&mut writer, tie).map_err(io)?;
        writer.flush().map_err(io)
    }

    /// Writes the run to any writer, as [`Run::write`].
    pub fn to_writer(&self, mut writer: impl Write, tie: TieBreak) -> Result<()> {
        self.write_lines(&mut writer, tie)
            .map_err(|source| Error::Io {
                path: PathBuf::from(WRITER_NAME),
                source,
            })
    }

    fn write_lines(&self, writer: &mut impl Write, tie: TieBreak) -> std::io::Result<()> {
        let tag = self.tag.as_deref().unwrap_or(DEFAULT_RUN_TAG);
        for (query, docs) in &self.queries {
            for entry in docs.ranking(tie).iter() {
                writeln!(
                    writer,
                    "{query} Q0 {} {} {} {tag}",
                    entry.doc, entry.rank, entry.score
                )?;
            }
        }
        Ok(())
    }
}

/// Moves the accumulated entries of `query` into `queries` (merging with earlier entries of the
/// same query).
fn flush(
    queries: &mut BTreeMap<String, (QueryRun, Vec<usize>)>,
    query: &str,
    current: &mut (QueryRun, Vec<usize>),
) {
    if current.0.is_empty() {
        return;
    }
    let taken = std::mem::replace(current, (QueryRun::new(), Vec::new()));
    match queries.get_mut(query) {
        Some((docs, lines)) => {
            docs.append(&taken.0);
            lines.extend_from_slice(&taken.1);
        }
        None => {
            queries.insert(query.to_owned(), taken);
        }
    }
}
