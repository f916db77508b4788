//! Nodes as EKS shows them with Bottlerocket, and, for Karpenter-managed ones, the NodeClaim that owns
//! each, its NodePool and EC2NodeClass (created when referenced but not declared).

use serde_json::{Value, json};

use super::ScenarioError;
use super::format::*;
use super::load::{NodeInstance, instance_capacity};
use crate::apiserver::store::{Store, WriteOptions};
use crate::world::objects::*;

fn create(
    store: &Store,
    file: &str,
    what: &str,
    res: crate::apiserver::resources::ResKey,
    obj: Value,
) -> Result<Value, ScenarioError> {
    store
        .create(
            &res,
            None,
            obj,
            WriteOptions {
                internal: true,
                ..Default::default()
            },
        )
        .map(|o| (*o).clone())
        .map_err(|e| ScenarioError::Load {
            file: file.into(),
            what: what.into(),
            message: e.message,
        })
}

fn image_id_for(class: &str) -> String {
    format!(
        "ami-{}",
        &sha256_hex(&format!("bottlerocket/{class}"))[..17]
    )
}

/// Creates classes, pools, NodeClaims and Nodes; returns the instances behind the nodes.
pub fn load(store: &Store, s: &Scenario, file: &str) -> Result<Vec<NodeInstance>, ScenarioError> {
    let mut classes: Vec<NodeClassSpec> = s.ec2_node_classes.clone();
    let pools = s.node_pools_in_use();
    for p in &pools {
        if !classes.iter().any(|c| c.name == p.node_class) {
            classes.push(NodeClassSpec {
                name: p.node_class.clone(),
                ami_alias: "bottlerocket@latest".into(),
                image_id: None,
                role: "KarpenterNodeRole-snapdrain-sim".into(),
            });
        }
    }
    for c in &classes {
        let image = c.image_id.clone().unwrap_or_else(|| image_id_for(&c.name));
        create(
            store,
            file,
            &format!("EC2NodeClass {}", c.name),
            ResKey::new("karpenter.k8s.aws", "ec2nodeclasses"),
            json!({
                "apiVersion": "karpenter.k8s.aws/v1", "kind": "EC2NodeClass",
                "metadata": {"name": c.name, "finalizers": ["karpenter.k8s.aws/termination"]},
                "spec": {"amiFamily": "Bottlerocket", "amiSelectorTerms": [{"alias": c.ami_alias}], "role": c.role,
                         "subnetSelectorTerms": [{"tags": {"karpenter.sh/discovery": "snapdrain-sim"}}],
                         "securityGroupSelectorTerms": [{"tags": {"karpenter.sh/discovery": "snapdrain-sim"}}],
                         "metadataOptions": {"httpEndpoint": "enabled", "httpProtocolIPv6": "disabled", "httpPutResponseHopLimit": 1, "httpTokens": "required"}},
                // What Karpenter resolved: the alias's AMI (with the architecture requirement
                // karpenter-provider-aws pkg/providers/amifamily/bottlerocket.go gives each SSM
                // parameter) and the profile it created for the role; subnets and security groups are
                // resolved against the EC2 endpoint once it runs (world/karpenter/nodeclass.rs).
                "status": {"amis": [{"id": image, "name": format!("bottlerocket-aws-k8s-1.35-x86_64-v{}", default_os_version()),
                                     "requirements": [{"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64"]}]}],
                           "instanceProfile": format!("snapdrain-sim_{}", c.name),
                           "conditions": [{"type": "Ready", "status": "True", "reason": "Ready", "message": "", "lastTransitionTime": now()}]},
            }),
        )?;
    }
    let mut pool_uids = std::collections::HashMap::new();
    for p in &pools {
        let mut disruption = json!({"consolidationPolicy": p.consolidation_policy, "consolidateAfter": p.consolidate_after});
        if let Some(b) = &p.budgets {
            disruption["budgets"] = json!(b);
        } else {
            disruption["budgets"] = json!([{"nodes": "10%"}]);
        }
        let mut template_spec = json!({
            "nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": p.node_class},
            "expireAfter": p.expire_after,
            "requirements": [
                {"key": "karpenter.sh/capacity-type", "operator": "In", "values": p.capacity_types.clone().unwrap_or(vec!["on-demand".into()])},
                {"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64"]},
            ],
        });
        if let Some(t) = &p.termination_grace_period {
            template_spec["terminationGracePeriod"] = json!(t);
        }
        let pool = create(
            store,
            file,
            &format!("NodePool {}", p.name),
            nodepools(),
            json!({
                "apiVersion": "karpenter.sh/v1", "kind": "NodePool",
                "metadata": {"name": p.name, "annotations": {"karpenter.sh/nodepool-hash": template_hash(&template_spec), "karpenter.sh/nodepool-hash-version": "v3"}},
                "spec": {"template": {"metadata": {}, "spec": template_spec}, "disruption": disruption},
                "status": {"conditions": [{"type": "Ready", "status": "True", "reason": "Ready", "message": "", "lastTransitionTime": now()}]},
            }),
        )?;
        pool_uids.insert(p.name.clone(), (uid(&pool).to_string(), p.clone()));
    }
    let mut instances = Vec::new();
    let mut ip_counter: u32 = 10 * 256;
    for (gi, g) in s.nodes.iter().enumerate() {
        let zones: Vec<String> = if g.zones.is_empty() {
            g.zone.clone().into_iter().collect()
        } else {
            g.zones.clone()
        };
        let count = g.count.unwrap_or(1);
        for i in 0..count {
            ip_counter += 1;
            let zone = zones[i as usize % zones.len().max(1)].clone();
            let region = zone
                .trim_end_matches(|c: char| c.is_ascii_lowercase())
                .to_string();
            let ip = format!(
                "10.{}.{}.{}",
                (ip_counter >> 16) & 255,
                (ip_counter >> 8) & 255,
                ip_counter & 255
            );
            let node_name = match (&g.name, &g.prefix) {
                (Some(n), _) => n.clone(),
                (None, Some(p)) => format!("{p}-{i}"),
                (None, None) => format!("ip-{}.{region}.compute.internal", ip.replace('.', "-")),
            };
            let provider_id = g
                .provider_id
                .clone()
                .unwrap_or_else(|| format!("aws:///{zone}/i-{}", &sha256_hex(&node_name)[..17]));
            let instance_id = provider_id.rsplit('/').next().unwrap_or("").to_string();
            let (cpu, mem_gib, max_pods) = instance_capacity(&g.instance_type);
            let cap = g.capacity.clone().unwrap_or_default();
            let cpu_q = cap.cpu.clone().unwrap_or(cpu.to_string());
            let mem_q = cap.memory.clone().unwrap_or(format!("{mem_gib}Gi"));
            let pods_q = cap.pods.unwrap_or(max_pods).to_string();
            // kube-reserved and system-reserved, roughly as EKS computes them.
            let alloc_cpu = format!("{}m", (cpu_millis(&json!(cpu_q)) - 80).max(0));
            let alloc_mem = format!("{}Ki", (bytes(&json!(mem_q)) / 1024 * 93 / 100).max(0));
            let capacity =
                json!({"cpu": cpu_q, "memory": mem_q, "pods": pods_q, "ephemeral-storage": "20Gi"});
            let allocatable = json!({"cpu": alloc_cpu, "memory": alloc_mem, "pods": pods_q, "ephemeral-storage": "18Gi"});
            let mut labels = json!({
                "kubernetes.io/hostname": node_name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
                "node.kubernetes.io/instance-type": g.instance_type, "topology.kubernetes.io/zone": zone,
                "topology.kubernetes.io/region": region, "topology.ebs.csi.aws.com/zone": zone,
                "beta.kubernetes.io/os": "linux", "beta.kubernetes.io/arch": "amd64",
            });
            let mut image_id = image_id_for("default");
            let mut node_pool = None;
            let mut owner = None;
            if let Some(k) = &g.karpenter {
                let (pool_uid, pool) =
                    pool_uids
                        .get(&k.node_pool)
                        .cloned()
                        .ok_or_else(|| ScenarioError::Invalid {
                            file: file.into(),
                            path: format!("nodes[{gi}].karpenter.nodePool"),
                            message: format!("no NodePool {}", k.node_pool),
                        })?;
                image_id = classes
                    .iter()
                    .find(|c| c.name == pool.node_class)
                    .and_then(|c| c.image_id.clone())
                    .unwrap_or_else(|| image_id_for(&pool.node_class));
                for (key, v) in [
                    ("karpenter.sh/nodepool", k.node_pool.as_str()),
                    ("karpenter.sh/capacity-type", k.capacity_type.as_str()),
                    ("karpenter.k8s.aws/ec2nodeclass", pool.node_class.as_str()),
                    (
                        "karpenter.k8s.aws/instance-family",
                        g.instance_type.split('.').next().unwrap_or(""),
                    ),
                    (
                        "karpenter.k8s.aws/instance-size",
                        g.instance_type.split('.').nth(1).unwrap_or(""),
                    ),
                ] {
                    labels[key] = json!(v);
                }
                let claim_name =
                    format!("{}-{}", k.node_pool, &template_hash(&json!(node_name))[..5]);
                let now = now();
                let conds: Vec<Value> = ["Launched", "Registered", "Initialized", "Ready"]
                    .iter()
                    .map(|t| json!({"type": t, "status": "True", "reason": t, "message": "", "observedGeneration": 1, "lastTransitionTime": now}))
                    .collect();
                let mut claim_labels = labels.clone();
                if let Some(m) = claim_labels.as_object_mut() {
                    m.remove("kubernetes.io/hostname");
                }
                let mut spec = json!({
                    "nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": pool.node_class},
                    "expireAfter": pool.expire_after,
                    "requirements": [
                        {"key": "karpenter.sh/nodepool", "operator": "In", "values": [k.node_pool]},
                        {"key": "node.kubernetes.io/instance-type", "operator": "In", "values": [g.instance_type]},
                        {"key": "karpenter.sh/capacity-type", "operator": "In", "values": [k.capacity_type]},
                    ],
                    "resources": {"requests": {"pods": "5"}},
                });
                if let Some(t) = &pool.termination_grace_period {
                    spec["terminationGracePeriod"] = json!(t);
                }
                let claim = create(
                    store,
                    file,
                    &format!("NodeClaim for {node_name}"),
                    nodeclaims(),
                    json!({
                        "apiVersion": "karpenter.sh/v1", "kind": "NodeClaim",
                        "metadata": {"name": claim_name, "labels": claim_labels, "finalizers": ["karpenter.sh/termination"],
                                     "annotations": {"karpenter.sh/nodepool-hash-version": "v3", "karpenter.k8s.aws/ec2nodeclass-hash-version": "v4"},
                                     "ownerReferences": [{"apiVersion": "karpenter.sh/v1", "kind": "NodePool", "name": k.node_pool, "uid": pool_uid, "blockOwnerDeletion": true}]},
                        "spec": spec,
                        "status": {"providerID": provider_id, "nodeName": node_name, "imageID": image_id,
                                   "capacity": capacity, "allocatable": allocatable, "conditions": conds},
                    }),
                )?;
                labels["karpenter.sh/registered"] = json!("true");
                labels["karpenter.sh/initialized"] = json!("true");
                owner = Some(
                    json!([{"apiVersion": "karpenter.sh/v1", "kind": "NodeClaim", "name": claim_name, "uid": uid(&claim), "blockOwnerDeletion": true}]),
                );
                node_pool = Some(k.node_pool.clone());
            }
            for (k, v) in &g.labels {
                labels[k] = json!(v);
            }
            let mut meta = json!({"name": node_name, "labels": labels,
                                  "annotations": {"node.alpha.kubernetes.io/ttl": "0", "volumes.kubernetes.io/controller-managed-attach-detach": "true",
                                                  "csi.volume.kubernetes.io/nodeid": json!({"ebs.csi.aws.com": instance_id}).to_string()}});
            if let Some(o) = owner {
                meta["ownerReferences"] = o;
                meta["finalizers"] = json!(["karpenter.sh/termination"]);
            }
            let now = now();
            let node = json!({
                "apiVersion": "v1", "kind": "Node", "metadata": meta,
                "spec": {"providerID": provider_id, "unschedulable": g.unschedulable,
                         "taints": g.taints.iter().map(|t| { let mut v = json!({"key": t.key, "effect": t.effect}); if let Some(val) = &t.value { v["value"] = json!(val); } v }).collect::<Vec<_>>()},
                "status": {
                    "capacity": capacity, "allocatable": allocatable,
                    "conditions": [
                        {"type": "MemoryPressure", "status": "False", "reason": "KubeletHasSufficientMemory", "lastHeartbeatTime": now, "lastTransitionTime": now},
                        {"type": "DiskPressure", "status": "False", "reason": "KubeletHasNoDiskPressure", "lastHeartbeatTime": now, "lastTransitionTime": now},
                        {"type": "PIDPressure", "status": "False", "reason": "KubeletHasSufficientPID", "lastHeartbeatTime": now, "lastTransitionTime": now},
                        {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "kubelet is posting ready status", "lastHeartbeatTime": now, "lastTransitionTime": now},
                    ],
                    "addresses": [{"type": "InternalIP", "address": ip}, {"type": "Hostname", "address": node_name},
                                  {"type": "InternalDNS", "address": node_name}],
                    "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
                    "nodeInfo": {"osImage": format!("Bottlerocket OS {} (aws-k8s-1.35)", g.os_version),
                                 "kernelVersion": "6.12.37", "containerRuntimeVersion": "containerd://2.0.6+bottlerocket",
                                 "kubeletVersion": "v1.35.0-eks-4ed2f5a", "kubeProxyVersion": "", "operatingSystem": "linux", "architecture": "amd64",
                                 "machineID": sha256_hex(&format!("machine/{node_name}"))[..32], "systemUUID": sha256_hex(&format!("uuid/{node_name}"))[..32],
                                 "bootID": sha256_hex(&format!("boot/{node_name}"))[..32]},
                },
            });
            create(store, file, &format!("node {node_name}"), nodes(), node)?;
            instances.push(NodeInstance {
                instance_id,
                node_name,
                zone,
                instance_type: g.instance_type.clone(),
                private_ip: ip,
                provider_id,
                image_id,
                node_pool,
                instance_profile: g.launch.as_ref().is_none_or(|l| l.instance_profile),
                user_data: g.launch.as_ref().is_none_or(|l| l.user_data),
            });
        }
    }
    Ok(instances)
}

use crate::apiserver::resources::ResKey;
