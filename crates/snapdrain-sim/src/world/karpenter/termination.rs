//! The termination finalizer of a deleted NodeClaim: taint, tiered drain through the eviction API
//! (429 → per-pod backoff 100 ms → 10 s), do-not-disrupt pods held until the termination grace
//! period, wait for VolumeAttachments, terminate the instance, then release the Node and NodeClaim.

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
        if let Some(node) = &node {
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
                let first = drainable.iter().map(|p| tier(p)).min().unwrap_or(0);
                for p in drainable.iter().filter(|p| tier(p) == first) {
                    drain_pod(ctx, config, p, deadline, &mut backoff).await;
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
        if let Some(pid) = claim.pointer("/status/providerID").and_then(Value::as_str) {
            let id = pid.rsplit('/').next().unwrap_or("").to_string();
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

/// Evicts one pod (or, for a do-not-disrupt pod, deletes it once the grace period runs out).
async fn drain_pod(
    ctx: &WorldContext,
    config: &KarpenterConfig,
    pod: &Value,
    deadline: Option<jiff::Timestamp>,
    backoff: &mut HashMap<String, Backoff>,
) {
    if pod.pointer("/metadata/deletionTimestamp").is_some() {
        return;
    }
    let ns = meta_str(pod, "namespace").unwrap_or("").to_string();
    let name = meta_str(pod, "name").unwrap_or("").to_string();
    let uid = meta_str(pod, "uid").unwrap_or("").to_string();
    let grace = pod
        .pointer("/spec/terminationGracePeriodSeconds")
        .and_then(Value::as_i64)
        .unwrap_or(30);
    // Past terminationTime − pod grace, pods are deleted, skipping PDBs and do-not-disrupt.
    if let Some(deadline) = deadline {
        let delete_at = deadline - jiff::SignedDuration::from_secs(grace);
        if jiff::Timestamp::now() >= delete_at {
            let left = deadline
                .duration_since(jiff::Timestamp::now())
                .as_secs()
                .max(1);
            let opts = DeleteOptions {
                grace_period_seconds: Some(left.min(grace)),
                precondition_uid: Some(uid),
                ..Default::default()
            };
            let _ = ctx
                .store
                .delete(&ResKey::core("pods"), Some(&ns), &name, &opts);
            ctx.audit.world(
                "pod-deleted",
                "pods",
                Some(&ns),
                Some(&name),
                json!({"reason": "TerminationGracePeriodExpiring"}),
            );
            return;
        }
    }
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
