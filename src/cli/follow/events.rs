//! What changed in a followed plan, as structured updates: the pure core of `snapdrain drain`'s output.
//! [`Tracker`] remembers what was already told, so each change becomes exactly one [`Update`], whichever
//! source (the plan's status, the Velero Backup, its PodVolumeBackups) reports it first.

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;

use snapdrain::api::status::{DisruptionPlanStatus, NodePhase, PlanPhase};
use snapdrain::api::velero::BackupItemsProgress;

/// One change worth telling. Serialized (with `event` as tag) for `-o json` lines.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(
    tag = "event",
    rename_all = "camelCase",
    rename_all_fields = "camelCase"
)]
pub enum Update {
    /// The plan moved to another step.
    Phase {
        #[serde(skip_serializing_if = "Option::is_none")]
        from: Option<PlanPhase>,
        to: PlanPhase,
        #[serde(skip_serializing_if = "Option::is_none")]
        message: Option<String>,
    },
    /// The plan's message changed within a step.
    Message {
        phase: PlanPhase,
        message: String,
    },
    /// The plan has a deadline (a forceful disruption): the node goes away then regardless.
    Deadline {
        at: String,
    },
    BackupCreated {
        name: String,
        namespace: String,
        attempt: u32,
        reused: bool,
        pvcs: Vec<String>,
    },
    BackupPhase {
        name: String,
        phase: String,
    },
    /// Velero's `status.progress` of a Backup.
    BackupItems {
        name: String,
        done: u64,
        total: u64,
    },
    /// Bytes moved by the Backup's PodVolumeBackups (file-system backups), summed.
    BackupBytes {
        name: String,
        done: u64,
        total: u64,
    },
    BackupVerified {
        name: String,
        objects: usize,
        bytes: u64,
    },
    VerificationFailed {
        name: String,
        error: String,
    },
    NodePhase {
        node: String,
        phase: NodePhase,
    },
    Evictions {
        node: String,
        evicted: u32,
        total: u32,
    },
    /// Pods of a node that cannot be evicted right now, and why (PDB, missing backup, ...).
    Blocked {
        node: String,
        pods: u32,
        why: String,
    },
    Unblocked {
        node: String,
    },
    ReplacementLaunched {
        node: String,
        instance: String,
    },
    ReplacementReady {
        node: String,
        new_node: String,
    },
}

impl Update {
    /// The plain-text form (without the elapsed-time prefix).
    pub fn text(&self) -> String {
        match self {
            Self::Phase { from, to, message } => {
                let mut s = match from {
                    Some(f) => format!("step {to} (after {f})"),
                    None => format!("step {to}"),
                };
                if let Some(m) = message {
                    s.push_str(": ");
                    s.push_str(m);
                }
                s
            }
            Self::Message { phase, message } => format!("{phase}: {message}"),
            Self::Deadline { at } => format!("deadline {at}: the node goes away then regardless"),
            Self::BackupCreated {
                name,
                namespace,
                attempt,
                reused,
                pvcs,
            } => {
                let what = if *reused {
                    format!("reusing verified backup {name}")
                } else {
                    format!("backup {name} (attempt {attempt})")
                };
                format!("{what}: namespace {namespace}, PVCs {}", list(pvcs))
            }
            Self::BackupPhase { name, phase } => format!("backup {name}: Velero phase {phase}"),
            Self::BackupItems { name, done, total } => {
                format!("backup {name}: {done}/{total} items backed up")
            }
            Self::BackupBytes { name, done, total } => format!(
                "backup {name}: {} of {} of volume data uploaded",
                human_bytes(*done),
                human_bytes(*total)
            ),
            Self::BackupVerified {
                name,
                objects,
                bytes,
            } => format!(
                "backup {name}: verified in the bucket ({objects} objects, {})",
                human_bytes(*bytes)
            ),
            Self::VerificationFailed { name, error } => {
                format!("backup {name}: verification failed: {error}")
            }
            Self::NodePhase { node, phase } => format!("node {node}: {phase:?}"),
            Self::Evictions {
                node,
                evicted,
                total,
            } => format!("node {node}: {evicted}/{total} pods evicted"),
            Self::Blocked { node, pods, why } => {
                format!("node {node}: {pods} pod(s) blocked: {why}")
            }
            Self::Unblocked { node } => format!("node {node}: no longer blocked"),
            Self::ReplacementLaunched { node, instance } => {
                format!("replacement for {node}: launched instance {instance}")
            }
            Self::ReplacementReady { node, new_node } => {
                format!("replacement for {node}: node {new_node} is Ready")
            }
        }
    }
}

