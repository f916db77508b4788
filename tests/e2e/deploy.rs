//! The deploy manifests cannot go stale silently: every plain YAML file under deploy/ parses, the chart's
//! CRD is the committed one, every `.Values` path a template uses exists, template blocks balance, and
//! the ClusterRole grants exactly the verbs the controller uses, and the uninstall hook's RBAC exactly
//! what its command uses. (Real Helm installs the chart in helm.rs.)

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use serde_json::Value;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn chart() -> PathBuf {
    root().join("deploy/helm/snapdrain")
}

fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return out;
    };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(files_under(&p));
        } else {
            out.push(p);
        }
    }
    out.sort();
    out
}

fn is_template(p: &Path) -> bool {
    p.components().any(|c| c.as_os_str() == "templates")
}

fn read(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_else(|e| panic!("cannot read {}: {e}", p.display()))
}

fn parse_all(text: &str, what: &str) -> Vec<Value> {
    serde_saphyr::from_multiple::<Value>(text).unwrap_or_else(|e| panic!("{what} is not YAML: {e}"))
}

#[test]
fn every_plain_yaml_file_under_deploy_parses() {
    let files: Vec<PathBuf> = files_under(&root().join("deploy"))
        .into_iter()
        .filter(|p| matches!(p.extension().and_then(|e| e.to_str()), Some("yaml" | "yml")))
        .filter(|p| !is_template(p))
        .collect();
    assert!(
        files.len() >= 3,
        "expected Chart.yaml, values.yaml and the CRD: {files:?}"
    );
    for f in files {
        let docs = parse_all(&read(&f), &f.display().to_string());
        assert!(
            docs.iter().any(|d| !d.is_null()),
            "{} holds no YAML document",
            f.display()
        );
    }
}

#[test]
fn the_chart_crds_are_the_committed_crds() {
    for file in ["disruptionplan.yaml", "disruptionpolicy.yaml"] {
        let committed = read(&root().join("crds").join(file));
        let copy = read(&chart().join("crds").join(file));
        assert!(
            committed == copy,
            "deploy/helm/snapdrain/crds/{file} differs from crds/{file}: cp crds/{file} deploy/helm/snapdrain/crds/"
        );
    }
}

#[test]
fn chart_metadata_names_the_app() {
    let chart_yaml = &parse_all(&read(&chart().join("Chart.yaml")), "Chart.yaml")[0];
    assert_eq!(chart_yaml["apiVersion"], "v2");
    assert_eq!(chart_yaml["name"], "snapdrain");
    assert_eq!(chart_yaml["appVersion"], env!("CARGO_PKG_VERSION"));
}

fn values() -> Value {
    parse_all(&read(&chart().join("values.yaml")), "values.yaml")
        .into_iter()
        .next()
        .unwrap_or(Value::Null)
}

/// `.Values.a.b` paths used in a template.
fn value_refs(text: &str) -> BTreeSet<String> {
    let re = regex::Regex::new(r"\.Values((?:\.[A-Za-z0-9_]+)+)").expect("regex");
    re.captures_iter(text)
        .map(|c| c[1].trim_start_matches('.').to_string())
        .collect()
}

#[test]
fn every_values_path_the_templates_use_exists_and_blocks_balance() {
    let values = values();
    let templates: Vec<PathBuf> = files_under(&chart().join("templates"));
    assert!(templates.len() >= 8, "{templates:?}");
    let opener = regex::Regex::new(r"\{\{-?\s*(if|with|range|define)\b").expect("regex");
    let closer = regex::Regex::new(r"\{\{-?\s*end\s*-?\}\}").expect("regex");
    for t in &templates {
        let text = read(t);
        for path in value_refs(&text) {
            let pointer = format!("/{}", path.replace('.', "/"));
            assert!(
                values.pointer(&pointer).is_some(),
                "{} uses .Values.{path}, which values.yaml does not define",
                t.display()
            );
        }
        assert_eq!(
            text.matches("{{").count(),
            text.matches("}}").count(),
            "unbalanced braces in {}",
            t.display()
        );
        assert_eq!(
            opener.find_iter(&text).count(),
            closer.find_iter(&text).count(),
            "if/with/range/define and end do not pair up in {}",
            t.display()
        );
    }
}

#[test]
fn the_deployment_runs_two_leader_elected_non_root_replicas_with_metrics() {
    let v = values();
    assert_eq!(v["replicaCount"], 2);
    assert_eq!(v["leaderElection"]["enabled"], true);
    assert_eq!(v["metrics"]["port"], 8080);
    assert_eq!(v["webhook"]["enabled"], true);
    assert_eq!(v["webhook"]["failurePolicy"], "Ignore");
    assert_eq!(v["podSecurityContext"]["runAsNonRoot"], true);
    assert_eq!(v["securityContext"]["readOnlyRootFilesystem"], true);
    assert_eq!(v["securityContext"]["allowPrivilegeEscalation"], false);
    let deployment = read(&chart().join("templates/deployment.yaml"));
    for needle in [
        "name: POD_NAME",
        "fieldPath: metadata.name",
        "name: POD_NAMESPACE",
        "fieldPath: metadata.namespace",
        "- controller",
        "--metrics-addr=0.0.0.0:{{ .Values.metrics.port }}",
        "name: AWS_REGION",
        "--webhook-addr=0.0.0.0:{{ .Values.webhook.port }}",
        "--webhook-service={{ include \"snapdrain.fullname\" . }}-webhook",
        "--webhook-configuration={{ include \"snapdrain.fullname\" . }}",
    ] {
        assert!(
            deployment.contains(needle),
            "deployment.yaml lacks {needle:?}"
        );
    }
    let sa = read(&chart().join("templates/serviceaccount.yaml"));
    assert!(
        sa.contains(".Values.serviceAccount.annotations"),
        "IRSA annotations go on the ServiceAccount"
    );
}

