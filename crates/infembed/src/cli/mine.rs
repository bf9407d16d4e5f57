//! `infembed mine`: hard negatives for a training file, mined with a (zero-shot) model.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use clap::Args;
use infembed::data::{MiningOptions, ReadMode, mined_negatives_jsonl, read_records, write_atomic};

use super::load_encoder;

#[derive(Args)]
pub struct MineArgs {
    /// A training config (TOML or JSON): its model, `data.train`, `data.lenient` and encoder
    /// settings (the query template) are used, so the mining embeds as training does.
    #[arg(long, conflicts_with_all = ["model", "train", "encoder_config", "lenient"])]
    config: Option<PathBuf>,
    /// The mining model's directory (instead of --config).
    #[arg(long, requires = "train")]
    model: Option<PathBuf>,
    /// The InF-IR training file (JSONL or Parquet) to mine for (instead of --config).
    #[arg(long, requires = "model")]
    train: Option<PathBuf>,
    /// Encoder config JSON for --model.
    #[arg(long)]
    encoder_config: Option<PathBuf>,
    /// Skip malformed training records (as `data.lenient`, which --config takes from the
    /// config); the file's lines then follow the records kept, as training reads them with the
    /// same setting.
    #[arg(long)]
    lenient: bool,
    /// Where the mined negatives go (JSONL, one line per record; written atomically).
    #[arg(long, short)]
    output: PathBuf,
    /// Negatives kept per record; training uses the first `batch.mined_per_record` of them.
    #[arg(long, default_value_t = 8)]
    per_record: usize,
    /// Drop a candidate scoring above this fraction of the record's positive score (a likely
    /// unlabelled positive; NV-Retriever's positive-aware margin).
    #[arg(long, default_value_t = 0.95, conflicts_with = "no_margin")]
    max_relative: f32,
    /// Keep candidates whatever their score relative to the positive.
    #[arg(long)]
    no_margin: bool,
    #[command(flatten)]
    device: super::device::DeviceArgs,
}

pub fn run(args: &MineArgs) -> Result<()> {
    if args.per_record == 0 {
        bail!("--per-record must be at least 1");
    }
    if !(args.max_relative.is_finite() && args.max_relative > 0.0) {
        bail!("--max-relative must be a positive number");
    }
    let start = Instant::now();
    let (encoder, train, lenient) = match &args.config {
        Some(path) => {
            let config = infembed::train::TrainConfig::from_file(path)?;
            let mut encoder = infembed::load_encoder(
                &config.model,
                Some(config.encoder.clone()),
                &args.device.open()?,
            )?;
            args.device.apply(&mut encoder)?;
            (encoder, config.data.train.clone(), config.data.lenient)
        }
        None => {
            let (Some(model), Some(train)) = (&args.model, &args.train) else {
                bail!("give --config TRAIN.toml, or --model DIR and --train FILE");
            };
            let encoder = load_encoder(model, args.encoder_config.as_deref(), &args.device)?;
            (encoder, train.clone(), args.lenient)
        }
    };
    let mode = if lenient {
        ReadMode::Lenient
    } else {
        ReadMode::Strict
    };
    let set = read_records(&train, mode)?;
    if !set.skipped.is_empty() {
        eprintln!(
            "warning: {}: skipped {} malformed record(s)",
            train.display(),
            set.skipped.len()
        );
    }
    let records = set.records;
    if records.is_empty() {
        bail!("{}: holds no training record", train.display());
    }
    let options = MiningOptions::new(args.per_record)
        .with_max_relative((!args.no_margin).then_some(args.max_relative));
    let mined = infembed::mine_hard_negatives(&encoder, &records, options)?;
    write_atomic(&args.output, &mined_negatives_jsonl(&records, &mined.lists))
        .with_context(|| format!("cannot write {}", args.output.display()))?;
    let kept: usize = mined.lists.iter().map(Vec::len).sum();
    let short = mined
        .lists
        .iter()
        .filter(|l| l.len() < args.per_record)
        .count();
    let mean = |v: &mut dyn Iterator<Item = f32>| {
        let (s, n) = v.fold((0f64, 0usize), |(s, n), x| (s + f64::from(x), n + 1));
        if n == 0 { f64::NAN } else { s / n as f64 }
    };
    let positive = mean(&mut mined.positive_scores.iter().copied());
    let first = mean(
        &mut mined
            .lists
            .iter()
            .filter_map(|l| l.first().map(|m| m.score)),
    );
    let first = if first.is_nan() {
        "none".to_string()
    } else {
        format!("{first:.3}")
    };
    eprintln!(
        "mined {kept} negatives for {} records from {} candidate passages in {:.1} s \
         ({short} record(s) with fewer than {}; {} scored against every candidate); mean \
         cosine: positive {positive:.3}, best negative {first} -> {}",
        records.len(),
        mined.candidates,
        start.elapsed().as_secs_f64(),
        args.per_record,
        mined.full_scans,
        args.output.display()
    );
    Ok(())
}
