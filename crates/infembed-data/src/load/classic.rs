//! The classic test collections kept in the project's shared data (`collections/` there), each
//! loaded into an [`EvalSet`].
//!
//! | collection | files read | ids |
//! |---|---|---|
//! | CACM | `cacm.jsonl` (`id`, `contents`), `topics.cacm.txt` (TREC SGML, `<DOC><DOCNO>`), `qrels.cacm.txt` (TREC qrels) | as in the files |
//! | CISI | `CISI.ALL`, `CISI.QRY`, `CISI.REL` (SMART; REL lines `qid docid 0 0.0`, every pair relevant with grade 1) | `.I` numbers |
//! | Cranfield | `cran.all.1400`, `cran.qry`, `cranqrel` (`qid docid code`) | documents: `.I`; queries: position `1..=225` in `cran.qry` (see below) |
//! | NPL (vaswani) | `corpus/doc-text.trec`, `query-text.trec` (TREC SGML), `qrels` (TREC qrels) | as in the files |
//! | MS MARCO subset | BEIR layout, split `test` | as in the files |
//!
//! Cranfield: `cran.qry` numbers its queries with gaps (`.I 001, 002, 004, ...`), while `cranqrel`
//! numbers them `1..=225` in file order; query ids here are therefore the positions, as strings.
//! Cranfield grades are kept as the file has them (`-1` and `1..=4`, the same values ir_datasets
//! reports); `-1` is a judged non-relevant pair. The Glasgow readme describes code 1 as the most
//! relevant, while ir_datasets treats 4 as the most relevant; for binary metrics (anything `> 0`
//! is relevant) the two readings agree.
//!
//! Document texts: CISI and Cranfield take the title from `.T` and the text from `.W`; queries take
//! `.W`. CACM documents have no separate title (`contents` is the text, trimmed).

use std::path::{Path, PathBuf};

use crate::error::Result;
use crate::eval::{Document, EvalSet, Qrels, Query};
use crate::load::beir::load_beir;
use crate::load::smart::{SmartRecord, read_smart};
use crate::load::trec::{read_trec_docs, read_trec_qrels, read_trec_topics};
use crate::load::{
    IdSet, add_judgment, for_each_json_object, format_error, json_id, json_str, numbered_lines,
    parse_grade, read_text, require_file,
};

/// The collections under `collections/` of the shared data.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Collection {
    /// CACM (3,204 documents, 64 queries).
    Cacm,
    /// CISI (1,460 documents, 112 queries).
    Cisi,
    /// Cranfield (1,400 documents, 225 queries).
    Cranfield,
    /// NPL, in the `vaswani/` folder (11,429 documents, 93 queries).
    Vaswani,
    /// The MS MARCO passage subset in BEIR layout (1,743 passages and queries).
    MsMarcoSubset,
}

impl Collection {
    /// All collections.
    pub const ALL: [Collection; 5] = [
        Collection::Cacm,
        Collection::Cisi,
        Collection::Cranfield,
        Collection::Vaswani,
        Collection::MsMarcoSubset,
    ];

    /// The collection's folder name under `collections/`, also used as the set's name.
    pub fn folder(self) -> &'static str {
        match self {
            Collection::Cacm => "cacm",
            Collection::Cisi => "cisi",
            Collection::Cranfield => "cranfield",
            Collection::Vaswani => "vaswani",
            Collection::MsMarcoSubset => "msmarco-subset",
        }
    }

    /// Parses a folder name (as [`Collection::folder`] gives it).
    pub fn from_folder(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|c| c.folder() == name)
    }

    /// Loads the collection from its own folder (e.g. `.../collections/cacm`).
    ///
    /// # Errors
    /// [`crate::Error::MissingFile`] for an absent file, else the parsers' errors.
    pub fn load(self, dir: impl AsRef<Path>) -> Result<EvalSet> {
        let dir = dir.as_ref();
        match self {
            Collection::Cacm => load_cacm(dir),
            Collection::Cisi => load_cisi(dir),
            Collection::Cranfield => load_cranfield(dir),
            Collection::Vaswani => load_vaswani(dir),
            Collection::MsMarcoSubset => {
                let mut set = load_beir(dir, "test")?;
                set.name = self.folder().to_string();
                Ok(set)
            }
        }
    }

    /// Loads the collection from a shared-data root (the folder holding `collections/`).
    ///
    /// # Errors
    /// As [`Collection::load`].
    pub fn load_from_root(self, root: impl AsRef<Path>) -> Result<EvalSet> {
        self.load(collection_dir(root.as_ref(), self))
    }
}

