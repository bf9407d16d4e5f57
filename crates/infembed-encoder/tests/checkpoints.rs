//! Checkpoints as they ship, in and out: sentence-transformers' pipeline honoured
//! (`max_seq_length`, `Dense`, `Normalize`, similarity, prompts), unsupported modules and
//! config keys refused by name, sharded weights with missing shards named, reproducible
//! saved files, and save / reload round trips for every architecture.

mod common;

use std::path::Path;

use common::*;
use infembed_encoder::{
    DualEncoder, EncoderConfig, Error, Interaction, QueryTemplate, Similarity, TextEncoder,
};

/// Texts of 60 to 400 tokens (`minilm-reference/long_cases.json`, made by
/// `generate_long.py` beside it with sentence-transformers): `infembed embed`'s path (a dual
/// encoder with the default config) and the text encoder both truncate at the checkpoint's
/// `max_seq_length` (256) as sentence-transformers does.
#[test]
fn minilm_long_texts_match_sentence_transformers() {
    let Some(dir) = minilm_dir("minilm_long_texts_match_sentence_transformers") else {
        return;
    };
    let exp = read_json(&fixture("minilm-reference/long_cases.json"));
    let cases = exp["cases"].as_array().unwrap();
    let texts: Vec<&str> = cases.iter().map(|c| c["text"].as_str().unwrap()).collect();
    let tokens: Vec<u64> = cases
        .iter()
        .map(|c| c["tokens"].as_u64().unwrap())
        .collect();
    assert!(tokens.iter().any(|&t| t >= 400) && tokens.iter().any(|&t| t < 256));

    let dual = DualEncoder::from_dir(&dir, EncoderConfig::default(), &device()).unwrap();
    assert_eq!(
        dual.passage_max_length(),
        256,
        "from sentence_bert_config.json"
    );
    assert_eq!(dual.query_max_length(), 256);
    let text = TextEncoder::from_dir(&dir, &device()).unwrap();
    let from_dual = rows(dual.encode_passages(&texts).unwrap().embeddings);
    let from_text = rows(text.encode_sorted(&texts, 4).unwrap().embeddings);
    let mut worst = 0f32;
    for (i, c) in cases.iter().enumerate() {
        let want = f32s(&c["embedding"]);
        for got in [&from_dual[i], &from_text[i]] {
            let d = max_abs_diff(got, &want);
            assert!(d <= 1e-5, "text {i} ({} tokens) differs by {d}", tokens[i]);
            worst = worst.max(d);
        }
    }
    eprintln!("MiniLM, 60 to 400 tokens: max abs diff {worst:e}");

    // An explicit length still wins: at 512 the texts past 256 tokens embed differently.
    let config = EncoderConfig::default().with_reference_lengths();
    let long = DualEncoder::from_dir(&dir, config, &device()).unwrap();
    assert_eq!(long.passage_max_length(), 512);
    assert_eq!(long.query_max_length(), 256);
    let at_512 = rows(long.encode_passages(&texts).unwrap().embeddings);
    for (i, &t) in tokens.iter().enumerate() {
        let d = max_abs_diff(&at_512[i], &from_dual[i]);
        if t <= 256 {
            assert!(
                d <= 1e-6,
                "text {i} ({t} tokens) is not cut either way: {d}"
            );
        } else {
            assert!(d > 1e-4, "text {i} ({t} tokens) is cut at 256 only: {d}");
        }
    }
}

