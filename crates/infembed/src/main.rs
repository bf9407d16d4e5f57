//! The `infembed` command line.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, Result, bail};
use burn::tensor::Device;
use clap::{Args, Parser, Subcommand};
use infembed::data::{self, Collection, QueryTemplate};
use infembed::encoder::{DualEncoder, EncoderConfig};
use infembed::lexical::Bm25Config;
use infembed::metrics::{EvalOptions, Measure, Qrels, Run, TieBreak, evaluate_with};
use infembed::{
    Bm25Retriever, EmbeddingIndex, EncoderRetriever, EvalConfig, FollowIrReport, IndexFormat,
    RetrievalReport, Retriever, Side, embed_passages, embed_records, evaluate_followir,
    evaluate_retrieval, read_texts,
};

#[derive(Parser)]
#[command(
    name = "infembed",
    version,
    about = "Instruction-following retrieval: evaluation and tools"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Evaluate a retriever on an instruction-following or ad hoc retrieval test.
    Eval(Box<EvalArgs>),
    /// trec_eval-compatible evaluation of a TREC run file against a TREC qrels file.
    TrecEval(TrecEvalArgs),
    /// Synthesize InF-IR records from (query, passage) pairs with an OpenAI-compatible LLM server.
    Synth(SynthArgs),
    /// Embed the texts of a JSONL file and save the embeddings (.safetensors or .npy).
    Embed(EmbedArgs),
    /// Search a JSONL corpus or a saved index with an instruction and a query.
    Search(SearchArgs),
    /// Fine-tune an embedding model on InF-IR records (config: docs/training.md).
    Train(TrainArgs),
    /// Zero-shot eval, fine-tune, eval again: the before/after table (README's first command).
    Quickstart(QuickstartArgs),
}

#[derive(Args)]
struct TrainArgs {
    /// The training config (TOML or JSON); every key is in docs/training.md.
    #[arg(long)]
    config: PathBuf,
    /// Continue from the newest checkpoint in the config's output_dir (after a crash or kill).
    #[arg(long)]
    resume: bool,
    /// Progress display: `auto` (burn-train's dashboard when stdout and stderr are
    /// terminals, plain lines otherwise), `plain`, or `dashboard`. Quitting the dashboard
    /// (q) stops after the current step with a checkpoint, for --resume.
    #[arg(long, default_value = "auto")]
    progress: infembed::train::ProgressMode,
}

#[derive(Args)]
struct QuickstartArgs {
    /// The training config of the quickstart.
    #[arg(long, default_value = "examples/configs/quickstart.toml")]
    config: PathBuf,
    /// Where the shared data (msmarco-subset) lives (default: $INFEMBED_SHARED_DATA, else
    /// ../shared/data).
    #[arg(long)]
    shared_data: Option<PathBuf>,
    /// Print the report as one JSON object on stdout.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
#[command(group(clap::ArgGroup::new("side").args(["passages", "queries"])))]
struct EmbedArgs {
    /// The model directory (e.g. models/all-MiniLM-L6-v2 after `cargo xtask fetch-model`).
    #[arg(long)]
    model: PathBuf,
    /// JSONL input, one object per line: `id` or `_id`, `text`, optional `title` (passages) and
    /// `instruction` (queries).
    #[arg(long)]
    input: PathBuf,
    /// Output file; its extension picks the format: .safetensors (embeddings, ids and model in one
    /// file) or .npy (plus FILE.ids.txt, one id per line).
    #[arg(long)]
    output: PathBuf,
    /// Encoder config JSON (towers, interaction, template, max lengths, prefixes).
    #[arg(long)]
    encoder_config: Option<PathBuf>,
    /// Embed the texts as passages, "{title} {text}" (the default).
    #[arg(long)]
    passages: bool,
    /// Embed the texts as queries, (instruction, text) through the query tower.
    #[arg(long)]
    queries: bool,
}

#[derive(Args)]
#[command(group(clap::ArgGroup::new("source").required(true).args(["corpus", "index"])))]
struct SearchArgs {
    /// The model directory (e.g. models/all-MiniLM-L6-v2 after `cargo xtask fetch-model`).
    #[arg(long)]
    model: PathBuf,
    /// A JSONL corpus (as for `infembed embed`), embedded on the fly.
    #[arg(long)]
    corpus: Option<PathBuf>,
    /// An index written by `infembed embed` (.safetensors, or .npy with its .ids.txt).
    #[arg(long)]
    index: Option<PathBuf>,
    /// Encoder config JSON; must match the one the index was embedded with.
    #[arg(long)]
    encoder_config: Option<PathBuf>,
    /// The query.
    #[arg(long)]
    query: String,
    /// The instruction that goes with the query (empty by default).
    #[arg(long, default_value = "")]
    instruction: String,
    /// How many documents to print.
    #[arg(short, long, default_value_t = 10)]
    k: usize,
    /// Print one JSON object on stdout instead of a table.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
struct SynthArgs {
    /// The synthesis config (TOML or JSON); see docs/synthesis.md.
    #[arg(long)]
    config: PathBuf,
}

#[derive(Args)]
#[command(group(clap::ArgGroup::new("set").required(true)
    .args(["data", "beir", "followir", "collection"])))]