/// The object of `kind` named `name` in a default install of the chart as real Helm renders it (release
/// `snapdrain` in namespace `snapdrain`, Velero in `velero`).
fn rendered(kind: &str, name: &str) -> Value {
    super::helm::default_chart()
        .iter()
        .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
        .cloned()
        .unwrap_or_else(|| panic!("the chart renders no {kind} {name}"))
}

type Grants = BTreeMap<(String, String), BTreeSet<String>>;

fn grants(rules: &Value) -> Grants {
    let mut out = Grants::new();
    for rule in rules.as_array().into_iter().flatten() {
        let strings = |k: &str| -> Vec<String> {
            rule[k]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|s| s.as_str().map(str::to_string))
                .collect()
        };
        for group in strings("apiGroups") {
            for resource in strings("resources") {
                out.entry((group.clone(), resource))
                    .or_default()
                    .extend(strings("verbs"));
            }
        }
    }
    out
}

fn expect(entries: &[(&str, &str, &[&str])]) -> Grants {
    entries
        .iter()
        .map(|(g, r, verbs)| {
            (
                (g.to_string(), r.to_string()),
                verbs.iter().map(|v| v.to_string()).collect(),
            )
        })
        .collect()
}

#[test]
fn rbac_grants_exactly_what_the_controller_uses() {
    let cluster_role = &rendered("ClusterRole", "snapdrain");
    let want = expect(&[
        (
            "snapdrain.io",
            "disruptionplans",
            &["list", "watch", "patch", "create", "delete"],
        ),
        ("snapdrain.io", "disruptionplans/status", &["patch"]),
        (
            "snapdrain.io",
            "disruptionpolicies",
            &["list", "watch", "create"],
        ),
        ("snapdrain.io", "disruptionpolicies/status", &["patch"]),
        (
            "velero.io",
            "backups",
            &["create", "get", "list", "watch", "delete"],
        ),
        ("velero.io", "backupstoragelocations", &["get", "list"]),
        ("velero.io", "deletebackuprequests", &["create"]),
        (
            "velero.io",
            "schedules",
            &["list", "create", "update", "delete"],
        ),
        ("", "nodes", &["get", "list", "watch", "patch", "delete"]),
        ("", "pods", &["get", "list", "watch", "patch"]),
        ("", "namespaces", &["list", "watch"]),
        ("", "pods/eviction", &["create"]),
        ("", "persistentvolumeclaims", &["get", "list", "watch"]),
        ("", "persistentvolumes", &["get"]),
        (
            "snapshot.storage.k8s.io",
            "volumesnapshotclasses",
            &["list"],
        ),
        ("snapshot.storage.k8s.io", "volumesnapshots", &["list"]),
        (
            "snapshot.storage.k8s.io",
            "volumesnapshotcontents",
            &["get"],
        ),
        ("apps", "statefulsets", &["list", "watch"]),
        ("policy", "poddisruptionbudgets", &["list", "watch"]),
        ("storage.k8s.io", "volumeattachments", &["list", "watch"]),
        (
            "karpenter.sh",
            "nodeclaims",
            &["get", "list", "watch", "delete"],
        ),
        ("karpenter.k8s.aws", "ec2nodeclasses", &["get"]),
        (
            "admissionregistration.k8s.io",
            "validatingwebhookconfigurations",
            &["get", "patch"],
        ),
        ("events.k8s.io", "events", &["create", "patch"]),
        ("", "events", &["list"]),
    ]);
    assert_eq!(grants(&cluster_role["rules"]), want);

    let role_docs = |name: &str| [rendered("Role", name), rendered("RoleBinding", name)];
    let secrets = role_docs("snapdrain-velero-secrets");
    assert_eq!(
        grants(&secrets[0]["rules"]),
        expect(&[
            ("", "secrets", &["get"]),
            ("apps", "deployments", &["list"]),
            ("", "configmaps", &["create"])
        ])
    );
    assert_eq!(secrets[1]["kind"], "RoleBinding");
    // Velero's Secrets by name only (`velero install`'s and the Helm chart's), from velero.secretNames.
    assert_eq!(
        secrets[0]["rules"][0]["resourceNames"],
        serde_json::json!(["cloud-credentials", "velero"])
    );
    let webhook = role_docs("snapdrain-webhook");
    assert_eq!(
        grants(&webhook[0]["rules"]),
        expect(&[("", "secrets", &["get", "create", "update"])])
    );
    assert_eq!(webhook[1]["kind"], "RoleBinding");
    let leases = role_docs("snapdrain-leader-election");
    assert_eq!(
        grants(&leases[0]["rules"]),
        expect(&[(
            "coordination.k8s.io",
            "leases",
            &["get", "list", "watch", "create", "patch"],
        )])
    );
}

/// The chart's RBAC objects as a default install in namespace `snapdrain` renders them (release
/// `snapdrain`, Velero in `velero`), hooks left out.
fn rendered_rbac() -> Vec<Value> {
    super::helm::default_chart()
        .iter()
        .filter(|d| {
            matches!(
                d["kind"].as_str(),
                Some("ClusterRole" | "ClusterRoleBinding" | "Role" | "RoleBinding")
            ) && d.pointer("/metadata/annotations/helm.sh~1hook").is_none()
        })
        .cloned()
        .collect()
}

