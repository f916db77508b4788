//! What a plan tells people: one catalogue of every plan Event reason, with its type, action and the
//! metric it moves, and the [`Report`] that publishes them. Only the driver publishes, and only after the
//! status write that carries the news has landed (a refused write announces nothing; the next pass
//! recomputes the news from the written status and announces it once its own write lands).

use std::time::Duration;

use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, EventType, Recorder};
use tokio::sync::mpsc;

use crate::api::status::PlanPhase;
use crate::telemetry::metrics::ReasonLabel;
use crate::telemetry::{Metrics, Notification, Notifier};

/// Something a person hears about: what happened (the catalogue entry) and the text.
#[derive(Clone, Debug, PartialEq)]
pub struct Note {
    pub what: What,
    pub text: String,
}

/// The catalogue. Each entry is an Event reason (unless said otherwise), with what its metric needs.
#[derive(Clone, Debug, PartialEq)]
pub enum What {
    // Pending
    PlanWarning,
    ProtectedPodsLeft {
        pods: u64,
    },
    // BackingUp
    BackupCreated,
    BackupRetry,
    /// No Event: the backup's duration, for `snapdrain_backup_duration_seconds`.
    BackupCompleted {
        took: Duration,
    },
    ReusedBackupUnusable,
    BackupDeleted,
    BackupDeleteRequested,
    /// A plan with a deadline takes EC2 snapshots of its EBS volumes instead of waiting for Velero.
    EmergencySnapshots,
    /// Pods released at an accepted EC2 snapshot, not at a verified bucket copy.
    ReleasedAtSnapshot {
        pods: u64,
    },
    EmergencySnapshotsCompleted,
    /// EC2 makes the emergency set wait for its per-volume window (15 s after a volume's last snapshot).
    EmergencySnapshotsDelayed,
    // Verifying
    BackupVerified,
    BackupVerificationFailed {
        reason: &'static str,
    },
    BucketUnreadable,
    BucketUnreachable,
    // Draining (Execute)
    EvictionBlocked,
    // Release plans and rollback
    HoldsReleased {
        pods: u64,
    },
    /// No Event: holds released for pods new on a released node (counted only).
    NewcomersReleased {
        pods: u64,
    },
    /// An Event only when `event` (the rollback's); the count always.
    HoldsRestored {
        pods: u64,
        event: bool,
    },
    NewProtectedPods,
    ReleaseWindowPassed,
    Uncordoned,
    RollbackFailed,
    // Terminating
    NodeRecreated,
    NodeClaimDeleted,
    InstanceKept,
    InstanceTerminated,
    // Replacing
    ReplacementLaunched,
    /// EC2 had no capacity for the launch: when and with which token it is tried again.
    ReplacementWaitingForCapacity,
    ReplacementJoinTimeout,
    ReplacementReady,
    // The driver's own
    InvalidSpec,
    DeadlineMissed,
    PhaseChanged {
        from: PlanPhase,
        to: PlanPhase,
        seconds: f64,
    },
}

/// How a catalogue entry appears as a Kubernetes Event: type, reason and action.
pub struct Rendered {
    pub type_: EventType,
    pub reason: String,
    pub action: &'static str,
}

