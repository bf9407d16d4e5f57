//! `infembed search`: rank a JSONL corpus or a saved index for an instruction and a query.

use std::path::PathBuf;

use anyhow::{Result, bail};
use clap::Args;
use infembed::{EmbeddingIndex, embed_passages, read_texts};

use super::load_encoder;

#[derive(Args)]
#[command(group(clap::ArgGroup::new("source").required(true).args(["corpus", "index"])))]
pub struct SearchArgs {
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
        let index = EmbeddingIndex::load(path)?;
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