/// The chart's gate (its Service and ValidatingWebhookConfiguration) as an install with
/// `webhook.failurePolicy: Fail` renders it, so that a gate the chart's RBAC broke would stop the
/// plan's drain.
fn rendered_webhook() -> [Value; 2] {
    static RENDERED: std::sync::OnceLock<Vec<Value>> = std::sync::OnceLock::new();
    let docs = RENDERED.get_or_init(|| {
        super::helm::rendered_chart(&serde_json::json!({"webhook": {"failurePolicy": "Fail"}}))
    });
    let find = |kind: &str, name: &str| {
        docs.iter()
            .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
            .cloned()
            .unwrap_or_else(|| panic!("the chart renders no {kind} {name}"))
    };
    [
        find("Service", "snapdrain-webhook"),
        find("ValidatingWebhookConfiguration", "snapdrain"),
    ]
}

/// Installs `docs` (RBAC objects) through the admin client.
async fn apply(client: &kube::Client, docs: &[Value]) {
    use kube::api::{Api, DynamicObject, PostParams};
    use kube::discovery::ApiResource;
    for doc in docs {
        let kind = doc["kind"].as_str().expect("a kind");
        let gvk = kube::core::GroupVersionKind::gvk("rbac.authorization.k8s.io", "v1", kind);
        let plural = format!("{}s", kind.to_lowercase());
        let ar = ApiResource::from_gvk_with_plural(&gvk, &plural);
        let api: Api<DynamicObject> =
            match doc.pointer("/metadata/namespace").and_then(Value::as_str) {
                Some(ns) => Api::namespaced_with(client.clone(), ns, &ar),
                None => Api::all_with(client.clone(), &ar),
            };
        let obj: DynamicObject = serde_json::from_value(doc.clone()).expect("an RBAC object");
        api.create(&PostParams::default(), &obj)
            .await
            .unwrap_or_else(|e| panic!("create {kind}: {e}"));
    }
}

