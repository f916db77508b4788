//! Volumes: dynamic provisioning of EBS-like PersistentVolumes, PV reclaim, and VolumeAttachments.
//!
//! Provisioning is WaitForFirstConsumer: the scheduler calls [`provision`] for a pod's unbound claims
//! with the zone of the node it chose, before binding the pod. A claim annotated
//! `sim.snapdrain.io/zone` is provisioned at once in that zone (Immediate binding). A released claim's
//! PV is deleted (reclaim policy Delete, as for gp3).
//!
//! A VolumeAttachment `csi-<sha256(pv+attacher+node)>` exists, attached, while a non-terminal pod bound
//! to the node uses a claim bound to an EBS PV (local PVs attach nothing), and is removed `timings.volume_detach` after the last such
//! pod left the node (terminated or gone), as the attach/detach controller does.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use serde_json::{Value, json};
use tokio::task::JoinSet;

use super::WorldContext;
use super::feed::{Change, Feed, ObjKey};
use super::objects::*;
use crate::apiserver::store::{DeleteOptions, Store};

pub const ATTACHER: &str = "ebs.csi.aws.com";
/// A claim with this annotation is provisioned at once in the zone it names.
pub const IMMEDIATE_ZONE: &str = "sim.snapdrain.io/zone";

/// Creates the PV for a pending claim in `zone` and binds the claim to it.
pub fn provision(
    ctx: &WorldContext,
    pvc: &Value,
    zone: &str,
    selected_node: Option<&str>,
) -> Result<String, String> {
    let pv_name = format!("pvc-{}", uid(pvc));
    let pv = persistent_volume(pvc, &pv_name, zone);
    match ctx.store.create(&pvs(), None, pv, internal()) {
        Ok(_) => ctx.audit.world(
            "provisioned",
            "persistentvolumes",
            None,
            Some(&pv_name),
            json!({"claim": format!("{}/{}", namespace(pvc), name(pvc)), "zone": zone}),
        ),
        Err(e) if e.code == 409 => {}
        Err(e) => return Err(e.message),
    }
    let pv_for_claim = pv_name.clone();
    modify_uid(
        &ctx.store,
        &pvcs(),
        Some(namespace(pvc)),
        name(pvc),
        uid(pvc),
        |c| {
            bind_claim(c, &pv_for_claim, selected_node);
            true
        },
    )
    .ok_or_else(|| {
        format!(
            "claim {} changed while its volume was provisioned",
            name(pvc)
        )
    })?;
    Ok(pv_name)
}

/// A PV as the EBS CSI driver provisions it, already bound to `pvc`.
pub fn persistent_volume(pvc: &Value, pv_name: &str, zone: &str) -> Value {
    let size = pvc
        .pointer("/spec/resources/requests/storage")
        .cloned()
        .unwrap_or(json!("1Gi"));
    let volume_id = format!("vol-{}", &sha256_hex(pv_name)[..17]);
    json!({
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {
            "name": pv_name,
            "annotations": {"pv.kubernetes.io/provisioned-by": ATTACHER, "volume.kubernetes.io/provisioner-deletion-secret-name": "", "volume.kubernetes.io/provisioner-deletion-secret-namespace": ""},
            "finalizers": ["kubernetes.io/pv-protection"],
        },
        "spec": {
            "accessModes": pvc.pointer("/spec/accessModes").cloned().unwrap_or(json!(["ReadWriteOnce"])),
            "capacity": {"storage": size},
            "claimRef": {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "namespace": namespace(pvc), "name": name(pvc), "uid": uid(pvc)},
            "csi": {"driver": ATTACHER, "fsType": "ext4", "volumeHandle": volume_id,
                    "volumeAttributes": {"storage.kubernetes.io/csiProvisionerIdentity": "sim-ebs-csi"}},
            "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                {"key": "topology.kubernetes.io/zone", "operator": "In", "values": [zone]}]}]}},
            "persistentVolumeReclaimPolicy": "Delete",
            "storageClassName": pvc.pointer("/spec/storageClassName").cloned().unwrap_or(json!("gp3")),
            "volumeMode": "Filesystem",
        },
        "status": {"phase": "Bound"},
    })
}

