//! `snapdrain holds list` and `snapdrain holds release --all` (the binary) against the simulated cluster:
//! the release takes away exactly the annotations snapdrain placed (those listed in `snapdrain.io/held`
//! and still at its value, and its own `held` / `released-by` marks), never a user's own
//! `do-not-disrupt` or `safe-to-evict`, and changes nothing the second time. A running controller's hold
//! keeper places the holds again, which is why an uninstall stops the controller first.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;
use snapdrain_sim::apiserver::faults::FaultRule;
use snapdrain_testkit::harness::{Harness, TIMEOUT};

const BIN: &str = env!("CARGO_BIN_EXE_snapdrain");

// The annotation names, written out here rather than taken from the product (the oracle is independent).
const DO_NOT_DISRUPT: &str = "karpenter.sh/do-not-disrupt";
const SAFE_TO_EVICT: &str = "cluster-autoscaler.kubernetes.io/safe-to-evict";
const HELD: &str = "snapdrain.io/held";
const RELEASED_BY: &str = "snapdrain.io/released-by";

struct Out {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

async fn snapdrain(kubeconfig: &Path, args: &[&str]) -> Out {
    let mut c = tokio::process::Command::new(BIN);
    c.args(args)
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .env_remove("KUBECONFIG")
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .kill_on_drop(true);
    let out = tokio::time::timeout(TIMEOUT, c.output())
        .await
        .unwrap_or_else(|_| panic!("snapdrain {args:?} did not finish within {TIMEOUT:?}"))
        .expect("snapdrain runs");
    Out {
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// A kubeconfig for the simulated cluster, in a temporary directory that lives as long as the guard.
fn kubeconfig(h: &Harness) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().expect("temp dir");
    let kc = h
        .cluster
        .write_kubeconfig(&dir.path().join("kubeconfig"))
        .expect("kubeconfig written");
    (dir, kc)
}

fn annotation<'a>(p: &'a Pod, key: &str) -> Option<&'a str> {
    p.annotations().get(key).map(String::as_str)
}

fn is_statefulset_pod(p: &Pod) -> bool {
    let n = p.name_any();
    n.starts_with("postgres-") || n.starts_with("redis-")
}

async fn annotate(h: &Harness, pod: &str, key: &str, value: &str) {
    let pods: Api<Pod> = Api::namespaced(h.client.clone(), "shop");
    pods.patch(
        pod,
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"annotations": {key: value}}})),
    )
    .await
    .unwrap_or_else(|e| panic!("annotate {pod}: {e}"));
}

