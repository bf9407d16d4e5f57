//! `infembed search`: rank a JSONL corpus or a saved index for an instruction and a query, or
//! for a file of queries at once (a TREC run).

use std::path::PathBuf;

use anyhow::{Result, bail};
use clap::Args;
use infembed::{EmbeddingIndex, embed_passages, read_texts};

use super::load_encoder;

#[derive(Args)]
#[command(group(clap::ArgGroup::new("source").required(true).args(["corpus", "index"])))]
#[command(group(clap::ArgGroup::new("asked").required(true).args(["query", "queries"])))]
pub struct SearchArgs {
    /// The model directory (e.g. models/all-MiniLM-L6-v2 after `cargo xtask fetch-model`).
    #[arg(long)]
    model: PathBuf,
    /// A JSONL corpus (as for `infembed embed`), embedded on the fly.
    #[arg(long)]
    corpus: Option<PathBuf>,
    /// An index written by `infembed embed` (.safetensors, or .npy with its .ids.txt), f32 or
    /// f16; it is memory-mapped, not read.
    #[arg(long)]
    index: Option<PathBuf>,
    /// Encoder config JSON; must match the one the index was embedded with.
    #[arg(long)]
    encoder_config: Option<PathBuf>,
    /// The query.
    #[arg(long)]
    query: Option<String>,
    /// The instruction that goes with the query (empty by default). With --queries, each query's
    /// instruction comes from the file.
    #[arg(long, default_value = "", conflicts_with = "queries")]
    instruction: String,
    /// A JSONL file of queries (`id` or `_id`, `text`, optional `instruction`), searched in one
    /// pass over the index; the hits are written as a TREC run (`qid Q0 doc rank score tag`).
    #[arg(long, conflicts_with = "json")]
    queries: Option<PathBuf>,
    /// Where the TREC run of --queries goes (standard output by default).
    #[arg(long, requires = "queries")]
    output: Option<PathBuf>,
    /// How many documents to print (per query).
    #[arg(short, long, default_value_t = 10)]
    k: usize,
    /// Print one JSON object on stdout instead of a table.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    device: super::device::DeviceArgs,
}

pub fn run(args: &SearchArgs) -> Result<()> {
    let encoder;
    let (index, records) = if let Some(corpus) = &args.corpus {
        let records = read_texts(corpus)?;
        encoder = load_encoder(&args.model, args.encoder_config.as_deref(), &args.device)?;
        (embed_passages(&encoder, &records)?, records)
    } else if let Some(path) = &args.index {
        let index = EmbeddingIndex::open(path)?;
        encoder = load_encoder(&args.model, args.encoder_config.as_deref(), &args.device)?;
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
    if let Some(queries) = &args.queries {
        return search_many(&encoder, &index, queries, args);
    }
    let query = args.query.as_deref().unwrap_or_default();
    let hits = infembed::search(&encoder, &index, &args.instruction, query, args.k)?;
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
            "query": query,
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

/// `--queries`: every query of the file embedded, searched in one pass over the index, the hits
/// written as a TREC run.
fn search_many(
    encoder: &infembed::encoder::DualEncoder,
    index: &EmbeddingIndex,
    queries: &std::path::Path,
    args: &SearchArgs,
) -> Result<()> {
    use std::io::Write;
    let records = read_texts(queries)?;
    let embedded = infembed::embed_queries(encoder, &records)?;
    index.check_dim(embedded.dim, &encoder.source_dir().display().to_string())?;
    let start = std::time::Instant::now();
    let hits = index.search_batch(&embedded.embeddings(), args.k)?;
    let seconds = start.elapsed().as_secs_f64();
    // A TREC run line is whitespace-separated: an id with whitespace cannot go in one.
    let spaced = |id: &str| id.is_empty() || id.contains(char::is_whitespace);
    if let Some(q) = records.iter().find(|r| spaced(&r.id)) {
        anyhow::bail!(
            "query id {:?} in {} holds whitespace, which a TREC run cannot hold",
            q.id,
            queries.display()
        );
    }
    let mut run = String::new();
    for (query, hits) in records.iter().zip(&hits) {
        for h in hits {
            if spaced(&h.id) {
                anyhow::bail!(
                    "document id {:?} of {} holds whitespace, which a TREC run cannot hold",
                    h.id,
                    index.source_path().display()
                );
            }
            run.push_str(&format!(
                "{} Q0 {} {} {} infembed\n",
                query.id, h.id, h.rank, h.score
            ));
        }
    }
    match &args.output {
        Some(path) => infembed::data::write_atomic(path, run.as_bytes())
            .map_err(|e| anyhow::anyhow!("cannot write {}: {e}", path.display()))?,
        None => {
            let mut out = std::io::stdout().lock();
            out.write_all(run.as_bytes())?;
            out.flush()?;
        }
    }
    eprintln!(
        "searched {} queries over {} documents ({}, {}) in {seconds:.2} s",
        records.len(),
        index.len(),
        index.dtype(),
        if index.is_mapped() {
            "mapped"
        } else {
            "in memory"
        },
    );
    Ok(())
}
