//! The warm-backup keeper: exactly one Velero Schedule per namespace with protected pods while the
//! policy's `spec.warmBackups` is set, and none once a namespace stops being protected or the option is
//! turned off (decisions: [`crate::planning::warm`]; this file reads the caches and writes).
//!
//! Runs on the Lease holder only. Crash-safe and idempotent: Schedule names are deterministic (a second
//! create is a 409), updates are guarded by the resourceVersion read, deletes by uid, and every pass
//! starts again from what the API server lists. Nothing is decided before the cluster's policy was read
//! (the built-in defaults have no warm backups, and would delete a user's Schedules) nor before the
//! pod, namespace and StatefulSet caches are filled (an empty cache reads as "nothing protected").

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::api::{Api, DeleteParams, ListParams, PostParams, Preconditions};
use kube::{Client, ResourceExt};
use tokio::sync::watch;

use super::cache::Caches;
use crate::api::policy::DisruptionPolicySpec;
use crate::api::velero_schedule::Schedule;
use crate::planning::inventory::{is_terminal, statefulset_owner};
use crate::planning::protection;
use crate::planning::warm::{self, Change, WARM_LABEL};

/// How often the Schedules are compared with the protected namespaces (and at once on a policy change).
/// A namespace's first protected pod waits at most this long for its Schedule, which runs hours apart.
const PASS: Duration = Duration::from_secs(5);

/// Keeps the Schedules until `until`.
pub async fn run(
    client: Client,
    caches: Caches,
    mut policy: watch::Receiver<DisruptionPolicySpec>,
    until: impl std::future::Future<Output = ()>,
) {
    let mut until = std::pin::pin!(until);
    // The follower announces the first valid policy it reads; until then nothing is decided.
    tokio::select! {
        () = &mut until => return,
        r = policy.changed() => if r.is_err() { return },
    }
    let api: Api<Schedule> = Api::all(client.clone());
    let mut warned = false;
    loop {
        let spec = policy.borrow_and_update().clone();
        let mut settled = false;
        if caches.pods.synced() && caches.namespaces.synced() && caches.stateful_sets.synced() {
            match pass(&client, &api, &caches, &spec).await {
                Ok(()) => {
                    warned = false;
                    settled = true;
                }
                // Velero's Schedule CRD missing (no Velero) with the option off is nothing to say.
                Err(e) if spec.warm_backups.is_none() => {
                    tracing::debug!(error = %e, "warm backups: cannot list Schedules");
                }
                Err(e) => {
                    if !warned {
                        tracing::warn!(error = %e, "warm backups: cannot list Velero Schedules (is Velero installed, and may snapdrain list schedules.velero.io?); trying again");
                    }
                    warned = true;
                }
            }
        }
        // Off: one pass deleted what an earlier setting left; nothing changes until the policy does,
        // so no LIST every few seconds on the clusters that do not use the option.
        let off = spec.warm_backups.is_none() && settled;
        tokio::select! {
            () = &mut until => return,
            r = policy.changed() => if r.is_err() { return },
            () = tokio::time::sleep(PASS), if !off => {}
        }
    }
}

/// One comparison and the writes it asks for. Err only when the Schedules cannot be listed.
async fn pass(
    client: &Client,
    api: &Api<Schedule>,
    caches: &Caches,
    spec: &DisruptionPolicySpec,
) -> Result<(), kube::Error> {
    let desired = warm::desired(spec, &protected_namespaces(caches, spec));
    let existing = api
        .list(&ListParams::default().labels(&format!("{WARM_LABEL}=true")))
        .await?
        .items;
    for change in warm::changes(&desired, &existing) {
        apply(client, change).await;
    }
    Ok(())
}

/// Namespace → what its warm backups select, for every namespace with a protected pod. A namespace
/// whose labels are not cached yet is left out while the policy has a namespaceSelector: its Schedule
/// comes on a later pass (a Schedule made too early would back up a namespace the policy leaves out).
fn protected_namespaces(
    caches: &Caches,
    spec: &DisruptionPolicySpec,
) -> BTreeMap<String, Vec<LabelSelector>> {
    let mut pods: BTreeMap<String, Vec<(String, Option<LabelSelector>)>> = BTreeMap::new();
    for cached in caches.pods.all() {
        // Cheap first: only pods with a PVC can be protected.
        if !cached.may_be_held() {
            continue;
        }
        let pod = cached.to_pod();
        if is_terminal(&pod) {
            continue;
        }
        let labels = caches.namespaces.labels_of(&pod);
        if spec.protection.namespace_selector.is_some() && labels.is_none() {
            continue;
        }
        if !protection::protects(&spec.protection, &pod, labels.as_ref()) {
            continue;
        }
        let ns = pod.namespace().unwrap_or_default();
        let selector = statefulset_owner(&pod)
            .and_then(|sts| caches.stateful_sets.get(&ns, sts))
            .and_then(|sts| sts.selector().cloned());
        pods.entry(ns).or_default().push((pod.name_any(), selector));
    }
    pods.into_iter()
        .map(|(ns, pods)| (ns, warm::namespace_selectors(&pods)))
        .collect()
}

