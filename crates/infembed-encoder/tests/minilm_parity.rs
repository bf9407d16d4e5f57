//! Parity of the BERT backbone with sentence-transformers on the real all-MiniLM-L6-v2
//! (reference embeddings vendored in tests/fixtures/minilm-reference/cases.json), and
//! padding / batch-order invariance. Skips loudly when the model is not fetched.

mod common;

use common::*;
use infembed_encoder::{Pooling, TextEncoder};

#[test]
fn minilm_matches_sentence_transformers() {
    let Some(dir) = minilm_dir("minilm_matches_sentence_transformers") else {
        return;
    };
    let enc = TextEncoder::from_dir(&dir, &device()).expect("load MiniLM");
    assert_eq!(enc.pooling, Pooling::Mean, "from 1_Pooling/config.json");
    assert!(enc.normalize, "modules.json lists Normalize");
    assert_eq!(enc.max_length, 256, "from sentence_bert_config.json");

    let cases = read_json(&fixture("minilm-reference/cases.json"));
    let cases = cases["cases"].as_array().expect("cases");
    assert!(cases.len() >= 20);
    let texts: Vec<&str> = cases.iter().map(|c| c["text"].as_str().unwrap()).collect();

    // Token ids identical to the Python tokenizer (truncation at 256 included).
    let tokens = enc.tokenizer.tokenize(&texts, enc.max_length).unwrap();
    for (c, ids) in cases.iter().zip(&tokens.ids) {
        assert_eq!(ids, &u32s(&c["input_ids"]), "token ids of {:?}", c["text"]);
    }
    assert_eq!(
        tokens.truncated, 1,
        "exactly one reference text exceeds 256 tokens"
    );

    let got = enc.encode_to_vecs(&texts, 8).unwrap();
    let mut worst = 0f32;
    let mut worst_cos = 1f64;
    for (c, g) in cases.iter().zip(&got) {
        let want = f32s(&c["embedding"]);
        worst = worst.max(max_abs_diff(g, &want));
        worst_cos = worst_cos.min(cosine(g, &want));
    }
    eprintln!("MiniLM parity: max abs diff {worst:e}, min cosine {worst_cos:.9}");
    assert!(worst <= 1e-5, "max abs diff {worst}");
    assert!(worst_cos >= 0.99999, "min cosine {worst_cos}");
    assert!(enc.truncated_total() >= 1, "truncation is counted");
}

#[test]
fn minilm_padding_and_order_invariance() {
    let Some(dir) = minilm_dir("minilm_padding_and_order_invariance") else {
        return;
    };
    let enc = TextEncoder::from_dir(&dir, &device()).expect("load MiniLM");
    let texts = [
        "a",
        "what is the capital of france",
        "The pituitary gland also controls ovulation and the menstrual cycle in women, and \
         the posterior lobe releases antidiuretic hormone which helps control water balance.",
        "short query",
        "ships",
    ];
    let batch = rows(enc.encode(&texts).unwrap().embeddings);
    for (i, t) in texts.iter().enumerate() {
        let alone = rows(enc.encode(&[t]).unwrap().embeddings);
        let diff = max_abs_diff(&alone[0], &batch[i]);
        assert!(diff <= 1e-5, "text {i} alone vs in a padded batch: {diff}");
    }
    let perm = [3usize, 0, 4, 2, 1];
    let shuffled: Vec<&str> = perm.iter().map(|&i| texts[i]).collect();
    let sb = rows(enc.encode(&shuffled).unwrap().embeddings);
    for (k, &i) in perm.iter().enumerate() {
        let diff = max_abs_diff(&sb[k], &batch[i]);
        assert!(diff <= 1e-5, "row {i} changes with batch order: {diff}");
    }
}
