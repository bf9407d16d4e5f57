//! Config files: formats, defaults, path resolution, environment fallbacks and typed errors.

use std::collections::HashMap;
use std::path::Path;

use infembed_synth::{ConstrainedOutput, Error, SynthConfig};

fn write(dir: &Path, name: &str, text: &str) -> std::path::PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

const MINIMAL: &str = r#"
[input]
beir = "data/msmarco"
limit = 20

[output]
records = "out/r.jsonl"
"#;

#[test]
fn toml_defaults_and_relative_paths() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = SynthConfig::from_file(write(dir.path(), "c.toml", MINIMAL)).unwrap();
    assert_eq!(
        cfg.input.beir.as_deref(),
        Some(dir.path().join("data/msmarco").as_path())
    );
    assert_eq!(cfg.input.split, "test");
    assert_eq!(cfg.input.limit, Some(20));
    assert_eq!(cfg.output.records, dir.path().join("out/r.jsonl"));
    assert_eq!(
        cfg.output.rejected_path(),
        dir.path().join("out/r.rejected.jsonl")
    );
    assert_eq!(
        cfg.output.report_path(),
        dir.path().join("out/r.report.json")
    );
    assert_eq!(
        cfg.output.generated_path(),
        dir.path().join("out/r.generated.jsonl")
    );
    assert_eq!(cfg.client.concurrency, 4);
    assert_eq!(cfg.quality.distractors, 2);
    assert!(cfg.quality.enabled);
}

#[test]
fn json_config_is_accepted() {
    let dir = tempfile::tempdir().unwrap();
    let text = r#"{"input": {"jsonl": "/abs/pairs.jsonl"}, "output": {"records": "r.jsonl"},
                   "generator": {"base_url": "http://127.0.0.1:1/v1", "model": "m",
                                 "structured_output": "json_object"},
                   "client": {"concurrency": 2, "request_budget": 100}}"#;
    let cfg = SynthConfig::from_file(write(dir.path(), "c.json", text)).unwrap();
    assert_eq!(
        cfg.input.jsonl.as_deref(),
        Some(Path::new("/abs/pairs.jsonl"))
    );
    assert_eq!(cfg.client.request_budget, Some(100));
    let (g, j) = cfg.endpoints_with_env(&|_| None).unwrap();
    // `structured_output` is the older name of `constrained_output`.
    assert_eq!(g.constrained_output, ConstrainedOutput::JsonObject);
    assert_eq!(j.constrained_output, ConstrainedOutput::JsonSchema);
    assert_eq!(j.model, "m");
    assert_eq!(j.base_url, "http://127.0.0.1:1/v1");
}

#[test]
fn unknown_keys_and_bad_values_name_file_and_field() {
    let dir = tempfile::tempdir().unwrap();
    let p = write(
        dir.path(),
        "c.toml",
        &format!("{MINIMAL}\n[client]\nconcurency = 3\n"),
    );
    let e = SynthConfig::from_file(&p).unwrap_err();
    assert!(matches!(e, Error::ConfigToml { .. }));
    let msg = e.to_string();
    assert!(
        msg.contains("c.toml") && msg.contains("concurency"),
        "{msg}"
    );

    let p = write(
        dir.path(),
        "d.toml",
        &format!("{MINIMAL}\n[client]\nconcurrency = 0\n"),
    );
    let msg = SynthConfig::from_file(&p).unwrap_err().to_string();
    assert!(
        msg.contains("d.toml") && msg.contains("client.concurrency"),
        "{msg}"
    );

    let p = write(
        dir.path(),
        "e.toml",
        &format!("{MINIMAL}\n[quality]\ndistractors = 24\n"),
    );
    let msg = SynthConfig::from_file(&p).unwrap_err().to_string();
    assert!(msg.contains("quality.distractors"), "{msg}");

    let p = write(
        dir.path(),
        "f.toml",
        "[input]\nbeir = \"a\"\njsonl = \"b\"\n[output]\nrecords = \"r.jsonl\"\n",
    );
    let msg = SynthConfig::from_file(&p).unwrap_err().to_string();
    assert!(msg.contains("only one"), "{msg}");

    let p = write(dir.path(), "g.yaml", MINIMAL);
    assert!(matches!(
        SynthConfig::from_file(&p).unwrap_err(),
        Error::ConfigFormat { .. }
    ));

    let p = write(dir.path(), "h.json", "{\"input\": ");
    let msg = SynthConfig::from_file(&p).unwrap_err().to_string();
    assert!(msg.contains("h.json") && msg.contains("line 1"), "{msg}");

    let e = SynthConfig::from_file(dir.path().join("missing.toml")).unwrap_err();
    assert!(matches!(e, Error::Io { .. }));
}

