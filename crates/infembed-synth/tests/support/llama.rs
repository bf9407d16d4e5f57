//! Test support for the real local server: where `cargo xtask llama-server` put llama.cpp's
//! `llama-server` and the SmolLM2-135M-Instruct GGUF, and a server process on a free loopback
//! port, killed when dropped. Standard library only, so other crates' tests can include it.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The cache `cargo xtask llama-server` fills (same rule as `xtask/src/llama.rs`).
pub fn cache_root() -> PathBuf {
    if let Some(d) = std::env::var_os("INFEMBED_CACHE_DIR").filter(|v| !v.is_empty()) {
        return PathBuf::from(d);
    }
    if let Some(d) = std::env::var_os("XDG_CACHE_HOME").filter(|v| !v.is_empty()) {
        return PathBuf::from(d).join("infembed");
    }
    PathBuf::from(std::env::var_os("HOME").unwrap_or_else(|| ".".into())).join(".cache/infembed")
}

/// The server binary and the model, or `None` (with a loud `SKIPPED:` line) when absent.
/// `INFEMBED_LLAMA_SERVER` / `INFEMBED_LLAMA_MODEL` override the cache paths.
pub fn llama_paths() -> Option<(PathBuf, PathBuf)> {
    let from_env = |k: &str| {
        std::env::var_os(k)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    let server = from_env("INFEMBED_LLAMA_SERVER")
        .unwrap_or_else(|| cache_root().join("llama/bin/llama-server"));
    let model = from_env("INFEMBED_LLAMA_MODEL")
        .unwrap_or_else(|| cache_root().join("llama/models/SmolLM2-135M-Instruct.Q4_1.gguf"));
    for p in [&server, &model] {
        if !p.is_file() {
            eprintln!(
                "SKIPPED: {} not found (run `cargo xtask llama-server`, or set \
                 INFEMBED_LLAMA_SERVER / INFEMBED_LLAMA_MODEL)",
                p.display()
            );
            return None;
        }
    }
    Some((server, model))
}

/// `collections/msmarco-subset` of the shared data, or `None` with a loud `SKIPPED:` line.
/// `repo_root` is the workspace root.
pub fn msmarco(repo_root: &Path) -> Option<PathBuf> {
    match infembed_data::shared_data_dir(repo_root) {
        Some(d) => Some(d.join("collections/msmarco-subset")),
        None => {
            eprintln!(
                "SKIPPED: shared data not found at {} (set INFEMBED_SHARED_DATA)",
                infembed_data::shared_data_candidate(repo_root).display()
            );
            None
        }
    }
}

/// A running `llama-server` (`-t 1 -np 1 -c 4096`), killed when dropped.
pub struct LlamaServer {
    child: Child,
    /// `http://127.0.0.1:PORT/v1`.
    pub base_url: String,
    log: PathBuf,
}

/// The status code of `GET path` on 127.0.0.1:`port`, if the server answered.
fn http_get_status(port: u16, path: &str) -> Option<u16> {
    let mut s = TcpStream::connect_timeout(
        &std::net::SocketAddr::from(([127, 0, 0, 1], port)),
        Duration::from_secs(2),
    )
    .ok()?;
    s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut head = [0u8; 12];
    s.read_exact(&mut head).ok()?;
    std::str::from_utf8(&head[9..12]).ok()?.parse().ok()
}

impl LlamaServer {
    /// Starts the server on a free port, logging to `log_dir/llama-server.log`, and waits (up
    /// to 120 s) for `GET /health` to answer 200.
    pub fn start(server: &Path, model: &Path, log_dir: &Path) -> Self {
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let log = log_dir.join("llama-server.log");
        let log_file = std::fs::File::create(&log).unwrap();
        let child = Command::new(server)
            .args(["-m", &model.to_string_lossy(), "--host", "127.0.0.1"])
            .args(["--port", &port.to_string()])
            .args(["-t", "1", "-np", "1", "-c", "4096"])
            .stdin(Stdio::null())
            .stdout(log_file.try_clone().unwrap())
            .stderr(log_file)
            .spawn()
            .expect("start llama-server");
        let mut s = LlamaServer {
            child,
            base_url: format!("http://127.0.0.1:{port}/v1"),
            log,
        };
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            if let Ok(Some(status)) = s.child.try_wait() {
                panic!("llama-server exited ({status}): {}", s.log_text());
            }
            if http_get_status(port, "/health") == Some(200) {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "llama-server not healthy after 120 s: {}",
                s.log_text()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        s
    }

    /// The server's log so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for LlamaServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
