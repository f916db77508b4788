//! The termination finalizer of a deleted NodeClaim: taint, tiered drain through the eviction API
//! (429 → per-pod backoff 100 ms → 10 s), do-not-disrupt pods held until the termination grace
//! period, wait for VolumeAttachments, terminate the instance, then release the Node and NodeClaim.
//!
//! Past `terminationTime − pod grace` a pod is DELETEd through the API instead, whatever its tier, PDB or
//! do-not-disrupt (kubernetes-sigs/karpenter `pkg/controllers/node/termination/terminator/terminator.go`
//! `Drain`: "deleteEligible ... across ALL tiers immediately"; `terminator/eviction.go` `needsForceDelete`,
//! `forceDelete`: `gracePeriodSeconds = max(terminationTime − now, 1)`, the pod's uid as a precondition).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::time::Instant;

use super::disruption::{do_not_disrupt, is_daemonset_pod};
use super::{
    DISRUPTED_TAINT, KarpenterConfig, KarpenterError, TERMINATION_TIMESTAMP, add_finalizer,
    condition_true, modify_claim, modify_node, node_of, nodeclaims, pods_on, remove_finalizer,
    set_condition,
};
use crate::apiserver::meta::meta_str;
use crate::apiserver::objects::ATTACHMENT_NODE;
use crate::apiserver::resources::ResKey;
use crate::apiserver::store::DeleteOptions;
use crate::world::objects::node_ready;
use crate::world::{WorldContext, go_duration};

const MIN_BACKOFF: Duration = Duration::from_millis(100);
const MAX_BACKOFF: Duration = Duration::from_secs(10);

fn rfc3339(t: jiff::Timestamp) -> String {
    t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}

/// The drain order: non-critical non-DaemonSet, non-critical DaemonSet, critical non-DaemonSet,
/// critical DaemonSet.
fn tier(p: &Value) -> u8 {
    let critical = matches!(
        p.pointer("/spec/priorityClassName").and_then(Value::as_str),
        Some("system-cluster-critical" | "system-node-critical")
    );
    u8::from(critical) * 2 + u8::from(is_daemonset_pod(p))
}

fn tolerates_disrupted(p: &Value) -> bool {
    p.pointer("/spec/tolerations")
        .and_then(Value::as_array)
        .is_some_and(|ts| {
            ts.iter().any(|t| {
                t["key"] == DISRUPTED_TAINT
                    || (t.get("key").is_none_or(|k| k == "") && t["operator"] == "Exists")
            })
        })
}

fn termination_time(claim: &Value) -> Option<jiff::Timestamp> {
    claim
        .pointer(&format!(
            "/metadata/annotations/{}",
            TERMINATION_TIMESTAMP.replace('/', "~1")
        ))
        .and_then(Value::as_str)?
        .parse()
        .ok()
}

struct Backoff {
    next: Instant,
    delay: Duration,
}

/// The Node is not Ready and the cloud no longer finds its instance (an error asking counts as found:
/// Karpenter requeues).
async fn instance_gone(config: &KarpenterConfig, node: &Value, claim: &Value) -> bool {
    if node_ready(node) {
        return false;
    }
    let Some(id) = instance_id(claim).filter(|id| !id.is_empty()) else {
        return false;
    };
    matches!(config.cloud.exists(id).await, Ok(false))
}

/// The instance id of the claim's `status.providerID` (`aws:///<zone>/<id>`).
fn instance_id(claim: &Value) -> Option<&str> {
    claim
        .pointer("/status/providerID")
        .and_then(Value::as_str)
        .and_then(|p| p.rsplit('/').next())
}

/// Drives one deleting NodeClaim to the end of its finalizer.
pub(super) async fn terminate(ctx: Arc<WorldContext>, config: Arc<KarpenterConfig>, name: String) {
    if let Err(e) = run(&ctx, &config, &name).await {
        tracing::warn!(nodeclaim = %name, error = %e, "karpenter sim: termination failed");
    }
}

