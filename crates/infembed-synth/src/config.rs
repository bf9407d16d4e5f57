//! The run's configuration ([`SynthConfig`]), read from a TOML or JSON file.
//!
//! Relative paths in a config file are resolved against the file's own folder. Every section but
//! `[input]` and `[output]` is optional. The endpoint settings (`[generator]`, `[judge]`) fall back
//! to environment variables, and the judge falls back to the generator's base URL, key and model:
//!
//! | setting | config | environment (first set wins) |
//! |---|---|---|
//! | base URL | `base_url` | `INFEMBED_SYNTH_BASE_URL`, `OPENAI_BASE_URL` |
//! | API key | `api_key`, or the variable named by `api_key_env` | `INFEMBED_SYNTH_API_KEY`, `OPENAI_API_KEY` |
//! | generator model | `generator.model` | `INFEMBED_SYNTH_GENERATOR_MODEL` |
//! | judge model | `judge.model` | `INFEMBED_SYNTH_JUDGE_MODEL`, then the generator's model |
//!
//! A config value always wins over the environment.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// Environment variable for the API base URL (e.g. `https://api.openai.com/v1`).
pub const ENV_BASE_URL: &str = "INFEMBED_SYNTH_BASE_URL";
/// Environment variable for the API key.
pub const ENV_API_KEY: &str = "INFEMBED_SYNTH_API_KEY";
/// Environment variable for the generator's model name.
pub const ENV_GENERATOR_MODEL: &str = "INFEMBED_SYNTH_GENERATOR_MODEL";
/// Environment variable for the judge's model name.
pub const ENV_JUDGE_MODEL: &str = "INFEMBED_SYNTH_JUDGE_MODEL";

/// The whole configuration of a synthesis run.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SynthConfig {
    /// Where the (query, passage) pairs come from.
    pub input: InputConfig,
    /// Where records, rejections and the report go.
    pub output: OutputConfig,
    /// The model that writes instructions, poisoned negatives and passages.
    #[serde(default)]
    pub generator: EndpointConfig,
    /// The model that judges relevance in the quality check; unset values fall back to the
    /// generator's base URL, API key and model.
    #[serde(default)]
    pub judge: EndpointConfig,
    /// HTTP client behaviour: concurrency, timeouts, retries, budget.
    #[serde(default)]
    pub client: ClientConfig,
    /// The rule filter's limits.
    #[serde(default)]
    pub filter: FilterConfig,
    /// The LLM quality check.
    #[serde(default)]
    pub quality: QualityConfig,
    /// A folder whose template files (same names as `prompts/` in this crate) replace the built-in
    /// prompts; files it lacks keep the built-in text.
    #[serde(default)]
    pub prompts_dir: Option<PathBuf>,
    /// Stop taking new pairs once this many pairs were finished (kept or rejected) in this run;
    /// pairs already in flight still finish and are written. A later run resumes.
    #[serde(default)]
    pub stop_after: Option<usize>,
    /// Where the config came from (for error messages); not part of the file.
    #[serde(skip)]
    pub origin: Option<PathBuf>,
}

/// The input: exactly one of `beir` and `jsonl`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InputConfig {
    /// A BEIR-layout folder (`corpus.jsonl`, `queries.jsonl`, `qrels/{split}.tsv`); each relevant
    /// (query, document) judgment is one pair, queries in file order, documents by id. The whole
    /// corpus is the distractor pool.
    #[serde(default)]
    pub beir: Option<PathBuf>,
    /// The qrels split of a BEIR folder.
    #[serde(default = "default_split")]
    pub split: String,
    /// A JSONL file of pairs: `query` and `passage` (non-blank strings), optional `query_id` and
    /// `passage_id` (string or integer; default `line{N}`). Its distinct passages are the
    /// distractor pool.
    #[serde(default)]
    pub jsonl: Option<PathBuf>,
    /// Skip this many pairs first.
    #[serde(default)]
    pub offset: usize,
    /// Use at most this many pairs (after `offset`).
    #[serde(default)]
    pub limit: Option<usize>,
}

fn default_split() -> String {
    "test".to_string()
}

