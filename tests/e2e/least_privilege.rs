//! Least privilege, proven on the simulated cluster with RBAC enforced: the kustomize base is applied
//! with the real `kubectl apply -k deploy/kustomize/base` (kubectl's embedded kustomize renders it), the
//! controller runs in-process with the Deployment's own arguments and a kube client holding only the
//! ServiceAccount's token (from a TokenRequest), and four flows complete: an
//! Execute plan with replacement, an Execute plan on a node no autoscaler owns (snapdrain terminates
//! the instance and deletes the Node), a Release plan under a Karpenter drift, and the eviction gate
//! under `kubectl drain`. Then:
//! - no request of the ServiceAccount was refused (the simulator's authorization log, which records
//!   user, verb, resource, subresource, namespace and name as kube-apiserver's audit events do), and
//! - no rule is unused: the recorded requests are replayed against the roles with one rule removed,
//!   and with one verb of one rule removed, by the SIMULATOR's RBAC authorizer (modelled on kubernetes
//!   `plugin/pkg/auth/authorizer/rbac/rbac.go`; it imports nothing from the product). Every rule must
//!   then refuse some recorded request. Verbs only rare paths use are listed in [`RARE_PATHS`] with the
//!   path and the test that takes it; every verb these flows leave unused must be listed there.
//!
//! Replaying instead of re-running each flow per removed rule: the authorizer is a pure function of the
//! request and the role objects, so a request the narrower role refuses is a 403 the controller would
//! have got at that point; re-running the flows for each of 60-odd verbs would cost minutes of CI for the same verdict.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use k8s_openapi::api::authentication::v1::TokenRequest;
use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use kube::ResourceExt;
use kube::api::{Api, ListParams, PostParams};
use serde_json::Value;
use snapdrain::api::status::PlanPhase;
use snapdrain::api::{DisruptionPlan, PlanSource};
use snapdrain::controller::ControllerHandle;
use snapdrain_sim::apiserver::admission::ADDRESS_ANNOTATION;
use snapdrain_sim::apiserver::auth::Decision;
use snapdrain_sim::apiserver::auth::rbac::{self, Attributes, Policy};
use snapdrain_testkit::harness::{Harness, replacing_spec};
use snapdrain_testkit::kubectl::Kubectl;

use super::kustomize::kustomize;

const SA_USER: &str = "system:serviceaccount:snapdrain:snapdrain";

/// Verbs of the base's roles that the flows here never use, each with the path that does and
/// the e2e test that takes it (those run with the same roles through the chart: deploy.rs renders the
/// same rules). (role, resource, verb).
const RARE_PATHS: &[(&str, &str, &str, &str)] = &[
    // Finished plans past the policy's history.ttlAfterFinished (72h by default) are deleted
    // (controller::history); history.rs runs with a TTL of seconds.
    (
        "snapdrain",
        "disruptionplans",
        "delete",
        "finished plan past its TTL",
    ),
    // An abandoned backup attempt Velero never started is deleted (controller::steps::backups);
    // real_velero.rs / resilience.rs abandon attempts.
    ("snapdrain", "backups", "delete", "abandoned backup attempt"),
    // A plan releasing network volumes at their CSI snapshot reads Velero's VolumeSnapshots and their
    // contents (controller::steps::csi_release); volumes.rs takes it.
    (
        "snapdrain",
        "volumesnapshots",
        "list",
        "release at the CSI snapshot",
    ),
    (
        "snapdrain",
        "volumesnapshotcontents",
        "get",
        "release at the CSI snapshot",
    ),
    (
        "snapdrain",
        "deletebackuprequests",
        "create",
        "abandoned attempt Velero started",
    ),
    // Reusing a recent backup in a plan without backup.storageLocation lists the locations for the
    // default one (controller::steps::plan effective_location); signals.rs's release-window test.
    (
        "snapdrain",
        "backupstoragelocations",
        "list",
        "backup reuse, default location",
    ),
    // Volumes still attached when the detach wait starts are watched until they go (drain::wait); the
    // simulator detaches in 50 ms, so the first list usually finds none. real_drain.rs.
    (
        "snapdrain",
        "volumeattachments",
        "watch",
        "volumes still attached",
    ),
    // The serving certificate is renewed with a third of its life left (gate.rs rotation test).
    (
        "snapdrain-webhook",
        "secrets",
        "update",
        "certificate renewal",
    ),
    // The policy's NotificationsReady condition is written only when a notification webhook is
    // configured (controller::notifications); notifications.rs's urlSecretRef test.
    (
        "snapdrain",
        "disruptionpolicies/status",
        "patch",
        "notification webhook configured",
    ),
    // A repeated Event is patched (its count) instead of created again.
    ("snapdrain", "events", "patch", "repeated Event"),
    // Warm backups are off in these flows: the keeper only lists its Schedules (controller::warm).
    // With policy spec.warmBackups it creates, updates and deletes them: warm_backups.rs, and with the
    // base's roles admission_policies.rs's warm-backup Schedules test.
    ("snapdrain", "schedules", "create", "warm backups turned on"),
    (
        "snapdrain",
        "schedules",
        "update",
        "warm backups' schedule changed",
    ),
    (
        "snapdrain",
        "schedules",
        "delete",
        "warm backups turned off",
    ),
    // backup.method Auto makes a Velero resource policy only for a namespace with a volume to snapshot
    // (a CSI driver with a VolumeSnapshotClass); these flows have none. volumes.rs's snapshot test.
    (
        "snapdrain-velero-secrets",
        "configmaps",
        "create",
        "volume policy of a CSI snapshot backup",
    ),
];

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The base's Deployment.
fn deployment() -> Value {
    kustomize("deploy/kustomize/base")
        .into_iter()
        .find(|o| o["kind"] == "Deployment")
        .expect("the base has a Deployment")
}