#[test]
fn endpoints_fall_back_to_environment_and_config_wins() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = SynthConfig::from_file(write(dir.path(), "c.toml", MINIMAL)).unwrap();
    let e = cfg.endpoints_with_env(&|_| None).unwrap_err().to_string();
    assert!(
        e.contains("generator.base_url") && e.contains("INFEMBED_SYNTH_BASE_URL"),
        "{e}"
    );

    let env: HashMap<&str, &str> = [
        ("OPENAI_BASE_URL", "https://api.example.invalid/v1/"),
        ("OPENAI_API_KEY", "sk-openai"),
        ("INFEMBED_SYNTH_GENERATOR_MODEL", "gpt-4o-mini"),
        ("INFEMBED_SYNTH_JUDGE_MODEL", "o3-mini"),
        ("MY_JUDGE_KEY", "sk-judge"),
    ]
    .into();
    let lookup = |k: &str| env.get(k).map(|v| v.to_string());
    let (g, j) = cfg.endpoints_with_env(&lookup).unwrap();
    assert_eq!(g.base_url, "https://api.example.invalid/v1");
    assert_eq!(g.model, "gpt-4o-mini");
    assert_eq!(g.api_key.as_deref(), Some("sk-openai"));
    assert_eq!(j.model, "o3-mini");
    assert_eq!(j.api_key.as_deref(), Some("sk-openai"));

    let text = format!(
        "{MINIMAL}\n[generator]\nbase_url = \"http://127.0.0.1:9/v1\"\nmodel = \"local\"\n\
         [judge]\napi_key_env = \"MY_JUDGE_KEY\"\nmax_tokens_field = \"max_completion_tokens\"\n"
    );
    let cfg = SynthConfig::from_file(write(dir.path(), "d.toml", &text)).unwrap();
    let (g, j) = cfg.endpoints_with_env(&lookup).unwrap();
    assert_eq!(g.base_url, "http://127.0.0.1:9/v1");
    assert_eq!(g.model, "local");
    assert_eq!(j.model, "o3-mini");
    assert_eq!(j.api_key.as_deref(), Some("sk-judge"));
    assert_eq!(j.max_tokens_field, "max_completion_tokens");

    let text = format!("{MINIMAL}\n[generator]\nbase_url = \"ftp://x\"\nmodel = \"m\"\n");
    let cfg = SynthConfig::from_file(write(dir.path(), "e.toml", &text)).unwrap();
    let e = cfg.endpoints_with_env(&|_| None).unwrap_err().to_string();
    assert!(e.contains("ftp://x"), "{e}");
}

#[test]
fn bad_input_pairs_name_file_line_and_field() {
    let dir = tempfile::tempdir().unwrap();
    let pairs = write(
        dir.path(),
        "pairs.jsonl",
        "{\"query\": \"q\", \"passage\": \"p\"}\n\n{\"query\": \"q2\", \"passage\": \"  \"}\n",
    );
    let e = infembed_synth::input::load_jsonl_pairs(&pairs)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("pairs.jsonl") && e.contains("line 3") && e.contains("`passage`"),
        "{e}"
    );
    write(
        dir.path(),
        "bad.jsonl",
        "{\"query\": \"q\", \"passage\": \"p\"}\n{oops\n",
    );
    let e = infembed_synth::input::load_jsonl_pairs(&dir.path().join("bad.jsonl"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("line 2") && e.contains("invalid JSON"), "{e}");
    let ok = infembed_synth::input::load_jsonl_pairs(&pairs_ok(dir.path())).unwrap();
    assert_eq!(ok.pairs[0].query_id, "line1");
    assert_eq!(ok.pairs[1].query_id, "7");
    assert_eq!(
        ok.pool.len(),
        1,
        "identical passages count once in the pool"
    );
}