async fn shop_pods(h: &Harness) -> Vec<Pod> {
    let pods: Api<Pod> = Api::namespaced(h.client.clone(), "shop");
    pods.list(&Default::default())
        .await
        .expect("list pods")
        .items
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn release_all_removes_exactly_snapdrains_holds_keeps_a_users_own_and_is_idempotent() {
    let h = Harness::start().await;
    let (_dir, kc) = kubeconfig(&h);
    // The node the plan below drains, and a protected pod elsewhere (a user's do-not-disrupt on the
    // node would block that drain).
    let node = h.node_with_statefulset_pods().await;
    let user_pod = shop_pods(&h)
        .await
        .into_iter()
        .filter(is_statefulset_pod)
        .find(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) != Some(node.as_str()))
        .map(|p| p.name_any())
        .expect("a StatefulSet pod on another node");
    // A user's own holds, set before snapdrain runs: on a protected pod (snapdrain then adds only
    // safe-to-evict) and on an unprotected web pod.
    annotate(&h, &user_pod, DO_NOT_DISRUPT, "true").await;
    let web = shop_pods(&h)
        .await
        .into_iter()
        .map(|p| p.name_any())
        .find(|n| n.starts_with("web-"))
        .expect("the quickstart scenario runs web pods");
    annotate(&h, &web, SAFE_TO_EVICT, "false").await;

    // Every pod's annotations before snapdrain ran: exactly what must be left in the end.
    let before: BTreeMap<String, BTreeMap<String, String>> = shop_pods(&h)
        .await
        .iter()
        .map(|p| (p.name_any(), p.annotations().clone()))
        .collect();

    // Both of snapdrain's pod holds, Cluster Autoscaler's too, for the CLI to remove.
    h.set_policy(json!({"holds": {"clusterAutoscaler": "SafeToEvictFalse"}}))
        .await;
    let controller = h.controller().await;
    let pods: Api<Pod> = Api::namespaced(h.client.clone(), "shop");
    h.wait_all(pods.clone(), "every StatefulSet pod held", |ps| {
        ps.iter()
            .filter(|p| is_statefulset_pod(p))
            .filter(|p| annotation(p, HELD).is_some())
            .count()
            == 5
    })
    .await;
    // A Release-mode plan (waiting for Karpenter, which never comes) leaves released pods marked with it:
    // the state an uninstall in the middle of a plan finds.
    h.create_plan("holds-cli", json!({"nodes": [node], "mode": "Release"}))
        .await;
    h.wait_plan_until("holds-cli", TIMEOUT, |p| {
        p.status.as_ref().is_some_and(|s| s.released_at.is_some())
    })
    .await;
    h.wait_all(pods.clone(), "a pod released by the plan", |ps| {
        ps.iter()
            .any(|p| annotation(p, RELEASED_BY) == Some("holds-cli"))
    })
    .await;

    let list = snapdrain(&kc, &["holds", "list"]).await;
    assert_eq!(list.code, Some(0), "{}", list.stderr);
    let header = list.stdout.lines().next().unwrap_or_default();
    assert!(
        header.starts_with("NAMESPACE") && header.contains("NODE"),
        "{}",
        list.stdout
    );
    assert!(
        list.stdout.contains("released by plan holds-cli"),
        "{}",
        list.stdout
    );
    assert!(
        !list.stdout.contains(&web),
        "a user's own hold is not snapdrain's: {}",
        list.stdout
    );

    // With the controller still running, its hold keeper places the holds again: why the README and the
    // chart's pre-delete hook stop the controller before releasing.
    let early = snapdrain(&kc, &["holds", "release", "--all"]).await;
    assert_eq!(early.code, Some(0), "{}", early.stderr);
    h.wait_all(
        pods.clone(),
        "the keeper's holds back on every StatefulSet pod",
        |ps| {
            ps.iter()
                .filter(|p| is_statefulset_pod(p))
                .filter(|p| annotation(p, HELD).is_some())
                .count()
                == 5
        },
    )
    .await;

    controller.shutdown().await;
    // Two patches answered 409 Conflict, as for a concurrent writer: the command reads the pod again
    // and retries.
    h.cluster.faults.add(FaultRule {
        verb: Some("patch".into()),
        resource: Some("pods".into()),
        error_rate: 1.0,
        error_code: Some(409),
        times: Some(2),
        ..FaultRule::default()
    });
    let release = snapdrain(&kc, &["holds", "release", "--all"]).await;
    assert_eq!(release.code, Some(0), "{}", release.stderr);
    assert!(
        release
            .stdout
            .contains(&format!("shop/{user_pod}: removed {SAFE_TO_EVICT}")),
        "{}",
        release.stdout
    );
    let after = shop_pods(&h).await;
    for p in &after {
        let name = p.name_any();
        for key in [HELD, RELEASED_BY] {
            assert_eq!(annotation(p, key), None, "{name} still carries {key}");
        }
        let (dnd, ste) = (annotation(p, DO_NOT_DISRUPT), annotation(p, SAFE_TO_EVICT));
        match name.as_str() {
            n if n == user_pod => {
                assert_eq!(dnd, Some("true"), "the user's do-not-disrupt stays");
                assert_eq!(ste, None, "snapdrain's safe-to-evict goes");
            }
            n if n == web => {
                assert_eq!(ste, Some("false"), "the user's safe-to-evict stays");
                assert_eq!(dnd, None);
            }
            _ => assert_eq!((dnd, ste), (None, None), "{name}: snapdrain's holds go"),
        }
    }

    let now: BTreeMap<String, BTreeMap<String, String>> = after
        .iter()
        .map(|p| (p.name_any(), p.annotations().clone()))
        .collect();
    assert_eq!(now, before, "every pod is as it was before snapdrain");

    // Idempotent: nothing left, nothing written.
    let versions = |ps: &[Pod]| -> BTreeMap<String, Option<String>> {
        ps.iter()
            .map(|p| (p.name_any(), p.resource_version()))
            .collect()
    };
    let again = snapdrain(&kc, &["holds", "release", "--all"]).await;
    assert_eq!(again.code, Some(0), "{}", again.stderr);
    assert!(
        again.stdout.contains("nothing to release"),
        "{}",
        again.stdout
    );
    assert_eq!(versions(&shop_pods(&h).await), versions(&after));
    let empty = snapdrain(&kc, &["holds", "list"]).await;
    assert!(
        empty.stdout.contains("no pod carries snapdrain's holds"),
        "{}",
        empty.stdout
    );
}

