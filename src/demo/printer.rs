//! Where the demo's story goes: plain lines to any writer (a pipe, a file, a test buffer), plus an
//! indicatif spinner on a terminal showing the current phase. Lines are written around the spinner
//! (`suspend`), so the two never garble each other.

use std::io::{self, Write};
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};

pub struct Printer<'a> {
    out: &'a mut (dyn Write + Send),
    spinner: Option<ProgressBar>,
    started: Instant,
}

impl<'a> Printer<'a> {
    /// `live`: draw a spinner on stderr (only sensible when stdout and stderr are a terminal).
    pub fn new(out: &'a mut (dyn Write + Send), live: bool) -> Self {
        Self {
            out,
            spinner: live.then(spinner),
            started: Instant::now(),
        }
    }

    /// Restarts the clock of [`Printer::event`] lines (at plan submission).
    pub fn restart_clock(&mut self) {
        self.started = Instant::now();
    }

    pub fn elapsed(&self) -> Duration {
        self.started.elapsed()
    }

    /// One line of output.
    pub fn line(&mut self, text: impl AsRef<str>) -> io::Result<()> {
        let text = text.as_ref();
        let out = &mut *self.out;
        match &self.spinner {
            Some(pb) => pb.suspend(|| writeln!(out, "{text}")),
            None => writeln!(out, "{text}"),
        }
    }

    /// A line prefixed with the wall-clock time and the time since the plan was submitted.
    pub fn event(&mut self, text: impl AsRef<str>) -> io::Result<()> {
        let clock = jiff::Zoned::now().strftime("%H:%M:%S%.3f").to_string();
        let since = self.started.elapsed().as_secs_f64();
        self.line(format!("  {clock}  +{since:>6.2}s  {}", text.as_ref()))
    }

    /// What the spinner says (nothing happens without a terminal).
    pub fn status(&self, text: impl Into<String>) {
        if let Some(pb) = &self.spinner {
            pb.set_message(text.into());
        }
    }

    /// Removes the spinner (before the summary, or for good).
    pub fn stop_spinner(&mut self) {
        if let Some(pb) = self.spinner.take() {
            pb.finish_and_clear();
        }
    }

    pub fn flush(&mut self) -> io::Result<()> {
        self.out.flush()
    }
}

impl Drop for Printer<'_> {
    fn drop(&mut self) {
        self.stop_spinner();
    }
}

fn spinner() -> ProgressBar {
    let pb = ProgressBar::new_spinner();
    // The template is a constant known to be valid; fall back to the default style rather than fail.
    if let Ok(style) = ProgressStyle::with_template("{spinner:.cyan} {elapsed:>3} {msg}") {
        pb.set_style(style);
    }
    pb.enable_steady_tick(Duration::from_millis(100));
    pb
}
