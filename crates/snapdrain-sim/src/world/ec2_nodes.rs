//! EC2 instances joining the cluster: a booted instance becomes a Ready Node (as a Bottlerocket host's
//! kubelet registers itself), a terminated one goes NotReady and is removed.
//!
//! The instance events come from the EC2 simulator; [`InstanceChange`] is the part of them a Node
//! needs, so this module does not depend on how the simulator represents instances.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde_json::{Value, json};
use tokio::sync::broadcast;

use super::WorldContext;
use crate::apiserver::meta::now_rfc3339;
use crate::apiserver::resources::ResKey;
use crate::apiserver::store::{DeleteOptions, WriteOptions};

/// Annotation carrying the kernel sysctls the host applied from its user data (JSON object).
pub const SYSCTLS_ANNOTATION: &str = "sim.snapdrain.io/sysctls";

/// What a Node is made from.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct BootedInstance {
    pub id: String,
    pub instance_type: String,
    pub zone: String,
    pub private_dns_name: String,
    pub image_id: String,
    pub spot: bool,
    /// `settings.kubernetes.node-labels`.
    pub node_labels: BTreeMap<String, String>,
    /// `settings.kubernetes.node-taints` as (key, value, effect).
    pub node_taints: Vec<(String, String, String)>,
    /// `settings.kernel.sysctl`.
    pub sysctls: BTreeMap<String, String>,
}

impl BootedInstance {
    pub fn provider_id(&self) -> String {
        format!("aws:///{}/{}", self.zone, self.id)
    }
}

#[derive(Clone, Debug, PartialEq)]
pub enum InstanceChange {
    Booted(BootedInstance),
    BootFailed { id: String, reason: String },
    Terminated { id: String },
}

impl From<crate::ec2::InstanceEvent> for InstanceChange {
    fn from(e: crate::ec2::InstanceEvent) -> Self {
        use crate::ec2::InstanceEvent;
        match e {
            // A Bottlerocket host without cluster settings runs but never registers a Node.
            InstanceEvent::Booted { instance } if instance.kubelet_error.is_some() => {
                InstanceChange::BootFailed {
                    id: instance.id.clone(),
                    reason: instance.kubelet_error.clone().unwrap_or_default(),
                }
            }
            InstanceEvent::Booted { instance } if instance.user_data.is_none() => {
                InstanceChange::BootFailed {
                    id: instance.id.clone(),
                    reason: "running, but its user data has no Bottlerocket cluster settings, so no Node joins".into(),
                }
            }
            InstanceEvent::Booted { instance } => {
                let ud = instance.user_data.as_ref();
                InstanceChange::Booted(BootedInstance {
                    id: instance.id.clone(),
                    instance_type: instance.instance_type.clone(),
                    zone: instance.zone.clone(),
                    private_dns_name: instance.private_dns_name.clone(),
                    image_id: instance.image_id.clone(),
                    spot: instance.spot,
                    node_labels: ud.map(|u| u.node_labels.clone()).unwrap_or_default(),
                    node_taints: ud.map(|u| u.node_taints.clone()).unwrap_or_default(),
                    sysctls: ud.map(|u| u.sysctls.clone()).unwrap_or_default(),
                })
            }
            InstanceEvent::BootFailed { id, reason } => InstanceChange::BootFailed { id, reason },
            InstanceEvent::Terminated { id } => InstanceChange::Terminated { id },
        }
    }
}

/// (cpu, memory, max pods) of the instance types the sim knows; others get a mid-size default.
pub fn capacity(instance_type: &str) -> (&'static str, &'static str, u32) {
    match instance_type {
        "t3.medium" => ("2", "3943Mi", 17),
        "m5.large" | "c5.large" => ("2", "7577Mi", 29),
        "m5.xlarge" | "c5.xlarge" | "c5a.xlarge" => ("4", "15155Mi", 58),
        "m5.2xlarge" | "c5.2xlarge" | "c5a.2xlarge" => ("8", "31134Mi", 58),
        "r5.xlarge" => ("4", "31134Mi", 58),
        "m5.4xlarge" => ("16", "63252Mi", 234),
        _ => ("4", "15155Mi", 58),
    }
}

/// The Node a booted instance registers.
pub fn node_for(inst: &BootedInstance) -> Value {
    let (cpu, memory, pods) = capacity(&inst.instance_type);
    let mut labels: BTreeMap<String, String> = BTreeMap::from([
        (
            "kubernetes.io/hostname".into(),
            inst.private_dns_name.clone(),
        ),
        ("kubernetes.io/os".into(), "linux".into()),
        ("kubernetes.io/arch".into(), "amd64".into()),
        (
            "node.kubernetes.io/instance-type".into(),
            inst.instance_type.clone(),
        ),
        ("topology.kubernetes.io/zone".into(), inst.zone.clone()),
        (
            "topology.kubernetes.io/region".into(),
            inst.zone
                .trim_end_matches(|c: char| c.is_ascii_lowercase())
                .to_string(),
        ),
        (
            "karpenter.sh/capacity-type".into(),
            if inst.spot { "spot" } else { "on-demand" }.into(),
        ),
    ]);
    labels.extend(inst.node_labels.clone());
    let taints: Vec<Value> = inst
        .node_taints
        .iter()
        .map(|(k, v, e)| {
            let mut t = json!({"key": k, "effect": e});
            if !v.is_empty() {
                t["value"] = json!(v);
            }
            t
        })
        .collect();
    let now = now_rfc3339();
    json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": inst.private_dns_name,
            "labels": labels,
            "annotations": {SYSCTLS_ANNOTATION: serde_json::to_string(&inst.sysctls).unwrap_or_default()},
        },
        "spec": {"providerID": inst.provider_id(), "taints": taints},
        "status": {
            "capacity": {"cpu": cpu, "memory": memory, "pods": pods.to_string(), "ephemeral-storage": "20Gi"},
            "allocatable": {"cpu": cpu, "memory": memory, "pods": pods.to_string(), "ephemeral-storage": "17Gi"},
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "kubelet is posting ready status", "lastHeartbeatTime": now, "lastTransitionTime": now}],
            "nodeInfo": {"osImage": "Bottlerocket OS 1.51.0 (aws-k8s-1.33)", "kubeletVersion": "v1.33.1-eks-1234567", "containerRuntimeVersion": "containerd://2.0.5", "operatingSystem": "linux", "architecture": "amd64"},
            "addresses": [{"type": "InternalDNS", "address": inst.private_dns_name}, {"type": "Hostname", "address": inst.private_dns_name}],
        },
    })
}

