//! The dual encoder's batch API on the tiny BERT fixture, checked against independent
//! paths (single-text encodes through `TextEncoder`, host-side combinations).

mod common;

use common::*;
use infembed_encoder::{
    BatchRow, CrossAttentionConfig, CrossAttentionKind, DualEncoder, EncoderConfig, Interaction,
    QueryTemplate, TextEncoder, Towers,
};

const ROWS: [(&str, &str, &str); 4] = [
    ("find recent news", "cat food", "the cat sat on the mat"),
    ("documents about ships", "ocean", "ships on the ocean"),
    ("find recent news", "dog", "a dog"),
    ("be brief", "cat food", "the cat sat on the mat"),
];

fn batch() -> Vec<BatchRow<'static>> {
    ROWS.iter()
        .map(|&(instruction, query, passage)| BatchRow {
            instruction,
            query,
            passage,
        })
        .collect()
}

/// The fixture's hidden size, read through the single-text encoder.
fn fixture_dim(dir: &std::path::Path) -> usize {
    TextEncoder::from_dir(dir, &device()).unwrap().dim()
}

/// Every other row for each of `n` rows, in increasing order (what the trainer gives
/// Interaction II).
fn all_others(n: usize) -> Vec<Vec<usize>> {
    (0..n)
        .map(|i| (0..n).filter(|&j| j != i).collect())
        .collect()
}

fn single(enc: &TextEncoder, text: &str) -> Vec<f32> {
    rows(enc.encode(&[text]).unwrap().embeddings).remove(0)
}

#[test]
fn interaction_one_batch_matches_single_encodes() {
    let dir = fixture("tiny-bert");
    let reference = TextEncoder::from_dir(&dir, &device()).unwrap();
    let cfg = EncoderConfig {
        interaction: Interaction::SelfAttention {
            template: QueryTemplate::new("{instruction} | {query}").unwrap(),
            instruction_negatives: Some(2),
        },
        query_max_length: Some(16),
        passage_max_length: Some(16),
        ..EncoderConfig::default()
    };
    let enc = DualEncoder::from_dir(&dir, cfg, &device()).unwrap();
    let others = vec![vec![1, 2], vec![0, 3], vec![0, 1], vec![2, 0]];
    let out = enc.encode_batch(&batch(), &others).unwrap();
    let dim = reference.dim();
    assert_eq!(out.p.dims(), [4, dim]);
    assert_eq!(out.iq.dims(), [4, dim]);
    assert_eq!(out.iq_instr.dims(), [4, 2, dim]);
    let p = rows(out.p);
    let iq = rows(out.iq);
    let [n, k, d] = out.iq_instr.dims();
    let iqi = out.iq_instr.reshape([n * k, d]);
    let iqi = rows(iqi);
    for (i, &(instr, query, passage)) in ROWS.iter().enumerate() {
        assert!(
            max_abs_diff(&p[i], &single(&reference, passage)) < 1e-5,
            "p row {i}"
        );
        let own = single(&reference, &format!("{instr} | {query}"));
        assert!(max_abs_diff(&iq[i], &own) < 1e-5, "iq row {i}");
        for (slot, &j) in others[i].iter().enumerate() {
            let text = format!("{} | {query}", ROWS[j].0);
            let want = single(&reference, &text);
            assert!(
                max_abs_diff(&iqi[i * k + slot], &want) < 1e-5,
                "iq_instr {i},{slot}"
            );
        }
    }
    // Distinct texts: 3 passages + distinct rendered strings among the 12 combinations.
    let mut rendered: Vec<String> = Vec::new();
    for (i, list) in others.iter().enumerate() {
        rendered.push(format!("{} | {}", ROWS[i].0, ROWS[i].1));
        for &j in list {
            rendered.push(format!("{} | {}", ROWS[j].0, ROWS[i].1));
        }
    }
    rendered.sort();
    rendered.dedup();
    assert_eq!(out.texts_encoded, 3 + rendered.len());
    assert!(rendered.len() < 12, "the fixture has repeated combinations");
}