async fn run(
    ctx: &WorldContext,
    config: &KarpenterConfig,
    name: &str,
) -> Result<(), KarpenterError> {
    let mut backoff: HashMap<String, Backoff> = HashMap::new();
    let mut volumes: HashSet<String> = HashSet::new();
    loop {
        let Some(claim) = ctx.store.get(&nodeclaims(), None, name) else {
            return Ok(());
        };
        // The termination timestamp: deletionTimestamp + terminationGracePeriod.
        if termination_time(&claim).is_none()
            && let (Some(tgp), Some(del)) = (
                claim
                    .pointer("/spec/terminationGracePeriod")
                    .and_then(Value::as_str)
                    .and_then(go_duration),
                meta_str(&claim, "deletionTimestamp")
                    .and_then(|d| d.parse::<jiff::Timestamp>().ok()),
            )
        {
            let at = rfc3339(del + jiff::SignedDuration::try_from(tgp).unwrap_or_default());
            modify_claim(ctx, name, |v| {
                if !v["metadata"]["annotations"].is_object() {
                    v["metadata"]["annotations"] = json!({});
                }
                v["metadata"]["annotations"][TERMINATION_TIMESTAMP] = json!(at);
            })?;
            continue;
        }
        let deadline = termination_time(&claim);
        let tgp_elapsed = deadline.is_some_and(|d| jiff::Timestamp::now() >= d);
        let node = node_of(ctx, &claim);
        if let Some(node) = &node
            && instance_gone(config, node, &claim).await
        {
            // Nothing is left to drain gracefully: the Node's finalizer goes at once, whatever its
            // pods (kubernetes-sigs/karpenter `pkg/controllers/node/termination/controller.go`: a Node
            // not Ready whose instance the cloud provider no longer finds). A pod that holds the drain
            // (do-not-disrupt without a terminationGracePeriod) would otherwise keep a dead Node for
            // good, and with it the pods bound to it (the pod garbage collector takes them once it goes).
            let node_name = meta_str(node, "name").unwrap_or("");
            let _ = modify_node(ctx, node_name, remove_finalizer);
            ctx.audit.world(
                "finalizer-removed",
                "nodes",
                None,
                Some(node_name),
                json!({"nodeclaim": name, "reason": "not Ready and its instance is gone"}),
            );
        } else if let Some(node) = &node {
            let node_name = meta_str(node, "name").unwrap_or("").to_string();
            prepare_node(ctx, node, &node_name)?;
            // awaitDrain
            let drainable: Vec<Arc<Value>> = pods_on(ctx, &node_name)
                .into_iter()
                .filter(|p| !tolerates_disrupted(p))
                .collect();
            for p in &drainable {
                volumes.extend(pvs_of(ctx, p));
            }
            if !drainable.is_empty() {
                if !condition_true(&claim, "Drained") {
                    modify_claim(ctx, name, |v| {
                        set_condition(v, "Drained", "Unknown", "Draining", "Draining")
                    })?;
                }
                let now = jiff::Timestamp::now();
                let (due, graceful): (Vec<&Arc<Value>>, Vec<&Arc<Value>>) = drainable
                    .iter()
                    .partition(|p| needs_force_delete(p, deadline, now));
                for p in due {
                    if let Some(deadline) = deadline {
                        force_delete(ctx, config, p, deadline).await;
                    }
                }
                let first = graceful.iter().map(|p| tier(p)).min().unwrap_or(0);
                for p in graceful.into_iter().filter(|p| tier(p) == first) {
                    drain_pod(ctx, config, p, &mut backoff).await;
                }
                tokio::time::sleep(config.requeue).await;
                continue;
            }
            if !condition_true(&claim, "Drained") {
                modify_claim(ctx, name, |v| {
                    set_condition(v, "Drained", "True", "Drained", "")
                })?;
                ctx.audit.world(
                    "drained",
                    "nodes",
                    None,
                    Some(&node_name),
                    json!({"nodeclaim": name}),
                );
            }
            // awaitVolumeDetachment
            let attached = attachments(ctx, &node_name, &volumes);
            if !attached.is_empty() && !tgp_elapsed {
                modify_claim(ctx, name, |v| {
                    set_condition(
                        v,
                        "VolumesDetached",
                        "Unknown",
                        "AwaitingVolumeDetachment",
                        "AwaitingVolumeDetachment",
                    )
                })?;
                tokio::time::sleep(config.requeue).await;
                continue;
            }
            let (status, reason) = if attached.is_empty() {
                ("True", "VolumesDetached")
            } else {
                ("False", "TerminationGracePeriodElapsed")
            };
            modify_claim(ctx, name, |v| {
                set_condition(v, "VolumesDetached", status, reason, "")
            })?;
        }
        // awaitInstanceTermination
        if let Some(id) = instance_id(&claim).map(str::to_string) {
            config
                .cloud
                .terminate(&id)
                .await
                .map_err(|message| KarpenterError::Terminate {
                    instance: id.clone(),
                    message,
                })?;
            modify_claim(ctx, name, |v| {
                set_condition(v, "InstanceTerminating", "True", "InstanceTerminating", "")
            })?;
            ctx.audit.world(
                "instance-terminate",
                "nodeclaims.karpenter.sh",
                None,
                Some(name),
                json!({"instance": id}),
            );
        }
        if let Some(node) = &node {
            let node_name = meta_str(node, "name").unwrap_or("");
            let _ = modify_node(ctx, node_name, remove_finalizer);
        }
        let _ = modify_claim(ctx, name, remove_finalizer);
        ctx.audit.world(
            "nodeclaim-terminated",
            "nodeclaims.karpenter.sh",
            None,
            Some(name),
            json!({"node": node.as_ref().and_then(|n| meta_str(n, "name"))}),
        );
        return Ok(());
    }
}

