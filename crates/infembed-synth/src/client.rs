//! A blocking client for the OpenAI-compatible `POST {base_url}/chat/completions` API, with
//! retries and exponential backoff, per-request timeouts, a shared request budget and counters.
//!
//! Concurrency is the caller's business: a [`ChatClient`] is `Sync` and may be shared by worker
//! threads (the pipeline runs `client.concurrency` of them).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::config::{ConstrainedOutput, Endpoint};
use crate::error::RequestError;
use crate::shape::ResponseShape;

/// How many HTTP attempts a run may still send, shared by all clients of the run.
#[derive(Debug)]
pub struct Budget {
    remaining: Option<AtomicU64>,
    exhausted: AtomicBool,
}

impl Budget {
    /// A budget of `limit` attempts, or unlimited for `None`.
    pub fn new(limit: Option<u64>) -> Self {
        Budget {
            remaining: limit.map(AtomicU64::new),
            exhausted: AtomicBool::new(false),
        }
    }

    /// Takes one attempt from the budget; false (and nothing taken) when it is spent.
    pub fn try_take(&self) -> bool {
        let Some(rem) = &self.remaining else {
            return true;
        };
        let ok = rem
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |r| r.checked_sub(1))
            .is_ok();
        if !ok {
            self.exhausted.store(true, Ordering::SeqCst);
        }
        ok
    }

    /// Whether an attempt was ever refused for lack of budget.
    pub fn was_exhausted(&self) -> bool {
        self.exhausted.load(Ordering::SeqCst)
    }
}

/// Retry policy for one request.
#[derive(Debug, Clone, Copy)]
pub struct RetryPolicy {
    /// Retries after the first attempt.
    pub max_retries: u32,
    /// Delay before the first retry.
    pub backoff_initial: Duration,
    /// Largest delay (also caps `Retry-After`).
    pub backoff_max: Duration,
}

impl RetryPolicy {
    /// The delay before retry number `retry` (0-based): `initial * 2^retry` capped at `max`,
    /// scaled by `jitter` (expected in [0.5, 1]). A server's `Retry-After` (seconds), when given,
    /// replaces the computed delay, still capped at `max`.
    pub fn delay(&self, retry: u32, jitter: f64, retry_after: Option<Duration>) -> Duration {
        if let Some(ra) = retry_after {
            return ra.min(self.backoff_max);
        }
        let factor = 2f64.powi(retry.min(30) as i32);
        let base = self.backoff_initial.as_secs_f64() * factor;
        let capped = base.min(self.backoff_max.as_secs_f64());
        Duration::from_secs_f64(capped * jitter.clamp(0.0, 1.0))
    }
}

/// Counters of a run's HTTP traffic (all attempts, retries included).
#[derive(Debug, Default)]
pub struct RequestCounters {
    attempts: AtomicU64,
    completions: AtomicU64,
    retries: AtomicU64,
    rate_limited: AtomicU64,
    server_errors: AtomicU64,
    timeouts: AtomicU64,
    transport_errors: AtomicU64,
    malformed_responses: AtomicU64,
    other_status: AtomicU64,
    prompt_tokens: AtomicU64,
    completion_tokens: AtomicU64,
}

/// A snapshot of [`RequestCounters`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RequestStats {
    /// HTTP attempts sent.
    pub attempts: u64,
    /// Attempts that produced a completion.
    pub completions: u64,
    /// Attempts that were retries of an earlier failure.
    pub retries: u64,
    /// 429 answers.
    pub rate_limited: u64,
    /// 5xx (and 408) answers.
    pub server_errors: u64,
    /// Attempts that timed out.
    pub timeouts: u64,
    /// Attempts that failed to connect, send or receive.
    pub transport_errors: u64,
    /// 200 answers that were not chat completions.
    pub malformed_responses: u64,
    /// Other non-200 answers (not retried).
    pub other_status: u64,
    /// Sum of `usage.prompt_tokens` reported by the server.
    pub prompt_tokens: u64,
    /// Sum of `usage.completion_tokens` reported by the server.
    pub completion_tokens: u64,
}