/// Output files.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OutputConfig {
    /// Kept records, InF-IR JSONL (public field names plus a `provenance` object). Appended to; a
    /// rerun skips the pairs already in it or in `rejected`.
    pub records: PathBuf,
    /// Rejected pairs with the stage and reason (default: `records` with extension
    /// `rejected.jsonl`).
    #[serde(default)]
    pub rejected: Option<PathBuf>,
    /// Every generated record (all seven texts produced and passed the rule filter), kept by the
    /// quality check or not, with its provenance and the judge's verdicts (default: `records`
    /// with extension `generated.jsonl`). With a weak judge this file still holds well-formed
    /// InF-IR records; `records` holds the subset that passed all three judgments.
    #[serde(default)]
    pub generated: Option<PathBuf>,
    /// The JSON report (default: `records` with extension `report.json`).
    #[serde(default)]
    pub report: Option<PathBuf>,
}

impl OutputConfig {
    /// The rejected-pairs file, defaulted.
    pub fn rejected_path(&self) -> PathBuf {
        self.rejected
            .clone()
            .unwrap_or_else(|| self.records.with_extension("rejected.jsonl"))
    }

    /// The generated-records file, defaulted.
    pub fn generated_path(&self) -> PathBuf {
        self.generated
            .clone()
            .unwrap_or_else(|| self.records.with_extension("generated.jsonl"))
    }

    /// The report file, defaulted.
    pub fn report_path(&self) -> PathBuf {
        self.report
            .clone()
            .unwrap_or_else(|| self.records.with_extension("report.json"))
    }
}

/// How the server is asked for well-formed output (the `constrained_output` setting).
///
/// llama.cpp's `llama-server` honours both `json_schema` (it turns the schema into a grammar) and
/// `grammar`; hosted OpenAI-compatible APIs usually support `json_schema` only.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ConstrainedOutput {
    /// `response_format: {type: json_schema, json_schema: {name, strict: true, schema}}` (OpenAI
    /// structured outputs). With `schema_length_limits` the string fields carry
    /// `minLength`/`maxLength`.
    #[default]
    JsonSchema,
    /// llama.cpp's `grammar` field: a GBNF grammar written by this crate
    /// ([`crate::shape::ResponseShape::gbnf`]) that fixes the JSON layout, bounds every field's
    /// length, keeps instructions and queries on one line, and lets the judge answer only one of
    /// the offered letters.
    Grammar,
    /// `response_format: {type: json_object}` (JSON mode, no schema).
    JsonObject,
    /// Nothing; the reply is parsed leniently (code fences and prose around the JSON ignored).
    None,
}

impl ConstrainedOutput {
    /// Whether answers are length-limited by the server (so the token budget can be derived from
    /// the limits): always for `grammar`, for `json_schema` when `schema_length_limits` is on.
    pub fn enforces_lengths(self, schema_length_limits: bool) -> bool {
        match self {
            ConstrainedOutput::Grammar => true,
            ConstrainedOutput::JsonSchema => schema_length_limits,
            ConstrainedOutput::JsonObject | ConstrainedOutput::None => false,
        }
    }
}

/// One OpenAI-compatible endpoint and model. Every field is optional in the file.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EndpointConfig {
    /// Base URL up to and including `/v1` (the client appends `/chat/completions`).
    #[serde(default)]
    pub base_url: Option<String>,
    /// Model name sent in each request.
    #[serde(default)]
    pub model: Option<String>,
    /// The API key itself (prefer `api_key_env`).
    #[serde(default)]
    pub api_key: Option<String>,
    /// Name of an environment variable holding the API key.
    #[serde(default)]
    pub api_key_env: Option<String>,
    /// Sampling temperature; unset sends none (reasoning models such as o3-mini reject it).
    /// Default: 0.7 for the generator, unset for the judge.
    #[serde(default)]
    pub temperature: Option<f32>,
    /// Completion token limit of every request to this endpoint. Unset: derived per step from
    /// the answer's shape when the server enforces the length limits (`grammar`, or `json_schema`
    /// with `schema_length_limits`; see [`crate::shape::ResponseShape::token_budget`]), else 512;
    /// 24 for the judge's one-letter answer. Reasoning judges (o3-mini) need it set, e.g. 2000.
    #[serde(default)]
    pub max_tokens: Option<u32>,
    /// The request field that carries `max_tokens` (OpenAI's o-series want
    /// `max_completion_tokens`). Default `max_tokens`.
    #[serde(default)]
    pub max_tokens_field: Option<String>,
    /// How to constrain the answers (default `json_schema`). `structured_output` is accepted as
    /// an older name.
    #[serde(default, alias = "structured_output")]
    pub constrained_output: Option<ConstrainedOutput>,
    /// Add `minLength: 1` and `maxLength` (the rule filter's limits) to generated string fields
    /// of the JSON schema. llama.cpp enforces them in its grammar; some hosted APIs reject the
    /// keywords in strict mode. Default false. (The `grammar` mode always limits lengths.)
    #[serde(default)]
    pub schema_length_limits: Option<bool>,
}

