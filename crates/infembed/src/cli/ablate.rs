//! `infembed ablate`: run an ablation grid (docs/ablation.md).

use std::path::PathBuf;

use anyhow::Result;
use clap::Args;
use infembed::ablation::{Grid, GridOptions, GridReport, load_results, run_grid};

#[derive(Args)]
pub struct AblateArgs {
    /// The grid file (TOML): a base training config, keys set over it, axes, seeds
    /// (examples/ablation/).
    #[arg(long)]
    grid: PathBuf,
    /// Only rewrite the report from the results already in the grid's output folder
    /// (trains nothing).
    #[arg(long, conflicts_with = "check")]
    report: bool,
    /// Only check the grid (every row's config, for every seed) and list its rows; trains
    /// and writes nothing.
    #[arg(long)]
    check: bool,
    /// Stop after this many runs have trained (finished runs found in the output folder do not
    /// count); run the command again to go on.
    #[arg(long)]
    max_runs: Option<usize>,
    /// Progress display of each run: `plain` (default), `dashboard` or `auto`.
    #[arg(long, default_value = "plain")]
    progress: infembed::train::ProgressMode,
    #[command(flatten)]
    devices: super::device::TrainDeviceArgs,
}

pub fn run(args: &AblateArgs) -> Result<()> {
    let grid = Grid::from_file(&args.grid)?;
    if args.check {
        println!(
            "grid `{}` ({}): {} row(s) x seeds {:?}{}",
            grid.name,
            args.grid.display(),
            grid.rows.len(),
            grid.seeds,
            grid.more_seeds.as_ref().map_or(String::new(), |m| format!(
                ", then seeds {:?} for the best {} row(s) by {}",
                m.seeds,
                m.top,
                m.by.name()
            ))
        );
        for row in &grid.rows {
            for seed in grid.all_seeds() {
                grid.config(row, seed)?;
            }
            println!("  {}", row.label);
        }
        return Ok(());
    }
    let mut options = GridOptions::new().progress(args.progress);
    if let Some(specs) = args.devices.specs() {
        options = options.devices(specs);
    }
    if let Some(n) = args.max_runs {
        options = options.max_runs(n);
    }
    let report = if args.report {
        let (zero, runs) = load_results(&grid, &options)?;
        let report = GridReport::build(&grid, zero, runs);
        report.write(&grid.output_dir)?;
        report
    } else {
        eprintln!(
            "grid `{}`: {} row(s) x {} seed(s){} -> {}",
            grid.name,
            grid.rows.len(),
            grid.seeds.len(),
            grid.more_seeds.as_ref().map_or(String::new(), |m| format!(
                ", then {} more seed(s) for the best {} row(s)",
                m.seeds.len(),
                m.top
            )),
            grid.output_dir.display()
        );
        run_grid(&grid, &options)?
    };
    print!("{}", report.markdown());
    eprintln!(
        "report: {} ({} run(s) finished, {} pending)",
        grid.output_dir.join("report.md").display(),
        report.runs.len(),
        report.pending()
    );
    Ok(())
}
