//! What is dropped from an object before it is cached. Pods are cached as [`super::CachedPod`], which
//! keeps metadata (labels, the annotations decisions read, owners, deletion, resourceVersion), `spec.nodeName`,
//! `spec.volumes` (their PVC claim and emptyDir), the tolerations of the drain taint, `spec.priorityClassName`,
//! `spec.priority`, `spec.terminationGracePeriodSeconds`, `status.phase` and `status.startTime`; the other kinds lose managedFields and what
//! the functions below say. Every field a decision reads stays: planning (`planning::inventory`,
//! `planning::node`, `planning::taint`, `planning::protection`), the drain step, the hold keeper, the
//! signal watcher and the gate's decision. The tests below run those decisions on trimmed and untrimmed
//! objects and compare; a field read by new code must be kept here or in `CachedPod`.
//!
//! A cached object is never written back: writes are patches of a few keys guarded by the cached
//! resourceVersion (the hold annotations), so a trimmed field can never be lost on the server.

use k8s_openapi::api::core::v1::{Namespace, Node, NodeCondition, NodeStatus};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

/// Written by `kubectl apply`: a copy of the whole object, read by nothing in snapdrain.
pub(super) const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

fn meta(m: &mut ObjectMeta) {
    m.managed_fields = None;
    if let Some(a) = m.annotations.as_mut() {
        a.remove(LAST_APPLIED);
    }
}

/// Keeps metadata with the annotations decisions read (the holds', as a pod's: snapdrain's, Karpenter's,
/// Cluster Autoscaler's), the spec (providerID, taints, unschedulable) and the Ready condition's type and
/// status (a replacement is ready at Ready=True, `controller::step`). The rest of a Node's status is what
/// no decision reads and most of its size: every image it pulled, system info, capacity and allocatable,
/// addresses, attached volumes, the other conditions and every condition's reason, message and times
/// (at scale-5k the soak's controller started about 10 MiB smaller without the kubelet's conditions and
/// the CSI/TTL annotations of 5,000 nodes).
pub fn node(n: &mut Node) {
    meta(&mut n.metadata);
    if let Some(a) = n.metadata.annotations.as_mut() {
        a.retain(|k, _| super::pod::read_annotation(k));
    }
    if let Some(status) = n.status.as_mut() {
        let ready = status
            .conditions
            .take()
            .into_iter()
            .flatten()
            .filter(|c| c.type_ == "Ready")
            .map(|c| NodeCondition {
                type_: c.type_,
                status: c.status,
                ..NodeCondition::default()
            })
            .collect::<Vec<_>>();
        *status = NodeStatus {
            conditions: Some(ready).filter(|c| !c.is_empty()),
            ..NodeStatus::default()
        };
    }
}

pub fn pdb(p: &mut PodDisruptionBudget) {
    meta(&mut p.metadata);
}

pub fn namespace(n: &mut Namespace) {
    meta(&mut n.metadata);
}

/// Velero Backups snapdrain made: the eviction gate (`webhook::confirm`) reads their names, labels,
/// the plan annotation, `spec.includedNamespaces` and `status.phase`; hooks and selectors go.
pub fn backup(b: &mut crate::api::velero::Backup) {
    meta(&mut b.metadata);
    b.spec.hooks = None;
    b.spec.or_label_selectors.clear();
    b.spec.label_selector = None;
}

