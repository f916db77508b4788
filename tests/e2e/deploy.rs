//! The deploy manifests cannot go stale silently: every plain YAML file under deploy/ parses, the chart's
//! CRD is the committed one, every `.Values` path a template uses exists, template blocks balance, and
//! the ClusterRole grants exactly the verbs the controller uses. (helm itself is not run here.)

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

/// A template whose only template expressions sit on their own lines (metadata): dropping those lines
/// leaves plain YAML.
fn strip_template_lines(text: &str) -> String {
    text.lines()
        .filter(|l| !l.contains("{{"))
        .collect::<Vec<_>>()
        .join("\n")
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
    let cluster_role = &parse_all(
        &strip_template_lines(&read(&chart().join("templates/clusterrole.yaml"))),
        "clusterrole.yaml",
    )[0];
    assert_eq!(cluster_role["kind"], "ClusterRole");
    let want = expect(&[
        (
            "snapdrain.io",
            "disruptionplans",
            &["list", "watch", "patch", "create"],
        ),
        ("snapdrain.io", "disruptionplans/status", &["patch"]),
        (
            "snapdrain.io",
            "disruptionpolicies",
            &["list", "watch", "create"],
        ),
        (
            "velero.io",
            "backups",
            &["create", "get", "list", "watch", "delete"],
        ),
        ("velero.io", "backupstoragelocations", &["get", "list"]),
        ("velero.io", "deletebackuprequests", &["create"]),
        ("", "nodes", &["get", "list", "watch", "patch", "delete"]),
        ("", "pods", &["get", "list", "watch", "patch"]),
        ("", "namespaces", &["list", "watch"]),
        ("", "pods/eviction", &["create"]),
        ("", "persistentvolumeclaims", &["get", "list"]),
        ("", "persistentvolumes", &["get"]),
        ("apps", "statefulsets", &["get", "list"]),
        ("policy", "poddisruptionbudgets", &["list"]),
        ("storage.k8s.io", "volumeattachments", &["list", "watch"]),
        (
            "karpenter.sh",
            "nodeclaims",
            &["get", "list", "watch", "delete"],
        ),
        (
            "admissionregistration.k8s.io",
            "validatingwebhookconfigurations",
            &["get", "patch"],
        ),
        ("events.k8s.io", "events", &["create", "patch"]),
    ]);
    assert_eq!(grants(&cluster_role["rules"]), want);

    let role_docs = |file: &str| {
        parse_all(
            &strip_template_lines(&read(&chart().join("templates").join(file))),
            file,
        )
    };
    let secrets = role_docs("role-velero-secrets.yaml");
    assert_eq!(
        grants(&secrets[0]["rules"]),
        expect(&[
            ("", "secrets", &["get"]),
            ("apps", "deployments", &["list"])
        ])
    );
    assert_eq!(secrets[1]["kind"], "RoleBinding");
    let webhook = role_docs("role-webhook.yaml");
    assert_eq!(
        grants(&webhook[0]["rules"]),
        expect(&[("", "secrets", &["get", "create", "update"])])
    );
    assert_eq!(webhook[1]["kind"], "RoleBinding");
    let leases = role_docs("role-leader-election.yaml");
    assert_eq!(
        grants(&leases[0]["rules"]),
        expect(&[("coordination.k8s.io", "leases", &["get", "create", "patch"])])
    );
}

/// The chart's RBAC templates with the values a default install in namespace `snapdrain` gives them
/// (release `snapdrain`, Velero in `velero`); lines that are only template control are dropped.
fn rendered_rbac() -> Vec<Value> {
    let files = [
        "clusterrole.yaml",
        "clusterrolebinding.yaml",
        "role-velero-secrets.yaml",
        "role-leader-election.yaml",
        "role-webhook.yaml",
    ];
    files
        .iter()
        .flat_map(|f| {
            let text = read(&chart().join("templates").join(f))
                .replace("{{ include \"snapdrain.fullname\" . }}", "snapdrain")
                .replace(
                    "{{ include \"snapdrain.serviceAccountName\" . }}",
                    "snapdrain",
                )
                .replace("{{ .Values.velero.namespace }}", "velero")
                .replace("{{ .Release.Namespace }}", "snapdrain");
            parse_all(&strip_template_lines(&text), f)
        })
        .filter(|d| !d.is_null())
        .collect()
}

/// The chart's webhook.yaml (Service and ValidatingWebhookConfiguration) as a default install renders
/// it, with `failurePolicy: Fail` so that a gate the chart's RBAC broke would stop the plan's drain.
fn rendered_webhook() -> Vec<Value> {
    let text = read(&chart().join("templates/webhook.yaml"))
        .replace("{{ include \"snapdrain.fullname\" . }}", "snapdrain")
        .replace("{{ .Release.Namespace }}", "snapdrain")
        .replace("{{ .Values.webhook.failurePolicy }}", "Fail")
        .replace("{{ .Values.webhook.timeoutSeconds }}", "5");
    parse_all(&strip_template_lines(&text), "webhook.yaml")
        .into_iter()
        .filter(|d| !d.is_null())
        .collect()
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
    let (mut svc, vwc) = match webhook.as_slice() {
        [svc, vwc] => (svc.clone(), vwc.clone()),
        other => panic!("webhook.yaml renders a Service and a configuration: {other:?}"),
    };
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