/// Taint, exclusion label and deletion of the Node (its finalizer keeps it until the end).
fn prepare_node(ctx: &WorldContext, node: &Value, node_name: &str) -> Result<(), KarpenterError> {
    let tainted = node
        .pointer("/spec/taints")
        .and_then(Value::as_array)
        .is_some_and(|t| t.iter().any(|t| t["key"] == DISRUPTED_TAINT));
    let labelled = node
        .pointer("/metadata/labels/node.kubernetes.io~1exclude-from-external-load-balancers")
        .is_some();
    if !tainted || !labelled {
        modify_node(ctx, node_name, |v| {
            if !v["spec"]["taints"].is_array() {
                v["spec"]["taints"] = json!([]);
            }
            if let Some(t) = v["spec"]["taints"].as_array_mut()
                && !t.iter().any(|t| t["key"] == DISRUPTED_TAINT)
            {
                t.push(json!({"key": DISRUPTED_TAINT, "effect": "NoSchedule"}));
            }
            v["metadata"]["labels"]["node.kubernetes.io/exclude-from-external-load-balancers"] =
                json!("karpenter");
            if v.pointer("/metadata/deletionTimestamp").is_none() {
                add_finalizer(v);
            }
        })?;
    }
    if node.pointer("/metadata/deletionTimestamp").is_none() {
        let _ = ctx.store.delete(
            &ResKey::core("nodes"),
            None,
            node_name,
            &DeleteOptions::default(),
        );
    }
    Ok(())
}

fn pvs_of(ctx: &WorldContext, pod: &Value) -> Vec<String> {
    let ns = meta_str(pod, "namespace").unwrap_or("");
    pod.pointer("/spec/volumes")
        .and_then(Value::as_array)
        .map(|vs| {
            vs.iter()
                .filter_map(|v| v.pointer("/persistentVolumeClaim/claimName")?.as_str())
                .filter_map(|c| {
                    ctx.store
                        .get(&ResKey::core("persistentvolumeclaims"), Some(ns), c)
                })
                .filter_map(|pvc| {
                    pvc.pointer("/spec/volumeName")?
                        .as_str()
                        .map(str::to_string)
                })
                .collect()
        })
        .unwrap_or_default()
}

fn attachments(ctx: &WorldContext, node: &str, pvs: &HashSet<String>) -> Vec<String> {
    ctx.store
        .by_field(
            &ResKey::new("storage.k8s.io", "volumeattachments"),
            ATTACHMENT_NODE,
            node,
        )
        .iter()
        .filter(|va| {
            va.pointer("/spec/source/persistentVolumeName")
                .and_then(Value::as_str)
                .is_some_and(|pv| pvs.contains(pv))
        })
        .filter_map(|va| meta_str(va, "name").map(str::to_string))
        .collect()
}

/// A pod's `terminationGracePeriodSeconds`; kube-apiserver defaults an unset one to 30.
fn grace_of(pod: &Value) -> i64 {
    pod.pointer("/spec/terminationGracePeriodSeconds")
        .and_then(Value::as_i64)
        .unwrap_or(30)
}

/// Karpenter's `needsForceDelete`: the node terminates at `deadline` and the pod's own grace would
/// run past it. A terminating pod is left to finish.
fn needs_force_delete(
    pod: &Value,
    deadline: Option<jiff::Timestamp>,
    now: jiff::Timestamp,
) -> bool {
    let Some(deadline) = deadline else {
        return false;
    };
    if pod.pointer("/metadata/deletionTimestamp").is_some() {
        return false;
    }
    now > deadline - jiff::SignedDuration::from_secs(grace_of(pod))
}

/// The grace Karpenter's `forceDelete` gives: what is left until the node's termination, at least 1 s
/// (0 would remove the pod from etcd at once).
fn force_delete_grace(deadline: jiff::Timestamp, now: jiff::Timestamp) -> i64 {
    deadline.duration_since(now).as_secs().max(1)
}

