//! Prometheus metrics, all prefixed `snapdrain_`, served on `/metrics` by every replica.

use std::sync::Arc;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PhaseLabel {
    pub phase: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StepLabel {
    pub step: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CodeLabel {
    pub code: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DecisionLabel {
    pub decision: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    pub reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabel {
    /// sent | failed | dropped
    pub result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CertLabel {
    /// serving | ca
    pub certificate: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct HoldLabel {
    /// placed | released | restored | removed | let-go (hold changes); held | released (pods now).
    pub action: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SignalLabel {
    pub source: String,
    /// created | joined | waiting | settled | error
    pub outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabel {
    /// Pod, PersistentVolumeClaim, StatefulSet, PodDisruptionBudget, VolumeAttachment, Node, ...
    pub kind: String,
}

fn step_histogram() -> Histogram {
    // 10 ms to about 3 hours: steps range from instant evictions to long backups.
    Histogram::new(exponential_buckets(0.01, 2.5, 14))
}

/// Every metric snapdrain exports. Cheap to clone (Arcs inside).
#[derive(Clone)]
pub struct Metrics {
    registry: Arc<Registry>,
    /// Plans currently in each phase.
    pub plans: Family<PhaseLabel, Gauge>,
    /// Time spent in each plan step.
    pub step_duration: Family<StepLabel, Histogram, fn() -> Histogram>,
    /// From Backup creation to Completed.
    pub backup_duration: Histogram,
    /// Verification failures by reason (missing object, uid mismatch, volume failed, ...).
    pub verification_failures: Family<ReasonLabel, Counter>,
    /// Eviction requests by HTTP response code.
    pub evictions: Family<CodeLabel, Counter>,
    /// Reconcile failures by error kind.
    pub reconcile_errors: Family<ReasonLabel, Counter>,
    /// Plans that ended Failed, by reason.
    pub plans_failed: Family<ReasonLabel, Counter>,
    /// Plans that ended Aborted (a person or a policy stopped them: not a failure), by the phase left.
    pub plans_aborted: Family<ReasonLabel, Counter>,
    /// Reconciles running now: 0 on a standby or a deposed leader.
    pub reconciles_in_flight: Gauge,
    /// Hold annotation changes snapdrain made, by action.
    pub hold_changes: Family<HoldLabel, Counter>,
    /// Protected pods now held, and released by a running plan.
    pub pods_held: Family<HoldLabel, Gauge>,
    /// Disruption signals seen, by source and what became of them.
    pub signals: Family<SignalLabel, Counter>,
    /// Plans that failed because `spec.deadline` passed before the backup was verified.
    pub deadlines_missed: Counter,
    /// Protected pods that left their node (deleted by the disruptor) between a forceful signal and the
    /// plan's first look, so no backup of this plan covers them.
    pub pods_left_unbacked: Counter,
    /// Notifications to the policy's webhook, by result (sent, failed, dropped).
    pub notifications: Family<ResultLabel, Counter>,
    /// 1 while this replica holds the Lease and reconciles, else 0.
    pub leader: Gauge,
    /// notAfter (Unix seconds) of the certificate the gate serves and of the CA it trusts.
    pub webhook_cert_expiry: Family<CertLabel, Gauge>,
    /// Eviction gate answers: allowed, denied (429), error (unreadable request or no decision).
    pub gate_decisions: Family<DecisionLabel, Counter>,
    /// Time to answer one AdmissionReview.
    pub gate_latency: Histogram,
    /// Objects in each shared cache (controller::cache), after trimming.
    pub cache_objects: Family<KindLabel, Gauge>,
    /// Complete lists each cache took in: 1 once synced, one more per relist (a 410 Gone).
    pub cache_lists: Family<KindLabel, Counter>,
    /// Finished plans deleted by the policy's `history` settings.
    pub plans_deleted: Counter,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("snapdrain");
        let plans = Family::<PhaseLabel, Gauge>::default();
        registry.register("plans", "DisruptionPlans by phase", plans.clone());
        let step_duration = Family::<StepLabel, Histogram, fn() -> Histogram>::new_with_constructor(
            step_histogram as fn() -> Histogram,
        );
        registry.register(
            "step_duration_seconds",
            "Time spent in each plan step",
            step_duration.clone(),
        );
        let backup_duration = Histogram::new(exponential_buckets(0.1, 2.0, 16));
        registry.register(
            "backup_duration_seconds",
            "Velero Backup creation to Completed",
            backup_duration.clone(),
        );
        let verification_failures = Family::<ReasonLabel, Counter>::default();
        registry.register(
            "backup_verification_failures",
            "Backups that failed verification in object storage, by reason",
            verification_failures.clone(),
        );
        let evictions = Family::<CodeLabel, Counter>::default();
        registry.register(
            "evictions",
            "Eviction requests by response code",
            evictions.clone(),
        );
        let reconcile_errors = Family::<ReasonLabel, Counter>::default();
        registry.register(
            "reconcile_errors",
            "Reconcile errors by kind",
            reconcile_errors.clone(),
        );
        let plans_failed = Family::<ReasonLabel, Counter>::default();
        registry.register(
            "plans_failed",
            "Plans that ended Failed, by reason",
            plans_failed.clone(),
        );
        let plans_aborted = Family::<ReasonLabel, Counter>::default();
        registry.register(
            "plans_aborted",
            "Plans that ended Aborted (stopped on purpose, not failed), by the phase they left",
            plans_aborted.clone(),
        );
        let reconciles_in_flight = Gauge::default();
        registry.register(
            "reconciles_in_flight",
            "Plan reconciles running now (0 on a standby replica)",
            reconciles_in_flight.clone(),
        );
        let hold_changes = Family::<HoldLabel, Counter>::default();
        registry.register(
            "hold_changes",
            "Hold annotations snapdrain placed, released, restored or removed on pods (let-go: removed from a node being taken that snapdrain will not back up; node-placed, node-removed: on Nodes)",
            hold_changes.clone(),
        );
        let pods_held = Family::<HoldLabel, Gauge>::default();
        registry.register(
            "pods_held",
            "Protected pods held (action=held) or released by a running plan (action=released)",
            pods_held.clone(),
        );
        let signals = Family::<SignalLabel, Counter>::default();
        registry.register(
            "signals",
            "Disruption signals, by source and outcome (created, joined, waiting, settled, error)",
            signals.clone(),
        );
        let deadlines_missed = Counter::default();
        registry.register(
            "plan_deadlines_missed",
            "Plans that failed because spec.deadline passed before their backup was verified",
            deadlines_missed.clone(),
        );
        let pods_left_unbacked = Counter::default();
        registry.register(
            "protected_pods_left_unbacked",
            "Protected pods that left without a backup: deleted by the disruptor before their plan could back them up, or let go on a node being taken that snapdrain will not back up",
            pods_left_unbacked.clone(),
        );
        let notifications = Family::<ResultLabel, Counter>::default();
        registry.register(
            "notifications",
            "Plan Events POSTed to the DisruptionPolicy's notification webhook, by result (sent, failed after retries, dropped when the queue was full)",
            notifications.clone(),
        );
        let leader = Gauge::default();
        registry.register(
            "leader",
            "1 while this replica holds the Lease and reconciles DisruptionPlans, else 0",
            leader.clone(),
        );
        let webhook_cert_expiry = Family::<CertLabel, Gauge>::default();
        registry.register(
            "webhook_certificate_expiry_timestamp_seconds",
            "notAfter (Unix seconds) of the eviction gate's serving certificate and of its CA",
            webhook_cert_expiry.clone(),
        );
        let gate_decisions = Family::<DecisionLabel, Counter>::default();
        registry.register(
            "gate_decisions",
            "Eviction gate answers by decision (allowed, denied, error)",
            gate_decisions.clone(),
        );
        // 0.5 ms to about 4 s: a cached decision is sub-millisecond, a plan creation a few round trips.
        let gate_latency = Histogram::new(exponential_buckets(0.0005, 2.0, 14));
        registry.register(
            "gate_decision_duration_seconds",
            "Time the eviction gate takes to answer an AdmissionReview",
            gate_latency.clone(),
        );
        let cache_objects = Family::<KindLabel, Gauge>::default();
        registry.register(
            "cache_objects",
            "Objects in snapdrain's shared caches, by kind (present once the cache's first list is in)",
            cache_objects.clone(),
        );
        let cache_lists = Family::<KindLabel, Counter>::default();
        registry.register(
            "cache_lists",
            "Complete lists taken in by each shared cache: 1 at sync, one more per relist",
            cache_lists.clone(),
        );
        let plans_deleted = Counter::default();
        registry.register(
            "plans_deleted",
            "Finished DisruptionPlans deleted by the DisruptionPolicy's history settings",
            plans_deleted.clone(),
        );
        Self {
            registry: Arc::new(registry),
            plans_deleted,
            cache_objects,
            cache_lists,
            gate_decisions,
            gate_latency,
            plans,
            step_duration,
            backup_duration,
            verification_failures,
            evictions,
            reconcile_errors,
            plans_failed,
            plans_aborted,
            reconciles_in_flight,
            hold_changes,
            pods_held,
            signals,
            deadlines_missed,
            pods_left_unbacked,
            leader,
            webhook_cert_expiry,
            notifications,
        }
    }

    /// This replica leads (or stopped leading). A replica that stops leading zeroes what only the leader
    /// keeps (plans by phase, held pods), so a standby exports no stale figures.
    pub fn set_leading(&self, leading: bool) {
        self.leader.set(i64::from(leading));
        if !leading {
            self.plans.clear();
            self.pods_held.clear();
        }
    }

    pub fn cache_objects(&self, kind: &str, objects: usize) {
        self.cache_objects
            .get_or_create(&KindLabel { kind: kind.into() })
            .set(i64::try_from(objects).unwrap_or(i64::MAX));
    }

    pub fn cache_listed(&self, kind: &str) {
        self.cache_lists
            .get_or_create(&KindLabel { kind: kind.into() })
            .inc();
    }

    pub fn notification(&self, result: &str) {
        self.notifications
            .get_or_create(&ResultLabel {
                result: result.into(),
            })
            .inc();
    }

    /// The certificates the gate serves now.
    pub fn set_certificate_expiry(&self, serving: jiff::Timestamp, ca: jiff::Timestamp) {
        for (which, at) in [("serving", serving), ("ca", ca)] {
            self.webhook_cert_expiry
                .get_or_create(&CertLabel {
                    certificate: which.into(),
                })
                .set(at.as_second());
        }
    }

    pub fn observe_step(&self, step: &str, seconds: f64) {
        self.step_duration
            .get_or_create(&StepLabel {
                step: step.to_string(),
            })
            .observe(seconds);
    }

    pub fn hold_change(&self, action: &str) {
        self.hold_changes
            .get_or_create(&HoldLabel {
                action: action.to_string(),
            })
            .inc();
    }

    pub fn signal(&self, source: &str, outcome: &str) {
        self.signals
            .get_or_create(&SignalLabel {
                source: source.to_string(),
                outcome: outcome.to_string(),
            })
            .inc();
    }

    pub fn eviction(&self, code: u16) {
        self.evictions
            .get_or_create(&CodeLabel {
                code: code.to_string(),
            })
            .inc();
    }

    pub fn gate_decision(&self, decision: &str) {
        self.gate_decisions
            .get_or_create(&DecisionLabel {
                decision: decision.to_string(),
            })
            .inc();
    }

    /// Text exposition format.
    pub fn render(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_prefixed_metrics() {
        let m = Metrics::new();
        m.eviction(429);
        m.observe_step("backup", 1.5);
        m.plans
            .get_or_create(&PhaseLabel {
                phase: "Completed".into(),
            })
            .set(2);
        let text = m.render();
        assert!(
            text.contains("snapdrain_evictions_total{code=\"429\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("snapdrain_step_duration_seconds_count{step=\"backup\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("snapdrain_plans{phase=\"Completed\"} 2"),
            "{text}"
        );
    }
}
