//! Deployments, ReplicaSets, DaemonSets and Jobs, each a small reconciler over its owned children.
//!
//! Simplifications: a Deployment rollout replaces the old ReplicaSets at once (scale new up, old to 0)
//! instead of stepping by maxSurge/maxUnavailable; a Job without `completions` needs `parallelism`
//! successes; failed Job pods are counted but not retried (no backoffLimit).

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::sync::Arc;

use serde_json::{Map, Value, json};

use super::WorldContext;
use super::feed::{Change, Feed, ObjKey};
use super::kubelet::RUN_FOR_MS;
use super::objects::*;
use super::statefulset::write_status;
use crate::apiserver::resources::ResKey;
use crate::apiserver::store::WriteOptions;

/// A pod for `owner` from a pod template, with the defaults the API server's admission would add.
/// `pod_name` ending in '-' becomes a generateName.
pub fn pod_from_template(template: &Value, ns: &str, pod_name: &str, owner: &Value) -> Value {
    let mut meta = json!({
        "namespace": ns,
        "labels": template.pointer("/metadata/labels").cloned().unwrap_or(json!({})),
        "ownerReferences": [controller_ref(owner)],
    });
    if let Some(a) = template.pointer("/metadata/annotations") {
        meta["annotations"] = a.clone();
    }
    if pod_name.ends_with('-') {
        meta["generateName"] = json!(pod_name);
    } else {
        meta["name"] = json!(pod_name);
    }
    let mut spec = template.get("spec").cloned().unwrap_or(json!({}));
    for (field, default) in [
        ("restartPolicy", json!("Always")),
        ("terminationGracePeriodSeconds", json!(30)),
        ("schedulerName", json!("default-scheduler")),
        ("dnsPolicy", json!("ClusterFirst")),
        ("serviceAccountName", json!("default")),
        ("enableServiceLinks", json!(true)),
        ("preemptionPolicy", json!("PreemptLowerPriority")),
        ("priority", json!(0)),
    ] {
        if spec.get(field).is_none() {
            spec[field] = default;
        }
    }
    // The DefaultTolerationSeconds admission plugin.
    let mut tolerations = spec["tolerations"].as_array().cloned().unwrap_or_default();
    for key in [
        "node.kubernetes.io/not-ready",
        "node.kubernetes.io/unreachable",
    ] {
        if !tolerations
            .iter()
            .any(|t| t.get("key").and_then(Value::as_str) == Some(key))
        {
            tolerations.push(json!({"key": key, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}));
        }
    }
    spec["tolerations"] = json!(tolerations);
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec})
}

/// Owners of one kind, their children of one kind, and which owners need a look.
struct Owned {
    kind: &'static str,
    by_owner: HashMap<String, HashSet<ObjKey>>,
    by_uid: HashMap<String, ObjKey>,
    dirty: HashSet<ObjKey>,
}

impl Owned {
    fn on_owner(&mut self, ch: &Change) {
        if let Some(old) = &ch.old {
            self.by_uid.remove(uid(old));
        }
        if let Some(new) = &ch.new {
            self.by_uid.insert(uid(new).to_string(), ch.key.clone());
            self.dirty.insert(ch.key.clone());
        }
    }

    fn on_child(&mut self, ch: &Change) {
        let old_owner = ch.old.as_deref().and_then(|p| controller_uid(p, self.kind));
        let new_owner = ch.new.as_deref().and_then(|p| controller_uid(p, self.kind));
        if let Some(o) = old_owner
            && new_owner != Some(o)
            && let Some(set) = self.by_owner.get_mut(o)
        {
            set.remove(&ch.key);
            if set.is_empty() {
                self.by_owner.remove(o);
            }
        }
        if let Some(o) = new_owner {
            self.by_owner
                .entry(o.to_string())
                .or_default()
                .insert(ch.key.clone());
        }
        for owner in [old_owner, new_owner].into_iter().flatten() {
            if let Some(k) = self.by_uid.get(owner) {
                self.dirty.insert(k.clone());
            }
        }
    }

    fn children(&self, owner: &Value, feed: &Feed) -> Vec<Arc<Value>> {
        self.by_owner
            .get(uid(owner))
            .into_iter()
            .flatten()
            .filter_map(|k| feed.get(k).cloned())
            .collect()
    }
}

type Reconcile = fn(&WorldContext, &Value, Vec<Arc<Value>>, Option<&Feed>);

