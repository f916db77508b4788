//! `DisruptionPolicy` (cluster-scoped): the cluster-wide rules for plans snapdrain makes on its own — which
//! pods it protects (and holds), which disruption signals become plans and in which mode, whether Karpenter
//! may consolidate protected nodes, how long released holds wait for the autoscaler, how many signal plans
//! run at once, and the backup/drain/termination settings of those plans.
//!
//! The controller reads the object named [`DEFAULT_POLICY`] and creates it with these defaults when it is
//! absent. Every field has a serde default, so `spec: {}` is the documented default policy.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector};
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::backup_hooks::PolicyBackupHook;
use super::launch::ReplacementPolicy;
use super::plan::{
    BackupSpec, DURATION_MAX_LENGTH, DURATION_PATTERN, DisruptionPlanSpec, DrainSpec,
    TerminationSpec,
};

/// The policy the controller reads (and creates when absent).
pub const DEFAULT_POLICY: &str = "default";

/// Cluster-wide rules for the plans snapdrain makes from disruption signals.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[kube(
    group = "snapdrain.io",
    version = "v1alpha1",
    kind = "DisruptionPolicy",
    doc = "Cluster-wide rules for the disruption plans snapdrain makes from autoscaler signals (snapdrain).",
    plural = "disruptionpolicies",
    shortname = "dpolicy",
    category = "snapdrain",
    status = "DisruptionPolicyStatus"
)]
#[serde(rename_all = "camelCase")]
pub struct DisruptionPolicySpec {
    /// Which pods snapdrain protects: holds them and backs them up before their node goes.
    #[serde(default)]
    pub protection: ProtectionSpec,

    /// Which holds protected pods carry besides Karpenter's `do-not-disrupt`.
    #[serde(default)]
    pub holds: HoldsSpec,

    /// What each disruption signal leads to.
    #[serde(default)]
    pub signals: SignalsSpec,

    /// How long released holds wait for the autoscaler to take the node. After that the holds come back
    /// and the verified backup stays reusable for the next plan. Go duration.
    #[serde(default = "default_release_window")]
    #[schemars(regex(pattern = DURATION_PATTERN), length(max = DURATION_MAX_LENGTH))]
    pub release_window: String,

    /// How many signal plans run at once. Forceful signals (a NodeClaim deletion, Karpenter's disrupted
    /// taint, NTH's spot interruption, ASG lifecycle termination or scheduled maintenance) never wait
    /// for a slot.
    #[serde(default)]
    pub concurrency: ConcurrencySpec,

    /// When graceful signals may start plans (none: any time). Forceful signals never wait.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 50))]
    pub maintenance_windows: Vec<MaintenanceWindow>,

    /// Backup settings of signal plans. `reuseIfNewerThan` defaults to one hour here, so a plan after
    /// an expired release window reuses the backup it verified.
    #[serde(default = "default_signal_backup")]
    pub backup: BackupSpec,

    /// Drain settings of signal plans in Execute mode.
    #[serde(default)]
    pub drain: DrainSpec,

    /// Termination settings of signal plans in Execute mode.
    #[serde(default)]
    pub termination: TerminationSpec,

    /// Where plan Events go besides Kubernetes Events (which are always written).
    #[serde(default)]
    pub notifications: NotificationsSpec,

    /// How long finished plans (every plan, signal or manual) are kept before the controller deletes them.
    #[serde(default)]
    pub history: HistorySpec,

    /// The most nodes one plan may select: its `spec.nodes`, or what its `spec.nodeSelector` matches
    /// when it is decided. A plan over the cap is marked invalid before any node is touched. 0: no cap.
    #[serde(default = "default_max_nodes_per_plan")]
    pub max_nodes_per_plan: u32,

    /// What a plan's replacement may launch (AMI, instance profile, security groups, subnets, launch
    /// template, Bottlerocket settings). The default lets plans name an EC2NodeClass or inherit from
    /// the replaced instance, nothing free-form.
    #[serde(default)]
    pub replacement: ReplacementPolicy,

