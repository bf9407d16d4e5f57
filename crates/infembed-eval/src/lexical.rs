//! A BM25 lexical baseline.
//!
//! FollowIR and the InF-IR paper report BM25 next to the neural retrievers: a lexical model reads the
//! instruction as a bag of extra words, so it shows how far plain term matching gets on an
//! instruction-following test. It is also what `infembed eval` runs when no model directory is given.
//!
//! The scoring is documented at [`Bm25Index`].

use std::collections::{HashMap, HashSet};

use crate::stem::{LUCENE_ENGLISH_STOPWORDS, porter_stem};

/// BM25 parameters and text analysis.
///
/// The default analysis is the plain one this crate has always used (lower-cased alphanumeric
/// tokens, nothing removed, nothing stemmed). Pyserini's default analyzer (Lucene's English
/// analyzer) also removes English stop words and applies Porter's stemmer:
/// [`Bm25Config::pyserini`] sets both.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Bm25Config {
    /// Term-frequency saturation.
    pub k1: f32,
    /// Length normalisation (0 = none, 1 = full).
    pub b: f32,
    /// Stemming of every token (documents and queries alike).
    #[serde(default)]
    pub stemmer: Stemmer,
    /// Stop words removed before scoring.
    #[serde(default)]
    pub stopwords: StopWords,
}

impl Default for Bm25Config {
    fn default() -> Self {
        Self {
            k1: 0.9,
            b: 0.4,
            stemmer: Stemmer::None,
            stopwords: StopWords::None,
        }
    }
}

impl Bm25Config {
    /// Pyserini's defaults: `k1 = 0.9`, `b = 0.4`, Lucene's English stop words and Porter's
    /// stemmer.
    pub fn pyserini() -> Self {
        Self {
            stemmer: Stemmer::Porter,
            stopwords: StopWords::Lucene,
            ..Self::default()
        }
    }
}

/// How BM25 tokens are stemmed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Stemmer {
    /// Tokens are kept as they are (`none`).
    #[default]
    None,
    /// Porter's stemmer as Lucene's `PorterStemFilter` applies it ([`crate::porter_stem`];
    /// `porter`).
    Porter,
}

/// Which stop words BM25 drops.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum StopWords {
    /// None: every token counts (`none`).
    #[default]
    None,
    /// The 33 English stop words of Lucene's `EnglishAnalyzer` ("a", "an", "and", "the", ...;
    /// `lucene`).
    Lucene,
}

/// One name per variant, used everywhere the choice is written or read: `Display`, `FromStr`
/// (the command line) and serde (configs) of [`Stemmer`] and [`StopWords`].
macro_rules! named_choices {
    ($ty:ident, $what:literal, $($variant:ident => $name:literal),+) => {
        impl $ty {
            /// The choice's name in configs, on the command line and in retriever names.
            pub fn name(self) -> &'static str {
                match self {
                    $(Self::$variant => $name),+
                }
            }
        }

        impl std::fmt::Display for $ty {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.name())
            }
        }

        impl std::str::FromStr for $ty {
            type Err = String;

            fn from_str(text: &str) -> std::result::Result<Self, String> {
                match text {
                    $($name => Ok(Self::$variant),)+
                    other => Err(format!(
                        concat!("unknown ", $what, " `{}` (expected one of: {})"),
                        other,
                        [$($name),+].join(", ")
                    )),
                }
            }
        }

        impl serde::Serialize for $ty {
            fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
                s.serialize_str(self.name())
            }
        }

        impl<'de> serde::Deserialize<'de> for $ty {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
                String::deserialize(d)?.parse().map_err(serde::de::Error::custom)
            }
        }
    };
}

named_choices!(Stemmer, "stemmer", None => "none", Porter => "porter");
named_choices!(StopWords, "stop list", None => "none", Lucene => "lucene");

/// Turns texts into BM25 terms: [`tokenize`], then the stop words and the stemmer of a config.
#[derive(Debug, Clone)]
struct Analyzer {
    stopwords: HashSet<&'static str>,
    stemmer: Stemmer,
}

impl Analyzer {
    fn new(config: &Bm25Config) -> Self {
        let stopwords = match config.stopwords {
            StopWords::None => HashSet::new(),
            StopWords::Lucene => LUCENE_ENGLISH_STOPWORDS.into_iter().collect(),
        };
        Self {
            stopwords,
            stemmer: config.stemmer,
        }
    }

    fn terms<'a>(&'a self, text: &'a str) -> impl Iterator<Item = String> + 'a {
        tokenize(text)
            .filter(|t| !self.stopwords.contains(t.as_str()))
            .map(|t| match self.stemmer {
                Stemmer::None => t,
                Stemmer::Porter => porter_stem(&t),
            })
    }
}

