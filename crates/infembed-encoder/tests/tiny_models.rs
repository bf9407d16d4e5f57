//! Architecture parity on TINY random models made with Python transformers
//! (scripts/encoder/make_fixtures.py: BERT, ModernBERT, Qwen2, Llama): token ids, last-layer
//! hidden states and pooled embeddings must match to 1e-4, on the CPU and on a wgpu device.

mod common;

use common::*;
use infembed_encoder::TextEncoder;

/// Checks a tiny fixture directory: ids, hidden states of real tokens, pooled and
/// normalized embeddings, and sentence-transformers' own output when recorded.
pub fn check_fixture(name: &str) {
    check_fixture_on(name, &device());
}

/// [`check_fixture`] on `device`.
pub fn check_fixture_on(name: &str, device: &burn::tensor::Device) {
    let dir = fixture(name);
    let exp = read_json(&dir.join("expected.json"));
    let mut enc = TextEncoder::from_dir(&dir, device).expect("load tiny model");
    assert_eq!(
        enc.max_length as u64,
        exp["max_seq_length"].as_u64().unwrap()
    );
    let cases = exp["cases"].as_array().unwrap();
    let texts: Vec<&str> = cases.iter().map(|c| c["text"].as_str().unwrap()).collect();

    let tokens = enc.tokenizer.tokenize(&texts, enc.max_length).unwrap();
    for (c, ids) in cases.iter().zip(&tokens.ids) {
        assert_eq!(
            ids,
            &u32s(&c["input_ids"]),
            "{name}: ids of {:?}",
            c["text"]
        );
    }
    assert!(tokens.truncated >= 1, "{name}: the long text is truncated");

    // Hidden states of the real tokens in a padded batch.
    let states = enc.token_states(&texts).unwrap();
    let [b, l, d] = states.hidden.dims();
    let h = states.hidden.into_data().try_into_vec::<f32>().unwrap();
    let left = enc.tokenizer.pads_left();
    let mut worst = 0f32;
    for (r, c) in cases.iter().enumerate() {
        let want = c["hidden"].as_array().unwrap();
        let n = want.len();
        let start = if left { l - n } else { 0 };
        for (j, w) in want.iter().enumerate() {
            let at = (r * l + start + j) * d;
            worst = worst.max(max_abs_diff(&h[at..at + d], &f32s(w)));
        }
    }
    assert_eq!(b, cases.len());
    eprintln!("{name}: hidden states max abs diff {worst:e}");
    assert!(worst <= 1e-4, "{name}: hidden states differ by {worst}");

    enc.normalize = false;
    let pooled = rows(enc.encode(&texts).unwrap().embeddings);
    enc.normalize = true;
    let normed = rows(enc.encode(&texts).unwrap().embeddings);
    for (r, c) in cases.iter().enumerate() {
        let dp = max_abs_diff(&pooled[r], &f32s(&c["pooled"]));
        let dn = max_abs_diff(&normed[r], &f32s(&c["embedding"]));
        assert!(dp <= 1e-4, "{name}: pooled row {r} differs by {dp}");
        assert!(dn <= 1e-4, "{name}: embedding row {r} differs by {dn}");
    }
    // Padding invariance: each text alone (no padding at all) equals its row in the batch.
    for (r, t) in texts.iter().enumerate() {
        let alone = rows(enc.encode(&[t]).unwrap().embeddings);
        let diff = max_abs_diff(&alone[0], &normed[r]);
        assert!(
            diff <= 1e-5,
            "{name}: text {r} alone vs in a padded batch: {diff}"
        );
    }
    if let Some(st) = exp["sentence_transformers_embeddings"].as_array() {
        for (r, e) in st.iter().enumerate() {
            let ds = max_abs_diff(&normed[r], &f32s(e));
            assert!(
                ds <= 1e-4,
                "{name}: sentence-transformers row {r} differs by {ds}"
            );
        }
    }
}

#[test]
fn tiny_bert_matches_transformers() {
    check_fixture("tiny-bert");
}

#[test]
fn tiny_modernbert_matches_transformers() {
    check_fixture("tiny-modernbert");
}

#[test]
fn tiny_qwen2_matches_transformers() {
    check_fixture("tiny-qwen2");
}

#[test]
fn tiny_llama_matches_transformers() {
    check_fixture("tiny-llama");
}

/// The four architectures on wgpu meet the same references (and so the CPU's output).
#[test]
fn tiny_models_on_wgpu_match_transformers() {
    let Some(gpu) = wgpu_device("tiny_models_on_wgpu_match_transformers") else {
        return;
    };
    for name in ["tiny-bert", "tiny-modernbert", "tiny-qwen2", "tiny-llama"] {
        check_fixture_on(name, &gpu);
    }
}
