//! The pipeline against a scripted OpenAI-compatible server on 127.0.0.1.

mod support;

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use infembed_data::{ReadMode, read_jsonl};
use infembed_synth::{NoProgress, Scenario, SynthConfig, SynthReport, run};
use serde_json::{Value, json};
use support::*;

fn config(dir: &Path, n: usize, base_url: &str, extra: &str) -> SynthConfig {
    let pairs = write_pairs(dir, n);
    let path = write_config(dir, &pairs, base_url, extra);
    SynthConfig::from_file(path).expect("valid config")
}

fn lines(path: &Path) -> Vec<Value> {
    match std::fs::read_to_string(path) {
        Ok(t) => t
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| serde_json::from_str(l).unwrap())
            .collect(),
        Err(_) => Vec::new(),
    }
}

/// Source (query id) of every line of the generated and rejected files (each finished pair is in
/// exactly one of them), with multiplicity. Also checks that the records file is exactly the kept
/// part of the generated file.
fn finished(cfg: &SynthConfig) -> BTreeMap<String, usize> {
    let generated = lines(&cfg.output.generated_path());
    let kept_generated: Vec<&Value> = generated
        .iter()
        .filter(|v| v["provenance"]["status"] == "kept")
        .collect();
    let records = lines(&cfg.output.records);
    assert_eq!(kept_generated.len(), records.len());
    for r in &records {
        assert!(kept_generated.contains(&r), "{r}");
    }
    let mut m = BTreeMap::new();
    for v in generated
        .into_iter()
        .chain(lines(&cfg.output.rejected_path()))
    {
        let q = v["provenance"]["source"]["query_id"]
            .as_str()
            .unwrap()
            .to_string();
        *m.entry(q).or_insert(0) += 1;
    }
    m
}

fn rejected_reasons(cfg: &SynthConfig) -> HashMap<String, (String, String)> {
    lines(&cfg.output.rejected_path())
        .into_iter()
        .map(|v| {
            let p = &v["provenance"];
            (
                p["source"]["query_id"].as_str().unwrap().to_string(),
                (
                    p["stage"].as_str().unwrap().to_string(),
                    p["reason"].as_str().unwrap().to_string(),
                ),
            )
        })
        .collect()
}

fn assert_invariants(report: &SynthReport) {
    let c = &report.total;
    assert_eq!(
        c.finished,
        c.kept + c.rejected_malformed + c.rejected_rule + c.rejected_judge
    );
    assert_eq!(c.generated, c.kept + c.rejected_judge);
}

