//! The garbage collector, background propagation only: when an owner is gone, every object whose
//! ownerReferences name its uid is deleted; an object created with an owner that does not exist (or
//! has another uid) is deleted too. Owners are looked up by uid in an index, never by scanning.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use futures::future::select_all;
use serde_json::{Value, json};

use super::WorldContext;
use super::feed::{Change, Feed, ObjKey};
use super::objects::*;
use crate::apiserver::resources::ResKey;
use crate::apiserver::store::DeleteOptions;

/// Kinds that own others here: (kind, resource, namespaced).
fn owner_kinds() -> Vec<(&'static str, ResKey, bool)> {
    vec![
        ("StatefulSet", statefulsets(), true),
        ("Deployment", deployments(), true),
        ("ReplicaSet", replicasets(), true),
        ("DaemonSet", daemonsets(), true),
        ("Job", jobs(), true),
        ("NodeClaim", nodeclaims(), false),
        ("NodePool", nodepools(), false),
        ("Backup", ResKey::new("velero.io", "backups"), true),
        // A PodVolumeBackup's hosting pod (Velero 1.17+).
        (
            "PodVolumeBackup",
            ResKey::new("velero.io", "podvolumebackups"),
            true,
        ),
    ]
}

/// Kinds whose objects have owners here.
fn dependent_kinds() -> Vec<ResKey> {
    vec![
        pods(),
        replicasets(),
        pvcs(),
        nodes(),
        nodeclaims(),
        ResKey::new("velero.io", "podvolumebackups"),
    ]
}

struct Gc {
    ctx: Arc<WorldContext>,
    /// owner uid → dependents (resource, key).
    dependents: HashMap<String, HashSet<(usize, ObjKey)>>,
    deps: Vec<ResKey>,
    owners: Vec<(&'static str, ResKey, bool)>,
}

pub async fn run(ctx: Arc<WorldContext>) {
    let owners = owner_kinds();
    let deps = dependent_kinds();
    let mut gc = Gc {
        ctx: ctx.clone(),
        dependents: HashMap::new(),
        deps: deps.clone(),
        owners: owners.clone(),
    };
    // Feeds 0..deps.len() are dependents, the rest owners.
    let mut feeds = Vec::new();
    let mut initial = Vec::new();
    for res in deps.iter().chain(owners.iter().map(|(_, r, _)| r)) {
        let (f, changes) = Feed::open(&ctx.store, res.clone());
        feeds.push(f);
        initial.push(changes);
    }
    for (i, changes) in initial.into_iter().enumerate() {
        for ch in changes {
            gc.on_change(i, &ch);
        }
    }
    loop {
        let (changes, i, _) = select_all(feeds.iter_mut().map(|f| Box::pin(f.recv()))).await;
        for ch in changes {
            gc.on_change(i, &ch);
        }
    }
}

fn owner_uids(obj: &Value) -> Vec<(&str, &str, &str)> {
    obj.pointer("/metadata/ownerReferences")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(|r| {
            (
                r.get("kind").and_then(Value::as_str).unwrap_or(""),
                r.get("name").and_then(Value::as_str).unwrap_or(""),
                r.get("uid").and_then(Value::as_str).unwrap_or(""),
            )
        })
        .collect()
}

impl Gc {
    fn on_change(&mut self, feed: usize, ch: &Change) {
        if feed < self.deps.len() {
            self.on_dependent(feed, ch);
        }
        // Replicasets and nodeclaims are both dependents and owners: they appear in both feed ranges.
        if feed >= self.deps.len()
            && ch.new.is_none()
            && let Some(old) = &ch.old
        {
            self.owner_gone(uid(old));
        }
    }

    fn on_dependent(&mut self, feed: usize, ch: &Change) {
        let entry = (feed, ch.key.clone());
        if let Some(old) = &ch.old {
            for (_, _, u) in owner_uids(old) {
                if let Some(set) = self.dependents.get_mut(u) {
                    set.remove(&entry);
                    if set.is_empty() {
                        self.dependents.remove(u);
                    }
                }
            }
        }
        let Some(new) = &ch.new else {
            return;
        };
        let refs = owner_uids(new);
        for (_, _, u) in &refs {
            self.dependents
                .entry(u.to_string())
                .or_default()
                .insert(entry.clone());
        }
        if ch.old.is_none() && !refs.is_empty() && !is_terminating(new) {
            self.check_dangling(feed, new, &refs);
        }
    }

    /// A new object whose owner does not exist is garbage from the start.
    fn check_dangling(&self, feed: usize, obj: &Value, refs: &[(&str, &str, &str)]) {
        for (kind, owner_name, owner_uid) in refs {
            let Some((_, res, namespaced)) = self.owners.iter().find(|(k, _, _)| k == kind) else {
                continue;
            };
            let ns = if *namespaced {
                ns_opt(namespace(obj))
            } else {
                None
            };
            // Only meaningful when the owner's kind is served (its CRD may not be installed).
            if self.ctx.store.def(res).is_none() {
                continue;
            }
            let alive = self
                .ctx
                .store
                .get(res, ns, owner_name)
                .is_some_and(|o| uid(&o) == *owner_uid);
            if alive {
                return;
            }
        }
        let all_known = refs
            .iter()
            .all(|(k, _, _)| self.owners.iter().any(|(kind, _, _)| kind == k));
        if all_known {
            self.delete(feed, obj, "owner does not exist");
        }
    }

    fn owner_gone(&mut self, owner_uid: &str) {
        let Some(deps) = self.dependents.remove(owner_uid) else {
            return;
        };
        for (feed, (ns, obj_name)) in deps {
            let res = &self.deps[feed];
            // Objects here have one owner (workloads, Karpenter, Velero), so the first owner gone decides.
            if let Some(obj) = self.ctx.store.get(res, ns_opt(&ns), &obj_name)
                && !is_terminating(&obj)
                && owner_uids(&obj).iter().any(|(_, _, u)| *u == owner_uid)
            {
                self.delete(feed, &obj, "owner deleted");
            }
        }
    }

    fn delete(&self, feed: usize, obj: &Value, why: &str) {
        let res = &self.deps[feed];
        let opts = DeleteOptions {
            precondition_uid: Some(uid(obj).to_string()),
            ..Default::default()
        };
        if self
            .ctx
            .store
            .delete(res, ns_opt(namespace(obj)), name(obj), &opts)
            .is_ok()
        {
            self.ctx.audit.world(
                "garbage-collected",
                &res.plural,
                ns_opt(namespace(obj)),
                Some(name(obj)),
                json!({"reason": why}),
            );
        }
    }
}