/// The claim side of a binding.
pub fn bind_claim(c: &mut Value, pv_name: &str, selected_node: Option<&str>) {
    let size = c
        .pointer("/spec/resources/requests/storage")
        .cloned()
        .unwrap_or(json!("1Gi"));
    c["spec"]["volumeName"] = json!(pv_name);
    if c.pointer("/spec/storageClassName").is_none() {
        c["spec"]["storageClassName"] = json!("gp3");
    }
    if !c
        .pointer("/metadata/annotations")
        .is_some_and(Value::is_object)
    {
        c["metadata"]["annotations"] = json!({});
    }
    let a = &mut c["metadata"]["annotations"];
    a["pv.kubernetes.io/bind-completed"] = json!("yes");
    a["pv.kubernetes.io/bound-by-controller"] = json!("yes");
    a["volume.beta.kubernetes.io/storage-provisioner"] = json!(ATTACHER);
    a["volume.kubernetes.io/storage-provisioner"] = json!(ATTACHER);
    if let Some(n) = selected_node {
        a["volume.kubernetes.io/selected-node"] = json!(n);
    }
    c["status"] = json!({
        "phase": "Bound",
        "accessModes": c.pointer("/spec/accessModes").cloned().unwrap_or(json!(["ReadWriteOnce"])),
        "capacity": {"storage": size},
    });
}

/// The real name is `csi-` + the full 64-hex sha256; the simulated API server's name validation still
/// limits every dot-free name to 63 characters, so the hash is cut to fit. Nothing may parse it anyway.
pub fn attachment_name(pv: &str, node: &str) -> String {
    format!(
        "csi-{}",
        &sha256_hex(&format!("{pv}{ATTACHER}{node}"))[..59]
    )
}

pub fn volume_attachment(pv: &str, node: &str) -> Value {
    json!({
        "apiVersion": "storage.k8s.io/v1",
        "kind": "VolumeAttachment",
        "metadata": {"name": attachment_name(pv, node), "annotations": {"csi.alpha.kubernetes.io/node-id": node}},
        "spec": {"attacher": ATTACHER, "nodeName": node, "source": {"persistentVolumeName": pv}},
        "status": {"attached": true, "attachmentMetadata": {"devicePath": "/dev/xvdaa"}},
    })
}

/// What EC2 knows of the EBS volumes attached to `instance_id`: one per attached VolumeAttachment of the
/// EBS CSI driver on the Node whose `spec.providerID` names the instance, sized from its PV and tagged as
/// the driver tags the volumes it provisions (kubernetes-sigs/aws-ebs-csi-driver `pkg/driver/controller.go`:
/// `CSIVolumeName`, `ebs.csi.aws.com/cluster=true`, and `kubernetes.io/created-for/pvc/{name,namespace}`, `kubernetes.io/created-for/pv/name`
/// with `--extra-create-metadata`, which the EKS add-on turns on).
pub fn ec2_attached_volumes(store: &Store, instance_id: &str) -> Vec<crate::ec2::AttachedVolume> {
    let on_instance = |node: &str| {
        store.get(&nodes(), None, node).is_some_and(|n| {
            n.pointer("/spec/providerID")
                .and_then(Value::as_str)
                .and_then(|p| p.rsplit('/').next())
                == Some(instance_id)
        })
    };
    let attachments = store.list(
        &volumeattachments(),
        None,
        &|va| {
            va.pointer("/spec/attacher").and_then(Value::as_str) == Some(ATTACHER)
                && va.pointer("/status/attached").and_then(Value::as_bool) == Some(true)
        },
        None,
        None,
    );
    let mut out = Vec::new();
    for va in attachments.items {
        let node = va
            .pointer("/spec/nodeName")
            .and_then(Value::as_str)
            .unwrap_or_default();
        if !on_instance(node) {
            continue;
        }
        let Some(pv_name) = va
            .pointer("/spec/source/persistentVolumeName")
            .and_then(Value::as_str)
        else {
            continue;
        };
        let Some(pv) = store.get(&pvs(), None, pv_name) else {
            continue;
        };
        let Some(volume_id) = pv.pointer("/spec/csi/volumeHandle").and_then(Value::as_str) else {
            continue;
        };
        let bytes = pv.pointer("/spec/capacity/storage").map_or(0, bytes);
        let mut tags = std::collections::BTreeMap::new();
        tags.insert("CSIVolumeName".to_string(), pv_name.to_string());
        tags.insert("ebs.csi.aws.com/cluster".to_string(), "true".to_string());
        tags.insert(
            "kubernetes.io/created-for/pv/name".to_string(),
            pv_name.to_string(),
        );
        for (key, field) in [
            ("kubernetes.io/created-for/pvc/name", "name"),
            ("kubernetes.io/created-for/pvc/namespace", "namespace"),
        ] {
            if let Some(v) = pv
                .pointer(&format!("/spec/claimRef/{field}"))
                .and_then(Value::as_str)
            {
                tags.insert(key.to_string(), v.to_string());
            }
        }
        out.push(crate::ec2::AttachedVolume {
            volume_id: volume_id.to_string(),
            // EBS sizes are whole GiB; a claim for less gets 1 GiB.
            size_gib: (bytes.max(1) as u64).div_ceil(1 << 30),
            device: va
                .pointer("/status/attachmentMetadata/devicePath")
                .and_then(Value::as_str)
                .unwrap_or("/dev/xvdaa")
                .to_string(),
            boot: false,
            tags,
        });
    }
    out
}

