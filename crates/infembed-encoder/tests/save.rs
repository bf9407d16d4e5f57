//! Saving back to Hugging Face / sentence-transformers directories: round trips give
//! identical embeddings, keys keep their original names, and modified weights are what
//! gets saved.

mod common;

use burn::module::{Module, ModuleMapper, Param};
use burn::prelude::*;
use common::*;
use infembed_encoder::safetensors_keys;
use infembed_encoder::{
    CrossAttentionConfig, CrossAttentionKind, DualEncoder, EncoderConfig, Interaction, TextEncoder,
    Towers,
};

const TEXTS: [&str; 4] = [
    "the cat sat on the mat",
    "x",
    "find documents about the ocean",
    "a dog",
];

/// Adds a deterministic perturbation to every float parameter (a "fine-tuning" stand-in).
struct Nudge;
impl ModuleMapper for Nudge {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<D>>) -> Param<Tensor<D>> {
        param.map(|t| {
            let shape = t.shape();
            let n = shape.num_elements();
            let bump: Vec<f32> = (0..n).map(|i| ((i % 7) as f32 - 3.0) * 1e-3).collect();
            let bump =
                Tensor::<1>::from_data(TensorData::new(bump, [n]), &t.device()).reshape(shape);
            t + bump
        })
    }
}

fn assert_same(a: &[Vec<f32>], b: &[Vec<f32>], what: &str) {
    for (r, (x, y)) in a.iter().zip(b).enumerate() {
        let d = max_abs_diff(x, y);
        assert!(d <= 1e-6, "{what}: row {r} differs by {d}");
    }
}

#[test]
fn text_encoder_round_trip_keeps_embeddings_and_key_names() {
    let src = fixture("tiny-bert");
    let mut enc = TextEncoder::from_dir(&src, &device()).unwrap();
    let before_nudge = rows(enc.encode(&TEXTS).unwrap().embeddings);
    enc.backbone = enc.backbone.clone().map(&mut Nudge);
    let tuned = rows(enc.encode(&TEXTS).unwrap().embeddings);
    assert!(
        max_abs_diff(&tuned[0], &before_nudge[0]) > 1e-4,
        "the nudge changes the model"
    );

    let out = tempfile::tempdir().unwrap();
    enc.save(out.path()).unwrap();
    let back = TextEncoder::from_dir(out.path(), &device()).unwrap();
    assert_eq!(back.pooling, enc.pooling);
    assert_eq!(back.normalize, enc.normalize);
    assert_eq!(back.max_length, enc.max_length);
    assert_same(
        &rows(back.encode(&TEXTS).unwrap().embeddings),
        &tuned,
        "tiny-bert round trip",
    );

    let mut want = safetensors_keys(&src.join("model.safetensors")).unwrap();
    want.retain(|k| k != "embeddings.position_ids");
    want.sort();
    let mut got = safetensors_keys(&out.path().join("model.safetensors")).unwrap();
    got.sort();
    assert_eq!(got, want, "original Hugging Face key names");
}

#[test]
fn minilm_round_trip() {
    let Some(dir) = minilm_dir("minilm_round_trip") else {
        return;
    };
    let enc = TextEncoder::from_dir(&dir, &device()).unwrap();
    let out = tempfile::tempdir().unwrap();
    enc.save(out.path()).unwrap();
    let back = TextEncoder::from_dir(out.path(), &device()).unwrap();
    assert_same(
        &rows(back.encode(&TEXTS).unwrap().embeddings),
        &rows(enc.encode(&TEXTS).unwrap().embeddings),
        "MiniLM round trip",
    );
}

#[test]
fn dual_encoder_round_trip_with_separate_towers_and_cross_weights() {
    let src = fixture("tiny-bert");
    let cfg = EncoderConfig {
        towers: Towers::Separate,
        interaction: Interaction::CrossAttention(CrossAttentionConfig {
            kind: CrossAttentionKind::Token,
            learnable: true,
        }),
        query_max_length: Some(12),
        passage_max_length: Some(16),
        ..EncoderConfig::default()
    };
    let mut enc = DualEncoder::from_dir(&src, cfg, &device()).unwrap();
    // Train the towers apart (different nudges) and the cross weights.
    let model = enc.model_mut();
    model.passage_tower = model.passage_tower.take().map(|p| p.map(&mut Nudge));
    model.cross = model.cross.take().map(|c| c.map(&mut Nudge));
    let pairs = [("find news", "cats"), ("ships", "ocean")];
    let q = rows(enc.encode_queries(&pairs).unwrap().embeddings);
    let p = rows(enc.encode_passages(&TEXTS).unwrap().embeddings);

    let out = tempfile::tempdir().unwrap();
    enc.save(out.path()).unwrap();
    assert!(out.path().join("passage_tower/model.safetensors").exists());
    let back = DualEncoder::load_saved(out.path(), &device()).unwrap();
    assert_eq!(back.config().towers, Towers::Separate);
    assert_eq!(back.config().query_max_length, Some(12));
    assert_same(
        &rows(back.encode_queries(&pairs).unwrap().embeddings),
        &q,
        "queries",
    );
    assert_same(
        &rows(back.encode_passages(&TEXTS).unwrap().embeddings),
        &p,
        "passages",
    );
    let mut keys = safetensors_keys(&out.path().join("interaction.safetensors")).unwrap();
    keys.sort();
    assert_eq!(keys, ["w_i.weight", "w_q1.weight", "w_q2.weight"]);
}
