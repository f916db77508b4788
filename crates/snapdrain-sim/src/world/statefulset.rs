//! The StatefulSet controller: pods `<sts>-<ordinal>` with stable names, claims
//! `<template>-<sts>-<ordinal>` created before their pod and kept after it, OrderedReady (one ordinal at
//! a time, each waiting for the previous to be Running and Ready) or Parallel management, scale-down
//! from the highest ordinal, recreation of deleted or failed pods under the same name, and status.
//! Rolling updates of a changed template are not simulated: existing pods keep their revision.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use serde_json::{Value, json};

use super::WorldContext;
use super::feed::{Change, Feed, ObjKey};
use super::objects::*;
use super::workloads::pod_from_template;
use crate::apiserver::store::WriteOptions;

struct Controller {
    ctx: Arc<WorldContext>,
    by_owner: HashMap<String, HashSet<ObjKey>>,
    by_uid: HashMap<String, ObjKey>,
    /// Pod names this controller has seen, so that a pod created again is reported as recreated.
    seen: HashSet<ObjKey>,
    dirty: HashSet<ObjKey>,
}

pub async fn run(ctx: Arc<WorldContext>) {
    let (mut sts_feed, initial_sets) = Feed::open(&ctx.store, statefulsets());
    let (mut pod_feed, initial_pods) = Feed::open(&ctx.store, pods());
    let mut c = Controller {
        ctx,
        by_owner: HashMap::new(),
        by_uid: HashMap::new(),
        seen: HashSet::new(),
        dirty: HashSet::new(),
    };
    for ch in initial_sets {
        c.on_set(&ch);
    }
    for ch in initial_pods {
        c.on_pod(&ch);
    }
    loop {
        c.reconcile_dirty(&sts_feed, &pod_feed);
        tokio::select! {
            changes = sts_feed.recv() => { for ch in changes { c.on_set(&ch); } }
            changes = pod_feed.recv() => { for ch in changes { c.on_pod(&ch); } }
        }
        for ch in sts_feed.try_recv() {
            c.on_set(&ch);
        }
        for ch in pod_feed.try_recv() {
            c.on_pod(&ch);
        }
    }
}

/// The ordinal of `pod_name` when it is `<set>-<n>`.
fn ordinal(set_name: &str, pod_name: &str) -> Option<usize> {
    pod_name
        .strip_prefix(set_name)?
        .strip_prefix('-')?
        .parse()
        .ok()
}

impl Controller {
    fn on_set(&mut self, ch: &Change) {
        if let Some(old) = &ch.old {
            self.by_uid.remove(uid(old));
        }
        if let Some(new) = &ch.new {
            self.by_uid.insert(uid(new).to_string(), ch.key.clone());
            self.dirty.insert(ch.key.clone());
        }
    }

    fn on_pod(&mut self, ch: &Change) {
        let old_owner = ch
            .old
            .as_deref()
            .and_then(|p| controller_uid(p, "StatefulSet"));
        let new_owner = ch
            .new
            .as_deref()
            .and_then(|p| controller_uid(p, "StatefulSet"));
        if let Some(o) = old_owner
            && new_owner != Some(o)
            && let Some(set) = self.by_owner.get_mut(o)
        {
            set.remove(&ch.key);
        }
        for owner in [old_owner, new_owner].into_iter().flatten() {
            if let Some(k) = self.by_uid.get(owner) {
                self.dirty.insert(k.clone());
            }
        }
        if let Some(o) = new_owner {
            self.by_owner
                .entry(o.to_string())
                .or_default()
                .insert(ch.key.clone());
            self.seen.insert(ch.key.clone());
        }
    }

    fn reconcile_dirty(&mut self, sts_feed: &Feed, pod_feed: &Feed) {
        for key in std::mem::take(&mut self.dirty) {
            if let Some(set) = sts_feed.get(&key).cloned() {
                self.reconcile(&set, pod_feed);
            }
        }
    }