    /// Which plan settings that let a drain go without a backup, or take pods down without their
    /// owners' consent, plans may use. All refused by default: a plan author may then only drain
    /// behind a verified backup, as kubectl drain without `--force` would.
    #[serde(default)]
    pub plan_settings: PlanSettingsPolicy,

    /// Keep a recent backup of every protected namespace in Velero's repository with a Velero Schedule
    /// per namespace (snapdrain keeps them), so a pre-drain backup moves only what changed since.
    /// Absent: off (snapdrain deletes the Schedules it made).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub warm_backups: Option<super::warm::WarmBackupsSpec>,
    /// Default backup hooks per workload (a file-system freeze, a database checkpoint), shaped as
    /// Velero's exec hooks. A Backup snapdrain creates for a namespace listed here carries the entry
    /// as one of Velero's `spec.hooks.resources[]` (for that namespace only); Velero runs it in the
    /// selected pods, except in pods with hook annotations of their own, whose annotations Velero
    /// runs instead. An admission policy lets snapdrain's Backups carry exactly these hooks.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 50))]
    pub backup_hooks: Vec<PolicyBackupHook>,
}

/// Plan settings the policy must allow (security review C-1). A plan using one that is not allowed is
/// refused (`RefusedByPolicy`) before any node is touched; one set while the plan runs stops it.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct PlanSettingsPolicy {
    /// Allow `spec.backup.policy: skip`: the protected pods are drained (Execute) or released to the
    /// disruptor (Release) with no backup at all.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub allow_backup_skip: bool,
    /// Allow `spec.drain.force: true`: pods no controller owns are evicted (lost for good) and an active
    /// `karpenter.sh/do-not-disrupt` of a tenant is overridden.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub allow_force: bool,
    /// Allow `spec.drain.gracePeriodSeconds: 0`: pods are killed without their shutdown (databases do
    /// not flush).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub allow_zero_grace_period: bool,
    /// Allow `spec.backup.releaseNetworkVolumesAt: Snapshot`: pods on network volumes go at their CSI
    /// snapshot, crash-consistent, before the copy in the bucket is verified.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub allow_release_at_snapshot: bool,
}

fn default_max_nodes_per_plan() -> u32 {
    // Enough for a rack or a node group's rolling batch; a plan wider than this is a cluster-wide
    // event that a person should split or allow on purpose.
    10
}

/// Finished plans are deleted once they are older than `ttlAfterFinished`, except the newest
/// `keepPerNode` of each node that still exists, and plans annotated `snapdrain.io/keep: "true"`. The
/// Velero Backups a plan made are not deleted with it: they keep their own TTL.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct HistorySpec {
    /// How long a plan is kept after it ended (Completed, Failed or Aborted). Go duration. Keep it longer
    /// than `backup.reuseIfNewerThan`: a later plan reuses a backup only a kept plan records.
    #[serde(default = "default_ttl_after_finished")]
    #[schemars(regex(pattern = DURATION_PATTERN), length(max = DURATION_MAX_LENGTH))]
    pub ttl_after_finished: String,
    /// How many of a node's newest finished plans outlive the TTL while the node exists (its last
    /// report stays readable however long ago it ran).
    #[serde(default = "default_keep_per_node")]
    #[schemars(range(max = 100))]
    pub keep_per_node: u32,
}

impl Default for HistorySpec {
    fn default() -> Self {
        Self {
            ttl_after_finished: default_ttl_after_finished(),
            keep_per_node: default_keep_per_node(),
        }
    }
}

fn default_ttl_after_finished() -> String {
    // Three days: a weekend's plans can still be read on Monday.
    "72h".into()
}

fn default_keep_per_node() -> u32 {
    3
}

/// Notifications of plan Events.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct NotificationsSpec {
    /// POST every plan Event (of every plan, signal or manual) as JSON to a URL.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub webhook: Option<WebhookNotification>,
}