struct EvalArgs {
    /// An InF-IR-format JSONL (or Parquet) file: the held-out instruction-following test of
    /// data/inf-ir-sample/README.md is built from it (p-MRR, nDCG, MAP, MRR, pairwise accuracy).
    #[arg(long)]
    data: Option<PathBuf>,
    /// Distractor passages (JSONL with passage_id, passage) added to the --data corpus.
    #[arg(long, requires = "data")]
    distractors: Option<PathBuf>,
    /// A BEIR-layout folder (corpus.jsonl, queries.jsonl, qrels/SPLIT.tsv).
    #[arg(long)]
    beir: Option<PathBuf>,
    /// A FollowIR folder in its published layout (re-ranks top_ranked when present).
    #[arg(long)]
    followir: Option<PathBuf>,
    /// A classic collection from the shared data: cacm, cisi, cranfield, vaswani, msmarco-subset.
    #[arg(long)]
    collection: Option<String>,
    /// Where the shared data lives (default: $INFEMBED_SHARED_DATA, else ../shared/data).
    #[arg(long)]
    shared_data: Option<PathBuf>,
    /// The qrels split of a BEIR or FollowIR folder.
    #[arg(long, default_value = "test")]
    split: String,
    /// A model directory (Hugging Face / sentence-transformers layout, or saved by infembed), e.g.
    /// models/all-MiniLM-L6-v2 after `cargo xtask fetch-model`. Without it, the BM25 baseline runs.
    #[arg(long)]
    model: Option<PathBuf>,
    /// Encoder config JSON (towers, interaction, template, max lengths, prefixes); with --model.
    #[arg(long, requires = "model")]
    encoder_config: Option<PathBuf>,
    /// BM25 query template with {Q} (query) and {I} (instruction). A model's template is part of
    /// its encoder config.
    #[arg(long, default_value = QueryTemplate::DEFAULT, conflicts_with = "model")]
    template: String,
    /// BM25 k1 (the lexical baseline).
    #[arg(long, default_value_t = Bm25Config::default().k1)]
    k1: f32,
    /// BM25 b (the lexical baseline).
    #[arg(long, default_value_t = Bm25Config::default().b)]
    b: f32,
    /// Documents kept per query for ad hoc retrieval runs.
    #[arg(long, default_value_t = 1000)]
    depth: usize,
    /// Print one JSON object on stdout instead of a table.
    #[arg(long)]
    json: bool,
    /// Write TREC run files into this folder.
    #[arg(long)]
    run_dir: Option<PathBuf>,
}

#[derive(Args)]
struct TrecEvalArgs {
    /// TREC qrels file (query 0 doc label).
    qrels: PathBuf,
    /// TREC run file (query Q0 doc rank score tag).
    run: PathBuf,
    /// Comma-separated measures in trec_eval names (default: trec_eval's standard set).
    #[arg(short, long)]
    measures: Option<String>,
    /// Also print per-query values.
    #[arg(short, long)]
    q: bool,
    /// Average over all judged queries (trec_eval -c).
    #[arg(short, long)]
    c: bool,
}