impl RequestCounters {
    /// The current values.
    pub fn snapshot(&self) -> RequestStats {
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        RequestStats {
            attempts: g(&self.attempts),
            completions: g(&self.completions),
            retries: g(&self.retries),
            rate_limited: g(&self.rate_limited),
            server_errors: g(&self.server_errors),
            timeouts: g(&self.timeouts),
            transport_errors: g(&self.transport_errors),
            malformed_responses: g(&self.malformed_responses),
            other_status: g(&self.other_status),
            prompt_tokens: g(&self.prompt_tokens),
            completion_tokens: g(&self.completion_tokens),
        }
    }

    fn bump(a: &AtomicU64) {
        a.fetch_add(1, Ordering::Relaxed);
    }

    fn count_failure(&self, e: &RequestError) {
        match e {
            RequestError::Status { status: 429, .. } => Self::bump(&self.rate_limited),
            RequestError::Status { status, .. } if *status == 408 || *status >= 500 => {
                Self::bump(&self.server_errors)
            }
            RequestError::Status { .. } => Self::bump(&self.other_status),
            RequestError::Timeout => Self::bump(&self.timeouts),
            RequestError::Transport(_) => Self::bump(&self.transport_errors),
            RequestError::MalformedResponse { .. } => Self::bump(&self.malformed_responses),
            RequestError::BudgetExhausted | RequestError::RetriesExhausted { .. } => {}
        }
    }
}

/// One chat message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Message {
    /// `system`, `user` or `assistant`.
    pub role: String,
    /// The text.
    pub content: String,
}

impl Message {
    /// A system message.
    pub fn system(content: impl Into<String>) -> Self {
        Message {
            role: "system".into(),
            content: content.into(),
        }
    }

    /// A user message.
    pub fn user(content: impl Into<String>) -> Self {
        Message {
            role: "user".into(),
            content: content.into(),
        }
    }
}

/// One request: messages, an optional answer shape, an optional sampling seed.
#[derive(Debug, Clone)]
pub struct ChatRequest {
    /// The conversation.
    pub messages: Vec<Message>,
    /// The expected answer's shape; sent as a JSON schema or a grammar according to the
    /// endpoint's [`ConstrainedOutput`], and used to derive the token budget. Its name identifies
    /// the pipeline step (`instruction`, `poison`, `negative_passage_1`, `negative_passage_2`,
    /// `judgment`).
    pub shape: Option<ResponseShape>,
    /// Sampling seed sent as `seed` (OpenAI and llama.cpp honour it).
    pub seed: Option<u64>,
}

/// Completion-token limit of a generator request when neither the config nor the answer's shape
/// gives one.
pub const DEFAULT_MAX_TOKENS: u32 = 512;

/// A completion: the first choice's text and the server's token usage.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Completion {
    /// `choices[0].message.content` (empty when the server sent `null`).
    pub content: String,
    /// `choices[0].finish_reason`, when given (`length` means the token limit cut the answer).
    pub finish_reason: Option<String>,
    /// HTTP attempts this completion took.
    pub attempts: u32,
}

/// A chat-completions client bound to one [`Endpoint`].
#[derive(Debug)]
pub struct ChatClient {
    agent: ureq::Agent,
    endpoint: Endpoint,
    url: String,
    retry: RetryPolicy,
    budget: Arc<Budget>,
    counters: Arc<RequestCounters>,
    jitter_state: AtomicU64,
}

impl ChatClient {
    /// A client for `endpoint` with the given per-request timeout, retry policy, shared budget and
    /// shared counters. Loopback base URLs bypass any proxy from the environment.
    pub fn new(
        endpoint: Endpoint,
        timeout: Duration,
        retry: RetryPolicy,
        budget: Arc<Budget>,
        counters: Arc<RequestCounters>,
    ) -> Self {
        let loopback = ["http://127.0.0.1", "http://localhost", "http://[::1]"]
            .iter()
            .any(|p| endpoint.base_url.starts_with(p));
        let mut builder = ureq::Agent::config_builder()
            .timeout_global(Some(timeout))
            .http_status_as_error(false);
        if loopback {
            builder = builder.proxy(None);
        }
        let agent = ureq::Agent::new_with_config(builder.build());
        let url = format!("{}/chat/completions", endpoint.base_url);
        ChatClient {
            agent,
            endpoint,
            url,
            retry,
            budget,
            counters,
            jitter_state: AtomicU64::new(0x9E37_79B9_7F4A_7C15),
        }
    }

