//! # infembed-testkit
//!
//! The one place where the workspace's tests and examples decide what happens when a resource
//! they need is absent: the all-MiniLM-L6-v2 directory, llama.cpp's server and its GGUF model,
//! the project's shared data (`../shared/data`, or `$INFEMBED_SHARED_DATA`), a system tool.
//!
//! - Under CI (`CI` set to a true value: anything but empty, `0`, `false`, `no`, `off`), a missing
//!   resource **fails** the test: it panics with a message naming what is missing, where it was
//!   looked for, and how to get it. A CI run cannot pass by skipping.
//! - Otherwise the test skips: it prints a `SKIPPED:` line on stderr and appends one line to the
//!   skip record ([`skip_log`]), which `cargo xtask skips` counts at the end of the README's test
//!   command (`N tests skipped: ...`), since `cargo test` hides the stderr of passing tests.
//!
//! Dev-only (`publish = false`): a dev-dependency of the crates whose tests need resources, and
//! of the examples. Standard library only.

use std::ffi::OsStr;
use std::io::Write;
use std::path::{Path, PathBuf};

/// The environment variable that says the run is CI (`CI=true`).
pub const CI_ENV: &str = "CI";
/// The environment variable that overrides where skips are recorded.
pub const SKIP_LOG_ENV: &str = "INFEMBED_SKIP_LOG";
/// The skip record's file name, in the build profile's folder (`target/debug/`).
pub const SKIP_LOG_NAME: &str = "infembed-skips.log";
/// The environment variable that overrides where the shared data lives.
pub const SHARED_DATA_ENV: &str = "INFEMBED_SHARED_DATA";
/// The environment variable that overrides where all-MiniLM-L6-v2 lives.
pub const MINILM_ENV: &str = "INFEMBED_MINILM_DIR";

/// Whether an environment value means "true" (`CI=true`, `CI=1`, `CI=yes`): present and not
/// empty, `0`, `false`, `no` or `off` (case-insensitive).
pub fn is_true(value: Option<&OsStr>) -> bool {
    let Some(v) = value else { return false };
    let v = v.to_string_lossy();
    let v = v.trim().to_ascii_lowercase();
    !matches!(v.as_str(), "" | "0" | "false" | "no" | "off")
}

/// Whether this run is CI (`CI` set to a true value, see [`is_true`]).
pub fn ci() -> bool {
    is_true(std::env::var_os(CI_ENV).as_deref())
}

/// The workspace root (two levels above this crate).
pub fn workspace_root() -> PathBuf {
    let here = Path::new(env!("CARGO_MANIFEST_DIR"));
    let root = here.join("../..");
    root.canonicalize().unwrap_or(root)
}

/// Where skips are recorded: `$INFEMBED_SKIP_LOG` when set and non-empty, else
/// `infembed-skips.log` in the build profile's folder of the running executable (a test binary
/// lives in `target/debug/deps/`, an example in `target/debug/examples/`: both give
/// `target/debug/infembed-skips.log`). `None` when neither can be worked out.
pub fn skip_log() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os(SKIP_LOG_ENV).filter(|v| !v.is_empty()) {
        return Some(PathBuf::from(p));
    }
    let exe = std::env::current_exe().ok()?;
    profile_dir_of(&exe).map(|d| d.join(SKIP_LOG_NAME))
}

/// The build profile's folder of an executable under `target/` (`target/debug` for
/// `target/debug/deps/x` and `target/debug/examples/x`; the executable's own folder otherwise).
pub fn profile_dir_of(exe: &Path) -> Option<PathBuf> {
    let dir = exe.parent()?;
    match dir.file_name().and_then(OsStr::to_str) {
        Some("deps" | "examples") => dir.parent().map(Path::to_path_buf),
        _ => Some(dir.to_path_buf()),
    }
}

/// A resource a test needs and could not find.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Missing {
    /// The test (or example) that needs it.
    pub test: String,
    /// What is missing, with where it was looked for.
    pub what: String,
    /// How to get it.
    pub fix: String,
}

impl Missing {
    /// A missing resource.
    pub fn new(test: &str, what: impl Into<String>, fix: impl Into<String>) -> Self {
        Missing {
            test: test.to_string(),
            what: what.into(),
            fix: fix.into(),
        }
    }

    /// The failure message under CI.
    pub fn failure(&self) -> String {
        format!(
            "MISSING RESOURCE: {}: {} ({}). CI is set, so a missing resource fails the test \
             instead of skipping it.",
            self.test, self.what, self.fix
        )
    }

    /// The skip line outside CI.
    pub fn skip_line(&self) -> String {
        format!("SKIPPED: {}: {} ({})", self.test, self.what, self.fix)
    }

    /// The line appended to the skip record: `test<TAB>what` (tabs and newlines in either are
    /// replaced by spaces).
    pub fn record_line(&self) -> String {
        let clean = |s: &str| s.replace(['\t', '\n', '\r'], " ");
        format!("{}\t{}\n", clean(&self.test), clean(&self.what))
    }

