//! `infembed eval`: evaluate a retriever on an instruction-following or ad hoc test.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use clap::Args;
use infembed::data::{self, Collection, QueryTemplate};
use infembed::encoder::{Interaction, ModelInfo};
use infembed::metrics::{Run, TieBreak};
use infembed::{
    Bm25Config, Bm25Retriever, EmbeddingIndex, EncoderRetriever, EvalConfig, EvalResults,
    EvaluatedModel, FollowIrOutcome, FollowIrReport, ReportedMeasure, RetrievalReport, Retriever,
    Stemmer, StopWords, evaluate_followir, evaluate_retrieval, load_heldout,
};

use super::load_encoder;

#[derive(Args)]
#[command(group(clap::ArgGroup::new("set").required(true)
    .args(["data", "beir", "followir", "collection"])))]
pub struct EvalArgs {
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
    /// The corpus's passage embeddings, written by `infembed embed` from the same corpus with the
    /// same model (f32 or f16, memory-mapped): looked up by document id instead of embedding the
    /// corpus again. Only the queries are encoded.
    #[arg(long, requires = "model")]
    index: Option<PathBuf>,
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
    /// BM25 stemming: none, or porter (Lucene's Porter stemmer, Pyserini's default).
    #[arg(long, default_value = "none", conflicts_with = "model")]
    stemmer: Stemmer,
    /// BM25 stop words: none, or lucene (the 33 English stop words Pyserini removes).
    #[arg(long, default_value = "none", conflicts_with = "model")]
    stopwords: StopWords,
    /// Documents kept per query for ad hoc retrieval runs.
    #[arg(long, default_value_t = 1000)]
    depth: usize,
    /// Print the results as one JSON object on stdout instead of a table: mteb's layout
    /// (fractions, `main_score`, the split, `evaluation_time`), with the model's name, revision,
    /// base model, template and settings, and the infembed version.
    #[arg(long)]
    json: bool,
    /// Also write the results (the `--json` object) to
    /// DIR/<model name, / as __>/<revision>/<set>.json, with model_meta.json beside it, as
    /// mteb's results folders are laid out.
    #[arg(long, value_name = "DIR")]
    results: Option<PathBuf>,
    /// Write TREC run files into this folder (og.trec and changed.trec, or run.trec), and for
    /// instruction-following tests p-MRR in detail: p-mrr.tsv (query, p-MRR x100) and
    /// p-mrr-documents.tsv (query, document, rank under the original and under the changed
    /// instruction, the document's score x100), pictured in p-mrr.svg and p-mrr.png.
    #[arg(long)]
    run_dir: Option<PathBuf>,
    #[command(flatten)]
    device: super::device::DeviceArgs,
}

pub fn run(args: &EvalArgs) -> Result<()> {
    let started = Instant::now();
    let config = EvalConfig::default().with_depth(args.depth);
    let (mut retriever, model): (Box<dyn Retriever>, EvaluatedModel) = match &args.model {
        Some(dir) => {
            let encoder = load_encoder(dir, args.encoder_config.as_deref(), &args.device)?;
            let info = ModelInfo::of_dir(dir)?;
            let ours = encoder.source_dir().display().to_string();
            let template = match &encoder.config().interaction {
                Interaction::SelfAttention { template, .. } => Some(template.as_str().to_string()),
                Interaction::CrossAttention(_) => None,
            };
            let mut model = EvaluatedModel::new(
                &info.name,
                &info.revision,
                template,
                serde_json::to_value(encoder.config())?,
            );
            if let Some(base) = &info.base_model {
                model = model.with_base(&base.name, &base.revision);
            }
            let retriever = EncoderRetriever::new(encoder, info.name.clone());
            let retriever: Box<dyn Retriever> = match &args.index {
                Some(path) => {
                    let index = EmbeddingIndex::open(path)?;
                    if !index.model.is_empty() && index.model != ours {
                        eprintln!(
                            "warning: {} was embedded with model {}, evaluating {ours}",
                            path.display(),
                            index.model
                        );
                    }
                    Box::new(retriever.with_index(index)?)
                }
                None => Box::new(retriever),
            };
            (retriever, model)
        }
        None => {
            let template = QueryTemplate::new(&args.template)?;
            let bm25 = Bm25Config {
                k1: args.k1,
                b: args.b,
                stemmer: args.stemmer,
                stopwords: args.stopwords,
            };
            // The settings as configs name them (Bm25Config's serde, the choices' names).
            let settings = serde_json::to_value(bm25)?;
            let revision = format!(
                "k1={},b={},stemmer={},stopwords={}",
                bm25.k1, bm25.b, bm25.stemmer, bm25.stopwords
            );
            let model =
                EvaluatedModel::new("bm25", revision, Some(args.template.clone()), settings);
            (Box::new(Bm25Retriever::new(bm25, template)), model)
        }
    };
    let retriever: &mut dyn Retriever = retriever.as_mut();

    if args.data.is_some() || args.followir.is_some() {
        let (set, split) = match (&args.data, &args.followir) {
            (Some(path), _) => (load_heldout(path, args.distractors.as_deref())?, "test"),
            (None, Some(dir)) => (data::load_followir(dir, &args.split)?, args.split.as_str()),
            (None, None) => unreachable!("checked above"),
        };
        let outcome = evaluate_followir(&set, retriever, &config)?;
        let results = EvalResults::followir(
            &outcome.report,
            split,
            model,
            started.elapsed().as_secs_f64(),
        );
        write_followir(args, &outcome)?;
        return finish(args, &results, || print_followir(&outcome.report));
    }
    let set = if let Some(dir) = &args.beir {
        data::load_beir(dir, &args.split)?
    } else if let Some(name) = &args.collection {
        let collection = Collection::from_folder(name).with_context(|| {
            format!("unknown collection `{name}` (cacm, cisi, cranfield, vaswani, msmarco-subset)")
        })?;
        let root = match &args.shared_data {
            Some(dir) => dir.clone(),
            None => Some(super::shared_data_from_env().unwrap_or_else(|| "../shared/data".into()))
                .filter(|d| d.is_dir())
                .context(
                    "shared data not found: pass --shared-data DIR or set INFEMBED_SHARED_DATA",
                )?,
        };
        collection.load_from_root(&root)?
    } else {
        bail!("give one of --data, --beir, --followir, --collection");
    };
    let outcome = evaluate_retrieval(&set, retriever, &config)?;
    let split = if args.beir.is_some() {
        args.split.as_str()
    } else {
        "test"
    };
    let results = EvalResults::retrieval(
        &outcome.report,
        split,
        model,
        started.elapsed().as_secs_f64(),
    );
    write_runs(args, &[("run", &outcome.run)])?;
    finish(args, &results, || print_retrieval(&outcome.report))
}

