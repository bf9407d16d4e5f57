//! The pipeline: for each pair, four generator requests, the rule filter, three judge requests;
//! workers in parallel, results written as they arrive.

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, mpsc};
use std::time::{Duration, Instant};

use infembed_data::InfIrRecord;
use rand::Rng;
use serde_json::{Map, Value};

use crate::client::{Budget, ChatClient, ChatRequest, Message, RequestCounters, RetryPolicy};
use crate::config::SynthConfig;
use crate::error::{RequestError, Result};
use crate::filter::{TextKind, apply_rule, parse_fields, same_text};
use crate::input::{Pair, PoolPassage, load_input};
use crate::judge::{
    JudgeOption, Scenario, letter, letters_list, pair_rng, parse_answer, render_options,
    sample_distractors, shuffle_options,
};
use crate::output::{
    JsonlAppender, Judgment, Provenance, Resumed, Source, Stage, Status, kept_line, rejected_line,
};
use crate::prompt::PromptSet;
use crate::report::{Progress, RunCounts, SynthReport, Tally};
use crate::shape::{ResponseShape, StringField};

/// How many failure messages the report keeps.
const FAILURE_SAMPLES: usize = 5;

/// What processing one pair produced.
#[derive(Debug)]
pub enum PairOutcome {
    /// All seven texts were generated and passed the rules: the record and its provenance, with
    /// the judge's verdicts; `provenance.status` says whether the quality check kept it.
    Generated(InfIrRecord, Provenance),
    /// Rejected before a record existed (malformed answer or rule filter): provenance (with stage
    /// and reason) and the texts generated so far.
    Rejected(Provenance, Map<String, Value>),
    /// A request failed for good; nothing is written and a later run retries the pair.
    Failed(Source, RequestError),
}

/// Everything a worker needs, shared by reference.
pub struct PairContext<'a> {
    /// The generator client.
    pub generator: &'a ChatClient,
    /// The judge client (`None` when the quality check is off).
    pub judge: Option<&'a ChatClient>,
    /// The templates.
    pub prompts: &'a PromptSet,
    /// The config (filter, quality).
    pub config: &'a SynthConfig,
    /// Distractor pool.
    pub pool: &'a [PoolPassage],
}

fn fields_shape(name: &str, fields: &[(&str, usize, bool)]) -> ResponseShape {
    ResponseShape::Fields {
        name: name.to_string(),
        fields: fields
            .iter()
            .map(|(n, max, single)| StringField::new(n, *max, *single))
            .collect(),
    }
}