    /// Outside CI: prints [`Missing::skip_line`] and appends [`Missing::record_line`] to `log`
    /// (when given); returns `Ok(())`, and the caller skips. Under CI: returns
    /// `Err(`[`Missing::failure`]`)`, and the caller fails. [`skip_or_fail`] is this with the
    /// process's environment.
    ///
    /// # Errors
    /// The failure message when `ci` is true.
    pub fn resolve(&self, ci: bool, log: Option<&Path>) -> Result<(), String> {
        if ci {
            return Err(self.failure());
        }
        eprintln!("{}", self.skip_line());
        if let Some(log) = log {
            let appended = log
                .parent()
                .map_or(Ok(()), std::fs::create_dir_all)
                .and_then(|()| {
                    std::fs::OpenOptions::new()
                        .create(true)
                        .append(true)
                        .open(log)
                })
                // One write of one short line: appends from parallel test processes stay whole.
                .and_then(|mut f| f.write_all(self.record_line().as_bytes()));
            if let Err(e) = appended {
                eprintln!("(could not record the skip in {}: {e})", log.display());
            }
        }
        Ok(())
    }
}

/// Skips (outside CI: prints and records, see [`Missing::resolve`]) or fails (under CI: panics
/// with the message naming the resource and how to get it).
///
/// # Panics
/// Under CI, always: that is the point.
pub fn skip_or_fail(missing: &Missing) {
    if let Err(msg) = missing.resolve(ci(), skip_log().as_deref()) {
        panic!("{msg}");
    }
}

/// `Some(path)` when `path` exists, else skip-or-fail (see [`skip_or_fail`]) and `None`.
pub fn require(test: &str, path: PathBuf, what: &str, fix: &str) -> Option<PathBuf> {
    if path.exists() {
        Some(path)
    } else {
        skip_or_fail(&Missing::new(
            test,
            format!("{what} not found at {}", path.display()),
            fix,
        ));
        None
    }
}

/// The all-MiniLM-L6-v2 directory (`$INFEMBED_MINILM_DIR`, else `models/all-MiniLM-L6-v2` in
/// the workspace), or skip-or-fail when it holds no `model.safetensors`.
pub fn minilm_dir(test: &str) -> Option<PathBuf> {
    let dir = std::env::var_os(MINILM_ENV)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("models/all-MiniLM-L6-v2"));
    require(
        test,
        dir.join("model.safetensors"),
        "the model all-MiniLM-L6-v2",
        "run `cargo xtask fetch-model`, or set INFEMBED_MINILM_DIR",
    )
    .map(|_| dir)
}

/// Records that a test's wgpu device did not open (`problem` says why: the backend not compiled
/// in, or no adapter): a skip outside CI, a failure under `CI=true`. Returns `None`, for
/// `device().map_err(..).ok()`-style callers.
pub fn wgpu_missing<T>(test: &str, problem: &dyn std::fmt::Display) -> Option<T> {
    skip_or_fail(&Missing::new(
        test,
        format!("a wgpu device ({problem})"),
        "cargo xtask test builds with --features infembed/wgpu; install a Vulkan driver \
         (apt-get install -t bookworm-backports mesa-vulkan-drivers)",
    ));
    None
}

/// A model directory given by path (an example's argument), or skip-or-fail when it does not
/// exist.
pub fn require_model(test: &str, dir: &Path) -> Option<PathBuf> {
    require(
        test,
        dir.to_path_buf(),
        "the model directory",
        "run `cargo xtask fetch-model` for all-MiniLM-L6-v2, or pass an existing model directory",
    )
}

/// The cache `cargo xtask llama-server` fills: `$INFEMBED_CACHE_DIR`, else
/// `$XDG_CACHE_HOME/infembed`, else `~/.cache/infembed` (the rule of `xtask/src/llama.rs`).
pub fn cache_root() -> PathBuf {
    let var = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty());
    if let Some(d) = var("INFEMBED_CACHE_DIR") {
        return PathBuf::from(d);
    }
    if let Some(d) = var("XDG_CACHE_HOME") {
        return PathBuf::from(d).join("infembed");
    }
    PathBuf::from(var("HOME").unwrap_or_else(|| ".".into())).join(".cache/infembed")
}

