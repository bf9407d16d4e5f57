//! Where training progress goes: plain lines (pipes, CI, log files) or burn-train's terminal
//! dashboard.
//!
//! [`ProgressMode::Auto`] (the default) opens the dashboard when the crate is built with the
//! `tui` feature and both stdout and stderr are terminals, and writes plain lines otherwise.
//! The dashboard is burn-train's own (`TuiMetricsRendererWrapper`): loss, learning rate and
//! rows/s as training metrics, the dev metrics of each evaluation as validation metrics,
//! progress over the epoch's steps, and checkpoint notes in its status panel. Quitting it
//! (`q`, then confirm) stops training after the current step with a checkpoint written, so
//! `--resume` continues from there. What is trained does not depend on the mode.

use std::io::IsTerminal;

use crate::error::{DashboardProblem, Error, Result};

/// How training progress is shown.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ProgressMode {
    /// The dashboard on a terminal (with the `tui` feature), plain lines otherwise.
    #[default]
    Auto,
    /// Plain lines on stderr (on a terminal the step line is rewritten in place).
    Plain,
    /// burn-train's terminal dashboard; an error when stdout or stderr is not a terminal or
    /// the crate was built without the `tui` feature.
    Dashboard,
}

impl std::str::FromStr for ProgressMode {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "auto" => Ok(Self::Auto),
            "plain" => Ok(Self::Plain),
            "dashboard" => Ok(Self::Dashboard),
            other => Err(format!(
                "unknown progress mode `{other}` (expected auto, plain or dashboard)"
            )),
        }
    }
}

/// The run as a whole, told once when training starts.
#[derive(Debug, Clone)]
// Some fields are read by the dashboard only (feature `tui`).
#[cfg_attr(not(feature = "tui"), allow(dead_code))]
pub(crate) struct RunInfo {
    pub epochs: usize,
    pub start_epoch: usize,
    pub total_steps: usize,
    pub label: String,
}

/// One optimizer step, told after it.
#[derive(Debug, Clone)]
// Some fields are read by the dashboard only (feature `tui`).
#[cfg_attr(not(feature = "tui"), allow(dead_code))]
pub(crate) struct StepInfo {
    /// Optimizer steps done, this one included.
    pub done: usize,
    pub total: usize,
    /// 0-based epoch of this step.
    pub epoch: usize,
    pub epochs: usize,
    /// Steps of this epoch done, this one included.
    pub in_epoch: usize,
    pub epoch_steps: usize,
    pub loss: f32,
    pub lr: f64,
    pub rows_per_second: f64,
}

/// A progress display.
pub(crate) trait ProgressSink: Send {
    /// Training starts (after any resume).
    fn start(&mut self, run: &RunInfo);
    /// An optimizer step finished.
    fn step(&mut self, step: &StepInfo);
    /// The dev evaluation at optimizer step `step` gave `metrics`.
    fn eval(&mut self, step: usize, metrics: &[(String, f64)], seconds: f64);
    /// A note (checkpoint written, model saved, ...).
    fn note(&mut self, line: &str);
    /// Whether the user asked to stop (the dashboard's quit).
    fn stop_requested(&self) -> bool {
        false
    }
    /// Training ended (finished, stopped or failed): restore the terminal.
    fn finish(&mut self);
}

/// Opens the sink for `mode` (`quiet`: plain mode prints nothing).
pub(crate) fn open(mode: ProgressMode, quiet: bool) -> Result<Box<dyn ProgressSink>> {
    let terminals = std::io::stdout().is_terminal() && std::io::stderr().is_terminal();
    match mode {
        ProgressMode::Plain => Ok(Box::new(Plain::new(quiet))),
        ProgressMode::Auto if quiet || !terminals || !cfg!(feature = "tui") => {
            Ok(Box::new(Plain::new(quiet)))
        }
        ProgressMode::Auto | ProgressMode::Dashboard => {
            if !terminals {
                return Err(Error::Dashboard(DashboardProblem::NoTerminal));
            }
            dashboard()
        }
    }
}

