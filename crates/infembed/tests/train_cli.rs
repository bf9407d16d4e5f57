//! `infembed train` end to end on the tiny random BERT fixture: a run killed with SIGKILL in
//! the middle and resumed with `--resume` ends with byte-identical weights to an
//! uninterrupted run; user mistakes give one-line errors naming the path.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_infembed")
}

fn tiny_bert() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../infembed-encoder/tests/fixtures/tiny-bert")
        .canonicalize()
        .unwrap()
}

const WORDS: [&str; 10] = [
    "cat", "dog", "ocean", "ships", "news", "world", "mat", "models", "hello", "recent",
];

fn words(seed: usize, n: usize) -> String {
    (0..n)
        .map(|i| WORDS[(seed * 3 + i * 7 + i * i) % WORDS.len()])
        .collect::<Vec<_>>()
        .join(" ")
}

fn write_data(path: &Path, n: usize) {
    let mut f = std::fs::File::create(path).unwrap();
    for i in 0..n {
        let v = serde_json::json!({
            "query_positive": words(i, 3),
            "instruction_positive": format!("find {}", words(i + 50, 2)),
            "document_positive": words(i + 100, 6),
            "query_negative": words(i + 150, 3),
            "instruction_negative": format!("find {}", words(i + 200, 2)),
            "hard_negative_document_1": words(i + 250, 5),
            "hard_negative_document_2": words(i + 300, 5),
        });
        writeln!(f, "{v}").unwrap();
    }
}

fn write_config(dir: &Path, name: &str, epochs: usize) -> PathBuf {
    let data = dir.join("train.jsonl");
    if !data.exists() {
        write_data(&data, 24);
    }
    let path = dir.join(format!("{name}.toml"));
    let text = format!(
        r#"model = {model:?}
output_dir = {out:?}
seed = 3
epochs = {epochs}

[data]
train = {data:?}

[encoder]
query_max_length = 40
passage_max_length = 64
encode_batch_size = 8

[optimizer]
lr = 1e-3

[batch]
records = 2

[eval]
at_start = false

[checkpoint]
every_steps = 1
keep = 2
"#,
        model = tiny_bert(),
        out = dir.join(name),
        data = data,
    );
    std::fs::write(&path, text).unwrap();
    path
}

#[test]
fn a_run_killed_in_its_first_epoch_resumes_to_the_uninterrupted_weights() {
    // 12 steps per epoch: killed after the checkpoint of step 5.
    killed_and_resumed_matches_uninterrupted(5, &[]);
}

#[test]
fn a_run_killed_in_a_later_epoch_resumes_to_the_uninterrupted_weights() {
    // Killed after the checkpoint of step 15: 3 steps into the second epoch.
    killed_and_resumed_matches_uninterrupted(15, &[]);
}

/// `--devices cpu,cpu` (two devices sharing each batch, docs/devices.md): killed with SIGKILL
/// and resumed on the same devices, the run ends with the uninterrupted run's weights.
#[test]
fn a_two_device_run_killed_and_resumed_ends_with_the_uninterrupted_weights() {
    killed_and_resumed_matches_uninterrupted(7, &["--devices", "cpu,cpu"]);
}

/// `--dtype bf16` (bf16 products on a CPU with AVX512-BF16): killed and resumed, the run ends
/// with the uninterrupted bf16 run's weights, bit for bit. Without the feature (or with
/// `INFEMBED_MAX_ISA=avx2`, which this test sets to play a Zen 3 on any machine), the command
/// fails in one line naming it, before it trains.
#[test]
fn a_bf16_run_killed_and_resumed_ends_with_the_uninterrupted_weights() {
    if infembed_testkit::cpu_has_avx512_bf16() {
        killed_and_resumed_matches_uninterrupted(7, &["--dtype", "bf16"]);
    } else {
        eprintln!("this processor has no AVX512-BF16: only the refusal is checked");
    }
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), "bf16", 1);
    let out = Command::new(bin())
        .args(["train", "--dtype", "bf16", "--config"])
        .arg(&config)
        .env("INFEMBED_MAX_ISA", "avx2")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    let errors: Vec<&str> = stderr.lines().filter(|l| l.starts_with("error:")).collect();
    assert_eq!(errors.len(), 1, "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(
        errors[0].contains("AVX512-BF16") && errors[0].contains("avx2"),
        "{stderr}"
    );
    assert!(!dir.path().join("bf16/checkpoints").exists(), "it trained");
}