/// Splits text into lower-cased alphanumeric tokens.
pub fn tokenize(text: &str) -> impl Iterator<Item = String> + '_ {
    text.split(|c: char| !c.is_alphanumeric())
        .filter(|t| !t.is_empty())
        .map(str::to_lowercase)
}

/// An inverted index over a fixed corpus, scored with BM25.
///
/// Scoring is Okapi BM25 with Lucene's non-negative idf:
///
/// ```text
/// idf(t)      = ln(1 + (N - df(t) + 0.5) / (df(t) + 0.5))
/// score(q, d) = sum over query tokens t of idf(t) * tf(t, d) * (k1 + 1)
///                                        / (tf(t, d) + k1 * (1 - b + b * |d| / avgdl))
/// ```
///
/// A query token that occurs twice counts twice (as Lucene's boolean query of term clauses does).
/// Tokens are maximal runs of alphanumeric characters, lower-cased; by default there is no
/// stemming and no stop list ([`Bm25Config::pyserini`] adds Lucene's English stop words and
/// Porter's stemmer, to documents and queries alike). Defaults `k1 = 0.9`, `b = 0.4` are
/// Anserini's/Pyserini's.
#[derive(Debug, Clone)]
pub struct Bm25Index {
    config: Bm25Config,
    analyzer: Analyzer,
    /// term -> (document index, term frequency), document indices ascending.
    postings: HashMap<String, Vec<(u32, u32)>>,
    doc_len: Vec<u32>,
    avg_len: f32,
}