fn list(items: &[String]) -> String {
    if items.is_empty() {
        "(none)".into()
    } else {
        items.join(", ")
    }
}

/// Where a Velero Backup phase sits in its lifecycle (Velero 1.18 `BackupPhase`): the plan's status can
/// carry a phase older than the one the Backup watch already told, and a stale phase is not news.
fn backup_phase_rank(phase: &str) -> u8 {
    match phase {
        "New" => 0,
        "Queued" => 1,
        "ReadyToStart" => 2,
        "InProgress" => 3,
        "WaitingForPluginOperations" | "WaitingForPluginOperationsPartiallyFailed" => 4,
        "Finalizing" | "FinalizingPartiallyFailed" => 5,
        "Completed" | "PartiallyFailed" | "Failed" | "FailedValidation" => 6,
        _ => 7,
    }
}

#[derive(Debug, Default, Clone)]
struct BackupSeen {
    /// Told as created (from the plan's status, which names its namespace and PVCs).
    created: bool,
    /// The latest phase told, by [`backup_phase_rank`].
    phase: Option<String>,
    items: Option<(u64, u64)>,
    bytes: Option<(u64, u64)>,
    verified: bool,
    verification_error: Option<String>,
}

impl BackupSeen {
    /// Records `phase` if it is later in the lifecycle than the last one told.
    fn newer_phase(&mut self, phase: &str) -> bool {
        let newer = self
            .phase
            .as_deref()
            .is_none_or(|old| old != phase && backup_phase_rank(phase) >= backup_phase_rank(old));
        if newer {
            self.phase = Some(phase.to_string());
        }
        newer
    }
}

#[derive(Debug, Default, Clone)]
struct NodeSeen {
    phase: Option<NodePhase>,
    evicted: Option<u32>,
    blocked: Option<String>,
}

/// Remembers what was told about one plan.
#[derive(Debug, Default)]
pub struct Tracker {
    phase: Option<PlanPhase>,
    message: Option<String>,
    deadline_told: bool,
    backups: BTreeMap<String, BackupSeen>,
    nodes: BTreeMap<String, NodeSeen>,
    launched: BTreeSet<String>,
    ready: BTreeSet<String>,
    /// PodVolumeBackup name → (backup, bytes done, bytes total).
    volumes: BTreeMap<String, (String, u64, u64)>,
}

impl Tracker {
    pub fn phase(&self) -> Option<PlanPhase> {
        self.phase
    }

    /// Backups known so far (for matching PodVolumeBackups to them).
    pub fn knows_backup(&self, name: &str) -> bool {
        self.backups.get(name).is_some_and(|s| s.created)
    }

    /// The plan's deadline, told once.
    pub fn deadline(&mut self, at: Option<String>) -> Vec<Update> {
        match at {
            Some(at) if !self.deadline_told => {
                self.deadline_told = true;
                vec![Update::Deadline { at }]
            }
            _ => Vec::new(),
        }
    }