async fn apply(client: &Client, change: Change) {
    match change {
        Change::Create(s) => {
            let ns = s.metadata.namespace.clone().unwrap_or_default();
            let api: Api<Schedule> = Api::namespaced(client.clone(), &ns);
            match api.create(&PostParams::default(), &s).await {
                Ok(_) => {
                    tracing::info!(schedule = %s.name_any(), namespace = %ns, "created a warm-backup Velero Schedule")
                }
                // Made by an earlier pass (or replica) this list did not see yet, or a Schedule of that
                // name that is not snapdrain's: either way nothing to write now.
                Err(kube::Error::Api(e)) if e.code == 409 => {
                    tracing::debug!(schedule = %s.name_any(), "warm-backup Schedule exists")
                }
                Err(e) => {
                    tracing::warn!(schedule = %s.name_any(), namespace = %ns, error = %e, "cannot create a warm-backup Velero Schedule (may snapdrain create schedules.velero.io there?); trying again")
                }
            }
        }
        Change::Update(s) => {
            let ns = s.metadata.namespace.clone().unwrap_or_default();
            let api: Api<Schedule> = Api::namespaced(client.clone(), &ns);
            match api.replace(&s.name_any(), &PostParams::default(), &s).await {
                Ok(_) => {
                    tracing::info!(schedule = %s.name_any(), namespace = %ns, "brought a warm-backup Velero Schedule back to the policy")
                }
                // Velero (or a person) wrote it since the list: the next pass compares again.
                Err(kube::Error::Api(e)) if e.code == 409 || e.code == 404 => {}
                Err(e) => {
                    tracing::warn!(schedule = %s.name_any(), namespace = %ns, error = %e, "cannot update a warm-backup Velero Schedule; trying again")
                }
            }
        }
        Change::Delete {
            namespace,
            name,
            uid,
        } => {
            let api: Api<Schedule> = Api::namespaced(client.clone(), &namespace);
            let params = DeleteParams {
                preconditions: Some(Preconditions {
                    uid,
                    resource_version: None,
                }),
                ..DeleteParams::default()
            };
            match api.delete(&name, &params).await {
                Ok(_) => {
                    tracing::info!(schedule = %name, namespace = %namespace, "deleted a warm-backup Velero Schedule no protected namespace needs (its Backups stay, under their TTL)")
                }
                Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => {}
                Err(e) => {
                    tracing::warn!(schedule = %name, namespace = %namespace, error = %e, "cannot delete a warm-backup Velero Schedule; trying again")
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::cache::CachedPod;
    use crate::controller::cache::pod::WirePod;
    use kube::runtime::watcher::Event;
    use serde_json::json;

    fn sts_pod(ns: &str, name: &str, sts: &str, phase: &str) -> CachedPod {
        let wire: WirePod = serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": ns, "uid": format!("{ns}-{name}"),
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "StatefulSet", "name": sts,
                                     "uid": "s", "controller": true}]},
            "spec": {"containers": [], "nodeName": "n1",
                     "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": format!("data-{name}")}}]},
            "status": {"phase": phase}
        }))
        .expect("a pod");
        CachedPod::from(wire)
    }

    fn caches() -> Caches {
        let c = Caches::new();
        for (ns, env) in [("shop", "prod"), ("scratch", "scratch"), ("done", "prod")] {
            c.namespaces.apply(Event::Apply(
                serde_json::from_value(json!({"metadata": {"name": ns, "labels": {"env": env}}}))
                    .expect("a namespace"),
            ));
        }
        c.stateful_sets.apply(Event::Apply(
            serde_json::from_value::<k8s_openapi::api::apps::v1::StatefulSet>(
                json!({"metadata": {"name": "pg", "namespace": "shop"},
                "spec": {"selector": {"matchLabels": {"app": "pg"}}, "serviceName": "pg",
                         "template": {"spec": {"containers": []}}}}),
            )
            .expect("a StatefulSet")
            .into(),
        ));
        c.pods
            .apply(Event::Apply(sts_pod("shop", "pg-0", "pg", "Running")));
        // Its StatefulSet not cached: selected by its own name.
        c.pods
            .apply(Event::Apply(sts_pod("shop", "cache-0", "cache", "Running")));
        c.pods
            .apply(Event::Apply(sts_pod("scratch", "tmp-0", "tmp", "Running")));
        // A finished pod protects nothing.
        c.pods
            .apply(Event::Apply(sts_pod("done", "job-0", "job", "Succeeded")));
        c
    }

    #[test]
    fn protected_namespaces_follow_the_policy_protection() {
        let c = caches();
        let all = protected_namespaces(&c, &DisruptionPolicySpec::defaults());
        assert_eq!(all.keys().collect::<Vec<_>>(), ["scratch", "shop"]);
        let shop: Vec<String> = all["shop"]
            .iter()
            .map(|s| serde_json::to_string(s).expect("json"))
            .collect();
        assert_eq!(
            shop,
            [
                r#"{"matchLabels":{"app":"pg"}}"#,
                r#"{"matchLabels":{"statefulset.kubernetes.io/pod-name":"cache-0"}}"#
            ]
        );
        let narrowed: DisruptionPolicySpec = serde_json::from_value(json!({"protection": {
            "namespaceSelector": {"matchExpressions": [{"key": "env", "operator": "NotIn", "values": ["scratch"]}]}}}))
        .expect("a policy");
        assert_eq!(
            protected_namespaces(&c, &narrowed)
                .keys()
                .collect::<Vec<_>>(),
            ["shop"]
        );
    }
}
