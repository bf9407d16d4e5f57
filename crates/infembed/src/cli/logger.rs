//! The binary's logger for the libraries' `log` records: each message on its own line on stderr,
//! as the libraries printed them before they logged. The level is `info` unless `RUST_LOG` names
//! another (`off`, `error`, `warn`, `info`, `debug`, `trace`); `debug` and `trace` lines carry
//! their level and target.

use log::{Level, LevelFilter, Log, Metadata, Record};

struct StderrLogger;

impl Log for StderrLogger {
    fn enabled(&self, metadata: &Metadata<'_>) -> bool {
        metadata.level() <= log::max_level()
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

/// The level `RUST_LOG` names (case-insensitive), `info` when unset or not a level name.
fn level_from_env() -> LevelFilter {
    std::env::var("RUST_LOG")
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(LevelFilter::Info)
}

/// Installs the logger (once; later calls do nothing).
pub fn install() {
    if log::set_logger(&LOGGER).is_ok() {
        log::set_max_level(level_from_env());
    }
}