#[test]
fn happy_path_records_read_back_with_provenance() {
    let dir = tempfile::tempdir().unwrap();
    let server = FakeServer::start(good_model);
    let cfg = config(dir.path(), 6, &server.base_url, "");
    let report = run(&cfg, &mut NoProgress).unwrap();
    assert_invariants(&report);
    assert_eq!(report.total.kept, 6);
    assert_eq!(report.this_run.failed, 0);
    assert_eq!(report.retention, Some(1.0));
    for s in &report.scenarios {
        assert_eq!((s.judged, s.correct, s.retention), (6, 6, Some(1.0)));
    }
    // 4 generator + 3 judge requests per pair.
    assert_eq!(server.count(), 6 * 7);
    assert_eq!(report.generator_requests.attempts, 24);
    assert_eq!(report.judge_requests.attempts, 18);
    assert_eq!(report.generator_requests.prompt_tokens, 24 * 10);

    // The data crate reads the output back strictly.
    let set = read_jsonl(&cfg.output.records, ReadMode::Strict).unwrap();
    assert_eq!(set.records.len(), 6);
    let by_query: HashMap<String, &infembed_data::InfIrRecord> = set
        .records
        .iter()
        .map(|r| (r.query_positive.to_string(), r))
        .collect();
    let r = by_query["what is topic [q03]"];
    assert_eq!(
        &*r.instruction_positive,
        "I am a student and need a short answer about [q03]"
    );
    assert_eq!(
        &*r.document_positive,
        "POS passage that answers [q03] for a student."
    );
    assert!(r.instruction_negative.starts_with("NEG "));
    assert!(r.query_negative.starts_with("NEGQ"));
    assert!(r.hard_negative_document_1.starts_with("P1MARK"));
    assert!(r.hard_negative_document_2.starts_with("P2MARK"));

    // Provenance: ids, models, judgments with 3 + 2 options and the right letters.
    for v in lines(&cfg.output.records) {
        let p = &v["provenance"];
        assert_eq!(p["generator_model"], "fake-generator");
        assert_eq!(p["judge_model"], "fake-judge");
        assert_eq!(p["status"], "kept");
        let q = p["source"]["query_id"].as_str().unwrap();
        assert_eq!(p["source"]["passage_id"], q.replace('q', "p"));
        let j = p["judgments"].as_array().unwrap();
        assert_eq!(j.len(), 3);
        for judgment in j {
            let options = judgment["options"].as_array().unwrap();
            assert_eq!(options.len(), 5);
            let distractors: Vec<&str> = options
                .iter()
                .filter_map(|o| o.as_str().unwrap().strip_prefix("distractor:"))
                .collect();
            assert_eq!(distractors.len(), 2);
            assert!(!distractors.contains(&q.replace('q', "p").as_str()));
            assert_eq!(judgment["chosen"], judgment["expected"]);
        }
    }

    // Request bodies: model names, structured output, seeds, sampling settings.
    let reqs = server.requests();
    let judge_req = reqs.iter().find(|r| r.step() == "judgment").unwrap();
    assert_eq!(judge_req.body["model"], "fake-judge");
    assert_eq!(
        judge_req.body["response_format"]["json_schema"]["schema"]["properties"]["answer"]["enum"],
        json!(["A", "B", "C", "D", "E"])
    );
    assert!(judge_req.body.get("temperature").is_none());
    // `{"answer": "E"}` is 15 bytes; the judge's budget covers it.
    assert_eq!(judge_req.body["max_tokens"], 24);
    assert!(judge_req.body.get("grammar").is_none());
    let gen_req = reqs.iter().find(|r| r.step() == "instruction").unwrap();
    assert_eq!(gen_req.body["model"], "fake-generator");
    assert_eq!(gen_req.path, "/v1/chat/completions");
    assert!(gen_req.body["seed"].is_u64());
    assert!((gen_req.body["temperature"].as_f64().unwrap() - 0.7).abs() < 1e-6);
    assert_eq!(gen_req.body["messages"][0]["role"], "system");
    assert!(gen_req.header("authorization").is_none());
    // Hosted-API defaults: no length keywords in the schema, the fixed 512-token limit.
    assert_eq!(gen_req.body["max_tokens"], 512);
    assert!(
        gen_req.body["response_format"]["json_schema"]["schema"]["properties"]["instruction"]
            .get("maxLength")
            .is_none()
    );

    // The judge sees the same shuffled options in all three scenarios of a pair, first in the
    // prompt (a prefix the server can cache), the record's passages among them.
    for q in ["[q00]", "[q03]"] {
        let prompts: Vec<String> = reqs
            .iter()
            .filter(|r| r.step() == "judgment" && judge_query_instruction(&r.user()).0.contains(q))
            .map(|r| r.user())
            .collect();
        assert_eq!(prompts.len(), 3, "{q}");
        let options_block = |u: &str| u.split("\n\nQuery:").next().unwrap().to_string();
        assert!(prompts[0].starts_with("Passages:\n[A] "));
        assert_eq!(options_block(&prompts[0]), options_block(&prompts[1]));
        assert_eq!(options_block(&prompts[0]), options_block(&prompts[2]));
        assert_eq!(judge_options(&prompts[0]).len(), 5);
    }
    // Every generator prompt of a pair starts with the same query and passage block.
    let gen_prompts: Vec<String> = reqs
        .iter()
        .filter(|r| r.step() != "judgment" && r.user().contains("answers [q02]"))
        .map(|r| r.user())
        .collect();
    assert_eq!(gen_prompts.len(), 4);
    let head =
        "Query: what is topic [q02]\nPassage: POS passage that answers [q02] for a student.\n";
    assert!(
        gen_prompts.iter().all(|p| p.starts_with(head)),
        "{gen_prompts:?}"
    );

    // Every record is also in the generated file, with the same line.
    let generated = lines(&cfg.output.generated_path());
    assert_eq!(generated, lines(&cfg.output.records));

    // A rerun finds everything done and sends nothing.
    let again = run(&cfg, &mut NoProgress).unwrap();
    assert_eq!(again.already_done, 6);
    assert_eq!(again.this_run.to_do, 0);
    assert_eq!(server.count(), 42);
    assert_eq!(again.total.kept, 6);
    let report_file: Value =
        serde_json::from_str(&std::fs::read_to_string(cfg.output.report_path()).unwrap()).unwrap();
    assert_eq!(report_file["total"]["kept"], 6);
}