/// Processes one pair: generation, rules, quality check.
pub fn process_pair(ctx: &PairContext<'_>, pair: &Pair) -> PairOutcome {
    let cfg = ctx.config;
    let limits = &cfg.filter;
    let mut rng = pair_rng(cfg.quality.seed, &pair.query_id, &pair.passage_id);
    let seeds: [u64; 7] = std::array::from_fn(|_| rng.random::<u32>() as u64);
    let source = Source {
        query_id: pair.query_id.clone(),
        passage_id: pair.passage_id.clone(),
    };
    let mut prov = Provenance {
        source: source.clone(),
        status: Status::Rejected,
        stage: None,
        reason: None,
        generator_model: ctx.generator.endpoint().model.clone(),
        judge_model: ctx.judge.map(|j| j.endpoint().model.clone()),
        seed: cfg.quality.seed,
        judgments: Vec::new(),
    };
    let mut generated = Map::new();
    let system = ctx.prompts.generator_system.render(&[]);

    macro_rules! ask {
        ($template:expr, $values:expr, $name:expr, $fields:expr, $seed:expr) => {{
            let fields: &[(&str, usize, bool)] = $fields;
            let request = ChatRequest {
                messages: vec![
                    Message::system(system.clone()),
                    Message::user($template.render($values)),
                ],
                shape: Some(fields_shape($name, fields)),
                seed: Some($seed),
            };
            match ctx.generator.complete(&request) {
                Ok(c) => c,
                Err(e) => return PairOutcome::Failed(source, e),
            }
        }};
    }
    macro_rules! reject {
        ($stage:expr, $reason:expr) => {{
            prov.stage = Some($stage);
            prov.reason = Some($reason);
            return PairOutcome::Rejected(prov, generated);
        }};
    }
    macro_rules! fields {
        ($completion:expr, $step:expr, $names:expr) => {
            match parse_fields(&$completion.content, $names) {
                Ok(v) => v,
                Err(p) => {
                    let cut = if $completion.finish_reason.as_deref() == Some("length") {
                        " (the answer hit the token limit)"
                    } else {
                        ""
                    };
                    reject!(Stage::Malformed, format!("{} step: {p}{cut}", $step))
                }
            }
        };
    }
    macro_rules! rule {
        ($text:expr, $kind:expr, $field:expr) => {
            match apply_rule(&$text, $kind, limits) {
                Ok(t) => {
                    generated.insert($field.to_string(), Value::String(t.clone()));
                    t
                }
                Err(v) => {
                    generated.insert($field.to_string(), Value::String($text.clone()));
                    reject!(Stage::Rule, format!("{} {v}", $field))
                }
            }
        };
    }

    // 1. I+ from (Q+, P+).
    let c = ask!(
        ctx.prompts.instruction,
        &[
            ("query", pair.query.as_str()),
            ("passage", pair.passage.as_str())
        ],
        "instruction",
        &[("instruction", limits.max_instruction_chars, true)],
        seeds[0]
    );
    let [i_raw] = fields!(c, "instruction", ["instruction"]);
    let i_pos = rule!(i_raw, TextKind::Instruction, "instruction_positive");

    // 2. I- and Q- (poisoning).
    let c = ask!(
        ctx.prompts.poison,
        &[
            ("query", pair.query.as_str()),
            ("instruction", i_pos.as_str()),
            ("passage", pair.passage.as_str())
        ],
        "poison",
        &[
            ("negative_instruction", limits.max_instruction_chars, true),
            ("negative_query", limits.max_query_chars, true)
        ],
        seeds[1]
    );
    let [in_raw, qn_raw] = fields!(c, "poison", ["negative_instruction", "negative_query"]);
    let i_neg = rule!(in_raw, TextKind::Instruction, "instruction_negative");
    let q_neg = rule!(qn_raw, TextKind::Query, "query_negative");
    if same_text(&i_neg, &i_pos) {
        reject!(
            Stage::Rule,
            "instruction_negative is identical to its positive".to_string()
        );
    }
    if same_text(&q_neg, &pair.query) {
        reject!(
            Stage::Rule,
            "query_negative is identical to its positive".to_string()
        );
    }

    // 3. P1-: relevant to (I-, Q+).
    let c = ask!(
        ctx.prompts.negative_passage_1,
        &[
            ("query", pair.query.as_str()),
            ("instruction", i_pos.as_str()),
            ("negative_instruction", i_neg.as_str()),
            ("passage", pair.passage.as_str())
        ],
        "negative_passage_1",
        &[("passage", limits.max_passage_chars, false)],
        seeds[2]
    );
    let [p1_raw] = fields!(c, "negative_passage_1", ["passage"]);
    let p1 = rule!(p1_raw, TextKind::Passage, "hard_negative_document_1");

    // 4. P2-: relevant to (I+, Q-).
    let c = ask!(
        ctx.prompts.negative_passage_2,
        &[
            ("query", pair.query.as_str()),
            ("negative_query", q_neg.as_str()),
            ("instruction", i_pos.as_str()),
            ("passage", pair.passage.as_str())
        ],
        "negative_passage_2",
        &[("passage", limits.max_passage_chars, false)],
        seeds[3]
    );
    let [p2_raw] = fields!(c, "negative_passage_2", ["passage"]);
    let p2 = rule!(p2_raw, TextKind::Passage, "hard_negative_document_2");
    for (name, p) in [
        ("hard_negative_document_1", &p1),
        ("hard_negative_document_2", &p2),
    ] {
        if same_text(p, &pair.passage) {
            reject!(
                Stage::Rule,
                format!("{name} is identical to document_positive")
            );
        }
    }
    if same_text(&p1, &p2) {
        reject!(
            Stage::Rule,
            "hard_negative_document_1 and hard_negative_document_2 are identical".to_string()
        );
    }

    let record = match InfIrRecord::from_texts([
        &pair.query,
        &i_pos,
        &pair.passage,
        &q_neg,
        &i_neg,
        &p1,
        &p2,
    ]) {
        Ok(r) => r,
        Err((field, problem)) => reject!(Stage::Rule, format!("{field} {problem}")),
    };

    // 5. Quality check.
    let Some(judge) = ctx.judge else {
        prov.status = Status::Kept;
        return PairOutcome::Generated(record, prov);
    };
    let distractors = sample_distractors(
        &mut rng,
        ctx.pool,
        cfg.quality.distractors,
        &pair.passage_id,
        &[&pair.passage, &p1, &p2],
    );
    let base_options: Vec<JudgeOption> = [
        ("document_positive", pair.passage.as_str()),
        ("hard_negative_document_1", p1.as_str()),
        ("hard_negative_document_2", p2.as_str()),
    ]
    .into_iter()
    .map(|(l, t)| JudgeOption {
        label: l.to_string(),
        text: t.to_string(),
    })
    .chain(distractors.iter().map(|d| JudgeOption {
        label: format!("distractor:{}", d.id),
        text: d.text.clone(),
    }))
    .collect();
    let n = base_options.len();
    // One shuffle per pair, shown in all three scenarios: the judge prompt starts with the options,
    // so a server with prompt caching (llama.cpp, OpenAI) processes them once per pair.
    let (options, _) = shuffle_options(&mut rng, base_options, Scenario::Positive.target());
    let rendered = render_options(&options);
    let letters = letters_list(n);
    let shape = ResponseShape::Choice {
        name: "judgment".to_string(),
        letters: (0..n).map(letter).collect(),
    };
    let judge_system = ctx.prompts.judge_system.render(&[]);
    let mut failures = Vec::new();
    for (k, scenario) in Scenario::ALL.into_iter().enumerate() {
        let (instruction, query) = match scenario {
            Scenario::Positive => (&i_pos, &pair.query),
            Scenario::NegativeInstruction => (&i_neg, &pair.query),
            Scenario::NegativeQuery => (&i_pos, &q_neg),
        };
        let target = options
            .iter()
            .position(|o| o.label == scenario.target())
            .expect("the record's three passages are among the options");
        let user = ctx.prompts.judge.render(&[
            ("query", query.as_str()),
            ("instruction", instruction.as_str()),
            ("options", rendered.as_str()),
            ("letters", letters.as_str()),
        ]);
        let request = ChatRequest {
            messages: vec![Message::system(judge_system.clone()), Message::user(user)],
            shape: Some(shape.clone()),
            seed: Some(seeds[4 + k]),
        };
        let c = match judge.complete(&request) {
            Ok(c) => c,
            Err(e) => return PairOutcome::Failed(source, e),
        };
        let chosen = parse_answer(&c.content, n);
        let correct = chosen == Some(target);
        let answer: String = c.content.trim().chars().take(40).collect();
        if !correct {
            failures.push(format!(
                "{scenario:?}: expected {}, answered {answer:?}",
                letter(target)
            ));
        }
        prov.judgments.push(Judgment {
            scenario,
            options: options.iter().map(|o| o.label.clone()).collect(),
            expected: letter(target).to_string(),
            answer,
            chosen: chosen.map(|i| letter(i).to_string()),
            correct,
        });
    }
    if failures.is_empty() {
        prov.status = Status::Kept;
    } else {
        prov.stage = Some(Stage::Judge);
        prov.reason = Some(failures.join("; "));
    }
    PairOutcome::Generated(record, prov)
}