fn collection_dir(root: &Path, c: Collection) -> PathBuf {
    root.join("collections").join(c.folder())
}

/// CACM document ids as the qrels write them: `cacm.jsonl` zero-pads the number to four digits
/// (`CACM-0046`) while `qrels.cacm.txt` does not (`CACM-46`), so leading zeros of the number are
/// dropped. Other ids are returned unchanged.
fn cacm_doc_id(raw: &str) -> String {
    match raw.strip_prefix("CACM-") {
        Some(num) if !num.is_empty() && num.bytes().all(|b| b.is_ascii_digit()) => {
            let trimmed = num.trim_start_matches('0');
            format!("CACM-{}", if trimmed.is_empty() { "0" } else { trimmed })
        }
        _ => raw.to_string(),
    }
}

/// Loads CACM (`cacm.jsonl`, `topics.cacm.txt`, `qrels.cacm.txt`). Document ids are normalised to
/// the qrels' unpadded form (`CACM-0046` becomes `CACM-46`).
///
/// # Errors
/// Missing files or malformed content.
pub fn load_cacm(dir: impl AsRef<Path>) -> Result<EvalSet> {
    let dir = dir.as_ref();
    let corpus_path = require_file(dir, "cacm.jsonl", "CACM documents")?;
    let mut corpus = Vec::new();
    let mut ids = IdSet::new();
    for_each_json_object(&corpus_path, |line, obj| {
        let id = cacm_doc_id(&json_id(obj, "id", &corpus_path, line)?);
        ids.insert(&id, &corpus_path, line)?;
        let text = json_str(obj, "contents", &corpus_path, line)?
            .trim()
            .to_string();
        corpus.push(Document {
            id,
            title: String::new(),
            text,
        });
        Ok(())
    })?;
    let queries = read_trec_topics(require_file(dir, "topics.cacm.txt", "CACM topics")?)?;
    let qrels = read_trec_qrels(require_file(dir, "qrels.cacm.txt", "CACM qrels")?)?;
    Ok(EvalSet {
        name: "cacm".to_string(),
        corpus,
        queries,
        qrels,
        top_ranked: None,
    })
}

fn smart_docs(records: Vec<SmartRecord>) -> Vec<Document> {
    records
        .into_iter()
        .map(|r| Document {
            title: r.field('T').to_string(),
            text: r.field('W').to_string(),
            id: r.id,
        })
        .collect()
}

fn smart_queries(path: &Path, records: Vec<SmartRecord>) -> Result<Vec<Query>> {
    records
        .into_iter()
        .map(|r| {
            let text = r.field('W').to_string();
            if text.is_empty() {
                return Err(format_error(
                    path,
                    r.line,
                    format!("query {} has no .W text", r.id),
                ));
            }
            Ok(Query {
                id: r.id,
                text,
                instruction: None,
            })
        })
        .collect()
}

/// Reads a qrels file whose lines hold at least `query doc` (whitespace-separated), with the grade
/// computed from the columns by `grade`.
fn read_column_qrels(
    path: &Path,
    min_columns: usize,
    mut grade: impl FnMut(&[&str]) -> std::result::Result<(String, i32), String>,
) -> Result<Qrels> {
    let text = read_text(path)?;
    let mut qrels = Qrels::new();
    for (line, content) in numbered_lines(&text) {
        let cols: Vec<&str> = content.split_whitespace().collect();
        if cols.is_empty() {
            continue;
        }
        if cols.len() < min_columns {
            return Err(format_error(
                path,
                line,
                format!(
                    "expected at least {min_columns} columns, found {}",
                    cols.len()
                ),
            ));
        }
        let (query, g) = grade(&cols).map_err(|p| format_error(path, line, p))?;
        add_judgment(&mut qrels, &query, cols[1], g, path, line)?;
    }
    Ok(qrels)
}