/// HTTP client behaviour.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ClientConfig {
    /// Pairs processed at once (each pair's requests are sequential), so also the most requests in
    /// flight. At least 1.
    pub concurrency: usize,
    /// Timeout of one request (connect to last byte), seconds.
    pub timeout_secs: f64,
    /// Retries after the first attempt on 429, 408, 5xx, timeouts and connection failures.
    pub max_retries: u32,
    /// First backoff delay, milliseconds; doubles each retry (with jitter in [50%, 100%]).
    pub backoff_initial_ms: u64,
    /// Largest backoff delay (also caps a server's `Retry-After`), milliseconds.
    pub backoff_max_ms: u64,
    /// The most HTTP attempts (retries included) this run may send; unset is unlimited.
    pub request_budget: Option<u64>,
}

impl Default for ClientConfig {
    fn default() -> Self {
        ClientConfig {
            concurrency: 4,
            timeout_secs: 120.0,
            max_retries: 4,
            backoff_initial_ms: 500,
            backoff_max_ms: 30_000,
            request_budget: None,
        }
    }
}

/// Rule filter limits (paper appendix B.1), in Unicode scalar values (`char`s).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct FilterConfig {
    /// Longest instruction (I+, I-) kept.
    pub max_instruction_chars: usize,
    /// Longest query (Q-) kept.
    pub max_query_chars: usize,
    /// Longest generated passage (P1-, P2-) kept.
    pub max_passage_chars: usize,
}

impl Default for FilterConfig {
    fn default() -> Self {
        FilterConfig {
            max_instruction_chars: 600,
            max_query_chars: 300,
            max_passage_chars: 2_000,
        }
    }
}

/// The quality check (paper section 4.1).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct QualityConfig {
    /// Run the check; when false, every record that passes the rule filter is kept.
    pub enabled: bool,
    /// Random distractor passages added to the record's three passages (at most 23, so the
    /// options fit in A..Z).
    pub distractors: usize,
    /// Seed for distractor sampling, option shuffling and per-request sampling seeds. Each pair's
    /// randomness depends only on this seed and the pair's ids, not on processing order.
    pub seed: u64,
}

impl Default for QualityConfig {
    fn default() -> Self {
        QualityConfig {
            enabled: true,
            distractors: 2,
            seed: 0,
        }
    }
}

/// The endpoint's role (for defaults and messages).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// Writes instructions, negatives and passages.
    Generator,
    /// Picks the most relevant passage.
    Judge,
}

/// An endpoint with every setting resolved.
#[derive(Debug, Clone)]
pub struct Endpoint {
    /// Generator or judge.
    pub role: Role,
    /// Base URL without a trailing slash.
    pub base_url: String,
    /// Model name.
    pub model: String,
    /// API key, sent as `Authorization: Bearer KEY` when present.
    pub api_key: Option<String>,
    /// Sampling temperature, sent when present.
    pub temperature: Option<f32>,
    /// The configured completion token limit; `None` lets the client derive one per request.
    pub max_tokens: Option<u32>,
    /// The field name for `max_tokens`.
    pub max_tokens_field: String,
    /// How answers are constrained.
    pub constrained_output: ConstrainedOutput,
    /// Whether generated string fields get `maxLength` in the schema.
    pub schema_length_limits: bool,
}