fn pairs_ok(dir: &Path) -> std::path::PathBuf {
    write(
        dir,
        "ok.jsonl",
        "{\"query\": \"q\", \"passage\": \"p\"}\n{\"query_id\": 7, \"query\": \"q2\", \"passage\": \"p\"}\n",
    )
}

#[test]
fn prompts_dir_overrides_and_bad_templates_are_errors() {
    let dir = tempfile::tempdir().unwrap();
    write(
        dir.path(),
        "judge.txt",
        "Q={{query}} I={{instruction}} {{options}} {{letters}} {{passage}}",
    );
    let e = infembed_synth::PromptSet::from_dir(dir.path())
        .unwrap_err()
        .to_string();
    assert!(e.contains("judge.txt") && e.contains("passage"), "{e}");
    write(
        dir.path(),
        "judge.txt",
        "Q={{query}} I={{instruction}} {{options}} {{letters}}",
    );
    let p = infembed_synth::PromptSet::from_dir(dir.path()).unwrap();
    assert_eq!(
        p.judge.text(),
        "Q={{query}} I={{instruction}} {{options}} {{letters}}"
    );
    assert_eq!(
        p.poison.text(),
        infembed_synth::PromptSet::built_in().poison.text()
    );
}

#[test]
fn beir_input_from_the_vendored_msmarco_subset() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../data/msmarco-subset");
    let input = infembed_synth::input::load_beir_pairs(&dir, "test").unwrap();
    assert_eq!(input.pairs.len(), 1743);
    assert_eq!(input.pool.len(), 1743);
    // First query of queries.jsonl and its judged passage (qrels/test.tsv line 2).
    assert_eq!(input.pairs[0].query_id, "320792");
    assert_eq!(input.pairs[0].query, "how much is a cost to run disneyland");
    assert_eq!(input.pairs[0].passage_id, "7067677");
    assert!(
        input.pairs[0]
            .passage
            .starts_with("Disney's Theme Parks had an operating cost")
    );
}

#[test]
fn constrained_output_modes_parse_and_bad_ones_name_the_field() {
    let dir = tempfile::tempdir().unwrap();
    for (text, mode) in [
        ("json_schema", ConstrainedOutput::JsonSchema),
        ("grammar", ConstrainedOutput::Grammar),
        ("json_object", ConstrainedOutput::JsonObject),
        ("none", ConstrainedOutput::None),
    ] {
        let p = write(
            dir.path(),
            "c.toml",
            &format!(
                "{MINIMAL}\n[generator]\nbase_url = \"http://x/v1\"\nmodel = \"m\"\n\
                 constrained_output = \"{text}\"\n"
            ),
        );
        let cfg = SynthConfig::from_file(&p).unwrap();
        let (g, _) = cfg.endpoints_with_env(&|_| None).unwrap();
        assert_eq!(g.constrained_output, mode);
    }
    let p = write(
        dir.path(),
        "c.toml",
        &format!("{MINIMAL}\n[judge]\nconstrained_output = \"regex\"\n"),
    );
    let e = SynthConfig::from_file(&p).unwrap_err().to_string();
    assert!(e.contains("c.toml") && e.contains("regex"), "{e}");
    let p = write(
        dir.path(),
        "c.toml",
        &format!("{MINIMAL}\n[judge]\nmax_tokens = 0\n"),
    );
    let e = SynthConfig::from_file(&p).unwrap_err().to_string();
    assert!(e.contains("judge.max_tokens"), "{e}");
    let p = write(
        dir.path(),
        "c.toml",
        &format!("{MINIMAL}\ngenerated = \"out/r.jsonl\"\n"),
    );
    let e = SynthConfig::from_file(&p).unwrap_err().to_string();
    assert!(e.contains("output.generated"), "{e}");
}
