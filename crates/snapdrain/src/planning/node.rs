//! Planning one node: which backups it needs, what to evict in which order, what to skip and what refuses.
//!
//! Inputs are slices the caller already narrowed with its indexed caches (the node's pods, their owners,
//! claims and namespaces' PDBs), so planning never scans the cluster. Lookups are hashed once per call.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::core::{Selector, SelectorExt};

use super::backups::{
    BackupNeed, Clock, PlannedVolume, ReusableBackup, find_reusable, scope_selectors,
};
use super::csi_release::release_point;
use super::evictions::{PlannedEviction, eviction_tier};
use super::inventory::{
    DO_NOT_DISRUPT_ANNOTATION, PdbIndex, do_not_disrupt_active, has_empty_dir, is_daemonset_pod,
    is_mirror, is_terminal, is_terminating, is_unreplicated, name_of, namespace_of, pvc_claims,
    statefulset_owner,
};
use super::taint::{DRAIN_TAINT_KEY, tolerates_drain_taint};
use super::volumes::{SnapshotClass, choose_method, classify_pv, settle_methods};
use crate::api::plan::{BackupPolicy, BackupScope, DisruptionPlanSpec, PlanMode};
use crate::api::validate::ValidSpec;

/// Label the StatefulSet controller puts on each pod; the fallback selector when the StatefulSet is unknown.
pub const POD_NAME_LABEL: &str = "statefulset.kubernetes.io/pod-name";

/// What [`plan_node`] looks at. Each slice may hold more than needed (e.g. all PDBs of the namespaces
/// involved); only matching objects are used.
#[derive(Clone, Copy)]
pub struct NodeInputs<'a> {
    pub node: &'a Node,
    /// Pods bound to the node (`spec.nodeName`).
    pub pods: &'a [Pod],
    /// At least the StatefulSets owning the node's pods.
    pub stateful_sets: &'a [StatefulSet],
    /// At least the PVCs the node's pods mount.
    pub pvcs: &'a [PersistentVolumeClaim],
    /// At least the PDBs of the node's pods' namespaces.
    pub pdbs: &'a [PodDisruptionBudget],
    /// At least the PVs bound to the protected pods' claims (a missing one classifies as unknown).
    pub pvs: &'a [PersistentVolume],
    /// The cluster's VolumeSnapshotClasses (empty when the snapshot CRDs are not installed).
    pub snapshot_classes: &'a [SnapshotClass],
    /// Backups that could be reused.
    pub existing_backups: &'a [ReusableBackup],
    /// Which pods are protected: the DisruptionPolicy's rule (`protection::protects_or_more`), so a
    /// plan backs up what the holds and the gate keep, and nothing the policy leaves out.
    pub protects: &'a (dyn Fn(&Pod) -> bool + Sync),
}

/// Why a pod on the node is left alone.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SkipReason {
    /// Succeeded or Failed.
    Terminal,
    /// Static pod mirror; the kubelet owns it.
    Mirror,
    /// DaemonSet pod with `ignoreDaemonSets`.
    DaemonSet,
    /// Not matched by `drain.podSelector`.
    NotSelected,
    /// Tolerates snapdrain's drain taint, so it would be scheduled straight back (Karpenter's
    /// `IsEvictable`); it stops when the node goes.
    ToleratesDrainTaint,
}

/// A pod left alone.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SkippedPod {
    pub namespace: String,
    pub name: String,
    pub reason: SkipReason,
}

/// The plan for one node.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct NodePlan {
    pub node: String,
    pub node_uid: Option<String>,
    /// From `spec.providerID` `aws:///<az>/<i-...>`.
    pub instance_id: Option<String>,
    /// One per workload namespace with protected pods, sorted by namespace. Empty with backup policy skip.
    pub backups: Vec<BackupNeed>,
    /// In eviction order: by tier, then namespace/name.
    pub evictions: Vec<PlannedEviction>,
    pub skipped: Vec<SkippedPod>,
    /// `ns/name` of pods with emptyDir volumes that may not be evicted (drain.deleteEmptyDirData false).
    pub local_storage_refusals: Vec<String>,
    /// `ns/name` of pods no controller owns (nothing recreates them), refused unless `drain.force`.
    pub unreplicated_refusals: Vec<String>,
    /// Protected pods that are not Running, with the claims a file-system backup would copy: Velero
    /// skips them, so the plan waits for the pod to run (`ns/name (claims)`).
    pub not_running_refusals: Vec<String>,
    /// Protected pods with block-mode claims a file-system backup would copy, which Velero skips
    /// (`ns/name (claims)`): the plan waits until they are left out or get a CSI snapshot.
    pub block_refusals: Vec<String>,
    /// PersistentVolumes of the pods to evict: wait for their VolumeAttachments before terminating.
    pub persistent_volumes: Vec<String>,
    /// Things a person should know that do not stop the plan (unknown StatefulSet, missing PVC, several PDBs).
    pub warnings: Vec<String>,
}

impl NodePlan {
    /// kubectl's refusals (kubernetes/kubectl `pkg/drain/filters.go`: `localStorageFilter`,
    /// `unreplicatedFilter`, same wording), or None when the drain may go ahead.
    pub fn refusal_message(&self) -> Option<String> {
        let mut parts = Vec::new();
        if !self.local_storage_refusals.is_empty() {
            parts.push(format!(
                "cannot delete Pods with local storage (use --delete-emptydir-data to override): {}; \
                 in a DisruptionPlan set spec.drain.deleteEmptyDirData: true to evict them anyway",
                self.local_storage_refusals.join(", ")
            ));
        }
        if !self.unreplicated_refusals.is_empty() {
            parts.push(format!(
                "cannot delete Pods that declare no controller (use --force to override): {}; \
                 nothing recreates such a pod once evicted: in a DisruptionPlan set spec.drain.force: true \
                 to evict them anyway",
                self.unreplicated_refusals.join(", ")
            ));
        }
        if !self.not_running_refusals.is_empty() {
            parts.push(format!(
                "waiting for protected pods to run: {}; Velero's file-system backup skips the volumes of a \
                 pod that is not Running, and a node-local volume is lost with its node: get the pod \
                 running, leave it out with the DisruptionPolicy's spec.protection, or delete the plan",
                self.not_running_refusals.join(", ")
            ));
        }
        if !self.block_refusals.is_empty() {
            parts.push(format!(
                "cannot back up block-mode volumes with a file-system backup: {}; Velero's file-system \
                 backup skips them: give their CSI driver a VolumeSnapshotClass (labelled \
                 velero.io/csi-volumesnapshot-class) so backup.method auto snapshots them, or leave \
                 the pod out with the DisruptionPolicy's spec.protection",
                self.block_refusals.join(", ")
            ));
        }
        (!parts.is_empty()).then(|| parts.join("; "))
    }