#[cfg(feature = "tui")]
fn dashboard() -> Result<Box<dyn ProgressSink>> {
    Ok(Box::new(tui::Dashboard::new()))
}

#[cfg(not(feature = "tui"))]
fn dashboard() -> Result<Box<dyn ProgressSink>> {
    Err(Error::Dashboard(DashboardProblem::NotBuilt))
}

/// The plain line format of a step (shared by the plain sink and the tests).
pub(crate) fn step_line(s: &StepInfo) -> String {
    format!(
        "train step {:>5}/{} epoch {}/{} loss {:.4} lr {:.3e} rows/s {:.1}",
        s.done,
        s.total,
        s.epoch + 1,
        s.epochs,
        s.loss,
        s.lr,
        s.rows_per_second
    )
}

/// Plain lines on stderr.
struct Plain {
    quiet: bool,
    tty: bool,
}

impl Plain {
    fn new(quiet: bool) -> Self {
        Plain {
            quiet,
            tty: std::io::stderr().is_terminal(),
        }
    }
}

impl ProgressSink for Plain {
    fn start(&mut self, run: &RunInfo) {
        self.note(&run.label);
    }

    fn step(&mut self, s: &StepInfo) {
        if self.quiet {
            return;
        }
        let line = step_line(s);
        if self.tty {
            eprint!("\r{line}   ");
            if s.done == s.total || s.done.is_multiple_of(10) {
                eprintln!();
            }
        } else {
            eprintln!("{line}");
        }
    }

    fn eval(&mut self, step: usize, metrics: &[(String, f64)], seconds: f64) {
        let shown: Vec<String> = metrics.iter().map(|(k, v)| format!("{k} {v:.2}")).collect();
        self.note(&format!(
            "eval  step {step:>5}: {} ({seconds:.1} s)",
            shown.join(", ")
        ));
    }

    fn note(&mut self, line: &str) {
        if !self.quiet {
            eprintln!("{line}");
        }
    }

    fn finish(&mut self) {}
}

#[cfg(feature = "tui")]
mod tui {
    use std::collections::HashMap;
    use std::sync::Arc;

    use burn::train::Interrupter;
    use burn::train::logger::TrainingProgressLogger;
    use burn::train::metric::{
        MetricAttributes, MetricDefinition, MetricEntry, MetricId, NumericAttributes, NumericEntry,
        SerializedEntry,
    };
    use burn::train::renderer::tui::TuiMetricsRendererWrapper;
    use burn::train::renderer::{MetricState, MetricsRenderer, MetricsRendererTraining};

    use super::{ProgressSink, RunInfo, StepInfo};

    /// burn-train's terminal dashboard.
    pub(super) struct Dashboard {
        renderer: Option<TuiMetricsRendererWrapper>,
        interrupter: Interrupter,
        ids: HashMap<String, MetricId>,
        epoch: Option<usize>,
    }

    impl Dashboard {
        pub(super) fn new() -> Self {
            let interrupter = Interrupter::new();
            Dashboard {
                renderer: Some(TuiMetricsRendererWrapper::new(interrupter.clone(), None)),
                interrupter,
                ids: HashMap::new(),
                epoch: None,
            }
        }

        fn renderer(&mut self) -> &mut TuiMetricsRendererWrapper {
            self.renderer.as_mut().expect("dashboard used after finish")
        }

        /// The id of metric `name`, registered with the dashboard on first use.
        fn id(&mut self, name: &str, higher_is_better: bool) -> MetricId {
            if let Some(id) = self.ids.get(name) {
                return id.clone();
            }
            let id = MetricId::new(Arc::new(name.to_string()));
            let definition = MetricDefinition {
                metric_id: id.clone(),
                name: Arc::new(name.to_string()),
                description: None,
                attributes: MetricAttributes::Numeric(NumericAttributes {
                    unit: None,
                    higher_is_better,
                }),
            };
            self.renderer().register_metric(definition);
            self.ids.insert(name.to_string(), id.clone());
            id
        }

