//! Pre-placed workloads for large scenarios: every StatefulSet, Deployment and DaemonSet already has its
//! pods bound and Running, its claims Bound to zonal volumes, and its VolumeAttachments, written
//! directly into the store, exactly as the world controllers would leave them. The controllers then
//! start from a converged cluster instead of creating 150,000 pods one event at a time.

use std::sync::Arc;

use serde_json::{Value, json};

use crate::apiserver::store::{Store, WriteOptions};
use crate::world::kubelet::set_running;
use crate::world::objects::*;
use crate::world::statefulset::{claim_for, revision_of, stateful_pod};
use crate::world::volumes::{bind_claim, persistent_volume, volume_attachment};
use crate::world::workloads::{daemon_pod, daemon_template, pod_from_template, replicaset_for};

struct Slot {
    node: Arc<Value>,
    ip: String,
    cpu: i64,
    mem: i64,
    pods: i64,
}

struct Placer {
    slots: Vec<Slot>,
    cursor: usize,
    next_ip: u32,
}

impl Placer {
    fn fits(slot: &Slot, pod: &Value) -> bool {
        let (cpu, mem) = pod_requests(pod);
        slot.pods >= 1
            && slot.cpu >= cpu
            && slot.mem >= mem
            && untolerated_taint(pod, &slot.node).is_none()
            && node_affinity_allows(pod, &slot.node)
    }

    fn take(&mut self, i: usize, pod: &Value) {
        let (cpu, mem) = pod_requests(pod);
        let s = &mut self.slots[i];
        s.cpu -= cpu;
        s.mem -= mem;
        s.pods -= 1;
    }

    /// The next node round-robin that fits, for spreading.
    fn place(&mut self, pod: &Value) -> Option<usize> {
        let n = self.slots.len();
        for k in 0..n {
            let i = (self.cursor + k) % n;
            if Self::fits(&self.slots[i], pod) {
                self.cursor = (i + 1) % n;
                self.take(i, pod);
                return Some(i);
            }
        }
        None
    }

    fn pod_ip(&mut self) -> String {
        self.next_ip += 1;
        let n = self.next_ip;
        format!(
            "10.{}.{}.{}",
            128 + ((n >> 16) & 63),
            (n >> 8) & 255,
            n & 255
        )
    }

    fn run_on(&mut self, i: usize, mut pod: Value) -> Value {
        let node = name(&self.slots[i].node).to_string();
        pod["spec"]["nodeName"] = json!(node);
        let host_ip = self.slots[i].ip.clone();
        let pod_ip = self.pod_ip();
        set_running(&mut pod, &host_ip, &pod_ip);
        pod
    }
}

fn create(
    store: &Store,
    res: &crate::apiserver::resources::ResKey,
    ns: Option<&str>,
    obj: Value,
) -> Result<Arc<Value>, String> {
    store
        .create(
            res,
            ns,
            obj,
            WriteOptions {
                internal: true,
                ..Default::default()
            },
        )
        .map_err(|e| e.message)
}

pub fn run(store: &Store, _file: &str) -> Result<(), String> {
    let slots: Vec<Slot> = store
        .snapshot(&nodes())
        .0
        .into_iter()
        .filter(|n| {
            node_ready(n) && n.pointer("/spec/unschedulable").and_then(Value::as_bool) != Some(true)
        })
        .map(|n| {
            let a = n
                .pointer("/status/allocatable")
                .cloned()
                .unwrap_or(json!({}));
            let ip = n
                .pointer("/status/addresses/0/address")
                .and_then(Value::as_str)
                .unwrap_or("10.0.0.1")
                .to_string();
            Slot {
                cpu: a.get("cpu").map_or(0, cpu_millis),
                mem: a.get("memory").map_or(0, bytes),
                pods: a
                    .get("pods")
                    .and_then(Value::as_str)
                    .and_then(|p| p.parse().ok())
                    .unwrap_or(110),
                ip,
                node: n,
            }
        })
        .collect();
    if slots.is_empty() {
        return Err("materialize needs at least one Ready, schedulable node".into());
    }
    let mut p = Placer {
        slots,
        cursor: 0,
        next_ip: 0,
    };
    // DaemonSets first: they claim a slot on every node, as on a real node.
    for ds in store.snapshot(&daemonsets()).0 {
        let template = daemon_template(&ds);
        for i in 0..p.slots.len() {
            let node_name = name(&p.slots[i].node).to_string();
            let pod = daemon_pod(&ds, &template, &node_name);
            if !Placer::fits(&p.slots[i], &pod) {
                continue;
            }
            p.take(i, &pod);
            let pod = p.run_on(i, pod);
            create(store, &pods(), Some(namespace(&ds)), pod)?;
        }
    }
    for set in store.snapshot(&statefulsets()).0 {
        let ns = namespace(&set).to_string();
        let revision = revision_of(&set);
        let replicas = i64_at(&set, "/spec/replicas").unwrap_or(1).max(0) as usize;
        for ordinal in 0..replicas {
            let (pod, claims) = stateful_pod(&set, ordinal, &revision);
            let Some(i) = p.place(&pod) else {
                return Err(format!("no node has room for pod {ns}/{}", name(&pod)));
            };
            let node_name = name(&p.slots[i].node).to_string();
            let zone = label(&p.slots[i].node, "topology.kubernetes.io/zone")
                .unwrap_or("")
                .to_string();
            for (template, claim) in &claims {
                let Some(pvc) = claim_for(&set, template, claim) else {
                    continue;
                };
                let created = create(store, &pvcs(), Some(&ns), pvc)?;
                let pv_name = format!("pvc-{}", uid(&created));
                create(
                    store,
                    &pvs(),
                    None,
                    persistent_volume(&created, &pv_name, &zone),
                )?;
                let _ = modify_uid(store, &pvcs(), Some(&ns), claim, uid(&created), |c| {
                    bind_claim(c, &pv_name, Some(&node_name));
                    true
                });
                create(
                    store,
                    &volumeattachments(),
                    None,
                    volume_attachment(&pv_name, &node_name),
                )?;
            }
            let pod = p.run_on(i, pod);
            create(store, &pods(), Some(&ns), pod)?;
        }
    }
    for dep in store.snapshot(&deployments()).0 {
        let ns = namespace(&dep).to_string();
        let rs = create(store, &replicasets(), Some(&ns), replicaset_for(&dep, 1))?;
        let template = rs.pointer("/spec/template").cloned().unwrap_or(json!({}));
        let replicas = i64_at(&rs, "/spec/replicas").unwrap_or(1).max(0);
        for _ in 0..replicas {
            let pod = pod_from_template(&template, &ns, &format!("{}-", name(&rs)), &rs);
            let Some(i) = p.place(&pod) else {
                return Err(format!(
                    "no node has room for another pod of deployment {ns}/{}",
                    name(&dep)
                ));
            };
            let pod = p.run_on(i, pod);
            create(store, &pods(), Some(&ns), pod)?;
        }
    }
    Ok(())
}