fn main() -> ExitCode {
    match run(Cli::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}", one_line(&e));
            ExitCode::FAILURE
        }
    }
}

/// The error and its causes on one line, leaving out a cause whose text the message before it
/// already contains (the workspace's errors name their source in their own message).
fn one_line(e: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if !line.contains(&text) {
            if !line.is_empty() {
                line.push_str(": ");
            }
            line.push_str(&text);
        }
    }
    line
}

fn run(cli: Cli) -> Result<()> {
    match cli.command {
        Command::Eval(args) => eval(&args),
        Command::TrecEval(args) => trec_eval(&args),
        Command::Synth(args) => synth(&args),
        Command::Embed(args) => embed(&args),
        Command::Search(args) => search(&args),
        Command::Train(args) => train(&args),
        Command::Quickstart(args) => quickstart(&args),
    }
}

fn train(args: &TrainArgs) -> Result<()> {
    let config = infembed::train::TrainConfig::from_file(&args.config)?;
    eprintln!("{}", infembed::train::describe(&config));
    let summary = infembed::train(config, args.resume, args.progress)?;
    eprintln!(
        "done: {} optimizer steps, {:.2} rows/s in this process{}",
        summary.steps,
        summary.rows_per_second(),
        summary
            .final_dir
            .map(|d| format!(", model saved to {}", d.display()))
            .unwrap_or_default()
    );
    Ok(())
}

fn quickstart(args: &QuickstartArgs) -> Result<()> {
    let report = infembed::quickstart::run(&args.config, args.shared_data.as_deref())?;
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
        return Ok(());
    }
    println!(
        "\nquickstart: {} optimizer steps (seed {}), {:.2} training rows/s, {:.0} s in all",
        report.steps, report.seed, report.rows_per_second, report.total_seconds
    );
    print!("{}", report.markdown());
    if let Some(why) = &report.skipped {
        println!("(msmarco-subset skipped: {why})");
    }
    if let Some(dir) = &report.model_dir {
        println!("fine-tuned model: {}", dir.display());
    }
    println!("training plot: {}", report.plot.display());
    Ok(())
}

fn load_encoder(model: &Path, encoder_config: Option<&Path>) -> Result<DualEncoder> {
    let config = match encoder_config {
        Some(path) => EncoderConfig::from_file(path)?,
        None => EncoderConfig::default(),
    };
    if !model.is_dir() {
        bail!(
            "model directory {} not found: pass --model DIR (a Hugging Face / sentence-transformers \
             model directory; `cargo xtask fetch-model` puts all-MiniLM-L6-v2 in \
             models/all-MiniLM-L6-v2)",
            model.display()
        );
    }
    // A directory saved by `infembed train` carries its encoder config (template, lengths,
    // towers); it applies unless --encoder-config overrides it.
    if encoder_config.is_none() && model.join("infembed_encoder.json").is_file() {
        return Ok(DualEncoder::load_saved(model, &Device::default())?);
    }
    Ok(DualEncoder::from_dir(model, config, &Device::default())?)
}

fn embed(args: &EmbedArgs) -> Result<()> {
    // Cheap checks first: the output format and the input, before loading the model.
    IndexFormat::from_path(&args.output)?;
    let records = read_texts(&args.input)?;
    let encoder = load_encoder(&args.model, args.encoder_config.as_deref())?;
    let side = if args.queries {
        Side::Queries
    } else {
        Side::Passages
    };
    let start = std::time::Instant::now();
    let mut index = embed_records(&encoder, &records, side)?;
    let seconds = start.elapsed().as_secs_f64();
    index.save(&args.output)?;
    eprintln!(
        "embedded {} {} (d = {}) in {seconds:.1} s -> {}",
        index.len(),
        if args.queries { "queries" } else { "passages" },
        index.dim,
        args.output.display()
    );
    Ok(())
}

