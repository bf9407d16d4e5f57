//! The binary's logger for the libraries' `log` records: each message on its own line on stderr,
//! as the libraries printed them before they logged. The level is `info` unless `RUST_LOG` names
//! another (`off`, `error`, `warn`, `info`, `debug`, `trace`); `debug` and `trace` lines carry
//! their level and target.
//!
//! `RUST_LOG` may also name levels for targets, comma-separated, as `env_logger` spells them:
//! `RUST_LOG=infembed_encoder=debug` shows this project's encoder's debug lines (its timings of
//! each encoding pass among them) without those of wgpu and the other dependencies, and
//! `RUST_LOG=warn,infembed_eval=debug` sets `warn` for every other target; a target named
//! without a level logs everything. As with `env_logger`, a target matches every target that
//! starts with it (`infembed_encoder::ops`, also `infembed_encoder_x`), and the longest match
//! wins. Not taken from `env_logger`: its `/regex` filter.

use log::{Level, LevelFilter, Log, Metadata, Record};
use std::sync::OnceLock;

/// The levels `RUST_LOG` names: one for every target, and one per target prefix.
#[derive(Debug, PartialEq)]
struct Filter {
    default: LevelFilter,
    targets: Vec<(String, LevelFilter)>,
}

impl Filter {
    /// The filter of a `RUST_LOG` value: levels, `target=level` and bare targets (every level);
    /// `target=` with something other than a level is ignored, and an unset or empty value is
    /// `info`.
    fn parse(spec: Option<&str>) -> Self {
        let mut filter = Self {
            default: LevelFilter::Info,
            targets: Vec::new(),
        };
        for item in spec.unwrap_or("").split(',').map(str::trim) {
            match item.split_once('=') {
                Some((target, level)) => {
                    if let (false, Ok(level)) = (target.trim().is_empty(), level.trim().parse()) {
                        filter.targets.push((target.trim().to_owned(), level));
                    }
                }
                None => {
                    if let Ok(level) = item.parse() {
                        filter.default = level;
                    } else if !item.is_empty() {
                        filter.targets.push((item.to_owned(), LevelFilter::Trace));
                    }
                }
            }
        }
        filter
    }

    /// The most verbose level any target may log at (the `log` crate's global gate).
    fn max(&self) -> LevelFilter {
        self.targets
            .iter()
            .map(|(_, l)| *l)
            .fold(self.default, Ord::max)
    }

    /// Whether a record of `level` from `target` is shown.
    fn enabled(&self, target: &str, level: Level) -> bool {
        let named = self
            .targets
            .iter()
            .filter(|(t, _)| target.starts_with(t.as_str()))
            .max_by_key(|(t, _)| t.len())
            .map(|(_, l)| *l);
        level <= named.unwrap_or(self.default)
    }
}

struct StderrLogger;

static FILTER: OnceLock<Filter> = OnceLock::new();

impl Log for StderrLogger {
    fn enabled(&self, metadata: &Metadata<'_>) -> bool {
        FILTER
            .get()
            .is_some_and(|f| f.enabled(metadata.target(), metadata.level()))
    }

    fn log(&self, record: &Record<'_>) {
        if !self.enabled(record.metadata()) {
            return;
        }
        match record.level() {
            Level::Error | Level::Warn | Level::Info => eprintln!("{}", record.args()),
            level => eprintln!("[{level} {}] {}", record.target(), record.args()),
        }
    }

    fn flush(&self) {}
}

static LOGGER: StderrLogger = StderrLogger;

/// Installs the logger with the levels of `RUST_LOG` (once; later calls do nothing).
pub fn install() {
    let filter = FILTER.get_or_init(|| Filter::parse(std::env::var("RUST_LOG").ok().as_deref()));
    if log::set_logger(&LOGGER).is_ok() {
        log::set_max_level(filter.max());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_for_every_target_and_for_named_ones() {
        let info = Filter::parse(None);
        assert_eq!(info.max(), LevelFilter::Info);
        assert!(info.enabled("wgpu_core", Level::Info));
        assert!(!info.enabled("infembed_encoder", Level::Debug));
        assert_eq!(Filter::parse(Some("DEBUG")).default, LevelFilter::Debug);
        assert_eq!(Filter::parse(Some("  ")), info);
        let debug = Filter::parse(Some("debug"));
        assert!(debug.enabled("wgpu_core", Level::Debug) && !debug.enabled("x", Level::Trace));
        // a bare target: everything it logs
        let bare = Filter::parse(Some("infembed_eval"));
        assert_eq!(bare.max(), LevelFilter::Trace);
        assert!(bare.enabled("infembed_eval::embed", Level::Trace));
        assert!(!bare.enabled("wgpu_core", Level::Debug));

        let f = Filter::parse(Some(
            "warn, infembed_encoder=debug ,infembed_encoder::ops=trace",
        ));
        assert_eq!(f.max(), LevelFilter::Trace);
        assert!(f.enabled("infembed_encoder", Level::Debug));
        assert!(f.enabled("infembed_encoder::encoder", Level::Debug));
        assert!(!f.enabled("infembed_encoder::encoder", Level::Trace));
        assert!(f.enabled("infembed_encoder::ops::blocked", Level::Trace));
        // as env_logger matches: by the start of the target
        assert!(f.enabled("infembed_encoder_extra", Level::Debug));
        assert!(!f.enabled("wgpu_core", Level::Info));
        assert!(f.enabled("wgpu_core", Level::Warn));

        let only = Filter::parse(Some("infembed_eval=debug,=trace,x=loud"));
        assert_eq!(only.default, LevelFilter::Info);
        assert_eq!(
            only.targets,
            vec![("infembed_eval".to_owned(), LevelFilter::Debug)]
        );
        assert!(only.enabled("wgpu_hal", Level::Info) && !only.enabled("wgpu_hal", Level::Debug));
    }
}