    /// Every protected pod on the node, as `ns/name`.
    pub fn protected_pods(&self) -> impl Iterator<Item = String> + '_ {
        self.evictions
            .iter()
            .filter(|e| e.protected)
            .map(|e| format!("{}/{}", e.namespace, e.name))
    }
}

/// Plans one node. `valid` is the result of [`crate::api::validate()`] on `spec`.
///
/// Protected pods are backed up whatever `drain.podSelector` says: in Release mode (and for the eviction
/// gate) other drainers evict them too, so the backup is about the node, not about what snapdrain evicts.
pub fn plan_node(
    inputs: &NodeInputs<'_>,
    spec: &DisruptionPlanSpec,
    valid: &ValidSpec,
    clock: Clock,
) -> NodePlan {
    let node = inputs.node;
    let mut plan = NodePlan {
        node: node.metadata.name.clone().unwrap_or_default(),
        node_uid: node.metadata.uid.clone(),
        instance_id: node
            .spec
            .as_ref()
            .and_then(|s| s.provider_id.as_deref())
            .and_then(|p| crate::cloud::ec2::instance_id_from_provider_id(p).ok()),
        ..NodePlan::default()
    };

    let sts_by_key: HashMap<(&str, &str), &StatefulSet> = inputs
        .stateful_sets
        .iter()
        .map(|s| {
            (
                (
                    s.metadata.namespace.as_deref().unwrap_or_default(),
                    s.metadata.name.as_deref().unwrap_or_default(),
                ),
                s,
            )
        })
        .collect();
    let pvc_by_key: HashMap<(&str, &str), &PersistentVolumeClaim> = inputs
        .pvcs
        .iter()
        .map(|p| {
            (
                (
                    p.metadata.namespace.as_deref().unwrap_or_default(),
                    p.metadata.name.as_deref().unwrap_or_default(),
                ),
                p,
            )
        })
        .collect();
    let pdb_index = PdbIndex::new(inputs.pdbs);
    let pod_selector = match spec.drain.pod_selector.clone().map(Selector::try_from) {
        None => None,
        Some(Ok(sel)) => Some(sel),
        Some(Err(e)) => {
            // validate() refuses this; if it gets here anyway, evict nothing rather than everything.
            plan.warnings.push(format!(
                "drain.podSelector is invalid ({e}); no pod is selected"
            ));
            Some(Selector::from_iter([kube::core::Expression::In(
                "snapdrain.io/never".into(),
                Default::default(),
            )]))
        }
    };

    let mut needs: BTreeMap<&str, NeedBuilder> = BTreeMap::new();
    let mut pvs = BTreeSet::new();
    let empty_labels = BTreeMap::new();

    for pod in inputs.pods {
        let (ns, name) = (namespace_of(pod), name_of(pod));
        let skip = |reason| SkippedPod {
            namespace: ns.to_owned(),
            name: name.to_owned(),
            reason,
        };
        let protected = (inputs.protects)(pod);
        if protected && spec.backup.policy != BackupPolicy::Skip {
            let sts = statefulset_owner(pod).unwrap_or_default();
            let need = needs.entry(ns).or_default();
            need.pods.insert(name.to_owned());
            need.pvcs.extend(pvc_claims(pod).map(str::to_owned));
            if !need.selectors.contains_key(sts) {
                let selector = sts_by_key
                    .get(&(ns, sts))
                    .and_then(|s| s.spec.as_ref())
                    .map(|s| s.selector.clone());
                let selector = selector.unwrap_or_else(|| {
                    plan.warnings.push(format!(
                        "StatefulSet {ns}/{sts} of pod {ns}/{name} is not in the cache; backing up its pods by name"
                    ));
                    need.by_pod_name.push(name.to_owned());
                    LabelSelector::default()
                });
                if selector != LabelSelector::default() {
                    need.selectors.insert(sts.to_owned(), selector);
                }
            }
            for claim in pvc_claims(pod) {
                if !pvc_by_key.contains_key(&(ns, claim)) {
                    plan.warnings.push(format!(
                        "pod {ns}/{name} mounts PVC {claim}, which is not in the cache (deleted or not yet created?)"
                    ));
                }
            }
        }

        if is_mirror(pod) {
            plan.skipped.push(skip(SkipReason::Mirror));
            continue;
        }
        if is_terminal(pod) {
            plan.skipped.push(skip(SkipReason::Terminal));
            continue;
        }
        let labels = pod.metadata.labels.as_ref().unwrap_or(&empty_labels);
        if pod_selector.as_ref().is_some_and(|s| !s.matches(labels)) {
            plan.skipped.push(skip(SkipReason::NotSelected));
            continue;
        }
        if is_daemonset_pod(pod) && spec.drain.ignore_daemon_sets {
            plan.skipped.push(skip(SkipReason::DaemonSet));
            continue;
        }
        if tolerates_drain_taint(pod) {
            // Evicted, it would come straight back (the taint is what keeps pods off the node).
            if !is_daemonset_pod(pod) {
                plan.warnings.push(format!(
                    "pod {ns}/{name} tolerates the {DRAIN_TAINT_KEY} taint, so it is not evicted \
                     (it would be scheduled straight back); it stops when the node goes"
                ));
            }
            plan.skipped.push(skip(SkipReason::ToleratesDrainTaint));
            continue;
        }
        // The refusals are kubectl drain's, for the evictions snapdrain makes itself. A Release plan evicts
        // nothing: the drainer (Karpenter, Cluster Autoscaler, NTH, `kubectl drain` with its own flags)
        // decides about emptyDir and bare pods, and refusing here would only keep the plan in Pending.
        let execute = spec.mode == PlanMode::Execute;
        let mut refused = false;
        if execute && has_empty_dir(pod) && !spec.drain.delete_empty_dir_data {
            plan.local_storage_refusals.push(format!("{ns}/{name}"));
            refused = true;
        }
        if execute && is_unreplicated(pod) && !spec.drain.force {
            plan.unreplicated_refusals.push(format!("{ns}/{name}"));
            refused = true;
        }
        if refused {
            continue;
        }
        // snapdrain's own hold means "not before the backup is verified", which this drain enforces
        // itself; only a user's do-not-disrupt makes the drain wait.
        let do_not_disrupt = !spec.drain.force
            && do_not_disrupt_active(pod, clock.now)
            && !super::holds::own_do_not_disrupt(pod);
        if do_not_disrupt {
            plan.warnings.push(format!(
                "pod {ns}/{name} has an active {DO_NOT_DISRUPT_ANNOTATION} annotation; the drain waits \
                 for it to be removed (or set spec.drain.force: true to evict it anyway)"
            ));
        }
        let pdbs = pdb_index.matching(pod);
        if pdbs.len() > 1 {
            plan.warnings.push(format!(
                "pod {ns}/{name} is covered by {} PodDisruptionBudgets ({}); the eviction API refuses such pods \
                 until all but one are removed",
                pdbs.len(),
                pdbs.join(", ")
            ));
        }
        for claim in pvc_claims(pod) {
            if let Some(pv) = pvc_by_key
                .get(&(ns, claim))
                .and_then(|p| p.spec.as_ref()?.volume_name.clone())
            {
                pvs.insert(pv);
            }
        }
        plan.evictions.push(PlannedEviction {
            namespace: ns.to_owned(),
            name: name.to_owned(),
            uid: pod.metadata.uid.clone(),
            tier: eviction_tier(pod),
            protected,
            pdbs,
            terminating: is_terminating(pod),
            do_not_disrupt,
        });
    }

    plan.evictions
        .sort_by(|a, b| (a.tier, &a.namespace, &a.name).cmp(&(b.tier, &b.namespace, &b.name)));
    plan.local_storage_refusals.sort();
    plan.unreplicated_refusals.sort();
    plan.persistent_volumes = pvs.into_iter().collect();
    let volumes = Volumes::new(inputs, &pvc_by_key);
    plan.backups = needs
        .into_iter()
        .map(|(ns, b)| {
            let mut need = b.build(ns, inputs.existing_backups, spec, valid, clock);
            need.volumes = need
                .pvcs
                .iter()
                .map(|claim| volumes.plan(ns, claim, &spec.backup))
                .collect();
            settle_planned(&spec.backup, &mut need.volumes);
            need
        })
        .collect();
    plan.not_running_refusals = not_running_refusals(inputs, &plan.backups);
    plan.block_refusals = block_refusals(inputs, &plan.backups);
    plan
}

