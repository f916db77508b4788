//! The real kubectl (v1.32) against the in-process simulated API server: discovery, OpenAPI-backed
//! apply/create, server-side tables, writes of every kind, watches, deletion with --wait, drain, and the
//! Velero and Karpenter CRDs from the fixtures.

use serde_json::json;
use snapdrain_sim::apiserver::KubeconfigUser;
use snapdrain_testkit::{Kubectl, data, eventually, start_cluster, trusting};

fn path(p: &str) -> String {
    data(p).display().to_string()
}

/// Lines of a table whose first column is `name`.
fn row<'a>(table: &'a str, name: &str) -> &'a str {
    table
        .lines()
        .find(|l| l.split_whitespace().next() == Some(name))
        .unwrap_or_else(|| panic!("no row {name} in:\n{table}"))
}

fn header(table: &str) -> Vec<&str> {
    table
        .lines()
        .next()
        .unwrap_or("")
        .split("  ")
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apply_and_create_validate_through_openapi_without_flags() {
    let cluster = start_cluster().await;
    let k = Kubectl::new(&cluster);
    let index = k.ok(&["get", "--raw", "/openapi/v3"]).await;
    let index: serde_json::Value = serde_json::from_str(&index).expect("index is JSON");
    assert!(index["paths"]["api/v1"]["serverRelativeURL"].is_string());

    let out = k.ok(&["apply", "-f", &path("base.yaml")]).await;
    for created in [
        "namespace/velero created",
        "node/node-a created",
        "statefulset.apps/web created",
        "pod/web-0 created",
        "poddisruptionbudget.policy/web created",
    ] {
        assert!(out.contains(created), "{created} missing from:\n{out}");
    }
    let cm = k.file(
        "cm.yaml",
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: settings\ndata:\n  a: b\n",
    );
    assert!(
        k.ok(&["create", "-f", &cm])
            .await
            .contains("configmap/settings created")
    );
    let err = k.fails(&["create", "-f", &cm]).await;
    assert!(
        err.contains("Error from server (AlreadyExists)")
            && err.contains("configmaps \"settings\" already exists"),
        "{err}"
    );

    // CRD kinds: the CRD's schema is what the server validates against (kubectl sends fieldValidation=Strict).
    k.ok(&["apply", "-f", &path("crds")]).await;
    let backup: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(data("velero-backup.example.json")).unwrap())
            .unwrap();
    let mut bad = backup.clone();
    bad["spec"]["bogusField"] = json!(true);
    bad["spec"]["hooks"]["resources"][0]["typo"] = json!("x");
    let bad = k.file("bad-backup.json", &bad.to_string());
    let err = k.fails(&["apply", "-f", &bad]).await;
    assert!(
        err.contains("strict decoding error")
            && err.contains("unknown field \"spec.bogusField\"")
            && err.contains("unknown field \"spec.hooks.resources[0].typo\""),
        "{err}"
    );
    let out = k
        .ok(&["create", "-f", &path("velero-backup.example.json")])
        .await;
    assert!(
        out.contains("backup.velero.io/pre-drain-worker-3-20260520101500 created"),
        "{out}"
    );

    let explain = k.ok(&["explain", "pods.spec.containers"]).await;
    assert!(
        explain.contains("KIND:       Pod") && explain.contains("FIELD: containers <[]Container>"),
        "{explain}"
    );
    let explain = k.ok(&["explain", "nodeclaims.spec"]).await;
    assert!(
        explain.contains("KIND:       NodeClaim") && explain.contains("nodeClassRef"),
        "{explain}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_prints_server_side_tables_and_filters() {
    let cluster = start_cluster().await;
    let k = Kubectl::new(&cluster);
    k.ok(&["apply", "-f", &path("base.yaml")]).await;

    let pods = k.ok(&["get", "pods"]).await;
    assert_eq!(
        header(&pods),
        ["NAME", "READY", "STATUS", "RESTARTS", "AGE"]
    );
    assert!(row(&pods, "web-0").contains("0/1") && row(&pods, "web-0").contains("Pending"));
    row(&pods, "loose");
    let wide = k.ok(&["get", "pods", "-o", "wide"]).await;
    assert!(header(&wide).contains(&"NODE") && row(&wide, "web-0").contains("node-a"));

    let nodes = k.ok(&["get", "nodes"]).await;
    assert_eq!(
        header(&nodes),
        ["NAME", "STATUS", "ROLES", "AGE", "VERSION"]
    );
    let node = row(&nodes, "node-a");
    assert!(node.contains("Ready") && node.contains("worker") && node.contains("v1.32.4"));

    let sts = k.ok(&["get", "sts"]).await;
    assert_eq!(header(&sts), ["NAME", "READY", "AGE"]);
    assert!(row(&sts, "web").contains("0/1"));
    let pdb = k.ok(&["get", "pdb"]).await;
    assert_eq!(
        header(&pdb),
        [
            "NAME",
            "MIN AVAILABLE",
            "MAX UNAVAILABLE",
            "ALLOWED DISRUPTIONS",
            "AGE"
        ]
    );
    row(&pdb, "web");

    let all = k.ok(&["get", "pods", "-A"]).await;
    assert_eq!(header(&all)[0], "NAMESPACE");
    assert!(
        all.lines()
            .any(|l| l.starts_with("default") && l.contains("web-0"))
    );

    let labelled = k.ok(&["get", "pods", "-l", "app=web", "-o", "name"]).await;
    assert_eq!(labelled.trim(), "pod/web-0");
    let on_node = k
        .ok(&[
            "get",
            "pods",
            "--field-selector",
            "spec.nodeName=node-a",
            "-o",
            "name",
        ])
        .await;
    assert_eq!(on_node.trim(), "pod/web-0");
    let names = k
        .ok(&["get", "pods", "-o", "jsonpath={.items[*].metadata.name}"])
        .await;
    assert_eq!(names.trim(), "loose web-0");
    let yaml = k.ok(&["get", "pod", "web-0", "-o", "yaml"]).await;
    assert!(
        yaml.contains("kind: Pod") && yaml.contains("nodeName: node-a"),
        "{yaml}"
    );
    let raw = k
        .ok(&["get", "--raw", "/api/v1/namespaces/default/pods/web-0"])
        .await;
    let raw: serde_json::Value = serde_json::from_str(&raw).unwrap();
    assert_eq!(raw["metadata"]["name"], "web-0");

    let none = k.ok(&["get", "pods", "-n", "velero"]).await;
    assert!(none.is_empty(), "{none}");
    let err = k.fails(&["get", "pod", "missing"]).await;
    assert!(
        err.contains("Error from server (NotFound): pods \"missing\" not found"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn velero_and_karpenter_crds_print_their_columns() {
    let cluster = start_cluster().await;
    let k = Kubectl::new(&cluster);
    k.ok(&["apply", "-f", &path("base.yaml")]).await;
    let out = k.ok(&["apply", "-f", &path("crds")]).await;
    assert!(
        out.contains(
            "customresourcedefinition.apiextensions.k8s.io/nodeclaims.karpenter.sh created"
        )
    );
    let crds = k.ok(&["get", "crds"]).await;
    assert_eq!(header(&crds), ["NAME", "CREATED AT"]);
    row(&crds, "backups.velero.io");

    let resources = k.ok(&["api-resources"]).await;
    let bsl = row(&resources, "backupstoragelocations");
    assert!(bsl.contains("bsl") && bsl.contains("velero.io/v1") && bsl.contains("true"));
    let pods = row(&resources, "pods");
    assert!(pods.contains(" po ") && pods.contains("Pod"));
    let karpenter = k
        .ok(&["api-resources", "--api-group=karpenter.sh", "-o", "name"])
        .await;
    assert_eq!(karpenter.trim(), "nodeclaims.karpenter.sh");

    k.ok(&["apply", "-f", &path("velero-backup.example.json")])
        .await;
    k.ok(&["apply", "-f", &path("velero-bsl-minio.example.yaml")])
        .await;
    let backups = k.ok(&["get", "backups", "-n", "velero"]).await;
    row(&backups, "pre-drain-worker-3-20260520101500");
    // The BSL CRD declares no status subresource (`subresources: {}`): the manifest's status is kept.
    let bsl = k.ok(&["get", "bsl", "-n", "velero"]).await;
    assert_eq!(
        header(&bsl),
        ["NAME", "PHASE", "LAST VALIDATED", "AGE", "DEFAULT"]
    );
    let row_bsl = row(&bsl, "default");
    assert!(
        row_bsl.contains("Available") && row_bsl.contains("true"),
        "{bsl}"
    );

    k.ok(&["apply", "-f", &path("karpenter-nodeclaim.yaml")])
        .await;
    let claims = k.ok(&["get", "nodeclaims"]).await;
    assert_eq!(
        header(&claims),
        ["NAME", "TYPE", "CAPACITY", "ZONE", "NODE", "READY", "AGE"]
    );
    let claim = row(&claims, "default-x9wxq");
    assert!(
        claim.contains("c5a.2xlarge") && claim.contains("spot") && claim.contains("us-west-2c"),
        "{claims}"
    );
    assert!(
        !claim.contains("True"),
        "status must not be set by create: {claims}"
    );
    let stored = k.json(&["get", "nodeclaim", "default-x9wxq"]).await;
    assert!(stored.get("status").is_none(), "{stored}");
    assert_ne!(stored["metadata"]["resourceVersion"], "19600526");

    // Status is written through the status subresource, as Karpenter does.
    k.ok(&[
        "patch",
        "nodeclaim",
        "default-x9wxq",
        "--subresource=status",
        "--type=merge",
        "-p",
        r#"{"status":{"nodeName":"node-a","conditions":[{"type":"Ready","status":"True","reason":"Ready","message":"","lastTransitionTime":"2026-01-01T00:00:00Z"}]}}"#,
    ])
    .await;
    let claims = k.ok(&["get", "nodeclaims"]).await;
    let claim = row(&claims, "default-x9wxq");
    assert!(
        claim.contains("node-a") && claim.contains("True"),
        "{claims}"
    );
    let wide = k.ok(&["get", "nodeclaims", "-o", "wide"]).await;
    assert!(header(&wide).contains(&"NODEPOOL"));
    assert!(row(&wide, "default-x9wxq").contains("default"));
    // A spec patch on the main resource leaves status alone.
    k.ok(&[
        "label",
        "nodeclaim",
        "default-x9wxq",
        "snapdrain.io/test=yes",
    ])
    .await;
    let stored = k.json(&["get", "nodeclaim", "default-x9wxq"]).await;
    assert_eq!(stored["status"]["nodeName"], "node-a");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_patch_label_annotate_cordon_and_apply() {
    let cluster = start_cluster().await;
    let k = Kubectl::new(&cluster);
    k.ok(&["apply", "-f", &path("base.yaml")]).await;
    let manifest = |value: &str| {
        format!(
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: app\n  labels:\n    tier: web\ndata:\n  mode: {value}\n"
        )
    };
    let file = k.file("app.yaml", &manifest("one"));
    assert!(
        k.ok(&["apply", "-f", &file])
            .await
            .contains("configmap/app created")
    );
    assert!(
        k.ok(&["apply", "-f", &file])
            .await
            .contains("configmap/app unchanged")
    );
    let file = k.file("app.yaml", &manifest("two"));
    assert!(
        k.ok(&["apply", "-f", &file])
            .await
            .contains("configmap/app configured")
    );
    let cm = k.json(&["get", "cm", "app"]).await;
    assert_eq!(cm["data"]["mode"], "two");
    assert!(
        cm["metadata"]["annotations"]["kubectl.kubernetes.io/last-applied-configuration"]
            .is_string()
    );

    k.ok(&[
        "patch",
        "cm",
        "app",
        "--type=merge",
        "-p",
        r#"{"data":{"merge":"1"}}"#,
    ])
    .await;
    k.ok(&[
        "patch",
        "cm",
        "app",
        "--type=json",
        "-p",
        r#"[{"op":"add","path":"/data/json","value":"2"},{"op":"remove","path":"/data/merge"}]"#,
    ])
    .await;
    k.ok(&[
        "patch",
        "cm",
        "app",
        "--type=strategic",
        "-p",
        r#"{"data":{"smp":"3"}}"#,
    ])
    .await;
    k.ok(&["label", "cm", "app", "owner=team-a"]).await;
    k.ok(&["label", "cm", "app", "tier-"]).await;
    k.ok(&["annotate", "cm", "app", "note=hello"]).await;
    let cm = k.json(&["get", "cm", "app"]).await;
    assert_eq!(cm["data"], json!({"mode": "two", "json": "2", "smp": "3"}));
    assert_eq!(cm["metadata"]["labels"], json!({"owner": "team-a"}));
    assert_eq!(cm["metadata"]["annotations"]["note"], "hello");
    let err = k
        .fails(&[
            "patch",
            "cm",
            "app",
            "--type=json",
            "-p",
            r#"[{"op":"remove","path":"/data/nope"}]"#,
        ])
        .await;
    // kube-apiserver reports a failed JSON-patch operation with only its generic 422 message.
    assert!(
        err.contains("the server rejected our request due to an error in our request"),
        "{err}"
    );

    assert!(
        k.ok(&["cordon", "node-a"])
            .await
            .contains("node/node-a cordoned")
    );
    let nodes = k.ok(&["get", "nodes"]).await;
    assert!(row(&nodes, "node-a").contains("Ready,SchedulingDisabled"));
    assert!(
        k.ok(&["uncordon", "node-a"])
            .await
            .contains("node/node-a uncordoned")
    );
    let node = k.json(&["get", "node", "node-a"]).await;
    assert_ne!(node["spec"]["unschedulable"], true);

    let ssa = k.file(
        "ssa.yaml",
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: ssa\ndata:\n  k: v\n",
    );
    let out = k.ok(&["apply", "--server-side", "-f", &ssa]).await;
    assert!(out.contains("configmap/ssa serverside-applied"), "{out}");
    let cm = k.json(&["get", "cm", "ssa"]).await;
    assert_eq!(cm["data"]["k"], "v");
}

/// Client-side apply and `kubectl patch` of a pod send strategic merge patches: the containers list
/// merges by name. Needs the strategic merge implementation in `patch/`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn strategic_merge_from_apply_and_patch_keeps_other_containers() {
    let cluster = start_cluster().await;
    let k = Kubectl::new(&cluster);
    let manifest = |b: &str| {
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: two\nspec:\n  containers:\n  - name: a\n    image: a:1\n  - name: b\n    image: {b}\n"
        )
    };
    k.ok(&["apply", "-f", &k.file("two.yaml", &manifest("b:1"))])
        .await;
    k.ok(&["apply", "-f", &k.file("two.yaml", &manifest("b:2"))])
        .await;
    let images = k
        .ok(&[
            "get",
            "pod",
            "two",
            "-o",
            "jsonpath={.spec.containers[*].image}",
        ])
        .await;
    assert_eq!(images, "a:1 b:2");
    k.ok(&[
        "patch",
        "pod",
        "two",
        "-p",
        r#"{"spec":{"containers":[{"name":"a","image":"a:2"}]}}"#,
    ])
    .await;
    let images = k
        .ok(&[
            "get",
            "pod",
            "two",
            "-o",
            "jsonpath={.spec.containers[*].image}",
        ])
        .await;
    assert_eq!(images, "a:2 b:2");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_wait_follows_finalizers_and_get_watch_streams_rows() {
    let cluster = start_cluster().await;
    let k = Kubectl::new(&cluster);
    let mut watch = k.spawn(&["get", "configmaps", "-w"]);
    let held = k.file(
        "held.yaml",
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: held\n  finalizers: [snapdrain.io/hold]\n",
    );
    k.ok(&["create", "-f", &held]).await;
    watch
        .line_matching("the watch to print the new ConfigMap", |l| {
            l.starts_with("held")
        })
        .await;

    let deleting = k.spawn(&["delete", "cm", "held", "--wait=true", "--timeout=15s"]);
    let cm = eventually("deletionTimestamp on the held ConfigMap", || async {
        let cm = k.json(&["get", "cm", "held"]).await;
        cm["metadata"]["deletionTimestamp"]
            .is_string()
            .then_some(cm)
    })
    .await;
    assert_eq!(cm["metadata"]["finalizers"], json!(["snapdrain.io/hold"]));
    k.ok(&[
        "patch",
        "cm",
        "held",
        "--type=json",
        "-p",
        r#"[{"op":"remove","path":"/metadata/finalizers"}]"#,
    ])
    .await;
    let (ok, out, err) = deleting.finish().await;
    assert!(
        ok && out.contains("configmap \"held\" deleted"),
        "{out}\n{err}"
    );
    let err = k.fails(&["get", "cm", "held"]).await;
    assert!(err.contains("NotFound"), "{err}");

    // The watch saw the deletion mark; it keeps running until killed.
    assert!(
        watch.seen.iter().all(|l| !l.contains("error")),
        "{:?}",
        watch.seen
    );
    watch.child.start_kill().expect("kill kubectl get -w");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_pods_watch_prints_changes() {
    let cluster = start_cluster().await;
    let k = Kubectl::new(&cluster);
    k.ok(&["apply", "-f", &path("base.yaml")]).await;
    let mut watch = k.spawn(&["get", "pods", "-w"]);
    let first = watch
        .line_matching("the table header", |l| l.starts_with("NAME"))
        .await;
    assert!(first.contains("STATUS"));
    watch
        .line_matching("web-0", |l| l.starts_with("web-0"))
        .await;
    let pod = k.file(
        "new.yaml",
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: newcomer\nspec:\n  containers:\n  - name: c\n    image: busybox\n",
    );
    k.ok(&["apply", "-f", &pod]).await;
    let line = watch
        .line_matching("the new pod", |l| l.starts_with("newcomer"))
        .await;
    assert!(line.contains("Pending"), "{line}");
    k.ok(&["delete", "pod", "newcomer"]).await;
    // Unscheduled pods go at once; the watch prints the pod's last state.
    watch
        .line_matching("the deleted pod", |l| l.starts_with("newcomer"))
        .await;
    watch.child.start_kill().expect("kill kubectl get -w");
}

/// Marks `web-0` Running and Ready through the status subresource (there is no kubelet here).
async fn make_ready(k: &Kubectl, pod: &str) {
    k.ok(&[
        "patch",
        "pod",
        pod,
        "--subresource=status",
        "--type=merge",
        "-p",
        r#"{"status":{"phase":"Running","conditions":[{"type":"Ready","status":"True"}],"containerStatuses":[{"name":"c","ready":true,"restartCount":0,"image":"nginx","imageID":"","started":true,"state":{"running":{}}}]}}"#,
    ])
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drain_evicts_and_retries_on_disruption_budget() {
    let cluster = start_cluster().await;
    let k = Kubectl::new(&cluster);
    k.ok(&["apply", "-f", &path("base.yaml")]).await;
    make_ready(&k, "web-0").await;
    let pods = k.ok(&["get", "pods"]).await;
    assert!(row(&pods, "web-0").contains("1/1") && row(&pods, "web-0").contains("Running"));

    // The PDB allows no disruption of the only ready web pod: kubectl retries the eviction, and the same
    // drain completes once the budget allows it.
    let drain = k.spawn(&[
        "drain",
        "node-a",
        "--ignore-daemonsets",
        "--force",
        "--grace-period=0",
        "--timeout=60s",
    ]);
    let refused = || {
        cluster
            .audit
            .since(0)
            .iter()
            .filter(|e| e.resource == "pods/eviction" && e.code == Some(429))
            .count()
    };
    eventually("kubectl to retry the refused eviction", || async {
        (refused() >= 2).then_some(())
    })
    .await;
    let nodes = k.ok(&["get", "nodes"]).await;
    assert!(row(&nodes, "node-a").contains("SchedulingDisabled"));
    k.ok(&["get", "pod", "web-0"]).await;
    k.ok(&["delete", "pdb", "web"]).await;
    let (ok, out, stderr) = drain.finish().await;
    assert!(
        ok,
        "the drain completes once the PDB allows it:\n{out}\n{stderr}"
    );
    assert!(
        stderr.contains(
            "error when evicting pods/\"web-0\" -n \"default\" (will retry after 5s): Cannot evict pod as it would violate the pod's disruption budget."
        ),
        "{stderr}"
    );
    assert!(
        out.contains("pod/web-0 evicted") && out.contains("node/node-a drained"),
        "{out}"
    );
    eventually("web-0 to be gone", || async {
        let out = k.run(&["get", "pod", "web-0"]).await;
        (!out.status.success()).then_some(())
    })
    .await;
}

/// Over HTTPS kubectl sends its credentials, and the API server authenticates and authorizes every
/// request as kube-apiserver does (kubernetes `pkg/kubeapiserver/authenticator/config.go` `Config.New`,
/// `staging/src/k8s.io/apiserver/pkg/authentication/request/bearertoken/bearertoken.go`,
/// `.../request/anonymous/anonymous.go`): a ServiceAccount token from TokenRequest gets what its Role
/// allows and the server's 403 for the rest, a token nobody issued is 401, and without credentials
/// kubectl is `system:anonymous`, which RBAC lets read only `/healthz`, `/livez`, `/readyz` and
/// `/version` (the bootstrap `system:public-info-viewer`, kubernetes
/// `plugin/pkg/auth/authorizer/rbac/bootstrappolicy/policy.go`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_credentials_are_checked_and_rbac_decides_for_every_user() {
    let cluster = start_cluster().await;
    let admin = Kubectl::new(&cluster);
    let rbac = json!([
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "apps"}},
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "reader", "namespace": "apps"}},
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "settings", "namespace": "apps"},
            "data": {"mode": "on"}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
            "metadata": {"name": "read-configmaps", "namespace": "apps"},
            "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": {"name": "reader", "namespace": "apps"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "read-configmaps"},
            "subjects": [{"kind": "ServiceAccount", "name": "reader", "namespace": "apps"}]}]);
    for (i, doc) in rbac.as_array().into_iter().flatten().enumerate() {
        let file = admin.file(&format!("rbac-{i}.json"), &doc.to_string());
        admin.ok(&["apply", "-f", &file]).await;
    }
    let token = admin.ok(&["create", "token", "reader", "-n", "apps"]).await;

    let sa = Kubectl::as_user(&cluster, KubeconfigUser::Token(token.trim()));
    let got = sa
        .json(&["get", "configmap", "settings", "-n", "apps"])
        .await;
    assert_eq!(got["data"]["mode"], "on", "{got}");
    let listed = sa
        .ok(&["get", "configmaps", "-n", "apps", "-o", "name"])
        .await;
    assert!(listed.contains("configmap/settings"), "{listed}");
    let refused = sa.fails(&["get", "configmaps", "-n", "default"]).await;
    assert!(
        refused.contains(
            "Error from server (Forbidden): configmaps is forbidden: User \
             \"system:serviceaccount:apps:reader\" cannot list resource \"configmaps\" in API group \"\" \
             in the namespace \"default\""
        ),
        "{refused}"
    );
    let refused = sa
        .fails(&["delete", "configmap", "settings", "-n", "apps"])
        .await;
    assert!(
        refused.contains("Error from server (Forbidden)")
            && refused.contains("cannot delete resource \"configmaps\""),
        "{refused}"
    );
    assert!(
        admin
            .ok(&["get", "configmap", "settings", "-n", "apps", "-o", "name"])
            .await
            .contains("configmap/settings"),
        "the refused delete left the ConfigMap"
    );

    // A 401 on discovery ends `kubectl get` with client-go's generic text for the code (discovery does
    // not decode the Status body, as on a real cluster); a plain REST read shows the Status's message.
    let garbage = Kubectl::as_user(&cluster, KubeconfigUser::Token("garbage"));
    let refused = garbage.fails(&["get", "configmaps", "-n", "apps"]).await;
    assert!(
        refused.contains(
            "error: You must be logged in to the server (the server has asked for the client to \
             provide credentials)"
        ),
        "{refused}"
    );
    let refused = garbage
        .fails(&["get", "--raw", "/api/v1/namespaces/apps/configmaps"])
        .await;
    assert!(
        refused.contains("error: You must be logged in to the server (Unauthorized)"),
        "{refused}"
    );

    // No bearer token reaches the server: kubectl with a basic-auth user (a kubeconfig user without
    // any credentials makes kubectl prompt for a username), then a request with no Authorization
    // header at all.
    let anonymous = Kubectl::as_user(
        &cluster,
        KubeconfigUser::Basic {
            username: "admin",
            password: "admin",
        },
    );
    // Discovery is refused first (client-go does not decode that Status body), then the read itself.
    let refused = anonymous.fails(&["get", "configmaps", "-n", "apps"]).await;
    assert!(
        refused.contains("Error from server (Forbidden)"),
        "{refused}"
    );
    let refused = anonymous
        .fails(&["get", "--raw", "/api/v1/namespaces/apps/configmaps"])
        .await;
    assert!(
        refused.contains(
            "Error from server (Forbidden): configmaps is forbidden: User \"system:anonymous\" cannot \
             list resource \"configmaps\" in API group \"\" in the namespace \"apps\""
        ),
        "{refused}"
    );
    for path in ["/healthz", "/livez", "/readyz"] {
        assert_eq!(anonymous.ok(&["get", "--raw", path]).await.trim(), "ok");
    }
    let version = anonymous.ok(&["get", "--raw", "/version"]).await;
    assert!(version.contains("gitVersion"), "{version}");
    let refused = anonymous.fails(&["get", "--raw", "/api"]).await;
    assert!(
        refused.contains("Error from server (Forbidden)")
            && refused.contains("User \"system:anonymous\" cannot get path \"/api\""),
        "{refused}"
    );
    let http = trusting(cluster.ca_pem())
        .timeout(snapdrain_testkit::WAIT)
        .build()
        .expect("an HTTPS client");
    let get = |path: &'static str| {
        let req = http.get(format!("{}{path}", cluster.url()));
        async move {
            let resp = req.send().await.expect("answered");
            let code = resp.status().as_u16();
            (code, resp.text().await.expect("a body"))
        }
    };
    assert_eq!(get("/healthz").await, (200, "ok".to_string()));
    let (code, body) = get("/api/v1/namespaces/apps/configmaps").await;
    assert_eq!(code, 403, "{body}");
    let status: serde_json::Value = serde_json::from_str(&body).expect("a Status");
    assert_eq!(status["reason"], "Forbidden", "{status}");
    assert_eq!(
        status["message"],
        "configmaps is forbidden: User \"system:anonymous\" cannot list resource \"configmaps\" in \
         API group \"\" in the namespace \"apps\"",
        "{status}"
    );
}
