//! `infembed embed`: embed the texts of a JSONL file into a saved index.

use std::path::PathBuf;

use anyhow::Result;
use clap::Args;
use infembed::{IndexFormat, Side, embed_records, read_texts};

use super::load_encoder;

#[derive(Args)]
#[command(group(clap::ArgGroup::new("side").args(["passages", "queries"])))]
pub struct EmbedArgs {
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
    #[command(flatten)]
    device: super::device::DeviceArgs,
}

pub fn run(args: &EmbedArgs) -> Result<()> {
    // Cheap checks first: the output format and the input, before loading the model.
    IndexFormat::from_path(&args.output)?;
    let records = read_texts(&args.input)?;
    let encoder = load_encoder(&args.model, args.encoder_config.as_deref(), &args.device)?;
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
