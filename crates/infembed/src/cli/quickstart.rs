//! `infembed quickstart`: zero-shot evaluation, fine-tuning, evaluation again.

use std::path::PathBuf;

use anyhow::Result;
use clap::Args;

#[derive(Args)]
pub struct QuickstartArgs {
    /// The training config of the quickstart.
    #[arg(long, default_value = "examples/configs/quickstart.toml")]
    config: PathBuf,
    /// A shared-data root whose collections/msmarco-subset replaces the vendored
    /// data/msmarco-subset (default: $INFEMBED_SHARED_DATA when set, else data/msmarco-subset).
    #[arg(long)]
    shared_data: Option<PathBuf>,
    /// Print the report as one JSON object on stdout.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    devices: super::device::TrainDeviceArgs,
}

pub fn run(args: &QuickstartArgs) -> Result<()> {
    let shared_data = args
        .shared_data
        .clone()
        .or_else(super::shared_data_from_env);
    let report = infembed::quickstart::run(
        &args.config,
        shared_data.as_deref(),
        args.devices.specs().as_deref(),
    )?;
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
    println!("training chart: {} (and .png)", report.plot.display());
    println!(
        "evaluation chart: {} (and .png)",
        report.evaluation_plot.display()
    );
    Ok(())
}