/// Protected pods that are not Running whose claims a file-system backup would copy. Velero's
/// file-system backup skips every volume of such a pod without failing the Backup (velero
/// `pkg/podvolume/backupper.go` `BackupPodVolumes`, its check of the pod's phase), so the backup could
/// never be verified; a CSI snapshot does not need the pod.
fn not_running_refusals(inputs: &NodeInputs<'_>, backups: &[BackupNeed]) -> Vec<String> {
    fsb_refusals(inputs, backups, |pod, _| {
        pod.status.as_ref().and_then(|s| s.phase.as_deref()) != Some("Running")
    })
}

/// Protected pods whose block-mode claims a file-system backup would copy: Velero's file-system backup
/// skips block volumes (velero `pkg/podvolume/backupper.go`, its volume-mode check), so the backup could
/// never be verified. A CSI snapshot takes them.
fn block_refusals(inputs: &NodeInputs<'_>, backups: &[BackupNeed]) -> Vec<String> {
    fsb_refusals(inputs, backups, |pod, claim| {
        inputs.pvcs.iter().any(|p| {
            p.metadata.namespace.as_deref() == pod.metadata.namespace.as_deref()
                && p.metadata.name.as_deref() == Some(claim)
                && p.spec.as_ref().and_then(|s| s.volume_mode.as_deref()) == Some("Block")
        })
    })
}

/// `ns/name (claims)` of each protected pod with claims a file-system backup would copy and
/// `skipped(pod, claim)` says Velero would skip.
fn fsb_refusals(
    inputs: &NodeInputs<'_>,
    backups: &[BackupNeed],
    skipped: impl Fn(&Pod, &str) -> bool,
) -> Vec<String> {
    let mut out = Vec::new();
    for pod in inputs.pods.iter().filter(|p| (inputs.protects)(p)) {
        let (ns, name) = (namespace_of(pod), name_of(pod));
        let Some(need) = backups.iter().find(|b| b.namespace == ns) else {
            continue;
        };
        let copied: Vec<&str> = pvc_claims(pod)
            .filter(|c| {
                need.volumes.iter().any(|v| {
                    v.record.pvc == *c
                        && v.record.method == crate::api::volume::VolumeMethod::FileSystem
                })
            })
            .filter(|c| skipped(pod, c))
            .collect();
        if !copied.is_empty() {
            out.push(format!("{ns}/{name} ({})", copied.join(", ")));
        }
    }
    out.sort();
    out
}