#[test]
fn interaction_two_token_batch_matches_separate_encodes() {
    let dir = fixture("tiny-bert");
    let cfg = EncoderConfig {
        interaction: Interaction::CrossAttention(CrossAttentionConfig {
            kind: CrossAttentionKind::Token,
            learnable: false,
        }),
        query_max_length: Some(16),
        passage_max_length: Some(16),
        ..EncoderConfig::default()
    };
    let enc = DualEncoder::from_dir(&dir, cfg, &device()).unwrap();
    let out = enc.encode_batch(&batch(), &all_others(4)).unwrap();
    assert_eq!(out.iq_instr.dims(), [4, 3, fixture_dim(&dir)]);
    assert_eq!(out.instruction_rows, all_others(4));
    // Each pair alone (no batch padding at all) must give the same vector.
    let iq = rows(out.iq);
    let [n, k, d] = out.iq_instr.dims();
    let iqi = rows(out.iq_instr.reshape([n * k, d]));
    for i in 0..4 {
        let alone = rows(
            enc.encode_queries(&[(ROWS[i].0, ROWS[i].1)])
                .unwrap()
                .embeddings,
        );
        assert!(max_abs_diff(&iq[i], &alone[0]) < 1e-5, "iq row {i}");
        for (slot, &j) in out.instruction_rows[i].iter().enumerate() {
            let alone = rows(
                enc.encode_queries(&[(ROWS[j].0, ROWS[i].1)])
                    .unwrap()
                    .embeddings,
            );
            assert!(
                max_abs_diff(&iqi[i * k + slot], &alone[0]) < 1e-5,
                "iq_instr {i},{slot}"
            );
        }
    }
    // 3 passages + 3 instructions + 3 queries.
    assert_eq!(out.texts_encoded, 9);
}

#[test]
fn interaction_two_vector_learnable_and_separate_towers() {
    let dir = fixture("tiny-bert");
    let cfg = EncoderConfig {
        towers: Towers::Separate,
        interaction: Interaction::CrossAttention(CrossAttentionConfig {
            kind: CrossAttentionKind::Vector,
            learnable: true,
        }),
        query_max_length: Some(16),
        passage_max_length: Some(16),
        ..EncoderConfig::default()
    };
    let enc = DualEncoder::from_dir(&dir, cfg, &device()).unwrap();
    assert!(enc.model().passage_tower.is_some() && enc.model().cross.is_some());
    let shared = DualEncoder::from_dir(&dir, EncoderConfig::default(), &device()).unwrap();
    use burn::module::Module;
    let tower_params = shared.model().num_params();
    let dim = fixture_dim(&dir);
    assert_eq!(enc.model().num_params(), 2 * tower_params + 3 * dim * dim);
    // Both towers start from the checkpoint: same passage embeddings as a shared encoder.
    let a = rows(
        enc.encode_passages(&["ships on the ocean", "x"])
            .unwrap()
            .embeddings,
    );
    let b = rows(
        shared
            .encode_passages(&["ships on the ocean", "x"])
            .unwrap()
            .embeddings,
    );
    assert!(max_abs_diff(&a[0], &b[0]) < 1e-6 && max_abs_diff(&a[1], &b[1]) < 1e-6);
    let out = enc.encode_batch(&batch(), &all_others(4)).unwrap();
    assert_eq!(out.iq_instr.dims(), [4, 3, dim]);
    // Rows are unit vectors.
    for r in rows(out.iq) {
        let n: f32 = r.iter().map(|x| x * x).sum::<f32>().sqrt();
        assert!((n - 1.0).abs() < 1e-5);
    }
}

#[test]
fn prefixes_are_applied() {
    let dir = fixture("tiny-bert");
    let reference = TextEncoder::from_dir(&dir, &device()).unwrap();
    let cfg = EncoderConfig {
        query_prefix: "query: ".into(),
        passage_prefix: "passage: ".into(),
        instruction_prefix: "find ".into(),
        query_max_length: Some(16),
        passage_max_length: Some(16),
        ..EncoderConfig::default()
    };
    let enc = DualEncoder::from_dir(&dir, cfg, &device()).unwrap();
    let p = rows(enc.encode_passages(&["a dog"]).unwrap().embeddings);
    assert!(max_abs_diff(&p[0], &single(&reference, "passage: a dog")) < 1e-5);
    let q = rows(enc.encode_queries(&[("news", "cats")]).unwrap().embeddings);
    // Default template, query first: prefix + "{query} {instruction}".
    assert!(max_abs_diff(&q[0], &single(&reference, "query: cats find news")) < 1e-5);
}

#[test]
fn encoder_config_rejects_unknown_fields_and_zero_lengths() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("enc.json");
    std::fs::write(&path, "{\n  \"query_max_lenght\": 10\n}").unwrap();
    let msg = EncoderConfig::from_file(&path).unwrap_err().to_string();
    assert!(msg.contains("enc.json"), "{msg}");
    std::fs::write(&path, r#"{"passage_max_length": 0}"#).unwrap();
    let msg = EncoderConfig::from_file(&path).unwrap_err().to_string();
    assert!(msg.contains("passage_max_length"), "{msg}");
    std::fs::write(
        &path,
        r#"{"interaction": {"type": "cross_attention", "kind": "vector", "learnable": true}, "towers": "separate"}"#,
    )
    .unwrap();
    let cfg = EncoderConfig::from_file(&path).unwrap();
    assert_eq!(cfg.towers, Towers::Separate);
    assert_eq!(
        cfg.interaction,
        Interaction::CrossAttention(CrossAttentionConfig {
            kind: CrossAttentionKind::Vector,
            learnable: true
        })
    );
}