impl SynthConfig {
    /// Reads a config from a `.toml` or `.json` file and validates it. Relative paths in it are
    /// made relative to the file's folder.
    ///
    /// # Errors
    /// I/O, a parse error (with line and column), an unknown key, or an invalid value (naming the
    /// file and field).
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|source| Error::Io {
            path: path.to_path_buf(),
            source,
        })?;
        let ext = path
            .extension()
            .and_then(|e| e.to_str())
            .map(str::to_ascii_lowercase);
        let mut config: SynthConfig = match ext.as_deref() {
            Some("toml") => toml::from_str(&text).map_err(|source| Error::ConfigToml {
                path: path.to_path_buf(),
                source,
            })?,
            Some("json") => serde_json::from_str(&text).map_err(|source| Error::ConfigJson {
                path: path.to_path_buf(),
                source,
            })?,
            _ => {
                return Err(Error::ConfigFormat {
                    path: path.to_path_buf(),
                });
            }
        };
        config.origin = Some(path.to_path_buf());
        let base = path.parent().unwrap_or(Path::new("")).to_path_buf();
        config.resolve_paths(&base);
        config.validate()?;
        Ok(config)
    }

    /// Makes every relative path absolute against `base`.
    pub fn resolve_paths(&mut self, base: &Path) {
        let fix = |p: &mut PathBuf| {
            if p.is_relative() {
                *p = base.join(&*p);
            }
        };
        for p in [&mut self.input.beir, &mut self.input.jsonl]
            .into_iter()
            .flatten()
        {
            fix(p);
        }
        fix(&mut self.output.records);
        for p in [
            &mut self.output.rejected,
            &mut self.output.generated,
            &mut self.output.report,
            &mut self.prompts_dir,
        ]
        .into_iter()
        .flatten()
        {
            fix(p);
        }
    }

    /// The origin named in error messages.
    pub fn origin_name(&self) -> String {
        self.origin
            .as_ref()
            .map(|p| p.display().to_string())
            .unwrap_or_else(|| "<config>".to_string())
    }

    fn invalid(&self, field: &'static str, problem: impl Into<String>) -> Error {
        Error::ConfigValue {
            origin: self.origin_name(),
            field,
            problem: problem.into(),
        }
    }

    /// Checks values that the types alone do not constrain.
    ///
    /// # Errors
    /// The first invalid field.
    pub fn validate(&self) -> Result<()> {
        match (&self.input.beir, &self.input.jsonl) {
            (Some(_), Some(_)) => {
                return Err(self.invalid("input", "set only one of `beir` and `jsonl`"));
            }
            (None, None) => return Err(self.invalid("input", "set one of `beir` or `jsonl`")),
            _ => {}
        }
        if self.input.limit == Some(0) {
            return Err(self.invalid("input.limit", "must be at least 1"));
        }
        if self.output.records.as_os_str().is_empty() {
            return Err(self.invalid("output.records", "is empty"));
        }
        if self.output.rejected_path() == self.output.records {
            return Err(self.invalid("output.rejected", "must differ from output.records"));
        }
        let generated = self.output.generated_path();
        if generated == self.output.records || generated == self.output.rejected_path() {
            return Err(self.invalid(
                "output.generated",
                "must differ from output.records and output.rejected",
            ));
        }
        for (field, e) in [
            ("generator.max_tokens", &self.generator),
            ("judge.max_tokens", &self.judge),
        ] {
            if e.max_tokens == Some(0) {
                return Err(self.invalid(field, "must be at least 1"));
            }
        }
        let c = &self.client;
        if c.concurrency == 0 {
            return Err(self.invalid("client.concurrency", "must be at least 1"));
        }
        if !(c.timeout_secs.is_finite() && c.timeout_secs > 0.0) {
            return Err(self.invalid("client.timeout_secs", "must be a positive number"));
        }
        if c.backoff_initial_ms > c.backoff_max_ms {
            return Err(self.invalid(
                "client.backoff_initial_ms",
                "must not exceed client.backoff_max_ms",
            ));
        }
        let f = &self.filter;
        for (field, v) in [
            ("filter.max_instruction_chars", f.max_instruction_chars),
            ("filter.max_query_chars", f.max_query_chars),
            ("filter.max_passage_chars", f.max_passage_chars),
        ] {
            if v == 0 {
                return Err(self.invalid(field, "must be at least 1"));
            }
        }
        if self.quality.distractors > 23 {
            return Err(self.invalid(
                "quality.distractors",
                "at most 23 (3 record passages + distractors must fit in letters A..Z)",
            ));
        }
        for (field, e) in [
            ("generator.temperature", &self.generator),
            ("judge.temperature", &self.judge),
        ] {
            if let Some(t) = e.temperature
                && !(t.is_finite() && t >= 0.0)
            {
                return Err(self.invalid(field, "must be a non-negative number"));
            }
        }
        if self.stop_after == Some(0) {
            return Err(self.invalid("stop_after", "must be at least 1"));
        }
        Ok(())
    }

    /// The per-request timeout.
    pub fn timeout(&self) -> Duration {
        Duration::from_secs_f64(self.client.timeout_secs)
    }

    /// Resolves the generator and judge endpoints from the config and the process environment.
    ///
    /// # Errors
    /// A missing base URL or model.
    pub fn endpoints(&self) -> Result<(Endpoint, Endpoint)> {
        self.endpoints_with_env(&|name| std::env::var(name).ok().filter(|v| !v.is_empty()))
    }

    /// [`SynthConfig::endpoints`] with an explicit environment lookup (for tests).
    ///
    /// # Errors
    /// A missing base URL or model.
    pub fn endpoints_with_env(
        &self,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<(Endpoint, Endpoint)> {
        let g = &self.generator;
        let j = &self.judge;
        let env_base = || env(ENV_BASE_URL).or_else(|| env("OPENAI_BASE_URL"));
        let key_of = |e: &EndpointConfig| -> Option<String> {
            e.api_key.clone().or_else(|| {
                e.api_key_env
                    .as_deref()
                    .and_then(env)
                    .filter(|k| !k.is_empty())
            })
        };
        let env_key = || env(ENV_API_KEY).or_else(|| env("OPENAI_API_KEY"));

        let g_base = g.base_url.clone().or_else(env_base).ok_or_else(|| {
            self.invalid(
                "generator.base_url",
                format!("is not set (nor {ENV_BASE_URL} / OPENAI_BASE_URL)"),
            )
        })?;
        let g_model = g
            .model
            .clone()
            .or_else(|| env(ENV_GENERATOR_MODEL))
            .ok_or_else(|| {
                self.invalid(
                    "generator.model",
                    format!("is not set (nor {ENV_GENERATOR_MODEL})"),
                )
            })?;
        let g_key = key_of(g).or_else(env_key);
        let j_base = j.base_url.clone().unwrap_or_else(|| g_base.clone());
        let j_model = j
            .model
            .clone()
            .or_else(|| env(ENV_JUDGE_MODEL))
            .unwrap_or_else(|| g_model.clone());
        let j_key = key_of(j).or_else(|| g_key.clone());

        let generator = Endpoint {
            role: Role::Generator,
            base_url: g_base.trim_end_matches('/').to_string(),
            model: g_model,
            api_key: g_key,
            temperature: g.temperature.or(Some(0.7)),
            max_tokens: g.max_tokens,
            max_tokens_field: g
                .max_tokens_field
                .clone()
                .unwrap_or_else(|| "max_tokens".into()),
            constrained_output: g.constrained_output.unwrap_or_default(),
            schema_length_limits: g.schema_length_limits.unwrap_or(false),
        };
        let judge = Endpoint {
            role: Role::Judge,
            base_url: j_base.trim_end_matches('/').to_string(),
            model: j_model,
            api_key: j_key,
            temperature: j.temperature,
            max_tokens: j.max_tokens,
            max_tokens_field: j
                .max_tokens_field
                .clone()
                .unwrap_or_else(|| "max_tokens".into()),
            constrained_output: j.constrained_output.unwrap_or_default(),
            schema_length_limits: false,
        };
        for (field, e) in [
            ("generator.base_url", &generator),
            ("judge.base_url", &judge),
        ] {
            if !(e.base_url.starts_with("http://") || e.base_url.starts_with("https://")) {
                return Err(self.invalid(
                    field,
                    format!("{:?} is not an http:// or https:// URL", e.base_url),
                ));
            }
        }
        Ok((generator, judge))
    }
}
