//! The quality check's pieces: per-pair deterministic randomness, distractor sampling, shuffled
//! lettered options and the parsing of the judge's letter.
//!
//! Each of the three scenarios asks the judge to pick, for one (instruction, query), the best of
//! the same passage set: the record's P+, P1-, P2- and `k` distractors, shuffled once per pair and
//! shown in that order in all three scenarios (the judge prompt starts with the options, so a
//! server with prompt caching processes them once per pair). The right answer is P+ for
//! (I+, Q+), P1- for (I-, Q+) and P2- for (I+, Q-), each at its own letter.

use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::filter::extract_json_object;
use crate::input::PoolPassage;

/// One of the three judged scenarios.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Scenario {
    /// (I+, Q+) should pick P+.
    Positive,
    /// (I-, Q+) should pick P1-.
    NegativeInstruction,
    /// (I+, Q-) should pick P2-.
    NegativeQuery,
}

impl Scenario {
    /// The three scenarios in report order.
    pub const ALL: [Scenario; 3] = [
        Scenario::Positive,
        Scenario::NegativeInstruction,
        Scenario::NegativeQuery,
    ];

    /// Index in [`Scenario::ALL`].
    pub fn index(self) -> usize {
        match self {
            Scenario::Positive => 0,
            Scenario::NegativeInstruction => 1,
            Scenario::NegativeQuery => 2,
        }
    }

    /// The option label of the passage that should win.
    pub fn target(self) -> &'static str {
        match self {
            Scenario::Positive => "document_positive",
            Scenario::NegativeInstruction => "hard_negative_document_1",
            Scenario::NegativeQuery => "hard_negative_document_2",
        }
    }
}

/// 64-bit FNV-1a: a stable hash (unlike `std`'s, fixed across Rust versions) for deriving seeds.
pub fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// The random generator of one pair: a function of the run seed and the pair's ids only, so the
/// same pair gets the same distractors, shuffles and request seeds whatever the processing order.
pub fn pair_rng(seed: u64, query_id: &str, passage_id: &str) -> ChaCha8Rng {
    let mut key = Vec::with_capacity(query_id.len() + passage_id.len() + 1);
    key.extend_from_slice(query_id.as_bytes());
    key.push(0);
    key.extend_from_slice(passage_id.as_bytes());
    ChaCha8Rng::seed_from_u64(seed ^ fnv1a(&key))
}

/// Samples up to `k` distinct distractors from `pool`, skipping the passage with id `exclude_id`
/// and any passage whose text equals one of `exclude_texts` (after trimming). Fewer come back when
/// the pool is too small. Order is the sampling order.
pub fn sample_distractors<'a>(
    rng: &mut impl Rng,
    pool: &'a [PoolPassage],
    k: usize,
    exclude_id: &str,
    exclude_texts: &[&str],
) -> Vec<&'a PoolPassage> {
    let ok = |p: &PoolPassage| {
        p.id != exclude_id && !exclude_texts.iter().any(|t| t.trim() == p.text.trim())
    };
    let mut out: Vec<&PoolPassage> = Vec::with_capacity(k);
    if k == 0 || pool.is_empty() {
        return out;
    }
    // Rejection sampling while the pool is much larger than k; a full scan otherwise.
    if pool.len() >= 4 * (k + exclude_texts.len() + 1) {
        let mut tries = 0;
        while out.len() < k && tries < 64 * (k + 1) {
            tries += 1;
            let p = &pool[rng.random_range(0..pool.len())];
            if ok(p) && !out.iter().any(|q| q.id == p.id) {
                out.push(p);
            }
        }
        if out.len() == k {
            return out;
        }
    }
    let mut candidates: Vec<&PoolPassage> = pool
        .iter()
        .filter(|p| ok(p) && !out.iter().any(|q| q.id == p.id))
        .collect();
    candidates.shuffle(rng);
    let need = k - out.len();
    out.extend(candidates.into_iter().take(need));
    out
}

/// One lettered option shown to the judge.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JudgeOption {
    /// What the passage is: a record field name (`document_positive`, ...) or
    /// `distractor:<passage id>`.
    pub label: String,
    /// The passage text.
    pub text: String,
}

/// The letter of option `i` (0 -> `A`).
pub fn letter(i: usize) -> char {
    assert!(i < 26, "at most 26 options");
    char::from(b'A' + i as u8)
}

/// Shuffles `options` with `rng` and returns them with the index of the option labelled
/// `target`.
///
/// # Panics
/// If no option has label `target` (a contract of the caller, which always includes all three
/// record passages).
pub fn shuffle_options(
    rng: &mut impl Rng,
    mut options: Vec<JudgeOption>,
    target: &str,
) -> (Vec<JudgeOption>, usize) {
    options.shuffle(rng);
    let at = options
        .iter()
        .position(|o| o.label == target)
        .expect("the target passage is among the options");
    (options, at)
}

/// The options as the judge prompt shows them: `[A] text` blocks separated by blank lines, line
/// breaks inside a passage replaced by spaces.
pub fn render_options(options: &[JudgeOption]) -> String {
    options
        .iter()
        .enumerate()
        .map(|(i, o)| {
            let flat: String = o
                .text
                .split(['\n', '\r'])
                .filter(|s| !s.trim().is_empty())
                .collect::<Vec<_>>()
                .join(" ");
            format!("[{}] {}", letter(i), flat.trim())
        })
        .collect::<Vec<_>>()
        .join("\n\n")
}