/// Runs the controller as the chart's ServiceAccount, with a token from TokenRequest, on a simulated
/// cluster that enforces RBAC as kube-apiserver does, with the eviction gate served as the chart sets it
/// up. Returns the plan as it ended and the controller's metrics.
async fn plan_as_the_chart_service_account(
    h: &snapdrain_testkit::harness::Harness,
    rbac: &[Value],
    plan: &str,
) -> (snapdrain::api::DisruptionPlan, String) {
    use k8s_openapi::api::authentication::v1::TokenRequest;
    use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
    use kube::api::{Api, PostParams};
    let client = h.client.clone();
    let ns: Namespace =
        serde_json::from_value(serde_json::json!({"metadata": {"name": "snapdrain"}})).expect("ns");
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &ns)
        .await
        .expect("create namespace snapdrain");
    let sas: Api<ServiceAccount> = Api::namespaced(client.clone(), "snapdrain");
    let sa: ServiceAccount =
        serde_json::from_value(serde_json::json!({"metadata": {"name": "snapdrain"}})).expect("sa");
    sas.create(&PostParams::default(), &sa)
        .await
        .expect("create the ServiceAccount");
    apply(&client, rbac).await;
    let request: TokenRequest =
        serde_json::from_value(serde_json::json!({"spec": {"audiences": []}})).expect("request");
    let token = sas
        .create_token_request("snapdrain", &PostParams::default(), &request)
        .await
        .expect("TokenRequest")
        .status
        .expect("a token in the status")
        .token;
    let mut config = h.kube_config();
    config.auth_info.token = Some(token.into());
    // The gate as the chart installs it: its configuration first (the gate patches the caBundle), then
    // the controller serving it with the chart's names, then the Service at its address.
    let webhook = rendered_webhook();
    let [mut svc, vwc] = webhook;
    use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
    use k8s_openapi::api::core::v1::Service;
    let vwc: ValidatingWebhookConfiguration =
        serde_json::from_value(vwc).expect("a ValidatingWebhookConfiguration");
    Api::<ValidatingWebhookConfiguration>::all(client.clone())
        .create(&PostParams::default(), &vwc)
        .await
        .expect("create the chart's ValidatingWebhookConfiguration");
    let opts = snapdrain::controller::run::RunOptions {
        lease_namespace: Some("snapdrain".into()),
        lease_seconds: 2,
        webhook: Some(snapdrain::webhook::WebhookConfig {
            addr: std::net::SocketAddr::from(([127, 0, 0, 1], 0)),
            ..snapdrain::webhook::WebhookConfig::default()
        }),
        ..Default::default()
    };
    let controller = snapdrain::controller::start(config, h.settings("snapdrain-0"), opts)
        .await
        .expect("the controller starts");
    let addr = controller.webhook_addr.expect("the gate listens");
    svc["metadata"]["annotations"] = serde_json::json!({
        snapdrain_sim::apiserver::admission::ADDRESS_ANNOTATION: addr.to_string()
    });
    svc["spec"]["selector"] = serde_json::json!({"app.kubernetes.io/name": "snapdrain"});
    let svc: Service = serde_json::from_value(svc).expect("a Service");
    Api::<Service>::namespaced(client.clone(), "snapdrain")
        .create(&PostParams::default(), &svc)
        .await
        .expect("create the chart's webhook Service");
    let node = h.node_with_statefulset_pods().await;
    h.create_plan(plan, serde_json::json!({"nodes": [node]}))
        .await;
    let done = h
        .wait_plan_until(plan, snapdrain_testkit::harness::TIMEOUT, |p| {
            p.status.as_ref().is_some_and(|s| {
                s.phase.is_terminal()
                    || s.nodes.iter().any(|n| {
                        n.blocked_by
                            .as_deref()
                            .is_some_and(|b| b.contains("forbidden"))
                    })
            })
        })
        .await;
    let metrics = controller.metrics.render();
    controller.shutdown().await;
    (done, metrics)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_charts_rbac_is_enough_for_a_whole_plan() {
    let h = snapdrain_testkit::harness::Harness::start().await;
    let (plan, metrics) =
        plan_as_the_chart_service_account(&h, &rendered_rbac(), "least-privilege").await;
    // The plan's own evictions went through the gate (failurePolicy Fail), which allowed them.
    assert!(
        metrics.contains("snapdrain_gate_decisions_total{decision=\"allowed\"}"),
        "{metrics}"
    );
    assert!(!metrics.contains("decision=\"error\""), "{metrics}");
    let status = plan.status.expect("status");
    assert_eq!(
        status.phase,
        snapdrain::api::status::PlanPhase::Completed,
        "{:?}",
        status.message
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn without_the_eviction_rule_the_drain_is_refused_with_the_servers_403() {
    let h = snapdrain_testkit::harness::Harness::start().await;
    let mut rbac = rendered_rbac();
    for doc in rbac.iter_mut().filter(|d| d["kind"] == "ClusterRole") {
        let rules = doc["rules"].as_array_mut().expect("rules");
        rules.retain(|r| r["resources"] != serde_json::json!(["pods/eviction"]));
    }
    let (plan, _) = plan_as_the_chart_service_account(&h, &rbac, "no-evictions").await;
    let status = plan.status.expect("status");
    let blocked: Vec<String> = status
        .nodes
        .iter()
        .filter_map(|n| n.blocked_by.clone())
        .collect();
    assert!(
        blocked.iter().any(|b| b.contains(
            "User \"system:serviceaccount:snapdrain:snapdrain\" cannot create resource \"pods/eviction\""
        )),
        "{blocked:?} {:?}",
        status.message
    );
}

/// The chart's uninstall hook (ServiceAccount, RBAC, Job: the objects annotated `helm.sh/hook`) as a
/// default install renders it (release `snapdrain` in namespace `snapdrain`).
fn rendered_hook() -> Vec<Value> {
    super::helm::default_chart()
        .iter()
        .filter(|d| d.pointer("/metadata/annotations/helm.sh~1hook").is_some())
        .cloned()
        .collect()
}

fn hook_doc(docs: &[Value], kind: &str) -> Value {
    docs.iter()
        .find(|d| d["kind"] == kind)
        .cloned()
        .unwrap_or_else(|| panic!("uninstall-hook.yaml has no {kind}"))
}

/// What `snapdrain holds release --all --delete-webhook-configuration --stop-deployment` calls
/// (src/cli/holds.rs, src/cli/uninstall.rs): cluster-wide, then in the release namespace.
fn hook_grants() -> (Grants, Grants) {
    (
        expect(&[
            (
                "admissionregistration.k8s.io",
                "validatingwebhookconfigurations",
                &["delete"],
            ),
            ("", "pods", &["list", "get", "patch"]),
            // The node-level holds.
            ("", "nodes", &["list", "get", "patch"]),
            // Unfinished plans' cordons (from their status) and every plan's finalizer.
            ("snapdrain.io", "disruptionplans", &["list", "patch"]),
        ]),
        expect(&[
            ("apps", "deployments", &["get"]),
            ("apps", "deployments/scale", &["patch"]),
            ("", "pods", &["watch"]),
        ]),
    )
}

#[test]
fn the_uninstall_hook_is_a_pre_delete_job_whose_rbac_goes_with_it() {
    let docs = rendered_hook();
    let kinds: Vec<&str> = docs.iter().filter_map(|d| d["kind"].as_str()).collect();
    assert_eq!(
        kinds,
        [
            "ServiceAccount",
            "ClusterRole",
            "ClusterRoleBinding",
            "Role",
            "RoleBinding",
            "Job"
        ]
    );
    let weight = |d: &Value| -> i64 {
        d["metadata"]["annotations"]["helm.sh/hook-weight"]
            .as_str()
            .and_then(|w| w.parse().ok())
            .unwrap_or_else(|| panic!("{} has no hook weight", d["kind"]))
    };
    let job = hook_doc(&docs, "Job");
    for d in &docs {
        let a = &d["metadata"]["annotations"];
        assert_eq!(a["helm.sh/hook"], "pre-delete", "{}", d["kind"]);
        let policy = a["helm.sh/hook-delete-policy"].as_str().unwrap_or_default();
        assert!(
            policy.contains("hook-succeeded") && policy.contains("before-hook-creation"),
            "{}: {policy}",
            d["kind"]
        );
        if d["kind"] != "Job" {
            // A failed RBAC hook is removed too: no cluster-wide pod patch stays bound (review M-4).
            assert!(policy.contains("hook-failed"), "{}: {policy}", d["kind"]);
            assert!(
                weight(d) < weight(&job),
                "{} is created after the Job",
                d["kind"]
            );
        }
    }
    let pod = &job["spec"]["template"]["spec"];
    assert_eq!(pod["serviceAccountName"], "snapdrain-uninstall");
    assert_eq!(pod["restartPolicy"], "Never");
    let args: Vec<&str> = pod["containers"][0]["args"]
        .as_array()
        .expect("args")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert_eq!(
        args,
        [
            "holds",
            "release",
            "--all",
            "--delete-webhook-configuration=snapdrain",
            "--stop-deployment=snapdrain/snapdrain",
            "--stop-timeout=2m"
        ]
    );
    // The hook's own pod is not one of the Deployment's, which step 2 waits to see gone.
    assert_eq!(
        job["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/name"],
        "snapdrain-uninstall"
    );
    // The controller's image.
    let image_line = |file: &str| {
        read(&chart().join("templates").join(file))
            .lines()
            .find(|l| l.trim_start().starts_with("image:"))
            .map(str::trim)
            .map(str::to_owned)
            .unwrap_or_else(|| panic!("{file} has no image"))
    };
    assert_eq!(
        image_line("uninstall-hook.yaml"),
        image_line("deployment.yaml")
    );
    let (cluster, namespaced) = hook_grants();
    let cluster_role = hook_doc(&docs, "ClusterRole");
    assert_eq!(grants(&cluster_role["rules"]), cluster);
    assert_eq!(
        cluster_role["rules"][0]["resourceNames"],
        serde_json::json!(["snapdrain"])
    );
    let role = hook_doc(&docs, "Role");
    assert_eq!(role["metadata"]["namespace"], "snapdrain");
    assert_eq!(grants(&role["rules"]), namespaced);
    for r in role["rules"].as_array().expect("rules") {
        if r["apiGroups"] == serde_json::json!(["apps"]) {
            assert_eq!(r["resourceNames"], serde_json::json!(["snapdrain"]), "{r}");
        }
    }
}

/// Runs the hook Job's command (the `snapdrain` binary, the Job's args) with a token of the hook's
/// ServiceAccount against the simulated cluster, which enforces RBAC as kube-apiserver does.
async fn run_hook_command(kubeconfig: &Path) -> (Option<i32>, String, String) {
    let out = tokio::time::timeout(
        snapdrain_testkit::harness::TIMEOUT,
        tokio::process::Command::new(env!("CARGO_BIN_EXE_snapdrain"))
            .args([
                "holds",
                "release",
                "--all",
                "--delete-webhook-configuration=snapdrain",
                "--stop-deployment=snapdrain/snapdrain",
                "--stop-timeout=30s",
                "--kubeconfig",
            ])
            .arg(kubeconfig)
            .env_remove("KUBECONFIG")
            .env_remove("RUST_LOG")
            .stdin(std::process::Stdio::null())
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("the hook command finishes")
    .expect("the hook command runs");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_uninstall_hook_runs_with_its_own_rbac_and_needs_every_rule() {
    use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
    use k8s_openapi::api::apps::v1::Deployment;
    use k8s_openapi::api::authentication::v1::TokenRequest;
    use k8s_openapi::api::core::v1::{Pod, ServiceAccount};
    use k8s_openapi::api::rbac::v1::{ClusterRole, Role};
    use kube::ResourceExt;
    use kube::api::{Api, Patch, PatchParams, PostParams};
    let h = snapdrain_testkit::harness::Harness::start().await;
    let client = h.client.clone();
    snapdrain_testkit::eviction::namespace(&client, "snapdrain", serde_json::json!({})).await;
    // The release as installed: its gate configuration (failurePolicy Fail, no gate serving it) and its
    // controller Deployment, whose pods the simulated kubelet runs.
    let vwc: ValidatingWebhookConfiguration =
        serde_json::from_value(rendered_webhook()[1].clone()).expect("the configuration");
    let vwcs: Api<ValidatingWebhookConfiguration> = Api::all(client.clone());
    vwcs.create(&PostParams::default(), &vwc)
        .await
        .expect("create the configuration");
    let labels = serde_json::json!({"app.kubernetes.io/name": "snapdrain", "app.kubernetes.io/instance": "snapdrain"});
    let deployment: Deployment = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "snapdrain", "namespace": "snapdrain"},
        "spec": {"replicas": 2, "selector": {"matchLabels": labels},
                 "template": {"metadata": {"labels": labels},
                              "spec": {"containers": [{"name": "controller", "image": "snapdrain:test"}]}}}
    }))
    .expect("a Deployment");
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), "snapdrain");
    deployments
        .create(&PostParams::default(), &deployment)
        .await
        .expect("create the Deployment");
    let release_pods: Api<Pod> = Api::namespaced(client.clone(), "snapdrain");
    let controller_pods = h
        .wait_all(release_pods.clone(), "the controller's two pods", |ps| {
            ps.len() == 2
        })
        .await;
    // The controller's pods outlive the hook's first look at them until the `watch` case below is done:
    // a pod gone before the hook lists them (the simulated kubelet stops them within 50 ms) would spare
    // it the watch that case takes away.
    let finalizers = |list: Value| {
        let release_pods = release_pods.clone();
        let names: Vec<String> = controller_pods.iter().map(|p| p.name_any()).collect();
        async move {
            for name in names {
                release_pods
                    .patch(
                        &name,
                        &PatchParams::default(),
                        &Patch::Merge(serde_json::json!({"metadata": {"finalizers": list}})),
                    )
                    .await
                    .expect("set the pod's finalizers");
            }
        }
    };
    finalizers(serde_json::json!(["snapdrain.test/outlive-the-hooks-list"])).await;
    // Holds placed by a controller, which then stops (as a crash or `--no-hooks` would leave them).
    let controller = h.controller().await;
    let shop: Api<Pod> = Api::namespaced(client.clone(), "shop");
    let held = |p: &Pod| p.annotations().contains_key("snapdrain.io/held");
    let under: std::collections::BTreeSet<String> = h
        .wait_all(shop.clone(), "the StatefulSet pods held", |ps| {
            ps.iter().filter(|p| held(p)).count() == 5
        })
        .await
        .iter()
        .filter(|p| held(p))
        .filter_map(|p| p.spec.as_ref()?.node_name.clone())
        .collect();
    // And the nodes under them (the node-level hold).
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(client.clone());
    let node_held =
        |n: &k8s_openapi::api::core::v1::Node| n.annotations().contains_key("snapdrain.io/held");
    h.wait_all(nodes.clone(), "the nodes under them held", |ns| {
        ns.iter()
            .filter(|n| under.contains(&n.name_any()))
            .all(node_held)
    })
    .await;
    controller.shutdown().await;
    // A plan the stopped controller left with its finalizer.
    h.create_plan(
        "left-behind",
        serde_json::json!({"nodes": ["nowhere"], "dryRun": true}),
    )
    .await;
    let plans: Api<snapdrain::api::DisruptionPlan> = Api::all(client.clone());
    plans
        .patch(
            "left-behind",
            &PatchParams::default(),
            &Patch::Merge(
                serde_json::json!({"metadata": {"finalizers": ["snapdrain.io/rollback"]}}),
            ),
        )
        .await
        .expect("the plan's finalizer");
    let held_nodes = nodes
        .list(&Default::default())
        .await
        .expect("list nodes")
        .items
        .iter()
        .filter(|n| node_held(n))
        .count();
    assert!(held_nodes > 0);

    // The hook's ServiceAccount and RBAC, as the chart renders them.
    let docs = rendered_hook();
    let sas: Api<ServiceAccount> = Api::namespaced(client.clone(), "snapdrain");
    let sa: ServiceAccount =
        serde_json::from_value(hook_doc(&docs, "ServiceAccount")).expect("a ServiceAccount");
    sas.create(&PostParams::default(), &sa)
        .await
        .expect("create the hook's ServiceAccount");
    let rbac: Vec<Value> = docs
        .iter()
        .filter(|d| d["kind"] != "ServiceAccount" && d["kind"] != "Job")
        .cloned()
        .collect();
    apply(&client, &rbac).await;
    let request: TokenRequest =
        serde_json::from_value(serde_json::json!({"spec": {"audiences": []}})).expect("request");
    let token = sas
        .create_token_request("snapdrain-uninstall", &PostParams::default(), &request)
        .await
        .expect("TokenRequest")
        .status
        .expect("a token in the status")
        .token;
    let dir = tempfile::tempdir().expect("temp dir");
    let admin = h
        .cluster
        .write_kubeconfig(&dir.path().join("admin"))
        .expect("kubeconfig");
    let kubeconfig = dir.path().join("hook");
    std::fs::write(
        &kubeconfig,
        read(&admin).replace(
            &format!("token: {}", snapdrain_sim::apiserver::auth::ADMIN_TOKEN),
            &format!("token: {token}"),
        ),
    )
    .expect("write the hook's kubeconfig");

    // Each rule taken away in turn (in the order the command needs them) stops it with the server's 403.
    let cluster_roles: Api<ClusterRole> = Api::all(client.clone());
    let roles: Api<Role> = Api::namespaced(client.clone(), "snapdrain");
    let full_cluster = hook_doc(&docs, "ClusterRole")["rules"].clone();
    let full_role = hook_doc(&docs, "Role")["rules"].clone();
    let without = |rules: &Value, resource: &str, verb: &str| -> Value {
        let mut out = Vec::new();
        for r in rules.as_array().expect("rules") {
            if r["resources"][0] != resource {
                out.push(r.clone());
                continue;
            }
            let mut r = r.clone();
            let verbs: Vec<Value> = r["verbs"]
                .as_array()
                .expect("verbs")
                .iter()
                .filter(|v| *v != verb)
                .cloned()
                .collect();
            if !verbs.is_empty() {
                r["verbs"] = Value::Array(verbs);
                out.push(r);
            }
        }
        Value::Array(out)
    };
    let user = "system:serviceaccount:snapdrain:snapdrain-uninstall";
    let cases: [(&str, &str, &str, &str); 12] = [
        (
            "ClusterRole",
            "validatingwebhookconfigurations",
            "delete",
            "cannot delete ValidatingWebhookConfiguration snapdrain",
        ),
        ("Role", "deployments", "get", "cannot scale Deployment"),
        (
            "Role",
            "deployments/scale",
            "patch",
            "cannot scale Deployment",
        ),
        ("Role", "pods", "watch", "cannot watch the pods"),
        ("ClusterRole", "pods", "list", "cannot"),
        ("ClusterRole", "nodes", "list", "cannot list nodes"),
        (
            "ClusterRole",
            "disruptionplans",
            "list",
            "cannot list DisruptionPlans",
        ),
        (
            "ClusterRole",
            "disruptionplans",
            "patch",
            "cannot remove snapdrain's finalizer from DisruptionPlan left-behind",
        ),
        (
            "ClusterRole",
            "nodes",
            "get",
            "cannot remove snapdrain's hold from node",
        ),
        (
            "ClusterRole",
            "nodes",
            "patch",
            "cannot remove snapdrain's hold from node",
        ),
        (
            "ClusterRole",
            "pods",
            "get",
            "cannot remove snapdrain's holds",
        ),
        (
            "ClusterRole",
            "pods",
            "patch",
            "cannot remove snapdrain's holds",
        ),
    ];
    let set_rules = |kind: &'static str, rules: Value| {
        let cluster_roles = cluster_roles.clone();
        let roles = roles.clone();
        async move {
            let patch = Patch::Merge(serde_json::json!({"rules": rules}));
            let pp = PatchParams::default();
            match kind {
                "ClusterRole" => cluster_roles
                    .patch("snapdrain-uninstall", &pp, &patch)
                    .await
                    .map(|_| ()),
                _ => roles
                    .patch("snapdrain-uninstall", &pp, &patch)
                    .await
                    .map(|_| ()),
            }
            .expect("patch the hook's rules");
        }
    };
    for (kind, resource, verb, message) in cases {
        let full = if kind == "ClusterRole" {
            &full_cluster
        } else {
            &full_role
        };
        set_rules(kind, without(full, resource, verb)).await;
        let (code, stdout, stderr) = run_hook_command(&kubeconfig).await;
        assert_eq!(
            code,
            Some(1),
            "without {verb} {resource} the command should fail: {stdout}{stderr}"
        );
        assert!(
            stderr.contains(message) && stderr.contains(user),
            "without {verb} {resource}: {stderr}"
        );
        if resource == "nodes"
            || resource == "disruptionplans"
            || (resource == "pods" && verb == "list")
        {
            // Listed before anything changes, nodes released before pods: nothing went yet.
            let still = nodes
                .list(&Default::default())
                .await
                .expect("list nodes")
                .items;
            assert_eq!(
                still.iter().filter(|n| node_held(n)).count(),
                held_nodes,
                "without {verb} {resource} no node hold went"
            );
        }
        if resource == "pods" && verb == "watch" {
            finalizers(Value::Null).await;
        }
        if resource == "deployments" {
            // The gate's configuration went first, while the controller still ran.
            assert!(vwcs.get_opt("snapdrain").await.expect("get").is_none());
            let d = deployments.get("snapdrain").await.expect("the Deployment");
            assert_eq!(d.spec.and_then(|s| s.replicas), Some(2));
        }
        set_rules(kind, full.clone()).await;
    }
    let still_held = shop
        .list(&Default::default())
        .await
        .expect("list")
        .items
        .iter()
        .filter(|p| held(p))
        .count();
    assert_eq!(still_held, 5, "no hold went while a rule was missing");

    // With every rule: the configuration is gone, the controller scaled to 0 with its pods gone, and
    // every hold of snapdrain's removed.
    let (code, stdout, stderr) = run_hook_command(&kubeconfig).await;
    assert_eq!(code, Some(0), "{stdout}{stderr}");
    assert!(
        vwcs.get_opt("snapdrain").await.expect("get").is_none(),
        "{stdout}"
    );
    let left = plans.get("left-behind").await.expect("the plan");
    assert!(left.finalizers().is_empty(), "{stdout}");
    let d = deployments.get("snapdrain").await.expect("the Deployment");
    assert_eq!(d.spec.and_then(|s| s.replicas), Some(0));
    assert!(
        release_pods
            .list(&Default::default())
            .await
            .expect("list")
            .items
            .is_empty()
    );
    let pods = shop.list(&Default::default()).await.expect("list").items;
    assert!(
        pods.iter()
            .all(|p| !held(p) && !p.annotations().contains_key("karpenter.sh/do-not-disrupt")),
        "{stdout}"
    );
    let after = nodes
        .list(&Default::default())
        .await
        .expect("list nodes")
        .items;
    assert!(
        after
            .iter()
            .all(|n| !node_held(n) && !n.annotations().contains_key("karpenter.sh/do-not-disrupt")),
        "{stdout}"
    );
    // Run again (a retried hook): nothing left to do, still success.
    let (code, stdout, stderr) = run_hook_command(&kubeconfig).await;
    assert_eq!(code, Some(0), "{stdout}{stderr}");
    assert!(stdout.contains("nothing to release"), "{stdout}");
}