type Use = (String, String);

struct Volumes {
    ctx: Arc<WorldContext>,
    /// (pv, node) pairs each pod holds.
    uses: HashMap<ObjKey, Vec<Use>>,
    counts: HashMap<Use, usize>,
    detaching: HashSet<Use>,
    timers: JoinSet<Use>,
}

pub async fn run(ctx: Arc<WorldContext>) {
    let (mut claim_feed, initial_claims) = Feed::open(&ctx.store, pvcs());
    let (mut pod_feed, initial_pods) = Feed::open(&ctx.store, pods());
    let mut v = Volumes {
        ctx,
        uses: HashMap::new(),
        counts: HashMap::new(),
        detaching: HashSet::new(),
        timers: JoinSet::new(),
    };
    for c in initial_claims {
        v.on_claim(&c);
    }
    for c in initial_pods {
        v.on_pod(&c);
    }
    loop {
        tokio::select! {
            changes = claim_feed.recv() => { for c in changes { v.on_claim(&c); } }
            changes = pod_feed.recv() => { for c in changes { v.on_pod(&c); } }
            Some(done) = v.timers.join_next(), if !v.timers.is_empty() => {
                if let Ok(u) = done { v.detach_due(u); }
            }
        }
    }
}

impl Volumes {
    fn on_claim(&mut self, c: &Change) {
        match (&c.old, &c.new) {
            (Some(old), None) => {
                // A released volume goes with its claim (reclaim policy Delete).
                if let Some(pv_name) = str_at(old, "/spec/volumeName")
                    && let Some(pv) = self.ctx.store.get(&pvs(), None, pv_name)
                    && str_at(&pv, "/spec/claimRef/uid") == Some(uid(old))
                    && str_at(&pv, "/spec/persistentVolumeReclaimPolicy") == Some("Delete")
                {
                    self.delete_pv(pv_name, uid(&pv));
                }
            }
            (_, Some(new)) => {
                if str_at(new, "/spec/volumeName").is_none_or(str::is_empty)
                    && !is_terminating(new)
                    && let Some(zone) = annotation(new, IMMEDIATE_ZONE)
                    && let Err(e) = provision(&self.ctx, new, zone, None)
                {
                    tracing::warn!(claim = name(new), error = %e, "cannot provision a volume");
                }
            }
            (None, None) => {}
        }
    }