/// llama.cpp's `llama-server` and the SmolLM2-135M-Instruct GGUF that `cargo xtask
/// llama-server` caches (`$INFEMBED_LLAMA_SERVER` / `$INFEMBED_LLAMA_MODEL` override them), or
/// skip-or-fail naming the first one missing.
pub fn llama_paths(test: &str) -> Option<(PathBuf, PathBuf)> {
    let from_env = |k: &str| {
        std::env::var_os(k)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    let server = from_env("INFEMBED_LLAMA_SERVER")
        .unwrap_or_else(|| cache_root().join("llama/bin/llama-server"));
    let model = from_env("INFEMBED_LLAMA_MODEL")
        .unwrap_or_else(|| cache_root().join("llama/models/SmolLM2-135M-Instruct.Q4_1.gguf"));
    let fix = "run `cargo xtask llama-server` (without INFEMBED_LLAMA_BUILD_DEADLINE, or with a \
               later one), or set INFEMBED_LLAMA_SERVER / INFEMBED_LLAMA_MODEL";
    let server = require(test, server, "llama.cpp's llama-server", fix)?;
    let model = require(test, model, "the GGUF model SmolLM2-135M-Instruct", fix)?;
    Some((server, model))
}

/// Where the project's shared data should be: `$INFEMBED_SHARED_DATA` when set and non-empty,
/// else `../shared/data` beside the workspace. The folder may not exist.
pub fn shared_data_candidate() -> PathBuf {
    match std::env::var_os(SHARED_DATA_ENV) {
        Some(v) if !v.is_empty() => PathBuf::from(v),
        _ => workspace_root().join("../shared/data"),
    }
}

/// The shared data folder ([`shared_data_candidate`]), or skip-or-fail when it does not exist.
pub fn shared_data_dir(test: &str) -> Option<PathBuf> {
    let dir = shared_data_candidate();
    if dir.is_dir() {
        Some(dir)
    } else {
        skip_or_fail(&Missing::new(
            test,
            format!("the shared data not found at {}", dir.display()),
            "put the project's shared data at ../shared/data beside the repository, or set \
             INFEMBED_SHARED_DATA",
        ));
        None
    }
}

/// Whether this processor has what infembed's bf16 kernels need (AVX-512 F, BW, VL and
/// AVX512-BF16), read from the standard library's own detection, and `INFEMBED_MAX_ISA`
/// (docs/int8.md) leaves them in; the tests of `--quantize bf16` check the refusal instead
/// where it is `false`.
pub fn cpu_has_avx512_bf16() -> bool {
    let capped = std::env::var("INFEMBED_MAX_ISA")
        .is_ok_and(|v| matches!(v.trim().to_ascii_lowercase().as_str(), "avx2" | "avx512"));
    if capped {
        return false;
    }
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512bw")
            && std::arch::is_x86_feature_detected!("avx512vl")
            && std::arch::is_x86_feature_detected!("avx512bf16")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// `true` when `program --version` starts, else skip-or-fail naming the program and `package`.
pub fn require_program(test: &str, program: &str, package: &str) -> bool {
    let found = std::process::Command::new(program)
        .arg("--version")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok();
    if !found {
        skip_or_fail(&Missing::new(
            test,
            format!("the program `{program}` not found on PATH"),
            format!("install {package}"),
        ));
    }
    found
}

/// Copies the files of `from`, and of its sub-directories, into `to` (created if needed):
/// tests edit copies of the vendored fixtures, never the fixtures themselves.
pub fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("create the copy's directory");
    for entry in std::fs::read_dir(from).expect("read the fixture directory") {
        let entry = entry.expect("fixture directory entry");
        let target = to.join(entry.file_name());
        if entry.file_type().expect("file type").is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).expect("copy a fixture file");
        }
    }
}

/// The largest absolute difference of `a` and `b`, relative to the largest magnitude in `a`
/// (at least `f32::MIN_POSITIVE`), for comparing a result with its reference.
///
/// # Panics
/// When the slices' lengths differ.
pub fn max_rel_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "different lengths");
    let scale = a.iter().fold(f32::MIN_POSITIVE, |m, x| m.max(x.abs()));
    a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs())) / scale
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ci_values() {
        for v in ["true", "TRUE", "1", "yes", " on "] {
            assert!(is_true(Some(OsStr::new(v))), "{v}");
        }
        for v in ["", "0", "false", "False", "no", "off"] {
            assert!(!is_true(Some(OsStr::new(v))), "{v}");
        }
        assert!(!is_true(None));
    }

    #[test]
    fn ci_fails_naming_the_resource_and_records_nothing() {
        let dir = std::env::temp_dir().join(format!("testkit-ci-{}", std::process::id()));
        let log = dir.join("skips.log");
        let m = Missing::new(
            "some_test",
            "the model all-MiniLM-L6-v2 not found at /x",
            "run it",
        );
        let err = m.resolve(true, Some(&log)).unwrap_err();
        assert!(err.contains("some_test"), "{err}");
        assert!(err.contains("all-MiniLM-L6-v2 not found at /x"), "{err}");
        assert!(err.contains("run it"), "{err}");
        assert!(!log.exists(), "a CI failure is not a skip");
    }

    #[test]
    fn outside_ci_a_skip_is_recorded_one_line_each() {
        let dir = std::env::temp_dir().join(format!("testkit-skip-{}", std::process::id()));
        let log = dir.join("nested/skips.log");
        let _ = std::fs::remove_dir_all(&dir);
        Missing::new("a", "thing\tone", "f")
            .resolve(false, Some(&log))
            .unwrap();
        Missing::new("b", "thing two", "f")
            .resolve(false, Some(&log))
            .unwrap();
        let text = std::fs::read_to_string(&log).unwrap();
        assert_eq!(text, "a\tthing one\nb\tthing two\n");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn profile_dir_of_tests_and_examples() {
        let t = Path::new("/w/target/debug");
        assert_eq!(profile_dir_of(&t.join("deps/x-123")).unwrap(), t);
        assert_eq!(profile_dir_of(&t.join("examples/embed_search")).unwrap(), t);
        assert_eq!(profile_dir_of(&t.join("infembed")).unwrap(), t);
    }
}