/// The NetworkPolicy and the Deployment among `docs`, once it is checked that the policy selects the
/// Deployment's pods.
fn policy_selecting_the_pods(docs: &[Value]) -> (&Value, &Value) {
    let policy = docs
        .iter()
        .find(|d| d["kind"] == "NetworkPolicy")
        .expect("a NetworkPolicy");
    let deployment = docs
        .iter()
        .find(|d| d["kind"] == "Deployment")
        .expect("the Deployment");
    let pod_labels = &deployment["spec"]["template"]["metadata"]["labels"];
    for (k, v) in policy["spec"]["podSelector"]["matchLabels"]
        .as_object()
        .expect("matchLabels")
    {
        assert_eq!(
            &pod_labels[k], v,
            "the policy selects the controller's pods"
        );
    }
    (policy, deployment)
}

/// The optional NetworkPolicy (review H-2, L-9): off by default; on, it admits the gate's port only from
/// the listed sources and the metrics port only from the listed scrapers, on the Deployment's own pods
/// and named ports. The simulator does not enforce NetworkPolicies, so this checks what the manifest
/// says.
#[test]
fn the_network_policy_admits_only_the_api_server_and_the_scrapers() {
    let off = super::helm::default_chart();
    assert!(!off.iter().any(|d| d["kind"] == "NetworkPolicy"));
    let api_server = serde_json::json!([{"ipBlock": {"cidr": "10.0.0.0/28"}}]);
    let scrapers = serde_json::json!([{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}]);
    let on = super::helm::rendered_chart(
        &serde_json::json!({"networkPolicy": {"enabled": true, "webhookFrom": api_server, "metricsFrom": scrapers}}),
    );
    let (policy, deployment) = policy_selecting_the_pods(&on);
    assert_eq!(
        policy["spec"]["policyTypes"],
        serde_json::json!(["Ingress"])
    );
    let ports: Vec<&str> = deployment["spec"]["template"]["spec"]["containers"][0]["ports"]
        .as_array()
        .expect("ports")
        .iter()
        .filter_map(|p| p["name"].as_str())
        .collect();
    let ingress = policy["spec"]["ingress"].as_array().expect("ingress rules");
    assert_eq!(ingress.len(), 2, "{ingress:?}");
    for (rule, port, from) in [
        (&ingress[0], "webhook", &api_server),
        (&ingress[1], "metrics", &scrapers),
    ] {
        assert_eq!(&rule["from"], from);
        assert_eq!(
            rule["ports"],
            serde_json::json!([{"port": port, "protocol": "TCP"}])
        );
        assert!(
            ports.contains(&port),
            "{port} is a container port: {ports:?}"
        );
    }
}