    /// What changed in the plan's status. The phase line comes last, so that what the old step finished
    /// (a verified backup, the last eviction) is told before the step that follows it.
    pub fn plan(&mut self, status: &DisruptionPlanStatus) -> Vec<Update> {
        let mut out = Vec::new();
        for b in &status.backups {
            let seen = self.backups.entry(b.name.clone()).or_default();
            if !seen.created {
                seen.created = true;
                out.push(Update::BackupCreated {
                    name: b.name.clone(),
                    namespace: b.namespace.clone(),
                    attempt: b.attempt,
                    reused: b.reused,
                    pvcs: b.pvcs.clone(),
                });
            }
            if let Some(p) = &b.phase
                && seen.newer_phase(p)
            {
                out.push(Update::BackupPhase {
                    name: b.name.clone(),
                    phase: p.clone(),
                });
            }
            if b.verified && !seen.verified {
                seen.verified = true;
                out.push(Update::BackupVerified {
                    name: b.name.clone(),
                    objects: b.verified_objects.len(),
                    bytes: b.verified_objects.iter().map(|o| o.size).sum(),
                });
            }
            if let Some(e) = &b.verification_error
                && seen.verification_error.as_ref() != Some(e)
            {
                seen.verification_error = Some(e.clone());
                out.push(Update::VerificationFailed {
                    name: b.name.clone(),
                    error: e.clone(),
                });
            }
        }
        for n in &status.nodes {
            let seen = self.nodes.entry(n.name.clone()).or_default();
            // "0/N evicted" before anything was evicted says nothing; the step line says draining began.
            if n.pods_total > 0 && seen.evicted.unwrap_or(0) != n.pods_evicted {
                seen.evicted = Some(n.pods_evicted);
                out.push(Update::Evictions {
                    node: n.name.clone(),
                    evicted: n.pods_evicted,
                    total: n.pods_total,
                });
            }
            if seen.blocked != n.blocked_by {
                match &n.blocked_by {
                    Some(why) => out.push(Update::Blocked {
                        node: n.name.clone(),
                        pods: n.pods_blocked,
                        why: why.clone(),
                    }),
                    None => out.push(Update::Unblocked {
                        node: n.name.clone(),
                    }),
                }
                seen.blocked = n.blocked_by.clone();
            }
            if seen.phase != Some(n.phase) {
                // The first sight of a node in its initial phase says nothing new.
                if seen.phase.is_some() || n.phase != NodePhase::Pending {
                    out.push(Update::NodePhase {
                        node: n.name.clone(),
                        phase: n.phase,
                    });
                }
                seen.phase = Some(n.phase);
            }
            if let Some(r) = &n.replacement {
                for id in &r.instance_ids {
                    if self.launched.insert(id.clone()) {
                        out.push(Update::ReplacementLaunched {
                            node: n.name.clone(),
                            instance: id.clone(),
                        });
                    }
                }
                if r.ready
                    && let Some(new_node) = &r.node_name
                    && self.ready.insert(new_node.clone())
                {
                    out.push(Update::ReplacementReady {
                        node: n.name.clone(),
                        new_node: new_node.clone(),
                    });
                }
            }
        }
        if self.phase != Some(status.phase) {
            // A message carried over from the previous step was already told with it.
            let message = status
                .message
                .clone()
                .filter(|m| Some(m) != self.message.as_ref());
            out.push(Update::Phase {
                from: self.phase,
                to: status.phase,
                message,
            });
            self.phase = Some(status.phase);
        } else if status.message != self.message
            && let Some(m) = &status.message
        {
            out.push(Update::Message {
                phase: status.phase,
                message: m.clone(),
            });
        }
        self.message = status.message.clone();
        out
    }

    /// What changed in a Velero Backup of the plan (watched directly: Velero's phase and item counts
    /// arrive there before the controller copies the phase into the plan).
    pub fn backup(
        &mut self,
        name: &str,
        phase: Option<&str>,
        progress: Option<BackupItemsProgress>,
    ) -> Vec<Update> {
        let mut out = Vec::new();
        // A Backup the plan has not listed yet waits: its creation line (namespace, PVCs) comes first.
        let Some(seen) = self.backups.get_mut(name).filter(|s| s.created) else {
            return out;
        };
        if let Some(p) = phase
            && seen.newer_phase(p)
        {
            out.push(Update::BackupPhase {
                name: name.into(),
                phase: p.into(),
            });
        }
        if let Some(pr) = progress
            && pr.total_items > 0
            && seen.items != Some((pr.items_backed_up, pr.total_items))
        {
            seen.items = Some((pr.items_backed_up, pr.total_items));
            out.push(Update::BackupItems {
                name: name.into(),
                done: pr.items_backed_up,
                total: pr.total_items,
            });
        }
        out
    }

    /// A PodVolumeBackup of `backup` reported `done` of `total` bytes: the backup's bytes, summed.
    pub fn volume(&mut self, pvb: &str, backup: &str, done: u64, total: u64) -> Vec<Update> {
        self.volumes
            .insert(pvb.to_string(), (backup.to_string(), done, total));
        let (done, total) = self
            .volumes
            .values()
            .filter(|(b, _, _)| b == backup)
            .fold((0, 0), |(d, t), (_, vd, vt)| (d + vd, t + vt));
        let Some(seen) = self.backups.get_mut(backup).filter(|s| s.created) else {
            return Vec::new();
        };
        if total == 0 || seen.bytes == Some((done, total)) {
            return Vec::new();
        }
        seen.bytes = Some((done, total));
        vec![Update::BackupBytes {
            name: backup.into(),
            done,
            total,
        }]
    }
}