/// A webhook receiving `{"kind": "DisruptionPlanEvent", "plan", "type", "reason", "message", "phase",
/// "nodes", "time"}` for each plan Event. Its URL is `urlSecretRef` (a chat or paging webhook's URL is
/// its secret) or `url` (a URL that carries no secret).
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("has(self.url) != has(self.urlSecretRef)")
    .message("notifications.webhook needs exactly one of url and urlSecretRef"))]
pub struct WebhookNotification {
    /// An http or https URL that carries no secret. The policy is readable cluster-wide: a URL whose
    /// path or query is its credential (Slack, Teams, PagerDuty Events) belongs in `urlSecretRef`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 8, max = 2048))]
    pub url: Option<String>,
    /// The URL, read from a key of a Secret in snapdrain's own namespace (the chart's
    /// `notifications.urlSecretNames` lets snapdrain read it by name). It passes the same checks as
    /// `url`. A missing Secret or key sets the policy's `NotificationsReady` condition to False.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url_secret_ref: Option<UrlSecretRef>,
    /// Only Events with these reasons (e.g. PlanFailed, DeadlineMissed, ProtectedPodsLeft); none: all.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    pub reasons: Vec<String>,
    /// Attempts after a failed one (unreachable, 5xx, 408, 429), 1 s apart doubling.
    #[serde(default = "default_notification_retries")]
    #[schemars(range(max = 20))]
    pub retries: u32,
    /// Allow a plain `http://` URL. Off: https only (the Events name nodes, pods and backups).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub allow_insecure_http: bool,
    /// Allow a URL whose host is, or resolves to, a loopback, link-local (e.g. the instance metadata
    /// service), private or unique-local address. Off: such addresses are refused, so the policy
    /// cannot aim snapdrain's requests at in-cluster or cloud-internal endpoints.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub allow_private_addresses: bool,
}

/// A key of a Secret in the controller's own namespace.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct UrlSecretRef {
    /// The Secret's name.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
    /// The key whose value is the URL.
    #[schemars(length(min = 1, max = 253))]
    pub key: String,
}

/// What the controller reports about the policy it works under.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct DisruptionPolicyStatus {
    /// metav1 Conditions: `NotificationsReady` (the notification webhook's URL is known and accepted, or
    /// why not).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

/// Condition types the controller sets on the policy.
pub mod condition {
    /// Whether the notification webhook's URL is known and accepted (reasons [`URL_RESOLVED`],
    /// [`SECRET_NOT_FOUND`], [`SECRET_KEY_NOT_FOUND`], [`SECRET_UNREADABLE`], [`URL_REFUSED`]).
    pub const NOTIFICATIONS_READY: &str = "NotificationsReady";
    pub const URL_RESOLVED: &str = "URLResolved";
    pub const SECRET_NOT_FOUND: &str = "SecretNotFound";
    pub const SECRET_KEY_NOT_FOUND: &str = "SecretKeyNotFound";
    pub const SECRET_UNREADABLE: &str = "SecretUnreadable";
    pub const URL_REFUSED: &str = "URLRefused";
}

fn default_notification_retries() -> u32 {
    5
}

/// A recurring window: opens when `schedule` (five-field cron: minute hour day-of-month month
/// day-of-week) matches in `timeZone`, stays open for `duration`.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct MaintenanceWindow {
    /// e.g. `0 2 * * 6,0` (Saturdays and Sundays at 02:00).
    #[schemars(length(min = 9, max = 100))]
    pub schedule: String,
    /// Go duration, at most 168h.
    #[schemars(regex(pattern = DURATION_PATTERN), length(max = DURATION_MAX_LENGTH))]
    pub duration: String,
    /// IANA time zone name.
    #[serde(default = "default_time_zone")]
    pub time_zone: String,
}

fn default_time_zone() -> String {
    "UTC".into()
}