fn search(args: &SearchArgs) -> Result<()> {
    let encoder;
    let (index, records) = if let Some(corpus) = &args.corpus {
        let records = read_texts(corpus)?;
        encoder = load_encoder(&args.model, args.encoder_config.as_deref())?;
        (embed_passages(&encoder, &records)?, records)
    } else if let Some(path) = &args.index {
        let index = EmbeddingIndex::load(path)?;
        encoder = load_encoder(&args.model, args.encoder_config.as_deref())?;
        let ours = encoder.source_dir().display().to_string();
        if !index.model.is_empty() && index.model != ours {
            eprintln!(
                "warning: {} was embedded with model {}, searching with {ours}",
                path.display(),
                index.model
            );
        }
        (index, Vec::new())
    } else {
        bail!("give --corpus FILE.jsonl or --index FILE.safetensors");
    };
    let hits = infembed::search(&encoder, &index, &args.instruction, &args.query, args.k)?;
    let text_of: std::collections::HashMap<&str, String> = records
        .iter()
        .map(|r| (r.id.as_str(), r.passage_text()))
        .collect();
    let snippet = |id: &str| {
        text_of
            .get(id)
            .map(|t| t.chars().take(100).collect::<String>())
    };
    if args.json {
        let hits: Vec<serde_json::Value> = hits
            .iter()
            .map(|h| {
                serde_json::json!({
                    "rank": h.rank,
                    "score": h.score,
                    "id": h.id,
                    "text": snippet(&h.id),
                })
            })
            .collect();
        let out = serde_json::json!({
            "query": args.query,
            "instruction": args.instruction,
            "model": encoder.source_dir().display().to_string(),
            "n_docs": index.len(),
            "hits": hits,
        });
        println!("{out}");
        return Ok(());
    }
    for h in &hits {
        let text = snippet(&h.id)
            .unwrap_or_default()
            .replace(['\n', '\r', '\t'], " ");
        println!("{:>4}  {:>8.4}  {}  {text}", h.rank, h.score, h.id);
    }
    Ok(())
}

fn eval(args: &EvalArgs) -> Result<()> {
    let config = EvalConfig {
        depth: args.depth,
        ..EvalConfig::default()
    };
    let mut retriever: Box<dyn Retriever> = match &args.model {
        Some(dir) => {
            let encoder = load_encoder(dir, args.encoder_config.as_deref())?;
            let name = dir.file_name().map_or_else(
                || dir.display().to_string(),
                |n| n.to_string_lossy().into_owned(),
            );
            Box::new(EncoderRetriever::new(encoder, name))
        }
        None => {
            let template = QueryTemplate::new(&args.template)?;
            Box::new(Bm25Retriever::new(
                Bm25Config {
                    k1: args.k1,
                    b: args.b,
                },
                template,
            ))
        }
    };
    let retriever: &mut dyn Retriever = retriever.as_mut();

    if let Some(path) = &args.data {
        let records = data::read_records(path, data::ReadMode::Strict)?.records;
        let distractors = match &args.distractors {
            Some(p) => data::read_distractors(p)?,
            None => Vec::new(),
        };
        let name = path
            .file_stem()
            .map_or("data".into(), |s| s.to_string_lossy().into_owned());
        let set = data::build_heldout(&name, &records, &distractors)?;
        let outcome = evaluate_followir(&set, retriever, &config)?;
        write_runs(
            args,
            &[("og", &outcome.og_run), ("changed", &outcome.changed_run)],
        )?;
        return print_followir(&outcome.report, args.json);
    }
    if let Some(dir) = &args.followir {
        let set = data::load_followir(dir, &args.split)?;
        let outcome = evaluate_followir(&set, retriever, &config)?;
        write_runs(
            args,
            &[("og", &outcome.og_run), ("changed", &outcome.changed_run)],
        )?;
        return print_followir(&outcome.report, args.json);
    }
    let set = if let Some(dir) = &args.beir {
        data::load_beir(dir, &args.split)?
    } else if let Some(name) = &args.collection {
        let collection = Collection::from_folder(name).with_context(|| {
            format!("unknown collection `{name}` (cacm, cisi, cranfield, vaswani, msmarco-subset)")
        })?;
        let root = match &args.shared_data {
            Some(dir) => dir.clone(),
            None => data::shared_data_dir(".").context(
                "shared data not found: pass --shared-data DIR or set INFEMBED_SHARED_DATA",
            )?,
        };
        collection.load_from_root(&root)?
    } else {
        bail!("give one of --data, --beir, --followir, --collection");
    };
    let outcome = evaluate_retrieval(&set, retriever, &config)?;
    write_runs(args, &[("run", &outcome.run)])?;
    print_retrieval(&outcome.report, args.json)
}