#[test]
fn malformed_model_json_is_a_rejection() {
    let dir = tempfile::tempdir().unwrap();
    let server = FakeServer::start(|req, _| {
        let user = req.user();
        if req.step() == "instruction" && user.contains("[q01]") {
            completion("{\"instruction\": \"unterminated")
        } else if req.step() == "poison" && user.contains("[q02]") {
            completion("{\"negative_instruction\": \"NEG x\"}")
        } else {
            good_model(req, 0)
        }
    });
    let cfg = config(dir.path(), 4, &server.base_url, "");
    let report = run(&cfg, &mut NoProgress).unwrap();
    assert_invariants(&report);
    assert_eq!(report.total.kept, 2);
    assert_eq!(report.total.rejected_malformed, 2);
    let reasons = rejected_reasons(&cfg);
    assert_eq!(reasons["q01"].0, "malformed");
    assert!(
        reasons["q01"].1.contains("instruction step"),
        "{:?}",
        reasons["q01"]
    );
    assert!(
        reasons["q02"].1.contains("negative_query"),
        "{:?}",
        reasons["q02"]
    );
    // No further requests were spent on the rejected pairs: 1 and 2 requests.
    assert_eq!(server.count(), 2 * 7 + 1 + 2);
}

#[test]
fn newline_in_instruction_is_cut_and_over_long_is_rejected() {
    let dir = tempfile::tempdir().unwrap();
    let server = FakeServer::start(|req, _| {
        let user = req.user();
        if req.step() == "instruction" && user.contains("[q00]") {
            completion(
                &json!({"instruction": "Find a short answer about [q00]\nExplanation: I wrote this because"})
                    .to_string(),
            )
        } else if req.step() == "instruction" && user.contains("[q01]") {
            completion(&json!({"instruction": "x".repeat(601)}).to_string())
        } else if req.step() == "instruction" && user.contains("[q02]") {
            completion(&json!({"instruction": "\n\n   \n"}).to_string())
        } else {
            good_model(req, 0)
        }
    });
    let cfg = config(dir.path(), 3, &server.base_url, "");
    let report = run(&cfg, &mut NoProgress).unwrap();
    assert_invariants(&report);
    assert_eq!(report.total.kept, 1);
    assert_eq!(report.total.rejected_rule, 2);
    let set = read_jsonl(&cfg.output.records, ReadMode::Strict).unwrap();
    assert_eq!(
        &*set.records[0].instruction_positive,
        "Find a short answer about [q00]"
    );
    let reasons = rejected_reasons(&cfg);
    assert_eq!(reasons["q01"].0, "rule");
    assert!(
        reasons["q01"].1.contains("601 characters"),
        "{:?}",
        reasons["q01"]
    );
    assert!(reasons["q02"].1.contains("empty"), "{:?}", reasons["q02"]);
    // The cut instruction is what later prompts see.
    let poison = server
        .requests()
        .into_iter()
        .find(|r| r.step() == "poison" && r.user().contains("[q00]"))
        .unwrap();
    assert!(!poison.user().contains("Explanation"));
}

#[test]
fn rate_limit_then_success_is_retried() {
    let dir = tempfile::tempdir().unwrap();
    let server = FakeServer::start(|req, i| {
        if i < 2 {
            Reply::Http(
                429,
                vec![("Retry-After".into(), "0".into())],
                "{\"error\": {\"message\": \"slow down\"}}".into(),
            )
        } else {
            good_model(req, i)
        }
    });
    let cfg = config(dir.path(), 2, &server.base_url, "\n[quality]\nseed = 5\n");
    let mut cfg = cfg;
    cfg.client.concurrency = 1;
    let report = run(&cfg, &mut NoProgress).unwrap();
    assert_eq!(report.total.kept, 2);
    assert_eq!(report.generator_requests.rate_limited, 2);
    assert_eq!(report.generator_requests.retries, 2);
    assert_eq!(report.generator_requests.attempts, 8 + 2);
    assert_eq!(report.this_run.failed, 0);
}

