//! The plan's life on one time axis: steps, each backup from creation to verification, each pod's
//! eviction with its refused attempts (PDB waits), instance termination and replacement boot. Pure: it
//! only reads [`ReportData`].

use std::collections::BTreeMap;

use jiff::Timestamp;

use super::model::{AuditRecord, ReportData};
use snapdrain::api::status::PlanPhase;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Step,
    Queued,
    BackingUp,
    Verifying,
    Eviction,
    /// An eviction that was never accepted.
    Blocked,
    Replacement,
    /// A point in time: a refused eviction, a termination, a block.
    Retry,
    Terminated,
    Warning,
}

impl Kind {
    /// CSS class (and legend name).
    pub fn class(self) -> &'static str {
        match self {
            Self::Step => "step",
            Self::Queued => "queued",
            Self::BackingUp => "backup",
            Self::Verifying => "verify",
            Self::Eviction => "evict",
            Self::Blocked => "blocked",
            Self::Replacement => "replace",
            Self::Retry => "retry",
            Self::Terminated => "terminated",
            Self::Warning => "warning",
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct Bar {
    pub lane: usize,
    pub label: String,
    pub kind: Kind,
    pub start: Timestamp,
    pub end: Timestamp,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Mark {
    pub lane: usize,
    pub at: Timestamp,
    pub label: String,
    pub kind: Kind,
}

/// One pod's evictions, from the audit log.
#[derive(Clone, Debug, PartialEq)]
pub struct PodEvictions {
    pub pod: String,
    pub attempts: u32,
    /// Attempts refused with 429 (a PodDisruptionBudget, or the eviction gate, said not now).
    pub refused: u32,
    pub first_attempt: Timestamp,
    pub evicted_at: Option<Timestamp>,
}

/// A step as it happened.
#[derive(Clone, Debug, PartialEq)]
pub struct Step {
    pub phase: String,
    pub start: Timestamp,
    pub end: Timestamp,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Timeline {
    pub start: Timestamp,
    pub end: Timestamp,
    pub lanes: Vec<String>,
    pub bars: Vec<Bar>,
    pub marks: Vec<Mark>,
    pub steps: Vec<Step>,
    pub evictions: Vec<PodEvictions>,
}

const FINAL_REASONS: [(&str, &str); 3] = [
    ("PlanCompleted", "Completed"),
    ("PlanFailed", "Failed"),
    ("PlanAborted", "Aborted"),
];

/// Step boundaries: from the Events the controller records on each transition; without Events, from
/// `status.stepTimings` laid end to end from the decision.
fn steps(data: &ReportData, created: Timestamp, last: Timestamp) -> Vec<Step> {
    let phase_names: Vec<&str> = PlanPhase::ALL.iter().map(|p| p.as_str()).collect();
    let mut starts: Vec<(Timestamp, String)> = data
        .events
        .iter()
        .filter_map(|e| {
            if phase_names.contains(&e.reason.as_str()) {
                return Some((e.time, e.reason.clone()));
            }
            FINAL_REASONS
                .iter()
                .find(|(r, _)| *r == e.reason)
                .map(|(_, p)| (e.time, (*p).to_string()))
        })
        .collect();
    starts.sort_by_key(|(t, _)| *t);
    let status = data.plan.status.clone().unwrap_or_default();
    if starts.is_empty() {
        // No Events (expired after an hour by default, or not readable): lay the recorded durations out.
        let mut t = status.decided_at.as_ref().map_or(created, |d| d.0);
        let mut out = Vec::new();
        for p in PlanPhase::ALL {
            if let Some(secs) = status.step_timings.get(p.as_str()) {
                let end = t + jiff::SignedDuration::from_secs_f64(secs.max(0.0));
                out.push(Step {
                    phase: p.as_str().into(),
                    start: t,
                    end,
                });
                t = end;
            }
        }
        if status.phase.is_terminal() {
            out.push(Step {
                phase: status.phase.as_str().into(),
                start: t,
                end: t,
            });
        }
        return out;
    }
    let mut out = vec![Step {
        phase: "Pending".into(),
        start: created,
        end: starts[0].0,
    }];
    for (i, (t, phase)) in starts.iter().enumerate() {
        let terminal = matches!(phase.as_str(), "Completed" | "Failed" | "Aborted");
        let end = if terminal {
            *t
        } else {
            starts.get(i + 1).map_or(last, |(n, _)| *n)
        };
        out.push(Step {
            phase: phase.clone(),
            start: *t,
            end,
        });
    }
    out
}

fn evictions(audit: &[AuditRecord], from: Timestamp, to: Timestamp) -> Vec<PodEvictions> {
    let mut by_pod: BTreeMap<String, PodEvictions> = BTreeMap::new();
    for e in audit
        .iter()
        .filter(|e| e.source == "api" && e.resource == "pods/eviction")
    {
        let Some(at) = e.at().filter(|t| *t >= from && *t <= to) else {
            continue;
        };
        let pod = format!(
            "{}/{}",
            e.namespace.as_deref().unwrap_or_default(),
            e.name.as_deref().unwrap_or_default()
        );
        let entry = by_pod.entry(pod.clone()).or_insert(PodEvictions {
            pod,
            attempts: 0,
            refused: 0,
            first_attempt: at,
            evicted_at: None,
        });
        entry.attempts += 1;
        match e.code {
            Some(201) => {
                entry.evicted_at.get_or_insert(at);
            }
            Some(429) => entry.refused += 1,
            _ => {}
        }
    }
    let mut v: Vec<PodEvictions> = by_pod.into_values().collect();
    v.sort_by_key(|p| (p.first_attempt, p.pod.clone()));
    v
}

pub fn build(data: &ReportData) -> Timeline {
    let status = data.plan.status.clone().unwrap_or_default();
    let created = data
        .plan
        .metadata
        .creation_timestamp
        .as_ref()
        .map(|t| t.0)
        .or_else(|| status.decided_at.as_ref().map(|t| t.0))
        .unwrap_or(data.generated_at);
    let mut last = created;
    for e in &data.events {
        last = last.max(e.time);
    }
    for b in &status.backups {
        for t in [
            b.verified_at.as_ref().map(|t| t.0),
            b.completed_at.as_ref().map(|t| t.0),
        ]
        .into_iter()
        .flatten()
        {
            last = last.max(t);
        }
    }
    if !status.phase.is_terminal() {
        last = last.max(data.generated_at);
    }
    let audit = data.audit.as_deref().unwrap_or_default();
    let pods = evictions(audit, created, last.max(data.generated_at));
    for p in &pods {
        last = last.max(p.evicted_at.unwrap_or(p.first_attempt));
    }

    let mut lanes = vec!["Steps".to_string()];
    let mut bars = Vec::new();
    let mut marks = Vec::new();
    let steps = steps(data, created, last);
    for s in &steps {
        bars.push(Bar {
            lane: 0,
            label: s.phase.clone(),
            kind: Kind::Step,
            start: s.start,
            end: s.end,
        });
    }

    for b in &status.backups {
        lanes.push(format!("backup {}", b.name));
        let lane = lanes.len() - 1;
        let velero = data.backups.iter().find(|v| v.name == b.name);
        let created_at = velero
            .and_then(|v| v.created)
            .or(b.started_at.as_ref().map(|t| t.0));
        let started = velero.and_then(|v| v.started).or(created_at);
        let completed = b
            .completed_at
            .as_ref()
            .map(|t| t.0)
            .or(velero.and_then(|v| v.completed));
        let verified = b.verified_at.as_ref().map(|t| t.0);
        let mut push = |kind, label: &str, s: Option<Timestamp>, e: Option<Timestamp>| {
            if let (Some(s), Some(e)) = (s, e)
                && e >= s
            {
                bars.push(Bar {
                    lane,
                    label: label.into(),
                    kind,
                    start: s,
                    end: e,
                });
            }
        };
        push(Kind::Queued, "queued", created_at, started);
        push(
            Kind::BackingUp,
            "backing up",
            started,
            completed.or(Some(last).filter(|_| b.phase.as_deref() == Some("InProgress"))),
        );
        push(Kind::Verifying, "verifying", completed, verified);
        if let Some(err) = &b.verification_error {
            marks.push(Mark {
                lane,
                at: completed.unwrap_or(last),
                label: format!("verification failed: {err}"),
                kind: Kind::Warning,
            });
        }
        if matches!(
            b.phase.as_deref(),
            Some("Failed" | "PartiallyFailed" | "FailedValidation")
        ) {
            marks.push(Mark {
                lane,
                at: completed.or(started).unwrap_or(last),
                label: format!("Velero phase {}", b.phase.as_deref().unwrap_or_default()),
                kind: Kind::Warning,
            });
        }
    }

    for p in &pods {
        lanes.push(format!("pod {}", p.pod));
        let lane = lanes.len() - 1;
        let (end, kind) = match p.evicted_at {
            Some(t) => (t, Kind::Eviction),
            None => (last, Kind::Blocked),
        };
        bars.push(Bar {
            lane,
            label: format!("{} attempt(s), {} refused", p.attempts, p.refused),
            kind,
            start: p.first_attempt,
            end,
        });
        for e in audit.iter().filter(|e| {
            e.source == "api"
                && e.resource == "pods/eviction"
                && e.code == Some(429)
                && format!(
                    "{}/{}",
                    e.namespace.as_deref().unwrap_or_default(),
                    e.name.as_deref().unwrap_or_default()
                ) == p.pod
        }) {
            if let Some(at) = e.at() {
                marks.push(Mark {
                    lane,
                    at,
                    label: "429: disruption budget".into(),
                    kind: Kind::Retry,
                });
            }
        }
    }

    // Nodes: blocks, termination and the replacement's boot, from the plan's Events.
    for n in &status.nodes {
        lanes.push(format!("node {}", n.name));
        let lane = lanes.len() - 1;
        for e in data.events.iter().filter(|e| e.note.contains(&n.name)) {
            let kind = match e.reason.as_str() {
                "InstanceTerminated" | "NodeClaimDeleted" => Kind::Terminated,
                "EvictionBlocked" => Kind::Retry,
                _ => continue,
            };
            marks.push(Mark {
                lane,
                at: e.time,
                label: e.note.clone(),
                kind,
            });
        }
        let launched = data
            .events
            .iter()
            .find(|e| e.reason == "ReplacementLaunched")
            .map(|e| e.time);
        let ready = data
            .events
            .iter()
            .find(|e| e.reason == "ReplacementReady")
            .map(|e| e.time);
        if let (Some(r), Some(s)) = (&n.replacement, launched) {
            let label = format!(
                "replacement {} boot",
                r.node_name.as_deref().unwrap_or("(not joined)")
            );
            bars.push(Bar {
                lane,
                label,
                kind: Kind::Replacement,
                start: s,
                end: ready.unwrap_or(last),
            });
        }
    }
    for e in audit
        .iter()
        .filter(|e| e.source == "world" && e.verb == "instance-terminated")
    {
        let Some(at) = e.at().filter(|t| *t >= created && *t <= last) else {
            continue;
        };
        if let Some(lane) = status.nodes.iter().position(|n| {
            n.instance_id
                .as_deref()
                .is_some_and(|i| Some(i) == e.name.as_deref())
        }) {
            let lane = lanes
                .iter()
                .position(|l| *l == format!("node {}", status.nodes[lane].name))
                .unwrap_or(0);
            marks.push(Mark {
                lane,
                at,
                label: format!(
                    "instance {} terminated",
                    e.name.as_deref().unwrap_or_default()
                ),
                kind: Kind::Terminated,
            });
        }
    }
    let end = bars
        .iter()
        .map(|b| b.end)
        .chain(marks.iter().map(|m| m.at))
        .fold(last, Timestamp::max);
    Timeline {
        start: created,
        end,
        lanes,
        bars,
        marks,
        steps,
        evictions: pods,
    }
}

/// Seconds from the timeline's start.
pub fn offset(t: &Timeline, at: Timestamp) -> f64 {
    at.duration_since(t.start).as_secs_f64()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::report::model::{PlanEvent, VeleroBackupTimes};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, Time};
    use snapdrain::api::DisruptionPlan;
    use snapdrain::api::status::{
        BackupRecord, DisruptionPlanStatus, NodePhase, NodeProgress, VerifiedObject,
    };

    pub fn ts(s: &str) -> Timestamp {
        format!("2030-01-01T00:00:{s}Z").parse().expect("time")
    }

    fn ev(t: &str, reason: &str, note: &str) -> PlanEvent {
        PlanEvent {
            time: ts(t),
            type_: "Normal".into(),
            reason: reason.into(),
            note: note.into(),
        }
    }

    fn audit(seq: u64, t: &str, code: u16, pod: &str) -> AuditRecord {
        AuditRecord {
            seq,
            time: format!("2030-01-01T00:00:{t}Z"),
            source: "api".into(),
            verb: "create".into(),
            resource: "pods/eviction".into(),
            namespace: Some("shop".into()),
            name: Some(pod.into()),
            user_agent: None,
            code: Some(code),
            detail: serde_json::Value::Null,
        }
    }

    /// A completed plan: one backup, two pods (one refused twice by its PDB), termination.
    pub fn sample() -> ReportData {
        let mut plan: DisruptionPlan = serde_json::from_value(serde_json::json!({
            "apiVersion": "snapdrain.io/v1alpha1", "kind": "DisruptionPlan",
            "metadata": {"name": "drain-n1", "creationTimestamp": "2030-01-01T00:00:00Z"},
            "spec": {"nodes": ["n1"]}
        }))
        .expect("plan");
        plan.status = Some(DisruptionPlanStatus {
            phase: PlanPhase::Completed,
            message: Some("completed: n1 handled, 2 pod(s) evicted, 1 backup(s) verified".into()),
            decided_at: Some(Time(ts("00"))),
            nodes: vec![NodeProgress {
                name: "n1".into(),
                instance_id: Some("i-0abc".into()),
                pods_total: 2,
                pods_evicted: 2,
                phase: NodePhase::Gone,
                ..Default::default()
            }],
            backups: vec![BackupRecord {
                name: "drain-n1-shop-1".into(),
                namespace: "shop".into(),
                attempt: 1,
                phase: Some("Completed".into()),
                verified: true,
                pvcs: vec!["data-pg-0".into()],
                pods: vec!["pg-0".into()],
                verified_objects: vec![
                    VerifiedObject {
                        key: "backups/drain-n1-shop-1/velero-backup.json".into(),
                        size: 2048,
                    },
                    VerifiedObject {
                        key: "backups/drain-n1-shop-1/drain-n1-shop-1.tar.gz".into(),
                        size: 10_240,
                    },
                ],
                started_at: Some(Time(ts("01"))),
                completed_at: Some(MicroTime(ts("04"))),
                verified_at: Some(MicroTime(ts("05"))),
                ..Default::default()
            }],
            step_timings: [("Pending", 1.0), ("BackingUp", 3.0), ("Verifying", 1.0)]
                .into_iter()
                .map(|(k, v)| (k.to_string(), v))
                .collect(),
            ..Default::default()
        });
        ReportData {
            plan,
            events: vec![
                ev("01", "BackingUp", "Pending → BackingUp"),
                ev("04", "Verifying", "BackingUp → Verifying"),
                ev("05", "Cordoning", "Verifying → Cordoning"),
                ev("06", "Draining", "Cordoning → Draining"),
                ev(
                    "07",
                    "EvictionBlocked",
                    "node n1: shop/pg-0: Cannot evict pod as it would violate the pod's disruption budget.",
                ),
                ev("10", "Terminating", "Draining → Terminating"),
                ev(
                    "11",
                    "InstanceTerminated",
                    "EC2 instance i-0abc of node n1 terminated",
                ),
                ev("12", "PlanCompleted", "completed"),
            ],
            backups: vec![VeleroBackupTimes {
                name: "drain-n1-shop-1".into(),
                created: Some(ts("01")),
                started: Some(ts("02")),
                completed: Some(ts("04")),
                phase: Some("Completed".into()),
                items: Some((11, 11)),
            }],
            audit: Some(vec![
                audit(1, "06", 201, "web-1"),
                audit(2, "06", 429, "pg-0"),
                audit(3, "07", 429, "pg-0"),
                audit(4, "09", 201, "pg-0"),
            ]),
            generated_at: ts("30"),
        }
    }

    #[test]
    fn steps_come_from_the_transition_events_in_order() {
        let t = build(&sample());
        let names: Vec<&str> = t.steps.iter().map(|s| s.phase.as_str()).collect();
        assert_eq!(
            names,
            [
                "Pending",
                "BackingUp",
                "Verifying",
                "Cordoning",
                "Draining",
                "Terminating",
                "Completed"
            ]
        );
        assert_eq!(t.steps[1].start, ts("01"));
        assert_eq!(t.steps[1].end, ts("04"));
        assert_eq!(t.start, ts("00"));
        assert_eq!(t.end, ts("12"));
    }

    #[test]
    fn without_events_the_recorded_durations_are_laid_end_to_end() {
        let mut d = sample();
        d.events.clear();
        let t = build(&d);
        let names: Vec<(&str, f64)> = t
            .steps
            .iter()
            .map(|s| {
                (
                    s.phase.as_str(),
                    s.end.duration_since(s.start).as_secs_f64(),
                )
            })
            .collect();
        assert_eq!(
            names,
            [
                ("Pending", 1.0),
                ("BackingUp", 3.0),
                ("Verifying", 1.0),
                ("Completed", 0.0)
            ]
        );
    }

    #[test]
    fn backups_show_queue_run_and_verification_and_pods_their_refusals() {
        let t = build(&sample());
        let lane = t
            .lanes
            .iter()
            .position(|l| l == "backup drain-n1-shop-1")
            .expect("lane");
        let kinds: Vec<(Kind, Timestamp, Timestamp)> = t
            .bars
            .iter()
            .filter(|b| b.lane == lane)
            .map(|b| (b.kind, b.start, b.end))
            .collect();
        assert_eq!(
            kinds,
            [
                (Kind::Queued, ts("01"), ts("02")),
                (Kind::BackingUp, ts("02"), ts("04")),
                (Kind::Verifying, ts("04"), ts("05")),
            ]
        );
        assert_eq!(t.evictions.len(), 2);
        let pg = t
            .evictions
            .iter()
            .find(|p| p.pod == "shop/pg-0")
            .expect("pg-0");
        assert_eq!((pg.attempts, pg.refused), (3, 2));
        assert_eq!(pg.evicted_at, Some(ts("09")));
        let pg_lane = t
            .lanes
            .iter()
            .position(|l| l == "pod shop/pg-0")
            .expect("lane");
        assert_eq!(
            t.marks
                .iter()
                .filter(|m| m.lane == pg_lane && m.kind == Kind::Retry)
                .count(),
            2
        );
        let node_lane = t.lanes.iter().position(|l| l == "node n1").expect("lane");
        assert!(
            t.marks
                .iter()
                .any(|m| m.lane == node_lane && m.kind == Kind::Terminated)
        );
    }
}
