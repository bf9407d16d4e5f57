//! Turning a query's scored documents into a ranking: the tie rule.

use crate::run::QueryRun;
use crate::tie::TieBreak;

/// One entry of a [`Ranking`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RankedDocument<'a> {
    /// 1-based rank.
    pub rank: usize,
    /// Document id.
    pub doc: &'a str,
    /// The document's score as given (not rounded).
    pub score: f64,
}

/// A query's documents sorted by a [`TieBreak`] rule (sorted once, on construction).
#[derive(Debug, Clone)]
pub struct Ranking<'a> {
    run: &'a QueryRun,
    order: Vec<usize>,
}

impl<'a> Ranking<'a> {
    /// Sorts `run`'s documents by `tie`.
    pub fn new(run: &'a QueryRun, tie: TieBreak) -> Self {
        let keys: Vec<f64> = run.scores().iter().map(|&s| tie.key(s)).collect();
        let mut order: Vec<usize> = (0..run.len()).collect();
        order.sort_unstable_by(|&a, &b| tie.compare(keys[a], run.doc(a), keys[b], run.doc(b)));
        Self { run, order }
    }

    /// Number of ranked documents.
    pub fn len(&self) -> usize {
        self.order.len()
    }

    /// Whether there are no documents.
    pub fn is_empty(&self) -> bool {
        self.order.is_empty()
    }

    /// The document at 1-based `rank`, if there is one.
    pub fn get(&self, rank: usize) -> Option<RankedDocument<'a>> {
        let index = *self.order.get(rank.checked_sub(1)?)?;
        Some(RankedDocument {
            rank,
            doc: self.run.doc(index),
            score: self.run.score(index),
        })
    }

    /// The documents from rank 1 down.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = RankedDocument<'a>> + '_ {
        let run = self.run;
        self.order
            .iter()
            .enumerate()
            .map(move |(i, &index)| RankedDocument {
                rank: i + 1,
                doc: run.doc(index),
                score: run.score(index),
            })
    }
}

impl QueryRun {
    /// The documents sorted by `tie`.
    pub fn ranking(&self, tie: TieBreak) -> Ranking<'_> {
        Ranking::new(self, tie)
    }
}