/// The controller's options from the Deployment's container args, parsed by the CLI itself; the
/// listeners move to loopback ports of the test's choosing.
fn run_options_from_the_deployment() -> snapdrain::controller::run::RunOptions {
    let d = deployment();
    let args: Vec<String> = d["spec"]["template"]["spec"]["containers"][0]["args"]
        .as_array()
        .expect("container args")
        .iter()
        .filter_map(|a| a.as_str().map(str::to_string))
        .collect();
    let cli = snapdrain_cli::cli::Cli::try_parse_from(
        std::iter::once("snapdrain".to_string()).chain(args.iter().cloned()),
    )
    .unwrap_or_else(|e| panic!("the Deployment's args {args:?} do not parse: {e}"));
    let snapdrain_cli::cli::Command::Controller(c) = cli.command else {
        panic!("the Deployment runs `snapdrain controller`: {args:?}");
    };
    let mut opts = c.run_options();
    // POD_NAMESPACE is the Deployment's namespace: the CLI's default is the same.
    let ns = d["metadata"]["namespace"].as_str().expect("a namespace");
    assert_eq!(
        opts.lease_namespace.as_deref(),
        Some(ns),
        "leader election on"
    );
    let webhook = opts
        .webhook
        .as_mut()
        .expect("the Deployment serves the gate");
    assert_eq!(webhook.namespace, ns);
    webhook.addr = std::net::SocketAddr::from(([127, 0, 0, 1], 0));
    opts.metrics_addr = None;
    opts.lease_seconds = 2;
    opts
}

struct Installed {
    kubectl: Kubectl,
    controller: ControllerHandle,
}

/// `kubectl apply -k deploy/kustomize/base`, a token for the ServiceAccount, and the controller with
/// only that token; the webhook Service then points at where the gate listens.
async fn install(h: &Harness) -> Installed {
    let kubectl = Kubectl::new(&h.cluster);
    let base = root().join("deploy/kustomize/base");
    kubectl
        .ok(&["apply", "-k", &base.display().to_string()])
        .await;
    // TokenRequest through kube-rs: `kubectl create token` sends protobuf, which the simulator does not
    // read (README, known gaps).
    let request: TokenRequest =
        serde_json::from_value(serde_json::json!({"spec": {"audiences": []}})).expect("request");
    let token = Api::<ServiceAccount>::namespaced(h.client.clone(), "snapdrain")
        .create_token_request("snapdrain", &PostParams::default(), &request)
        .await
        .expect("TokenRequest for the base's ServiceAccount")
        .status
        .expect("a token in the status")
        .token;
    let mut config = h.kube_config();
    config.auth_info = kube::config::AuthInfo {
        token: Some(token.into()),
        ..Default::default()
    };
    let controller = snapdrain::controller::start(
        config,
        h.settings("snapdrain-0"),
        run_options_from_the_deployment(),
    )
    .await
    .expect("the controller starts with the ServiceAccount's token");
    let addr = controller.webhook_addr.expect("the gate listens");
    kubectl
        .ok(&[
            "annotate",
            "service",
            "snapdrain-webhook",
            "-n",
            "snapdrain",
            &format!("{ADDRESS_ANNOTATION}={addr}"),
        ])
        .await;
    Installed {
        kubectl,
        controller,
    }
}

