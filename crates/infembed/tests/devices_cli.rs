//! `--device` as a user meets it: `infembed devices` lists what the build sees, a device whose
//! backend is not compiled in is a one-line error naming the cargo feature, and on a wgpu
//! device (Mesa's software Vulkan driver in CI) `embed` and `eval` give the CPU's numbers.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use infembed::{DeviceSpec, EmbeddingIndex};

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_infembed"))
}

fn run(cmd: &mut Command) -> Output {
    let out = cmd.output().expect("the infembed binary starts");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "panic: {stderr}");
    out
}

fn ok(out: &Output) -> String {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The one non-empty line of a failed command's stderr (asserting that it failed and said
/// exactly one line).
fn one_error_line(out: &Output) -> String {
    assert!(!out.status.success(), "the command succeeded");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "{stderr}");
    lines[0].to_string()
}

fn root() -> PathBuf {
    infembed_testkit::workspace_root()
}

fn tiny_bert() -> PathBuf {
    root().join("crates/infembed-encoder/tests/fixtures/tiny-bert")
}

/// Whether this build and machine open a wgpu device; a skip (a failure under `CI=true`) when
/// they do not.
fn wgpu_available(test: &str) -> bool {
    match DeviceSpec::Wgpu(None).device() {
        Ok(_) => true,
        Err(e) => infembed_testkit::wgpu_missing::<()>(test, &e).is_some(),
    }
}

#[test]
fn devices_lists_the_cpu_and_names_the_features_of_missing_backends() {
    let stdout = ok(&run(bin().arg("devices")));
    let first = stdout.lines().next().unwrap();
    assert!(first.starts_with("cpu"), "{stdout}");
    for spec in [DeviceSpec::Wgpu(None), DeviceSpec::Cuda(None)] {
        let feature = spec.feature().unwrap();
        let named = stdout
            .lines()
            .any(|l| l.starts_with(feature) && l.contains(&format!("`{feature}`")));
        assert_eq!(named, !spec.is_compiled(), "{spec}: {stdout}");
    }
    // The last two lines say whether this build fuses operations and autotunes kernels on GPU
    // devices.
    let lines: Vec<&str> = stdout.lines().collect();
    let tail = &lines[lines.len() - 2..];
    for (line, name, compiled) in [
        (tail[0], "fusion", cfg!(feature = "fusion")),
        (tail[1], "autotune", cfg!(feature = "autotune")),
    ] {
        assert!(line.starts_with(name), "{stdout}");
        assert_eq!(line.contains("not in this build"), !compiled, "{stdout}");
    }
}

#[test]
fn a_device_not_compiled_in_or_malformed_is_a_one_line_error() {
    let dir = tempfile::tempdir().unwrap();
    let corpus = root().join("examples/data/corpus.jsonl");
    let out_file = dir.path().join("e.npy");
    let embed = |option: &str, value: &str| {
        run(bin()
            .args(["embed", "--model"])
            .arg(tiny_bert())
            .arg("--input")
            .arg(&corpus)
            .arg("--output")
            .arg(&out_file)
            .args([option, value]))
    };
    let cuda = DeviceSpec::Cuda(Some(0));
    if !cuda.is_compiled() {
        let line = one_error_line(&embed("--device", "cuda:0"));
        assert!(line.contains("cuda:0") && line.contains("`cuda`"), "{line}");
        assert!(!out_file.exists(), "nothing is written");
    }
    let out = embed("--device", "tpu");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("unknown device"), "{stderr}");
    let out = embed("--dtype", "bf16");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("f32"));
}

fn embed_on(device: &str, model: &Path, input: &Path, output: &Path) -> EmbeddingIndex {
    embed_in(device, "f32", model, input, output)
}

fn embed_in(
    device: &str,
    dtype: &str,
    model: &Path,
    input: &Path,
    output: &Path,
) -> EmbeddingIndex {
    ok(&run(&mut embed_command(
        device, dtype, model, input, output,
    )));
    EmbeddingIndex::load(output).unwrap()
}

/// `infembed embed` of `input` with `model` on `device` in `dtype`, writing `output`.
fn embed_command(device: &str, dtype: &str, model: &Path, input: &Path, output: &Path) -> Command {
    let mut cmd = bin();
    cmd.args(["embed", "--model"])
        .arg(model)
        .arg("--input")
        .arg(input)
        .arg("--output")
        .arg(output)
        .args(["--device", device, "--dtype", dtype]);
    cmd
}

