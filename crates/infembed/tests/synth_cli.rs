//! `infembed synth --config FILE` end to end: the built binary against the synthesis crate's
//! scripted loopback server (its test support, reused), and, when `cargo xtask llama-server` has
//! cached llama.cpp's server and model and the shared data is present, against the real server
//! (skipped loudly otherwise).

#[path = "../../infembed-synth/tests/support/mod.rs"]
mod support;

use std::path::Path;
use std::process::{Command, Output};

use infembed_data::{ReadMode, read_records};
use serde_json::Value;
use support::llama::{LlamaServer, llama_paths, msmarco};
use support::{FakeServer, completion, good_model, write_config, write_pairs};

fn synth(config: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_infembed"))
        .args(["synth", "--config"])
        .arg(config)
        .output()
        .expect("run the infembed binary")
}

fn lines(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .map(|t| {
            t.lines()
                .filter(|l| !l.trim().is_empty())
                .map(|l| serde_json::from_str(l).unwrap())
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn synth_cli_against_the_fake_server_writes_records_and_prints_the_report() {
    let dir = tempfile::tempdir().unwrap();
    // Pair q02's instruction answer is not JSON: a malformed rejection, not a record.
    let server = FakeServer::start(|req, i| {
        if req.step() == "instruction" && req.user().contains("[q02]") {
            completion("no JSON here")
        } else {
            good_model(req, i)
        }
    });
    let pairs = write_pairs(dir.path(), 5);
    let config = write_config(dir.path(), &pairs, &server.base_url, "");
    let out = synth(&config);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}\n{stdout}");

    // stdout is the report as JSON, equal to the report file.
    let report: Value = serde_json::from_str(&stdout).expect("the report on stdout is JSON");
    let records = dir.path().join("out/records.jsonl");
    let report_file: Value = serde_json::from_str(
        &std::fs::read_to_string(dir.path().join("out/records.report.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(report["total"], report_file["total"]);
    assert_eq!(report["total"]["finished"], 5);
    assert_eq!(report["total"]["kept"], 4);
    assert_eq!(report["total"]["generated"], 4);
    assert_eq!(report["total"]["rejected_malformed"], 1);
    let scenarios = report["scenarios"].as_array().unwrap();
    assert_eq!(scenarios.len(), 3);
    for s in scenarios {
        assert_eq!((&s["judged"], &s["correct"]), (&4.into(), &4.into()), "{s}");
    }
    // 4 full pairs of 7 requests, plus 1 for the malformed one.
    assert_eq!(server.count(), 4 * 7 + 1);

    // Progress and the per-scenario summary on stderr.
    assert!(stderr.contains("synth: 5 pairs to do"), "{stderr}");
    assert!(stderr.contains("5/5 pairs"), "{stderr}");
    assert!(stderr.contains("kept 4"), "{stderr}");
    assert!(stderr.contains("Positive: 4/4 judged right"), "{stderr}");
    assert!(stderr.contains("NegativeQuery: 4/4"), "{stderr}");

    // The data crate reads both record files back, strictly; the texts are the fake model's.
    let kept = read_records(&records, ReadMode::Strict).unwrap();
    assert_eq!(kept.records.len(), 4);
    let generated = read_records(
        dir.path().join("out/records.generated.jsonl"),
        ReadMode::Strict,
    )
    .unwrap();
    assert_eq!(generated.records.len(), 4);
    for r in &kept.records {
        assert!(r.instruction_negative.starts_with("NEG "));
        assert!(r.hard_negative_document_1.starts_with("P1MARK"));
    }
    let rejected = lines(&dir.path().join("out/records.rejected.jsonl"));
    assert_eq!(rejected.len(), 1);
    assert_eq!(rejected[0]["provenance"]["stage"], "malformed");
    assert_eq!(rejected[0]["provenance"]["source"]["query_id"], "q02");

    // A second run has nothing left to do and asks nothing.
    let again = synth(&config);
    assert!(again.status.success());
    let report: Value = serde_json::from_slice(&again.stdout).unwrap();
    assert_eq!(report["already_done"], 5);
    assert_eq!(report["this_run"]["to_do"], 0);
    assert_eq!(server.count(), 4 * 7 + 1);
}

#[test]
fn synth_cli_reports_config_errors_and_failed_pairs() {
    let dir = tempfile::tempdir().unwrap();
    // A config error names the file and the field, and the exit status is non-zero.
    let bad = dir.path().join("bad.toml");
    std::fs::write(
        &bad,
        "[input]\njsonl = \"p.jsonl\"\n[output]\nrecords = \"r.jsonl\"\n[client]\nconcurrency = 0\n",
    )
    .unwrap();
    let out = synth(&bad);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("bad.toml") && stderr.contains("client.concurrency"),
        "{stderr}"
    );

    // A server refusing every request (401): the pairs fail, nothing is written, exit non-zero.
    let server = FakeServer::start(|_, _| {
        support::Reply::Http(401, vec![], "{\"error\": \"bad key\"}".into())
    });
    let pairs = write_pairs(dir.path(), 2);
    let config = write_config(dir.path(), &pairs, &server.base_url, "");
    let out = synth(&config);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("2 pairs failed"), "{stderr}");
    assert!(lines(&dir.path().join("out/records.generated.jsonl")).is_empty());
}

#[test]
fn synth_cli_against_the_real_local_server() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let Some((server_bin, model)) = llama_paths("synth_cli_against_the_real_local_server") else {
        return;
    };
    let beir = msmarco(&root);
    let dir = tempfile::tempdir().unwrap();
    let server = LlamaServer::start(&server_bin, &model, dir.path());
    let config = dir.path().join("synth.toml");
    std::fs::write(
        &config,
        format!(
            r#"
[input]
beir = "{beir}"
limit = 2

[output]
records = "out/records.jsonl"

[generator]
base_url = "{url}"
model = "SmolLM2-135M-Instruct"
temperature = 0.3
schema_length_limits = true

[judge]
temperature = 0.0

[client]
concurrency = 1

[filter]
max_instruction_chars = 160
max_query_chars = 100
max_passage_chars = 200

[quality]
distractors = 1
"#,
            beir = beir.display(),
            url = server.base_url
        ),
    )
    .unwrap();
    let out = synth(&config);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}\n{}", server.log_text());
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    let total = &report["total"];
    assert_eq!(total["finished"], 2, "{report}");
    // The default `json_schema` mode with length limits keeps every answer well formed.
    assert_eq!(total["rejected_malformed"], 0, "{report}");
    let generated = read_records(
        dir.path().join("out/records.generated.jsonl"),
        ReadMode::Strict,
    )
    .expect("the data crate reads the generated records");
    assert_eq!(
        generated.records.len() as u64,
        total["generated"].as_u64().unwrap()
    );
    assert_eq!(
        total["generated"].as_u64().unwrap() + total["rejected_rule"].as_u64().unwrap(),
        2
    );
    for s in report["scenarios"].as_array().unwrap() {
        assert_eq!(s["invalid_answers"], 0, "{s}");
    }
    eprintln!(
        "real server via the CLI: {} generated, {} kept, {:.0}s",
        total["generated"],
        total["kept"],
        report["elapsed_secs"].as_f64().unwrap_or(0.0)
    );
}