    fn reconcile(&mut self, set: &Value, pod_feed: &Feed) {
        if is_terminating(set) {
            return;
        }
        let set_name = name(set);
        let ns = namespace(set);
        let replicas = i64_at(set, "/spec/replicas").unwrap_or(1).max(0) as usize;
        let parallel = str_at(set, "/spec/podManagementPolicy") == Some("Parallel");
        let revision = revision_of(set);
        let mut by_ordinal: BTreeMap<usize, Arc<Value>> = BTreeMap::new();
        for key in self.by_owner.get(uid(set)).into_iter().flatten() {
            if let Some(p) = pod_feed.get(key)
                && let Some(i) = ordinal(set_name, name(p))
            {
                by_ordinal.insert(i, p.clone());
            }
        }
        // Failed pods are deleted and come back under the same name.
        for p in by_ordinal.values() {
            if phase(p) == "Failed" && !is_terminating(p) {
                let _ =
                    self.ctx
                        .store
                        .delete(&pods(), Some(ns), name(p), &delete_uid(uid(p), Some(0)));
            }
        }
        for i in 0..replicas {
            match by_ordinal.get(&i) {
                None => {
                    self.create_pod(set, i, &revision);
                    if !parallel {
                        break;
                    }
                }
                Some(p) if !parallel && !pod_ready(p) => break,
                Some(_) => {}
            }
        }
        let extra: Vec<&Arc<Value>> = by_ordinal.range(replicas..).map(|(_, p)| p).rev().collect();
        let draining = extra.iter().any(|p| is_terminating(p));
        for p in extra.iter().filter(|p| !is_terminating(p)) {
            if !parallel && draining {
                break;
            }
            let _ = self
                .ctx
                .store
                .delete(&pods(), Some(ns), name(p), &delete_uid(uid(p), None));
            if !parallel {
                break;
            }
        }
        self.write_status(set, &by_ordinal, &revision);
    }

    fn create_pod(&mut self, set: &Value, i: usize, revision: &str) {
        let ns = namespace(set);
        let (pod, claims) = stateful_pod(set, i, revision);
        for (t, claim) in &claims {
            self.ensure_claim(set, t, claim);
        }
        let pod_name = name(&pod).to_string();
        let key = (ns.to_string(), pod_name.clone());
        match self
            .ctx
            .store
            .create(&pods(), Some(ns), pod, WriteOptions::default())
        {
            Ok(created) => {
                // Every pod made here is on record, the first of its name too: a pod with no record
                // is one a materialized scenario wrote Running before the log began (the chaos
                // judge's lost-with-node rule tells the two apart so).
                let verb = if self.seen.insert(key) {
                    "created"
                } else {
                    "recreated"
                };
                self.ctx.audit.world(
                    verb,
                    "pods",
                    Some(ns),
                    Some(&pod_name),
                    json!({"uid": uid(&created), "statefulSet": name(set),
                           "claims": claims.iter().map(|(_, c)| c.clone()).collect::<Vec<_>>()}),
                );
            }
            Err(e) if e.code == 409 => {}
            Err(e) => {
                tracing::warn!(pod = %pod_name, error = %e.message, "cannot create a StatefulSet pod")
            }
        }
    }

    fn ensure_claim(&self, set: &Value, template_name: &str, claim: &str) {
        let ns = namespace(set);
        if self.ctx.store.get(&pvcs(), Some(ns), claim).is_some() {
            return;
        }
        let Some(pvc) = claim_for(set, template_name, claim) else {
            return;
        };
        if let Err(e) = self
            .ctx
            .store
            .create(&pvcs(), Some(ns), pvc, WriteOptions::default())
            && e.code != 409
        {
            tracing::warn!(claim, error = %e.message, "cannot create a StatefulSet claim");
        }
    }

    fn write_status(&self, set: &Value, pods: &BTreeMap<usize, Arc<Value>>, revision: &str) {
        let live: Vec<&Arc<Value>> = pods.values().filter(|p| !is_terminal(p)).collect();
        let ready = live.iter().filter(|p| pod_ready(p)).count();
        let current = live
            .iter()
            .filter(|p| label(p, "controller-revision-hash") == Some(revision))
            .count();
        let status = json!({
            "observedGeneration": generation(set),
            "replicas": live.len(),
            "readyReplicas": ready,
            "availableReplicas": ready,
            "currentReplicas": current,
            "updatedReplicas": current,
            "currentRevision": revision,
            "updateRevision": revision,
            "collisionCount": 0,
        });
        write_status(&self.ctx, &statefulsets(), set, status);
    }
}

