//! Helpers shared by this crate's integration tests: deterministic texts from a small
//! vocabulary, and dropout-free copies of the encoder crate's tiny fixtures.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

/// A fixture directory of the encoder crate.
pub fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../infembed-encoder/tests/fixtures")
        .join(name)
}

const WORDS: [&str; 12] = [
    "cat", "dog", "ocean", "ships", "news", "world", "mat", "models", "query", "hello", "find",
    "recent",
];

/// `len` words of the vocabulary, a fixed function of `seed`.
pub fn text(seed: usize, len: usize) -> String {
    (0..len)
        .map(|i| WORDS[(seed * 7 + i * 5 + i * i) % WORDS.len()])
        .collect::<Vec<_>>()
        .join(" ")
}

/// A copy of fixture `name` in `dir` with its dropout probabilities set to 0 (the keys
/// the config has among BERT's and the decoders'), so that training is deterministic.
pub fn without_dropout(name: &str, dir: &Path) -> PathBuf {
    let out = dir.join(name);
    infembed_testkit::copy_dir(&fixture(name), &out);
    let cfg_path = out.join("config.json");
    let mut cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&cfg_path).unwrap()).unwrap();
    for key in [
        "hidden_dropout_prob",
        "attention_probs_dropout_prob",
        "attention_dropout",
    ] {
        if cfg.get(key).is_some() {
            cfg[key] = 0.0.into();
        }
    }
    std::fs::write(&cfg_path, cfg.to_string()).unwrap();
    out
}
