//! Test support: a tiny scripted HTTP/1.1 server on 127.0.0.1 (one thread per connection,
//! `Connection: close`), and a fake "model" that answers the pipeline's steps sensibly.
#![allow(dead_code)]

pub mod llama;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use serde_json::{Value, json};

/// One request the server received.
#[derive(Debug, Clone)]
pub struct Received {
    /// Request path.
    pub path: String,
    /// Lower-cased header names and values.
    pub headers: Vec<(String, String)>,
    /// The JSON body (Null when not JSON).
    pub body: Value,
}

impl Received {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    /// The pipeline step: the JSON schema's name, or the `# infembed step: NAME` comment that
    /// starts a grammar.
    pub fn step(&self) -> String {
        if let Some(name) = self.body["response_format"]["json_schema"]["name"].as_str() {
            return name.to_string();
        }
        self.body["grammar"]
            .as_str()
            .and_then(|g| g.lines().next())
            .and_then(|l| l.strip_prefix("# infembed step: "))
            .unwrap_or("")
            .to_string()
    }

    /// The user message.
    pub fn user(&self) -> String {
        self.body["messages"]
            .as_array()
            .and_then(|m| m.iter().find(|m| m["role"] == "user"))
            .and_then(|m| m["content"].as_str())
            .unwrap_or("")
            .to_string()
    }
}

/// A scripted reply.
#[derive(Debug, Clone)]
pub enum Reply {
    /// Status, extra headers, body.
    Http(u16, Vec<(String, String)>, String),
    /// Wait, then reply.
    Delay(Duration, Box<Reply>),
}

/// A 200 chat completion whose content is `content`.
pub fn completion(content: &str) -> Reply {
    Reply::Http(
        200,
        vec![],
        json!({
            "id": "x",
            "object": "chat.completion",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": content},
                          "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
        })
        .to_string(),
    )
}

pub type Handler = dyn Fn(&Received, usize) -> Reply + Send + Sync;

/// The server; stops when dropped.
pub struct FakeServer {
    pub base_url: String,
    pub received: Arc<Mutex<Vec<Received>>>,
    stop: Arc<AtomicBool>,
    port: u16,
    accept: Option<JoinHandle<()>>,
}

impl FakeServer {
    /// Starts a server whose replies come from `handler(request, index)`, `index` counting all
    /// requests from 0.
    pub fn start(handler: impl Fn(&Received, usize) -> Reply + Send + Sync + 'static) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind loopback");
        let port = listener.local_addr().unwrap().port();
        let received = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let handler: Arc<Handler> = Arc::new(handler);
        let counter = Arc::new(AtomicUsize::new(0));
        let accept = {
            let (received, stop) = (received.clone(), stop.clone());
            std::thread::spawn(move || {
                for stream in listener.incoming() {
                    if stop.load(Ordering::SeqCst) {
                        break;
                    }
                    let Ok(stream) = stream else { continue };
                    let (received, handler, counter) =
                        (received.clone(), handler.clone(), counter.clone());
                    std::thread::spawn(move || {
                        serve(stream, &received, &*handler, &counter);
                    });
                }
            })
        };
        FakeServer {
            base_url: format!("http://127.0.0.1:{port}/v1"),
            received,
            stop,
            port,
            accept: Some(accept),
        }
    }

    pub fn requests(&self) -> Vec<Received> {
        self.received.lock().unwrap().clone()
    }

    pub fn count(&self) -> usize {
        self.received.lock().unwrap().len()
    }
}

impl Drop for FakeServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect(("127.0.0.1", self.port));
        if let Some(h) = self.accept.take() {
            let _ = h.join();
        }
    }
}

fn serve(
    stream: TcpStream,
    received: &Mutex<Vec<Received>>,
    handler: &Handler,
    counter: &AtomicUsize,
) {
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut request_line = String::new();
    if reader.read_line(&mut request_line).unwrap_or(0) == 0 {
        return;
    }
    let path = request_line
        .split_whitespace()
        .nth(1)
        .unwrap_or("")
        .to_string();
    let mut headers = Vec::new();
    let mut len = 0usize;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        let line = line.trim_end();
        if line.is_empty() {
            break;
        }
        if let Some((k, v)) = line.split_once(':') {
            let (k, v) = (k.trim().to_ascii_lowercase(), v.trim().to_string());
            if k == "content-length" {
                len = v.parse().unwrap_or(0);
            }
            headers.push((k, v));
        }
    }
    let mut body = vec![0u8; len];
    if reader.read_exact(&mut body).is_err() {
        return;
    }
    let req = Received {
        path,
        headers,
        body: serde_json::from_slice(&body).unwrap_or(Value::Null),
    };
    let index = counter.fetch_add(1, Ordering::SeqCst);
    received.lock().unwrap().push(req.clone());
    let mut reply = handler(&req, index);
    while let Reply::Delay(d, inner) = reply {
        std::thread::sleep(d);
        reply = *inner;
    }
    let Reply::Http(status, extra, body) = reply else {
        unreachable!()
    };
    let mut out = stream;
    let mut head = format!(
        "HTTP/1.1 {status} Scripted\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n",
        body.len()
    );
    for (k, v) in extra {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    let _ = out.write_all(head.as_bytes());
    let _ = out.write_all(body.as_bytes());
    let _ = out.flush();
}

