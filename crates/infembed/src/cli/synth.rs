//! `infembed synth`: synthesize InF-IR records with an OpenAI-compatible server.

use std::path::PathBuf;

use anyhow::Result;
use clap::Args;

#[derive(Args)]
pub struct SynthArgs {
    /// The synthesis config (TOML or JSON); see docs/synthesis.md.
    #[arg(long)]
    config: PathBuf,
}

#[cfg(not(feature = "synth"))]
pub fn run(args: &SynthArgs) -> Result<()> {
    let _ = &args.config;
    Err(infembed::Error::FeatureNotBuilt {
        what: "`infembed synth`",
        feature: "synth",
    }
    .into())
}

#[cfg(feature = "synth")]
pub fn run(args: &SynthArgs) -> Result<()> {
    let config = infembed_synth::SynthConfig::from_file(&args.config)?;
    let mut progress = infembed_synth::StderrProgress::default();
    let report = infembed_synth::run(&config, &mut progress)?;
    println!("{}", serde_json::to_string_pretty(&report)?);
    if report.this_run.failed > 0 {
        anyhow::bail!(
            "{} pairs failed (see failure_samples); rerun to retry them",
            report.this_run.failed
        );
    }
    Ok(())
}