#[test]
fn encoder_config_reads_templates_in_both_spellings() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("enc.json");
    let read = |template: &str| {
        let json = serde_json::json!({
            "interaction": {"type": "self_attention", "template": template}
        });
        std::fs::write(&path, json.to_string()).unwrap();
        EncoderConfig::from_file(&path)
    };
    for (text, want) in [
        ("{query} {instruction}", "what is rust be brief"),
        ("{Q} {I}", "what is rust be brief"),
        (
            "Instruct: {I}\nQuery: {query}",
            "Instruct: be brief\nQuery: what is rust",
        ),
    ] {
        let cfg = read(text).unwrap();
        let Interaction::SelfAttention { template, .. } = &cfg.interaction else {
            panic!("{text}: not Interaction I");
        };
        assert_eq!(template.as_str(), text);
        assert_eq!(template.render("what is rust", Some("be brief")), want);
        // Written back as read.
        let back = serde_json::to_value(&cfg).unwrap();
        assert_eq!(back["interaction"]["template"], text);
    }
    // No instruction placeholder: parsed, then refused by the encoder's validation, naming
    // the field; a stray brace is a parse error.
    let msg = read("{query}").unwrap_err().to_string();
    assert!(msg.contains("interaction.template"), "{msg}");
    let msg = read("{query} {instr}").unwrap_err().to_string();
    assert!(msg.contains("enc.json"), "{msg}");
    // The default serializes as the reference's template.
    let json = serde_json::to_value(EncoderConfig::default()).unwrap();
    assert_eq!(json["interaction"]["template"], "{query} {instruction}");
}

/// The alias spelling gives the same embeddings as the canonical one.
#[test]
fn alias_templates_encode_like_canonical_ones() {
    let dir = fixture("tiny-bert");
    let with = |template: &str| {
        let cfg = EncoderConfig {
            interaction: Interaction::SelfAttention {
                template: QueryTemplate::new(template).unwrap(),
                instruction_negatives: None,
            },
            query_max_length: Some(16),
            passage_max_length: Some(16),
            ..EncoderConfig::default()
        };
        let enc = DualEncoder::from_dir(&dir, cfg, &device()).unwrap();
        rows(
            enc.encode_queries(&[("find news", "cats"), ("", "dogs")])
                .unwrap()
                .embeddings,
        )
    };
    assert_eq!(with("{I}: {Q}"), with("{instruction}: {query}"));
}

/// A saved encoder's `infembed_encoder.json` keeps the template as written, and loading it
/// gives the same query embeddings.
#[test]
fn saved_encoder_keeps_its_template() {
    let dir = fixture("tiny-bert");
    let text = "Instruct: {I}\nQuery: {query}";
    let cfg = EncoderConfig {
        interaction: Interaction::SelfAttention {
            template: QueryTemplate::new(text).unwrap(),
            instruction_negatives: Some(2),
        },
        query_max_length: Some(16),
        passage_max_length: Some(16),
        ..EncoderConfig::default()
    };
    let enc = DualEncoder::from_dir(&dir, cfg, &device()).unwrap();
    let out = tempfile::tempdir().unwrap();
    enc.save(out.path()).unwrap();
    let json: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(out.path().join("infembed_encoder.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(json["interaction"]["template"], text);
    let back = DualEncoder::load_saved(out.path(), &device()).unwrap();
    let mut want = enc.config().clone();
    want.pooling = Some(enc.pooling());
    assert_eq!(back.config(), &want);
    let pairs = [("find news", "cats")];
    assert_eq!(
        rows(back.encode_queries(&pairs).unwrap().embeddings),
        rows(enc.encode_queries(&pairs).unwrap().embeddings)
    );
}

/// Swapping the weights keeps the shared context: no tokenizer or config is copied, and the
/// encoder with the same weights gives the same embeddings.
#[test]
fn swapping_weights_shares_the_context() {
    let dir = fixture("tiny-bert");
    let cfg = EncoderConfig {
        query_max_length: Some(16),
        passage_max_length: Some(16),
        ..EncoderConfig::default()
    };
    let enc = DualEncoder::from_dir(&dir, cfg, &device()).unwrap();
    let mut other = enc.with_model(enc.model().clone(), enc.device());
    assert!(std::ptr::eq(enc.tokenizer(), other.tokenizer()));
    assert!(std::ptr::eq(enc.config(), other.config()));
    other.set_model(enc.model().clone());
    assert!(std::ptr::eq(enc.tokenizer(), other.clone().tokenizer()));
    assert_eq!(other.source_dir(), dir.as_path());
    let pairs = [("find news", "cats")];
    assert_eq!(
        rows(other.encode_queries(&pairs).unwrap().embeddings),
        rows(enc.encode_queries(&pairs).unwrap().embeddings)
    );
}