/// DELETEs the pod through the API server as Karpenter's `forceDelete` does: no eviction, so neither a
/// PDB nor an admission webhook on `pods/eviction` sees it.
async fn force_delete(
    ctx: &WorldContext,
    config: &KarpenterConfig,
    pod: &Value,
    deadline: jiff::Timestamp,
) {
    let ns = meta_str(pod, "namespace").unwrap_or("").to_string();
    let name = meta_str(pod, "name").unwrap_or("").to_string();
    let uid = meta_str(pod, "uid").unwrap_or("").to_string();
    let grace = force_delete_grace(deadline, jiff::Timestamp::now());
    let params = kube::api::DeleteParams {
        grace_period_seconds: u32::try_from(grace).ok(),
        preconditions: Some(kube::api::Preconditions {
            uid: Some(uid),
            resource_version: None,
        }),
        ..Default::default()
    };
    let api: kube::Api<k8s_openapi::api::core::v1::Pod> =
        kube::Api::namespaced(config.client.clone(), &ns);
    let code = match api.delete(&name, &params).await {
        Ok(_) => 200,
        Err(kube::Error::Api(s)) => s.code,
        Err(e) => {
            tracing::warn!(pod = %format!("{ns}/{name}"), error = %e, "karpenter sim: force-delete failed");
            0
        }
    };
    ctx.audit.world(
        "pod-deleted",
        "pods",
        Some(&ns),
        Some(&name),
        json!({"reason": "TerminationGracePeriodExpiring", "code": code, "gracePeriodSeconds": grace}),
    );
}

/// Evicts one pod through the eviction API (a do-not-disrupt pod waits for [`force_delete`]).
async fn drain_pod(
    ctx: &WorldContext,
    config: &KarpenterConfig,
    pod: &Value,
    backoff: &mut HashMap<String, Backoff>,
) {
    if pod.pointer("/metadata/deletionTimestamp").is_some() {
        return;
    }
    let ns = meta_str(pod, "namespace").unwrap_or("").to_string();
    let name = meta_str(pod, "name").unwrap_or("").to_string();
    let uid = meta_str(pod, "uid").unwrap_or("").to_string();
    if do_not_disrupt(pod) {
        return;
    }
    let now = Instant::now();
    if backoff.get(&uid).is_some_and(|b| b.next > now) {
        return;
    }
    let (code, message) = super::evict::evict(&config.client, &ns, &name, &uid).await;
    ctx.audit.world(
        "eviction-attempt",
        "pods",
        Some(&ns),
        Some(&name),
        json!({"code": code, "message": message, "by": "karpenter"}),
    );
    match code {
        201 | 200 | 404 | 409 => {
            backoff.remove(&uid);
        }
        _ => {
            // 429 (PDB), the multiple-PDB 500 and anything else: retry with exponential backoff.
            let delay = backoff
                .get(&uid)
                .map_or(MIN_BACKOFF, |b| (b.delay * 2).min(MAX_BACKOFF));
            backoff.insert(
                uid,
                Backoff {
                    next: now + delay,
                    delay,
                },
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(grace: Option<i64>, terminating: bool) -> Value {
        let mut p = json!({"metadata": {"name": "pg-0", "namespace": "db"}, "spec": {}});
        if let Some(g) = grace {
            p["spec"]["terminationGracePeriodSeconds"] = json!(g);
        }
        if terminating {
            p["metadata"]["deletionTimestamp"] = json!("2026-12-01T12:00:00Z");
        }
        p
    }

    fn at(t: &str) -> jiff::Timestamp {
        t.parse().expect("a test time")
    }

    #[test]
    fn a_pod_is_force_deleted_once_its_grace_would_outlast_the_node() {
        let end = Some(at("2026-12-01T12:10:00Z"));
        // 60 s grace: deleted after 12:09:00, not at or before it.
        assert!(!needs_force_delete(
            &pod(Some(60), false),
            end,
            at("2026-12-01T12:09:00Z")
        ));
        assert!(needs_force_delete(
            &pod(Some(60), false),
            end,
            at("2026-12-01T12:09:00.5Z")
        ));
        // No grace set: the API server's 30 s.
        assert!(!needs_force_delete(
            &pod(None, false),
            end,
            at("2026-12-01T12:09:20Z")
        ));
        assert!(needs_force_delete(
            &pod(None, false),
            end,
            at("2026-12-01T12:09:31Z")
        ));
        // No termination time (no terminationGracePeriod): never; a terminating pod is left to finish.
        assert!(!needs_force_delete(
            &pod(Some(60), false),
            None,
            at("2026-12-01T13:00:00Z")
        ));
        assert!(!needs_force_delete(
            &pod(Some(60), true),
            end,
            at("2026-12-01T13:00:00Z")
        ));
    }

    #[test]
    fn the_force_delete_grace_is_what_is_left_and_at_least_a_second() {
        let end = at("2026-12-01T12:10:00Z");
        assert_eq!(force_delete_grace(end, at("2026-12-01T12:09:15Z")), 45);
        assert_eq!(force_delete_grace(end, at("2026-12-01T12:10:00Z")), 1);
        assert_eq!(force_delete_grace(end, at("2026-12-01T12:20:00Z")), 1);
    }
}
