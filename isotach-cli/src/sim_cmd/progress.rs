//! Progress of a long simulation on stderr: an indicatif bar when stderr is a terminal or
//! `--progress` asks for one, otherwise a line about every tenth of the way (logs). Never on
//! stdout, so `--json` prints one object there whatever happens here.

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle, TermLike};
use std::cell::Cell;
use std::io::{IsTerminal, Write};
use std::time::Duration;

/// How often a bar redraws at most, per second.
const BAR_REDRAW_PER_S: u8 = 8;
/// How often a bar's spinner and elapsed time tick while nothing else moves.
const BAR_TICK_MS: u64 = 250;
/// Width of a bar drawn on a stderr that is no terminal (`--progress`), columns.
const FORCED_WIDTH: u16 = 100;

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
        let target = if std::io::stderr().is_terminal() {
            ProgressDrawTarget::stderr_with_hz(BAR_REDRAW_PER_S)
        } else {
            // indicatif hides a bar on a stderr that is no terminal; asked for, it is drawn
            // there anyway, with plain ANSI escapes.
            ProgressDrawTarget::term_like_with_hz(Box::new(AnsiStderr), BAR_REDRAW_PER_S)
        };
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

/// Stderr as a terminal that understands ANSI cursor escapes, whatever it is.
#[derive(Debug)]
struct AnsiStderr;

impl AnsiStderr {
    fn put(&self, s: &str) -> std::io::Result<()> {
        std::io::stderr().write_all(s.as_bytes())
    }

    /// Moves the cursor `n` cells in ANSI direction `dir` (`A` up, `B` down, `C` right, `D`
    /// left); nothing for 0 (the sequence would move it one).
    fn cursor(&self, n: usize, dir: char) -> std::io::Result<()> {
        if n == 0 {
            return Ok(());
        }
        self.put(&format!("\x1b[{n}{dir}"))
    }
}

impl TermLike for AnsiStderr {
    fn width(&self) -> u16 {
        FORCED_WIDTH
    }
    fn move_cursor_up(&self, n: usize) -> std::io::Result<()> {
        self.cursor(n, 'A')
    }
    fn move_cursor_down(&self, n: usize) -> std::io::Result<()> {
        self.cursor(n, 'B')
    }
    fn move_cursor_right(&self, n: usize) -> std::io::Result<()> {
        self.cursor(n, 'C')
    }
    fn move_cursor_left(&self, n: usize) -> std::io::Result<()> {
        self.cursor(n, 'D')
    }
    fn write_line(&self, s: &str) -> std::io::Result<()> {
        self.put(&format!("{s}\n"))
    }
    fn write_str(&self, s: &str) -> std::io::Result<()> {
        self.put(s)
    }
    fn clear_line(&self) -> std::io::Result<()> {
        self.put("\r\x1b[2K")
    }
    fn flush(&self) -> std::io::Result<()> {
        std::io::stderr().flush()
    }
}