/// Under `Auto`, makes a namespace's volume methods expressible in one Backup ([`settle_methods`]); then
/// sets each volume's release point ([`release_point`]).
pub fn settle_planned(backup: &crate::api::plan::BackupSpec, volumes: &mut [PlannedVolume]) {
    if backup.method == crate::api::plan::BackupMethod::Auto {
        let mut records: Vec<_> = volumes.iter().map(|v| v.record.clone()).collect();
        settle_methods(&mut records);
        for (v, r) in volumes.iter_mut().zip(records) {
            v.record = r;
        }
    }
    // After settling: a volume turned to a file-system backup waits for the verified copy.
    for v in volumes.iter_mut() {
        v.record.release_at = release_point(backup.release_network_volumes_at, &v.record);
    }
}

/// Classifies the protected pods' claims from the PVs they are bound to.
struct Volumes<'a> {
    pvc_by_key: &'a HashMap<(&'a str, &'a str), &'a PersistentVolumeClaim>,
    pv_by_name: HashMap<&'a str, &'a PersistentVolume>,
    snapshot_classes: &'a [SnapshotClass],
}

impl<'a> Volumes<'a> {
    fn new(
        inputs: &NodeInputs<'a>,
        pvc_by_key: &'a HashMap<(&'a str, &'a str), &'a PersistentVolumeClaim>,
    ) -> Self {
        Self {
            pvc_by_key,
            pv_by_name: inputs
                .pvs
                .iter()
                .filter_map(|pv| Some((pv.metadata.name.as_deref()?, pv)))
                .collect(),
            snapshot_classes: inputs.snapshot_classes,
        }
    }

    fn plan(&self, ns: &str, claim: &str, backup: &crate::api::plan::BackupSpec) -> PlannedVolume {
        let pv_name = self
            .pvc_by_key
            .get(&(ns, claim))
            .and_then(|p| p.spec.as_ref()?.volume_name.clone())
            .filter(|n| !n.is_empty());
        let pv = pv_name
            .as_deref()
            .and_then(|n| self.pv_by_name.get(n).copied());
        let classified = classify_pv(pv);
        let move_data = backup.snapshot_move_data;
        let (method, snapshot_class) =
            choose_method(backup.method, &classified, self.snapshot_classes, move_data);
        let (auto_method, _) = choose_method(
            crate::api::plan::BackupMethod::Auto,
            &classified,
            self.snapshot_classes,
            move_data,
        );
        PlannedVolume {
            record: crate::api::volume::VolumeRecord {
                pvc: claim.to_owned(),
                pv: pv_name,
                class: classified.class,
                source: classified.source,
                reason: classified.reason,
                method,
                snapshot_class,
                release_at: crate::api::plan::ReleasePoint::Verified,
                snapshot: None,
                size_bytes: None,
                expected_seconds: None,
            },
            auto_method,
        }
    }
}

#[derive(Default)]
struct NeedBuilder {
    pods: BTreeSet<String>,
    pvcs: BTreeSet<String>,
    /// StatefulSet name → its selector.
    selectors: BTreeMap<String, LabelSelector>,
    /// Pods whose StatefulSet is unknown, selected by their pod-name label instead.
    by_pod_name: Vec<String>,
}