    /// The endpoint this client talks to.
    pub fn endpoint(&self) -> &Endpoint {
        &self.endpoint
    }

    /// The completion-token limit sent with `request`: the configured `max_tokens`; else, for a
    /// judge's one-letter answer or when the server enforces the length limits, the shape's
    /// [`ResponseShape::token_budget`]; else [`DEFAULT_MAX_TOKENS`].
    pub fn max_tokens_for(&self, request: &ChatRequest) -> u32 {
        let e = &self.endpoint;
        if let Some(m) = e.max_tokens {
            return m;
        }
        match &request.shape {
            Some(shape @ ResponseShape::Choice { .. }) => shape.token_budget(),
            Some(shape)
                if e.constrained_output
                    .enforces_lengths(e.schema_length_limits) =>
            {
                shape.token_budget()
            }
            _ => DEFAULT_MAX_TOKENS,
        }
    }

    /// The JSON body sent for `request`.
    pub fn request_body(&self, request: &ChatRequest) -> Value {
        let e = &self.endpoint;
        let mut body = json!({
            "model": e.model,
            "messages": request.messages,
        });
        let obj = body.as_object_mut().expect("json! built an object");
        if let Some(t) = e.temperature {
            obj.insert("temperature".into(), json!(t));
        }
        obj.insert(
            e.max_tokens_field.clone(),
            json!(self.max_tokens_for(request)),
        );
        if let Some(seed) = request.seed {
            obj.insert("seed".into(), json!(seed));
        }
        if let Some(shape) = &request.shape {
            match e.constrained_output {
                ConstrainedOutput::JsonSchema => {
                    obj.insert(
                        "response_format".into(),
                        json!({
                            "type": "json_schema",
                            "json_schema": {
                                "name": shape.name(),
                                "strict": true,
                                "schema": shape.json_schema(e.schema_length_limits),
                            },
                        }),
                    );
                }
                ConstrainedOutput::Grammar => {
                    obj.insert("grammar".into(), json!(shape.gbnf()));
                }
                ConstrainedOutput::JsonObject => {
                    obj.insert("response_format".into(), json!({"type": "json_object"}));
                }
                ConstrainedOutput::None => {}
            }
        }
        body
    }

    /// Sends `request`, retrying retryable failures with backoff, each attempt taken from the
    /// budget.
    ///
    /// # Errors
    /// [`RequestError::BudgetExhausted`] when the budget is spent before the first attempt (or
    /// before a retry: then the last failure is wrapped in [`RequestError::RetriesExhausted`]), a
    /// non-retryable [`RequestError::Status`], or [`RequestError::RetriesExhausted`].
    pub fn complete(&self, request: &ChatRequest) -> Result<Completion, RequestError> {
        let body = serde_json::to_string(&self.request_body(request))
            .expect("a JSON value always serializes");
        let mut attempt: u32 = 0;
        loop {
            if !self.budget.try_take() {
                return Err(RequestError::BudgetExhausted);
            }
            attempt += 1;
            RequestCounters::bump(&self.counters.attempts);
            if attempt > 1 {
                RequestCounters::bump(&self.counters.retries);
            }
            let (err, retry_after) = match self.attempt_once(&body) {
                Ok(mut c) => {
                    RequestCounters::bump(&self.counters.completions);
                    c.attempts = attempt;
                    return Ok(c);
                }
                Err(x) => x,
            };
            self.counters.count_failure(&err);
            if !err.is_retryable() {
                return Err(err);
            }
            if attempt > self.retry.max_retries {
                return Err(RequestError::RetriesExhausted {
                    attempts: attempt,
                    last: Box::new(err),
                });
            }
            let delay = self
                .retry
                .delay(attempt - 1, self.next_jitter(), retry_after);
            std::thread::sleep(delay);
        }
    }