/// Which pods are protected: StatefulSet pods that mount a PersistentVolumeClaim, narrowed by selectors.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct ProtectionSpec {
    /// Only pods with these labels (absent: every StatefulSet pod with a PVC).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_selector: Option<LabelSelector>,
    /// Only pods in namespaces with these labels (absent: every namespace).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace_selector: Option<LabelSelector>,
}

/// The holds protected pods carry. Karpenter's `karpenter.sh/do-not-disrupt` is always placed (Karpenter
/// releases a node only once the plan released it); Cluster Autoscaler's is a choice.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct HoldsSpec {
    /// How protected pods are kept from Cluster Autoscaler's scale-down. `Gate` (default): no annotation;
    /// CA may pick the node, its soft taint starts the backup and its drain waits at the eviction gate
    /// (unheld if the gate is off or down). `SafeToEvictFalse`: `safe-to-evict: "false"` on every
    /// protected pod; CA never scales down a node running one.
    #[serde(default)]
    pub cluster_autoscaler: ClusterAutoscalerHold,
}

/// How protected pods are kept from Cluster Autoscaler's scale-down.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum ClusterAutoscalerHold {
    /// No annotation: CA may find the node unneeded. Its `DeletionCandidateOfClusterAutoscaler` taint
    /// starts the backup early, and its drain waits at the eviction gate (429 until the backup is
    /// verified; CA retries for `--max-pod-eviction-time`, then gives up and comes back later). Without
    /// the gate (or with it down under `failurePolicy: Ignore`) CA's drain is not held.
    #[default]
    Gate,
    /// `cluster-autoscaler.kubernetes.io/safe-to-evict: "false"` on every protected pod: CA never scales
    /// down a node running one (kubernetes/autoscaler `simulator/drainability/rules/notsafetoevict`), so
    /// the `clusterAutoscaler` signal never fires and such nodes stay.
    SafeToEvictFalse,
}

/// What a signal leads to.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum SignalAction {
    /// A Release plan: back up, verify, release the holds; the disruptor drains.
    #[default]
    Release,
    /// No plan. A graceful disruption waits behind the holds; for a forceful one (the node goes anyway)
    /// snapdrain takes the holds off and its gate allows the evictions, without a backup.
    Ignore,
}

/// Whether Karpenter may consolidate nodes that run protected pods.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum ConsolidationAction {
    /// Keep the holds: Karpenter never consolidates a node with protected pods.
    #[default]
    Hold,
    /// A `Consolidatable` NodeClaim gets a Release plan like a drifted one.
    Release,
}

/// One entry per signal source (DESIGN.md, the signal table).
#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct SignalsSpec {
    /// Karpenter NodeClaim `Drifted=True`.
    #[serde(default)]
    pub drift: SignalAction,
    /// Karpenter NodeClaim `Consolidatable=True`.
    #[serde(default)]
    pub consolidation: ConsolidationAction,
    /// Karpenter's forceful termination: NodeClaim deletion (expiry, interruption, a manual delete) or the
    /// `karpenter.sh/disrupted:NoSchedule` taint. The deadline comes from the NodeClaim's
    /// `terminationGracePeriod`.
    #[serde(default)]
    pub termination: SignalAction,
    /// Cluster Autoscaler's taints: `DeletionCandidateOfClusterAutoscaler` (the node is unneeded; CA
    /// drains it after `--scale-down-unneeded-time`, so the backup starts now) and
    /// `ToBeDeletedByClusterAutoscaler` (its drain, which waits at the gate).
    #[serde(default)]
    pub cluster_autoscaler: SignalAction,
    /// aws-node-termination-handler's `aws-node-termination-handler/*` taints.
    #[serde(default)]
    pub node_termination_handler: SignalAction,
}

