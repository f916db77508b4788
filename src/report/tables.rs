//! The rows both renderers show (steps, evictions, Events), so HTML and Markdown never disagree.

use super::model::ReportData;
use super::timeline::{self, Timeline};
use snapdrain::api::status::DisruptionPlanStatus;

/// A time as an offset from the plan's start, e.g. `+1.25s`.
pub fn plus(t: &Timeline, at: jiff::Timestamp) -> String {
    format!("+{:.2}s", timeline::offset(t, at))
}

/// Step, started, took.
pub fn steps(t: &Timeline) -> Vec<Vec<String>> {
    t.steps
        .iter()
        .map(|s| {
            vec![
                s.phase.clone(),
                plus(t, s.start),
                format!("{:.2}s", s.end.duration_since(s.start).as_secs_f64()),
            ]
        })
        .collect()
}

/// Per node (when no per-pod record exists): node, evicted of total, blocked by.
pub fn node_evictions(status: &DisruptionPlanStatus) -> Vec<Vec<String>> {
    status
        .nodes
        .iter()
        .map(|n| {
            vec![
                n.name.clone(),
                format!("{}/{}", n.pods_evicted, n.pods_total),
                n.blocked_by.clone().unwrap_or_default(),
            ]
        })
        .collect()
}

/// Per pod: pod, attempts, refused, first attempt, evicted.
pub fn pod_evictions(t: &Timeline) -> Vec<Vec<String>> {
    t.evictions
        .iter()
        .map(|p| {
            vec![
                p.pod.clone(),
                p.attempts.to_string(),
                p.refused.to_string(),
                plus(t, p.first_attempt),
                p.evicted_at
                    .map(|a| plus(t, a))
                    .unwrap_or_else(|| "not evicted".into()),
            ]
        })
        .collect()
}

/// When, type, reason, message.
pub fn events(data: &ReportData, t: &Timeline) -> Vec<Vec<String>> {
    data.events
        .iter()
        .map(|e| {
            vec![
                plus(t, e.time),
                e.type_.clone(),
                e.reason.clone(),
                e.note.clone(),
            ]
        })
        .collect()
}