fn decisions(h: &Harness) -> Vec<Decision> {
    h.cluster
        .api
        .state
        .auth
        .decisions()
        .into_iter()
        .filter(|d| d.user.name == SA_USER)
        .collect()
}

async fn completed(h: &Harness, plan: &str) -> DisruptionPlan {
    let done = h
        .wait_plan(plan, Duration::from_secs(120), PlanPhase::is_terminal)
        .await;
    let status = done.status.clone().expect("a terminal plan has a status");
    assert_eq!(
        status.phase,
        PlanPhase::Completed,
        "{plan}: {:?}",
        status.message
    );
    done
}

async fn execute_with_replacement() -> Vec<Decision> {
    let h = Harness::start().await;
    let installed = install(&h).await;
    let node = h.node_with_statefulset_pods().await;
    // From the scenario's EC2NodeClass, so reading it (by name) is part of the flow.
    let mut spec = replacing_spec(&node);
    spec["replacement"]["nodeClassRef"] = serde_json::json!({"name": "default"});
    h.create_plan("lp-execute", spec).await;
    let done = completed(&h, "lp-execute").await;
    let status = done.status.expect("status");
    assert!(
        status
            .nodes
            .iter()
            .any(|n| n.replacement.as_ref().is_some_and(|r| r.ready)),
        "a replacement was launched: {status:?}"
    );
    installed.controller.shutdown().await;
    decisions(&h)
}

/// The quickstart's nodes without Karpenter: an Execute plan terminates the instance itself and deletes
/// the Node. Its Backup selects whole StatefulSets (`backup.scope: StatefulSet`), whose selectors come
/// from the controller's StatefulSet cache: the roles grant no `get` on StatefulSets, so a GET per
/// StatefulSet would be refused here.
async fn execute_on_a_node_no_autoscaler_owns() -> Vec<Decision> {
    let h = Harness::start_scenario("quickstart", |s| {
        for group in &mut s.nodes {
            group.karpenter = None;
        }
    })
    .await;
    let installed = install(&h).await;
    let node = h.node_with_statefulset_pods().await;
    h.create_plan(
        "lp-plain-node",
        serde_json::json!({"nodes": [node], "backup": {"scope": "StatefulSet"}}),
    )
    .await;
    completed(&h, "lp-plain-node").await;
    // The StatefulSets' own selectors, not the pods by name (what the scope falls back to when it
    // finds no StatefulSet).
    let backups: Api<snapdrain::api::velero::Backup> = Api::namespaced(h.client.clone(), "velero");
    let selectors: Vec<_> = backups
        .list(&ListParams::default().labels("snapdrain.io/plan=lp-plain-node"))
        .await
        .expect("list the plan's Backups")
        .items
        .into_iter()
        .flat_map(|b| b.spec.or_label_selectors)
        .collect();
    assert!(
        !selectors.is_empty()
            && selectors.iter().all(|sel| {
                sel.match_labels
                    .as_ref()
                    .is_none_or(|l| !l.contains_key("statefulset.kubernetes.io/pod-name"))
            }),
        "the Backups select by the StatefulSets' selectors: {selectors:?}"
    );
    assert!(h.node(&node).await.is_none(), "the Node object was deleted");
    installed.controller.shutdown().await;
    decisions(&h)
}

