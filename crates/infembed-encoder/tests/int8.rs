//! int8 and bf16 inference (`Quantization::Int8`, `Quantization::Bf16`) against the same models
//! in f32: the tiny fixtures of every architecture, and the real all-MiniLM-L6-v2 on the
//! vendored MS MARCO passages and sentence-transformers' reference embeddings. The bound: every
//! int8 or bf16 embedding within cosine 0.99 of its f32 embedding (measured on MiniLM: at least
//! 0.998, docs/int8.md). Also: the reduced path really runs (its output differs from f32), a
//! text alone equals its row in a batch (activations are quantized per token), and each is
//! refused where it cannot run. bf16 runs where the processor has AVX512-BF16; elsewhere its
//! tests check the refusal instead (and say so).

mod common;

use burn::tensor::Device;
use common::*;
use infembed_encoder::{DualEncoder, EncoderConfig, Quantization, TextEncoder};

/// The embeddings of `texts` in f32 and with `quant` (the same loaded model, switched).
fn both(
    enc: &mut TextEncoder,
    texts: &[&str],
    quant: Quantization,
) -> (Vec<Vec<f32>>, Vec<Vec<f32>>) {
    enc.backbone.set_quantization(Quantization::None);
    let f32s = enc.encode_to_vecs(texts, 8).expect("f32");
    enc.backbone.set_quantization(quant);
    let reduced = enc.encode_to_vecs(texts, 8).expect("reduced precision");
    (f32s, reduced)
}

/// The error of loading the tiny BERT with `quant` on `device`, which must refuse it.
fn refusal(quant: Quantization, device: &Device) -> String {
    let config = EncoderConfig {
        quantize: quant,
        ..EncoderConfig::default()
    };
    let Err(err) = DualEncoder::from_dir(fixture("tiny-bert"), config, device) else {
        panic!("{quant} on {device:?} is refused");
    };
    err.to_string()
}

/// Whether this processor runs the bf16 kernels (AVX-512 F, BW, VL and BF16); when not,
/// checks that the dual encoder refuses bf16 with an error naming the feature.
fn bf16_runs_here() -> bool {
    if infembed_testkit::cpu_has_avx512_bf16() {
        return true;
    }
    let err = refusal(Quantization::Bf16, &device());
    assert!(err.contains("AVX512-BF16"), "{err}");
    eprintln!("this processor has no AVX512-BF16: bf16 refused as it should be ({err})");
    false
}

fn check_tiny(name: &str, quant: Quantization) {
    let dir = fixture(name);
    let mut enc = TextEncoder::from_dir(&dir, &device()).expect("load tiny model");
    let exp = read_json(&dir.join("expected.json"));
    let texts: Vec<&str> = exp["cases"]
        .as_array()
        .expect("cases")
        .iter()
        .map(|c| c["text"].as_str().expect("text"))
        .collect();
    let (f, q) = both(&mut enc, &texts, quant);
    let mut worst = 1f64;
    let mut moved = 0f32;
    for (a, b) in f.iter().zip(&q) {
        worst = worst.min(cosine(a, b));
        moved = moved.max(max_abs_diff(a, b));
    }
    eprintln!("{name}: {quant} vs f32 min cosine {worst:.6}, max abs diff {moved:e}");
    assert!(worst >= 0.99, "{name}: {quant} vs f32 cosine {worst}");
    assert!(
        moved > 0.0,
        "{name}: the {quant} path ran (its output differs from f32)"
    );
    // per-token activation scales: a text's embedding does not depend on its batch
    for (r, t) in texts.iter().enumerate() {
        let alone = enc.encode_to_vecs(&[t], 8).expect("int8 alone");
        let diff = max_abs_diff(&alone[0], &q[r]);
        assert!(diff <= 1e-5, "{name}: text {r} alone vs in a batch: {diff}");
    }
}

#[test]
fn tiny_bert_int8_tracks_f32() {
    check_tiny("tiny-bert", Quantization::Int8);
}

#[test]
fn tiny_modernbert_int8_tracks_f32() {
    check_tiny("tiny-modernbert", Quantization::Int8);
}

#[test]
fn tiny_qwen2_int8_tracks_f32() {
    check_tiny("tiny-qwen2", Quantization::Int8);
}

#[test]
fn tiny_llama_int8_tracks_f32() {
    check_tiny("tiny-llama", Quantization::Int8);
}

#[test]
fn tiny_models_bf16_track_f32() {
    if bf16_runs_here() {
        for name in ["tiny-bert", "tiny-modernbert", "tiny-qwen2", "tiny-llama"] {
            check_tiny(name, Quantization::Bf16);
        }
    }
}