/// Limits on signal plans running at once. A plan takes a slot until its backups are verified, and an
/// Execute plan until it ends; a Release plan past verification only waits for the disruptor (whose own
/// budget paces it) and frees its slot, so Velero is not left idle while the next signals wait. 0 means
/// no limit.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ConcurrencySpec {
    /// Across the cluster.
    #[serde(default = "default_max_plans")]
    pub max_plans: u32,
    /// Per Karpenter NodePool (label `karpenter.sh/nodepool` of the node).
    #[serde(default)]
    pub max_plans_per_node_pool: u32,
}

impl Default for ConcurrencySpec {
    fn default() -> Self {
        Self {
            max_plans: default_max_plans(),
            max_plans_per_node_pool: 0,
        }
    }
}

fn default_release_window() -> String {
    "15m".into()
}

fn default_max_plans() -> u32 {
    // Velero runs one backup at a time by default: more plans than this only queue behind each other.
    10
}

fn default_signal_backup() -> BackupSpec {
    BackupSpec {
        reuse_if_newer_than: Some("1h".into()),
        ..BackupSpec::default()
    }
}

impl DisruptionPolicySpec {
    /// The policy as the controller uses it when none exists yet.
    pub fn defaults() -> Self {
        // Every field has a serde default: an empty object is the default policy.
        serde_json::from_value(serde_json::json!({}))
            .unwrap_or_else(|e| unreachable!("the empty policy deserializes: {e}"))
    }
}

impl DisruptionPolicySpec {
    /// The spec every signal plan starts from (see [`crate::signals::spec_for`]).
    pub fn plan_defaults(&self) -> DisruptionPlanSpec {
        DisruptionPlanSpec {
            release_window: Some(self.release_window.clone()),
            backup: self.backup.clone(),
            drain: self.drain.clone(),
            termination: self.termination.clone(),
            ..DisruptionPlanSpec::default()
        }
    }

