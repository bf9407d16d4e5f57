//! The `infembed` command line: one module per command, each with its arguments and its `run`.

use std::path::Path;

use anyhow::Result;
use clap::{Parser, Subcommand};
use infembed::encoder::{DualEncoder, EncoderConfig};

pub mod ablate;
pub mod device;
pub mod embed;
pub mod eval;
pub mod logger;
pub mod mine;
pub mod quickstart;
pub mod search;
pub mod synth;
pub mod train;
pub mod trec_eval;

#[derive(Parser)]
#[command(
    name = "infembed",
    version,
    about = "Instruction-following retrieval: evaluation and tools"
)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Evaluate a retriever on an instruction-following or ad hoc retrieval test.
    Eval(Box<eval::EvalArgs>),
    /// trec_eval-compatible evaluation of a TREC run file against a TREC qrels file.
    TrecEval(trec_eval::TrecEvalArgs),
    /// Synthesize InF-IR records from (query, passage) pairs with an OpenAI-compatible LLM server.
    Synth(synth::SynthArgs),
    /// Embed the texts of a JSONL file and save the embeddings (.safetensors or .npy).
    Embed(embed::EmbedArgs),
    /// Search a JSONL corpus or a saved index with an instruction and a query.
    Search(search::SearchArgs),
    /// Fine-tune an embedding model on InF-IR records (config: docs/training.md).
    Train(train::TrainArgs),
    /// Zero-shot eval, fine-tune, eval again: the before/after table (README's first command).
    Quickstart(quickstart::QuickstartArgs),
    /// List the devices this build can run on (--device), and the backends it lacks.
    Devices(device::DevicesArgs),
    /// Run an ablation grid: many training runs from one file, cached, resumable, reported
    /// as means and spreads over seeds (docs/ablation.md).
    Ablate(ablate::AblateArgs),
    /// Mine hard negatives for a training file with a model (training reads them through
    /// `data.mined_negatives`; docs/training.md).
    Mine(mine::MineArgs),
}

/// Runs the parsed command.
pub fn run(cli: Cli) -> Result<()> {
    match cli.command {
        Command::Eval(args) => eval::run(&args),
        Command::TrecEval(args) => trec_eval::run(&args),
        Command::Synth(args) => synth::run(&args),
        Command::Embed(args) => embed::run(&args),
        Command::Search(args) => search::run(&args),
        Command::Train(args) => train::run(&args),
        Command::Quickstart(args) => quickstart::run(&args),
        Command::Devices(args) => device::run(&args),
        Command::Ablate(args) => ablate::run(&args),
        Command::Mine(args) => mine::run(&args),
    }
}

/// The error and its causes on one line, leaving out a cause whose text the message before it
/// already contains (the workspace's errors name their source in their own message).
pub fn one_line(e: &anyhow::Error) -> String {
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

/// `--model DIR` with an optional `--encoder-config FILE` (read first, so that a bad config is
/// named before the model is looked for), loaded by [`infembed::load_encoder`]: a directory saved
/// by `infembed train` carries its encoder config, which applies unless `--encoder-config`
/// overrides it.
fn load_encoder(
    model: &Path,
    encoder_config: Option<&Path>,
    device: &device::DeviceArgs,
) -> Result<DualEncoder> {
    let config = match encoder_config {
        Some(path) => Some(EncoderConfig::from_file(path)?),
        None => None,
    };
    let mut encoder = infembed::load_encoder(model, config, &device.open()?)?;
    device.apply(&mut encoder)?;
    Ok(encoder)
}

/// `$INFEMBED_SHARED_DATA` when set and non-empty: where the project's shared data lives.
pub fn shared_data_from_env() -> Option<std::path::PathBuf> {
    std::env::var_os("INFEMBED_SHARED_DATA")
        .filter(|v| !v.is_empty())
        .map(std::path::PathBuf::from)
}