/// Whether a progress update deserves its own line in plain output: the first, each further tenth, and
/// the last (a large backup reports every few seconds; CI logs want a handful of lines, not hundreds).
pub fn progress_line_due(last_told: Option<(u64, u64)>, done: u64, total: u64) -> bool {
    let decile = |d: u64, t: u64| d.saturating_mul(10) / t.max(1);
    match last_told {
        None => true,
        Some(_) if done >= total => true,
        // Volumes being discovered (the total grows while nothing moved yet) are not progress.
        Some((d, _)) if done == 0 && d == 0 => false,
        Some((d, t)) => t != total || decile(done, total) > decile(d, t),
    }
}

/// `1.2 KiB`, `3.0 MiB`, `512 B`.
pub fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    if n < 1024 {
        return format!("{n} B");
    }
    let mut value = n as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.1} {}", UNITS[unit])
}

#[cfg(test)]
mod tests {
    use super::*;
    use snapdrain::api::status::{BackupRecord, NodeProgress, ReplacementProgress, VerifiedObject};

    fn status(phase: PlanPhase) -> DisruptionPlanStatus {
        DisruptionPlanStatus {
            phase,
            ..Default::default()
        }
    }

    #[test]
    fn a_plan_from_creation_to_completion_is_told_once_per_change() {
        let mut t = Tracker::default();
        let mut s = status(PlanPhase::Pending);
        assert_eq!(
            t.plan(&s),
            vec![Update::Phase {
                from: None,
                to: PlanPhase::Pending,
                message: None
            }]
        );
        assert!(t.plan(&s).is_empty(), "nothing changed, nothing told");

        s.phase = PlanPhase::BackingUp;
        s.backups = vec![BackupRecord {
            name: "b1".into(),
            namespace: "shop".into(),
            attempt: 1,
            pvcs: vec!["data-pg-0".into()],
            ..Default::default()
        }];
        let lines: Vec<String> = t.plan(&s).iter().map(Update::text).collect();
        assert_eq!(
            lines,
            vec![
                "backup b1 (attempt 1): namespace shop, PVCs data-pg-0",
                "step BackingUp (after Pending)",
            ]
        );

        // Velero's own phase and progress arrive by the Backup watch first ...
        let from_velero = t.backup(
            "b1",
            Some("InProgress"),
            Some(BackupItemsProgress {
                total_items: 8,
                items_backed_up: 0,
            }),
        );
        assert_eq!(from_velero.len(), 2, "{from_velero:?}");
        // ... so the same phase, or an older one, in the plan's status later is not told again.
        s.backups[0].phase = Some("New".into());
        assert!(t.plan(&s).is_empty());
        s.backups[0].phase = Some("InProgress".into());
        assert!(t.plan(&s).is_empty());

        s.phase = PlanPhase::Verifying;
        s.backups[0].phase = Some("Completed".into());
        s.backups[0].verified = true;
        s.backups[0].verified_objects = vec![
            VerifiedObject {
                key: "a".into(),
                size: 1024,
            },
            VerifiedObject {
                key: "b".into(),
                size: 1024,
            },
        ];
        let lines: Vec<String> = t.plan(&s).iter().map(Update::text).collect();
        assert_eq!(
            lines,
            vec![
                "backup b1: Velero phase Completed",
                "backup b1: verified in the bucket (2 objects, 2.0 KiB)",
                "step Verifying (after BackingUp)",
            ]
        );

        s.phase = PlanPhase::Draining;
        s.message = Some("eviction blocked: shop/pg-0: PDB".into());
        s.nodes = vec![NodeProgress {
            name: "n1".into(),
            phase: NodePhase::Draining,
            pods_total: 4,
            pods_evicted: 1,
            pods_blocked: 1,
            blocked_by: Some("shop/pg-0: PDB".into()),
            ..Default::default()
        }];
        let u = t.plan(&s);
        assert_eq!(
            u,
            vec![
                Update::Evictions {
                    node: "n1".into(),
                    evicted: 1,
                    total: 4
                },
                Update::Blocked {
                    node: "n1".into(),
                    pods: 1,
                    why: "shop/pg-0: PDB".into()
                },
                Update::NodePhase {
                    node: "n1".into(),
                    phase: NodePhase::Draining
                },
                Update::Phase {
                    from: Some(PlanPhase::Verifying),
                    to: PlanPhase::Draining,
                    message: Some("eviction blocked: shop/pg-0: PDB".into())
                },
            ]
        );

        s.nodes[0].pods_evicted = 4;
        s.nodes[0].blocked_by = None;
        s.nodes[0].replacement = Some(ReplacementProgress {
            instance_ids: vec!["i-1".into()],
            node_name: Some("n2".into()),
            ready: true,
            ..Default::default()
        });
        s.message = Some("waiting for evicted pods to terminate".into());
        let lines: Vec<String> = t.plan(&s).iter().map(Update::text).collect();
        assert_eq!(
            lines,
            vec![
                "node n1: 4/4 pods evicted",
                "node n1: no longer blocked",
                "replacement for n1: launched instance i-1",
                "replacement for n1: node n2 is Ready",
                "Draining: waiting for evicted pods to terminate",
            ]
        );
        s.phase = PlanPhase::Completed;
        s.message = Some("completed: n1 handled".into());
        assert_eq!(
            t.plan(&s).last().map(Update::text).as_deref(),
            Some("step Completed (after Draining): completed: n1 handled")
        );
    }