/// Runs the pipeline described by `config`, reporting progress to `progress`, and writes the
/// report to `config.output.report_path()`.
///
/// Pairs already in the output files are skipped; results are appended as they arrive. Uses
/// `client.concurrency` worker threads.
///
/// # Errors
/// Config/endpoint resolution, prompt templates, input loading, resuming the output files, or
/// writing output. Request failures are not errors: they are counted (`this_run.failed`) and
/// the pair is left for a later run.
pub fn run(config: &SynthConfig, progress: &mut dyn Progress) -> Result<SynthReport> {
    let started = Instant::now();
    config.validate()?;
    let (gen_endpoint, judge_endpoint) = config.endpoints()?;
    let prompts = match &config.prompts_dir {
        Some(dir) => PromptSet::from_dir(dir)?,
        None => PromptSet::built_in(),
    };
    let input = load_input(&config.input)?;

    let records_path = config.output.records.clone();
    let rejected_path = config.output.rejected_path();
    let generated_path = config.output.generated_path();
    let (mut records_out, resumed_kept) = JsonlAppender::open_resuming(&records_path)?;
    let (mut rejected_out, resumed_rejected) = JsonlAppender::open_resuming(&rejected_path)?;
    let (mut generated_out, resumed_generated) = JsonlAppender::open_resuming(&generated_path)?;
    let partial_lines_dropped = [&resumed_kept, &resumed_rejected, &resumed_generated]
        .iter()
        .map(|r| u64::from(r.dropped_partial_line))
        .sum();
    // A kept record is written to the generated file first, then to the records file; a crash in
    // between (or an output from before the generated file existed) is repaired here, so that
    // the records file is exactly the kept part of the generated file.
    let repaired = repair_kept(
        &resumed_kept,
        &resumed_generated,
        &mut records_out,
        &mut generated_out,
    )?;
    // One provenance per finished pair; the generated file wins over the others.
    let mut finished_pairs: BTreeMap<Source, Provenance> = BTreeMap::new();
    for r in [&resumed_rejected, &resumed_kept, &resumed_generated] {
        for line in &r.lines {
            finished_pairs.insert(line.provenance.source.clone(), line.provenance.clone());
        }
    }
    let mut total = Tally::default();
    for p in finished_pairs.values() {
        total.add(p);
    }
    let done: HashSet<Source> = finished_pairs.into_keys().collect();

    let mut seen = HashSet::new();
    let unique: Vec<&Pair> = input
        .pairs
        .iter()
        .filter(|p| seen.insert((p.query_id.clone(), p.passage_id.clone())))
        .collect();
    let is_done = |p: &Pair| {
        done.contains(&Source {
            query_id: p.query_id.clone(),
            passage_id: p.passage_id.clone(),
        })
    };
    let todo: Vec<&Pair> = unique.iter().copied().filter(|p| !is_done(p)).collect();
    let already_done = (unique.len() - todo.len()) as u64;

    let budget = Arc::new(Budget::new(config.client.request_budget));
    let retry = RetryPolicy {
        max_retries: config.client.max_retries,
        backoff_initial: Duration::from_millis(config.client.backoff_initial_ms),
        backoff_max: Duration::from_millis(config.client.backoff_max_ms),
    };
    let gen_counters = Arc::new(RequestCounters::default());
    let judge_counters = Arc::new(RequestCounters::default());
    let generator = ChatClient::new(
        gen_endpoint,
        config.timeout(),
        retry,
        budget.clone(),
        gen_counters.clone(),
    );
    let judge = config.quality.enabled.then(|| {
        ChatClient::new(
            judge_endpoint,
            config.timeout(),
            retry,
            budget.clone(),
            judge_counters.clone(),
        )
    });
    let ctx = PairContext {
        generator: &generator,
        judge: judge.as_ref(),
        prompts: &prompts,
        config,
        pool: &input.pool,
    };

    let mut run_counts = RunCounts {
        to_do: todo.len() as u64,
        ..RunCounts::default()
    };
    progress.start(run_counts.to_do, already_done);
    let next = AtomicUsize::new(0);
    let stop = AtomicBool::new(false);
    let finished = AtomicUsize::new(0);
    let mut stopped_early = false;
    let mut failure_samples = Vec::new();
    let mut write_error = None;
    let workers = config.client.concurrency.min(todo.len().max(1));

    std::thread::scope(|s| {
        let (tx, rx) = mpsc::channel::<PairOutcome>();
        for _ in 0..workers {
            let tx = tx.clone();
            let (ctx, todo, next, stop, finished, budget) =
                (&ctx, &todo, &next, &stop, &finished, &budget);
            s.spawn(move || {
                loop {
                    // Checked here too (not only by the writer) so that no worker starts a pair
                    // that is bound to be wasted.
                    let enough = config
                        .stop_after
                        .is_some_and(|n| finished.load(Ordering::SeqCst) >= n);
                    if stop.load(Ordering::SeqCst) || budget.was_exhausted() || enough {
                        break;
                    }
                    let i = next.fetch_add(1, Ordering::SeqCst);
                    let Some(pair) = todo.get(i) else { break };
                    let outcome = process_pair(ctx, pair);
                    if !matches!(outcome, PairOutcome::Failed(..)) {
                        finished.fetch_add(1, Ordering::SeqCst);
                    }
                    if tx.send(outcome).is_err() {
                        break;
                    }
                }
            });
        }
        drop(tx);
        for outcome in rx {
            let written = match &outcome {
                PairOutcome::Generated(record, prov) => {
                    let line = kept_line(record, prov);
                    generated_out
                        .append(&line)
                        .and_then(|()| match prov.status {
                            Status::Kept => records_out.append(&line),
                            Status::Rejected => Ok(()),
                        })
                        .map(|()| prov)
                }
                PairOutcome::Rejected(prov, generated) => rejected_out
                    .append(&rejected_line(generated, prov))
                    .map(|()| prov),
                PairOutcome::Failed(src, e) => {
                    run_counts.failed += 1;
                    if failure_samples.len() < FAILURE_SAMPLES {
                        failure_samples.push(format!(
                            "query {} / passage {}: {e}",
                            src.query_id, src.passage_id
                        ));
                    }
                    if matches!(e, RequestError::BudgetExhausted) || budget.was_exhausted() {
                        stop.store(true, Ordering::SeqCst);
                    }
                    progress.update(&run_counts);
                    continue;
                }
            };
            match written {
                Ok(prov) => {
                    let mut t = Tally {
                        counts: run_counts.counts,
                        ..Tally::default()
                    };
                    t.add(prov);
                    run_counts.counts = t.counts;
                    total.add(prov);
                }
                Err(e) => {
                    // Stop the workers; the error is returned after they finish.
                    stop.store(true, Ordering::SeqCst);
                    write_error.get_or_insert(e);
                }
            }
            if let Some(n) = config.stop_after
                && run_counts.counts.finished >= n as u64
                && !stop.swap(true, Ordering::SeqCst)
            {
                stopped_early = true;
            }
            progress.update(&run_counts);
        }
    });
    if let Some(e) = write_error {
        return Err(e);
    }

    let remaining = (unique.len() as u64).saturating_sub(already_done + run_counts.counts.finished);
    let report = SynthReport {
        records_path,
        rejected_path,
        generated_path,
        repaired_lines: repaired,
        generator_model: generator.endpoint().model.clone(),
        judge_model: judge.as_ref().map(|j| j.endpoint().model.clone()),
        distractors: config.quality.distractors,
        seed: config.quality.seed,
        input_pairs: unique.len() as u64,
        missing_passages: input.missing_passages as u64,
        already_done,
        this_run: run_counts,
        total: total.counts,
        scenarios: total.scenarios.to_vec(),
        retention: (total.counts.generated > 0)
            .then(|| total.counts.kept as f64 / total.counts.generated as f64),
        remaining,
        generator_requests: gen_counters.snapshot(),
        judge_requests: judge_counters.snapshot(),
        request_budget: config.client.request_budget,
        budget_exhausted: budget.was_exhausted(),
        stopped_early,
        partial_lines_dropped,
        failure_samples,
        elapsed_secs: started.elapsed().as_secs_f64(),
    };
    let report_path = config.output.report_path();
    let text = serde_json::to_string_pretty(&report).expect("the report serializes");
    std::fs::write(&report_path, text + "\n").map_err(|source| crate::Error::Io {
        path: report_path,
        source,
    })?;
    progress.finish(&report);
    Ok(report)
}

/// Makes the records file the kept part of the generated file: appends to the records file every
/// kept generated line it lacks, and to the generated file every record line it lacks. Returns
/// the number of lines appended.
fn repair_kept(
    kept: &Resumed,
    generated: &Resumed,
    records_out: &mut JsonlAppender,
    generated_out: &mut JsonlAppender,
) -> Result<u64> {
    let in_kept: HashSet<&Source> = kept.lines.iter().map(|l| &l.provenance.source).collect();
    let in_generated: HashSet<&Source> = generated
        .lines
        .iter()
        .map(|l| &l.provenance.source)
        .collect();
    let mut repaired = 0;
    for line in &generated.lines {
        if line.provenance.status == Status::Kept && !in_kept.contains(&line.provenance.source) {
            records_out.append(&line.value)?;
            repaired += 1;
        }
    }
    for line in &kept.lines {
        if !in_generated.contains(&line.provenance.source) {
            generated_out.append(&line.value)?;
            repaired += 1;
        }
    }
    Ok(repaired)
}