fn killed_and_resumed_matches_uninterrupted(kill_at_step: usize, devices: &[&str]) {
    let dir = tempfile::tempdir().unwrap();
    // 24 records, 2 per batch: 12 steps per epoch.
    let epochs = 4;
    let whole = write_config(dir.path(), "whole", epochs);
    let out = Command::new(bin())
        .args(["train", "--config"])
        .arg(&whole)
        .args(devices)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let reference = std::fs::read(dir.path().join("whole/final/model.safetensors")).unwrap();

    let killed = write_config(dir.path(), "killed", epochs);
    let mut child = Command::new(bin())
        .args(["train", "--config"])
        .arg(&killed)
        .args(devices)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let target = dir
        .path()
        .join(format!("killed/checkpoints/step-{kill_at_step:08}"));
    let started = Instant::now();
    while !target.exists() {
        assert!(
            started.elapsed() < Duration::from_secs(300),
            "no checkpoint after 300 s"
        );
        assert!(child.try_wait().unwrap().is_none(), "the run ended early");
        std::thread::sleep(Duration::from_millis(2));
    }
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    assert!(
        !dir.path().join("killed/final").exists(),
        "the run finished before it was killed: the test did not interrupt it"
    );
    let out = Command::new(bin())
        .args(["train", "--resume", "--config"])
        .arg(&killed)
        .args(devices)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("resumed from"), "{stderr}");
    let resumed = std::fs::read(dir.path().join("killed/final/model.safetensors")).unwrap();
    assert_same_weights(&reference, &resumed, "resumed");
}

/// Two saved models hold the same tensors, bit for bit.
fn assert_same_weights(reference: &[u8], other: &[u8], what: &str) {
    // The header's key order may differ between writes: compare tensor by tensor, bit for bit.
    let a = safetensors::SafeTensors::deserialize(reference).unwrap();
    let b = safetensors::SafeTensors::deserialize(other).unwrap();
    let mut names = a.names();
    names.sort();
    let mut other = b.names();
    other.sort();
    assert_eq!(names, other);
    for name in names {
        let (x, y) = (a.tensor(name).unwrap(), b.tensor(name).unwrap());
        assert_eq!(x.shape(), y.shape(), "{name}");
        assert!(
            x.data() == y.data(),
            "{name}: {what} weights differ from the reference run"
        );
    }
}

#[test]
fn the_dashboard_on_a_terminal_trains_the_same_weights_as_plain_lines() {
    // util-linux `script` runs the binary on a pseudo-terminal: stdout and stderr are
    // terminals there, so `--progress dashboard` draws burn-train's dashboard.
    if !infembed_testkit::require_program(
        "the_dashboard_on_a_terminal_trains_the_same_weights_as_plain_lines",
        "script",
        "util-linux (`script` runs the binary on a pseudo-terminal)",
    ) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let plain = write_config(dir.path(), "plain", 1);
    let out = Command::new(bin())
        .args(["train", "--progress", "plain", "--config"])
        .arg(&plain)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("train step    12/12"), "{stderr}");

    let dash = write_config(dir.path(), "dash", 1);
    let command = format!(
        "stty cols 120 rows 40; {:?} train --progress dashboard --config {:?}",
        bin(),
        dash
    );
    let out = Command::new("script")
        .args(["--quiet", "--return", "--command", &command, "/dev/null"])
        .env("TERM", "xterm-256color")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let screen = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{screen}");
    // The dashboard switched to the alternate screen and back, and printed no plain step line.
    assert!(
        screen.contains("\u{1b}[?1049h"),
        "no dashboard drawn: {screen}"
    );
    assert!(
        screen.contains("\u{1b}[?1049l"),
        "terminal not restored: {screen}"
    );
    assert!(!screen.contains("train step    12/12"), "{screen}");
    assert!(screen.contains("model saved to"), "{screen}");
    assert_same_weights(
        &std::fs::read(dir.path().join("plain/final/model.safetensors")).unwrap(),
        &std::fs::read(dir.path().join("dash/final/model.safetensors")).unwrap(),
        "dashboard",
    );
}