impl What {
    /// The Event this entry is published as, if any.
    pub fn event(&self) -> Option<Rendered> {
        use EventType::{Normal, Warning};
        let (type_, reason, action) = match self {
            Self::PlanWarning => (Warning, "PlanWarning", "Plan"),
            Self::ProtectedPodsLeft { .. } => (Warning, "ProtectedPodsLeft", "Plan"),
            Self::BackupCreated => (Normal, "BackupCreated", "Backup"),
            Self::BackupRetry => (Warning, "BackupRetry", "Backup"),
            Self::BackupCompleted { .. } | Self::NewcomersReleased { .. } => return None,
            Self::HoldsRestored { event: false, .. } => return None,
            Self::ReusedBackupUnusable => (Warning, "ReusedBackupUnusable", "Backup"),
            Self::EmergencySnapshots => (Warning, "EmergencySnapshots", "Backup"),
            Self::ReleasedAtSnapshot { .. } => (Warning, "ReleasedAtSnapshot", "Release"),
            Self::EmergencySnapshotsCompleted => (Normal, "EmergencySnapshotsCompleted", "Backup"),
            Self::EmergencySnapshotsDelayed => (Warning, "EmergencySnapshotsDelayed", "Backup"),
            Self::BackupDeleted => (Normal, "BackupDeleted", "Backup"),
            Self::BackupDeleteRequested => (Normal, "BackupDeleteRequested", "Backup"),
            Self::BackupVerified => (Normal, "BackupVerified", "Verify"),
            Self::BackupVerificationFailed { .. } => {
                (Warning, "BackupVerificationFailed", "Verify")
            }
            Self::BucketUnreadable => (Warning, "BucketUnreadable", "Verify"),
            Self::BucketUnreachable => (Warning, "BucketUnreachable", "Verify"),
            Self::EvictionBlocked => (Warning, "EvictionBlocked", "Drain"),
            Self::HoldsReleased { .. } => (Normal, "HoldsReleased", "Release"),
            Self::HoldsRestored { event: true, .. } => (Normal, "HoldsRestored", "Rollback"),
            Self::NewProtectedPods => (Normal, "NewProtectedPods", "Release"),
            Self::ReleaseWindowPassed => (Warning, "ReleaseWindowPassed", "Release"),
            Self::Uncordoned => (Normal, "Uncordoned", "Rollback"),
            Self::RollbackFailed => (Warning, "RollbackFailed", "Rollback"),
            Self::NodeRecreated => (Normal, "NodeRecreated", "Terminate"),
            Self::NodeClaimDeleted => (Normal, "NodeClaimDeleted", "Terminate"),
            Self::InstanceKept => (Normal, "InstanceKept", "Terminate"),
            Self::InstanceTerminated => (Normal, "InstanceTerminated", "Terminate"),
            Self::ReplacementLaunched => (Normal, "ReplacementLaunched", "Replace"),
            Self::ReplacementWaitingForCapacity => {
                (Warning, "ReplacementWaitingForCapacity", "Replace")
            }
            Self::ReplacementJoinTimeout => (Warning, "ReplacementJoinTimeout", "Replace"),
            Self::ReplacementReady => (Normal, "ReplacementReady", "Replace"),
            Self::InvalidSpec => (Warning, "InvalidSpec", "Validate"),
            Self::DeadlineMissed => (Warning, "DeadlineMissed", "Deadline"),
            Self::PhaseChanged { to, .. } => {
                return Some(match to {
                    PlanPhase::Failed | PlanPhase::Aborted => Rendered {
                        type_: Warning,
                        reason: format!("Plan{to}"),
                        action: "Finish",
                    },
                    PlanPhase::Completed => Rendered {
                        type_: Normal,
                        reason: "PlanCompleted".into(),
                        action: "Finish",
                    },
                    _ => Rendered {
                        type_: Normal,
                        reason: to.as_str().into(),
                        action: "Progress",
                    },
                });
            }
        };
        Some(Rendered {
            type_,
            reason: reason.into(),
            action,
        })
    }

    /// Moves the plan-level metric this entry counts, if any.
    pub fn count(&self, metrics: &Metrics) {
        let reason = |r: String| ReasonLabel { reason: r };
        match self {
            Self::ProtectedPodsLeft { pods } => {
                metrics.pods_left_unbacked.inc_by(*pods);
            }
            Self::BackupCompleted { took } => metrics.backup_duration.observe(took.as_secs_f64()),
            Self::BackupVerificationFailed { reason: r } => {
                metrics
                    .verification_failures
                    .get_or_create(&reason((*r).into()))
                    .inc();
            }
            Self::BucketUnreachable => {
                metrics
                    .verification_failures
                    .get_or_create(&reason("unreachable".into()))
                    .inc();
            }
            Self::HoldsReleased { pods }
            | Self::NewcomersReleased { pods }
            | Self::ReleasedAtSnapshot { pods } => {
                for _ in 0..*pods {
                    metrics.hold_change("released");
                }
            }
            Self::HoldsRestored { pods, .. } => {
                for _ in 0..*pods {
                    metrics.hold_change("restored");
                }
            }
            Self::DeadlineMissed => {
                metrics.deadlines_missed.inc();
            }
            Self::PhaseChanged { from, to, seconds } => {
                metrics.observe_step(from.as_str(), *seconds);
                let counter = match to {
                    PlanPhase::Failed => &metrics.plans_failed,
                    // Stopped on purpose: counted apart, so the failure rate sees only plans gone wrong.
                    PlanPhase::Aborted => &metrics.plans_aborted,
                    _ => return,
                };
                counter.get_or_create(&reason(format!("from_{from}"))).inc();
            }
            _ => {}
        }
    }
}

/// The plan an announcement is about, as the written status shows it.
pub struct About<'a> {
    pub plan: &'a str,
    pub reference: ObjectReference,
    pub phase: PlanPhase,
    pub nodes: Vec<String>,
}

/// Publishes notes: metrics at once, Events and notifications in order by one task, so a plan pass never
/// waits on the Events API.
#[derive(Clone)]
pub struct Report {
    metrics: Metrics,
    notifier: Notifier,
    events: mpsc::UnboundedSender<(Event, ObjectReference)>,
}