/// Writes `--results`, then prints the JSON object (`--json`) or the table.
fn finish(args: &EvalArgs, results: &EvalResults, table: impl FnOnce()) -> Result<()> {
    if let Some(folder) = &args.results {
        let path = results.write(folder)?;
        eprintln!("wrote {}", path.display());
    }
    if args.json {
        println!("{}", serde_json::to_string(results)?);
    } else {
        table();
    }
    Ok(())
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

/// `--run-dir` for an instruction-following test: both runs, then p-MRR per query and per
/// changed document.
fn write_followir(args: &EvalArgs, outcome: &FollowIrOutcome) -> Result<()> {
    write_runs(
        args,
        &[("og", &outcome.og_run), ("changed", &outcome.changed_run)],
    )?;
    let Some(dir) = &args.run_dir else {
        return Ok(());
    };
    let mut per_query = String::from("query\tp_mrr\n");
    for (query, value) in &outcome.p_mrr.per_query {
        per_query.push_str(&format!("{query}\t{}\n", 100.0 * value));
    }
    let mut documents = String::from("query\tdoc\tog_rank\tchanged_rank\tscore\n");
    for d in &outcome.p_mrr.documents {
        documents.push_str(&format!(
            "{}\t{}\t{}\t{}\t{}\n",
            d.query,
            d.doc,
            d.og_rank,
            d.changed_rank,
            100.0 * d.score
        ));
    }
    for (name, text) in [("p-mrr.tsv", per_query), ("p-mrr-documents.tsv", documents)] {
        let path = dir.join(name);
        infembed::data::write_atomic(&path, text.as_bytes())
            .with_context(|| format!("writing {}", path.display()))?;
        eprintln!("wrote {}", path.display());
    }
    let series = infembed::eval_series(&outcome.report.retriever, &outcome.p_mrr);
    let title = format!(
        "{}: p-MRR per query and ranks of the changed documents",
        outcome.report.name
    );
    for path in infembed::train::evaluation_chart(&title, &[series])?.write(&dir.join("p-mrr"))? {
        eprintln!("wrote {}", path.display());
    }
    Ok(())
}

/// What every report's header line names: set, retriever, query and document counts.
type Header<'a> = (&'a str, &'a str, usize, usize);

/// Prints a header line and a table of labelled values (`None` prints as n/a).
fn print_table((name, retriever, n_queries, n_docs): Header<'_>, rows: &[ReportedMeasure]) {
    println!("{name} | {retriever} | {n_queries} queries, {n_docs} documents");
    for ReportedMeasure { label, value, .. } in rows {
        match value {
            Some(v) => println!("  {label:<22}{v:>7.2}"),
            None => println!("  {label:<22}{:>7}", "n/a"),
        }
    }
}

fn print_followir(r: &FollowIrReport) {
    let header = (r.name.as_str(), r.retriever.as_str(), r.n_queries, r.n_docs);
    print_table(header, &r.measures());
}

fn print_retrieval(r: &RetrievalReport) {
    let header = (r.name.as_str(), r.retriever.as_str(), r.n_queries, r.n_docs);
    print_table(header, &r.measures());
}