/// Plans are cluster-scoped power (drain, terminate, launch): the editor and policy-admin roles join no
/// built-in role, so `edit`/`admin` holders (namespace users) never get them; the viewer joins `view`.
/// Same in the chart and the kustomize base.
#[test]
fn only_the_plan_viewer_role_is_aggregated_to_built_in_roles() {
    let aggregated = |doc: &Value| -> Vec<String> {
        let mut to: Vec<String> = doc["metadata"]["labels"]
            .as_object()
            .into_iter()
            .flatten()
            .filter(|(k, v)| {
                k.starts_with("rbac.authorization.k8s.io/aggregate-to-") && *v == "true"
            })
            .map(|(k, _)| {
                k.trim_start_matches("rbac.authorization.k8s.io/aggregate-to-")
                    .to_string()
            })
            .collect();
        to.sort();
        to
    };
    let chart = rendered_rbac();
    let base = super::kustomize::kustomize("deploy/kustomize/base");
    for docs in [&chart, &base] {
        let role = |name: &str| {
            docs.iter()
                .find(|d| d["kind"] == "ClusterRole" && d["metadata"]["name"] == name)
                .unwrap_or_else(|| panic!("ClusterRole {name} is shipped"))
        };
        assert_eq!(
            aggregated(role("snapdrain-plan-viewer")),
            ["admin", "edit", "view"]
        );
        assert_eq!(
            grants(&role("snapdrain-plan-viewer")["rules"]),
            expect(&[
                ("snapdrain.io", "disruptionplans", &["get", "list", "watch"]),
                (
                    "snapdrain.io",
                    "disruptionpolicies",
                    &["get", "list", "watch"]
                ),
            ])
        );
        for name in ["snapdrain-plan-editor", "snapdrain-policy-admin"] {
            assert!(aggregated(role(name)).is_empty(), "{name} is aggregated");
        }
        assert_eq!(
            grants(&role("snapdrain-plan-editor")["rules"]),
            expect(&[
                (
                    "snapdrain.io",
                    "disruptionplans",
                    &["get", "list", "watch", "create", "patch", "delete"]
                ),
                (
                    "snapdrain.io",
                    "disruptionpolicies",
                    &["get", "list", "watch"]
                ),
            ])
        );
        // Nothing else in either tree is aggregated to a built-in role.
        let others: Vec<&Value> = docs
            .iter()
            .filter(|d| {
                d["kind"] == "ClusterRole" && d["metadata"]["name"] != "snapdrain-plan-viewer"
            })
            .filter(|d| !aggregated(d).is_empty())
            .collect();
        assert!(others.is_empty(), "{others:?}");
    }
}

