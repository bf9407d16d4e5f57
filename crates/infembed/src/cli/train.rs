//! `infembed train`: fine-tune a model from a config file.

use std::path::PathBuf;

use anyhow::Result;
use clap::Args;

#[derive(Args)]
pub struct TrainArgs {
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
    #[command(flatten)]
    devices: super::device::TrainDeviceArgs,
    /// Float type of training (overrides the config's `dtype`): f32, or bf16 on a CPU with
    /// AVX512-BF16 (mixed precision: the linear layers' products in bf16, f32 sums, weights
    /// and optimizer; docs/training.md).
    #[arg(long, value_parser = super::device::parse_precision)]
    dtype: Option<infembed::Precision>,
    /// The matrix-product routine of the linear layers on a GPU device (overrides the
    /// config's `matmul`): `blocked_split` (the default, this project's kernel; `blocked`
    /// without its depth split), `burn` (burn's own
    /// `matmul`) or one of cubek's, as `infembed devices --probe-matmul` names them
    /// (docs/devices.md).
    #[arg(long, value_parser = super::device::parse_matmul)]
    matmul: Option<infembed::MatmulRoutine>,
}

pub fn run(args: &TrainArgs) -> Result<()> {
    let mut config = infembed::train::TrainConfig::from_file(&args.config)?;
    if let Some(specs) = args.devices.specs() {
        config.set_devices(specs);
    }
    if let Some(dtype) = args.dtype {
        config.dtype = Some(dtype);
    }
    if let Some(routine) = args.matmul {
        config.matmul = Some(routine);
    }
    // again after the overrides (validation is pure: a second pass over a config the file
    // already validated changes nothing)
    config.validate()?;
    let on: Vec<String> = config
        .device_specs()
        .iter()
        .map(|d| d.to_string())
        .collect();
    eprintln!("{} on {}", infembed::train::describe(&config), on.join(","));
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