#[test]
fn timeout_is_retried_and_persistent_timeouts_leave_pairs_for_later() {
    let dir = tempfile::tempdir().unwrap();
    // First request hangs past the 0.3 s timeout, the retry succeeds.
    let server = FakeServer::start(|req, i| {
        if i == 0 {
            Reply::Delay(Duration::from_millis(1500), Box::new(good_model(req, i)))
        } else {
            good_model(req, i)
        }
    });
    let mut cfg = config(dir.path(), 1, &server.base_url, "");
    cfg.client.timeout_secs = 0.3;
    let report = run(&cfg, &mut NoProgress).unwrap();
    assert_eq!(report.total.kept, 1);
    assert_eq!(report.generator_requests.timeouts, 1);
    assert_eq!(report.generator_requests.retries, 1);

    // A server that never answers in time: every pair fails, nothing is written.
    let dir = tempfile::tempdir().unwrap();
    let slow = FakeServer::start(|req, i| {
        Reply::Delay(Duration::from_millis(1000), Box::new(good_model(req, i)))
    });
    let mut cfg = config(dir.path(), 2, &slow.base_url, "");
    cfg.client.timeout_secs = 0.2;
    cfg.client.max_retries = 1;
    let report = run(&cfg, &mut NoProgress).unwrap();
    assert_eq!(report.this_run.failed, 2);
    assert_eq!(report.total.finished, 0);
    assert_eq!(report.remaining, 2);
    assert_eq!(report.generator_requests.timeouts, 4);
    assert!(
        report.failure_samples[0].contains("timed out"),
        "{:?}",
        report.failure_samples
    );
    assert!(finished(&cfg).is_empty());

    // The same output, pointed at a healthy server, finishes them.
    let good = FakeServer::start(good_model);
    cfg.generator.base_url = Some(good.base_url.clone());
    cfg.client.timeout_secs = 5.0;
    let report = run(&cfg, &mut NoProgress).unwrap();
    assert_eq!(report.total.kept, 2);
    assert_eq!(report.already_done, 0);
}

#[test]
fn invalid_judge_letter_is_a_rejection_not_a_crash() {
    let dir = tempfile::tempdir().unwrap();
    let server = FakeServer::start(|req, i| {
        let user = req.user();
        let (query, instruction) = judge_query_instruction(&user);
        if req.step() == "judgment" && query.contains("[q01]") && query.starts_with("NEGQ") {
            return completion("{\"answer\": \"Z\"}");
        }
        if req.step() == "judgment" && query.contains("[q02]") && instruction.starts_with("NEG") {
            return completion("I think it is probably B");
        }
        good_model(req, i)
    });
    let cfg = config(dir.path(), 3, &server.base_url, "");
    let report = run(&cfg, &mut NoProgress).unwrap();
    assert_invariants(&report);
    assert_eq!(
        report.total.kept,
        1,
        "{:?} {:?}",
        rejected_reasons(&cfg),
        report.failure_samples
    );
    assert_eq!(report.total.rejected_judge, 2);
    assert_eq!(report.this_run.failed, 0);
    let s = |sc: Scenario| report.scenarios[sc.index()];
    assert_eq!(s(Scenario::Positive).correct, 3);
    assert_eq!(s(Scenario::NegativeQuery).correct, 2);
    assert_eq!(s(Scenario::NegativeQuery).invalid_answers, 1);
    assert_eq!(s(Scenario::NegativeInstruction).invalid_answers, 1);
    assert!((s(Scenario::NegativeQuery).retention.unwrap() - 2.0 / 3.0).abs() < 1e-12);
    assert!((report.retention.unwrap() - 1.0 / 3.0).abs() < 1e-12);
    // Judge rejections are records: all three pairs are in the generated file (which the data
    // crate reads), with their verdicts; the rejected file holds none of them.
    assert!(lines(&cfg.output.rejected_path()).is_empty());
    let generated = lines(&cfg.output.generated_path());
    assert_eq!(generated.len(), 3);
    let set = read_jsonl(cfg.output.generated_path(), ReadMode::Strict).unwrap();
    assert_eq!(set.records.len(), 3);
    let judge_rejected: Vec<&Value> = generated
        .iter()
        .filter(|v| v["provenance"]["stage"] == "judge")
        .collect();
    assert_eq!(judge_rejected.len(), 2);
    for v in judge_rejected {
        assert_eq!(v["provenance"]["status"], "rejected");
        assert_eq!(v["provenance"]["judgments"].as_array().unwrap().len(), 3);
    }
    // All three scenarios are judged even after a wrong one (per-scenario retention needs it).
    assert_eq!(server.count(), 3 * 7);
}