/// The notification URL's Secrets (DisruptionPolicy `urlSecretRef`, security review M-5) are readable by
/// name only, from the chart's `notifications.urlSecretNames`: `get` on those names in the release
/// namespace, bound to snapdrain's ServiceAccount; a default install grants no such Role.
#[test]
fn the_notification_url_secrets_are_readable_by_name_only() {
    let named = |docs: &[Value], kind: &str| {
        docs.iter()
            .find(|d| d["kind"] == kind && d["metadata"]["name"] == "snapdrain-notifications")
            .cloned()
    };
    assert!(named(super::helm::default_chart(), "Role").is_none());
    let docs = super::helm::rendered_chart(
        &serde_json::json!({"notifications": {"urlSecretNames": ["chat-url"]}}),
    );
    let role = named(&docs, "Role").expect("the Role is rendered");
    assert_eq!(role["metadata"]["namespace"], "snapdrain");
    assert_eq!(
        role["rules"],
        serde_json::json!([{"apiGroups": [""], "resources": ["secrets"],
                            "resourceNames": ["chat-url"], "verbs": ["get"]}])
    );
    let binding = named(&docs, "RoleBinding").expect("the RoleBinding is rendered");
    assert_eq!(binding["roleRef"]["name"], "snapdrain-notifications");
    assert_eq!(
        binding["subjects"],
        serde_json::json!([{"kind": "ServiceAccount", "name": "snapdrain", "namespace": "snapdrain"}])
    );
}