async fn release_under_drift() -> Vec<Decision> {
    let h = Harness::start().await;
    let installed = install(&h).await;
    let node = h.node_with_statefulset_pods().await;
    let claim = h.nodeclaim_of(&node).await;
    snapdrain_testkit::karpenter::mark_drifted(&h.client, &claim)
        .await
        .expect("mark the NodeClaim drifted");
    let plans: Api<DisruptionPlan> = Api::all(h.client.clone());
    let found = h
        .wait_all(plans, "a Karpenter plan for the node", |ps| {
            ps.iter().any(|p| {
                p.spec.source == PlanSource::Karpenter && p.spec.nodes.iter().any(|n| n == &node)
            })
        })
        .await;
    let plan = found
        .into_iter()
        .find(|p| p.spec.nodes.iter().any(|n| n == &node))
        .expect("the wait returned it");
    completed(&h, &plan.name_any()).await;
    installed.controller.shutdown().await;
    decisions(&h)
}

async fn gate_under_kubectl_drain() -> Vec<Decision> {
    let h = Harness::start().await;
    let installed = install(&h).await;
    let node = h.node_with_statefulset_pods().await;
    let (ok, stdout, stderr) = installed
        .kubectl
        .spawn(&[
            "drain",
            &node,
            "--ignore-daemonsets",
            "--delete-emptydir-data",
            "--timeout=90s",
        ])
        .finish()
        .await;
    assert!(ok, "kubectl drain completes:\n{stdout}\n{stderr}");
    let plans = Api::<DisruptionPlan>::all(h.client.clone())
        .list(&ListParams::default())
        .await
        .expect("list plans");
    let gate_plan = plans
        .items
        .iter()
        .find(|p| p.spec.source == PlanSource::EvictionGate)
        .unwrap_or_else(|| {
            panic!("the gate (failurePolicy Ignore) was reached and started a plan: {stderr}")
        });
    completed(&h, &gate_plan.name_any()).await;
    installed.controller.shutdown().await;
    decisions(&h)
}

/// The base's roles as the cluster holds them after `kubectl apply`.
async fn applied_roles(h: &Harness) -> (Vec<Value>, Vec<Value>, Vec<Value>, Vec<Value>) {
    fn json<T: serde::Serialize>(items: Vec<T>) -> Vec<Value> {
        items
            .into_iter()
            .map(|i| serde_json::to_value(i).expect("RBAC objects serialize"))
            .collect()
    }
    let lp = ListParams::default();
    let c = h.client.clone();
    (
        json(
            Api::<ClusterRole>::all(c.clone())
                .list(&lp)
                .await
                .expect("list")
                .items,
        ),
        json(
            Api::<ClusterRoleBinding>::all(c.clone())
                .list(&lp)
                .await
                .expect("list")
                .items,
        ),
        json(
            Api::<Role>::all(c.clone())
                .list(&lp)
                .await
                .expect("list")
                .items,
        ),
        json(
            Api::<RoleBinding>::all(c)
                .list(&lp)
                .await
                .expect("list")
                .items,
        ),
    )
}

fn refused(
    roles: &(Vec<Value>, Vec<Value>, Vec<Value>, Vec<Value>),
    requests: &[Decision],
) -> Vec<Attributes> {
    let policy = Policy {
        cluster_roles: &roles.0,
        cluster_role_bindings: &roles.1,
        roles: &roles.2,
        role_bindings: &roles.3,
    };
    requests
        .iter()
        .filter(|d| !rbac::allows(&policy, &d.user, &d.attributes))
        .map(|d| d.attributes.clone())
        .collect()
}