/// A pipeline with a `Dense` module (16 -> 8, tanh), no `Normalize`, dot-product similarity
/// and prompts, against sentence-transformers' own `encode` (fixture `tiny-bert-dense`).
#[test]
fn dense_pipeline_and_prompts_match_sentence_transformers() {
    let dir = fixture("tiny-bert-dense");
    let exp = read_json(&dir.join("expected.json"));
    let texts: Vec<&str> = exp["texts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap())
        .collect();
    let check = |got: &[Vec<f32>], key: &str| {
        let want = exp[key].as_array().unwrap();
        assert_eq!(got.len(), want.len());
        for (r, (g, w)) in got.iter().zip(want).enumerate() {
            assert_eq!(g.len(), 8, "the Dense module's width");
            let d = max_abs_diff(g, &f32s(w));
            assert!(d <= 1e-5, "{key}: row {r} differs by {d}");
        }
    };

    let enc = TextEncoder::from_dir(&dir, &device()).unwrap();
    assert_eq!(enc.dim(), 8);
    assert!(
        !enc.normalize,
        "no Normalize module and dot-product similarity"
    );
    check(&rows(enc.encode(&texts).unwrap().embeddings), "plain");

    // The dual encoder takes the prompts as prefixes; with a template that puts an empty
    // instruction before the query, a query is embedded as `prompt + query`.
    let config = EncoderConfig {
        interaction: Interaction::SelfAttention {
            template: QueryTemplate::new("{instruction}{query}").unwrap(),
            instruction_negatives: None,
        },
        ..EncoderConfig::default()
    };
    let dual = DualEncoder::from_dir(&dir, config, &device()).unwrap();
    assert_eq!(dual.config().query_prefix, "query: ");
    assert_eq!(dual.config().passage_prefix, "passage: ");
    assert_eq!(dual.similarity(), Similarity::Dot);
    assert!(!dual.normalizes());
    assert_eq!(dual.dim(), 8);
    let pairs: Vec<(&str, &str)> = texts.iter().map(|t| ("", *t)).collect();
    check(
        &rows(dual.encode_queries(&pairs).unwrap().embeddings),
        "query_prompt",
    );
    check(
        &rows(dual.encode_passages(&texts).unwrap().embeddings),
        "document_prompt",
    );

    // Training embeddings are unit vectors whatever the pipeline (the objectives score by
    // cosine).
    let row = infembed_encoder::BatchRow {
        instruction: "",
        query: texts[0],
        passage: texts[1],
    };
    let batch = dual.encode_batch(&[row], &[vec![0]]).unwrap();
    let p = rows(batch.p);
    let norm: f32 = p[0].iter().map(|x| x * x).sum::<f32>().sqrt();
    assert!((norm - 1.0).abs() < 1e-5, "training passage norm {norm}");
}

/// Interaction II combines the backbone's states, which a `Dense` module would not see.
#[test]
fn dense_with_interaction_ii_is_refused() {
    let config = EncoderConfig {
        interaction: Interaction::CrossAttention(Default::default()),
        ..EncoderConfig::default()
    };
    let err = DualEncoder::from_dir(fixture("tiny-bert-dense"), config, &device()).unwrap_err();
    assert!(err.to_string().contains("Dense"), "{err}");
}

/// Writes a copy of fixture `name` into a temporary directory and lets `edit` change it.
fn edited(name: &str, edit: impl FnOnce(&Path)) -> tempfile::TempDir {
    let tmp = tempfile::tempdir().unwrap();
    copy_dir(&fixture(name), tmp.path());
    edit(tmp.path());
    tmp
}

fn edit_json(path: &Path, f: impl FnOnce(&mut serde_json::Value)) {
    let mut v = read_json(path);
    f(&mut v);
    std::fs::write(path, serde_json::to_string_pretty(&v).unwrap()).unwrap();
}

fn load_error(dir: &Path) -> String {
    match TextEncoder::from_dir(dir, &device()) {
        Ok(_) => panic!("{} should not load", dir.display()),
        Err(e) => {
            let msg = e.to_string();
            assert!(!msg.contains('\n'), "one line: {msg}");
            msg
        }
    }
}

#[test]
fn unsupported_modules_and_keys_are_named() {
    // A module type the pipeline does not implement.
    let dir = edited("tiny-bert", |d| {
        edit_json(&d.join("modules.json"), |m| {
            m.as_array_mut().unwrap().push(serde_json::json!({
                "idx": 3, "name": "3", "path": "3_LayerNorm",
                "type": "sentence_transformers.models.LayerNorm"
            }));
        })
    });
    let msg = load_error(dir.path());
    assert!(
        msg.contains("sentence_transformers.models.LayerNorm"),
        "{msg}"
    );
    assert!(msg.contains("modules.json"), "{msg}");

    // Modules out of order (Normalize before Pooling).
    let dir = edited("tiny-bert", |d| {
        edit_json(&d.join("modules.json"), |m| {
            m[1]["idx"] = 5.into();
        })
    });
    let msg = load_error(dir.path());
    assert!(msg.contains("out of order"), "{msg}");

    // A similarity other than cosine and dot.
    let dir = edited("tiny-bert-dense", |d| {
        edit_json(&d.join("config_sentence_transformers.json"), |c| {
            c["similarity_fn_name"] = "manhattan".into();
        })
    });
    let msg = load_error(dir.path());
    assert!(
        msg.contains("similarity_fn_name") && msg.contains("manhattan"),
        "{msg}"
    );

    // A Dense module whose input is not the pooled width.
    let dir = edited("tiny-bert-dense", |d| {
        edit_json(&d.join("2_Dense/config.json"), |c| {
            c["in_features"] = 12.into();
        })
    });
    let msg = load_error(dir.path());
    assert!(msg.contains("in_features"), "{msg}");

    // An activation sentence-transformers allows but this crate does not implement.
    let dir = edited("tiny-bert-dense", |d| {
        edit_json(&d.join("2_Dense/config.json"), |c| {
            c["activation_function"] = "torch.nn.modules.activation.Softsign".into();
        })
    });
    let msg = load_error(dir.path());
    assert!(
        msg.contains("activation_function") && msg.contains("Softsign"),
        "{msg}"
    );

    // Rotary scaling types and attention layouts that change the math.
    for (key, value, named) in [
        (
            "rope_parameters",
            serde_json::json!({"rope_type": "yarn", "factor": 4.0, "rope_theta": 10000.0}),
            "rope_parameters.rope_type",
        ),
        (
            "rope_scaling",
            serde_json::json!({"type": "linear", "factor": 2.0}),
            "rope_scaling.rope_type",
        ),
        (
            "rope_parameters",
            serde_json::json!({"rope_type": "llama3", "factor": 4.0, "rope_theta": 10000.0}),
            "rope_parameters.low_freq_factor",
        ),
        (
            "layer_types",
            serde_json::json!(["full_attention", "sliding_attention"]),
            "layer_types",
        ),
        (
            "partial_rotary_factor",
            serde_json::json!(0.5),
            "partial_rotary_factor",
        ),
    ] {
        let dir = edited("tiny-qwen2", |d| {
            edit_json(&d.join("config.json"), |c| c[key] = value.clone())
        });
        let msg = load_error(dir.path());
        assert!(msg.contains(named), "{key}: {msg}");
        assert!(msg.contains("config.json"), "{key}: {msg}");
    }
}

#[test]
fn sharded_checkpoint_problems_are_named() {
    // A shard listed by the index is missing.
    let dir = edited("tiny-qwen2-bf16-sharded", |d| {
        std::fs::remove_file(d.join("model-00002-of-00002.safetensors")).unwrap();
    });
    let err = TextEncoder::from_dir(dir.path(), &device()).unwrap_err();
    assert!(matches!(err, Error::MissingFile { .. }), "{err}");
    assert!(
        err.to_string().contains("model-00002-of-00002.safetensors"),
        "{err}"
    );

    // The second shard holds the first one's tensors: the parameters of the second are in
    // no file, named with the index.
    let dir = edited("tiny-qwen2-bf16-sharded", |d| {
        std::fs::copy(
            d.join("model-00001-of-00002.safetensors"),
            d.join("model-00002-of-00002.safetensors"),
        )
        .unwrap();
    });
    let index = read_json(&fixture(
        "tiny-qwen2-bf16-sharded/model.safetensors.index.json",
    ));
    let in_second: Vec<String> = index["weight_map"]
        .as_object()
        .unwrap()
        .iter()
        .filter(|(_, f)| *f == "model-00002-of-00002.safetensors")
        .map(|(k, _)| k.clone())
        .collect();
    assert!(!in_second.is_empty());
    let err = TextEncoder::from_dir(dir.path(), &device()).unwrap_err();
    assert!(matches!(err, Error::WeightsMismatch { .. }), "{err}");
    let msg = err.to_string();
    assert!(msg.contains("model.safetensors.index.json"), "{msg}");
    // Hugging Face names as in the index (the module path drops the `model.` prefix, if any).
    let named = in_second
        .iter()
        .filter(|k| msg.contains(k.trim_start_matches("model.")))
        .count();
    assert!(named > 0, "no tensor of the second shard is named: {msg}");

    // No weights at all.
    let dir = edited("tiny-qwen2-bf16-sharded", |d| {
        std::fs::remove_file(d.join("model.safetensors.index.json")).unwrap();
    });
    let err = TextEncoder::from_dir(dir.path(), &device()).unwrap_err();
    assert!(err.to_string().contains("model.safetensors"), "{err}");
}

/// Equal weights give equal bytes: two saves of one encoder, and a save of what was
/// reloaded from the first, write identical `model.safetensors` files.
#[test]
fn saved_weights_are_reproducible_bytes() {
    let enc = TextEncoder::from_dir(fixture("tiny-modernbert"), &device()).unwrap();
    let a = tempfile::tempdir().unwrap();
    let b = tempfile::tempdir().unwrap();
    let c = tempfile::tempdir().unwrap();
    enc.save(a.path()).unwrap();
    enc.save(b.path()).unwrap();
    TextEncoder::from_dir(a.path(), &device())
        .unwrap()
        .save(c.path())
        .unwrap();
    let bytes = |d: &Path| std::fs::read(d.join("model.safetensors")).unwrap();
    assert_eq!(bytes(a.path()), bytes(b.path()));
    assert_eq!(bytes(a.path()), bytes(c.path()));

    // A dual encoder's files too (the query tower and the Interaction II weights).
    let config = EncoderConfig {
        interaction: Interaction::CrossAttention(infembed_encoder::CrossAttentionConfig {
            kind: infembed_encoder::CrossAttentionKind::Vector,
            learnable: true,
        }),
        ..EncoderConfig::default()
    };
    let dual = DualEncoder::from_dir(fixture("tiny-bert"), config, &device()).unwrap();
    dual.save(a.path()).unwrap();
    dual.save(b.path()).unwrap();
    for name in ["model.safetensors", "interaction.safetensors"] {
        let x = std::fs::read(a.path().join(name)).unwrap();
        let y = std::fs::read(b.path().join(name)).unwrap();
        assert_eq!(x, y, "{name}");
    }
}

/// Save and reload: the embeddings, pooling, padding side, lengths, `Dense` modules and
/// prompts come back, for every architecture.
#[test]
fn save_and_reload_round_trips_every_architecture() {
    for name in [
        "tiny-bert",
        "tiny-modernbert",
        "tiny-qwen2",
        "tiny-llama",
        "tiny-qwen2-bf16-sharded",
        "tiny-llama-rope-llama3",
        "tiny-bert-dense",
    ] {
        let config = EncoderConfig {
            query_max_length: Some(12),
            query_prefix: "q: ".into(),
            passage_prefix: "p: ".into(),
            ..EncoderConfig::default()
        };
        let enc = DualEncoder::from_dir(fixture(name), config, &device()).unwrap();
        let out = tempfile::tempdir().unwrap();
        enc.save(out.path()).unwrap();
        let back = DualEncoder::load_saved(out.path(), &device()).unwrap();
        assert_eq!(back.pooling(), enc.pooling(), "{name}");
        assert_eq!(
            back.tokenizer().pads_left(),
            enc.tokenizer().pads_left(),
            "{name}"
        );
        assert_eq!(back.query_max_length(), 12, "{name}");
        assert_eq!(
            back.passage_max_length(),
            enc.passage_max_length(),
            "{name}"
        );
        assert_eq!(back.dim(), enc.dim(), "{name}");
        assert_eq!(back.config().query_prefix, "q: ", "{name}");

        let texts = [
            "the cat sat on the mat",
            "x",
            "find documents about the ocean",
        ];
        let pairs = [
            ("recent news", "cats"),
            ("", "a dog"),
            ("ships", "the ocean"),
        ];
        // A saved dual encoder normalizes (its training objective is cosine).
        let unit = |t: burn::prelude::Tensor<2>| rows(infembed_encoder::l2_normalize(t));
        for (a, b, what) in [
            (
                unit(enc.encode_passages(&texts).unwrap().embeddings),
                rows(back.encode_passages(&texts).unwrap().embeddings),
                "passages",
            ),
            (
                unit(enc.encode_queries(&pairs).unwrap().embeddings),
                rows(back.encode_queries(&pairs).unwrap().embeddings),
                "queries",
            ),
        ] {
            for (r, (x, y)) in a.iter().zip(&b).enumerate() {
                let d = max_abs_diff(x, y);
                assert!(d <= 1e-6, "{name} {what}: row {r} differs by {d}");
            }
        }

        // The sentence-transformers files say what was saved.
        let st = read_json(&out.path().join("config_sentence_transformers.json"));
        assert_eq!(st["prompts"]["query"], "q: ", "{name}");
        assert_eq!(st["prompts"]["document"], "p: ", "{name}");
        let sb = read_json(&out.path().join("sentence_bert_config.json"));
        assert_eq!(sb["max_seq_length"], 12, "{name}");
        assert!(!out.path().join("model.safetensors.index.json").exists());
    }
}

/// Rounds every float parameter to f16 and back (what an f16 checkpoint holds).
struct RoundToF16;
impl burn::module::ModuleMapper for RoundToF16 {
    fn map_float<const D: usize>(
        &mut self,
        param: burn::module::Param<burn::prelude::Tensor<D>>,
    ) -> burn::module::Param<burn::prelude::Tensor<D>> {
        param.map(|t| {
            let data = t.to_data().convert::<burn::tensor::f16>().convert::<f32>();
            burn::prelude::Tensor::from_data(data, &t.device())
        })
    }
}

/// An f16 checkpoint (written here with burn-store's cast, as `model.half().save_pretrained`
/// would) loads cast to f32: it embeds as the f32 model whose weights are rounded to f16.
#[test]
fn f16_weights_are_cast_on_load() {
    use burn::module::Module;
    use burn::store::{
        BurnToPyTorchAdapter, FloatCastAdapter, ModuleAdapter, ModuleSnapshot, SafetensorsStore,
    };
    use burn::tensor::DType;

    let src = fixture("tiny-bert");
    let enc = TextEncoder::from_dir(&src, &device()).unwrap();
    let dir = edited("tiny-bert", |_| {});
    let infembed_encoder::Backbone::Bert(model) = &enc.backbone else {
        panic!("tiny-bert is a BERT");
    };
    let f32_bytes = std::fs::metadata(src.join("model.safetensors"))
        .unwrap()
        .len();
    let path = dir.path().join("model.safetensors");
    // burn's own module paths (no Hugging Face renames): the loader's renames leave them as
    // they are.
    let mut store = SafetensorsStore::from_file(&path)
        .with_to_adapter(BurnToPyTorchAdapter.chain(FloatCastAdapter::to(DType::F16)))
        .overwrite(true);
    model.save_into(&mut store).unwrap();
    let f16_bytes = std::fs::metadata(&path).unwrap().len();
    assert!(
        f16_bytes < f32_bytes * 6 / 10,
        "the file holds f16 tensors ({f16_bytes} vs {f32_bytes} bytes)"
    );

    let loaded = TextEncoder::from_dir(dir.path(), &device()).unwrap();
    let mut rounded = TextEncoder::from_dir(&src, &device()).unwrap();
    rounded.backbone = rounded.backbone.clone().map(&mut RoundToF16);
    let texts = [
        "the cat sat on the mat",
        "find documents about the ocean and ships",
    ];
    let a = rows(loaded.encode(&texts).unwrap().embeddings);
    let b = rows(rounded.encode(&texts).unwrap().embeddings);
    let c = rows(enc.encode(&texts).unwrap().embeddings);
    for r in 0..texts.len() {
        let d = max_abs_diff(&a[r], &b[r]);
        assert!(d <= 1e-6, "row {r}: f16 load vs rounded f32 weights: {d}");
        assert!(max_abs_diff(&a[r], &c[r]) > 1e-6, "f16 rounding shows");
    }
}