    /// The checks the schema cannot make (selectors; durations and the plan settings, as a plan's are
    /// validated). Every problem, as `field: what is wrong`.
    pub fn validate(&self) -> Result<(), Vec<String>> {
        let mut problems = Vec::new();
        for (field, sel) in [
            ("spec.protection.podSelector", &self.protection.pod_selector),
            (
                "spec.protection.namespaceSelector",
                &self.protection.namespace_selector,
            ),
        ] {
            if let Some(sel) = sel
                && let Err(e) = kube::core::Selector::try_from(sel.clone())
            {
                problems.push(format!("{field}: {e}"));
            }
        }
        for (i, w) in self.maintenance_windows.iter().enumerate() {
            if let Err(e) = crate::signals::window::Window::new(w) {
                problems.push(format!("spec.maintenanceWindows[{i}]: {e}"));
            }
        }
        if let Some(w) = &self.notifications.webhook {
            match (&w.url, &w.url_secret_ref) {
                (Some(url), None) => {
                    if let Err(e) = crate::telemetry::notify::check_url(
                        &crate::telemetry::notify::Endpoint::new(w, url),
                    ) {
                        problems.push(format!("spec.notifications.webhook.url: {e}"));
                    }
                }
                (None, Some(_)) => {}
                _ => problems.push(
                    "spec.notifications.webhook: set exactly one of url and urlSecretRef".into(),
                ),
            }
        }
        for (i, entry) in self.replacement.allowed_settings.iter().enumerate() {
            if let Err(e) = crate::planning::launch_policy::check_setting_entry(entry) {
                problems.push(format!("spec.replacement.allowedSettings[{i}]: {e}"));
            }
        }
        if let Some(warm) = &self.warm_backups {
            problems.extend(warm.problems());
        }
        problems.extend(super::backup_hooks::validate(&self.backup_hooks));
        if let Err(e) = super::validate::spec_duration(&self.history.ttl_after_finished) {
            problems.push(format!("spec.history.ttlAfterFinished: {e}"));
        }
        let mut sample = self.plan_defaults();
        sample.nodes = vec!["node".into()];
        // Signal plans are judged by the same switches: a policy that sets skip or force for them
        // must allow it, or every signal plan would be refused.
        problems.extend(
            crate::planning::launch_policy::check_settings(&sample, &self.plan_settings)
                .iter()
                .map(|p| format!("{p} (this policy's signal plans use it)")),
        );
        if let Err(ps) = super::validate::validate(&sample) {
            // The policy's fields sit at the same paths as a plan's (spec.backup, spec.drain, ...).
            problems.extend(ps.iter().map(ToString::to_string));
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(problems)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_empty_spec_is_the_documented_default() {
        let p = DisruptionPolicySpec::defaults();
        assert_eq!(p.release_window, "15m");
        assert_eq!(p.signals.drift, SignalAction::Release);
        assert_eq!(p.signals.consolidation, ConsolidationAction::Hold);
        assert_eq!(p.concurrency.max_plans, 10);
        assert_eq!(p.backup.reuse_if_newer_than.as_deref(), Some("1h"));
        assert!(p.protection.pod_selector.is_none());
        assert_eq!(p.holds.cluster_autoscaler, ClusterAutoscalerHold::Gate);
        let blocking: DisruptionPolicySpec = serde_json::from_value(
            serde_json::json!({"holds": {"clusterAutoscaler": "SafeToEvictFalse"}}),
        )
        .expect("a valid policy");
        assert_eq!(
            blocking.holds.cluster_autoscaler,
            ClusterAutoscalerHold::SafeToEvictFalse
        );
    }

    #[test]
    fn signal_actions_are_spelled_as_in_the_docs() {
        let p: DisruptionPolicySpec = serde_json::from_value(serde_json::json!({
            "signals": {"drift": "Ignore", "consolidation": "Release", "clusterAutoscaler": "Ignore"},
            "concurrency": {"maxPlans": 2, "maxPlansPerNodePool": 1},
            "releaseWindow": "5m"
        }))
        .expect("a valid policy");
        assert_eq!(p.signals.drift, SignalAction::Ignore);
        assert_eq!(p.signals.consolidation, ConsolidationAction::Release);
        assert_eq!(p.signals.termination, SignalAction::Release);
        assert_eq!(p.concurrency.max_plans_per_node_pool, 1);
    }

    #[test]
    fn the_controller_names_every_problem_the_schema_cannot_see() {
        assert_eq!(DisruptionPolicySpec::defaults().validate(), Ok(()));
        let bad: DisruptionPolicySpec = serde_json::from_value(serde_json::json!({
            "releaseWindow": "soon",
            "protection": {"podSelector": {"matchExpressions": [{"key": "a", "operator": "Maybe"}]}},
            "drain": {"maxConcurrentEvictions": 0},
            "maintenanceWindows": [{"schedule": "0 2 * *", "duration": "1h"}],
            "notifications": {"webhook": {"url": "hooks.example/x"}},
            "history": {"ttlAfterFinished": "a week"},
            "warmBackups": {"schedule": "every six hours"}
        }))
        .expect("the shape is valid");
        let problems = bad.validate().expect_err("three problems").join("\n");
        assert!(problems.contains("spec.releaseWindow"), "{problems}");
        assert!(
            problems.contains("spec.protection.podSelector"),
            "{problems}"
        );
        assert!(problems.contains("maxConcurrentEvictions"), "{problems}");
        assert!(
            problems.contains("spec.maintenanceWindows[0]"),
            "{problems}"
        );
        assert!(
            problems.contains("spec.notifications.webhook.url"),
            "{problems}"
        );
        assert!(
            problems.contains("spec.history.ttlAfterFinished"),
            "{problems}"
        );
        assert!(
            problems.contains("spec.warmBackups.schedule") && problems.contains("@every"),
            "{problems}"
        );
    }

    #[test]
    fn finished_plans_are_kept_three_days_and_the_last_three_per_node() {
        let p = DisruptionPolicySpec::defaults();
        assert_eq!(p.history.ttl_after_finished, "72h");
        assert_eq!(p.history.keep_per_node, 3);
    }
}