/// The roles the base ships for the controller: (index in the ClusterRole list or Role list, is a
/// ClusterRole). The ClusterRoles for people (plan viewer, plan editor, policy admin) are bound to no
/// ServiceAccount of the base and left out; deploy.rs and admission_policies.rs check them.
fn shipped(roles: &(Vec<Value>, Vec<Value>, Vec<Value>, Vec<Value>)) -> Vec<(bool, usize, String)> {
    let ours = |o: &Value| {
        o.pointer("/metadata/labels/app.kubernetes.io~1name") == Some(&Value::from("snapdrain"))
    };
    let bound = |r: &Value| {
        roles
            .1
            .iter()
            .any(|b| b["roleRef"]["name"] == r["metadata"]["name"])
    };
    let mut out = Vec::new();
    for (i, r) in roles
        .0
        .iter()
        .enumerate()
        .filter(|(_, r)| ours(r) && bound(r))
    {
        out.push((
            true,
            i,
            r["metadata"]["name"].as_str().unwrap_or("").to_string(),
        ));
    }
    for (i, r) in roles.2.iter().enumerate().filter(|(_, r)| ours(r)) {
        out.push((
            false,
            i,
            r["metadata"]["name"].as_str().unwrap_or("").to_string(),
        ));
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_kustomize_base_is_enough_and_every_rule_is_used() {
    let mut requests = execute_with_replacement().await;
    requests.extend(execute_on_a_node_no_autoscaler_owns().await);
    requests.extend(release_under_drift().await);
    requests.extend(gate_under_kubectl_drain().await);
    let forbidden: Vec<&Decision> = requests.iter().filter(|d| !d.allowed).collect();
    assert!(
        forbidden.is_empty(),
        "the ServiceAccount got 403s: {:#?}",
        forbidden.iter().map(|d| &d.attributes).collect::<Vec<_>>()
    );

    // The roles as applied (identical in every cluster above: the same manifests).
    let h = Harness::start().await;
    let _installed = install(&h).await;
    let roles = applied_roles(&h).await;
    assert!(
        refused(&roles, &requests).is_empty(),
        "the replay agrees with the server"
    );
    let mut unused_verbs = BTreeSet::new();
    let ours = shipped(&roles);
    assert_eq!(
        ours.iter()
            .map(|(_, _, n)| n.as_str())
            .collect::<BTreeSet<_>>(),
        BTreeSet::from([
            "snapdrain",
            "snapdrain-leader-election",
            "snapdrain-velero-secrets",
            "snapdrain-webhook"
        ]),
    );
    for (cluster, idx, name) in &ours {
        let list = |r: &(Vec<Value>, Vec<Value>, Vec<Value>, Vec<Value>)| {
            if *cluster {
                r.0[*idx].clone()
            } else {
                r.2[*idx].clone()
            }
        };
        let rules = list(&roles)["rules"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        for (i, rule) in rules.iter().enumerate() {
            let with_rules = |new_rules: Vec<Value>| {
                let mut narrowed = roles.clone();
                let target = if *cluster {
                    &mut narrowed.0[*idx]
                } else {
                    &mut narrowed.2[*idx]
                };
                target["rules"] = Value::from(new_rules);
                narrowed
            };
            let verbs: Vec<Value> = rule["verbs"].as_array().cloned().unwrap_or_default();
            let only_rare = verbs.iter().all(|v| {
                rule["resources"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .all(|res| {
                        RARE_PATHS.iter().any(|(r, rs, rv, _)| {
                            r == name && Some(*rs) == res.as_str() && Some(*rv) == v.as_str()
                        })
                    })
            });
            let mut without = rules.clone();
            without.remove(i);
            assert!(
                only_rare || !refused(&with_rules(without), &requests).is_empty(),
                "rule {rule} of {name} is unused: no recorded request needs it"
            );
            for v in &verbs {
                let mut narrowed_rule = rule.clone();
                narrowed_rule["verbs"] = Value::from(
                    verbs
                        .iter()
                        .filter(|x| *x != v)
                        .cloned()
                        .collect::<Vec<_>>(),
                );
                let mut narrowed_rules = rules.clone();
                narrowed_rules[i] = narrowed_rule;
                if refused(&with_rules(narrowed_rules), &requests).is_empty() {
                    for res in rule["resources"].as_array().into_iter().flatten() {
                        unused_verbs.insert((
                            name.clone(),
                            res.as_str().unwrap_or("").to_string(),
                            v.as_str().unwrap_or("").to_string(),
                        ));
                    }
                }
            }
        }
    }
    let rare: BTreeSet<(String, String, String)> = RARE_PATHS
        .iter()
        .map(|(r, res, v, _)| (r.to_string(), res.to_string(), v.to_string()))
        .collect();
    let unlisted: Vec<_> = unused_verbs.difference(&rare).collect();
    assert!(
        unlisted.is_empty(),
        "verbs no request needed and RARE_PATHS does not list: {unlisted:?}; remove them from the role or name the path that uses them"
    );
    // RARE_PATHS names only verbs the roles grant (some, e.g. the VolumeAttachment watch, are used
    // here only when timing lets them: a subset check, not equality).
    let granted: BTreeSet<(String, String, String)> = ours
        .iter()
        .flat_map(|(cluster, idx, name)| {
            let role = if *cluster {
                &roles.0[*idx]
            } else {
                &roles.2[*idx]
            };
            role["rules"]
                .as_array()
                .cloned()
                .unwrap_or_default()
                .into_iter()
                .flat_map(move |r| {
                    let name = name.clone();
                    let verbs: Vec<String> = r["verbs"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .filter_map(|v| v.as_str().map(str::to_string))
                        .collect();
                    r["resources"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .filter_map(|x| x.as_str().map(str::to_string))
                        .flat_map(move |res| {
                            let name = name.clone();
                            verbs
                                .clone()
                                .into_iter()
                                .map(move |v| (name.clone(), res.clone(), v))
                        })
                        .collect::<Vec<_>>()
                })
        })
        .collect();
    let stale: Vec<_> = rare.difference(&granted).collect();
    assert!(
        stale.is_empty(),
        "RARE_PATHS lists verbs no role grants: {stale:?}"
    );
}

/// Security review L-2: the hold keeper decides whether the plan that released a pod still runs from
/// the plans it lists and watches, with the base's roles (which grant no `get` on plans). A Release
/// plan releases the protected pods; the plan is then deleted with its finalizer taken off, so it
/// leaves the keeper's store without ever being seen over; the pods get their holds back and the
/// ServiceAccount got no 403. Before, the keeper asked the API server for the missing plan, got a 403,
/// read it as "running" and left the pods released for good.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_deleted_plans_released_pods_get_their_holds_back_without_a_get() {
    use k8s_openapi::api::core::v1::Pod;
    use kube::api::{DeleteParams, Patch, PatchParams};
    use snapdrain::planning::holds::{HoldState, state};
    use snapdrain_testkit::eventually_within;

    let h = Harness::start().await;
    let installed = install(&h).await;
    let node = h.node_with_statefulset_pods().await;
    let protected: Vec<(String, String)> = h
        .protected_pods_on(&node)
        .await
        .keys()
        .filter_map(|k| {
            let (ns, name) = k.split_once('/')?;
            Some((ns.to_string(), name.to_string()))
        })
        .collect();
    assert!(!protected.is_empty(), "the node runs protected pods");
    let states = || async {
        let mut out = Vec::new();
        for (ns, name) in &protected {
            let pod = Api::<Pod>::namespaced(h.client.clone(), ns)
                .get(name)
                .await
                .expect("the protected pod");
            out.push(state(&pod));
        }
        out
    };
    h.create_plan(
        "lp-released",
        serde_json::json!({"nodes": [node], "mode": "Release", "releaseWindow": "1h"}),
    )
    .await;
    eventually_within(
        "the plan released its pods",
        Duration::from_secs(120),
        || async {
            states()
                .await
                .iter()
                .all(|s| *s == HoldState::Released("lp-released".into()))
                .then_some(())
        },
    )
    .await;
    let plans: Api<DisruptionPlan> = Api::all(h.client.clone());
    plans
        .patch(
            "lp-released",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"metadata": {"finalizers": null}})),
        )
        .await
        .expect("take the finalizer off");
    plans
        .delete("lp-released", &DeleteParams::default())
        .await
        .expect("delete the plan");
    eventually_within(
        "the released pods are held again",
        Duration::from_secs(60),
        || async {
            states()
                .await
                .iter()
                .all(|s| matches!(s, HoldState::Held(_)))
                .then_some(())
        },
    )
    .await;
    installed.controller.shutdown().await;
    let forbidden: Vec<_> = decisions(&h)
        .into_iter()
        .filter(|d| !d.allowed)
        .map(|d| d.attributes)
        .collect();
    assert!(
        forbidden.is_empty(),
        "the ServiceAccount got 403s: {forbidden:#?}"
    );
}