    #[test]
    fn volume_bytes_are_summed_per_backup() {
        let mut t = Tracker::default();
        assert!(
            t.volume("pvb-a", "b1", 10, 100).is_empty(),
            "a backup the plan has not listed waits"
        );
        t.plan(&DisruptionPlanStatus {
            backups: vec![BackupRecord {
                name: "b1".into(),
                ..Default::default()
            }],
            ..Default::default()
        });
        assert!(
            t.volume("pvb-a", "b1", 0, 0).is_empty(),
            "no size known yet"
        );
        assert_eq!(
            t.volume("pvb-a", "b1", 10, 100),
            vec![Update::BackupBytes {
                name: "b1".into(),
                done: 10,
                total: 100
            }]
        );
        assert_eq!(
            t.volume("pvb-b", "b1", 0, 50),
            vec![Update::BackupBytes {
                name: "b1".into(),
                done: 10,
                total: 150
            }]
        );
        assert!(t.volume("pvb-b", "b1", 0, 50).is_empty());
        assert!(t.knows_backup("b1"));
    }

    #[test]
    fn json_lines_carry_the_event_name_and_camel_case_fields() {
        let v = serde_json::to_value(Update::ReplacementReady {
            node: "n1".into(),
            new_node: "n2".into(),
        })
        .expect("serializes");
        assert_eq!(
            v,
            serde_json::json!({"event": "replacementReady", "node": "n1", "newNode": "n2"})
        );
        let v = serde_json::to_value(Update::Phase {
            from: None,
            to: PlanPhase::Failed,
            message: Some("x".into()),
        })
        .expect("serializes");
        assert_eq!(
            v,
            serde_json::json!({"event": "phase", "to": "Failed", "message": "x"})
        );
    }

    #[test]
    fn deadline_is_told_once() {
        let mut t = Tracker::default();
        assert_eq!(t.deadline(Some("2030-01-01T00:00:00Z".into())).len(), 1);
        assert!(t.deadline(Some("2030-01-01T00:00:00Z".into())).is_empty());
        assert!(Tracker::default().deadline(None).is_empty());
    }

    #[test]
    fn progress_lines_are_thinned_to_tenths() {
        assert!(progress_line_due(None, 0, 100));
        assert!(!progress_line_due(Some((0, 100)), 5, 100));
        assert!(progress_line_due(Some((5, 100)), 10, 100));
        assert!(!progress_line_due(Some((10, 100)), 19, 100));
        assert!(progress_line_due(Some((19, 100)), 100, 100));
        assert!(
            progress_line_due(Some((50, 100)), 50, 120),
            "the total changed"
        );
    }

    #[test]
    fn bytes_read_well() {
        assert_eq!(human_bytes(512), "512 B");
        assert_eq!(human_bytes(1536), "1.5 KiB");
        assert_eq!(human_bytes(3 * 1024 * 1024), "3.0 MiB");
    }
}