#[tokio::test]
async fn a_bad_kubeconfig_or_context_or_an_unreachable_cluster_is_a_clear_error() {
    let dir = tempfile::tempdir().expect("temp dir");
    let missing = dir.path().join("no-such-kubeconfig");
    let out = snapdrain(&missing, &["holds", "release", "--all"]).await;
    assert_eq!(out.code, Some(1));
    assert!(
        out.stderr.contains("cannot read kubeconfig") && out.stderr.contains("no-such-kubeconfig"),
        "{}",
        out.stderr
    );

    // A kubeconfig whose only cluster listens nowhere (port 1 is never served here).
    let unreachable = dir.path().join("kubeconfig");
    std::fs::write(
        &unreachable,
        "apiVersion: v1\nkind: Config\ncurrent-context: sim\n\
         clusters: [{name: sim, cluster: {server: 'http://127.0.0.1:1'}}]\n\
         users: [{name: sim, user: {token: t}}]\n\
         contexts: [{name: sim, context: {cluster: sim, user: sim}}]\n",
    )
    .expect("write kubeconfig");
    let out = snapdrain(
        &unreachable,
        &["holds", "release", "--all", "--context", "nope"],
    )
    .await;
    assert_eq!(out.code, Some(1));
    assert!(
        out.stderr.contains("no usable context") && out.stderr.contains("nope"),
        "{}",
        out.stderr
    );
    let out = snapdrain(&unreachable, &["holds", "list"]).await;
    assert_eq!(out.code, Some(1));
    assert!(
        out.stderr.contains("cannot list pods in all namespaces"),
        "{}",
        out.stderr
    );
    // `--all` is not implied: without it nothing runs.
    let out = snapdrain(&unreachable, &["holds", "release"]).await;
    assert_eq!(out.code, Some(2));
    assert!(out.stderr.contains("--all"), "{}", out.stderr);
    for text in [&out.stdout, &out.stderr] {
        assert!(!text.contains("panicked"), "{text}");
    }
}

/// More held pods than one page of a LIST (500, client-go's pager size, which the CLI asks for): `holds
/// list` shows every one and `holds release --all` releases every one, so the uninstall hook leaves no
/// hold behind in a large cluster. Without the `continue` loop only the first 500 would be seen.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn holds_list_and_release_page_through_more_pods_than_one_list_page() {
    const PODS: usize = 520;
    let h = Harness::start().await;
    let (_dir, kc) = kubeconfig(&h);
    snapdrain_testkit::eviction::namespace(&h.client, "many", json!({})).await;
    let pods: Api<Pod> = Api::namespaced(h.client.clone(), "many");
    // Bare pods held as snapdrain holds a pod: both annotations at their holding values, and listed
    // in `held`. No node: the simulated scheduler is not what this is about.
    let creates = (0..PODS).map(|i| {
        let pods = pods.clone();
        async move {
            let pod: Pod = serde_json::from_value(json!({
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": format!("held-{i:04}"), "annotations": {
                    DO_NOT_DISRUPT: "true", SAFE_TO_EVICT: "false",
                    HELD: "do-not-disrupt,safe-to-evict"}},
                "spec": {"containers": [{"name": "c", "image": "busybox"}]}
            }))
            .expect("a pod");
            pods.create(&Default::default(), &pod)
                .await
                .unwrap_or_else(|e| panic!("create held-{i:04}: {e}"));
        }
    });
    futures::stream::iter(creates)
        .buffer_unordered(16)
        .collect::<Vec<()>>()
        .await;

    let list = snapdrain(&kc, &["holds", "list"]).await;
    assert_eq!(list.code, Some(0), "{}", list.stderr);
    let listed = list
        .stdout
        .lines()
        .filter(|l| l.starts_with("many "))
        .count();
    assert_eq!(listed, PODS, "{}", list.stdout);

    let release = snapdrain(&kc, &["holds", "release", "--all"]).await;
    assert_eq!(release.code, Some(0), "{}", release.stderr);
    let still_held: Vec<String> = pods
        .list(&Default::default())
        .await
        .expect("list pods")
        .items
        .iter()
        .filter(|p| !p.annotations().is_empty())
        .map(|p| p.name_any())
        .collect();
    assert!(still_held.is_empty(), "{still_held:?}");
}