#[test]
fn non_retryable_status_fails_once_and_server_errors_retry() {
    let dir = tempfile::tempdir().unwrap();
    let server =
        FakeServer::start(|_, _| Reply::Http(401, vec![], "{\"error\":\"bad key\"}".into()));
    let cfg = config(dir.path(), 2, &server.base_url, "");
    let report = run(&cfg, &mut NoProgress).unwrap();
    assert_eq!(report.this_run.failed, 2);
    assert_eq!(server.count(), 2);
    assert!(report.failure_samples[0].contains("401"));

    let dir = tempfile::tempdir().unwrap();
    let server = FakeServer::start(|req, i| {
        if i % 2 == 0 && i < 6 {
            Reply::Http(503, vec![], "overloaded".into())
        } else if i == 1 {
            // A 200 whose body is not a chat completion is retried too.
            Reply::Http(200, vec![], "<html>proxy error</html>".into())
        } else {
            good_model(req, i)
        }
    });
    let mut cfg = config(dir.path(), 1, &server.base_url, "");
    cfg.client.max_retries = 6;
    let report = run(&cfg, &mut NoProgress).unwrap();
    assert_eq!(report.total.kept, 1);
    assert_eq!(report.generator_requests.server_errors, 3);
    assert_eq!(report.generator_requests.malformed_responses, 1);
}

#[test]
fn budget_stops_the_run_and_a_rerun_completes_without_duplicates() {
    let dir = tempfile::tempdir().unwrap();
    let server = FakeServer::start(good_model);
    let mut cfg = config(dir.path(), 4, &server.base_url, "");
    cfg.client.concurrency = 1;
    cfg.client.request_budget = Some(10);
    let report = run(&cfg, &mut NoProgress).unwrap();
    assert!(report.budget_exhausted);
    assert_eq!(
        report.total.finished,
        1,
        "{report:#?} {:?}",
        rejected_reasons(&cfg)
    );
    assert_eq!(report.this_run.failed, 1);
    assert_eq!(server.count(), 10);
    assert_eq!(report.remaining, 3);

    cfg.client.request_budget = None;
    let report = run(&cfg, &mut NoProgress).unwrap();
    assert_eq!(report.already_done, 1);
    assert_eq!(report.total.kept, 4);
    assert_eq!(server.count(), 10 + 3 * 7);
    assert!(finished(&cfg).values().all(|n| *n == 1));
    assert_eq!(finished(&cfg).len(), 4);
}

#[test]
fn stop_after_then_resume_gives_each_pair_once() {
    let dir = tempfile::tempdir().unwrap();
    let server = FakeServer::start(|req, i| {
        if req.step() == "instruction" && req.user().contains("[q04]") {
            completion("not json")
        } else {
            good_model(req, i)
        }
    });
    let mut cfg = config(dir.path(), 8, &server.base_url, "");
    cfg.stop_after = Some(3);
    cfg.client.concurrency = 1;
    let first = run(&cfg, &mut NoProgress).unwrap();
    assert!(first.stopped_early);
    assert_eq!(first.total.finished, 3);
    cfg.stop_after = None;
    cfg.client.concurrency = 3;
    let second = run(&cfg, &mut NoProgress).unwrap();
    assert_eq!(second.already_done, 3);
    assert_eq!(second.total.finished, 8);
    assert_eq!(second.total.kept, 7);
    assert_eq!(second.total.rejected_malformed, 1);
    let f = finished(&cfg);
    assert_eq!(f.len(), 8);
    assert!(f.values().all(|n| *n == 1), "{f:?}");
    // Requests: 7 per finished pair plus 1 for the malformed one.
    assert_eq!(server.count(), 7 * 7 + 1);
}