fn max_abs_diff(a: &EmbeddingIndex, b: &EmbeddingIndex) -> f32 {
    assert_eq!(a.ids, b.ids);
    assert_eq!(a.dim, b.dim);
    let (a, b) = (a.embeddings(), b.embeddings());
    a.iter()
        .zip(b.iter())
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// 40 shipped passages (the first distractors of the InF-IR sample) through
/// all-MiniLM-L6-v2 on wgpu and on the CPU.
#[test]
fn embed_on_wgpu_equals_the_cpu_with_minilm() {
    let test = "embed_on_wgpu_equals_the_cpu_with_minilm";
    let Some(model) = infembed_testkit::minilm_dir(test) else {
        return;
    };
    if !wgpu_available(test) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("passages.jsonl");
    let shipped =
        std::fs::read_to_string(root().join("data/inf-ir-sample/distractors.jsonl")).unwrap();
    let lines: Vec<String> = shipped
        .lines()
        .take(40)
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            serde_json::json!({"id": v["passage_id"], "text": v["passage"]}).to_string()
        })
        .collect();
    assert_eq!(lines.len(), 40);
    std::fs::write(&input, lines.join("\n")).unwrap();
    let cpu = embed_on("cpu", &model, &input, &dir.path().join("cpu.npy"));
    let gpu = embed_on("wgpu", &model, &input, &dir.path().join("gpu.npy"));
    let diff = max_abs_diff(&cpu, &gpu);
    eprintln!("MiniLM, 40 passages: wgpu vs cpu max abs diff {diff:e}");
    assert!(diff < 1e-5, "wgpu vs cpu: {diff}");
}

/// `--dtype f16` on wgpu computes in half precision: the weights are cast to f16 at load, the
/// padded batch (texts of different lengths) pools to finite unit vectors, and they differ
/// from the CPU's f32 embeddings (so the half type was really used) by less than 5e-3.
/// `--dtype bf16` is refused in one line, naming the device: WGSL has no bf16.
#[test]
fn embed_in_half_precision_on_wgpu_is_close_to_the_cpu() {
    if !wgpu_available("embed_in_half_precision_on_wgpu_is_close_to_the_cpu") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let input = root().join("examples/data/corpus.jsonl");
    let cpu = embed_on("cpu", &tiny_bert(), &input, &dir.path().join("cpu.npy"));
    let half = embed_in(
        "wgpu",
        "f16",
        &tiny_bert(),
        &input,
        &dir.path().join("f16.npy"),
    );
    let diff = max_abs_diff(&cpu, &half);
    eprintln!(
        "tiny BERT, {} texts: wgpu f16 vs cpu f32 max abs diff {diff:e}",
        cpu.ids.len()
    );
    assert!(diff > 0.0 && diff < 5e-3, "f16 vs f32: {diff}");
    for i in 0..half.ids.len() {
        let norm: f32 = half.row(i).iter().map(|x| x * x).sum::<f32>().sqrt();
        assert!((norm - 1.0).abs() < 1e-2, "row {i}: norm {norm}");
    }
    let out = run(&mut embed_command(
        "wgpu",
        "bf16",
        &tiny_bert(),
        &input,
        &dir.path().join("bf16.npy"),
    ));
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    // Mesa's software driver prints its own `EGL 'eglInitialize' ...` lines when wgpu probes
    // the GL backend; the rest is infembed's.
    let lines: Vec<&str> = stderr
        .lines()
        .filter(|l| !l.trim().is_empty() && !l.starts_with("EGL "))
        .collect();
    assert_eq!(lines.len(), 1, "{stderr}");
    assert!(
        lines[0].contains("wgpu") && lines[0].contains("bf16"),
        "{stderr}"
    );
    assert!(!dir.path().join("bf16.npy").exists());
}

/// `infembed eval --device wgpu` of the tiny model on the InF-IR sample's held-out test gives
/// the CPU's metrics.
#[test]
fn eval_on_wgpu_gives_the_cpu_metrics() {
    if !wgpu_available("eval_on_wgpu_gives_the_cpu_metrics") {
        return;
    }
    let eval = |device: &str| -> serde_json::Value {
        let stdout = ok(&run(bin()
            .args(["eval", "--data"])
            .arg(root().join("data/inf-ir-sample/dev.jsonl"))
            .arg("--model")
            .arg(tiny_bert())
            .args(["--json", "--device", device])));
        serde_json::from_str(&stdout).unwrap()
    };
    let (cpu, gpu) = (eval("cpu"), eval("wgpu"));
    let mut compared = 0;
    compare(&cpu, &gpu, "", &mut compared);
    assert!(compared >= 4, "{cpu}");
}