/// The loop shared by the workload controllers: owners, children and (for DaemonSets) nodes.
async fn run_owned(
    ctx: Arc<WorldContext>,
    owner_res: ResKey,
    child_res: ResKey,
    kind: &'static str,
    watch_nodes: bool,
    reconcile: Reconcile,
) {
    let (mut owners, initial_owners) = Feed::open(&ctx.store, owner_res);
    let (mut children, initial_children) = Feed::open(&ctx.store, child_res);
    let mut node_feed = watch_nodes.then(|| Feed::open(&ctx.store, nodes()).0);
    let mut o = Owned {
        kind,
        by_owner: HashMap::new(),
        by_uid: HashMap::new(),
        dirty: HashSet::new(),
    };
    for ch in initial_owners {
        o.on_owner(&ch);
    }
    for ch in initial_children {
        o.on_child(&ch);
    }
    loop {
        for key in std::mem::take(&mut o.dirty) {
            if let Some(owner) = owners.get(&key).cloned()
                && !is_terminating(&owner)
            {
                reconcile(
                    &ctx,
                    &owner,
                    o.children(&owner, &children),
                    node_feed.as_ref(),
                );
            }
        }
        let nodes_changed = async {
            match node_feed.as_mut() {
                Some(f) => f.recv().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            changes = owners.recv() => { for ch in changes { o.on_owner(&ch); } }
            changes = children.recv() => { for ch in changes { o.on_child(&ch); } }
            changes = nodes_changed => {
                if !changes.is_empty() {
                    o.dirty.extend(o.by_uid.values().cloned());
                }
            }
        }
        for ch in owners.try_recv() {
            o.on_owner(&ch);
        }
        for ch in children.try_recv() {
            o.on_child(&ch);
        }
        if let Some(f) = node_feed.as_mut()
            && !f.try_recv().is_empty()
        {
            o.dirty.extend(o.by_uid.values().cloned());
        }
    }
}

pub fn deployments_run(ctx: Arc<WorldContext>) -> impl Future<Output = ()> {
    run_owned(
        ctx,
        deployments(),
        replicasets(),
        "Deployment",
        false,
        reconcile_deployment,
    )
}
pub fn replicasets_run(ctx: Arc<WorldContext>) -> impl Future<Output = ()> {
    run_owned(
        ctx,
        replicasets(),
        pods(),
        "ReplicaSet",
        false,
        reconcile_replicaset,
    )
}
pub fn daemonsets_run(ctx: Arc<WorldContext>) -> impl Future<Output = ()> {
    run_owned(
        ctx,
        daemonsets(),
        pods(),
        "DaemonSet",
        true,
        reconcile_daemonset,
    )
}
pub fn jobs_run(ctx: Arc<WorldContext>) -> impl Future<Output = ()> {
    run_owned(ctx, jobs(), pods(), "Job", false, reconcile_job)
}

fn replicas(obj: &Value) -> i64 {
    i64_at(obj, "/spec/replicas").unwrap_or(1).max(0)
}

fn create_pod(ctx: &WorldContext, pod: Value) {
    if let Err(e) = ctx
        .store
        .create(&pods(), None, pod, WriteOptions::default())
    {
        tracing::warn!(error = %e.message, "cannot create a workload pod");
    }
}

/// The ReplicaSet a Deployment's current template needs: `<deployment>-<pod-template-hash>`.
pub fn replicaset_for(dep: &Value, revision: usize) -> Value {
    let mut template = dep.pointer("/spec/template").cloned().unwrap_or(json!({}));
    let hash = template_hash(&template);
    if !template
        .pointer("/metadata/labels")
        .is_some_and(Value::is_object)
    {
        template["metadata"]["labels"] = json!({});
    }
    template["metadata"]["labels"]["pod-template-hash"] = json!(hash);
    let mut selector = dep.pointer("/spec/selector").cloned().unwrap_or(json!({}));
    selector["matchLabels"]["pod-template-hash"] = json!(hash);
    let want = replicas(dep);
    json!({
        "apiVersion": "apps/v1",
        "kind": "ReplicaSet",
        "metadata": {
            "name": format!("{}-{hash}", name(dep)), "namespace": namespace(dep),
            "labels": template["metadata"]["labels"].clone(),
            "annotations": {"deployment.kubernetes.io/desired-replicas": want.to_string(),
                            "deployment.kubernetes.io/revision": revision.to_string()},
            "ownerReferences": [controller_ref(dep)],
        },
        "spec": {"replicas": want, "selector": selector, "template": template},
    })
}

fn reconcile_deployment(ctx: &WorldContext, dep: &Value, sets: Vec<Arc<Value>>, _: Option<&Feed>) {
    let ns = namespace(dep);
    let rs = replicaset_for(dep, sets.len() + 1);
    let rs_name = name(&rs).to_string();
    let want = replicas(dep);
    let mut current: Option<&Arc<Value>> = None;
    for rs in &sets {
        if name(rs) == rs_name {
            current = Some(rs);
        } else if replicas(rs) != 0 {
            let _ = modify_uid(
                &ctx.store,
                &replicasets(),
                Some(ns),
                name(rs),
                uid(rs),
                |r| {
                    r["spec"]["replicas"] = json!(0);
                    true
                },
            );
        }
    }
    match current {
        None => {
            if let Err(e) = ctx
                .store
                .create(&replicasets(), Some(ns), rs, WriteOptions::default())
                && e.code != 409
            {
                tracing::warn!(error = %e.message, "cannot create a ReplicaSet");
            }
        }
        Some(rs) if replicas(rs) != want => {
            let _ = modify_uid(
                &ctx.store,
                &replicasets(),
                Some(ns),
                name(rs),
                uid(rs),
                |r| {
                    r["spec"]["replicas"] = json!(want);
                    true
                },
            );
        }
        Some(_) => {}
    }
    let sum = |f: &str| -> i64 {
        sets.iter()
            .map(|r| i64_at(r, &format!("/status/{f}")).unwrap_or(0))
            .sum()
    };
    let updated = current.map_or(0, |r| i64_at(r, "/status/replicas").unwrap_or(0));
    let available = sum("availableReplicas");
    let mut status = json!({
        "observedGeneration": generation(dep),
        "replicas": sum("replicas"),
        "updatedReplicas": updated,
        "readyReplicas": sum("readyReplicas"),
        "availableReplicas": available,
        "unavailableReplicas": (want - available).max(0),
    });
    let (avail, reason) = if available >= want {
        ("True", "MinimumReplicasAvailable")
    } else {
        ("False", "MinimumReplicasUnavailable")
    };
    // Conditions keep their transition times from the stored status.
    let mut with_conds = json!({"status": dep.get("status").cloned().unwrap_or(json!({}))});
    set_condition(&mut with_conds, "Available", avail, reason, "");
    set_condition(
        &mut with_conds,
        "Progressing",
        "True",
        "NewReplicaSetAvailable",
        "",
    );
    status["conditions"] = with_conds["status"]["conditions"].clone();
    write_status(ctx, &deployments(), dep, status);
}

fn reconcile_replicaset(
    ctx: &WorldContext,
    rs: &Value,
    children: Vec<Arc<Value>>,
    _: Option<&Feed>,
) {
    let ns = namespace(rs);
    let mut active: Vec<&Arc<Value>> = children
        .iter()
        .filter(|p| !is_terminating(p) && !is_terminal(p))
        .collect();
    let want = replicas(rs) as usize;
    if active.len() < want {
        let template = rs.pointer("/spec/template").cloned().unwrap_or(json!({}));
        for _ in active.len()..want {
            create_pod(
                ctx,
                pod_from_template(&template, ns, &format!("{}-", name(rs)), rs),
            );
        }
    } else if active.len() > want {
        // Like the real controller: unscheduled first, then not ready, then the newest.
        active.sort_by_key(|p| {
            (
                node_name(p).is_some(),
                pod_ready(p),
                std::cmp::Reverse(
                    str_at(p, "/metadata/creationTimestamp")
                        .unwrap_or("")
                        .to_string(),
                ),
            )
        });
        for p in &active[..active.len() - want] {
            let _ = ctx
                .store
                .delete(&pods(), Some(ns), name(p), &delete_uid(uid(p), None));
        }
    }
    let live: Vec<&Arc<Value>> = children
        .iter()
        .filter(|p| !is_terminating(p) && !is_terminal(p))
        .collect();
    let ready = live.iter().filter(|p| pod_ready(p)).count();
    let status = json!({
        "observedGeneration": generation(rs),
        "replicas": live.len(),
        "fullyLabeledReplicas": live.len(),
        "readyReplicas": ready,
        "availableReplicas": ready,
    });
    write_status(ctx, &replicasets(), rs, status);
}

/// The tolerations the DaemonSet controller adds to its pods.
fn daemon_tolerations(spec: &mut Value) {
    let mut tolerations = spec["tolerations"].as_array().cloned().unwrap_or_default();
    for (key, effect) in [
        ("node.kubernetes.io/not-ready", "NoExecute"),
        ("node.kubernetes.io/unreachable", "NoExecute"),
        ("node.kubernetes.io/disk-pressure", "NoSchedule"),
        ("node.kubernetes.io/memory-pressure", "NoSchedule"),
        ("node.kubernetes.io/pid-pressure", "NoSchedule"),
        ("node.kubernetes.io/unschedulable", "NoSchedule"),
    ] {
        if !tolerations.iter().any(|t| {
            t.get("key").and_then(Value::as_str) == Some(key)
                && t.get("effect").and_then(Value::as_str) == Some(effect)
        }) {
            tolerations.push(json!({"key": key, "operator": "Exists", "effect": effect}));
        }
    }
    spec["tolerations"] = json!(tolerations);
}

/// The node a DaemonSet pod is for: its nodeName, or the node its required affinity names.
fn daemon_pod_node(pod: &Value) -> Option<String> {
    if let Some(n) = node_name(pod) {
        return Some(n.to_string());
    }
    pod.pointer("/spec/affinity/nodeAffinity/requiredDuringSchedulingIgnoredDuringExecution/nodeSelectorTerms/0/matchFields/0/values/0")
        .and_then(Value::as_str)
        .map(str::to_string)
}

/// A DaemonSet's pod template with the tolerations the controller adds.
pub fn daemon_template(ds: &Value) -> Value {
    let mut template = ds.pointer("/spec/template").cloned().unwrap_or(json!({}));
    daemon_tolerations(&mut template["spec"]);
    template
}

/// The DaemonSet's pod for `node`, pinned there by required node affinity as the real controller does.
pub fn daemon_pod(ds: &Value, template: &Value, node: &str) -> Value {
    let mut t = template.clone();
    if !t.pointer("/metadata/labels").is_some_and(Value::is_object) {
        t["metadata"]["labels"] = json!({});
    }
    t["metadata"]["labels"]["controller-revision-hash"] = json!(template_hash(template));
    t["metadata"]["labels"]["pod-template-generation"] = json!(generation(ds).to_string());
    t["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"] = json!({
        "nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}]
    });
    pod_from_template(&t, namespace(ds), &format!("{}-", name(ds)), ds)
}

fn reconcile_daemonset(
    ctx: &WorldContext,
    ds: &Value,
    children: Vec<Arc<Value>>,
    node_feed: Option<&Feed>,
) {
    let ns = namespace(ds);
    let template = daemon_template(ds);
    let probe = json!({"spec": template["spec"].clone()});
    let mut by_node: HashMap<String, Vec<&Arc<Value>>> = HashMap::new();
    for p in &children {
        if let Some(n) = daemon_pod_node(p) {
            by_node.entry(n).or_default().push(p);
        }
    }
    let mut desired = 0;
    let mut scheduled = 0;
    let mut ready = 0;
    let mut eligible: HashSet<&str> = HashSet::new();
    for node in node_feed.into_iter().flat_map(Feed::objects) {
        // A Node being deleted keeps its daemon pods: kube-controller-manager's DaemonSet controller
        // (pkg/controller/daemon/daemon_controller.go, `manage` over every listed node and
        // `NodeShouldRunDaemonPod`) never looks at the Node's deletionTimestamp, so Velero's node-agent
        // keeps running on a node Karpenter is terminating until the Node object is gone.
        if !node_affinity_allows(&probe, node) {
            continue;
        }
        let existing: Vec<&&Arc<Value>> = by_node
            .get(name(node))
            .into_iter()
            .flatten()
            .filter(|p| !is_terminating(p))
            .collect();
        // New pods need every NoSchedule/NoExecute taint tolerated; running ones only NoExecute.
        // The sim places no new daemon pod on a terminating node (the real controller would create one
        // and it would never start there): only running ones stay.
        let may_place = !is_terminating(node) && untolerated_taint(&probe, node).is_none();
        let may_stay = node
            .pointer("/spec/taints")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter(|t| t.get("effect").and_then(Value::as_str) == Some("NoExecute"))
            .all(|t| tolerates(probe.pointer("/spec/tolerations"), t));
        if !(may_place || (may_stay && !existing.is_empty())) {
            continue;
        }
        eligible.insert(name(node));
        desired += 1;
        let live: Vec<&&Arc<Value>> = existing
            .iter()
            .copied()
            .filter(|p| phase(p) != "Failed")
            .collect();
        for failed in existing.iter().filter(|p| phase(p) == "Failed") {
            let _ = ctx.store.delete(
                &pods(),
                Some(ns),
                name(failed),
                &delete_uid(uid(failed), Some(0)),
            );
        }
        if live.is_empty() {
            if may_place {
                create_pod(ctx, daemon_pod(ds, &template, name(node)));
            }
        } else {
            scheduled += 1;
            if live.iter().any(|p| pod_ready(p)) {
                ready += 1;
            }
            for extra in live.iter().skip(1) {
                let _ = ctx.store.delete(
                    &pods(),
                    Some(ns),
                    name(extra),
                    &delete_uid(uid(extra), None),
                );
            }
        }
    }
    // Pods for nodes that are gone or no longer eligible.
    for (node, ps) in &by_node {
        if !eligible.contains(node.as_str()) {
            for p in ps.iter().filter(|p| !is_terminating(p)) {
                let _ = ctx
                    .store
                    .delete(&pods(), Some(ns), name(p), &delete_uid(uid(p), None));
            }
        }
    }
    let status = json!({
        "observedGeneration": generation(ds),
        "desiredNumberScheduled": desired,
        "currentNumberScheduled": scheduled,
        "updatedNumberScheduled": scheduled,
        "numberReady": ready,
        "numberAvailable": ready,
        "numberUnavailable": desired - ready,
        "numberMisscheduled": 0,
    });
    write_status(ctx, &daemonsets(), ds, status);
}

fn reconcile_job(ctx: &WorldContext, job: &Value, children: Vec<Arc<Value>>, _: Option<&Feed>) {
    let ns = namespace(job);
    let parallelism = i64_at(job, "/spec/parallelism").unwrap_or(1).max(0);
    let completions = i64_at(job, "/spec/completions").unwrap_or(parallelism.max(1));
    let succeeded = children.iter().filter(|p| phase(p) == "Succeeded").count() as i64;
    let failed = children.iter().filter(|p| phase(p) == "Failed").count() as i64;
    let active = children
        .iter()
        .filter(|p| !is_terminal(p) && !is_terminating(p))
        .count() as i64;
    let ready = children.iter().filter(|p| pod_ready(p)).count() as i64;
    let done = succeeded >= completions;
    let suspended = job.pointer("/spec/suspend").and_then(Value::as_bool) == Some(true);
    if !done && !suspended {
        let to_create = (parallelism - active)
            .min(completions - succeeded - active)
            .max(0);
        let mut template = job.pointer("/spec/template").cloned().unwrap_or(json!({}));
        if !template
            .pointer("/metadata/labels")
            .is_some_and(Value::is_object)
        {
            template["metadata"]["labels"] = json!({});
        }
        let l = &mut template["metadata"]["labels"];
        for (k, v) in [
            ("batch.kubernetes.io/controller-uid", uid(job)),
            ("batch.kubernetes.io/job-name", name(job)),
            ("controller-uid", uid(job)),
            ("job-name", name(job)),
        ] {
            l[k] = json!(v);
        }
        if let Some(ms) = annotation(job, RUN_FOR_MS)
            && template
                .pointer("/metadata/annotations")
                .and_then(|a| a.get(RUN_FOR_MS))
                .is_none()
        {
            if !template
                .pointer("/metadata/annotations")
                .is_some_and(Value::is_object)
            {
                template["metadata"]["annotations"] = json!({});
            }
            template["metadata"]["annotations"][RUN_FOR_MS] = json!(ms);
        }
        if template.pointer("/spec/restartPolicy").is_none() {
            template["spec"]["restartPolicy"] = json!("Never");
        }
        for _ in 0..to_create {
            create_pod(
                ctx,
                pod_from_template(&template, ns, &format!("{}-", name(job)), job),
            );
        }
    }
    let mut status = job.get("status").cloned().unwrap_or(json!({}));
    let obj = status
        .as_object_mut()
        .map(std::mem::take)
        .unwrap_or_default();
    let mut s: Map<String, Value> = obj;
    s.insert("active".into(), json!(if done { 0 } else { active }));
    s.insert("succeeded".into(), json!(succeeded));
    s.insert("failed".into(), json!(failed));
    s.insert("ready".into(), json!(ready));
    s.insert(
        "terminating".into(),
        json!(children.iter().filter(|p| is_terminating(p)).count()),
    );
    s.entry("startTime").or_insert_with(|| json!(now()));
    s.entry("uncountedTerminatedPods")
        .or_insert_with(|| json!({}));
    let mut status = json!({"status": Value::Object(s)});
    if done && condition(&status, "Complete") != Some("True") {
        set_condition(
            &mut status,
            "SuccessCriteriaMet",
            "True",
            "CompletionsReached",
            "Reached expected number of succeeded pods",
        );
        set_condition(
            &mut status,
            "Complete",
            "True",
            "CompletionsReached",
            "Reached expected number of succeeded pods",
        );
        status["status"]["completionTime"] = json!(now());
    }
    write_status(ctx, &jobs(), job, status["status"].take());
}