/// Replaces a workload's status (a no-op write when unchanged keeps the resourceVersion).
pub fn write_status(
    ctx: &WorldContext,
    res: &crate::apiserver::resources::ResKey,
    obj: &Value,
    status: Value,
) {
    if obj.get("status") == Some(&status) {
        return;
    }
    let _ = modify_uid(
        &ctx.store,
        res,
        ns_opt(namespace(obj)),
        name(obj),
        uid(obj),
        |o| {
            o["status"] = status;
            true
        },
    );
}

/// The revision label value of a set's current template.
pub fn revision_of(set: &Value) -> String {
    let template = set.pointer("/spec/template").cloned().unwrap_or(json!({}));
    format!("{}-{}", name(set), template_hash(&template))
}

/// Pod `<set>-<i>` and its (volume name, claim name) pairs.
pub fn stateful_pod(set: &Value, i: usize, revision: &str) -> (Value, Vec<(String, String)>) {
    let set_name = name(set);
    let ns = namespace(set);
    let pod_name = format!("{set_name}-{i}");
    let claims: Vec<(String, String)> = set
        .pointer("/spec/volumeClaimTemplates")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(|t| (name(t).to_string(), format!("{}-{pod_name}", name(t))))
        .collect();
    let template = set.pointer("/spec/template").cloned().unwrap_or(json!({}));
    let mut pod = pod_from_template(&template, ns, &pod_name, set);
    let l = &mut pod["metadata"]["labels"];
    l["statefulset.kubernetes.io/pod-name"] = json!(pod_name);
    l["controller-revision-hash"] = json!(revision);
    l["apps.kubernetes.io/pod-index"] = json!(i.to_string());
    pod["spec"]["hostname"] = json!(pod_name);
    if let Some(svc) = str_at(set, "/spec/serviceName").filter(|s| !s.is_empty()) {
        pod["spec"]["subdomain"] = json!(svc);
    }
    if !claims.is_empty() {
        let mut volumes: Vec<Value> = pod["spec"]["volumes"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        volumes.retain(|v| {
            !claims
                .iter()
                .any(|(t, _)| v.get("name").and_then(Value::as_str) == Some(t))
        });
        for (t, claim) in &claims {
            volumes.push(json!({"name": t, "persistentVolumeClaim": {"claimName": claim}}));
        }
        pod["spec"]["volumes"] = json!(volumes);
    }
    (pod, claims)
}

/// The claim `claim` from the set's volumeClaimTemplate `template_name`, labelled like the real
/// controller does (template labels plus the set's selector labels).
pub fn claim_for(set: &Value, template_name: &str, claim: &str) -> Option<Value> {
    let template = set
        .pointer("/spec/volumeClaimTemplates")
        .and_then(Value::as_array)?
        .iter()
        .find(|t| name(t) == template_name)?;
    let mut pvc = json!({
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": claim, "namespace": namespace(set), "labels": {}},
        "spec": template.get("spec").cloned().unwrap_or(json!({})),
    });
    if let Some(l) = template
        .pointer("/metadata/labels")
        .and_then(Value::as_object)
    {
        for (k, v) in l {
            pvc["metadata"]["labels"][k] = v.clone();
        }
    }
    if let Some(a) = template.pointer("/metadata/annotations") {
        pvc["metadata"]["annotations"] = a.clone();
    }
    if let Some(ml) = set
        .pointer("/spec/selector/matchLabels")
        .and_then(Value::as_object)
    {
        for (k, v) in ml {
            pvc["metadata"]["labels"][k] = v.clone();
        }
    }
    if pvc.pointer("/spec/accessModes").is_none() {
        pvc["spec"]["accessModes"] = json!(["ReadWriteOnce"]);
    }
    if pvc.pointer("/spec/volumeMode").is_none() {
        pvc["spec"]["volumeMode"] = json!("Filesystem");
    }
    Some(pvc)
}
