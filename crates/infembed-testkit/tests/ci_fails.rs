//! The mechanism end to end, as cargo runs a test: this test binary runs its own `child` test in
//! a separate process with the model directory pointed at a folder that does not exist. Under
//! `CI=true` the child fails naming the model and how to get it; without CI it passes (skips),
//! prints `SKIPPED:` and appends exactly one line to the skip record.

use std::path::Path;
use std::process::{Command, Output};

const CHILD_ENV: &str = "INFEMBED_TESTKIT_CHILD";

/// Runs in a child process only (spawned below); in the parent's run it returns at once.
#[test]
fn child() {
    if std::env::var_os(CHILD_ENV).is_none() {
        return;
    }
    let dir = infembed_testkit::minilm_dir("testkit_child");
    assert!(dir.is_none(), "the model directory was pointed at nothing");
}

fn run_child(ci: &str, log: &Path, missing_model: &Path) -> Output {
    Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child", "--nocapture", "--test-threads", "1"])
        .env(CHILD_ENV, "1")
        .env("CI", ci)
        .env(infembed_testkit::SKIP_LOG_ENV, log)
        .env(infembed_testkit::MINILM_ENV, missing_model)
        .output()
        .unwrap()
}

#[test]
fn a_missing_model_fails_under_ci_and_skips_with_a_record_otherwise() {
    let tmp = std::env::temp_dir().join(format!("testkit-e2e-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp).unwrap();
    let log = tmp.join("skips.log");
    let missing = tmp.join("no-model-here");

    let out = run_child("true", &log, &missing);
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "CI=true must fail: {text}");
    assert!(text.contains("MISSING RESOURCE: testkit_child"), "{text}");
    assert!(text.contains("all-MiniLM-L6-v2"), "{text}");
    assert!(
        text.contains(&missing.join("model.safetensors").display().to_string()),
        "{text}"
    );
    assert!(text.contains("cargo xtask fetch-model"), "{text}");
    assert!(!log.exists(), "a failure is not recorded as a skip");

    let out = run_child("false", &log, &missing);
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "without CI the test skips: {text}");
    assert!(text.contains("SKIPPED: testkit_child"), "{text}");
    let record = std::fs::read_to_string(&log).unwrap();
    assert_eq!(record.lines().count(), 1, "{record}");
    assert!(
        record.starts_with("testkit_child\tthe model all-MiniLM-L6-v2 not found at "),
        "{record}"
    );
    std::fs::remove_dir_all(&tmp).unwrap();
}