const INTERNAL: WriteOptions = WriteOptions {
    dry_run: false,
    internal: true,
};

fn node_by_instance(ctx: &WorldContext, id: &str) -> Option<String> {
    let suffix = format!("/{id}");
    let page = ctx.store.list(
        &ResKey::core("nodes"),
        None,
        &|n| {
            n.pointer("/spec/providerID")
                .and_then(Value::as_str)
                .is_some_and(|p| p.ends_with(&suffix))
        },
        Some(1),
        None,
    );
    page.items.first().and_then(|n| {
        n.pointer("/metadata/name")
            .and_then(Value::as_str)
            .map(str::to_string)
    })
}

/// Applies one instance change to the cluster.
pub fn apply(ctx: &WorldContext, change: InstanceChange) {
    match change {
        InstanceChange::Booted(inst) => {
            let node = node_for(&inst);
            match ctx.store.create(&ResKey::core("nodes"), None, node, INTERNAL) {
                Ok(_) => ctx.audit.world(
                    "node-registered",
                    "nodes",
                    None,
                    Some(&inst.private_dns_name),
                    json!({"instance": inst.id, "providerID": inst.provider_id(), "instanceType": inst.instance_type}),
                ),
                Err(e) => tracing::warn!(instance = %inst.id, error = %e, "ec2 nodes: cannot register node"),
            }
        }
        InstanceChange::BootFailed { id, reason } => {
            ctx.audit.world(
                "instance-boot-failed",
                "instances",
                None,
                Some(&id),
                json!({"reason": reason}),
            );
        }
        InstanceChange::Terminated { id } => {
            ctx.audit.world(
                "instance-terminated",
                "instances",
                None,
                Some(&id),
                Value::Null,
            );
            let Some(name) = node_by_instance(ctx, &id) else {
                return;
            };
            let now = now_rfc3339();
            let _ = ctx
                .store
                .modify(&ResKey::core("nodes"), None, &name, None, INTERNAL, |cur| {
                    let mut v = cur.clone();
                    v["status"]["conditions"] = json!([{"type": "Ready", "status": "Unknown", "reason": "NodeStatusUnknown", "message": "Kubelet stopped posting node status.", "lastTransitionTime": now}]);
                    Ok(v)
                });
            // Finalizers (Karpenter's) keep it until their owners are done.
            let _ = ctx.store.delete(
                &ResKey::core("nodes"),
                None,
                &name,
                &DeleteOptions::default(),
            );
            ctx.audit.world(
                "node-removed",
                "nodes",
                None,
                Some(&name),
                json!({"instance": id}),
            );
        }
    }
}

/// Turns instance events into Nodes until the channel closes.
pub async fn run<E>(ctx: Arc<WorldContext>, mut events: broadcast::Receiver<E>)
where
    E: Into<InstanceChange> + Clone + Send + 'static,
{
    loop {
        match events.recv().await {
            Ok(e) => apply(&ctx, e.into()),
            Err(broadcast::error::RecvError::Lagged(n)) => {
                tracing::warn!(missed = n, "ec2 nodes: instance events were dropped");
            }
            Err(broadcast::error::RecvError::Closed) => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_carries_identity_labels_taints_and_sysctls() {
        let inst = BootedInstance {
            id: "i-0123456789abcdef0".into(),
            instance_type: "m5.large".into(),
            zone: "us-west-2a".into(),
            private_dns_name: "ip-10-0-1-2.us-west-2.compute.internal".into(),
            spot: true,
            node_labels: BTreeMap::from([("example.com/pool".into(), "db".into())]),
            node_taints: vec![("dedicated".into(), "db".into(), "NoSchedule".into())],
            sysctls: BTreeMap::from([("fs.inotify.max_user_watches".into(), "524288".into())]),
            ..Default::default()
        };
        let n = node_for(&inst);
        assert_eq!(
            n["spec"]["providerID"],
            "aws:///us-west-2a/i-0123456789abcdef0"
        );
        assert_eq!(
            n["metadata"]["labels"]["karpenter.sh/capacity-type"],
            "spot"
        );
        assert_eq!(
            n["metadata"]["labels"]["topology.kubernetes.io/region"],
            "us-west-2"
        );
        assert_eq!(n["metadata"]["labels"]["example.com/pool"], "db");
        assert_eq!(n["spec"]["taints"][0]["value"], "db");
        assert_eq!(n["status"]["allocatable"]["pods"], "29");
        assert!(
            n["status"]["nodeInfo"]["osImage"]
                .as_str()
                .unwrap()
                .starts_with("Bottlerocket")
        );
        let sysctls: BTreeMap<String, String> = serde_json::from_str(
            n["metadata"]["annotations"][SYSCTLS_ANNOTATION]
                .as_str()
                .unwrap(),
        )
        .unwrap();
        assert_eq!(sysctls["fs.inotify.max_user_watches"], "524288");
    }
}
