//! The summary table both renderers show: one (label, value) per row. Pure.

use super::model::ReportData;
use super::timeline::Timeline;
use crate::cli::follow::events::human_bytes;

pub fn rows(data: &ReportData, t: &Timeline) -> Vec<(String, String)> {
    let plan = &data.plan;
    let s = plan.status.clone().unwrap_or_default();
    let name = plan.metadata.name.clone().unwrap_or_default();
    let nodes: Vec<String> = if s.nodes.is_empty() {
        plan.spec.nodes.clone()
    } else {
        s.nodes.iter().map(|n| n.name.clone()).collect()
    };
    let verified: Vec<_> = s.backups.iter().filter(|b| b.verified).collect();
    let bytes: u64 = verified
        .iter()
        .flat_map(|b| b.verified_objects.iter().map(|o| o.size))
        .sum();
    let evicted: u32 = s.nodes.iter().map(|n| n.pods_evicted).sum();
    let total: u32 = s.nodes.iter().map(|n| n.pods_total).sum();
    let refused: u32 = t.evictions.iter().map(|p| p.refused).sum();
    let replacements: Vec<String> = s
        .nodes
        .iter()
        .filter_map(|n| n.replacement.as_ref())
        .map(|r| {
            format!(
                "{} ({}{})",
                r.node_name.as_deref().unwrap_or("not joined"),
                r.instance_ids.join(","),
                if r.ready { ", Ready" } else { "" }
            )
        })
        .collect();
    let mut rows = vec![
        ("Plan".to_string(), name),
        ("Outcome".into(), s.phase.to_string()),
        ("Message".into(), s.message.clone().unwrap_or_default()),
        (
            "Mode".into(),
            format!(
                "{:?}, backup {:?} ({:?}){}",
                plan.spec.mode,
                plan.spec.backup.policy,
                plan.spec.backup.method,
                if plan.spec.dry_run { ", dry run" } else { "" }
            ),
        ),
        ("Nodes".into(), nodes.join(", ")),
        (
            "Duration".into(),
            format!("{:.1}s", t.end.duration_since(t.start).as_secs_f64()),
        ),
        (
            "Backups verified".into(),
            format!(
                "{} of {} attempt(s); {} in the bucket",
                verified.len(),
                s.backups.len(),
                human_bytes(bytes)
            ),
        ),
        (
            "Pods evicted".into(),
            format!("{evicted} of {total}; {refused} eviction(s) refused and retried"),
        ),
    ];
    if let Some(d) = &plan.spec.deadline {
        rows.push(("Deadline".into(), d.0.to_string()));
    }
    if let Some(r) = &plan.spec.reason {
        rows.push(("Reason".into(), r.clone()));
    }
    rows.push((
        "Replacement".into(),
        if replacements.is_empty() {
            "none".into()
        } else {
            replacements.join("; ")
        },
    ));
    // The plan's status has no record of holds (the do-not-disrupt annotations); say so rather than
    // leave a reader to guess.
    let released: Vec<&str> = s
        .nodes
        .iter()
        .filter(|n| n.phase == snapdrain::api::NodePhase::Released)
        .map(|n| n.name.as_str())
        .collect();
    rows.push((
        "Holds released".into(),
        if released.is_empty() {
            "not recorded in the plan's status".into()
        } else {
            format!("released on {}", released.join(", "))
        },
    ));
    rows
}