/// The passages of the vendored MS MARCO subset, "{title} {text}" as `infembed embed` reads
/// them.
fn msmarco_passages(n: usize) -> Vec<String> {
    let path = workspace_root().join("data/msmarco-subset/corpus.jsonl");
    let text = std::fs::read_to_string(&path).expect("data/msmarco-subset/corpus.jsonl");
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .take(n)
        .map(|l| {
            let o: serde_json::Value = serde_json::from_str(l).expect("JSON line");
            let title = o["title"].as_str().unwrap_or("").trim().to_string();
            let body = o["text"].as_str().expect("text");
            if title.is_empty() {
                body.to_string()
            } else {
                format!("{title} {body}")
            }
        })
        .collect()
}

fn check_minilm(test: &str, quant: Quantization) {
    let Some(dir) = minilm_dir(test) else {
        return;
    };
    let mut enc = TextEncoder::from_dir(&dir, &device()).expect("load MiniLM");
    let passages = msmarco_passages(300);
    let texts: Vec<&str> = passages.iter().map(String::as_str).collect();
    let (f, q) = both(&mut enc, &texts, quant);
    let mut cos: Vec<f64> = f.iter().zip(&q).map(|(a, b)| cosine(a, b)).collect();
    cos.sort_by(f64::total_cmp);
    eprintln!(
        "MiniLM {quant} vs f32 on {} passages: min cosine {:.5}, median {:.5}",
        cos.len(),
        cos[0],
        cos[cos.len() / 2]
    );
    assert!(cos[0] >= 0.99, "min cosine {}", cos[0]);
    assert!(cos[cos.len() - 1] < 1.0 - 1e-7, "the {quant} path ran");

    // and against sentence-transformers' own (f32) embeddings of the reference texts
    let cases = read_json(&fixture("minilm-reference/cases.json"));
    let cases = cases["cases"].as_array().expect("cases");
    let texts: Vec<&str> = cases.iter().map(|c| c["text"].as_str().unwrap()).collect();
    let got = enc.encode_to_vecs(&texts, 8).expect("reduced precision");
    for (c, g) in cases.iter().zip(&got) {
        let c = cosine(g, &f32s(&c["embedding"]));
        assert!(c >= 0.99, "{quant} vs sentence-transformers: cosine {c}");
    }
}

#[test]
fn minilm_int8_within_cosine_099_of_f32() {
    check_minilm("minilm_int8_within_cosine_099_of_f32", Quantization::Int8);
}

#[test]
fn minilm_bf16_within_cosine_099_of_f32() {
    if bf16_runs_here() {
        check_minilm("minilm_bf16_within_cosine_099_of_f32", Quantization::Bf16);
    }
}

#[test]
fn dual_encoder_takes_int8_from_its_config_and_refuses_it_off_the_cpu() {
    let dir = fixture("tiny-bert");
    let config = EncoderConfig {
        quantize: Quantization::Int8,
        ..EncoderConfig::default()
    };
    let int8 = DualEncoder::from_dir(&dir, config, &device()).expect("int8 on the CPU");
    assert_eq!(int8.config().quantize, Quantization::Int8);
    let mut f32 = DualEncoder::from_dir(&dir, EncoderConfig::default(), &device()).expect("f32");
    let texts = [
        "a passage about rivers",
        "another one, about markets and energy",
    ];
    let a = rows(int8.encode_passages(&texts).expect("int8").embeddings);
    let b = rows(f32.encode_passages(&texts).expect("f32").embeddings);
    assert!(max_abs_diff(&a[0], &b[0]) > 0.0, "int8 from the config ran");
    f32.set_quantization(Quantization::Int8)
        .expect("switch to int8");
    assert_eq!(f32.config().quantize, Quantization::Int8);
    let c = rows(f32.encode_passages(&texts).expect("int8").embeddings);
    assert_eq!(
        a, c,
        "int8 from the config = int8 switched on after loading"
    );

    // an autodiff device (training) has no int8 or bf16 kernels: a typed error, not a silent
    // f32
    let autodiff = Device::flex().autodiff();
    let err = refusal(Quantization::Int8, &autodiff);
    assert!(err.contains("int8"), "{err}");
    let err = refusal(Quantization::Bf16, &autodiff);
    assert!(err.contains("bf16"), "{err}");
    // and the config's serde names
    let json = serde_json::to_value(EncoderConfig {
        quantize: Quantization::Int8,
        ..EncoderConfig::default()
    })
    .expect("serialize");
    assert_eq!(json["quantize"], "int8");
    let none = serde_json::to_value(EncoderConfig::default()).expect("serialize");
    assert!(
        none.get("quantize").is_none(),
        "f32 configs stay as they were"
    );
}