/// Every number of `a` equals the one at the same place in `b` to 1e-4; names where.
fn compare(a: &serde_json::Value, b: &serde_json::Value, at: &str, n: &mut usize) {
    use serde_json::Value;
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => {
            let (x, y) = (x.as_f64().unwrap(), y.as_f64().unwrap());
            assert!((x - y).abs() <= 1e-4, "{at}: cpu {x} vs wgpu {y}");
            *n += 1;
        }
        (Value::Object(x), Value::Object(y)) => {
            for (k, v) in x {
                let w = y
                    .get(k)
                    .unwrap_or_else(|| panic!("{at}.{k} missing on wgpu"));
                if !k.contains("seconds") && k != "evaluation_time" {
                    compare(v, w, &format!("{at}.{k}"), n);
                }
            }
        }
        (Value::Array(x), Value::Array(y)) => {
            assert_eq!(x.len(), y.len(), "{at}");
            for (i, (v, w)) in x.iter().zip(y).enumerate() {
                compare(v, w, &format!("{at}[{i}]"), n);
            }
        }
        _ => assert_eq!(a, b, "{at}"),
    }
}

/// By default the linear layers' products go to this project's blocked kernel (`blocked_split`,
/// which does not split products as small as the tiny model's), `--matmul
/// naive` sends them to cubek's naive routine, and `--matmul burn` to burn's own `matmul`:
/// cubecl's own kernel log shows each kernel (and not the others'), and the embeddings equal
/// the CPU's. The LayerNorms run as this project's one kernel in every case. On the CPU,
/// `--matmul burn` gives the CPU's embeddings bit for bit, any other routine is a one-line
/// error; an unknown name lists the names.
#[test]
fn embed_through_a_chosen_matmul_routine_equals_the_cpu() {
    if !wgpu_available("embed_through_a_chosen_matmul_routine_equals_the_cpu") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let input = root().join("examples/data/corpus.jsonl");
    let cpu = embed_on("cpu", &tiny_bert(), &input, &dir.path().join("cpu.npy"));
    let naive_kernel = "batch::naive::";
    let kernels_with = |matmul: Option<&str>, name: &str| {
        let log = dir.path().join(format!("{name}.log"));
        let mut cmd = embed_command(
            "wgpu",
            "f32",
            &tiny_bert(),
            &input,
            &dir.path().join(format!("{name}.npy")),
        );
        if let Some(m) = matmul {
            cmd.args(["--matmul", m]);
        }
        cmd.env("CUBECL_DEBUG_LOG", &log)
            .env("CUBECL_DEBUG_OPTION", "profile");
        ok(&run(&mut cmd));
        let kernels = std::fs::read_to_string(&log).expect("cubecl's kernel log");
        let index = EmbeddingIndex::load(dir.path().join(format!("{name}.npy"))).unwrap();
        (kernels, index)
    };
    let blocked_kernel = "blocked_matmul";
    let (burn_log, _) = kernels_with(Some("burn"), "burn");
    for kernel in [naive_kernel, blocked_kernel] {
        assert!(
            !burn_log.contains(kernel),
            "burn's own matmul took the {kernel} kernel"
        );
    }
    let (naive_log, naive) = kernels_with(Some("naive"), "naive");
    assert!(
        naive_log.contains(naive_kernel),
        "no naive matmul kernel in cubecl's log"
    );
    let diff = max_abs_diff(&cpu, &naive);
    eprintln!("tiny BERT through cubek's naive routine vs cpu: max abs diff {diff:e}");
    assert!(diff < 1e-5, "naive routine vs cpu: {diff}");
    let (default_log, blocked) = kernels_with(None, "default");
    assert!(
        default_log.contains(blocked_kernel) && !default_log.contains(naive_kernel),
        "the default run did not take the blocked kernel alone"
    );
    // and its LayerNorms are one kernel each (ops::cube_norm), whatever the routine
    for (routine, log) in [
        ("blocked", &default_log),
        ("burn", &burn_log),
        ("naive", &naive_log),
    ] {
        assert!(
            log.contains("layer_norm_rows"),
            "{routine}: no one-kernel LayerNorm in cubecl's log"
        );
    }
    let diff = max_abs_diff(&cpu, &blocked);
    eprintln!("tiny BERT through the blocked kernel (the default) vs cpu: max abs diff {diff:e}");
    assert!(diff < 1e-5, "blocked kernel vs cpu: {diff}");

    let mut on_cpu = embed_command(
        "cpu",
        "f32",
        &tiny_bert(),
        &input,
        &dir.path().join("c.npy"),
    );
    let line = one_error_line(&run(on_cpu.args(["--matmul", "naive"])));
    assert!(line.contains("naive") && line.contains("GPU"), "{line}");
    assert!(!dir.path().join("c.npy").exists());
    // `burn` names the products the CPU computes anyway: accepted there
    let cpu_burn = dir.path().join("cb.npy");
    let mut burn_on_cpu = embed_command("cpu", "f32", &tiny_bert(), &input, &cpu_burn);
    ok(&run(burn_on_cpu.args(["--matmul", "burn"])));
    let diff = max_abs_diff(&cpu, &EmbeddingIndex::load(&cpu_burn).unwrap());
    assert!(
        diff == 0.0,
        "--matmul burn changed the CPU's embeddings by {diff}"
    );
    let mut unknown = embed_command(
        "wgpu",
        "f32",
        &tiny_bert(),
        &input,
        &dir.path().join("u.npy"),
    );
    let out = run(unknown.args(["--matmul", "double-unit"]));
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("double_unit") && stderr.contains("simple_cyclic_cmma"),
        "{stderr}"
    );
}