        fn numeric(&mut self, name: &str, value: f64, shown: String, higher: bool) -> MetricState {
            let id = self.id(name, higher);
            MetricState::Numeric(
                MetricEntry::new(id, SerializedEntry::new(shown, value.to_string())),
                Some(NumericEntry::Value(value)),
            )
        }
    }

    impl ProgressSink for Dashboard {
        fn start(&mut self, run: &RunInfo) {
            let label = run.label.clone();
            self.renderer().start(
                run.epochs,
                run.start_epoch + 1,
                Some(run.total_steps),
                Some(&label),
            );
        }

        fn step(&mut self, s: &StepInfo) {
            if self.epoch != Some(s.epoch) {
                if self.epoch.is_some() {
                    self.renderer().end_split();
                    // burn-train's convention: the 1-based number of the epoch just done,
                    // which is the 0-based index of the one starting.
                    self.renderer().update_epoch(s.epoch);
                }
                self.epoch = Some(s.epoch);
                self.renderer().start_split("train", s.epoch_steps);
            }
            let states = [
                self.numeric("Loss", f64::from(s.loss), format!("{:.4}", s.loss), false),
                self.numeric("Learning rate", s.lr, format!("{:.3e}", s.lr), false),
                self.numeric(
                    "Rows/s",
                    s.rows_per_second,
                    format!("{:.1}", s.rows_per_second),
                    true,
                ),
            ];
            for state in states {
                self.renderer().update_train(state);
            }
            self.renderer().update_split(s.in_epoch);
        }

        fn eval(&mut self, step: usize, metrics: &[(String, f64)], seconds: f64) {
            let states: Vec<MetricState> = metrics
                .iter()
                .map(|(k, v)| self.numeric(&format!("dev {k}"), *v, format!("{v:.2}"), true))
                .collect();
            for state in states {
                self.renderer().update_valid(state);
            }
            self.note(&format!("eval at step {step} ({seconds:.1} s)"));
        }

        fn note(&mut self, line: &str) {
            self.renderer().log_event_training(line.to_string());
        }

        fn stop_requested(&self) -> bool {
            self.interrupter.should_stop()
        }

        fn finish(&mut self) {
            if let Some(mut renderer) = self.renderer.take() {
                if self.epoch.is_some() {
                    renderer.end_split();
                }
                // Drop closes the dashboard and gives the terminal back.
                let _ = renderer.on_train_end(None);
            }
        }
    }

    impl Drop for Dashboard {
        fn drop(&mut self) {
            self.finish();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_parse_and_unknown_names_are_refused() {
        assert_eq!("auto".parse::<ProgressMode>(), Ok(ProgressMode::Auto));
        assert_eq!("plain".parse::<ProgressMode>(), Ok(ProgressMode::Plain));
        assert_eq!(
            "dashboard".parse::<ProgressMode>(),
            Ok(ProgressMode::Dashboard)
        );
        assert!(
            "tui"
                .parse::<ProgressMode>()
                .unwrap_err()
                .contains("auto, plain")
        );
    }

    #[test]
    fn without_terminals_auto_is_plain_and_dashboard_is_an_error() {
        // Test harnesses capture stdout, so it is not a terminal here.
        if std::io::stdout().is_terminal() && std::io::stderr().is_terminal() {
            eprintln!("SKIPPED: stdout and stderr are terminals");
            return;
        }
        assert!(open(ProgressMode::Auto, false).is_ok());
        assert!(open(ProgressMode::Plain, false).is_ok());
        let err = open(ProgressMode::Dashboard, false)
            .err()
            .expect("an error");
        assert!(
            matches!(err, Error::Dashboard(DashboardProblem::NoTerminal)),
            "{err}"
        );
    }

    #[test]
    fn the_step_line_names_step_epoch_loss_lr_and_rate() {
        let s = StepInfo {
            done: 12,
            total: 30,
            epoch: 1,
            epochs: 2,
            in_epoch: 2,
            epoch_steps: 15,
            loss: 0.5,
            lr: 5e-5,
            rows_per_second: 3.26,
        };
        assert_eq!(
            step_line(&s),
            "train step    12/30 epoch 2/2 loss 0.5000 lr 5.000e-5 rows/s 3.3"
        );
    }
}