/// Loads CISI (`CISI.ALL`, `CISI.QRY`, `CISI.REL`).
///
/// # Errors
/// Missing files or malformed content.
pub fn load_cisi(dir: impl AsRef<Path>) -> Result<EvalSet> {
    let dir = dir.as_ref();
    let corpus = smart_docs(read_smart(require_file(
        dir,
        "CISI.ALL",
        "CISI documents",
    )?)?);
    let qry = require_file(dir, "CISI.QRY", "CISI queries")?;
    let queries = smart_queries(&qry, read_smart(&qry)?)?;
    let rel = require_file(dir, "CISI.REL", "CISI qrels")?;
    let qrels = read_column_qrels(&rel, 2, |cols| Ok((cols[0].to_string(), 1)))?;
    Ok(EvalSet {
        name: "cisi".to_string(),
        corpus,
        queries,
        qrels,
        top_ranked: None,
    })
}

/// Loads Cranfield (`cran.all.1400`, `cran.qry`, `cranqrel`); query ids are positions `1..=225`
/// (see the module docs).
///
/// # Errors
/// Missing files, malformed content, or a qrels query number outside `1..=number of queries`.
pub fn load_cranfield(dir: impl AsRef<Path>) -> Result<EvalSet> {
    let dir = dir.as_ref();
    let corpus = smart_docs(read_smart(require_file(
        dir,
        "cran.all.1400",
        "Cranfield documents",
    )?)?);
    let qry = require_file(dir, "cran.qry", "Cranfield queries")?;
    let mut queries = smart_queries(&qry, read_smart(&qry)?)?;
    for (i, q) in queries.iter_mut().enumerate() {
        q.id = (i + 1).to_string();
    }
    let n = queries.len();
    let rel = require_file(dir, "cranqrel", "Cranfield qrels")?;
    let qrels = read_column_qrels(&rel, 3, |cols| {
        let q: usize = cols[0]
            .parse()
            .ok()
            .filter(|q| (1..=n).contains(q))
            .ok_or_else(|| format!("query number {:?} is not in 1..={n}", cols[0]))?;
        let g = parse_grade(cols[2]).map_err(|p| format!("relevance code {p}"))?;
        Ok((q.to_string(), g))
    })?;
    Ok(EvalSet {
        name: "cranfield".to_string(),
        corpus,
        queries,
        qrels,
        top_ranked: None,
    })
}

/// Loads NPL as kept in `vaswani/` (`corpus/doc-text.trec`, `query-text.trec`, `qrels`).
///
/// # Errors
/// Missing files or malformed content.
pub fn load_vaswani(dir: impl AsRef<Path>) -> Result<EvalSet> {
    let dir = dir.as_ref();
    let corpus = read_trec_docs(require_file(dir, "corpus/doc-text.trec", "NPL documents")?)?;
    let queries = read_trec_topics(require_file(dir, "query-text.trec", "NPL topics")?)?;
    let qrels = read_trec_qrels(require_file(dir, "qrels", "NPL qrels")?)?;
    Ok(EvalSet {
        name: "vaswani".to_string(),
        corpus,
        queries,
        qrels,
        top_ranked: None,
    })
}

#[cfg(test)]
mod tests {
    use super::cacm_doc_id;

    #[test]
    fn cacm_ids_lose_zero_padding_only() {
        assert_eq!(cacm_doc_id("CACM-0046"), "CACM-46");
        assert_eq!(cacm_doc_id("CACM-2636"), "CACM-2636");
        assert_eq!(cacm_doc_id("CACM-1000"), "CACM-1000");
        assert_eq!(cacm_doc_id("CACM-0000"), "CACM-0");
        assert_eq!(cacm_doc_id("CACM-"), "CACM-");
        assert_eq!(cacm_doc_id("CACM-01a"), "CACM-01a");
        assert_eq!(cacm_doc_id("other-007"), "other-007");
    }
}