impl NeedBuilder {
    fn build(
        self,
        ns: &str,
        existing: &[ReusableBackup],
        spec: &DisruptionPlanSpec,
        valid: &ValidSpec,
        clock: Clock,
    ) -> BackupNeed {
        let pvcs: Vec<String> = self.pvcs.into_iter().collect();
        let pods: Vec<String> = self.pods.iter().cloned().collect();
        let or_label_selectors = match spec.backup.scope {
            BackupScope::Pods => scope_selectors(BackupScope::Pods, &pods, &[]),
            // Pods whose StatefulSet is not in the cache are selected by name.
            BackupScope::StatefulSet => {
                let mut all: Vec<LabelSelector> = self.selectors.values().cloned().collect();
                all.extend(scope_selectors(BackupScope::Pods, &self.by_pod_name, &[]));
                all
            }
        };
        let reuse = find_reusable(
            ns,
            &pvcs,
            existing,
            spec.backup.storage_location.as_deref(),
            valid.reuse_if_newer_than,
            clock,
        )
        .map(|b| b.name.clone());
        BackupNeed {
            namespace: ns.to_owned(),
            stateful_sets: self.selectors.into_keys().collect(),
            pvcs,
            pods: self.pods.into_iter().collect(),
            volumes: Vec::new(),
            or_label_selectors,
            reuse,
            // Only a Backup's creation knows the plan's EC2 snapshots.
            skip_drivers: Vec::new(),
            hooks: Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::evictions::EvictionTier;
    use super::super::inventory::fixtures::*;
    use super::*;
    use k8s_openapi::jiff::Timestamp;
    use serde_json::json;

    fn clock() -> Clock {
        Clock {
            decided_at: "2026-05-20T10:00:00Z".parse().expect("ts"),
            now: "2026-05-20T10:01:00Z".parse().expect("ts"),
        }
    }

    fn spec(v: serde_json::Value) -> DisruptionPlanSpec {
        let mut base = json!({"nodes": ["n1"]});
        if let (Some(b), Some(o)) = (base.as_object_mut(), v.as_object()) {
            b.extend(o.clone());
        }
        serde_json::from_value(base).expect("spec")
    }

    struct World {
        node: Node,
        pods: Vec<Pod>,
        sts: Vec<StatefulSet>,
        pvcs: Vec<PersistentVolumeClaim>,
        pdbs: Vec<PodDisruptionBudget>,
        pvs: Vec<PersistentVolume>,
        snapshot_classes: Vec<SnapshotClass>,
        existing: Vec<ReusableBackup>,
    }

    impl World {
        fn new() -> Self {
            Self {
                node: node("n1"),
                pods: vec![
                    sts_pod("db", "pg", 0, &["data"]),
                    sts_pod("db", "redis", 1, &["data", "aof"]),
                    sts_pod("mq", "rabbit", 2, &["data"]),
                    sts_pod("web", "cache", 0, &[]),
                    deploy_pod("web", "api"),
                    ds_pod("kube-system", "node-agent", None),
                    ds_pod("kube-system", "cni", Some("system-node-critical")),
                    with(
                        deploy_pod("kube-system", "coredns"),
                        json!({"spec": {"priorityClassName": "system-cluster-critical"}}),
                    ),
                    with(
                        deploy_pod("kube-system", "kube-proxy-n1"),
                        json!({"metadata": {"annotations": {"kubernetes.io/config.mirror": "x"}}}),
                    ),
                    with(
                        deploy_pod("batch", "job-1"),
                        json!({"status": {"phase": "Succeeded"}}),
                    ),
                ],
                sts: vec![
                    statefulset("db", "pg"),
                    statefulset("db", "redis"),
                    statefulset("mq", "rabbit"),
                ],
                pvcs: vec![
                    pvc("db", "data-pg-0", "pv-pg-0"),
                    pvc("db", "data-redis-1", "pv-redis-1"),
                    pvc("db", "aof-redis-1", "pv-aof-1"),
                    pvc("mq", "data-rabbit-2", "pv-rabbit-2"),
                ],
                pdbs: vec![pdb("db", "pg", json!({"matchLabels": {"app": "pg"}}))],
                pvs: vec![],
                snapshot_classes: vec![],
                existing: vec![],
            }
        }

        fn plan(&self, spec: &DisruptionPlanSpec) -> NodePlan {
            self.plan_protecting(spec, &crate::planning::protection::default_rule)
        }

        /// Every `db` volume on EBS, whose driver has a Velero VolumeSnapshotClass. All of them: a
        /// volume of unknown kind would turn the namespace to file-system backups.
        fn on_snapshotted_ebs(&mut self) {
            self.pvs = ["pv-pg-0", "pv-redis-1", "pv-aof-1"]
                .iter()
                .map(|name| {
                    pv(
                        name,
                        json!({"csi": {"driver": "ebs.csi.aws.com", "volumeHandle": format!("vol-{name}")}}),
                    )
                })
                .collect();
            self.snapshot_classes = vec![SnapshotClass {
                name: "ebs".into(),
                driver: "ebs.csi.aws.com".into(),
                velero_label: true,
                default: false,
            }];
        }

        fn plan_protecting(
            &self,
            spec: &DisruptionPlanSpec,
            protects: &(dyn Fn(&Pod) -> bool + Sync),
        ) -> NodePlan {
            let valid = crate::api::validate(spec).expect("valid spec");
            let inputs = NodeInputs {
                node: &self.node,
                pods: &self.pods,
                stateful_sets: &self.sts,
                pvcs: &self.pvcs,
                pdbs: &self.pdbs,
                pvs: &self.pvs,
                snapshot_classes: &self.snapshot_classes,
                existing_backups: &self.existing,
                protects,
            };
            plan_node(&inputs, spec, &valid, clock())
        }
    }

    fn names(e: &[PlannedEviction]) -> Vec<String> {
        e.iter()
            .map(|e| format!("{}/{}", e.namespace, e.name))
            .collect()
    }

    fn pv(name: &str, spec: serde_json::Value) -> PersistentVolume {
        serde_json::from_value(json!({"metadata": {"name": name}, "spec": spec})).expect("pv")
    }

    #[test]
    fn each_protected_volume_is_classified_from_its_pv() {
        use crate::api::volume::{VolumeClass, VolumeMethod};
        let mut w = World::new();
        w.pvs = vec![
            pv(
                "pv-pg-0",
                json!({"csi": {"driver": "ebs.csi.aws.com", "volumeHandle": "vol-1"},
                       "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                           {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["a"]}]}]}}}),
            ),
            pv(
                "pv-redis-1",
                json!({"local": {"path": "/mnt/nvme0"},
                       "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                           {"key": "kubernetes.io/hostname", "operator": "In", "values": ["n1"]}]}]}}}),
            ),
        ];
        w.snapshot_classes = vec![SnapshotClass {
            name: "ebs".into(),
            driver: "ebs.csi.aws.com".into(),
            velero_label: true,
            default: false,
        }];
        let plan = w.plan(&spec(json!({})));
        let db = &plan.backups[0];
        let by_pvc = |pvc: &str| {
            db.volumes
                .iter()
                .find(|v| v.record.pvc == pvc)
                .unwrap_or_else(|| panic!("{pvc} in {:?}", db.volumes))
        };
        assert_eq!(
            db.volumes
                .iter()
                .map(|v| v.record.pvc.as_str())
                .collect::<Vec<_>>(),
            db.pvcs,
            "one entry per PVC, in order"
        );
        let ebs = by_pvc("data-pg-0");
        assert_eq!(ebs.record.class, VolumeClass::Network);
        assert_eq!(ebs.record.pv.as_deref(), Some("pv-pg-0"));
        assert_eq!(ebs.record.source.as_deref(), Some("ebs.csi.aws.com"));
        // The plan's method (file-system by default) for every volume; Auto would snapshot the EBS one.
        assert_eq!(ebs.record.method, VolumeMethod::FileSystem);
        assert_eq!(ebs.auto_method, VolumeMethod::CsiDataMover);
        let local = by_pvc("data-redis-1");
        assert_eq!(local.record.class, VolumeClass::NodeLocal);
        assert_eq!(local.auto_method, VolumeMethod::FileSystem);
        // Its PV is not among the inputs: unknown, copied like a node-local one.
        let unknown = by_pvc("aof-redis-1");
        assert_eq!(unknown.record.class, VolumeClass::Unknown);
        assert_eq!(unknown.auto_method, VolumeMethod::FileSystem);
        // Under an explicit CSI method every volume takes it, with the class Velero would use.
        let csi = w.plan(&spec(json!({"backup": {"method": "csi-data-mover"}})));
        let ebs = &csi.backups[0]
            .volumes
            .iter()
            .find(|v| v.record.pvc == "data-pg-0")
            .expect("pg");
        assert_eq!(ebs.record.method, VolumeMethod::CsiDataMover);
        assert_eq!(ebs.record.snapshot_class.as_deref(), Some("ebs"));
    }

    /// Review #10: a protected pod that is not Running has its file-system-backed volumes skipped by
    /// Velero, so the plan waits for it (saying why) instead of failing every attempt; a volume a CSI
    /// snapshot takes does not need the pod to run.
    #[test]
    fn a_protected_pod_that_is_not_running_makes_the_plan_wait_for_it() {
        let mut w = World::new();
        for p in &mut w.pods {
            if p.metadata.name.as_deref() == Some("pg-0") {
                p.status =
                    Some(serde_json::from_value(json!({"phase": "Pending"})).expect("status"));
            }
        }
        let plan = w.plan(&spec(json!({})));
        assert_eq!(plan.not_running_refusals, ["db/pg-0 (data-pg-0)"]);
        let message = plan.refusal_message().expect("the plan waits");
        assert!(
            message.contains("waiting for protected pods to run: db/pg-0"),
            "{message}"
        );
        // Release plans wait too (Velero skips the volume whoever drains).
        let release = w.plan(&spec(json!({"mode": "Release"})));
        assert_eq!(release.not_running_refusals, ["db/pg-0 (data-pg-0)"]);
        // EBS volumes are snapshotted under Auto: no file-system copy, no wait.
        w.on_snapshotted_ebs();
        let auto = w.plan(&spec(json!({"backup": {"method": "auto"}})));
        assert!(
            auto.not_running_refusals.is_empty(),
            "{:?}",
            auto.not_running_refusals
        );
        assert!(
            World::new()
                .plan(&spec(json!({})))
                .not_running_refusals
                .is_empty()
        );
    }

    /// Review #10: Velero's file-system backup skips block-mode volumes, so a plan that would copy one
    /// that way waits, saying what to change; under Auto with a VolumeSnapshotClass it is snapshotted.
    #[test]
    fn a_block_mode_claim_is_never_left_to_a_file_system_backup() {
        let mut w = World::new();
        for p in &mut w.pvcs {
            if p.metadata.name.as_deref() == Some("data-pg-0") {
                p.spec.get_or_insert_with(Default::default).volume_mode = Some("Block".into());
            }
        }
        let plan = w.plan(&spec(json!({})));
        assert_eq!(plan.block_refusals, ["db/pg-0 (data-pg-0)"]);
        assert!(plan.not_running_refusals.is_empty());
        let message = plan.refusal_message().expect("the plan waits");
        assert!(message.contains("block-mode volumes"), "{message}");
        assert!(message.contains("VolumeSnapshotClass"), "{message}");
        w.on_snapshotted_ebs();
        let auto = w.plan(&spec(json!({"backup": {"method": "auto"}})));
        assert!(auto.block_refusals.is_empty(), "{:?}", auto.block_refusals);
    }

    /// Review #10: a plan backs up what the DisruptionPolicy protects, as the holds and the gate do; a
    /// StatefulSet pod the policy leaves out is moved like any other pod, with no backup of its own.
    #[test]
    fn the_policys_protection_decides_what_is_backed_up() {
        let only_pg: crate::api::policy::ProtectionSpec = serde_json::from_value(json!({
            "podSelector": {"matchLabels": {"app": "pg"}}
        }))
        .expect("a protection spec");
        let protects = |p: &Pod| crate::planning::protection::protects(&only_pg, p, None);
        let plan = World::new().plan_protecting(&spec(json!({})), &protects);
        let backed_up: Vec<(&str, Vec<&str>)> = plan
            .backups
            .iter()
            .map(|b| {
                (
                    b.namespace.as_str(),
                    b.pods.iter().map(String::as_str).collect(),
                )
            })
            .collect();
        assert_eq!(backed_up, [("db", vec!["pg-0"])]);
        let rabbit = plan
            .evictions
            .iter()
            .find(|e| e.name == "rabbit-2")
            .expect("the excluded StatefulSet pod is still evicted");
        assert!(!rabbit.protected);
        assert!(
            plan.evictions
                .iter()
                .any(|e| e.name == "pg-0" && e.protected)
        );
    }

    #[test]
    fn backups_grouped_by_namespace() {
        let plan = World::new().plan(&spec(json!({})));
        assert_eq!(plan.instance_id.as_deref(), Some("i-0abc123def4567890"));
        assert_eq!(plan.node_uid.as_deref(), Some("node-uid-n1"));
        assert_eq!(plan.backups.len(), 2, "{:?}", plan.backups);
        let db = &plan.backups[0];
        assert_eq!(db.namespace, "db");
        assert_eq!(db.stateful_sets, ["pg", "redis"]);
        assert_eq!(db.pods, ["pg-0", "redis-1"]);
        assert_eq!(db.pvcs, ["aof-redis-1", "data-pg-0", "data-redis-1"]);
        // Scope Pods (the default): the node's own protected pods, by the label the StatefulSet
        // controller sets on each.
        assert_eq!(
            serde_json::to_value(&db.or_label_selectors).expect("json"),
            json!([{"matchLabels": {POD_NAME_LABEL: "pg-0"}}, {"matchLabels": {POD_NAME_LABEL: "redis-1"}}])
        );
        assert_eq!(db.reuse, None);
        assert_eq!(plan.backups[1].namespace, "mq");
        assert!(plan.warnings.is_empty(), "{:?}", plan.warnings);
    }

    #[test]
    fn scope_statefulset_selects_every_replica_by_the_statefulsets_selector() {
        let plan = World::new().plan(&spec(json!({"backup": {"scope": "StatefulSet"}})));
        let db = &plan.backups[0];
        assert_eq!(
            db.pods,
            ["pg-0", "redis-1"],
            "the node's own pods are still the ones checked"
        );
        assert_eq!(
            serde_json::to_value(&db.or_label_selectors).expect("json"),
            json!([{"matchLabels": {"app": "pg"}}, {"matchLabels": {"app": "redis"}}])
        );
    }

    #[test]
    fn eviction_order_and_skips() {
        let plan = World::new().plan(&spec(json!({})));
        assert_eq!(
            names(&plan.evictions),
            [
                "db/pg-0",
                "db/redis-1",
                "mq/rabbit-2",
                "web/api",
                "web/cache-0",
                "kube-system/coredns"
            ]
        );
        assert_eq!(
            plan.evictions.last().map(|e| e.tier),
            Some(EvictionTier::Critical)
        );
        assert!(plan.evictions[0].protected && !plan.evictions[3].protected);
        assert_eq!(plan.evictions[0].uid.as_deref(), Some("uid-pg-0"));
        assert_eq!(plan.evictions[0].pdbs, ["pg"]);
        let skipped: Vec<_> = plan
            .skipped
            .iter()
            .map(|s| (s.name.as_str(), s.reason))
            .collect();
        assert!(skipped.contains(&("node-agent", SkipReason::DaemonSet)));
        assert!(skipped.contains(&("cni", SkipReason::DaemonSet)));
        assert!(skipped.contains(&("kube-proxy-n1", SkipReason::Mirror)));
        assert!(skipped.contains(&("job-1", SkipReason::Terminal)));
        assert_eq!(
            plan.persistent_volumes,
            ["pv-aof-1", "pv-pg-0", "pv-rabbit-2", "pv-redis-1"]
        );
        assert_eq!(plan.refusal_message(), None);
    }

    #[test]
    fn daemonsets_evicted_in_their_tiers_when_not_ignored() {
        let plan = World::new().plan(&spec(json!({"drain": {"ignoreDaemonSets": false}})));
        let tiers: Vec<_> = plan
            .evictions
            .iter()
            .map(|e| (e.name.as_str(), e.tier))
            .collect();
        let pos = |n: &str| tiers.iter().position(|(x, _)| *x == n).expect(n);
        assert!(pos("api") < pos("node-agent"));
        assert!(pos("node-agent") < pos("coredns"));
        assert!(pos("coredns") < pos("cni"));
        assert_eq!(
            tiers.last(),
            Some(&("cni", EvictionTier::CriticalDaemonSet))
        );
        let sorted = plan.evictions.windows(2).all(|w| w[0].tier <= w[1].tier);
        assert!(sorted);
    }

    #[test]
    fn empty_dir_refused_with_kubectl_wording() {
        let mut w = World::new();
        w.pods.push(with(
            deploy_pod("web", "scratch"),
            json!({"spec": {"volumes": [{"name": "tmp", "emptyDir": {}}]}}),
        ));
        let plan = w.plan(&spec(json!({})));
        let msg = plan.refusal_message().expect("refused");
        assert!(
            msg.starts_with("cannot delete Pods with local storage (use --delete-emptydir-data to override): web/scratch"),
            "{msg}"
        );
        assert!(!names(&plan.evictions).contains(&"web/scratch".to_owned()));
        let plan = w.plan(&spec(json!({"drain": {"deleteEmptyDirData": true}})));
        assert_eq!(plan.refusal_message(), None);
        assert!(names(&plan.evictions).contains(&"web/scratch".to_owned()));
    }

    #[test]
    fn a_release_plan_leaves_empty_dir_and_bare_pods_to_the_drainer() {
        let mut w = World::new();
        w.pods.push(with(
            deploy_pod("web", "scratch"),
            json!({"spec": {"volumes": [{"name": "tmp", "emptyDir": {}}]}}),
        ));
        w.pods.push(with(
            deploy_pod("ci", "job-runner"),
            json!({"metadata": {"ownerReferences": null}}),
        ));
        let execute = w.plan(&spec(json!({})));
        let refused = execute
            .refusal_message()
            .expect("Execute refuses as kubectl does");
        assert!(refused.contains("web/scratch"), "{refused}");
        assert!(refused.contains("ci/job-runner"), "{refused}");
        let release = w.plan(&spec(json!({"mode": "Release"})));
        assert_eq!(release.refusal_message(), None);
        assert!(
            !release.backups.is_empty(),
            "the protected pods are still backed up"
        );
    }

    #[test]
    fn pod_selector_filters_evictions_but_not_backups() {
        let plan = World::new().plan(&spec(
            json!({"drain": {"podSelector": {"matchLabels": {"app": "api"}}}}),
        ));
        assert_eq!(names(&plan.evictions), ["web/api"]);
        assert_eq!(plan.backups.len(), 2);
        assert!(
            plan.skipped
                .iter()
                .any(|s| s.name == "pg-0" && s.reason == SkipReason::NotSelected)
        );
    }

    #[test]
    fn policy_skip_needs_no_backup() {
        let plan = World::new().plan(&spec(json!({"backup": {"policy": "skip"}})));
        assert!(plan.backups.is_empty());
        assert!(
            plan.evictions[0].protected,
            "still marked protected for the record"
        );
    }

    #[test]
    fn several_pdbs_warn() {
        let mut w = World::new();
        w.pdbs.push(pdb(
            "db",
            "all-db",
            json!({"matchExpressions": [
                {"key": "app", "operator": "Exists"}
            ]}),
        ));
        let plan = w.plan(&spec(json!({})));
        assert_eq!(plan.evictions[0].pdbs, ["all-db", "pg"]);
        assert!(
            plan.warnings
                .iter()
                .any(|m| m.contains("db/pg-0 is covered by 2 PodDisruptionBudgets")),
            "{:?}",
            plan.warnings
        );
    }

    /// kubernetes `pkg/registry/core/pod/storage/eviction.go` `getPodDisruptionBudgets`: a PDB with a nil
    /// or empty selector "should match nothing, not everything", so it never makes a multi-PDB refusal.
    #[test]
    fn an_empty_selector_pdb_is_no_second_pdb() {
        let mut w = World::new();
        w.pdbs.push(pdb("db", "all-db", json!({})));
        let plan = w.plan(&spec(json!({})));
        assert_eq!(plan.evictions[0].pdbs, ["pg"]);
        assert!(plan.warnings.is_empty(), "{:?}", plan.warnings);
    }

    #[test]
    fn pods_tolerating_the_drain_taint_are_never_evicted() {
        let mut w = World::new();
        w.pods.push(with(
            deploy_pod("web", "everywhere"),
            json!({"spec": {"tolerations": [{"operator": "Exists"}]}}),
        ));
        w.pods.push(with(
            ds_pod("kube-system", "aws-node", Some("system-node-critical")),
            json!({"spec": {"tolerations": [{"operator": "Exists"}]}}),
        ));
        let plan = w.plan(&spec(json!({"drain": {"ignoreDaemonSets": false}})));
        let evicted = names(&plan.evictions);
        assert!(!evicted.contains(&"web/everywhere".to_owned()));
        assert!(!evicted.contains(&"kube-system/aws-node".to_owned()));
        assert!(
            evicted.contains(&"kube-system/node-agent".to_owned()),
            "a DaemonSet pod without such a toleration is evicted when not ignored"
        );
        assert!(
            plan.skipped
                .iter()
                .any(|s| s.name == "everywhere" && s.reason == SkipReason::ToleratesDrainTaint)
        );
        assert!(
            plan.warnings
                .iter()
                .any(|m| m.contains("web/everywhere tolerates the snapdrain.io/draining taint")),
            "{:?}",
            plan.warnings
        );
    }

    #[test]
    fn bare_pods_are_refused_with_kubectl_wording_unless_forced() {
        let mut w = World::new();
        w.pods.push(with(
            deploy_pod("web", "debug"),
            json!({"metadata": {"ownerReferences": []}}),
        ));
        let plan = w.plan(&spec(json!({})));
        let msg = plan.refusal_message().expect("refused");
        assert!(
            msg.starts_with(
                "cannot delete Pods that declare no controller (use --force to override): web/debug"
            ),
            "{msg}"
        );
        assert!(msg.contains("spec.drain.force: true"), "{msg}");
        assert!(!names(&plan.evictions).contains(&"web/debug".to_owned()));
        let forced = w.plan(&spec(json!({"drain": {"force": true}})));
        assert_eq!(forced.refusal_message(), None);
        assert!(names(&forced.evictions).contains(&"web/debug".to_owned()));
    }

    #[test]
    fn do_not_disrupt_pods_are_reported_and_held_unless_forced() {
        let mut w = World::new();
        w.pods.push(with(
            deploy_pod("web", "training"),
            json!({"metadata": {"annotations": {"karpenter.sh/do-not-disrupt": "true"}}}),
        ));
        let plan = w.plan(&spec(json!({})));
        let e = plan
            .evictions
            .iter()
            .find(|e| e.name == "training")
            .expect("planned");
        assert!(e.do_not_disrupt);
        assert!(
            plan.warnings
                .iter()
                .any(|m| m.contains("web/training has an active karpenter.sh/do-not-disrupt")),
            "{:?}",
            plan.warnings
        );
        let forced = w.plan(&spec(json!({"drain": {"force": true}})));
        assert!(forced.evictions.iter().all(|e| !e.do_not_disrupt));
    }

    #[test]
    fn unknown_statefulset_falls_back_to_pod_name_and_missing_pvc_warns() {
        let mut w = World::new();
        w.sts
            .retain(|s| s.metadata.name.as_deref() != Some("rabbit"));
        w.pvcs
            .retain(|p| p.metadata.name.as_deref() != Some("data-rabbit-2"));
        let plan = w.plan(&spec(json!({})));
        let mq = &plan.backups[1];
        assert_eq!(
            serde_json::to_value(&mq.or_label_selectors).expect("json"),
            json!([{"matchLabels": {"statefulset.kubernetes.io/pod-name": "rabbit-2"}}])
        );
        assert_eq!(mq.pvcs, ["data-rabbit-2"]);
        assert!(
            plan.warnings
                .iter()
                .any(|m| m.contains("StatefulSet mq/rabbit"))
        );
        assert!(
            plan.warnings
                .iter()
                .any(|m| m.contains("PVC data-rabbit-2"))
        );
    }

    #[test]
    fn fresh_backup_is_reused() {
        let mut w = World::new();
        let started: Timestamp = "2026-05-20T09:30:00Z".parse().expect("ts");
        w.existing.push(ReusableBackup {
            name: "nightly-db".into(),
            storage_location: "default".into(),
            namespace: "db".into(),
            pvcs: vec![
                "aof-redis-1".into(),
                "data-pg-0".into(),
                "data-redis-1".into(),
            ],
            phase: Some("Completed".into()),
            verified: true,
            started_at: Some(started),
        });
        assert_eq!(
            w.plan(&spec(json!({}))).backups[0].reuse,
            None,
            "before the decision, no window"
        );
        let plan = w.plan(&spec(
            json!({"backup": {"reuseIfNewerThan": "1h", "storageLocation": "default"}}),
        ));
        assert_eq!(plan.backups[0].reuse.as_deref(), Some("nightly-db"));
        assert_eq!(plan.backups[1].reuse, None);
    }

    #[test]
    fn plans_a_full_node() {
        let mut w = World::new();
        for i in 0..100 {
            w.pods
                .push(deploy_pod(&format!("ns{}", i % 10), &format!("app-{i}")));
            w.pdbs.push(pdb(
                &format!("ns{}", i % 10),
                &format!("pdb-{i}"),
                json!({"matchLabels": {"app": format!("app-{i}")}}),
            ));
        }
        let s = spec(json!({}));
        let plan = w.plan(&s);
        assert_eq!(plan.evictions.len(), 106);
    }
}