impl Bm25Index {
    /// Indexes `texts`; document `i` of the result is `texts[i]`.
    pub fn new<'a>(texts: impl IntoIterator<Item = &'a str>, config: Bm25Config) -> Self {
        let analyzer = Analyzer::new(&config);
        let mut postings: HashMap<String, Vec<(u32, u32)>> = HashMap::new();
        let mut doc_len = Vec::new();
        for (i, text) in texts.into_iter().enumerate() {
            let doc = u32::try_from(i).expect("corpus larger than u32::MAX documents");
            let mut tf: HashMap<String, u32> = HashMap::new();
            let mut len = 0u32;
            for token in analyzer.terms(text) {
                *tf.entry(token).or_default() += 1;
                len += 1;
            }
            for (term, count) in tf {
                postings.entry(term).or_default().push((doc, count));
            }
            doc_len.push(len);
        }
        let total: u64 = doc_len.iter().map(|&l| u64::from(l)).sum();
        let avg_len = if doc_len.is_empty() {
            0.0
        } else {
            total as f32 / doc_len.len() as f32
        };
        Self {
            config,
            analyzer,
            postings,
            doc_len,
            avg_len,
        }
    }

    /// Number of indexed documents.
    pub fn len(&self) -> usize {
        self.doc_len.len()
    }

    /// Whether the index holds no document.
    pub fn is_empty(&self) -> bool {
        self.doc_len.is_empty()
    }

    /// The inverse document frequency of a term (lower-cased, and stemmed when the config
    /// stems).
    pub fn idf(&self, term: &str) -> f32 {
        let n = self.doc_len.len() as f32;
        let df = self.postings.get(term).map_or(0, Vec::len) as f32;
        (1.0 + (n - df + 0.5) / (df + 0.5)).ln()
    }

    /// The BM25 score of `query` against every document, in corpus order.
    pub fn score_all(&self, query: &str) -> Vec<f32> {
        let Bm25Config { k1, b, .. } = self.config;
        let mut scores = vec![0.0f32; self.doc_len.len()];
        for token in self.analyzer.terms(query) {
            let Some(list) = self.postings.get(&token) else {
                continue;
            };
            let idf = self.idf(&token);
            for &(doc, tf) in list {
                let tf = tf as f32;
                let len = self.doc_len[doc as usize] as f32;
                let norm = if self.avg_len > 0.0 {
                    len / self.avg_len
                } else {
                    0.0
                };
                scores[doc as usize] += idf * tf * (k1 + 1.0) / (tf + k1 * (1.0 - b + b * norm));
            }
        }
        scores
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// BM25 straight from the formula, document by document, in f64, over the terms `analyze`
    /// makes of a text.
    fn naive_with(
        docs: &[&str],
        query: &str,
        k1: f64,
        b: f64,
        analyze: impl Fn(&str) -> Vec<String>,
    ) -> Vec<f64> {
        let toks: Vec<Vec<String>> = docs.iter().map(|d| analyze(d)).collect();
        let n = docs.len() as f64;
        let avg = toks.iter().map(Vec::len).sum::<usize>() as f64 / n;
        toks.iter()
            .map(|d| {
                analyze(query)
                    .into_iter()
                    .map(|t| {
                        let df = toks.iter().filter(|x| x.contains(&t)).count() as f64;
                        let tf = d.iter().filter(|x| **x == t).count() as f64;
                        let idf = (1.0 + (n - df + 0.5) / (df + 0.5)).ln();
                        idf * tf * (k1 + 1.0) / (tf + k1 * (1.0 - b + b * d.len() as f64 / avg))
                    })
                    .sum()
            })
            .collect()
    }

    fn naive(docs: &[&str], query: &str, k1: f64, b: f64) -> Vec<f64> {
        naive_with(docs, query, k1, b, |t| tokenize(t).collect())
    }

    /// Pyserini's analysis spelled out: tokens, minus Lucene's stop list, Porter-stemmed.
    fn pyserini_terms(text: &str) -> Vec<String> {
        tokenize(text)
            .filter(|t| !LUCENE_ENGLISH_STOPWORDS.contains(&t.as_str()))
            .map(|t| porter_stem(&t))
            .collect()
    }

    #[test]
    fn pyserini_analysis_matches_inflections_and_ignores_stop_words() {
        let docs = [
            "The cat runs to the connection",
            "a dog and the cats",
            "running",
        ];
        let plain = Bm25Index::new(docs, Bm25Config::default());
        let stemmed = Bm25Index::new(docs, Bm25Config::pyserini());
        // "running" and "runs" share the stem "run"; "cats" and "cat" the stem "cat"
        assert_eq!(plain.score_all("running")[0], 0.0);
        assert!(stemmed.score_all("running")[0] > 0.0);
        assert!(stemmed.score_all("cat")[1] > 0.0);
        // stop words never score, even where they occur
        assert_eq!(stemmed.score_all("the and to a"), vec![0.0; 3]);
        assert!(plain.score_all("the")[0] > 0.0);
        assert_eq!(
            stemmed.idf("connect"),
            stemmed.idf(&porter_stem("connection"))
        );
        let cfg: Bm25Config = serde_json::from_str(
            r#"{"k1": 0.9, "b": 0.4, "stemmer": "porter", "stopwords": "lucene"}"#,
        )
        .unwrap();
        assert_eq!(cfg, Bm25Config::pyserini());
        let old: Bm25Config = serde_json::from_str(r#"{"k1": 1.2, "b": 0.75}"#).unwrap();
        assert_eq!(
            (old.stemmer, old.stopwords),
            (Stemmer::None, StopWords::None)
        );
    }

    #[test]
    fn tokenizer_lowercases_and_splits_on_punctuation() {
        let t: Vec<String> = tokenize("Hello, WORLD!  état-major 42").collect();
        assert_eq!(t, ["hello", "world", "état", "major", "42"]);
    }

    #[test]
    fn rarer_terms_weigh_more_and_absent_terms_score_zero() {
        let docs = ["apple banana", "apple cherry", "apple"];
        let index = Bm25Index::new(docs, Bm25Config::default());
        assert!(index.idf("cherry") > index.idf("apple"));
        let s = index.score_all("cherry durian");
        assert_eq!(s[0], 0.0);
        assert!(s[1] > 0.0);
        assert_eq!(index.score_all("durian"), vec![0.0; 3]);
    }

    proptest! {
        #[test]
        fn matches_the_formula(
            docs in proptest::collection::vec("[abcde ]{0,30}", 1..12),
            query in "[abcdef ]{0,12}",
            k1 in 0.1f64..2.0,
            b in 0.0f64..1.0,
        ) {
            let refs: Vec<&str> = docs.iter().map(String::as_str).collect();
            let cfg = Bm25Config { k1: k1 as f32, b: b as f32, ..Bm25Config::default() };
            let got = Bm25Index::new(refs.iter().copied(), cfg).score_all(&query);
            let want = naive(&refs, &query, k1, b);
            for (g, w) in got.iter().zip(&want) {
                let w = if w.is_nan() { 0.0 } else { *w };
                prop_assert!((f64::from(*g) - w).abs() <= 1e-4 * (1.0 + w.abs()), "{g} vs {w}");
            }
        }

        #[test]
        fn pyserini_analysis_matches_the_formula(
            docs in proptest::collection::vec(
                proptest::collection::vec(
                    "(the|a|and|cat|cats|run|runs|running|connect|connected|connection|dog) ", 0..8)
                    .prop_map(|w| w.concat()),
                1..10),
            query in proptest::collection::vec(
                "(the|cat|cats|running|connections|dog|bird) ", 0..5).prop_map(|w| w.concat()),
        ) {
            let refs: Vec<&str> = docs.iter().map(String::as_str).collect();
            let got = Bm25Index::new(refs.iter().copied(), Bm25Config::pyserini()).score_all(&query);
            let want = naive_with(&refs, &query, 0.9, 0.4, pyserini_terms);
            for (g, w) in got.iter().zip(&want) {
                let w = if w.is_nan() { 0.0 } else { *w };
                prop_assert!((f64::from(*g) - w).abs() <= 1e-4 * (1.0 + w.abs()), "{g} vs {w}");
            }
        }
    }
}
