//! # infembed-synth
//!
//! The InF-IR synthesis pipeline (paper section 4.1, appendices B and H): it turns
//! (query, passage) pairs into contrastive `<instruction, query, passage>` records in the public
//! InF-IR format, using any OpenAI-compatible `/v1/chat/completions` server.
//!
//! For each pair (Q+, P+), in order:
//! 1. **Instruction**: the generator writes I+ so that P+ is the best match for I+ and Q+.
//! 2. **Poisoning**: it writes a negative instruction I- (one or two key requirements changed,
//!    same domain) and a negative query Q-, then the hard negatives P1- (relevant to (I-, Q+))
//!    and P2- (relevant to (I+, Q-)).
//! 3. **Rule filter** ([`filter`]): instructions and queries are cut at the first line break;
//!    empty, over-long, or negatives equal to their positives are rejected.
//! 4. **Quality check** ([`judge`]): for (I+,Q+), (I-,Q+), (I+,Q-) the judge picks the best of
//!    P+, P1-, P2- and random distractors, shuffled; the record is kept only if all three picks
//!    are right.
//!
//! That is 4 generator and 3 judge requests per pair, plus retries (see `docs/synthesis.md`).
//! Every request carries the shape of its answer ([`shape`]): a JSON schema, or, for llama.cpp, a
//! GBNF grammar that bounds every field and lets the judge answer only an offered letter
//! ([`ConstrainedOutput`]); token budgets follow from the same limits, so answers are not cut.
//!
//! Output ([`output`]): every generated record (kept or not, with the judge's verdicts) goes to
//! the generated file, the kept ones also to the records file (both readable by
//! [`infembed_data::read_records`]; each line carries a `provenance` object: source ids, model
//! names, seed, the judge's answers), and pairs rejected before a record existed to the rejected
//! file. All are appended as results arrive, so a crash loses only pairs in flight, and a rerun
//! skips pairs already written. Randomness is per pair, from the configured seed and the pair's
//! ids ([`judge::pair_rng`]), so results do not depend on concurrency or order.
//!
//! Entry points: [`SynthConfig::from_file`] and [`run`]. Prompts are editable text files
//! ([`prompt`]).

pub mod client;
pub mod config;
pub mod error;
pub mod filter;
pub mod input;
pub mod judge;
pub mod output;
pub mod pipeline;
pub mod prompt;
pub mod report;
pub mod shape;

pub use client::{Budget, ChatClient, ChatRequest, Completion, Message, RequestStats, RetryPolicy};
pub use config::{
    ClientConfig, ConstrainedOutput, Endpoint, EndpointConfig, FilterConfig, InputConfig,
    OutputConfig, QualityConfig, SynthConfig,
};
pub use error::{Error, RequestError, Result};
pub use judge::Scenario;
pub use output::{Judgment, Provenance, Source, Stage, Status};
pub use pipeline::run;
pub use prompt::PromptSet;
pub use report::{
    Counts, NoProgress, Progress, RunCounts, ScenarioStats, StderrProgress, SynthReport,
};
pub use shape::{ResponseShape, StringField};