/// `matmul = "naive"` in a training config: two optimizer steps of the tiny BERT on wgpu run
/// their linear layers' products (forward and backward) in cubek's naive kernel, which
/// cubecl's own kernel log shows, and save the model.
#[test]
fn training_through_a_chosen_matmul_routine_launches_its_kernel() {
    if !wgpu_available("training_through_a_chosen_matmul_routine_launches_its_kernel") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("train.toml");
    let text = format!(
        "model = {model:?}\noutput_dir = {out:?}\nseed = 1\nepochs = 1\nmax_steps = 2\n\
         matmul = \"naive\"\n\n[data]\ntrain = {data:?}\n\n[encoder]\nquery_max_length = 48\n\
         passage_max_length = 64\n\n[batch]\nrecords = 2\n\n[eval]\nat_start = false\n",
        model = tiny_bert(),
        out = dir.path().join("run"),
        data = root().join("examples/data/tiny-train.jsonl"),
    );
    std::fs::write(&config, text).unwrap();
    let log = dir.path().join("kernels.log");
    ok(&run(bin()
        .args(["train", "--config"])
        .arg(&config)
        .args(["--device", "wgpu", "--progress", "plain"])
        .env("CUBECL_DEBUG_LOG", &log)
        .env("CUBECL_DEBUG_OPTION", "profile")));
    let kernels = std::fs::read_to_string(&log).expect("cubecl's kernel log");
    assert!(
        kernels.contains("batch::naive::"),
        "no naive matmul kernel in cubecl's log of the training run"
    );
    assert!(
        dir.path().join("run/final").is_dir(),
        "the trained model was saved"
    );
}

#[test]
fn the_matmul_probe_needs_a_gpu_device_and_says_so_in_one_line() {
    let out = run(bin().args(["devices", "--probe-matmul", "cpu"]));
    let line = one_error_line(&out);
    let feature = if !DeviceSpec::Wgpu(None).is_compiled() {
        "`wgpu`"
    } else if cfg!(feature = "fusion") {
        "`fusion`"
    } else {
        "GPU devices"
    };
    assert!(line.contains(feature), "{line}");
    assert!(out.stdout.is_empty(), "no listing is printed");
}

/// `infembed devices --probe-matmul wgpu`: every routine that runs gives the product that the
/// host computes in f64 (within its precision's rounding), burn's own, cubek's SIMT routine and
/// this project's blocked kernel run in both precisions, the f16 rows really compute in f16
/// (their error is that of f16 operands, far above f32's), and a routine the device cannot
/// run is reported as unavailable, not as a failure.
#[test]
fn the_matmul_probe_times_routines_that_agree_with_the_host_product() {
    if !wgpu_available("the_matmul_probe_times_routines_that_agree_with_the_host_product") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("probe.json");
    let stdout = ok(&run(bin()
        .args([
            "devices",
            "--probe-matmul",
            "wgpu",
            "--tokens",
            "64",
            "--repeats",
            "1",
        ])
        .args([
            "--routines",
            "burn,auto,simple_unit,blocked,simple_cyclic_cmma",
        ])
        .arg("--json")
        .arg(&json)));
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let rows = report["rows"].as_array().unwrap();
    // 6 products, 5 routines, 2 precisions
    assert_eq!(rows.len(), 6 * 5 * 2, "{stdout}");
    let mut f16_err: f64 = 0.0;
    for row in rows {
        let (routine, precision) = (
            row["routine"].as_str().unwrap(),
            row["precision"].as_str().unwrap(),
        );
        let status = row["outcome"]["status"].as_str().unwrap();
        let what = format!("{routine} {precision} {}: {row}", row["case"]);
        if routine == "simple_cyclic_cmma" {
            assert_ne!(status, "failed", "{what}");
        } else {
            assert_eq!(status, "ran", "{what}");
        }
        if status != "ran" {
            continue;
        }
        let err = row["outcome"]["rel_err"].as_f64().unwrap();
        let tolerance = if precision == "f32" { 1e-5 } else { 1e-2 };
        assert!(err <= tolerance, "{what}");
        assert!(row["outcome"]["ms"].as_f64().unwrap() > 0.0, "{what}");
        if precision == "f16" {
            f16_err = f16_err.max(err);
        }
    }
    assert!(
        f16_err > 1e-4,
        "the f16 rows computed in f32 (largest error {f16_err})"
    );
    assert!(stdout.contains("simple_unit"), "{stdout}");
}
