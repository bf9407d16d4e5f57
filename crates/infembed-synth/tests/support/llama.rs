//! Test support for the real local server: where `cargo xtask llama-server` put llama.cpp's
//! `llama-server` and the SmolLM2-135M-Instruct GGUF (found by `infembed-testkit`, which skips
//! or, under `CI=true`, fails when they are absent), and a server process on a free loopback
//! port, killed when dropped. Other crates' tests include it (with `infembed-testkit` as a
//! dev-dependency).

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The server binary and the model; when absent, `None` after a recorded skip, or a failure
/// under `CI=true` (`infembed_testkit::llama_paths`).
pub fn llama_paths(test: &str) -> Option<(PathBuf, PathBuf)> {
    infembed_testkit::llama_paths(test)
}

/// The vendored `data/msmarco-subset` (BEIR layout); `repo_root` is the workspace root.
pub fn msmarco(repo_root: &Path) -> PathBuf {
    repo_root.join("data/msmarco-subset")
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
