//! Architecture parity on TINY random models made with Python transformers
//! (scripts/encoder/make_fixtures.py: BERT, ModernBERT, Qwen2, Llama): token ids, last-layer
//! hidden states and pooled embeddings must match to 1e-4, on the CPU and on a wgpu device.

mod common;

use common::*;
use infembed_encoder::TextEncoder;

/// Checks a tiny fixture directory: ids, hidden states of real tokens, pooled and
/// normalized embeddings, and sentence-transformers' own output when recorded. Returns the
/// largest difference from transformers seen (hidden states, pooled, embeddings).
pub fn check_fixture(name: &str) -> f32 {
    check_fixture_on(name, &device())
}

/// [`check_fixture`] on `device`.
pub fn check_fixture_on(name: &str, device: &burn::tensor::Device) -> f32 {
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
        worst = worst.max(dp).max(dn);
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
        // A checkpoint that sentence-transformers runs in bf16 (its own dtype) is a bf16
        // reference: 2e-2 of the (unit) embedding.
        let bf16 = exp["sentence_transformers_dtype"] == "bfloat16";
        let tol = if bf16 { 2e-2 } else { 1e-4 };
        for (r, e) in st.iter().enumerate() {
            let ds = max_abs_diff(&normed[r], &f32s(e));
            assert!(
                ds <= tol,
                "{name}: sentence-transformers row {r} differs by {ds}"
            );
            if bf16 {
                // Not the f32 result by accident: bf16 arithmetic shows.
                assert!(ds > 1e-5, "{name}: the bf16 reference equals f32 ({ds})");
            }
        }
    }
    worst
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

/// A batch large enough to be tokenized on several threads (a corpus shard) gives every row
/// transformers' ids in input order, and counts each cut text once.
#[test]
fn large_batches_tokenize_as_transformers_in_input_order() {
    for name in ["tiny-bert", "tiny-modernbert", "tiny-qwen2", "tiny-llama"] {
        let dir = fixture(name);
        let exp = read_json(&dir.join("expected.json"));
        let enc = TextEncoder::from_dir(&dir, &device()).expect("load tiny model");
        let cases = exp["cases"].as_array().unwrap();
        let texts: Vec<&str> = cases.iter().map(|c| c["text"].as_str().unwrap()).collect();
        // One text at a time: which of them are cut.
        let cut: Vec<usize> = texts
            .iter()
            .map(|t| {
                enc.tokenizer
                    .tokenize(&[t], enc.max_length)
                    .unwrap()
                    .truncated
            })
            .collect();
        // 500 texts drawn in a scrambled order (a small LCG), so that a row put at the
        // wrong position shows.
        let mut state = 12345u64;
        let picks: Vec<usize> = (0..500)
            .map(|_| {
                state = state
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                (state >> 33) as usize % texts.len()
            })
            .collect();
        let many: Vec<&str> = picks.iter().map(|&i| texts[i]).collect();
        let batch = enc.tokenizer.tokenize(&many, enc.max_length).unwrap();
        assert_eq!(batch.ids.len(), many.len());
        for (k, &i) in picks.iter().enumerate() {
            assert_eq!(
                batch.ids[k],
                u32s(&cases[i]["input_ids"]),
                "{name}: row {k}"
            );
            assert_eq!(
                batch.type_ids[k].len(),
                batch.ids[k].len(),
                "{name}: row {k}"
            );
        }
        let want: usize = picks.iter().map(|&i| cut[i]).sum();
        assert!(want > 0, "{name}: the long text is among the picks");
        assert_eq!(batch.truncated, want, "{name}: texts cut");
    }
}

/// Qwen2 as the larger checkpoints ship: bf16 weights in two shards listed by
/// `model.safetensors.index.json`. Cast to f32 on load, it computes what transformers
/// computes in f32 from the same bf16 weights.
#[test]
fn bf16_sharded_qwen2_matches_transformers() {
    let dir = fixture("tiny-qwen2-bf16-sharded");
    assert!(!dir.join("model.safetensors").exists());
    assert!(dir.join("model.safetensors.index.json").exists());
    let worst = check_fixture("tiny-qwen2-bf16-sharded");
    assert!(worst <= 1e-5, "bf16 sharded Qwen2 differs by {worst}");
}

/// Llama 3's rotary scaling (`rope_type: llama3`, original context 8 < the 16 positions of
/// the inputs): equal to transformers, and different from the same weights without it.
#[test]
fn llama3_rope_scaling_matches_transformers() {
    let worst = check_fixture("tiny-llama-rope-llama3");
    assert!(worst <= 1e-5, "llama3-scaled Llama differs by {worst}");

    // The same checkpoint with the scaling removed embeds differently: the test above
    // would fail if the scaling were ignored.
    let src = fixture("tiny-llama-rope-llama3");
    let tmp = tempfile::tempdir().unwrap();
    copy_dir(&src, tmp.path());
    let cfg_path = tmp.path().join("config.json");
    let mut cfg = read_json(&cfg_path);
    cfg["rope_parameters"] = serde_json::json!({"rope_type": "default", "rope_theta": 500000.0});
    std::fs::write(&cfg_path, cfg.to_string()).unwrap();
    let plain = TextEncoder::from_dir(tmp.path(), &device()).unwrap();
    let scaled = TextEncoder::from_dir(&src, &device()).unwrap();
    let text = ["retrieval models follow instructions when the query asks for recent news"];
    let a = rows(plain.encode(&text).unwrap().embeddings);
    let b = rows(scaled.encode(&text).unwrap().embeddings);
    let d = max_abs_diff(&a[0], &b[0]);
    assert!(
        d > 1e-3,
        "without the scaling the embedding moves by only {d}"
    );

    // The older spelling (`rope_scaling` beside a top-level `rope_theta`, as Llama 3.2's
    // published config.json has it) is the same model.
    let mut cfg = read_json(&src.join("config.json"));
    let rope = cfg["rope_parameters"].clone();
    cfg.as_object_mut().unwrap().remove("rope_parameters");
    cfg["rope_theta"] = rope["rope_theta"].clone();
    cfg["rope_scaling"] = rope;
    std::fs::write(&cfg_path, cfg.to_string()).unwrap();
    let old = TextEncoder::from_dir(tmp.path(), &device()).unwrap();
    let c = rows(old.encode(&text).unwrap().embeddings);
    assert_eq!(c, b, "rope_scaling and rope_parameters give the same model");
}

/// The four architectures on wgpu meet the same references (and so the CPU's output).
#[test]
fn tiny_models_on_wgpu_match_transformers() {
    let Some(gpu) = wgpu_device("tiny_models_on_wgpu_match_transformers") else {
        return;
    };
    for name in [
        "tiny-bert",
        "tiny-modernbert",
        "tiny-qwen2",
        "tiny-llama",
        "tiny-qwen2-bf16-sharded",
        "tiny-llama-rope-llama3",
    ] {
        check_fixture_on(name, &gpu);
    }
}
