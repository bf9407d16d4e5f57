//! Deterministic passages for the encoder benchmark (and `scripts/encoder/bench_st.py`, which
//! re-implements the same generator in Python so both sides embed identical texts).
//!
//! Passage `i` is 120 words drawn from [`WORDS`] by a 64-bit LCG seeded with `i + 1`
//! (`x = x * 6364136223846793005 + 1442695040888963407`, word `(x >> 33) % WORDS.len()`),
//! with a full stop after every 12th word. With the MiniLM (BERT uncased WordPiece) tokenizer
//! this is about 130 tokens per passage (every word is a single token, plus the full stops
//! and `[CLS]`/`[SEP]`), so nothing is truncated at 256.

/// The vocabulary of the synthetic passages: common English words, each one WordPiece token.
pub const WORDS: [&str; 64] = [
    "the", "of", "and", "to", "in", "is", "was", "for", "on", "are", "with", "as", "by", "at",
    "from", "this", "that", "which", "water", "system", "people", "time", "year", "city", "world",
    "school", "house", "music", "river", "market", "energy", "health", "study", "history", "game",
    "team", "power", "light", "field", "model", "data", "paper", "black", "small", "large",
    "early", "public", "local", "human", "social", "united", "national", "general", "found",
    "known", "used", "made", "called", "between", "during", "after", "before", "under", "over",
];

/// Words per passage.
pub const WORDS_PER_PASSAGE: usize = 120;

/// Passage `i` (see the module docs for the generator).
pub fn passage(i: usize) -> String {
    let mut x: u64 = i as u64 + 1;
    let mut out = String::new();
    for w in 0..WORDS_PER_PASSAGE {
        x = x
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        let word = WORDS[((x >> 33) % WORDS.len() as u64) as usize];
        if w > 0 {
            out.push(' ');
        }
        out.push_str(word);
        if w % 12 == 11 {
            out.push('.');
        }
    }
    out
}

/// The first `n` passages.
pub fn passages(n: usize) -> Vec<String> {
    (0..n).map(passage).collect()
}