/// The kustomize component `components/networkpolicy` (in the irsa overlay) is the chart's NetworkPolicy
/// with the same sources, and selects the overlay's own pods.
#[test]
fn the_kustomize_network_policy_is_the_charts() {
    let overlay = super::kustomize::kustomize("deploy/kustomize/overlays/irsa");
    let policy = overlay
        .iter()
        .find(|d| d["kind"] == "NetworkPolicy")
        .expect("the irsa overlay adds the NetworkPolicy component");
    let ingress = policy["spec"]["ingress"].as_array().expect("ingress rules");
    let chart = super::helm::rendered_chart(&serde_json::json!({"networkPolicy": {
        "enabled": true,
        "webhookFrom": ingress[0]["from"],
        "metricsFrom": ingress[1]["from"]}}));
    let charted = chart
        .iter()
        .find(|d| d["kind"] == "NetworkPolicy")
        .expect("rendered when enabled");
    assert_eq!(policy["spec"], charted["spec"]);
    let (_, deployment) = policy_selecting_the_pods(&overlay);
    assert_eq!(
        policy["metadata"]["namespace"],
        deployment["metadata"]["namespace"]
    );
}

/// The kustomize uninstall (`deploy/kustomize/uninstall`) is the chart's pre-delete hook object by
/// object (review M-4: a kustomize install had no uninstall path): the same ServiceAccount, rules,
/// bindings and Job, Helm's hook annotations and each tool's labels aside.
#[test]
fn the_kustomize_uninstall_is_the_charts_hook() {
    let strip = |d: &Value| {
        let mut d = d.clone();
        if let Some(m) = d["metadata"].as_object_mut() {
            m.remove("labels");
            m.remove("annotations");
        }
        d
    };
    let key = |d: &Value| {
        (
            d["kind"].as_str().unwrap_or_default().to_owned(),
            d["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
        )
    };
    let chart: std::collections::BTreeMap<_, _> =
        rendered_hook().iter().map(|d| (key(d), strip(d))).collect();
    let kustomized: std::collections::BTreeMap<_, _> =
        super::kustomize::kustomize("deploy/kustomize/uninstall")
            .iter()
            .map(|d| (key(d), strip(d)))
            .collect();
    assert_eq!(
        chart.keys().collect::<Vec<_>>(),
        kustomized.keys().collect::<Vec<_>>()
    );
    for (k, c) in &chart {
        assert_eq!(c, &kustomized[k], "{k:?}");
    }
}