/// With the controller gone, `holds release --all` also does what the rollbacks of plans that did not
/// complete would have done (review M-4): it uncordons and untaints the nodes their status records
/// snapdrain cordoned and tainted, never a cordon someone else set, leaves a Completed plan's drained
/// node as it is, and takes snapdrain's finalizer off every plan, so the plans (and the CRD) can be
/// deleted. A second run changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn release_all_undoes_what_unfinished_plans_cordoned_and_frees_their_finalizers() {
    use k8s_openapi::api::core::v1::Node;
    use snapdrain::api::DisruptionPlan;
    const TAINT: &str = "snapdrain.io/draining";
    const FINALIZER: &str = "snapdrain.io/rollback";

    let h = Harness::start().await;
    let (_dir, kc) = kubeconfig(&h);
    let nodes: Api<Node> = Api::all(h.client.clone());
    let names: Vec<String> = nodes
        .list(&Default::default())
        .await
        .expect("list nodes")
        .items
        .iter()
        .map(|n| n.name_any())
        .collect();
    let [running, failed, done] = [&names[0], &names[1], &names[2]];
    // As snapdrain (or a person, for `failed`) left them: cordoned, and tainted with snapdrain's taint.
    for n in [running, failed, done] {
        nodes
            .patch(
                n,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"unschedulable": true,
                    "taints": [{"key": TAINT, "effect": "NoSchedule"}]}})),
            )
            .await
            .expect("cordon");
    }
    let plans: Api<DisruptionPlan> = Api::all(h.client.clone());
    for (plan, node, phase, cordoned) in [
        ("running", running, "Draining", true),
        // Someone had cordoned this node before the plan: snapdrain only tainted it.
        ("failed", failed, "Failed", false),
        ("done", done, "Completed", true),
    ] {
        h.create_plan(plan, json!({"nodes": [node], "dryRun": true}))
            .await;
        plans
            .patch(
                plan,
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"finalizers": [FINALIZER, "example.com/keep"]}})),
            )
            .await
            .expect("finalizers");
        plans
            .patch_status(
                plan,
                &PatchParams::default(),
                &Patch::Merge(json!({"status": {"phase": phase, "nodes": [
                    {"name": node, "cordonedBySnapdrain": cordoned, "taintedBySnapdrain": true}]}})),
            )
            .await
            .expect("status");
    }

    let out = snapdrain(&kc, &["holds", "release", "--all"]).await;
    assert_eq!(out.code, Some(0), "{}{}", out.stdout, out.stderr);
    let node_state = |n: Node| {
        let spec = n.spec.unwrap_or_default();
        let tainted = spec.taints.iter().flatten().any(|t| t.key == TAINT);
        (spec.unschedulable.unwrap_or(false), tainted)
    };
    assert_eq!(
        node_state(nodes.get(running).await.expect("node")),
        (false, false),
        "{}",
        out.stdout
    );
    assert_eq!(
        node_state(nodes.get(failed).await.expect("node")),
        (true, false),
        "someone else's cordon stays: {}",
        out.stdout
    );
    assert_eq!(
        node_state(nodes.get(done).await.expect("node")),
        (true, true),
        "a completed plan's node stays drained: {}",
        out.stdout
    );
    for plan in ["running", "failed", "done"] {
        let p = plans.get(plan).await.expect("the plan");
        assert_eq!(
            p.finalizers(),
            ["example.com/keep"],
            "{plan}: {}",
            out.stdout
        );
    }
    assert!(
        out.stdout.contains(&format!("node/{running}: uncordoned")),
        "{}",
        out.stdout
    );

    // Nothing left: the second run changes no node and no plan.
    let again = snapdrain(&kc, &["holds", "release", "--all"]).await;
    assert_eq!(again.code, Some(0), "{}{}", again.stdout, again.stderr);
    assert!(
        !again.stdout.contains("disruptionplan/"),
        "{}",
        again.stdout
    );
}
