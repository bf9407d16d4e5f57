//! `infembed embed`: embed the texts of a JSONL file into a saved index, in shards that resume
//! after a crash, with progress on stderr.

use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Result;
use clap::Args;
use infembed::eval::{
    DEFAULT_SHARD_RECORDS, EmbedFileOptions, EmbedProgress, embed_file, parts_dir, scan_texts,
};
use infembed::{IndexDtype, IndexFormat, Side};

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
    /// Records per shard: finished shards are kept in OUTPUT.parts/ and a run killed half way
    /// (even with kill -9) resumes from them when started again with the same arguments.
    #[arg(long, default_value_t = DEFAULT_SHARD_RECORDS as u64,
          value_parser = clap::value_parser!(u64).range(1..))]
    shard_size: u64,
    /// Discard the shards of an earlier unfinished run instead of resuming from them.
    #[arg(long)]
    restart: bool,
    /// The number type the index file stores: f32, or f16 (half the size; scores move by about
    /// 1e-4, see docs/benchmarks.md). Search computes in f32 either way.
    #[arg(long, default_value = "f32")]
    index_dtype: IndexDtype,
    /// No progress display.
    #[arg(long)]
    quiet: bool,
    #[command(flatten)]
    device: super::device::DeviceArgs,
}

pub fn run(args: &EmbedArgs) -> Result<()> {
    // Cheap checks first: the output format and every input record, before loading the model.
    IndexFormat::from_path(&args.output)?;
    let scan = scan_texts(&args.input)?;
    let encoder = load_encoder(&args.model, args.encoder_config.as_deref(), &args.device)?;
    let side = if args.queries {
        Side::Queries
    } else {
        Side::Passages
    };
    let options = EmbedFileOptions::new(side)
        .with_shard_records(usize::try_from(args.shard_size).unwrap_or(usize::MAX))
        .with_restart(args.restart)
        .with_dtype(args.index_dtype);
    let start = Instant::now();
    let mut display = Progress::new(args.quiet);
    let summary = embed_file(&encoder, &scan, &args.output, &options, &mut |p| {
        display.update(p)
    })?;
    display.finish();
    let seconds = start.elapsed().as_secs_f64();
    let embedded = summary.records - summary.resumed;
    let resumed = if summary.resumed > 0 {
        format!(
            " ({} resumed from {})",
            summary.resumed,
            parts_dir(&args.output).display()
        )
    } else {
        String::new()
    };
    eprintln!(
        "embedded {embedded} {}{resumed} (d = {}) in {seconds:.2} s ({:.1}/s) -> {}",
        if args.queries { "queries" } else { "passages" },
        summary.dim,
        embedded as f64 / seconds.max(1e-9),
        args.output.display()
    );
    Ok(())
}

/// The progress display on stderr: one line redrawn in place on a terminal, a plain line every
/// 30 seconds when stderr is a file or a pipe (logs stay readable).
struct Progress {
    quiet: bool,
    terminal: bool,
    start: Instant,
    last: Option<Instant>,
    drawn: bool,
}

impl Progress {
    fn new(quiet: bool) -> Self {
        Self {
            quiet,
            terminal: std::io::stderr().is_terminal(),
            start: Instant::now(),
            last: None,
            drawn: false,
        }
    }

    fn update(&mut self, p: &EmbedProgress) {
        if self.quiet {
            return;
        }
        let now = Instant::now();
        let every = if self.terminal {
            Duration::from_millis(200)
        } else {
            Duration::from_secs(30)
        };
        let due = self.last.is_none_or(|t| now - t >= every) || p.done == p.total;
        if !due {
            return;
        }
        self.last = Some(now);
        let line = progress_line(p, now - self.start);
        let mut err = std::io::stderr().lock();
        if self.terminal {
            let _ = write!(err, "\r\x1b[2K{line}");
            self.drawn = true;
        } else {
            let _ = writeln!(err, "{line}");
        }
        let _ = err.flush();
    }

    fn finish(&mut self) {
        if self.drawn {
            eprintln!();
            self.drawn = false;
        }
    }
}

/// `embedding  1234/20000 (6.2%)  45.1/s  ETA 6m12s` (resumed records count as done, not in
/// the rate).
fn progress_line(p: &EmbedProgress, elapsed: Duration) -> String {
    let fresh = p.done - p.resumed;
    let rate = fresh as f64 / elapsed.as_secs_f64().max(1e-9);
    let percent = 100.0 * p.done as f64 / p.total.max(1) as f64;
    let eta = if fresh > 0 && p.done < p.total {
        format!("  ETA {}", clock((p.total - p.done) as f64 / rate))
    } else {
        String::new()
    };
    let resumed = if p.resumed > 0 {
        format!("  ({} resumed)", p.resumed)
    } else {
        String::new()
    };
    format!(
        "embedding {}/{} ({percent:.1}%)  {rate:.1}/s{eta}{resumed}",
        p.done, p.total
    )
}

/// `2h03m`, `6m12s`, `41s`.
fn clock(seconds: f64) -> String {
    let s = seconds.round() as u64;
    if s >= 3600 {
        format!("{}h{:02}m", s / 3600, (s % 3600) / 60)
    } else if s >= 60 {
        format!("{}m{:02}s", s / 60, s % 60)
    } else {
        format!("{s}s")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clock_reads_like_a_clock() {
        assert_eq!(clock(41.4), "41s");
        assert_eq!(clock(372.0), "6m12s");
        assert_eq!(clock(7380.0), "2h03m");
    }
}