/// The eviction gate's copy of a plan (every replica holds every plan, finished ones included, for the
/// policy's history): what `webhook::decision` and `webhook::confirm` read stays (the spec's nodes, mode,
/// deadline and backup settings; the status's phase and its start, nodes, backups' names, namespaces,
/// claims, verification and abandonment, released pods, emergency snapshots, the release). What goes is
/// what only a person or the leader reads, and most of a finished plan's size: each backup's verified
/// objects and volume notes, conditions, messages, step timings, the summary, the join and launch
/// records. Only the gate's read-only copy is trimmed: the leader reconciles from whole plans.
pub fn plan_for_gate(p: &mut crate::api::DisruptionPlan) {
    meta(&mut p.metadata);
    p.spec.replacement = None;
    if let Some(s) = p.status.as_mut() {
        s.conditions.clear();
        s.join = None;
        s.node_class = None;
        s.message = None;
        s.step_timings.clear();
        s.summary = None;
        for b in &mut s.backups {
            b.verified_objects.clear();
            // The gate reads only the CSI snapshot cuts (a release at the snapshot), not the rest.
            b.volumes.retain(|v| v.snapshot.is_some());
            for v in &mut b.volumes {
                v.reason.clear();
                v.source = None;
                v.snapshot_class = None;
            }
            b.message = None;
            b.verification_error = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::LAST_APPLIED;
    use crate::planning::inventory::fixtures::*;
    use crate::planning::inventory::{is_critical, is_terminal, pvc_claims};
    use crate::planning::taint::tolerates_drain_taint;
    use crate::planning::{Clock, NodeInputs, plan_node};
    use k8s_openapi::api::apps::v1::StatefulSet;
    use k8s_openapi::api::core::v1::{Node, Pod};
    use kube::api::DynamicObject;
    use serde_json::json;

    /// A pod as the API server returns it: the fixture plus what real pods carry.
    fn full(p: Pod, extra: serde_json::Value) -> Pod {
        let mut p = with(
            p,
            json!({
                "metadata": {
                    "resourceVersion": "42",
                    "managedFields": [{"manager": "kubelet", "operation": "Update", "apiVersion": "v1"}],
                    "annotations": {LAST_APPLIED: "{}", "checksum/config": "9f2c"}
                },
                "spec": {
                    "containers": [{"name": "main", "image": "postgres:17",
                                    "env": [{"name": "PGDATA", "value": "/data"}]}],
                    "serviceAccountName": "db",
                    "terminationGracePeriodSeconds": 120,
                    "tolerations": [{"key": "node.kubernetes.io/not-ready", "operator": "Exists",
                                     "effect": "NoExecute", "tolerationSeconds": 300}],
                    "nodeSelector": {"zone": "a"}
                },
                "status": {"conditions": [{"type": "Ready", "status": "True"}],
                           "podIP": "10.0.0.1", "startTime": "2026-05-20T09:00:00Z"}
            }),
        );
        if !extra.is_null() {
            p = with(p, extra);
        }
        p
    }

    /// The pod as the cache holds it: decoded from its JSON into a CachedPod, and back.
    fn trimmed(p: &Pod) -> Pod {
        let json = serde_json::to_value(p).expect("a Pod serializes");
        serde_json::from_value::<super::super::CachedPod>(json)
            .expect("a Pod's JSON decodes as a CachedPod")
            .to_pod()
    }

    fn pods() -> Vec<Pod> {
        vec![
            full(sts_pod("db", "pg", 0, &["data"]), json!(null)),
            full(
                sts_pod("db", "redis", 1, &["data", "aof"]),
                json!({"spec": {"volumes": [
                    {"name": "data", "persistentVolumeClaim": {"claimName": "data-redis-1"}},
                    {"name": "aof", "persistentVolumeClaim": {"claimName": "aof-redis-1", "readOnly": true}},
                    {"name": "cfg", "configMap": {"name": "redis"}},
                    {"name": "tmp", "emptyDir": {}}
                ]}}),
            ),
            full(
                deploy_pod("web", "api"),
                json!({"spec": {"tolerations": [{"operator": "Exists"}]}}),
            ),
            full(
                ds_pod("kube-system", "cni", Some("system-node-critical")),
                json!({"spec": {"priority": 2000001000}}),
            ),
            full(
                deploy_pod("web", "pinned"),
                json!({"metadata": {"annotations": {"karpenter.sh/do-not-disrupt": "true"}}}),
            ),
            full(
                deploy_pod("web", "held"),
                json!({"metadata": {"annotations": {
                    "karpenter.sh/do-not-disrupt": "true",
                    "cluster-autoscaler.kubernetes.io/safe-to-evict": "false",
                    "snapdrain.io/held": "do-not-disrupt,safe-to-evict"
                }}}),
            ),
            full(
                deploy_pod("kube-system", "etcd-n1"),
                json!({"metadata": {"annotations": {"kubernetes.io/config.mirror": "abc"}}}),
            ),
            full(
                deploy_pod("batch", "job-1"),
                json!({"status": {"phase": "Succeeded"}}),
            ),
        ]
    }

    #[test]
    fn a_trimmed_node_keeps_its_spec_labels_and_conditions() {
        let mut n: Node = serde_json::from_value(json!({
            "metadata": {"name": "ip-10-0-1-7", "labels": {"karpenter.sh/nodepool": "default"},
                         "annotations": {"karpenter.sh/do-not-disrupt": "true", "snapdrain.io/held": "do-not-disrupt",
                                         "cluster-autoscaler.kubernetes.io/scale-down-disabled": "true",
                                         "node.alpha.kubernetes.io/ttl": "0",
                                         "csi.volume.kubernetes.io/nodeid": "{\"ebs.csi.aws.com\":\"i-0abc\"}"},
                         "managedFields": [{"manager": "kubelet"}]},
            "spec": {"providerID": "aws:///us-east-1a/i-0abc", "unschedulable": true,
                     "taints": [{"key": "snapdrain.io/draining", "effect": "NoSchedule"}]},
            "status": {
                "conditions": [
                    {"type": "MemoryPressure", "status": "False", "reason": "KubeletHasSufficientMemory",
                     "lastHeartbeatTime": "2026-12-01T10:00:00Z", "lastTransitionTime": "2026-12-01T09:00:00Z"},
                    {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "kubelet is posting ready status",
                     "lastHeartbeatTime": "2026-12-01T10:00:00Z", "lastTransitionTime": "2026-12-01T09:00:00Z"}],
                "images": [{"names": ["public.ecr.aws/karpenter/controller:1.8.0"], "sizeBytes": 1}],
                "nodeInfo": {"machineID": "m", "systemUUID": "s", "bootID": "b", "kernelVersion": "6.1",
                             "osImage": "Bottlerocket OS 1.50.0", "containerRuntimeVersion": "containerd://2.0",
                             "kubeletVersion": "v1.35.0", "kubeProxyVersion": "", "operatingSystem": "linux",
                             "architecture": "amd64"},
                "capacity": {"cpu": "16", "memory": "64Gi"},
                "addresses": [{"type": "InternalIP", "address": "10.0.1.7"}]
            }
        }))
        .expect("a node");
        let before = n.clone();
        super::node(&mut n);
        assert_eq!(n.spec, before.spec);
        assert_eq!(n.metadata.labels, before.metadata.labels);
        assert!(n.metadata.managed_fields.is_none());
        let annotations: Vec<&str> = n
            .metadata
            .annotations
            .iter()
            .flatten()
            .map(|(k, _)| k.as_str())
            .collect();
        assert_eq!(
            annotations,
            [
                "cluster-autoscaler.kubernetes.io/scale-down-disabled",
                "karpenter.sh/do-not-disrupt",
                "snapdrain.io/held"
            ],
            "the holds' annotations stay, the kubelet's and the CSI driver's go"
        );
        let status = n.status.expect("the status stays");
        let conditions: Vec<(&str, &str)> = status
            .conditions
            .iter()
            .flatten()
            .map(|c| (c.type_.as_str(), c.status.as_str()))
            .collect();
        assert_eq!(
            conditions,
            [("Ready", "True")],
            "Ready is read of a replacement"
        );
        assert!(
            status
                .conditions
                .iter()
                .flatten()
                .all(|c| c.message.is_none()
                    && c.reason.is_none()
                    && c.last_heartbeat_time.is_none())
        );
        assert!(status.images.is_none() && status.node_info.is_none());
        assert!(status.capacity.is_none() && status.addresses.is_none());
    }

    #[test]
    fn a_pod_the_hold_keeper_skips_has_nothing_for_it_to_do() {
        let released = full(
            deploy_pod("web", "was-held"),
            json!({"metadata": {"annotations": {"snapdrain.io/released-by": "plan-1"}}}),
        );
        let mut skipped = 0;
        for p in pods().into_iter().chain([released]) {
            let json = serde_json::to_value(&p).expect("a Pod serializes");
            let cached: super::super::CachedPod =
                serde_json::from_value(json).expect("a Pod's JSON decodes as a CachedPod");
            if cached.may_be_held() {
                continue;
            }
            skipped += 1;
            let name = p.metadata.name.clone().unwrap_or_default();
            assert!(
                !crate::planning::ProtectionRule::default().protects(&p),
                "{name} is protected"
            );
            assert!(
                crate::planning::holds::remove(&p).is_none(),
                "{name} has marks to remove"
            );
        }
        assert!(skipped > 0, "some fixture pod is skipped");
    }

    #[test]
    fn a_trimmed_pod_keeps_every_field_a_decision_reads() {
        for p in pods() {
            let t = trimmed(&p);
            let claims = |p: &Pod| pvc_claims(p).map(str::to_owned).collect::<Vec<_>>();
            assert_eq!(claims(&t), claims(&p));
            assert_eq!(
                crate::planning::inventory::has_empty_dir(&t),
                crate::planning::inventory::has_empty_dir(&p)
            );
            assert_eq!(is_terminal(&t), is_terminal(&p));
            assert_eq!(is_critical(&t), is_critical(&p));
            assert_eq!(tolerates_drain_taint(&t), tolerates_drain_taint(&p));
            assert_eq!(
                crate::planning::ProtectionRule::default().protects(&t),
                crate::planning::ProtectionRule::default().protects(&p)
            );
            assert_eq!(t.metadata.labels, p.metadata.labels);
            assert_eq!(t.metadata.owner_references, p.metadata.owner_references);
            assert_eq!(t.metadata.resource_version, p.metadata.resource_version);
            assert_eq!(
                t.spec.as_ref().and_then(|s| s.node_name.clone()),
                p.spec.as_ref().and_then(|s| s.node_name.clone())
            );
            assert_eq!(
                t.status.as_ref().and_then(|s| s.start_time.clone()),
                p.status.as_ref().and_then(|s| s.start_time.clone())
            );
            assert_eq!(
                t.spec.as_ref().and_then(|s| s.priority),
                p.spec.as_ref().and_then(|s| s.priority)
            );
            assert_eq!(
                crate::signals::detect::pod_grace(&t),
                crate::signals::detect::pod_grace(&p)
            );
            assert_eq!(
                crate::planning::holds::state(&t),
                crate::planning::holds::state(&p)
            );
            assert_eq!(
                crate::planning::inventory::is_mirror(&t),
                crate::planning::inventory::is_mirror(&p)
            );
            // What goes: managedFields, the kubectl copy and annotations nothing reads, container
            // details, conditions.
            assert!(t.metadata.managed_fields.is_none());
            let annotations = t.metadata.annotations.clone().unwrap_or_default();
            assert!(!annotations.contains_key(LAST_APPLIED));
            assert!(!annotations.contains_key("checksum/config"));
            let spec = t.spec.as_ref().expect("the spec stays");
            assert!(
                spec.containers
                    .iter()
                    .all(|c| c.env.is_none() && c.image.is_none())
            );
            assert!(t.status.as_ref().is_some_and(|s| s.conditions.is_none()));
        }
    }

    #[test]
    fn a_node_planned_from_trimmed_objects_is_planned_the_same() {
        let pods = pods();
        let trimmed_pods: Vec<Pod> = pods.iter().map(trimmed).collect();
        let sts: Vec<StatefulSet> = [statefulset("db", "pg"), statefulset("db", "redis")].into();
        // As the cache keeps them (controller::cache::stateful_set) and inventory hands them to planning.
        let trimmed_sts: Vec<StatefulSet> = sts
            .iter()
            .map(|s| super::super::CachedStatefulSet::from(s.clone()).to_stateful_set())
            .collect();
        let pvcs = vec![
            pvc("db", "data-pg-0", "pv-pg-0"),
            pvc("db", "data-redis-1", "pv-redis-1"),
            pvc("db", "aof-redis-1", "pv-aof-1"),
        ];
        // As the cache keeps them (controller::cache::pvc) and inventory hands them to planning.
        let compact_pvcs: Vec<_> = pvcs
            .iter()
            .map(|c| super::super::CachedPvc::from(c.clone()).to_pvc())
            .collect();
        let pdbs = vec![pdb("db", "pg", json!({"matchLabels": {"app": "pg"}}))];
        let mut n = node("n1");
        let mut trimmed_node = n.clone();
        super::node(&mut trimmed_node);
        n.metadata.managed_fields = Some(vec![Default::default()]);
        let clock = Clock {
            decided_at: "2026-05-20T10:00:00Z".parse().expect("a valid timestamp"),
            now: "2026-05-20T10:01:00Z".parse().expect("a valid timestamp"),
        };
        for extra in [
            json!({}),
            json!({"drain": {"deleteEmptyDirData": true, "force": true}}),
            json!({"backup": {"scope": "StatefulSet"}}),
            json!({"drain": {"ignoreDaemonSets": false}}),
        ] {
            let mut spec = json!({"nodes": ["n1"]});
            if let (Some(s), Some(e)) = (spec.as_object_mut(), extra.as_object()) {
                s.extend(e.clone());
            }
            let spec: crate::api::DisruptionPlanSpec =
                serde_json::from_value(spec).expect("a valid plan spec");
            let valid = crate::api::validate(&spec).expect("a valid plan spec");
            let plan = |node: &Node, pods: &[Pod], sts: &[StatefulSet], pvcs: &[_]| {
                plan_node(
                    &NodeInputs {
                        node,
                        pods,
                        stateful_sets: sts,
                        pvcs,
                        pdbs: &pdbs,
                        pvs: &[],
                        snapshot_classes: &[],
                        existing_backups: &[],
                        protects: &crate::planning::protection::default_rule,
                    },
                    &spec,
                    &valid,
                    clock,
                )
            };
            assert_eq!(
                plan(&trimmed_node, &trimmed_pods, &trimmed_sts, &compact_pvcs),
                plan(&n, &pods, &sts, &pvcs),
                "plan spec {extra}"
            );
        }
    }

    #[test]
    fn a_trimmed_nodeclaim_gives_the_same_signals() {
        use crate::api::policy::SignalsSpec;
        use crate::signals::detect::detect;
        let node: Node = serde_json::from_value(json!({"metadata": {"name": "n1", "uid": "u1"}}))
            .expect("a test node");
        let now: jiff::Timestamp = "2026-12-01T12:00:00Z".parse().expect("valid");
        let claim = |conditions: serde_json::Value, deleting: bool| {
            let mut c = json!({
                "apiVersion": "karpenter.sh/v1", "kind": "NodeClaim",
                "metadata": {"name": "c1", "annotations": {
                    "karpenter.sh/nodeclaim-termination-timestamp": "2026-12-01T12:30:00Z"}},
                "spec": {"nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": "default"},
                         "requirements": [{"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["spot"]}]},
                "status": {"providerID": "aws:///us-east-1a/i-0123", "nodeName": "n1", "conditions": conditions,
                           "capacity": {"cpu": "16"}}
            });
            if deleting {
                c["metadata"]["deletionTimestamp"] = json!("2026-12-01T11:59:00Z");
            }
            serde_json::from_value::<DynamicObject>(c).expect("a NodeClaim")
        };
        let condition = |t: &str, s: &str| {
            json!({"type": t, "status": s, "reason": "R", "message": "m",
                   "lastTransitionTime": "2026-12-01T11:00:00Z", "observedGeneration": 1})
        };
        for (conditions, deleting) in [
            (json!([condition("Drifted", "True")]), false),
            (
                json!([condition("Drifted", "False"), condition("Ready", "True")]),
                false,
            ),
            (json!([condition("Consolidatable", "True")]), false),
            (json!([condition("Ready", "True")]), true),
            (json!(null), false),
        ] {
            let full = claim(conditions.clone(), deleting);
            let trimmed = super::super::node_claim::CachedNodeClaim::from(full.clone()).to_value();
            let as_json = |o: &DynamicObject| serde_json::to_value(o).expect("serializes");
            for signals in [
                SignalsSpec::default(),
                serde_json::from_value(json!({"consolidation": "Release"})).expect("valid"),
            ] {
                assert_eq!(
                    detect(&node, Some(&trimmed), &signals, now, || {
                        std::time::Duration::from_secs(30)
                    }),
                    detect(&node, Some(&as_json(&full)), &signals, now, || {
                        std::time::Duration::from_secs(30)
                    }),
                    "{conditions} deleting={deleting}"
                );
            }
            assert!(trimmed.get("spec").is_none());
            assert_eq!(trimmed["status"].get("providerID"), None);
            assert_eq!(
                trimmed["status"]["nodeName"], "n1",
                "the claim-change look finds its node"
            );
        }
    }

    /// The gate decides the same from its trimmed copy of a plan as from the whole plan.
    #[test]
    fn a_plan_trimmed_for_the_gate_gives_the_same_decisions() {
        use crate::api::DisruptionPlan;
        use crate::planning::inventory::ProtectionRule;
        use crate::webhook::decision::decide;
        let plan: DisruptionPlan = serde_json::from_value(json!({
            "apiVersion": "snapdrain.io/v1alpha1", "kind": "DisruptionPlan",
            "metadata": {"name": "p1", "managedFields": [{"manager": "snapdrain"}]},
            "spec": {"nodes": ["n1"], "mode": "Release", "deadline": "2026-05-20T10:02:00Z",
                     "backup": {"releaseNetworkVolumesAt": "Snapshot"},
                     "replacement": {"when": "before-drain", "instanceTypes": ["m6i.large"]}},
            "status": {"phase": "Draining", "phaseStartedAt": "2026-05-20T09:59:30.000000Z",
                "message": "draining", "stepTimings": {"BackingUp": 4.0},
                "conditions": [{"type": "Valid", "status": "True", "reason": "Valid", "message": "",
                                "lastTransitionTime": "2026-05-20T09:59:00Z"}],
                "nodes": [{"name": "n1", "phase": "Draining"}],
                "backups": [
                    {"name": "b1", "namespace": "shop", "pvcs": ["data-pg-0"], "attempt": 1, "verified": true,
                     "verifiedObjects": [{"key": "backups/b1/b1.tar.gz", "size": 10}],
                     "volumes": [{"pvc": "data-pg-0", "class": "Network", "reason": "EBS", "method": "FileSystem"}],
                     "message": "verified"},
                    {"name": "b2", "namespace": "db", "pvcs": ["data-db-0"], "attempt": 1, "verified": false},
                    {"name": "b3", "namespace": "kv", "pvcs": ["data-kv-0", "data-kv-1"], "attempt": 1,
                     "volumes": [
                        {"pvc": "data-kv-0", "class": "Network", "reason": "EBS", "method": "CsiDataMover",
                         "releaseAt": "Snapshot", "snapshot": {"volumeSnapshot": "vs0", "content": "vsc0",
                                                               "handle": "snap-0", "ready": false}},
                        {"pvc": "data-kv-1", "class": "Network", "reason": "EBS", "method": "CsiDataMover",
                         "releaseAt": "Snapshot"}]}],
                "releasedPods": [{"namespace": "web", "name": "cache-0", "uid": "c0"}]}
        }))
        .expect("a plan");
        let mut trimmed = plan.clone();
        super::plan_for_gate(&mut trimmed);
        assert!(
            trimmed.status.as_ref().expect("status").backups[0]
                .verified_objects
                .is_empty()
        );
        let now: jiff::Timestamp = "2026-05-20T10:00:00Z".parse().expect("a timestamp");
        let pod = |ns: &str, name: &str, claim: &str| -> Pod {
            serde_json::from_value(json!({
                "metadata": {"name": name, "namespace": ns, "ownerReferences": [{"apiVersion": "apps/v1",
                    "kind": "StatefulSet", "name": "s", "uid": "u", "controller": true}]},
                "spec": {"nodeName": "n1", "containers": [{"name": "c"}],
                         "volumes": [{"name": "d", "persistentVolumeClaim": {"claimName": claim}}]},
                "status": {"phase": "Running"}
            }))
            .expect("a pod")
        };
        let rule = ProtectionRule::default();
        // kv-0's claim is cut (the gate lets it go at the snapshot), kv-1's is not.
        assert!(matches!(
            decide(
                &pod("kv", "kv-0", "data-kv-0"),
                |q| rule.protects(q),
                &[&trimmed],
                |_: &DisruptionPlan, _: &crate::api::BackupRecord| Ok(()),
                now
            ),
            crate::webhook::decision::Decision::Allow(_)
        ));
        for p in [
            pod("shop", "pg-0", "data-pg-0"),
            pod("db", "db-0", "data-db-0"),
            pod("web", "cache-0", "data-cache-0"),
            pod("other", "x-0", "data-x-0"),
            pod("kv", "kv-0", "data-kv-0"),
            pod("kv", "kv-1", "data-kv-1"),
        ] {
            let ok =
                |_: &DisruptionPlan, _: &crate::api::BackupRecord| -> Result<(), String> { Ok(()) };
            assert_eq!(
                decide(&p, |q| rule.protects(q), &[&plan], ok, now),
                decide(&p, |q| rule.protects(q), &[&trimmed], ok, now),
                "{:?}",
                p.metadata.name
            );
        }
    }
}