    /// A jitter factor in [0.5, 1] from a shared xorshift state (randomness here only spreads
    /// retries out; it affects no output).
    fn next_jitter(&self) -> f64 {
        let mut x = self.jitter_state.load(Ordering::Relaxed);
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.jitter_state.store(x, Ordering::Relaxed);
        0.5 + 0.5 * ((x >> 11) as f64 / (1u64 << 53) as f64)
    }

    fn attempt_once(&self, body: &str) -> Result<Completion, (RequestError, Option<Duration>)> {
        let mut req = self
            .agent
            .post(&self.url)
            .header("Content-Type", "application/json");
        if let Some(key) = &self.endpoint.api_key {
            req = req.header("Authorization", format!("Bearer {key}"));
        }
        let mut resp = match req.send(body) {
            Ok(r) => r,
            Err(e) => return Err((classify_transport(e), None)),
        };
        let status = resp.status().as_u16();
        let retry_after = resp
            .headers()
            .get("retry-after")
            .and_then(|v| v.to_str().ok())
            .and_then(|s| s.trim().parse::<f64>().ok())
            .filter(|s| s.is_finite() && *s >= 0.0)
            .map(Duration::from_secs_f64);
        let text = match resp.body_mut().read_to_string() {
            Ok(t) => t,
            Err(e) => return Err((classify_transport(e), None)),
        };
        if status != 200 {
            let body: String = text.chars().take(500).collect();
            return Err((RequestError::Status { status, body }, retry_after));
        }
        let completion = parse_completion(&text).map_err(|e| (e, None))?;
        if let Some((p, c)) = parse_usage(&text) {
            self.counters.prompt_tokens.fetch_add(p, Ordering::Relaxed);
            self.counters
                .completion_tokens
                .fetch_add(c, Ordering::Relaxed);
        }
        Ok(completion)
    }
}

fn classify_transport(e: ureq::Error) -> RequestError {
    match e {
        ureq::Error::Timeout(_) => RequestError::Timeout,
        ureq::Error::Io(io)
            if matches!(
                io.kind(),
                std::io::ErrorKind::TimedOut | std::io::ErrorKind::WouldBlock
            ) =>
        {
            RequestError::Timeout
        }
        other => RequestError::Transport(other),
    }
}

/// Parses a chat-completion response body.
///
/// # Errors
/// [`RequestError::MalformedResponse`] when the body is not JSON or lacks `choices[0].message`.
pub fn parse_completion(text: &str) -> Result<Completion, RequestError> {
    let malformed = |problem: String| RequestError::MalformedResponse { problem };
    let v: Value =
        serde_json::from_str(text).map_err(|e| malformed(format!("body is not JSON: {e}")))?;
    let choice = v
        .get("choices")
        .and_then(Value::as_array)
        .and_then(|c| c.first())
        .ok_or_else(|| malformed("no `choices[0]`".into()))?;
    let message = choice
        .get("message")
        .ok_or_else(|| malformed("no `choices[0].message`".into()))?;
    let content = match message.get("content") {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Null) | None => String::new(),
        Some(_) => return Err(malformed("`content` is not a string".into())),
    };
    let finish_reason = choice
        .get("finish_reason")
        .and_then(Value::as_str)
        .map(str::to_string);
    Ok(Completion {
        content,
        finish_reason,
        attempts: 0,
    })
}

/// Token usage of a response body, if it reports any: `(prompt_tokens, completion_tokens)`.
pub fn parse_usage(text: &str) -> Option<(u64, u64)> {
    let v: Value = serde_json::from_str(text).ok()?;
    let u = v.get("usage")?;
    Some((
        u.get("prompt_tokens")?.as_u64()?,
        u.get("completion_tokens")?.as_u64()?,
    ))
}
