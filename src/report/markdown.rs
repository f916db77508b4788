//! The report as Markdown (GitHub-flavoured tables), for pasting into a change record. Pure.

use std::fmt::Write as _;

use super::model::ReportData;
use super::summary;
use super::tables::{self, plus};
use super::timeline;
use crate::cli::follow::events::human_bytes;

/// Escapes a table cell: pipes would split it, newlines would end the row.
fn cell(s: &str) -> String {
    s.replace('|', "\\|").replace(['\n', '\r'], " ")
}

fn table(o: &mut String, header: &[&str], rows: &[Vec<String>]) {
    let _ = writeln!(o, "| {} |", header.join(" | "));
    let _ = writeln!(o, "|{}", "---|".repeat(header.len()));
    for r in rows {
        let cells: Vec<String> = r.iter().map(|c| cell(c)).collect();
        let _ = writeln!(o, "| {} |", cells.join(" | "));
    }
    o.push('\n');
}

pub fn render_markdown(data: &ReportData) -> String {
    let t = timeline::build(data);
    let status = data.plan.status.clone().unwrap_or_default();
    let name = data.plan.metadata.name.clone().unwrap_or_default();
    let mut o = String::new();
    let _ = writeln!(o, "## DisruptionPlan `{name}`: {}\n", status.phase);
    let _ = writeln!(
        o,
        "_snapdrain report generated {}; plan created {}_\n",
        data.generated_at, t.start
    );
    let rows: Vec<Vec<String>> = summary::rows(data, &t)
        .into_iter()
        .map(|(k, v)| vec![format!("**{k}**"), v])
        .collect();
    table(&mut o, &["", ""], &rows);

    o.push_str("### Steps\n\n");
    let rows = tables::steps(&t);
    table(&mut o, &["Step", "Started", "Took"], &rows);

    o.push_str("### Backups\n\n");
    if status.backups.is_empty() {
        o.push_str("No backup was needed or taken.\n\n");
    }
    for b in &status.backups {
        let verified = match (&b.verified_at, &b.verification_error) {
            (Some(at), _) if b.verified => format!("verified {}", plus(&t, at.0)),
            (_, Some(e)) => format!("verification failed: {e}"),
            _ => "not verified".into(),
        };
        let _ = writeln!(
            o,
            "- `{}`: namespace {}, attempt {}, Velero phase {}, {verified}; PVCs {}; backup hooks {}",
            b.name,
            b.namespace,
            b.attempt,
            b.phase.as_deref().unwrap_or("-"),
            b.pvcs.join(", "),
            super::html::hooks_text(b)
        );
        for v in &b.verified_objects {
            let _ = writeln!(
                o,
                "  - `{}` {} ({} bytes)",
                v.key,
                human_bytes(v.size),
                v.size
            );
        }
    }
    o.push('\n');

    o.push_str("### Evictions\n\n");
    if t.evictions.is_empty() {
        let rows = tables::node_evictions(&status);
        table(&mut o, &["Node", "Evicted", "Blocked by"], &rows);
    } else {
        let rows = tables::pod_evictions(&t);
        table(
            &mut o,
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

    o.push_str("### Events\n\n");
    let rows = tables::events(data, &t);
    if rows.is_empty() {
        o.push_str("No Events found for this plan.\n");
    } else {
        table(&mut o, &["At", "Type", "Reason", "Note"], &rows);
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::timeline::tests::sample;

    #[test]
    fn markdown_has_the_summary_steps_objects_and_escaped_cells() {
        let mut d = sample();
        d.events[0].note = "a | b\nc".into();
        let md = render_markdown(&d);
        assert!(
            md.starts_with("## DisruptionPlan `drain-n1`: Completed"),
            "{md}"
        );
        assert!(md.contains("| **Outcome** | Completed |"), "{md}");
        assert!(md.contains("| BackingUp | +1.00s | 3.00s |"), "{md}");
        assert!(
            md.contains("`backups/drain-n1-shop-1/drain-n1-shop-1.tar.gz` 10.0 KiB"),
            "{md}"
        );
        assert!(
            md.contains("| shop/pg-0 | 3 | 2 | +6.00s | +9.00s |"),
            "{md}"
        );
        assert!(md.contains("a \\| b c"), "cells escaped: {md}");
    }
}
