//! Progress of a long simulation on stderr: an indicatif bar when stderr is a terminal or
//! `--progress` asks for one, otherwise a line about every tenth of the way (logs). Never on
//! stdout, so `--json` prints one object there whatever happens here.

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::cell::Cell;
use std::io::IsTerminal;
use std::time::Duration;

/// How often a bar redraws at most, per second.
const BAR_REDRAW_PER_S: u8 = 8;
/// How often a bar's spinner and elapsed time tick while nothing else moves.
const BAR_TICK_MS: u64 = 250;

/// Where a command's progress goes.
#[derive(Debug)]
pub(super) enum Progress {
    /// A bar on stderr.
    Bar(ProgressBar),
    /// A line on stderr per step: `label: <message>`.
    Lines {
        label: &'static str,
        total: u64,
        /// A line is printed each time the position crosses a multiple of `every` (and at
        /// the end).
        every: u64,
        /// The position last shown.
        shown: Cell<u64>,
    },
}

impl Progress {
    /// Progress over `total` steps of `unit` (e.g. "pulses"): a bar if stderr is a terminal
    /// or `bar` is asked for, else lines.
    pub(super) fn new(label: &'static str, total: u64, unit: &str, bar: bool) -> Self {
        if !(bar || std::io::stderr().is_terminal()) {
            return Self::Lines {
                label,
                total,
                every: (total / 10).max(1),
                shown: Cell::new(0),
            };
        }
        let target = ProgressDrawTarget::stderr_with_hz(BAR_REDRAW_PER_S);
        let pb = ProgressBar::with_draw_target(Some(total), target);
        let template = format!(
            "{label} {{spinner}} [{{elapsed_precise}}] {{bar:32}} {{pos}}/{{len}} {unit} \
             {{msg}} (eta {{eta}})"
        );
        if let Ok(style) = ProgressStyle::with_template(&template) {
            pb.set_style(style);
        }
        pb.enable_steady_tick(Duration::from_millis(BAR_TICK_MS));
        Self::Bar(pb)
    }

    /// The work is at `pos` of the total; `message` says more (made only when shown).
    pub(super) fn set(&self, pos: u64, message: impl FnOnce() -> String) {
        match self {
            Self::Bar(pb) => {
                pb.set_position(pos);
                pb.set_message(message());
            }
            Self::Lines {
                label,
                total,
                every,
                shown,
            } => {
                if pos / every > shown.get() / every || (pos >= *total && shown.get() < *total) {
                    shown.set(pos);
                    eprintln!("{label}: {pos}/{total} {}", message());
                }
            }
        }
    }

    /// The work is done: the bar is cleared (the summary follows).
    pub(super) fn finish(&self) {
        if let Self::Bar(pb) = self {
            pb.finish_and_clear();
        }
    }
}