fn fails_with(args: &[&str], needles: &[&str]) {
    let out = Command::new(bin()).args(args).output().unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    let errors: Vec<&str> = stderr.lines().filter(|l| l.starts_with("error:")).collect();
    assert_eq!(errors.len(), 1, "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    for n in needles {
        assert!(errors[0].contains(n), "`{n}` not in: {stderr}");
    }
}

#[test]
fn user_mistakes_are_one_line_errors() {
    let dir = tempfile::tempdir().unwrap();
    fails_with(
        &["train", "--config", "/nonexistent/train.toml"],
        &["/nonexistent/train.toml"],
    );
    let bad = dir.path().join("bad.toml");
    std::fs::write(
        &bad,
        "model = \"/nonexistent/model\"\noutput_dir = \"o\"\n[data]\ntrain = \"t.jsonl\"\n",
    )
    .unwrap();
    fails_with(
        &["train", "--config", bad.to_str().unwrap()],
        &["/nonexistent/model", "fetch-model"],
    );
    let typo = dir.path().join("typo.toml");
    std::fs::write(
        &typo,
        "model = \"m\"\noutput_dir = \"o\"\n[data]\ntrain = \"t\"\n[optimizer]\nlearning_rate = 1\n",
    )
    .unwrap();
    fails_with(
        &["train", "--config", typo.to_str().unwrap()],
        &["typo.toml", "learning_rate"],
    );
    let empty = dir.path().join("empty.jsonl");
    std::fs::write(&empty, "").unwrap();
    let cfg = dir.path().join("empty.toml");
    std::fs::write(
        &cfg,
        format!(
            "model = {:?}\noutput_dir = {:?}\n[data]\ntrain = {:?}\n",
            tiny_bert(),
            dir.path().join("o"),
            empty
        ),
    )
    .unwrap();
    fails_with(
        &["train", "--config", cfg.to_str().unwrap()],
        &["empty.jsonl", "no training record"],
    );
    // The dashboard needs a terminal (the test captures stdout and stderr).
    let data = dir.path().join("ok");
    std::fs::create_dir_all(&data).unwrap();
    let ok = write_config(&data, "ok", 1);
    fails_with(
        &[
            "train",
            "--progress",
            "dashboard",
            "--config",
            ok.to_str().unwrap(),
        ],
        &["dashboard", "terminals"],
    );
    fails_with(
        &["train", "--dtype", "f16", "--config", ok.to_str().unwrap()],
        &["dtype", "f16"],
    );
    fails_with(
        &["train", "--dtype", "f64", "--config", ok.to_str().unwrap()],
        &["f64", "f32, bf16 or f16"],
    );
    fails_with(
        &[
            "train",
            "--progress",
            "fancy",
            "--config",
            ok.to_str().unwrap(),
        ],
        &["fancy", "auto, plain or dashboard"],
    );
    // Devices: a backend not compiled in names its cargo feature; two devices need
    // Interaction I (the config's cross-attention would not do).
    if !infembed::DeviceSpec::Cuda(None).is_compiled() {
        fails_with(
            &[
                "train",
                "--device",
                "cuda",
                "--config",
                ok.to_str().unwrap(),
            ],
            &["cuda", "`cuda`"],
        );
    }
    let cross = data.join("cross.toml");
    let text = std::fs::read_to_string(&ok).unwrap().replace(
        "[optimizer]",
        "[encoder.interaction]\ntype = \"cross_attention\"\n\n[optimizer]",
    );
    std::fs::write(&cross, text).unwrap();
    fails_with(
        &[
            "train",
            "--devices",
            "cpu,cpu",
            "--config",
            cross.to_str().unwrap(),
        ],
        &["devices", "self_attention"],
    );
}