impl Report {
    /// Starts the publishing task (call inside a tokio runtime).
    pub fn start(recorder: Recorder, notifier: Notifier, metrics: Metrics) -> Self {
        let (events, mut rx) = mpsc::unbounded_channel::<(Event, ObjectReference)>();
        tokio::spawn(async move {
            while let Some((event, reference)) = rx.recv().await {
                // Events are best effort: losing one must not stop a plan.
                if let Err(e) = recorder.publish(&event, &reference).await {
                    tracing::warn!(reason = %event.reason, error = %e, "cannot publish event");
                }
            }
        });
        Self {
            metrics,
            notifier,
            events,
        }
    }

    /// Announces `notes` about a plan whose status carrying them is written.
    pub fn publish(&self, about: &About<'_>, notes: Vec<Note>) {
        for note in notes {
            note.what.count(&self.metrics);
            let Some(r) = note.what.event() else {
                continue;
            };
            let type_name = match r.type_ {
                EventType::Normal => "Normal",
                EventType::Warning => "Warning",
            };
            self.notifier.send(Notification::new(
                about.plan,
                type_name,
                &r.reason,
                &note.text,
                about.phase.as_str(),
                &about.nodes,
            ));
            let event = Event {
                type_: r.type_,
                reason: r.reason,
                note: Some(note.text),
                action: r.action.into(),
                secondary: None,
            };
            // The receiver lives as long as the process's runtime.
            let _ = self.events.send((event, about.reference.clone()));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every Event reason a plan can carry, as the README lists them.
    fn all() -> Vec<What> {
        let d = Duration::from_secs(1);
        vec![
            What::PlanWarning,
            What::ProtectedPodsLeft { pods: 1 },
            What::BackupCreated,
            What::BackupRetry,
            What::BackupCompleted { took: d },
            What::ReusedBackupUnusable,
            What::BackupDeleted,
            What::BackupDeleteRequested,
            What::EmergencySnapshots,
            What::ReleasedAtSnapshot { pods: 1 },
            What::EmergencySnapshotsCompleted,
            What::EmergencySnapshotsDelayed,
            What::BackupVerified,
            What::BackupVerificationFailed { reason: "missing" },
            What::BucketUnreadable,
            What::BucketUnreachable,
            What::EvictionBlocked,
            What::HoldsReleased { pods: 1 },
            What::NewcomersReleased { pods: 1 },
            What::HoldsRestored {
                pods: 1,
                event: true,
            },
            What::HoldsRestored {
                pods: 1,
                event: false,
            },
            What::NewProtectedPods,
            What::ReleaseWindowPassed,
            What::Uncordoned,
            What::RollbackFailed,
            What::NodeRecreated,
            What::NodeClaimDeleted,
            What::InstanceKept,
            What::InstanceTerminated,
            What::ReplacementLaunched,
            What::ReplacementWaitingForCapacity,
            What::ReplacementJoinTimeout,
            What::ReplacementReady,
            What::InvalidSpec,
            What::DeadlineMissed,
        ]
    }

    #[test]
    fn the_readme_lists_every_event_reason_a_plan_publishes() {
        let readme = include_str!("../../../../README.md");
        let mut reasons: Vec<String> = all()
            .iter()
            .filter_map(|w| w.event().map(|r| r.reason))
            .collect();
        // Every phase a plan can move to (none moves back to Pending).
        for to in PlanPhase::ALL
            .into_iter()
            .filter(|p| *p != PlanPhase::Pending)
        {
            let w = What::PhaseChanged {
                from: PlanPhase::Pending,
                to,
                seconds: 0.0,
            };
            reasons.extend(w.event().map(|r| r.reason));
        }
        let missing: Vec<&String> = reasons
            .iter()
            .filter(|r| !readme.contains(&format!("`{r}`")))
            .collect();
        assert!(missing.is_empty(), "README does not list: {missing:?}");
    }

    #[test]
    fn counts_only_and_events_only_entries_are_told_apart() {
        assert!(
            What::BackupCompleted {
                took: Duration::ZERO
            }
            .event()
            .is_none()
        );
        assert!(
            What::HoldsRestored {
                pods: 2,
                event: false
            }
            .event()
            .is_none()
        );
        let aborted = What::PhaseChanged {
            from: PlanPhase::Draining,
            to: PlanPhase::Aborted,
            seconds: 1.0,
        }
        .event()
        .map(|r| (r.reason, r.action));
        assert_eq!(aborted, Some(("PlanAborted".to_string(), "Finish")));
        let metrics = Metrics::new();
        What::PhaseChanged {
            from: PlanPhase::Draining,
            to: PlanPhase::Failed,
            seconds: 1.0,
        }
        .count(&metrics);
        What::HoldsRestored {
            pods: 3,
            event: false,
        }
        .count(&metrics);
        let text = metrics.render();
        assert!(
            text.contains("snapdrain_plans_failed_total{reason=\"from_Draining\"} 1"),
            "{text}"
        );
        assert!(text.contains("action=\"restored\"} 3"), "{text}");
    }
}