#[test]
fn partial_last_line_is_dropped_on_resume() {
    let dir = tempfile::tempdir().unwrap();
    let server = FakeServer::start(good_model);
    let mut cfg = config(dir.path(), 3, &server.base_url, "");
    cfg.stop_after = Some(1);
    cfg.client.concurrency = 1;
    run(&cfg, &mut NoProgress).unwrap();
    // Simulate a crash in the middle of writing the next line.
    let mut text = std::fs::read_to_string(&cfg.output.records).unwrap();
    text.push_str("{\"query_positive\": \"half a li");
    std::fs::write(&cfg.output.records, text).unwrap();
    cfg.stop_after = None;
    let report = run(&cfg, &mut NoProgress).unwrap();
    assert_eq!(report.partial_lines_dropped, 1);
    assert_eq!(report.total.kept, 3);
    assert_eq!(
        read_jsonl(&cfg.output.records, ReadMode::Strict)
            .unwrap()
            .records
            .len(),
        3
    );

    // A complete but corrupt line is an error naming file and line, not silently skipped.
    let mut text = std::fs::read_to_string(&cfg.output.records).unwrap();
    text.push_str("{\"no_provenance\": 1}\n");
    std::fs::write(&cfg.output.records, text).unwrap();
    let err = run(&cfg, &mut NoProgress).unwrap_err().to_string();
    assert!(
        err.contains("records.jsonl") && err.contains("line 4"),
        "{err}"
    );
}

#[test]
fn results_do_not_depend_on_concurrency() {
    let run_with = |concurrency: usize| {
        let dir = tempfile::tempdir().unwrap();
        let server = FakeServer::start(good_model);
        let mut cfg = config(
            dir.path(),
            6,
            &server.base_url,
            "\n[quality]\nseed = 11\ndistractors = 3\n",
        );
        cfg.client.concurrency = concurrency;
        run(&cfg, &mut NoProgress).unwrap();
        let mut out: Vec<(String, Value)> = lines(&cfg.output.records)
            .into_iter()
            .map(|v| {
                (
                    v["provenance"]["source"]["query_id"]
                        .as_str()
                        .unwrap()
                        .to_string(),
                    v["provenance"]["judgments"].clone(),
                )
            })
            .collect();
        out.sort_by(|a, b| a.0.cmp(&b.0));
        let mut seeds: Vec<(String, u64)> = server
            .requests()
            .iter()
            .map(|r| (r.user(), r.body["seed"].as_u64().unwrap()))
            .collect();
        seeds.sort();
        (out, seeds)
    };
    let (a, sa) = run_with(1);
    let (b, sb) = run_with(4);
    assert_eq!(a, b);
    assert_eq!(sa, sb);
    // Shuffles differ across scenarios of a pair (not one fixed order).
    let orders: Vec<&Value> = a
        .iter()
        .flat_map(|(_, j)| j.as_array().unwrap().iter().map(|x| &x["options"]))
        .collect();
    assert!(orders.windows(2).any(|w| w[0] != w[1]));
}

#[test]
fn api_key_is_sent_and_quality_check_can_be_off() {
    let dir = tempfile::tempdir().unwrap();
    let server = FakeServer::start(good_model);
    let mut cfg = config(
        dir.path(),
        1,
        &server.base_url,
        "\n[quality]\nenabled = false\n",
    );
    cfg.generator.api_key = Some("sk-test-123".into());
    let report = run(&cfg, &mut NoProgress).unwrap();
    assert_eq!(report.total.kept, 1);
    assert!(report.judge_model.is_none());
    // Quality check off: only the 4 generator requests.
    assert_eq!(server.count(), 4);
    for r in server.requests() {
        assert_eq!(r.header("authorization"), Some("Bearer sk-test-123"));
    }
}