fn write_runs(args: &EvalArgs, runs: &[(&str, &Run)]) -> Result<()> {
    let Some(dir) = &args.run_dir else {
        return Ok(());
    };
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    for (name, run) in runs {
        let path = dir.join(format!("{name}.trec"));
        run.write(&path, TieBreak::DocIdDescending)?;
        eprintln!("wrote {}", path.display());
    }
    Ok(())
}

/// What every report's header line names: set, retriever, query and document counts.
type Header<'a> = (&'a str, &'a str, usize, usize);

/// Prints a report as one JSON object, or as a header line and a table of labelled values
/// (`None` prints as n/a).
fn print_report(
    report: &impl serde::Serialize,
    json: bool,
    (name, retriever, n_queries, n_docs): Header<'_>,
    rows: &[(&str, Option<f64>)],
) -> Result<()> {
    if json {
        println!("{}", serde_json::to_string(report)?);
        return Ok(());
    }
    println!("{name} | {retriever} | {n_queries} queries, {n_docs} documents");
    for (label, value) in rows {
        match value {
            Some(v) => println!("  {label:<22}{v:>7.2}"),
            None => println!("  {label:<22}{:>7}", "n/a"),
        }
    }
    Ok(())
}

fn print_followir(r: &FollowIrReport, json: bool) -> Result<()> {
    let header = (r.name.as_str(), r.retriever.as_str(), r.n_queries, r.n_docs);
    let rows = [
        ("p-MRR", Some(r.p_mrr)),
        ("nDCG@5   (original)", Some(r.ndcg_at_5)),
        ("nDCG@10  (original)", Some(r.ndcg_at_10)),
        ("MAP@1000 (original)", Some(r.map_at_1000)),
        ("MRR@10   (original)", Some(r.mrr_at_10)),
        ("nDCG@10  (changed)", Some(r.changed_ndcg_at_10)),
        ("pairwise accuracy", r.pairwise_accuracy),
    ];
    print_report(r, json, header, &rows)
}

fn print_retrieval(r: &RetrievalReport, json: bool) -> Result<()> {
    let header = (r.name.as_str(), r.retriever.as_str(), r.n_queries, r.n_docs);
    let rows = [
        ("nDCG@10", Some(r.ndcg_at_10)),
        ("MAP@1000", Some(r.map_at_1000)),
        ("MRR@10", Some(r.mrr_at_10)),
        ("P@10", Some(r.p_at_10)),
        ("Recall@100", Some(r.recall_at_100)),
    ];
    print_report(r, json, header, &rows)
}

fn trec_eval(args: &TrecEvalArgs) -> Result<()> {
    let qrels = Qrels::read(&args.qrels)?;
    let run = Run::read(&args.run)?;
    let measures = match &args.measures {
        Some(list) => Measure::parse_list(list)?,
        None => Measure::trec_eval_all(),
    };
    let options = EvalOptions {
        complete: args.c,
        ..EvalOptions::default()
    };
    let evaluation = evaluate_with(&qrels, &run, &measures, &options)?;
    let stdout = std::io::stdout();
    evaluation.write_trec_eval(stdout.lock(), args.q)?;
    Ok(())
}

fn synth(args: &SynthArgs) -> Result<()> {
    let config = infembed_synth::SynthConfig::from_file(&args.config)?;
    let mut progress = infembed_synth::StderrProgress::default();
    let report = infembed_synth::run(&config, &mut progress)?;
    println!("{}", serde_json::to_string_pretty(&report)?);
    if report.this_run.failed > 0 {
        bail!(
            "{} pairs failed (see failure_samples); rerun to retry them",
            report.this_run.failed
        );
    }
    Ok(())
}