/// The `Query:` / `Instruction:` lines of a judge prompt.
pub fn judge_query_instruction(user: &str) -> (String, String) {
    let get = |prefix: &str| {
        user.lines()
            .find_map(|l| l.strip_prefix(prefix))
            .unwrap_or("")
            .trim()
            .to_string()
    };
    (get("Query:"), get("Instruction:"))
}

/// The `[X] text` options of a judge prompt.
pub fn judge_options(user: &str) -> Vec<(char, String)> {
    user.lines()
        .filter_map(|l| {
            let b = l.as_bytes();
            (b.len() > 4 && b[0] == b'[' && b[2] == b']' && b[1].is_ascii_uppercase())
                .then(|| (b[1] as char, l[4..].to_string()))
        })
        .collect()
}

/// The letter a perfect judge gives. Conventions of [`good_model`]: input passages start with
/// `POS` and name their query's tag (`[q03]`); the poisoned instruction starts with `NEG`, the
/// poisoned query with `NEGQ`; P1- starts with `P1MARK`, P2- with `P2MARK`.
pub fn right_letter(user: &str) -> char {
    let (query, instruction) = judge_query_instruction(user);
    let opts = judge_options(user);
    let pick = |pred: &dyn Fn(&str) -> bool| {
        opts.iter()
            .find(|(_, t)| pred(t))
            .map(|(c, _)| *c)
            .expect("a matching option")
    };
    if query.starts_with("NEGQ") {
        pick(&|t| t.starts_with("P2MARK"))
    } else if instruction.starts_with("NEG") {
        pick(&|t| t.starts_with("P1MARK"))
    } else {
        let tag = query
            .split_whitespace()
            .find(|w| w.starts_with("[q"))
            .expect("queries carry a tag")
            .to_string();
        pick(&|t| t.starts_with("POS") && t.contains(&tag))
    }
}

/// Sensible JSON answers for each step (see [`right_letter`] for the conventions).
pub fn good_answer(req: &Received) -> String {
    let user = req.user();
    let tag = user
        .split_whitespace()
        .find(|w| w.starts_with("[q"))
        .unwrap_or("[q?]")
        .trim_end_matches(['.', ','])
        .to_string();
    match req.step().as_str() {
        "instruction" => json!({"instruction": format!("I am a student and need a short answer about {tag}")}),
        "poison" => json!({
            "negative_instruction": format!("NEG I am a lawyer and need a long legal analysis about {tag}"),
            "negative_query": format!("NEGQ something different from {tag}"),
        }),
        "negative_passage_1" => json!({"passage": format!("P1MARK legal analysis for {tag}")}),
        "negative_passage_2" => json!({"passage": format!("P2MARK short answer to another question than {tag}")}),
        "judgment" => json!({"answer": right_letter(&user).to_string()}),
        other => panic!("unexpected step {other:?}"),
    }
    .to_string()
}

/// A handler answering every step well.
pub fn good_model(req: &Received, _index: usize) -> Reply {
    completion(&good_answer(req))
}

/// Writes `n` pairs to `dir/pairs.jsonl` following the conventions above; returns the path.
pub fn write_pairs(dir: &std::path::Path, n: usize) -> std::path::PathBuf {
    let path = dir.join("pairs.jsonl");
    let mut text = String::new();
    for i in 0..n {
        text.push_str(
            &json!({
                "query_id": format!("q{i:02}"),
                "query": format!("what is topic [q{i:02}]"),
                "passage_id": format!("p{i:02}"),
                "passage": format!("POS passage that answers [q{i:02}] for a student."),
            })
            .to_string(),
        );
        text.push('\n');
    }
    std::fs::write(&path, text).unwrap();
    path
}

/// A TOML config for `pairs` against `base_url`, output in `dir/out/`; `extra` is appended.
pub fn write_config(
    dir: &std::path::Path,
    pairs: &std::path::Path,
    base_url: &str,
    extra: &str,
) -> std::path::PathBuf {
    let path = dir.join("synth.toml");
    let text = format!(
        r#"
[input]
jsonl = "{}"

[output]
records = "out/records.jsonl"

[generator]
base_url = "{base_url}"
model = "fake-generator"

[judge]
model = "fake-judge"

[client]
concurrency = 2
timeout_secs = 5
max_retries = 2
backoff_initial_ms = 10
backoff_max_ms = 50
{extra}
"#,
        pairs.display()
    );
    // `extra` may hold whole sections; a [client] key must come right after the section above.
    std::fs::write(&path, text).unwrap();
    path
}
