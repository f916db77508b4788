//! What `snapdrain bench` prints: one figure per line, with its unit, the DESIGN target it answers to,
//! and a note on how it was measured. A table for people, JSON for machines.

use serde::Serialize;

use super::stats::Summary;

#[derive(Clone, Debug, Serialize)]
pub struct Figure {
    pub section: &'static str,
    /// What was measured, e.g. "full pod list, kube-rs (p50)".
    pub name: String,
    /// None when the measurement was skipped (the note says why).
    pub value: Option<f64>,
    pub unit: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

#[derive(Debug, Default, Serialize)]
pub struct Report {
    /// "release" or "debug": debug builds are several times slower and say little about targets.
    pub build: &'static str,
    pub cpus: usize,
    pub figures: Vec<Figure>,
}

impl Report {
    pub fn new() -> Self {
        Self {
            build: if cfg!(debug_assertions) {
                "debug"
            } else {
                "release"
            },
            cpus: std::thread::available_parallelism().map_or(1, |n| n.get()),
            figures: Vec::new(),
        }
    }

    pub fn add(
        &mut self,
        section: &'static str,
        name: impl Into<String>,
        value: f64,
        unit: &'static str,
    ) -> &mut Figure {
        self.figures.push(Figure {
            section,
            name: name.into(),
            value: Some(value),
            unit,
            target: None,
            note: None,
        });
        // Just pushed, so the vector is not empty.
        let last = self.figures.len() - 1;
        &mut self.figures[last]
    }

    pub fn skipped(
        &mut self,
        section: &'static str,
        name: impl Into<String>,
        why: impl Into<String>,
    ) {
        self.figures.push(Figure {
            section,
            name: name.into(),
            value: None,
            unit: "",
            target: None,
            note: Some(why.into()),
        });
    }

    /// p50, p99 and max of `s` in milliseconds, as three figures; the target goes on the percentile it is
    /// about (`target_on`: "p50", "p99" or "max").
    pub fn add_summary_ms(
        &mut self,
        section: &'static str,
        name: &str,
        s: &Summary,
        target: Option<(&str, &str)>,
        note: Option<&str>,
    ) {
        for (label, v) in [("p50", s.p50), ("p99", s.p99), ("max", s.max)] {
            let f = self.add(
                section,
                format!("{name} ({label}, n={})", s.n),
                v.as_secs_f64() * 1e3,
                "ms",
            );
            if let Some((on, t)) = target
                && on == label
            {
                f.target = Some(t.to_string());
            }
            if label == "p50" {
                f.note = note.map(str::to_string);
            }
        }
    }

    pub fn to_table(&self) -> String {
        let header = ["section", "measure", "value", "unit", "target", "note"];
        let rows: Vec<[String; 6]> = self
            .figures
            .iter()
            .map(|f| {
                [
                    f.section.to_string(),
                    f.name.clone(),
                    f.value.map_or("-".into(), format_value),
                    f.unit.to_string(),
                    f.target.clone().unwrap_or_default(),
                    f.note.clone().unwrap_or_default(),
                ]
            })
            .collect();
        let mut widths = header.map(str::len);
        for r in &rows {
            for (w, c) in widths.iter_mut().zip(r) {
                *w = (*w).max(c.chars().count());
            }
        }
        let line = |cells: [&str; 6]| {
            let mut s = String::new();
            for (i, (c, w)) in cells.iter().zip(widths).enumerate() {
                // Numbers read best right-aligned; the last column is not padded.
                match i {
                    2 => s.push_str(&format!("{c:>w$}  ")),
                    5 => s.push_str(c),
                    _ => s.push_str(&format!("{c:<w$}  ")),
                }
            }
            s.trim_end().to_string()
        };
        let mut out = format!(
            "snapdrain bench: {} build, {} CPU(s), measured on this machine\n\n",
            self.build, self.cpus
        );
        out.push_str(&line(header));
        out.push('\n');
        for r in &rows {
            out.push_str(&line([&r[0], &r[1], &r[2], &r[3], &r[4], &r[5]]));
            out.push('\n');
        }
        out
    }
}

fn format_value(v: f64) -> String {
    if v >= 100.0 || v.fract() == 0.0 {
        format!("{v:.0}")
    } else if v >= 10.0 {
        format!("{v:.1}")
    } else if v >= 1.0 {
        // Two decimals, so a ratio near its target (1.06x against <= 1.1x) reads as it is.
        format!("{v:.2}")
    } else {
        format!("{v:.3}")
    }
}
