//! Where a follower's updates go: plain lines (a pipe, CI logs), JSON lines (`-o json`), and on a
//! terminal the same plain lines above indicatif progress bars ([`super::bars`]).

use std::collections::BTreeMap;
use std::io::{self, Write};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::bars::Bars;
use super::events::{Update, progress_line_due};

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// One line per change, prefixed with the time since the plan was created.
    Text,
    /// One JSON object per line (`event`, `plan`, `time`, `elapsedSeconds`, and the event's fields).
    Json,
}

/// `[+  12.3s] text`.
pub fn text_line(elapsed: Duration, text: &str) -> String {
    format!("[+{:>6.1}s] {text}", elapsed.as_secs_f64())
}

/// One JSON line for an update (or any other event object with an `event` field).
pub fn json_line(elapsed: Duration, time: &str, plan: &str, event: Value) -> String {
    let mut obj = json!({
        "time": time,
        "elapsedSeconds": (elapsed.as_secs_f64() * 1000.0).round() / 1000.0,
        "plan": plan,
    });
    if let (Some(o), Value::Object(fields)) = (obj.as_object_mut(), event) {
        o.extend(fields);
    }
    super::super::terminal::json_safe(obj.to_string())
}

pub struct Output {
    format: Format,
    plan: String,
    started: Instant,
    bars: Option<Bars>,
    out: Box<dyn Write + Send>,
    /// Progress last given a line, per backup and kind (plain output thins them).
    progress_told: BTreeMap<(String, &'static str), (u64, u64)>,
}

impl Output {
    /// `live`: draw progress bars (stdout and stderr are a terminal, text format).
    pub fn new(format: Format, plan: &str, live: bool, out: Box<dyn Write + Send>) -> Self {
        Self {
            format,
            plan: plan.to_string(),
            started: Instant::now(),
            bars: (live && format == Format::Text).then(Bars::new),
            out,
            progress_told: BTreeMap::new(),
        }
    }

    pub fn elapsed(&self) -> Duration {
        self.started.elapsed()
    }

    pub fn format(&self) -> Format {
        self.format
    }

    fn write(&mut self, line: &str) -> io::Result<()> {
        // JSON lines escape control characters themselves; text shows them escaped.
        let line = match self.format {
            Format::Text => crate::cli::terminal::escape_controls(line),
            _ => std::borrow::Cow::Borrowed(line),
        };
        let out = &mut self.out;
        match &self.bars {
            Some(b) => b.suspend(|| writeln!(out, "{line}").and_then(|()| out.flush())),
            None => writeln!(out, "{line}").and_then(|()| out.flush()),
        }
    }

    /// Tells one update: a bar moves, and a line is written unless it is progress that plain output
    /// thins out (bars show every step of it).
    pub fn update(&mut self, u: &Update) -> io::Result<()> {
        if let Some(b) = &mut self.bars {
            b.apply(u);
        }
        let progress = match u {
            Update::BackupItems { name, done, total } => Some((name, "items", *done, *total)),
            Update::BackupBytes { name, done, total } => Some((name, "bytes", *done, *total)),
            _ => None,
        };
        if let Some((name, kind, done, total)) = progress {
            if self.bars.is_some() {
                return Ok(());
            }
            let key = (name.clone(), kind);
            if !progress_line_due(self.progress_told.get(&key).copied(), done, total) {
                return Ok(());
            }
            self.progress_told.insert(key, (done, total));
        }
        match self.format {
            Format::Text => {
                let line = text_line(self.elapsed(), &u.text());
                self.write(&line)
            }
            Format::Json => {
                let v = serde_json::to_value(u).unwrap_or(Value::Null);
                self.json(v)
            }
        }
    }

    /// A line that is not an update (created, hints, the final word). In JSON, `event` names it.
    pub fn note(&mut self, event: &str, text: &str) -> io::Result<()> {
        match self.format {
            Format::Text => {
                let line = text_line(self.elapsed(), text);
                self.write(&line)
            }
            Format::Json => self.json(json!({"event": event, "message": text})),
        }
    }

    /// An event object written as a JSON line (text output: its `message`).
    pub fn json(&mut self, event: Value) -> io::Result<()> {
        match self.format {
            Format::Json => {
                let time = jiff::Timestamp::now().to_string();
                let line = json_line(self.elapsed(), &time, &self.plan, event);
                self.write(&line)
            }
            Format::Text => {
                let text = event
                    .get("message")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_string();
                self.note("note", &text)
            }
        }
    }

    /// What the bars' header says (the step and the deadline).
    pub fn status(&mut self, text: String) {
        if let Some(b) = &mut self.bars {
            b.header(text);
        }
    }

    /// Writes a question with the bars hidden; [`Output::resume`] brings them back.
    pub fn prompt(&mut self, text: &str) -> io::Result<()> {
        if let Some(b) = &self.bars {
            b.pause();
        }
        write!(self.out, "{text}")?;
        self.out.flush()
    }

    pub fn resume(&mut self) {
        if let Some(b) = &self.bars {
            b.resume();
        }
    }

    /// Clears the bars for good (before the last lines).
    pub fn finish(&mut self) {
        if let Some(b) = self.bars.take() {
            b.clear();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_lines_start_with_the_elapsed_time() {
        assert_eq!(
            text_line(Duration::from_millis(12_340), "step Draining"),
            "[+  12.3s] step Draining"
        );
    }

    #[test]
    fn json_lines_merge_the_event_fields_after_the_common_ones() {
        let line = json_line(
            Duration::from_millis(1500),
            "2030-01-01T00:00:00Z",
            "p1",
            json!({"event": "phase", "to": "Completed"}),
        );
        let v: Value = serde_json::from_str(&line).expect("valid JSON");
        assert_eq!(
            v,
            json!({"time": "2030-01-01T00:00:00Z", "elapsedSeconds": 1.5, "plan": "p1",
                   "event": "phase", "to": "Completed"})
        );
        assert!(line.starts_with("{\"time\""), "common fields first: {line}");
    }

    /// A writer the test can read back.
    #[derive(Clone, Default)]
    struct Shared(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);
    impl Write for Shared {
        fn write(&mut self, b: &[u8]) -> io::Result<usize> {
            self.0
                .lock()
                .map_err(|_| io::Error::other("poisoned"))?
                .extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn plain_output_thins_progress_but_keeps_every_other_update() {
        let buf = Shared::default();
        let mut o = Output::new(Format::Text, "p1", false, Box::new(buf.clone()));
        for done in 0..=20 {
            o.update(&Update::BackupItems {
                name: "b1".into(),
                done,
                total: 20,
            })
            .expect("write");
        }
        o.update(&Update::Unblocked { node: "n1".into() })
            .expect("write");
        let text = String::from_utf8(buf.0.lock().expect("lock").clone()).expect("utf8");
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 12, "0, each tenth, and the unblock:\n{text}");
        assert!(lines[0].ends_with("backup b1: 0/20 items backed up"));
        assert!(lines[10].ends_with("backup b1: 20/20 items backed up"));
        assert!(lines[11].ends_with("node n1: no longer blocked"));
    }
}