#[test]
fn progress_sees_every_pair() {
    struct Spy {
        started: Option<(u64, u64)>,
        updates: Vec<infembed_synth::RunCounts>,
        finished: bool,
    }
    impl infembed_synth::Progress for Spy {
        fn start(&mut self, to_do: u64, already_done: u64) {
            self.started = Some((to_do, already_done));
        }
        fn update(&mut self, counts: &infembed_synth::RunCounts) {
            self.updates.push(*counts);
        }
        fn finish(&mut self, _report: &SynthReport) {
            self.finished = true;
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let calls = std::sync::Arc::new(AtomicUsize::new(0));
    let c2 = calls.clone();
    let server = FakeServer::start(move |req, i| {
        c2.fetch_add(1, Ordering::SeqCst);
        if req.step() == "instruction" && req.user().contains("[q00]") {
            completion("garbage")
        } else {
            good_model(req, i)
        }
    });
    let cfg = config(dir.path(), 3, &server.base_url, "");
    let mut spy = Spy {
        started: None,
        updates: vec![],
        finished: false,
    };
    run(&cfg, &mut spy).unwrap();
    assert_eq!(spy.started, Some((3, 0)));
    assert_eq!(spy.updates.len(), 3);
    let last = spy.updates.last().unwrap();
    assert_eq!(
        (
            last.counts.kept,
            last.counts.rejected(),
            last.counts.generated
        ),
        (2, 1, 2)
    );
    assert!(spy.finished);
    let line = infembed_synth::StderrProgress::line(last, 1.0);
    assert!(
        line.contains("3/3") && line.contains("kept 2") && line.contains("rejected 1"),
        "{line}"
    );
    assert_eq!(calls.load(Ordering::SeqCst), server.count());
}

#[test]
fn grammar_mode_sends_a_gbnf_grammar_and_derived_token_budgets() {
    let dir = tempfile::tempdir().unwrap();
    let server = FakeServer::start(good_model);
    let extra =
        "\n[filter]\nmax_instruction_chars = 100\nmax_query_chars = 50\nmax_passage_chars = 300\n";
    let mut cfg = config(dir.path(), 2, &server.base_url, extra);
    cfg.generator.constrained_output = Some(infembed_synth::ConstrainedOutput::Grammar);
    cfg.judge.constrained_output = Some(infembed_synth::ConstrainedOutput::Grammar);
    let report = run(&cfg, &mut NoProgress).unwrap();
    assert_eq!(report.total.kept, 2);
    let reqs = server.requests();
    assert_eq!(reqs.len(), 14);
    for r in &reqs {
        assert!(r.body.get("response_format").is_none(), "{}", r.body);
        let g = r.body["grammar"].as_str().unwrap();
        assert!(g.contains("root ::= "), "{g}");
    }
    let by_step = |step: &str| reqs.iter().find(|r| r.step() == step).unwrap();
    // Budgets: 2 bytes per character (escapes) plus keys and punctuation, per field.
    let poison = by_step("poison");
    assert_eq!(
        poison.body["max_tokens"],
        8 + (2 * 100 + "negative_instruction".len() + 8) + (2 * 50 + "negative_query".len() + 8)
    );
    let g = poison.body["grammar"].as_str().unwrap();
    assert!(
        g.contains("v0 ::= \"\\\"\" first line-char{0,99} \"\\\"\""),
        "{g}"
    );
    assert!(
        g.contains("v1 ::= \"\\\"\" first line-char{0,49} \"\\\"\""),
        "{g}"
    );
    let p1 = by_step("negative_passage_1");
    assert!(
        p1.body["grammar"]
            .as_str()
            .unwrap()
            .contains("first text-char{0,299}")
    );
    let judge = by_step("judgment");
    assert_eq!(judge.body["max_tokens"], 24);
    assert!(
        judge.body["grammar"]
            .as_str()
            .unwrap()
            .contains(r#"("A" | "B" | "C" | "D")"#),
        "two pairs: P+, P1-, P2- and the one other passage"
    );
    assert_eq!(judge_options(&judge.user()).len(), 4);
}

#[test]
fn a_crash_between_the_two_writes_of_a_kept_record_is_repaired() {
    let dir = tempfile::tempdir().unwrap();
    let server = FakeServer::start(good_model);
    let cfg = config(dir.path(), 4, &server.base_url, "");
    run(&cfg, &mut NoProgress).unwrap();
    let all = std::fs::read_to_string(&cfg.output.records).unwrap();
    assert_eq!(all.lines().count(), 4);

    // The generated line was written, the records line was not.
    let first_three: String = all.lines().take(3).map(|l| format!("{l}\n")).collect();
    std::fs::write(&cfg.output.records, &first_three).unwrap();
    let report = run(&cfg, &mut NoProgress).unwrap();
    assert_eq!(report.repaired_lines, 1);
    assert_eq!(report.this_run.to_do, 0);
    assert_eq!(report.total.kept, 4);
    assert_eq!(server.count(), 4 * 7, "nothing was asked again");
    let mut got: Vec<String> = std::fs::read_to_string(&cfg.output.records)
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect();
    let mut want: Vec<String> = all.lines().map(str::to_string).collect();
    got.sort();
    want.sort();
    assert_eq!(got, want);

    // An output without a generated file (older layout) gets one from the records.
    std::fs::remove_file(cfg.output.generated_path()).unwrap();
    let report = run(&cfg, &mut NoProgress).unwrap();
    assert_eq!(report.repaired_lines, 4);
    assert_eq!(report.total.generated, 4);
    assert_eq!(finished(&cfg).len(), 4);
}

const CHILD_ENV: &str = "INFEMBED_SYNTH_FAKE_CHILD_CONFIG";

#[test]
fn sigkill_half_way_then_resume_loses_and_duplicates_nothing() {
    let dir = tempfile::tempdir().unwrap();
    // Slow replies so that the kill lands in the middle of the run.
    let server = FakeServer::start(|req, i| {
        Reply::Delay(Duration::from_millis(40), Box::new(good_model(req, i)))
    });
    let cfg_path = {
        let pairs = write_pairs(dir.path(), 8);
        write_config(dir.path(), &pairs, &server.base_url, "")
    };
    let cfg = SynthConfig::from_file(&cfg_path).unwrap();
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--ignored", "--exact", "sigkill_child", "--nocapture"])
        .env(CHILD_ENV, &cfg_path)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    // Complete lines only, and no consistency check: the child is writing meanwhile.
    let complete_lines = |cfg: &SynthConfig| {
        [cfg.output.generated_path(), cfg.output.rejected_path()]
            .iter()
            .map(|p| {
                std::fs::read(p)
                    .map(|b| b.iter().filter(|c| **c == b'\n').count())
                    .unwrap_or(0)
            })
            .sum::<usize>()
    };
    while complete_lines(&cfg) < 3 {
        assert!(
            child.try_wait().unwrap().is_none(),
            "the child ended before the kill"
        );
        assert!(
            std::time::Instant::now() < deadline,
            "the child made no progress"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    child.kill().unwrap(); // SIGKILL on Unix
    child.wait().unwrap();
    // The kill may land between the generated and the records write of a kept pair; the resume
    // repairs that (and `finished` below checks the files agree).
    let before = complete_lines(&cfg);
    assert!((3..8).contains(&before), "{before}");
    let report = run(&cfg, &mut NoProgress).unwrap();
    assert_eq!(report.already_done, before as u64);
    assert_eq!(report.total.kept, 8);
    let f = finished(&cfg);
    assert_eq!(f.len(), 8);
    assert!(f.values().all(|n| *n == 1), "{f:?}");
    assert_eq!(
        read_jsonl(&cfg.output.records, ReadMode::Strict)
            .unwrap()
            .records
            .len(),
        8
    );
}

/// The child half of the SIGKILL test: runs the pipeline for the config named in its
/// environment, until the parent kills it.
#[test]
#[ignore = "child half of the SIGKILL test; the parent test spawns it"]
fn sigkill_child() {
    let Some(path) = std::env::var_os(CHILD_ENV) else {
        eprintln!("SKIPPED: sigkill_child only runs when spawned by its parent test");
        return;
    };
    let cfg = SynthConfig::from_file(std::path::PathBuf::from(path)).unwrap();
    run(&cfg, &mut NoProgress).unwrap();
}