/// `A, B, C` for 3 options.
pub fn letters_list(n: usize) -> String {
    (0..n)
        .map(|i| letter(i).to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

/// Reads the judge's letter: `{"answer": "B"}` (the JSON may be wrapped in prose or code fences)
/// or a bare answer such as `B`, `[B]`, `B)` or `B.`. Returns the option index when the letter is
/// one of the `n` offered (case-insensitive), `None` for anything else (an invalid answer).
pub fn parse_answer(content: &str, n: usize) -> Option<usize> {
    let raw = match extract_json_object(content) {
        Some(obj) => match obj.get("answer") {
            Some(Value::String(s)) => s.clone(),
            _ => return None,
        },
        None => content.to_string(),
    };
    let t = raw
        .trim()
        .trim_start_matches(['[', '('])
        .trim_end_matches([']', ')', '.', ':'])
        .trim();
    let mut chars = t.chars();
    let c = chars.next()?;
    if chars.next().is_some() || !c.is_ascii_alphabetic() {
        return None;
    }
    let i = (c.to_ascii_uppercase() as u8 - b'A') as usize;
    (i < n).then_some(i)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool(n: usize) -> Vec<PoolPassage> {
        (0..n)
            .map(|i| PoolPassage {
                id: format!("d{i}"),
                text: format!("text {i}"),
            })
            .collect()
    }

    #[test]
    fn answers_parse_and_invalid_letters_are_none() {
        assert_eq!(parse_answer("{\"answer\": \"B\"}", 5), Some(1));
        assert_eq!(parse_answer("```json\n{\"answer\":\"c\"}\n```", 5), Some(2));
        assert_eq!(parse_answer(" [D] ", 5), Some(3));
        assert_eq!(parse_answer("E.", 5), Some(4));
        assert_eq!(parse_answer("{\"answer\": \"F\"}", 5), None);
        assert_eq!(parse_answer("{\"answer\": \"AB\"}", 5), None);
        assert_eq!(parse_answer("{\"answer\": 1}", 5), None);
        assert_eq!(parse_answer("The answer is B", 5), None);
        assert_eq!(parse_answer("", 5), None);
        assert_eq!(parse_answer("7", 5), None);
    }

    #[test]
    fn distractors_are_distinct_and_exclude_the_pair() {
        for n in [3, 5, 40, 1000] {
            let p = pool(n);
            let mut rng = pair_rng(7, "q", "d1");
            let got = sample_distractors(&mut rng, &p, 4, "d1", &["text 2"]);
            let expected = 4.min(n - 2);
            assert_eq!(got.len(), expected, "pool {n}");
            let mut ids: Vec<&str> = got.iter().map(|d| d.id.as_str()).collect();
            assert!(!ids.contains(&"d1") && !ids.contains(&"d2"));
            ids.sort();
            ids.dedup();
            assert_eq!(ids.len(), expected);
        }
    }

    #[test]
    fn pair_randomness_depends_only_on_seed_and_ids() {
        let p = pool(500);
        let a: Vec<String> = sample_distractors(&mut pair_rng(1, "q1", "p1"), &p, 5, "", &[])
            .iter()
            .map(|d| d.id.clone())
            .collect();
        let b: Vec<String> = sample_distractors(&mut pair_rng(1, "q1", "p1"), &p, 5, "", &[])
            .iter()
            .map(|d| d.id.clone())
            .collect();
        let c: Vec<String> = sample_distractors(&mut pair_rng(2, "q1", "p1"), &p, 5, "", &[])
            .iter()
            .map(|d| d.id.clone())
            .collect();
        assert_eq!(a, b);
        assert_ne!(a, c);
        // The separator keeps ("q1", "p1") and ("q", "1p1") apart.
        assert_ne!(
            fnv1a(b"q1\0p1"),
            fnv1a(b"q\x001p1"),
            "separator must disambiguate"
        );
    }

    #[test]
    fn fnv1a_matches_published_vectors() {
        // Test vectors from the FNV reference (draft-eastlake-fnv): "" and "a".
        assert_eq!(fnv1a(b""), 0xcbf29ce484222325);
        assert_eq!(fnv1a(b"a"), 0xaf63dc4c8601ec8c);
        assert_eq!(fnv1a(b"foobar"), 0x85944171f73967e8);
    }

    #[test]
    fn shuffle_tracks_the_target_and_rendering_flattens_lines() {
        let opts = vec![
            JudgeOption {
                label: "document_positive".into(),
                text: "p\nplus".into(),
            },
            JudgeOption {
                label: "hard_negative_document_1".into(),
                text: "n1".into(),
            },
            JudgeOption {
                label: "hard_negative_document_2".into(),
                text: "n2".into(),
            },
        ];
        let mut rng = pair_rng(3, "a", "b");
        let (shuffled, at) = shuffle_options(&mut rng, opts, "hard_negative_document_1");
        assert_eq!(shuffled[at].text, "n1");
        let r = render_options(&shuffled);
        assert!(r.contains("p plus"));
        assert_eq!(r.matches('[').count(), 3);
        assert_eq!(letters_list(3), "A, B, C");
    }
}
