//! The report as one self-contained HTML page: inline CSS, an inline SVG timeline, tables; nothing is
//! fetched (a change record may be opened offline, years later). Pure: plan data in, a String out.

use std::fmt::Write as _;

use super::model::ReportData;
use super::summary;
use super::tables::{self, plus};
use super::timeline::{self, Kind, Timeline};
use crate::cli::follow::events::human_bytes;

/// Escapes text for HTML element content and attribute values.
pub fn esc(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => o.push_str("&amp;"),
            '<' => o.push_str("&lt;"),
            '>' => o.push_str("&gt;"),
            '"' => o.push_str("&quot;"),
            '\'' => o.push_str("&#39;"),
            c => o.push(c),
        }
    }
    o
}

const CSS: &str = "
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px;color:#1d2330;background:#fff}
h1{font-size:22px;margin:0 0 4px} h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid #dde2ea;padding-bottom:4px}
.sub{color:#5b6575;font-size:13px}
.badge{display:inline-block;padding:2px 8px;border-radius:10px;color:#fff;font-size:13px;vertical-align:middle}
.Completed{background:#2e7d32}.Failed{background:#c62828}.Aborted{background:#ef6c00}.running{background:#1565c0}
table{border-collapse:collapse;font-size:13px;margin:4px 0}
th,td{border:1px solid #dde2ea;padding:4px 8px;text-align:left;vertical-align:top}
th{background:#f3f5f9} td.num{text-align:right;font-variant-numeric:tabular-nums}
code{font-size:12px}
svg text{font-size:11px;fill:#1d2330}
.step{fill:#90a4ae}.queued{fill:#cfd8dc}.backup{fill:#1e88e5}.verify{fill:#43a047}.evict{fill:#8e24aa}
.blocked{fill:#e53935}.replace{fill:#fb8c00}.retry{fill:#e53935}.terminated{fill:#212121}.warning{fill:#ff6f00}
.legend span{display:inline-block;margin-right:12px;font-size:12px}
.legend i{display:inline-block;width:12px;height:12px;margin-right:4px;vertical-align:-2px}
";

const LANE_H: f64 = 22.0;
const LABEL_W: f64 = 300.0;
const PLOT_W: f64 = 760.0;

/// A round step for the axis ticks: 1, 2, 5 × 10^n seconds, about eight ticks.
fn tick_step(span: f64) -> f64 {
    let raw = (span / 8.0).max(0.001);
    let mag = 10f64.powf(raw.log10().floor());
    [1.0, 2.0, 5.0, 10.0]
        .iter()
        .map(|m| m * mag)
        .find(|s| *s >= raw)
        .unwrap_or(10.0 * mag)
}

/// The timeline as SVG: one lane per step row, backup, pod and node.
pub fn svg(t: &Timeline) -> String {
    let span = timeline::offset(t, t.end).max(0.001);
    let x = |secs: f64| LABEL_W + secs / span * PLOT_W;
    let height = (t.lanes.len() as f64 + 1.0) * LANE_H + 30.0;
    let width = LABEL_W + PLOT_W + 20.0;
    let mut s = String::new();
    let _ = write!(
        s,
        r##"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}" role="img" aria-label="plan timeline">"##
    );
    for (i, lane) in t.lanes.iter().enumerate() {
        let y = i as f64 * LANE_H + 4.0;
        if i % 2 == 1 {
            let _ = write!(
                s,
                r##"<rect x="0" y="{y}" width="{width}" height="{LANE_H}" fill="#f7f8fb"/>"##
            );
        }
        let _ = write!(
            s,
            r#"<text class="lane" x="4" y="{}">{}</text>"#,
            y + 15.0,
            esc(lane)
        );
    }
    for b in &t.bars {
        let x0 = x(timeline::offset(t, b.start));
        let w = (x(timeline::offset(t, b.end)) - x0).max(2.0);
        let y = b.lane as f64 * LANE_H + 7.0;
        let secs = b.end.duration_since(b.start).as_secs_f64();
        let _ = write!(
            s,
            r#"<rect class="{}" x="{x0:.1}" y="{y}" width="{w:.1}" height="{}" rx="2"><title>{} ({secs:.2}s, from +{:.2}s)</title></rect>"#,
            b.kind.class(),
            LANE_H - 6.0,
            esc(&b.label),
            timeline::offset(t, b.start)
        );
        if b.kind == Kind::Step && w > 50.0 {
            let _ = write!(
                s,
                r##"<text x="{:.1}" y="{}" fill="#fff">{}</text>"##,
                x0 + 3.0,
                y + 12.0,
                esc(&b.label)
            );
        }
    }
    for m in &t.marks {
        let cx = x(timeline::offset(t, m.at));
        let cy = m.lane as f64 * LANE_H + 4.0 + LANE_H / 2.0;
        let _ = write!(
            s,
            r#"<circle class="{}" cx="{cx:.1}" cy="{cy}" r="4"><title>{} (+{:.2}s)</title></circle>"#,
            m.kind.class(),
            esc(&m.label),
            timeline::offset(t, m.at)
        );
    }
    let axis_y = t.lanes.len() as f64 * LANE_H + 10.0;
    let _ = write!(
        s,
        r##"<line x1="{LABEL_W}" y1="{axis_y}" x2="{}" y2="{axis_y}" stroke="#5b6575"/>"##,
        LABEL_W + PLOT_W
    );
    let step = tick_step(span);
    let mut tick = 0.0;
    while tick <= span + 1e-9 {
        let tx = x(tick);
        let _ = write!(
            s,
            r##"<line x1="{tx:.1}" y1="{axis_y}" x2="{tx:.1}" y2="{}" stroke="#5b6575"/><text x="{tx:.1}" y="{}" text-anchor="middle">+{}s</text>"##,
            axis_y + 4.0,
            axis_y + 16.0,
            trim_float(tick)
        );
        tick += step;
    }
    s.push_str("</svg>");
    s
}

fn trim_float(v: f64) -> String {
    let s = format!("{v:.2}");
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}

fn table(out: &mut String, id: &str, header: &[&str], rows: &[Vec<String>]) {
    let _ = write!(out, r#"<table id="{id}">"#);
    // Key-value tables have no header row.
    if header.iter().any(|h| !h.is_empty()) {
        out.push_str("<thead><tr>");
        for h in header {
            let _ = write!(out, "<th>{}</th>", esc(h));
        }
        out.push_str("</tr></thead>");
    }
    out.push_str("<tbody>");
    for r in rows {
        out.push_str("<tr>");
        for c in r {
            let _ = write!(out, "<td>{}</td>", esc(c));
        }
        out.push_str("</tr>");
    }
    out.push_str("</tbody></table>");
}

pub fn render_html(data: &ReportData) -> String {
    let t = timeline::build(data);
    let status = data.plan.status.clone().unwrap_or_default();
    let name = data.plan.metadata.name.clone().unwrap_or_default();
    let phase = status.phase.as_str();
    let badge = if status.phase.is_terminal() {
        phase
    } else {
        "running"
    };
    let mut o = String::new();
    let _ = write!(
        o,
        r#"<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>snapdrain report: {n}</title><style>{CSS}</style></head><body>"#,
        n = esc(&name)
    );
    let _ = write!(
        o,
        r#"<h1>DisruptionPlan {} <span class="badge {badge}" id="outcome">{phase}</span></h1><div class="sub">snapdrain report generated {} · plan created {}</div>"#,
        esc(&name),
        data.generated_at,
        t.start
    );

    o.push_str("<h2>Summary</h2>");
    let rows: Vec<Vec<String>> = summary::rows(data, &t)
        .into_iter()
        .map(|(k, v)| vec![k, v])
        .collect();
    table(&mut o, "summary", &["", ""], &rows);

    o.push_str(r#"<h2>Timeline</h2><div class="legend">"#);
    for (k, label) in [
        (Kind::Step, "step"),
        (Kind::Queued, "Velero queue"),
        (Kind::BackingUp, "backing up"),
        (Kind::Verifying, "verifying in the bucket"),
        (Kind::Eviction, "eviction (first attempt → accepted)"),
        (Kind::Blocked, "never evicted"),
        (Kind::Retry, "refused (429) / blocked"),
        (Kind::Terminated, "terminated"),
        (Kind::Replacement, "replacement boot"),
    ] {
        let _ = write!(
            o,
            r#"<span><svg width="12" height="12"><rect class="{}" width="12" height="12"/></svg> {label}</span>"#,
            k.class()
        );
    }
    o.push_str("</div>");
    o.push_str(&svg(&t));

    o.push_str("<h2>Steps</h2>");
    let rows = tables::steps(&t);
    table(&mut o, "steps", &["Step", "Started", "Took"], &rows);

    o.push_str("<h2>Backups</h2>");
    if status.backups.is_empty() {
        o.push_str("<p>No backup was needed or taken.</p>");
    }
    for b in &status.backups {
        let velero = data.backups.iter().find(|v| v.name == b.name);
        let _ = write!(
            o,
            r#"<h3 class="backup" id="backup-{}">{}</h3>"#,
            esc(&b.name),
            esc(&b.name)
        );
        let items = velero
            .and_then(|v| v.items)
            .map(|(d, n)| format!("{d}/{n}"))
            .unwrap_or_else(|| "-".into());
        let rows = vec![
            vec!["Namespace".into(), b.namespace.clone()],
            vec![
                "Attempt".into(),
                format!("{}{}", b.attempt, if b.reused { " (reused)" } else { "" }),
            ],
            vec!["StatefulSets".into(), b.stateful_sets.join(", ")],
            vec!["Pods".into(), b.pods.join(", ")],
            vec!["PVCs".into(), b.pvcs.join(", ")],
            vec!["Velero phase".into(), b.phase.clone().unwrap_or_default()],
            vec!["Items".into(), items],
            vec!["Backup hooks".into(), hooks_text(b)],
            vec![
                "Verified".into(),
                match (&b.verified_at, &b.verification_error) {
                    (Some(at), _) if b.verified => format!("yes, {}", plus(&t, at.0)),
                    (_, Some(e)) => format!("no: {e}"),
                    _ => "no".into(),
                },
            ],
        ];
        table(
            &mut o,
            &format!("backup-{}-facts", b.name),
            &["", ""],
            &rows,
        );
        if !b.verified_objects.is_empty() {
            let rows: Vec<Vec<String>> = b
                .verified_objects
                .iter()
                .map(|v| vec![v.key.clone(), human_bytes(v.size), v.size.to_string()])
                .collect();
            table(
                &mut o,
                &format!("backup-{}-objects", b.name),
                &["Bucket object", "Size", "Bytes"],
                &rows,
            );
        }
    }

    o.push_str("<h2>Evictions</h2>");
    if t.evictions.is_empty() {
        o.push_str(
            "<p>No per-pod eviction record (the audit log is only available on the simulated cluster); \
             the plan counted the evictions per node:</p>",
        );
        let rows = tables::node_evictions(&status);
        table(
            &mut o,
            "evictions",
            &["Node", "Evicted", "Blocked by"],
            &rows,
        );
    } else {
        let rows = tables::pod_evictions(&t);
        table(
            &mut o,
            "evictions",
            &[
                "Pod",
                "Attempts",
                "Refused (429, PDB)",
                "First attempt",
                "Evicted",
            ],
            &rows,
        );
    }

    o.push_str("<h2>Events</h2>");
    let rows = tables::events(data, &t);
    if rows.is_empty() {
        o.push_str(
            "<p>No Events found for this plan (the API server keeps them an hour by default).</p>",
        );
    } else {
        table(&mut o, "events", &["At", "Type", "Reason", "Note"], &rows);
    }
    if let Some(audit) = &data.audit {
        let _ = write!(
            o,
            "<h2>Simulator audit log</h2><p>{} entries from the simulated cluster's <code>/sim/audit</code>; evictions above come from it.</p>",
            audit.len()
        );
    }
    o.push_str("</body></html>\n");
    o
}

/// The Velero backup hooks of a backup, as Velero counted them, and the policy's hooks it carried.
pub(super) fn hooks_text(b: &snapdrain::api::status::BackupRecord) -> String {
    let counted = match b.hooks {
        Some(h) if h.hooks_attempted > 0 => {
            format!("{} run, {} failed", h.hooks_attempted, h.hooks_failed)
        }
        Some(_) => "none (no pre/post.hook.backup.velero.io annotations)".into(),
        None => "-".into(),
    };
    if b.policy_hooks.is_empty() {
        counted
    } else {
        format!("{counted}; policy hooks {}", b.policy_hooks.join(", "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::timeline::tests::sample;

    #[test]
    fn the_page_is_self_contained_and_escapes_text() {
        let mut d = sample();
        d.events[0].note = "<script>alert(1)</script>".into();
        let html = render_html(&d);
        assert!(html.starts_with("<!DOCTYPE html>"));
        assert!(!html.contains("<script"), "notes are escaped");
        assert!(html.contains("&lt;script&gt;"));
        for external in ["http://", "https://", "src=", "<link"] {
            let outside_svg_ns = html.replace("http://www.w3.org/2000/svg", "");
            assert!(
                !outside_svg_ns.contains(external),
                "nothing fetched: {external}"
            );
        }
    }

    #[test]
    fn the_page_shows_steps_in_order_backups_objects_and_pods() {
        let html = render_html(&sample());
        let steps_at = html.find(r#"<table id="steps">"#).expect("steps table");
        let steps = &html[steps_at..];
        let pos = |s: &str| steps.find(&format!("<td>{s}</td>")).unwrap_or(usize::MAX);
        let order = [
            "Pending",
            "BackingUp",
            "Verifying",
            "Cordoning",
            "Draining",
            "Terminating",
            "Completed",
        ];
        let found: Vec<usize> = order.iter().map(|s| pos(s)).collect();
        assert!(found.windows(2).all(|w| w[0] < w[1]), "{found:?}");
        assert!(html.contains("backups/drain-n1-shop-1/drain-n1-shop-1.tar.gz"));
        assert!(html.contains("<td>10.0 KiB</td>"));
        assert!(
            html.contains("<td>shop/pg-0</td><td>3</td><td>2</td>"),
            "pg-0: 3 attempts, 2 refused"
        );
        assert!(html.contains(r#"class="badge Completed""#));
        assert!(html.contains("<svg") && html.contains("class=\"retry\""));
        assert!(html.contains("EC2 instance i-0abc of node n1 terminated"));
    }

    #[test]
    fn ticks_are_round() {
        assert_eq!(tick_step(12.0), 2.0);
        assert_eq!(tick_step(0.8), 0.1);
        assert_eq!(tick_step(300.0), 50.0);
    }
}