    fn delete_pv(&self, pv_name: &str, pv_uid: &str) {
        let store = &self.ctx.store;
        // pv-protection is released once no claim uses the volume, which is now.
        let _ = modify_uid(store, &pvs(), None, pv_name, pv_uid, |pv| {
            if let Some(m) = pv.get_mut("metadata").and_then(Value::as_object_mut) {
                m.remove("finalizers");
            }
            pv["status"]["phase"] = json!("Released");
            true
        });
        if store
            .delete(&pvs(), None, pv_name, &DeleteOptions::default())
            .is_ok()
        {
            self.ctx.audit.world(
                "deleted",
                "persistentvolumes",
                None,
                Some(pv_name),
                json!({"reason": "claim deleted"}),
            );
        }
    }

    fn uses_of(&self, pod: &Value) -> Vec<Use> {
        let Some(node) = node_name(pod) else {
            return Vec::new();
        };
        if is_terminal(pod) {
            return Vec::new();
        }
        let ns = namespace(pod);
        pod_claims(pod)
            .into_iter()
            .filter_map(|claim| {
                let pvc = self.ctx.store.get(&pvcs(), Some(ns), claim)?;
                let pv = str_at(&pvc, "/spec/volumeName").filter(|v| !v.is_empty())?;
                // Only the EBS driver's volumes attach: a `local` or `hostPath` PV has no attacher, so the
                // attach/detach controller makes no VolumeAttachment for it (kubernetes
                // pkg/volume/local/local.go implements no AttachableVolumePlugin).
                let object = self.ctx.store.get(&pvs(), None, pv);
                let attachable = object
                    .as_ref()
                    .is_none_or(|o| str_at(o, "/spec/csi/driver") == Some(ATTACHER));
                attachable.then(|| (pv.to_string(), node.to_string()))
            })
            .collect()
    }

    fn on_pod(&mut self, c: &Change) {
        let want = c
            .new
            .as_deref()
            .map(|p| self.uses_of(p))
            .unwrap_or_default();
        let have = self.uses.get(&c.key).cloned().unwrap_or_default();
        if want == have {
            return;
        }
        for u in &want {
            if !have.contains(u) {
                let n = self.counts.entry(u.clone()).or_default();
                *n += 1;
                if *n == 1 {
                    self.attach(u);
                }
            }
        }
        for u in &have {
            if !want.contains(u)
                && let Some(n) = self.counts.get_mut(u)
            {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    self.counts.remove(u);
                    self.detach_later(u.clone());
                }
            }
        }
        if want.is_empty() {
            self.uses.remove(&c.key);
        } else {
            self.uses.insert(c.key.clone(), want);
        }
    }

    fn attach(&mut self, (pv, node): &Use) {
        let va = volume_attachment(pv, node);
        let created = self
            .ctx
            .store
            .create(&volumeattachments(), None, va, internal());
        if let Err(e) = &created
            && e.code != 409
        {
            tracing::warn!(pv, node, error = %e.message, "cannot attach a volume");
        }
        if created.is_ok() {
            self.ctx.audit.world(
                "attached",
                "volumeattachments",
                None,
                Some(&attachment_name(pv, node)),
                json!({"persistentVolume": pv, "node": node}),
            );
        }
    }

    /// Detaches after `timings.volume_detach` unless a pod took the volume on the node again.
    fn detach_later(&mut self, u: Use) {
        if !self.detaching.insert(u.clone()) {
            return;
        }
        let delay = self.ctx.timings.volume_detach;
        self.timers.spawn(async move {
            tokio::time::sleep(delay).await;
            u
        });
    }

    fn detach_due(&mut self, u: Use) {
        self.detaching.remove(&u);
        if self.counts.contains_key(&u) {
            return;
        }
        let (pv, node) = &u;
        let va_name = attachment_name(pv, node);
        if self
            .ctx
            .store
            .delete(
                &volumeattachments(),
                None,
                &va_name,
                &DeleteOptions::default(),
            )
            .is_ok()
        {
            self.ctx.audit.world(
                "detached",
                "volumeattachments",
                None,
                Some(&va_name),
                json!({"persistentVolume": pv, "node": node}),
            );
        }
    }
}
